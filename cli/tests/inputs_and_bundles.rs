//! The binary, black box: declared inputs are required (exit 2 before any provider call)
//! and bundles from another format version are refused with both versions named.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn aplc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aplc"))
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove("OPENAI_API_KEY")
        .output()
        .expect("aplc runs")
}

/// A scratch directory unique to one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("aplc-inputs-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, name: &str, contents: impl AsRef<[u8]>) -> String {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path.to_string_lossy().into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const AGENT: &str =
    "{# inputs: customer, topic #}\n# prompt: answer\nWrite to {{ customer }} about {{ topic }}.\n";

/// Issue #22: `aplc bench` without the agent's inputs failed every run and exited 0. It
/// refuses the options as `aplc run` does: the same message and exit code, before any run.
#[test]
fn bench_missing_declared_inputs_fails_as_run_does() {
    let dir = scratch("bench-missing");
    let apl = write(&dir, "agent.apl", AGENT);
    let mock = write(&dir, "mock.json", r#"["Dear Ada"]"#);
    let partial = write(&dir, "partial.json", r#"{"topic": "refunds"}"#);
    let run = aplc(&["run", &apl, "--mock", &mock, "--context", &partial]);
    assert_eq!(run.status.code(), Some(2), "{}", stderr(&run));
    for extra in [&[][..], &["--concurrency", "2"][..]] {
        let mut args = vec![
            "bench",
            &apl,
            "--mock",
            &mock,
            "--context",
            &partial,
            "-n",
            "3",
        ];
        args.extend_from_slice(extra);
        let bench = aplc(&args);
        assert_eq!(
            bench.status.code(),
            Some(2),
            "{extra:?}: {}",
            stderr(&bench)
        );
        assert_eq!(stderr(&bench), stderr(&run), "{extra:?}");
        assert!(bench.stdout.is_empty(), "{extra:?}: no report");
    }
}

#[test]
fn a_run_missing_declared_inputs_exits_2_before_any_provider_call() {
    let dir = scratch("missing");
    let apl = write(&dir, "agent.apl", AGENT);
    // An empty script: a provider call would fail with `mock provider exhausted` and
    // exit 3, so exit 2 shows the run stopped before calling the provider.
    let mock = write(&dir, "mock.json", "[]");
    let bundle = dir.join("agent.aplb").to_string_lossy().into_owned();
    assert_eq!(aplc(&["build", &apl, "-o", &bundle]).status.code(), Some(0));

    // From source and from the bundle, with no context and with part of it.
    let partial = write(&dir, "partial.json", r#"{"topic": "refunds"}"#);
    for agent in [&apl, &bundle] {
        let o = aplc(&["run", agent, "--mock", &mock]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        let err = stderr(&o);
        assert!(err.contains("missing input: customer"), "{err}");
        assert!(err.contains("missing input: topic"), "{err}");
        assert!(err.contains("--context"), "{err}");
        assert!(o.stdout.is_empty());

        let o = aplc(&["run", agent, "--mock", &mock, "--context", &partial]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        let err = stderr(&o);
        assert!(err.contains("missing input: customer"), "{err}");
        assert!(!err.contains("missing input: topic"), "{err}");
    }

    // The HTTP provider is never contacted either: no "no API key" trouble, no
    // connection attempt to the closed port.
    let o = aplc(&["run", &bundle, "--base-url", "http://127.0.0.1:9"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("missing input: customer"));

    // With every input, the run goes ahead.
    let full = write(
        &dir,
        "full.json",
        r#"{"customer": "Ada", "topic": "refunds"}"#,
    );
    let answer = write(&dir, "answer.json", r#"["Dear Ada"]"#);
    let o = aplc(&["run", &bundle, "--mock", &answer, "--context", &full]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "Dear Ada\n");

    // `inspect` lists the declared inputs.
    let o = aplc(&["inspect", &bundle]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("inputs    customer, topic"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

#[test]
fn a_bundle_from_a_newer_format_is_refused_naming_both_versions() {
    let dir = scratch("versions");
    let apl = write(&dir, "agent.apl", "# prompt: a\nHello.\n");
    let mock = write(&dir, "mock.json", r#"["hi"]"#);
    let bundle = dir.join("agent.aplb").to_string_lossy().into_owned();
    assert_eq!(aplc(&["build", &apl, "-o", &bundle]).status.code(), Some(0));
    let bytes = std::fs::read(&bundle).unwrap();
    let current = u16::from_le_bytes([bytes[8], bytes[9]]);
    assert_eq!(current, aplc_vm::bundle::FORMAT_VERSION);

    let mut newer = bytes.clone();
    newer[8..10].copy_from_slice(&(current + 1).to_le_bytes());
    let newer = write(&dir, "newer.aplb", newer);
    let mut older = bytes;
    older[8..10].copy_from_slice(&(current - 1).to_le_bytes());
    let older = write(&dir, "older.aplb", older);

    let this = env!("CARGO_PKG_VERSION");
    for args in [
        vec!["run", &newer, "--mock", &mock],
        vec!["inspect", &newer],
    ] {
        let o = aplc(&args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        let err = stderr(&o);
        let expected = format!(
            "unsupported bundle format version {}: the bundle was built by a newer aplc, \
             and aplc {this} reads format version {current}",
            current + 1
        );
        assert!(err.contains(&expected), "{args:?}: {err}");
        assert!(err.contains("upgrade aplc"), "{args:?}: {err}");
    }
    for args in [
        vec!["run", &older, "--mock", &mock],
        vec!["inspect", &older],
    ] {
        let o = aplc(&args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        let err = stderr(&o);
        let expected = format!(
            "unsupported bundle format version {}: the bundle was built by an older aplc, \
             and aplc {this} reads format version {current}; rebuild it",
            current - 1
        );
        assert!(err.contains(&expected), "{args:?}: {err}");
    }
}

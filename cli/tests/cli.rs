//! The `aplc` binary, black box: exit codes, output streams, bundles, bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn aplc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aplc"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("aplc runs")
}

fn fixture(path: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures")
        .join(path)
        .to_string_lossy()
        .into_owned()
}

/// A scratch directory unique to one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("aplc-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, name: &str, contents: impl AsRef<[u8]>) -> String {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path.to_string_lossy().into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn check_valid_and_invalid() {
    let ok = aplc(&["check", &fixture("check/spec_1_2_2_simple.apl")]);
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
    // Success is one summary line on stderr (issue #10: `check` was silent).
    assert_eq!(stderr(&ok), "ok: 1 step, 1 template\n");

    let warned = aplc(&["check", &fixture("check/warn_unreachable_step.apl")]);
    assert_eq!(warned.status.code(), Some(0), "{}", stderr(&warned));
    assert!(
        stderr(&warned).ends_with(", 1 warning\n"),
        "{}",
        stderr(&warned)
    );

    // JSON Lines on stdout, and nothing on stderr for a valid file.
    let json = aplc(&[
        "check",
        "--format",
        "json",
        &fixture("check/spec_1_2_2_simple.apl"),
    ]);
    assert_eq!(json.status.code(), Some(0));
    assert!(stdout(&json).is_empty() && stderr(&json).is_empty());

    let bad = aplc(&["check", &fixture("check/err_multiple_errors.apl")]);
    assert_eq!(bad.status.code(), Some(2));
    let err = stderr(&bad);
    for code in ["APL0010", "APL0009", "APL0002", "APL0003"] {
        assert!(err.contains(code), "missing {code} in:\n{err}");
    }
}

#[test]
fn run_prints_result_text_or_json() {
    let apl = fixture("run/loop_by_runs.apl");
    let mock = fixture("run/loop_by_runs.mock.json");
    let text = aplc(&["run", &apl, "--mock", &mock]);
    assert_eq!(text.status.code(), Some(0), "{}", stderr(&text));
    assert_eq!(stdout(&text), "three\n");

    let json = aplc(&["run", &apl, "--mock", &mock, "--json"]);
    let context: serde_json::Value = serde_json::from_slice(&json.stdout).expect("one JSON object");
    assert_eq!(context["result_text"], "three");
    assert_eq!(context["global_runs"], 3);
    assert_eq!(context["context_history"].as_array().unwrap().len(), 3);
    assert!(context.get("context").is_none());
}

#[test]
fn a_built_bundle_runs_like_its_source() {
    let dir = scratch("bundle");
    let out = dir.join("agent.aplb").to_string_lossy().into_owned();
    let apl = fixture("run/spec_7_4_3_process_loop.apl");
    let mock = fixture("run/spec_7_4_3_process_loop.mock.json");
    let build = aplc(&["build", &apl, "-o", &out]);
    assert_eq!(build.status.code(), Some(0), "{}", stderr(&build));

    // Recognised by its magic bytes, whatever the extension.
    let renamed = dir.join("agent.apl").to_string_lossy().into_owned();
    std::fs::copy(&out, &renamed).unwrap();
    let strip_times = |o: &Output| {
        let mut v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        fn walk(v: &mut serde_json::Value) {
            match v {
                serde_json::Value::Object(m) => {
                    m.remove("time_elapsed");
                    m.remove("time_elapsed_global");
                    m.values_mut().for_each(walk);
                }
                serde_json::Value::Array(a) => a.iter_mut().for_each(walk),
                _ => {}
            }
        }
        walk(&mut v);
        v
    };
    let from_source = aplc(&["run", &apl, "--mock", &mock, "--json"]);
    let from_bundle = aplc(&["run", &renamed, "--mock", &mock, "--json"]);
    assert_eq!(from_bundle.status.code(), from_source.status.code());
    assert_eq!(strip_times(&from_bundle), strip_times(&from_source));
}

#[test]
fn exit_codes() {
    let run = |name: &str, extra: &[&str]| {
        let apl = fixture(&format!("run/{name}.apl"));
        let mock = fixture(&format!("run/{name}.mock.json"));
        let mut args = vec!["run", apl.as_str(), "--mock", mock.as_str()];
        args.extend_from_slice(extra);
        aplc(&args)
    };
    let unknown = run("unknown_step", &[]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(
        stderr(&unknown).contains("Unknown step: finish"),
        "{}",
        stderr(&unknown)
    );

    let budget = run("max_runs_budget", &["--max-runs", "2"]);
    assert_eq!(budget.status.code(), Some(1));
    assert!(stderr(&budget).contains("Run budget exceeded"));

    let errors = run("template_error_in_pre", &[]);
    assert_eq!(errors.status.code(), Some(3));
    assert!(
        stderr(&errors).contains("template error in pre phase"),
        "{}",
        stderr(&errors)
    );
    assert!(!stdout(&errors).is_empty(), "the output is still printed");

    let timeout = run("loop_by_runs", &["--timeout", "0"]);
    assert_eq!(timeout.status.code(), Some(1));
    assert!(stderr(&timeout).contains("timeout"), "{}", stderr(&timeout));
}

#[test]
fn bad_inputs_get_clear_errors() {
    let dir = scratch("bad");
    let apl = fixture("run/simple_one_step.apl");
    let mock = fixture("run/simple_one_step.mock.json");

    // Both --mock and --providers.
    let o = aplc(&["run", &apl, "--mock", &mock, "--providers", &mock]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("one of them"), "{}", stderr(&o));

    // Corrupt bundles: one flipped byte, a truncated file, a future version.
    let out = dir.join("a.aplb").to_string_lossy().into_owned();
    assert_eq!(aplc(&["build", &apl, "-o", &out]).status.code(), Some(0));
    let bytes = std::fs::read(&out).unwrap();
    let mut flipped = bytes.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0xff;
    let mut future = bytes.clone();
    future[8] = 9;
    for (name, data, needle) in [
        ("flipped.aplb", flipped, "checksum"),
        (
            "truncated.aplb",
            bytes[..bytes.len() - 3].to_vec(),
            "truncated",
        ),
        ("future.aplb", future, "version"),
    ] {
        let path = write(&dir, name, data);
        let o = aplc(&["run", &path, "--mock", &mock]);
        assert_eq!(o.status.code(), Some(1), "{name}");
        let err = stderr(&o);
        assert!(
            err.contains("unreadable bundle") && err.contains(needle),
            "{name}: {err}"
        );
        assert!(!err.contains("panicked"), "{name}: {err}");
    }

    // Not UTF-8, a bad mock file, a context that is not an object, a missing file.
    let latin1 = write(&dir, "latin1.apl", b"# prompt:\ncaf\xe9\n");
    let o = aplc(&["check", &latin1]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("UTF-8"));

    let bad_mock = write(&dir, "bad.mock.json", "[1, 2]");
    let o = aplc(&["run", &apl, "--mock", &bad_mock]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("mock entry 0"), "{}", stderr(&o));

    let bad_context = write(&dir, "ctx.json", "[1]");
    let o = aplc(&["run", &apl, "--mock", &mock, "--context", &bad_context]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("JSON object"));

    let reserved = write(&dir, "reserved.json", r#"{"memory": 1}"#);
    let o = aplc(&["run", &apl, "--mock", &mock, "--context", &reserved]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("reserved"), "{}", stderr(&o));

    let o = aplc(&["check", &dir.join("missing.apl").to_string_lossy()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot read"));

    let o = aplc(&["run", &apl, "--mock", &mock, "--max-runs", "lots"]);
    assert_eq!(o.status.code(), Some(2));
}

/// A base URL on 127.0.0.1 where nothing listens. Tests never reach outside the machine.
fn closed_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

#[test]
fn api_keys_are_never_echoed() {
    let apl = fixture("run/simple_one_step.apl");
    let mock = fixture("run/simple_one_step.mock.json");
    let secret = "sk-test-DO-NOT-PRINT-1234";
    let url = closed_port();
    let http = [
        "run",
        &apl,
        "--api-key",
        secret,
        "--base-url",
        &url,
        "--json",
    ];
    let mocked = ["run", &apl, "--mock", &mock, "--api-key", secret, "--json"];
    for args in [&http[..], &mocked[..]] {
        let o = aplc(args);
        assert!(!stdout(&o).contains(secret) && !stderr(&o).contains(secret));
    }
}

#[test]
fn an_unreachable_server_is_a_provider_error_in_errors() {
    let apl = fixture("run/simple_one_step.apl");
    let url = closed_port();
    let o = aplc(&["run", &apl, "--base-url", &url, "--api-key", "k", "--json"]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let ctx: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let errors = &ctx["context_history"][0]["errors"];
    assert!(
        errors[0].as_str().unwrap().starts_with("provider error: "),
        "{errors}"
    );
    assert_eq!(ctx["global_runs"], 0);
}

#[test]
fn relaxed_flag_changes_compilation() {
    let apl = fixture("check/spec_6_1_1_3_relaxed.apl");
    assert_eq!(aplc(&["check", &apl, "--relaxed"]).status.code(), Some(0));
}

#[test]
fn bench_reports_per_run_and_per_step_times() {
    let apl = fixture("run/loop_by_runs.apl");
    let mock = fixture("run/loop_by_runs.mock.json");
    let o = aplc(&[
        "bench", &apl, "--mock", &mock, "-n", "5", "--warmup", "1", "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    assert_eq!(report["runs"], 5);
    assert_eq!(report["steps_per_run"], 3);
    assert_eq!(report["failed_runs"], 0);
    for key in [
        "median_run_us",
        "min_run_us",
        "median_step_us",
        "min_step_us",
        "runs_per_sec",
    ] {
        assert!(
            report[key].as_f64().is_some_and(|v| v > 0.0),
            "{key}: {report}"
        );
    }
    assert!(report["min_run_us"].as_f64() <= report["median_run_us"].as_f64());

    let o = aplc(&[
        "bench",
        &apl,
        "--mock",
        &mock,
        "-n",
        "4",
        "--concurrency",
        "2",
        "--latency-ms",
        "5",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["provider_calls_per_run"], 3.0);
    let fraction = report["fraction_of_bound"].as_f64().unwrap();
    assert!(fraction > 0.0 && fraction <= 1.05, "{report}");

    let o = aplc(&["bench", &apl, "--mock", &mock, "-n", "0"]);
    assert_eq!(o.status.code(), Some(2), "zero runs is a usage error");
}

#[test]
fn providers_route_models() {
    let dir = scratch("providers");
    let config = write(
        &dir,
        "providers.json",
        r#"{"routes": [
            {"model": "gpt-4o", "kind": "mock", "responses": ["routed by exact name"]},
            {"model": "*", "kind": "mock", "responses": ["fallback"]}
        ]}"#,
    );
    let apl = fixture("run/simple_one_step.apl");
    let o = aplc(&["run", &apl, "--providers", &config]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), "routed by exact name\n");

    let bad = write(
        &dir,
        "bad.json",
        r#"{"routes": [{"model": "*", "kind": "openai", "api_key": "sk-x"}]}"#,
    );
    let o = aplc(&["run", &apl, "--providers", &bad]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("api_key_env"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("sk-x"));

    let missing_env = write(
        &dir,
        "env.json",
        r#"{"routes": [{"model": "*", "kind": "openai", "api_key_env": "APLC_TEST_UNSET_VARIABLE"}]}"#,
    );
    let o = aplc(&["run", &apl, "--providers", &missing_env]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("APLC_TEST_UNSET_VARIABLE"),
        "{}",
        stderr(&o)
    );
}

/// The "no API key" warning belongs to runs that will call the HTTP provider: a file
/// that cannot be read (or does not compile) gets its own error only.
#[test]
fn no_api_key_warning_only_when_the_run_needs_it() {
    let dir = scratch("nokey");
    let run = |file: &str| {
        Command::new(env!("CARGO_BIN_EXE_aplc"))
            .args(["run", file, "--timeout", "1"])
            .env("NO_COLOR", "1")
            .env_remove("OPENAI_API_KEY")
            .output()
            .expect("aplc runs")
    };
    let o = run(&dir.join("missing.apl").to_string_lossy());
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot read"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("API key"), "{}", stderr(&o));

    let bad = write(&dir, "bad.apl", "## user\nhi\n");
    let o = run(&bad);
    assert_eq!(o.status.code(), Some(2));
    assert!(!stderr(&o).contains("API key"), "{}", stderr(&o));

    // A valid agent does need the key: the warning comes, once.
    let ok = write(&dir, "ok.apl", "# prompt: a\nhi\n");
    let o = run(&ok);
    assert_eq!(
        stderr(&o).matches("no API key").count(),
        1,
        "{}",
        stderr(&o)
    );
}

/// `await_input` and `human_input` are known names (no APL0018), and APL0025, where no
/// ask can precede a read of `human_input`, is a warning: the file still builds.
#[test]
fn human_input_warnings_do_not_block_a_build() {
    let clean = aplc(&["check", &fixture("check/human_input_after_await.apl")]);
    assert_eq!(clean.status.code(), Some(0), "{}", stderr(&clean));
    assert_eq!(stderr(&clean), "ok: 2 steps, 4 templates\n");

    let apl = fixture("check/warn_human_input_without_await.apl");
    let warned = aplc(&["check", "--format", "json", &apl]);
    assert_eq!(warned.status.code(), Some(0), "{}", stderr(&warned));
    let codes: Vec<String> = stdout(&warned)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["code"].to_string())
        .collect();
    assert_eq!(codes, ["\"APL0025\""]);

    let dir = scratch("human-input");
    let out = dir.join("agent.aplb");
    let build = aplc(&["build", &apl, "-o", &out.to_string_lossy()]);
    assert_eq!(build.status.code(), Some(0), "{}", stderr(&build));
    assert!(
        stderr(&build).contains("[APL0025] Warning"),
        "{}",
        stderr(&build)
    );
    assert!(out.is_file());
    std::fs::remove_dir_all(&dir).ok();
}

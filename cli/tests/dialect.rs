//! The binary, black box: `--dialect defuss-1.1` lets agents written for defuss-apl 1.1.0
//! call its helpers; without it the same agent is refused before it runs.

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
    let dir = std::env::temp_dir().join(format!("aplc-dialect-{}-{name}", std::process::id()));
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

/// Loops three times with `inc` and `next`, then `add`s, `rem`s and reads `prev()` and
/// `result()`.
const AGENT: &str = "\
# pre: count
{{ inc('counter') }}
{{ set('stats.last', counter) }}

# prompt: count
## user
Count {{ get('stats.last') }}

# post: count
{% if counter < 3 %}{{ next('count') }}{% else %}{{ next('done') }}{% endif %}

# pre: done
{{ add('total', counter) }}{{ rem('total', 1) }}

# prompt: done
## user
Previous: {{ prev() }}, result {{ result() }}
";

#[test]
fn defuss_agents_run_with_the_dialect_and_are_refused_without_it() {
    let dir = scratch("run");
    let apl = write(&dir, "agent.apl", AGENT);
    let mock = write(&dir, "mock.json", r#"["a", "b", "c", "d"]"#);

    let o = aplc(&["check", &apl]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("Unknown function: inc"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        aplc(&["check", "--dialect", "defuss-1.1", &apl])
            .status
            .code(),
        Some(0)
    );

    // From source and from a bundle built in the dialect.
    let bundle = dir.join("agent.aplb").to_string_lossy().into_owned();
    let o = aplc(&["build", "--dialect", "defuss-1.1", &apl, "-o", &bundle]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    for agent in [&apl, &bundle] {
        let o = aplc(&[
            "run",
            "--dialect",
            "defuss-1.1",
            agent,
            "--mock",
            &mock,
            "--json",
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let context: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(context["counter"], 3);
        assert_eq!(context["stats"], serde_json::json!({"last": 3}));
        assert_eq!(context["total"], 2);
        assert_eq!(context["result_text"], "d");
        assert_eq!(
            context["prompts"][0]["content"],
            "Previous: count, result c"
        );
    }
    // The bundle records its dialect: it runs in it without the flag.
    let o = aplc(&["run", &bundle, "--mock", &mock, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let context: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(context["counter"], 3);
    assert_eq!(context["result_text"], "d");
}

#[test]
fn an_unknown_dialect_is_a_usage_error() {
    let dir = scratch("unknown");
    let apl = write(&dir, "agent.apl", AGENT);
    let o = aplc(&["check", "--dialect", "defuss-9", &apl]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unknown dialect `defuss-9`; known: spec, defuss-1.1"));
}

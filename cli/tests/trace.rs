//! `aplc run --verbose` and `aplc trace FILE` end to end: the verbose lines of the events
//! fixture (tools, a loop, errors), and the timeline of a committed events file, of a
//! malformed one and of one cut short.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use aplc_test_support::process::without_times;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/events")
        .join(name)
}

fn aplc_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aplc"))
        .current_dir(dir)
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("aplc runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("aplc-trace-{}-{name}", std::process::id()))
}

#[test]
fn verbose_prints_steps_calls_and_errors_on_stderr() {
    let out = aplc_in(
        &fixture(""),
        &[
            "run",
            "agent.apl",
            "--mock",
            "mock.json",
            "--tools",
            "tools.json",
            "--verbose",
        ],
    );
    assert_eq!(out.status.code(), Some(3));
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    // The output is still result_text alone.
    assert!(
        !text(&out.stdout).contains("step work"),
        "{}",
        text(&out.stdout)
    );
    insta::assert_snapshot!(without_times(&stderr));
}

#[test]
fn verbose_lines_are_indented_by_nesting() {
    let out = aplc_in(
        &fixture(""),
        &[
            "run",
            "agent.apl",
            "--mock",
            "mock.json",
            "--tools",
            "tools.json",
            "-v",
        ],
    );
    let stderr = text(&out.stderr);
    let line = |needle: &str| {
        stderr
            .lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle}: {stderr}"))
            .to_string()
    };
    let indent = |l: String| {
        l.split("ms  ")
            .nth(1)
            .map(|r| r.len() - r.trim_start().len())
    };
    assert_eq!(indent(line("step work (runs 0)")), Some(0));
    assert_eq!(indent(line("provider gpt-4o")), Some(2));
    assert_eq!(indent(line("tool add [call_1]: ok")), Some(2));
}

#[test]
fn trace_of_the_committed_events_file() {
    let out = aplc_in(&fixture(""), &["trace", "run.events.jsonl"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    insta::assert_snapshot!(text(&out.stdout));
}

#[test]
fn trace_reads_stdin() {
    let events = std::fs::read(fixture("run.events.jsonl")).expect("the fixture");
    let mut child = Command::new(env!("CARGO_BIN_EXE_aplc"))
        .args(["trace", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("aplc runs");
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(&events)
        .expect("written");
    let out = child.wait_with_output().expect("aplc ends");
    assert_eq!(out.status.code(), Some(0));
    let from_file = aplc_in(&fixture(""), &["trace", "run.events.jsonl"]);
    assert_eq!(text(&out.stdout), text(&from_file.stdout));
}

#[test]
fn trace_of_a_run_just_made_matches_its_totals() {
    let file = scratch("fresh.jsonl");
    let run = aplc_in(
        &fixture(""),
        &[
            "run",
            "agent.apl",
            "--mock",
            "mock.json",
            "--tools",
            "tools.json",
            "-q",
            "--events",
            &file.to_string_lossy(),
        ],
    );
    assert_eq!(run.status.code(), Some(3));
    let out = aplc_in(&fixture(""), &["trace", &file.to_string_lossy()]);
    let _ = std::fs::remove_file(&file);
    let stdout = text(&out.stdout);
    for expected in [
        "steps           3\n",
        "provider calls  3 (1 failed)\n",
        "tool calls      2 (1 failed, 0 cached)\n",
        "tokens          42 in, 8 out\n",
        "errors          2\n",
        "status          completed_with_errors\n",
    ] {
        assert!(stdout.contains(expected), "{expected}: {stdout}");
    }
}

#[test]
fn trace_of_a_malformed_file_names_the_line() {
    let events = std::fs::read_to_string(fixture("run.events.jsonl")).expect("the fixture");
    let mut lines: Vec<&str> = events.lines().collect();
    lines[4] = r#"{"seq":4,"t_ms":0.4,"type":"provider_call","step":"work"}"#;
    let file = scratch("malformed.jsonl");
    std::fs::write(&file, lines.join("\n") + "\n").expect("written");
    let out = aplc_in(&fixture(""), &["trace", &file.to_string_lossy()]);
    let _ = std::fs::remove_file(&file);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("line 5: not an event: missing field `model`"),
        "{stderr}"
    );
    // What came before the bad line is still shown.
    assert!(text(&out.stdout).contains("step work (runs 0)"));
}

#[test]
fn trace_of_a_file_cut_short_says_the_run_did_not_finish() {
    let events = std::fs::read_to_string(fixture("run.events.jsonl")).expect("the fixture");
    // Cut in the middle of line 8, as a killed writer leaves it.
    let cut: usize = events.lines().take(7).map(|l| l.len() + 1).sum::<usize>() + 20;
    let file = scratch("cut.jsonl");
    std::fs::write(&file, &events[..cut]).expect("written");
    let out = aplc_in(&fixture(""), &["trace", &file.to_string_lossy()]);
    let _ = std::fs::remove_file(&file);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    insta::assert_snapshot!(text(&out.stdout));
}

#[test]
fn trace_of_a_missing_file_is_a_usage_error() {
    let out = aplc_in(&fixture(""), &["trace", "no-such-file.jsonl"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("cannot read no-such-file.jsonl"));
}

#[test]
fn verbose_redacts_the_runs_secrets() {
    let out = Command::new(env!("CARGO_BIN_EXE_aplc"))
        .current_dir(fixture(""))
        .args([
            "run",
            "agent.apl",
            "--mock",
            "mock.json",
            "--tools",
            "tools.json",
            "-v",
        ])
        .env("OPENAI_API_KEY", "overloaded")
        .output()
        .expect("aplc runs");
    let stderr = text(&out.stderr);
    let verbose: Vec<&str> = stderr.lines().filter(|l| l.contains(" ms  ")).collect();
    let failed = verbose
        .iter()
        .find(|l| l.contains("failed (other)"))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(failed.ends_with("the model is <redacted>"), "{failed}");
    assert!(
        !verbose.iter().any(|l| l.contains("overloaded")),
        "{stderr}"
    );
}

//! People in the loop on the command line (spec/human.md §4.1), with the fixtures of
//! `fixtures/human/`: `aplc run --store` pauses (exit 4) and `aplc resume` with
//! `--approve`, `--deny`, `--input`, `--input-file` and `--as` goes on, a few answers at a
//! time; bad answers change nothing; a run without a store fails; a timeout denies.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use aplc_test_support::pg;
use aplc_test_support::process::root;
use aplc_test_support::{aplc, scratch_in};
use serde_json::{Value as Json, json};

/// A scratch copy of fixtures/human, its tools logging each run to `tools.log`.
fn fixture(name: &str) -> PathBuf {
    let dir = scratch_in!("human", name);
    for file in ["refund.apl", "refund.mock.json", "tools.json", "tool.py"] {
        std::fs::copy(root().join("fixtures/human").join(file), dir.join(file)).unwrap();
    }
    dir
}

fn aplc_in(dir: &Path, args: &[&str]) -> Command {
    let mut command = aplc!(dir, args);
    command.env("APLC_TOOL_LOG", dir.join("tools.log"));
    command
}

/// `aplc ARGS --tools tools.json --mock refund.mock.json` on the store.
fn run(dir: &Path, store: &str, args: &[&str]) -> Output {
    let mut all = args.to_vec();
    all.extend([
        "--tools",
        "tools.json",
        "--mock",
        "refund.mock.json",
        "--store",
        store,
    ]);
    aplc_in(dir, &all).output().expect("aplc runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The tool runs `tools.log` recorded.
fn tool_runs(dir: &Path) -> Vec<Json> {
    std::fs::read_to_string(dir.join("tools.log"))
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn the_three_kinds(store: &str, dir: &Path) {
    let out = run(dir, store, &["run", "refund.apl", "--run-id", "r1"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("waiting for input: 1-2 (approval: Approve a call of `refund`?)"),
        "{err}"
    );
    assert!(err.contains("waiting for input: 1-3 (approval"), "{err}");
    // The call with invalid arguments (1-4) was refused by the checks: nobody is asked.
    assert!(!err.contains("1-4"), "{err}");
    let shown = aplc_in(dir, &["runs", "show", "r1", "--store", store])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("status:   waiting"), "{shown}");
    assert!(shown.contains("waiting for input: 1-2"), "{shown}");
    let json = aplc_in(dir, &["runs", "show", "r1", "--store", store, "--json"])
        .output()
        .unwrap();
    let json: Json = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(json["pending"].as_array().map(Vec::len), Some(2), "{json}");
    let listed = aplc_in(dir, &["runs", "list", "--store", store])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&listed.stdout).contains("waiting"));
    // Nothing of the round ran: it waits for every approval first.
    assert_eq!(tool_runs(dir).len(), 0);

    // One answer: still waiting on the other.
    let out = run(dir, store, &["resume", "r1", "--approve", "1-2"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("waiting for input: 1-3"),
        "{}",
        stderr(&out)
    );
    assert_eq!(tool_runs(dir).len(), 0, "the round waits for every answer");

    // The denial: the round runs (the approved refund once), and the human tool asks.
    let out = run(
        dir,
        store,
        &[
            "resume",
            "r1",
            "--deny",
            "1-3=over the limit",
            "--as",
            "alice",
        ],
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(stderr(&out).contains("waiting for input: 2-1 (tool: The agent asks you a question.)"));
    let refunds: Vec<Json> = tool_runs(dir)
        .into_iter()
        .filter(|r| r["tool"] == "refund")
        .collect();
    assert_eq!(
        refunds,
        [json!({"tool": "refund", "arguments": {"order": "A-17", "amount": 20}})]
    );

    // The human tool's answer from a file, then the await_input's.
    std::fs::write(
        dir.join("answers.json"),
        r#"{"2-1": "the customer asked twice"}"#,
    )
    .unwrap();
    let out = run(
        dir,
        store,
        &["resume", "r1", "--input-file", "answers.json"],
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("waiting for input: 3-0 (input: Send the summary to the customer?)")
    );
    let out = run(
        dir,
        store,
        &["resume", "r1", "--input", "3-0=true", "--json"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let context: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(context["human_input"], json!(true));
    assert_eq!(context["result_text"], "Summary sent.");
    let transcript = context["transcript"].to_string();
    // The denial reached the model's next prompt (the transcript is its tool_result
    // section), and so did the human tool's answer.
    assert!(
        transcript.contains("denied by reviewer: over the limit"),
        "{transcript}"
    );
    assert!(
        transcript.contains("the customer asked twice"),
        "{transcript}"
    );
    assert_eq!(
        tool_runs(dir)
            .iter()
            .filter(|r| r["tool"] == "refund")
            .count(),
        1
    );
    // The audit trail: who answered what.
    let events = aplc_in(dir, &["runs", "events", "r1", "--store", store])
        .output()
        .unwrap();
    let received: Vec<Json> = String::from_utf8_lossy(&events.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Json>(l).unwrap())
        .filter(|e| e["type"] == "input_received")
        .collect();
    let by: Vec<(&str, &str)> = received
        .iter()
        .map(|e| (e["id"].as_str().unwrap(), e["by"].as_str().unwrap()))
        .collect();
    assert_eq!(
        by,
        [
            ("1-2", "cli"),
            ("1-3", "alice"),
            ("2-1", "cli"),
            ("3-0", "cli")
        ]
    );
}

#[test]
fn the_three_kinds_answered_a_few_at_a_time_on_sqlite() {
    let dir = fixture("kinds-sqlite");
    the_three_kinds("sqlite:runs.db", &dir);
}

#[test]
fn the_three_kinds_answered_a_few_at_a_time_on_postgres() {
    let dir = fixture("kinds-postgres");
    the_three_kinds(&pg::shared().database("human_cli"), &dir);
}

#[test]
fn bad_answers_are_refused_and_change_nothing() {
    let dir = fixture("bad");
    let store = "sqlite:runs.db";
    let out = run(&dir, store, &["run", "refund.apl", "--run-id", "b"]);
    assert_eq!(out.status.code(), Some(4));
    let refused = |args: &[&str], needle: &str| {
        let mut all = vec!["resume", "b"];
        all.extend_from_slice(args);
        let out = run(&dir, store, &all);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(needle), "{args:?}: {}", stderr(&out));
    };
    refused(&["--approve", "9-9"], "it waits for: 1-2, 1-3");
    refused(&["--input", "1-2=5"], "asks for an approval");
    refused(&["--input", "1-2=not json"], "the answer is not JSON");
    // A good answer beside a bad one: neither is stored.
    refused(
        &["--approve", "1-2", "--approve", "7-7"],
        "no request `7-7`",
    );
    refused(&["--approve", "1-2", "--deny", "1-2"], "answered twice");
    let out = run(&dir, store, &["resume", "b", "--approve", "1-2"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    refused(
        &["--deny", "1-2"],
        "waits for no request `1-2` (answered already",
    );
    // Finished: no more answers.
    run(&dir, store, &["resume", "b", "--approve", "1-3"]);
    run(&dir, store, &["resume", "b", "--input", "2-1=\"ok\""]);
    let out = run(&dir, store, &["resume", "b", "--input", "3-0=false"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = run(&dir, store, &["resume", "b", "--input", "3-0=true"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("already finished"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn without_a_store_and_a_terminal_a_run_that_asks_fails() {
    let dir = fixture("no-store");
    let out = aplc_in(
        &dir,
        &[
            "run",
            "refund.apl",
            "--tools",
            "tools.json",
            "--mock",
            "refund.mock.json",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("the run needs input (1-2 (approval: Approve a call of `refund`?)"),
        "{err}"
    );
    assert!(err.contains("run it with --store"), "{err}");
    assert!(tool_runs(&dir).iter().all(|r| r["tool"] != "refund"));
}

#[test]
fn an_approval_whose_timeout_passed_is_denied_on_resume() {
    let dir = fixture("timeout");
    let mut tools: Json =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tools.json")).unwrap()).unwrap();
    tools["refund"]["approval_timeout_ms"] = json!(300);
    std::fs::write(dir.join("tools.json"), tools.to_string()).unwrap();
    let store = "sqlite:runs.db";
    let out = run(&dir, store, &["run", "refund.apl", "--run-id", "t"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    std::thread::sleep(std::time::Duration::from_millis(500));
    // Nobody answered in time: both approvals count as denied, and the run asks on.
    let out = run(&dir, store, &["resume", "t"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("waiting for input: 2-1"),
        "{}",
        stderr(&out)
    );
    assert!(tool_runs(&dir).iter().all(|r| r["tool"] != "refund"));
    let events = aplc_in(&dir, &["runs", "events", "t", "--store", store])
        .output()
        .unwrap();
    let events = String::from_utf8_lossy(&events.stdout);
    assert!(
        events.contains("denied: no answer within 300 ms"),
        "{events}"
    );
}

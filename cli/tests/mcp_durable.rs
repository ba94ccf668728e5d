//! MCP tools in durable runs and in events (spec/mcp.md, spec/durability.md,
//! spec/events.md), through the `aplc` binary against a real MCP server over stdio
//! (`fixtures/mcp/counter_server.py`, PyPI `mcp`; `APLC_MCP_PYTHON`, see
//! `aplc_test_support::mcp`): `aplc run --store` SIGKILLed during an MCP call, then `aplc resume`d
//! (a non-idempotent call is not sent again, an idempotent one is); a resume whose MCP
//! tools differ is refused; a durable run's journal shows its MCP calls; `tool_call`
//! events name the server, and a server's progress notifications become `tool_progress`
//! events.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use aplc_test_support::process::{succeed, wait_for};
use aplc_test_support::{aplc, scratch_in};
use serde_json::{Value as Json, json};

use aplc_test_support::mcp::{calls, count, counter};

/// What a test waits for at most: 120 s, since a loaded machine starts Python slowly.
const WAIT: Duration = Duration::from_secs(120);

const AGENT: &str = "# prompt: go\nUse the tools.\n";
const INTERRUPTED: &str = "interrupted; not retried because the tool is not idempotent";

fn scratch(name: &str) -> PathBuf {
    scratch_in!("mcp_durable", name)
}

/// Writes the agent, the scripted answer `mock` and the manifest `tools.json` with the
/// counter server (prefix `c_`, `extra` keys on top).
fn setup(dir: &Path, mock: &Json, extra: Json) {
    std::fs::write(dir.join("agent.apl"), AGENT).unwrap();
    std::fs::write(dir.join("mock.json"), mock.to_string()).unwrap();
    let mut server = counter(dir, json!({"prefix": "c_"}));
    if let (Some(server), Json::Object(extra)) = (server.as_object_mut(), extra) {
        server.extend(extra);
    }
    write_manifest(dir, "tools.json", server);
}

fn write_manifest(dir: &Path, file: &str, server: Json) {
    let manifest = json!({"mcpServers": {"counter": server}});
    std::fs::write(dir.join(file), manifest.to_string()).unwrap();
}

fn store(dir: &Path) -> String {
    format!("sqlite:{}", dir.join("runs.db").display())
}

/// `aplc run` of the agent, durable, as run `id`.
fn run_command(dir: &Path, id: &str) -> Command {
    let store = store(dir);
    aplc!(
        dir,
        &[
            "run",
            "agent.apl",
            "--mock",
            "mock.json",
            "--tools",
            "tools.json",
            "--store",
            &store,
            "--run-id",
            id,
            "--json",
            "--quiet",
        ],
    )
}

/// `aplc resume id` with the manifest `tools`.
fn resume_command(dir: &Path, id: &str, tools: &str) -> Command {
    let store = store(dir);
    aplc!(
        dir,
        &[
            "resume",
            id,
            "--store",
            &store,
            "--mock",
            "mock.json",
            "--tools",
            tools,
            "--json",
            "--quiet",
        ],
    )
}

/// Starts run `id` and SIGKILLs aplc once the server counted the slow call's side
/// effect: the call is in flight. Then kills the server, which would sleep on (it sees
/// its stdin close only when it next reads).
fn kill_during_the_slow_call(dir: &Path, id: &str) {
    let mut child: Child = run_command(dir, id)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn aplc");
    wait_for("the slow call's side effect", WAIT, || count(dir) >= 1);
    child.kill().expect("SIGKILL aplc");
    let status = child.wait().expect("reap aplc");
    assert!(!status.success(), "aplc was killed, yet it succeeded");
    if let Some(pid) = std::fs::read_to_string(dir.join("server.pid"))
        .ok()
        .and_then(|pid| pid.trim().parse::<i32>().ok())
    {
        // SAFETY: a plain syscall on the pid the test's own server wrote.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// Runs `command` to the end of its run: exit 0, or 3 when its last step ended with
/// errors (an interrupted call is one).
fn finish(command: &mut Command) -> Output {
    let output = command.output().expect("run aplc");
    assert!(
        matches!(output.status.code(), Some(0 | 3)),
        "{:?}; stderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The final context printed with `--json`.
fn context(output: &Output) -> Json {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON context ({e}); stderr:\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

/// `result_tool_calls` by call id: `(content, with_error)`.
fn result(context: &Json, id: &str) -> (Json, bool) {
    let entries = context["result_tool_calls"].as_array().cloned();
    let entries = entries.unwrap_or_else(|| panic!("no result_tool_calls in {context}"));
    let mine: Vec<&Json> = entries
        .iter()
        .filter(|e| e["tool_call_id"] == json!(id))
        .collect();
    assert_eq!(mine.len(), 1, "exactly one entry for {id}: {entries:?}");
    (
        mine[0]["content"].clone(),
        mine[0]["with_error"] == json!(true),
    )
}

/// The slow call and a quick one after it, in one answer.
fn slow_then_add() -> Json {
    calls(&[
        ("c_bump_slow", json!({"seconds": 300})),
        ("c_add", json!({"a": 1, "b": 2})),
    ])
}

#[test]
fn a_non_idempotent_mcp_call_in_flight_at_a_kill_is_not_sent_again() {
    let dir = scratch("not-idempotent");
    // `bump_slow` says `destructiveHint: true`: not idempotent.
    setup(&dir, &slow_then_add(), json!({}));
    kill_during_the_slow_call(&dir, "crash");

    let output = finish(&mut resume_command(&dir, "crash", "tools.json"));
    assert_eq!(
        output.status.code(),
        Some(3),
        "the interrupted call is an error"
    );
    assert_eq!(count(&dir), 1, "the interrupted call was not sent again");
    let context = context(&output);
    let (content, failed) = result(&context, "call_0");
    assert!(failed, "{content}");
    assert!(
        content.as_str().is_some_and(|c| c.contains(INTERRUPTED)),
        "{content}"
    );
    // The run went on with the restarted server.
    assert_eq!(result(&context, "call_1"), (json!({"sum": 3}), false));
}

#[test]
fn an_idempotent_mcp_call_in_flight_at_a_kill_is_sent_again_once() {
    let dir = scratch("idempotent");
    setup(&dir, &slow_then_add(), json!({"idempotent": ["bump_slow"]}));
    kill_during_the_slow_call(&dir, "crash");

    let output = succeed(&mut resume_command(&dir, "crash", "tools.json"));
    assert_eq!(count(&dir), 2, "the call was sent again");
    let context = context(&output);
    // Once in the final context, with the answer of the call sent again.
    assert_eq!(result(&context, "call_0"), (json!("count=2"), false));
    assert_eq!(result(&context, "call_1"), (json!({"sum": 3}), false));
    assert_eq!(context["errors"], json!([]), "{context}");
}

/// A resume offers the MCP tools the run started with, or is refused (the rule of every
/// tool: spec/durability.md, "Tools"): a tool filtered out, another prefix, another
/// idempotency.
#[test]
fn a_resume_with_other_mcp_tools_is_refused() {
    let dir = scratch("tools-differ");
    setup(&dir, &slow_then_add(), json!({}));
    kill_during_the_slow_call(&dir, "crash");

    let others = [
        json!({"prefix": "c_", "tools": ["add", "greet"]}),
        json!({"prefix": "d_"}),
        json!({"prefix": "c_", "idempotent": true}),
    ];
    for (i, extra) in others.into_iter().enumerate() {
        let file = format!("other{i}.json");
        write_manifest(&dir, &file, counter(&dir, extra));
        let output = resume_command(&dir, "crash", &file).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{file}: {stderr}");
        assert!(
            stderr.contains("the tools differ from the ones it started with"),
            "{file}: {stderr}"
        );
    }
    assert_eq!(count(&dir), 1, "no refused resume called a tool");
    // The same tools still resume it.
    finish(&mut resume_command(&dir, "crash", "tools.json"));
}

/// A durable run with MCP calls: its journal (`aplc runs show`, `aplc runs events`)
/// holds the calls and their results, the `tool_call` events name the server, and
/// `aplc trace` reads them.
#[test]
fn a_durable_run_journals_its_mcp_calls() {
    let dir = scratch("journal");
    let mock = calls(&[("c_add", json!({"a": 40, "b": 2})), ("c_bump", json!({}))]);
    setup(&dir, &mock, json!({}));
    let live = context(&succeed(&mut run_command(&dir, "done")));
    assert_eq!(result(&live, "call_0"), (json!({"sum": 42}), false));
    assert_eq!(result(&live, "call_1"), (json!("count=1"), false));

    let store = store(&dir);
    let shown = succeed(&mut aplc!(
        &dir,
        &["runs", "show", "done", "--store", &store, "--json"]
    ));
    let shown = context(&shown);
    assert_eq!(shown["result_tool_calls"], live["result_tool_calls"]);

    let events = succeed(&mut aplc!(
        &dir,
        &["runs", "events", "done", "--store", &store]
    ));
    let calls: Vec<Json> = String::from_utf8_lossy(&events.stdout)
        .lines()
        .map(|line| serde_json::from_str::<Json>(line).unwrap())
        .filter(|e| e["type"] == "tool_call")
        .collect();
    assert_eq!(calls.len(), 2, "{calls:?}");
    for call in &calls {
        assert_eq!(call["source"], "mcp", "{call}");
        assert_eq!(call["server"], "counter", "{call}");
    }
    std::fs::write(dir.join("events.jsonl"), &events.stdout).unwrap();
    let trace = succeed(&mut aplc!(&dir, &["trace", "events.jsonl"]));
    let trace = String::from_utf8_lossy(&trace.stdout);
    assert!(trace.contains("tool c_add [call_0]: ok"), "{trace}");
    assert!(trace.contains("tool c_bump [call_1]: ok"), "{trace}");
    assert_eq!(count(&dir), 1);
}

/// The lines of a JSON Lines file of events.
fn events(text: &str) -> Vec<Json> {
    text.lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

/// A server's `notifications/progress` during a call reach `--events` as `tool_progress`
/// events, in order, with their call's `seq`, redacted; they are live only: the journal
/// of the same durable run has none.
#[test]
fn progress_notifications_become_live_tool_progress_events() {
    let dir = scratch("progress");
    let secret = "progress-secret-0123456789";
    let mock = calls(&[
        ("c_steps", json!({"n": 3, "note": format!(" ({secret})")})),
        ("c_add", json!({"a": 1, "b": 1})),
    ]);
    setup(&dir, &mock, json!({"env": {"NOTE_SECRET": secret}}));
    let output = finish(run_command(&dir, "progress").args(["--events", "events.jsonl"]));
    let context = context(&output);
    assert_eq!(result(&context, "call_0"), (json!("did 3 steps"), false));

    let text = std::fs::read_to_string(dir.join("events.jsonl")).unwrap();
    assert!(!text.contains(secret), "{text}");
    let live = events(&text);
    let call = live
        .iter()
        .find(|e| e["type"] == "tool_call" && e["tool"] == "c_steps")
        .unwrap_or_else(|| panic!("no tool_call: {text}"));
    let progress: Vec<&Json> = live
        .iter()
        .filter(|e| e["type"] == "tool_progress")
        .collect();
    assert_eq!(progress.len(), 3, "{text}");
    for (i, event) in progress.iter().enumerate() {
        let n = i + 1;
        assert_eq!(event["seq"], call["seq"], "{event}");
        assert_eq!(event["step"], "go", "{event}");
        assert_eq!(event["tool"], "c_steps", "{event}");
        assert_eq!(event["call_id"], "call_0", "{event}");
        assert_eq!(event["progress"], json!(n as f64), "{event}");
        assert_eq!(event["total"], json!(3.0), "{event}");
        let message = event["message"].as_str().unwrap_or_default();
        assert!(message.starts_with(&format!("step {n} of 3 (")), "{event}");
    }
    // Between the call and its result, and only for the tool that reports.
    let position = |pred: &dyn Fn(&Json) -> bool| live.iter().position(pred).unwrap();
    let first = position(&|e| e["type"] == "tool_progress");
    let result_at = position(&|e| e["type"] == "tool_result" && e["tool"] == "c_steps");
    assert!(first < result_at, "{text}");

    let store = store(&dir);
    let journaled = succeed(&mut aplc!(
        &dir,
        &["runs", "events", "progress", "--store", &store]
    ));
    let journaled = events(&String::from_utf8_lossy(&journaled.stdout));
    assert!(journaled.iter().all(|e| e["type"] != "tool_progress"));
    let live_machine: Vec<&Json> = live
        .iter()
        .filter(|e| e["type"] != "tool_progress")
        .collect();
    assert_eq!(
        journaled.len(),
        live_machine.len(),
        "the same events otherwise"
    );
}

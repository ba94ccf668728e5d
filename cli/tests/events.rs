//! Run events: `aplc run --events` end to end (a snapshot with tools, a loop and errors),
//! the order and numbering of events, and that a run nobody listens to records none.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use aplc_compiler::{Options, compile};
use aplc_vm::{Action, Event, EventKind, Limits, Machine, Program, RunOptions};
use serde_json::Value as Json;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/events")
        .join(name)
}

fn aplc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aplc"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("aplc runs")
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// The events file of `aplc run` on the fixture, parsed, and the exit code. It runs in
/// the fixture's folder, so `agent` is the same wherever the checkout is.
fn run_fixture(events: &Path) -> (i32, Vec<Json>) {
    let out = Command::new(env!("CARGO_BIN_EXE_aplc"))
        .current_dir(fixture(""))
        .args([
            "run",
            "agent.apl",
            "--mock",
            "mock.json",
            "--tools",
            "tools.json",
        ])
        .arg("--events")
        .arg(events)
        .arg("--quiet")
        .env("NO_COLOR", "1")
        .output()
        .expect("aplc runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let text = std::fs::read_to_string(events).expect("the events file was written");
    let lines = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    (out.status.code().unwrap_or(-1), lines)
}

/// Times vary from run to run: every time field becomes `"[ms]"`.
fn without_times(mut event: Json) -> Json {
    fn redact(value: &mut Json) {
        if let Json::Object(map) = value {
            for (key, field) in map.iter_mut() {
                if key == "t_ms" || (key.ends_with("_ms") && key != "timeout_ms") {
                    *field = Json::String("[ms]".into());
                } else {
                    redact(field);
                }
            }
        }
    }
    redact(&mut event);
    event
}

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("aplc-events-{}-{name}", std::process::id()))
}

#[test]
fn run_events_with_tools_a_loop_and_errors() {
    let file = scratch("snapshot.jsonl");
    let (code, events) = run_fixture(&file);
    let _ = std::fs::remove_file(&file);
    assert_eq!(code, 3, "the last step ended with errors");
    let text: Vec<String> = events
        .into_iter()
        .map(|e| without_times(e).to_string())
        .collect();
    insta::assert_snapshot!(text.join("\n"));
}

#[test]
fn every_line_has_seq_t_ms_and_type_in_order() {
    let file = scratch("order.jsonl");
    let (_, events) = run_fixture(&file);
    let _ = std::fs::remove_file(&file);
    let mut last_t = 0.0;
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event["seq"], i as u64, "{event}");
        let t = event["t_ms"].as_f64().expect("t_ms is a number");
        assert!(t >= last_t, "time never goes back: {event}");
        last_t = t;
        assert!(event["type"].is_string(), "{event}");
    }
    assert_eq!(events.first().unwrap()["type"], "run_started");
    assert_eq!(events.last().unwrap()["type"], "run_finished");
    assert_eq!(events.last().unwrap()["outcome"], "completed_with_errors");
}

#[test]
fn events_can_go_to_stderr() {
    let out = aplc(&[
        "run",
        &path(&fixture("agent.apl")),
        "--mock",
        &path(&fixture("mock.json")),
        "--tools",
        &path(&fixture("tools.json")),
        "--events",
        "/dev/stderr",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let events: Vec<Json> = stderr
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    assert_eq!(events.first().unwrap()["type"], "run_started", "{stderr}");
    assert_eq!(events.last().unwrap()["type"], "run_finished", "{stderr}");
    // The run's own report still follows the events.
    assert!(
        stderr.contains("the last step ended with errors"),
        "{stderr}"
    );
}

fn program(source: &str) -> Arc<Program> {
    let c = compile(source, "test.apl", &Options::default());
    let bundle = c.bundle.unwrap_or_else(|| panic!("{:?}", c.diagnostics));
    Arc::new(Program::from_bundle(bundle, Limits::default()).unwrap())
}

const LOOP: &str = "# pre: a\n{{ missing }}\n# prompt: a\nhi\n# post: a\n{% if runs < 2 %}{{ set_context('next_step', 'a') }}{% endif %}\n";

/// Drives a machine by hand, 1 ms per call, answering every provider call; returns the
/// events drained after each call.
fn drive(options: RunOptions) -> Vec<Event> {
    let mut machine = Machine::new(program(LOOP), options);
    let mut events: Vec<Event> = machine.drain_events().collect();
    let mut t = 0;
    let mut tick = || {
        t += 1;
        Duration::from_millis(t)
    };
    loop {
        let action = machine.poll(tick());
        events.extend(machine.drain_events());
        match action {
            Action::CallProvider(_) => {
                let reply = serde_json::json!({"choices": [{"message": {"role": "assistant",
                    "content": "ok"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 2}});
                let reply = aplc_vm::wire::openai::decode_value(&reply).unwrap();
                machine.handle_provider_response(tick(), Ok(reply));
                events.extend(machine.drain_events());
            }
            Action::CallTool(_) => panic!("no tools here"),
            Action::Continue => {}
            Action::Done | Action::AwaitInput => break,
        }
    }
    events
}

#[test]
fn a_run_nobody_listens_to_records_nothing() {
    assert!(drive(RunOptions::default()).is_empty());
}

#[test]
fn events_come_in_order_with_consecutive_seq() {
    let events = drive(RunOptions {
        events: true,
        ..RunOptions::default()
    });
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event.seq, i as u64);
    }
    let types: Vec<String> = events
        .iter()
        .map(|e| e.to_json()["type"].as_str().unwrap().to_string())
        .collect();
    let step = [
        "step_started",
        "error",
        "phase_finished",
        "phase_finished",
        "provider_call",
        "provider_result",
        "phase_finished",
        "step_finished",
    ];
    let mut expected = vec!["run_started"];
    expected.extend(step);
    expected.push("jump");
    expected.extend(step);
    expected.push("run_finished");
    assert_eq!(types, expected);
    // The phase ends at the next call: 1 ms per call.
    let EventKind::PhaseFinished { duration_ms, .. } = &events[3].kind else {
        panic!("{:?}", events[3]);
    };
    assert_eq!(*duration_ms, 1.0);
    let EventKind::RunFinished { totals, .. } = &events.last().unwrap().kind else {
        panic!("the last event finishes the run");
    };
    assert_eq!(totals.provider_calls, 2);
    assert_eq!(totals.input_tokens, 10);
    assert_eq!(totals.output_tokens, 4);
    assert_eq!(totals.steps, 2);
}

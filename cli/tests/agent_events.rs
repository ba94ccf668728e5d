//! A run of agents that call agents (`spec/agents.md`) in `aplc run`'s event displays:
//! a linked root → mid → leaf bundle (built here, not by `aplc build`), with `call_agent`
//! and an agent tool, run against `--mock` with `--events`, `--stream` and `--verbose`;
//! then `aplc trace` of its events file. A child's lines go under its `agent_started`
//! with its path; its streamed text reaches stdout; its deltas carry its path. With
//! OpenTelemetry export, its spans nest under the step or tool call that ran it.

use std::path::Path;
use std::process::{Command, Output};

use aplc_test_support::otlp::{Receiver, string};
use aplc_test_support::process::without_times;
use aplc_vm::bundle::Bundle;
use serde_json::{Value as Json, json};

/// The tree of `fixtures/agents/spans/`: `root` delegates to `mid`, then offers the `ask`
/// tool (which runs `leaf`); `mid` delegates to `leaf` with its answer. Linked as
/// `aplc build` links it.
fn linked_tree() -> Bundle {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/agents/spans");
    let read = |name: &str| std::fs::read_to_string(fixtures.join(format!("{name}.apl"))).unwrap();
    let (root, mid, leaf) = (read("root"), read("mid"), read("leaf"));
    let options = aplc_compiler::Options::for_run(false);
    let linked = aplc_compiler::link_sources(
        &root,
        "root.apl",
        &[("mid", &mid), ("leaf", &leaf)],
        &options,
    );
    let diagnostics: Vec<&str> = linked
        .diagnostics
        .iter()
        .map(|d| d.message.as_str())
        .collect();
    linked
        .bundle
        .unwrap_or_else(|| panic!("the tree links: {diagnostics:?}"))
}

/// Writes `root.aplb` (mid and leaf linked in), the mock answers and the tool manifest
/// into `dir`.
fn files(dir: &Path) {
    let root = linked_tree();
    let bytes = aplc_vm::bundle::encode(&root).expect("encodes");
    std::fs::write(dir.join("root.aplb"), bytes).unwrap();
    let ask = |id: &str, arguments: Json| {
        json!({"id": id, "type": "function",
               "function": {"name": "ask", "arguments": arguments.to_string()}})
    };
    // Root a, mid m, leaf l under mid, root b (the first call runs the leaf; the second
    // leaves out its input, so that child fails), the leaf of `c1`.
    let calls = json!({"content": null,
                       "tool_calls": [ask("c1", json!({"word": "hi"})), ask("c2", json!({}))]});
    let mock = json!(["one", "two", "three", calls, "four"]);
    std::fs::write(dir.join("mock.json"), mock.to_string()).unwrap();
    // A descriptor that lets the second call through, so that its child fails.
    let descriptor = json!({"name": "ask", "parameters": {"type": "object"}});
    let tools = json!({"ask": {"agent": "leaf", "descriptor": descriptor}});
    std::fs::write(dir.join("tools.json"), tools.to_string()).unwrap();
}

fn aplc(dir: &Path, args: &[&str]) -> Output {
    aplc_with(dir, args, None)
}

/// `aplc` exporting to the OTLP endpoint `otlp`, if given.
fn aplc_with(dir: &Path, args: &[&str], otlp: Option<&str>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_aplc"));
    command
        .current_dir(dir)
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove("OPENAI_API_KEY");
    for (name, _) in std::env::vars() {
        if name.starts_with("OTEL_") || name.starts_with("TRACE") {
            command.env_remove(name);
        }
    }
    if let Some(endpoint) = otlp {
        command.env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint);
    }
    command.output().expect("aplc runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The width of the indentation after a line's time.
fn indent(line: &str) -> usize {
    let rest = line.split("ms  ").nth(1).unwrap_or_default();
    rest.len() - rest.trim_start().len()
}

#[test]
fn child_runs_in_verbose_stream_events_and_trace() {
    let dir = tempfile::tempdir().unwrap();
    files(dir.path());
    let out = aplc(
        dir.path(),
        &[
            "run",
            "root.aplb",
            "--mock",
            "mock.json",
            "--tools",
            "tools.json",
            "--events",
            "events.jsonl",
            "--stream",
            "--verbose",
        ],
    );
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    // A failed agent tool call is an error the run goes on with.
    assert!(matches!(out.status.code(), Some(0 | 3)), "{stderr}");

    // `--stream`: every call's text, the children's too, in call order.
    assert_eq!(text(&out.stdout), "one\ntwo\nthree\nfour\n");

    // `--events`: each delta has its call's path.
    let events: Vec<Json> = std::fs::read_to_string(dir.path().join("events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let deltas: Vec<(Json, Json)> = events
        .iter()
        .filter(|e| e["type"] == "provider_delta")
        .map(|e| {
            (
                e.get("path").cloned().unwrap_or(Json::Null),
                e["text"].clone(),
            )
        })
        .collect();
    assert_eq!(
        deltas,
        [
            (Json::Null, json!("one")),
            (json!("mid"), json!("two")),
            (json!("mid/leaf"), json!("three")),
            (json!("leaf"), json!("four")),
        ]
    );

    // `--verbose`: a child's lines under its start, with its path.
    let line = |needle: &str| {
        stderr
            .lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle}: {stderr}"))
    };
    assert_eq!(indent(line("step a (runs 0)")), 0);
    assert_eq!(indent(line("agent mid started")), 2);
    assert_eq!(indent(line("mid > step m (runs 0)")), 4);
    assert_eq!(indent(line("mid > agent leaf started")), 6);
    assert_eq!(indent(line("mid/leaf > step l (runs 0)")), 8);
    assert_eq!(indent(line("mid/leaf > provider")), 10);
    assert_eq!(indent(line("agent mid completed")), 2);
    assert_eq!(indent(line("agent leaf started [c1]")), 2);
    assert_eq!(indent(line(" leaf > step l (runs 0)")), 4);
    assert!(
        line("agent leaf failed").contains("(missing_input)"),
        "{stderr}"
    );

    // `aplc trace`: the same tree from the file, with the totals of the whole tree.
    let trace = aplc(dir.path(), &["trace", "events.jsonl"]);
    assert_eq!(trace.status.code(), Some(0), "{}", text(&trace.stderr));
    insta::assert_snapshot!(without_times(&text(&trace.stdout)));
}

#[test]
fn aplc_run_exports_child_runs_under_their_callers_spans() {
    let dir = tempfile::tempdir().unwrap();
    files(dir.path());
    let receiver = Receiver::start(200);
    let args = [
        "run",
        "root.aplb",
        "--mock",
        "mock.json",
        "--tools",
        "tools.json",
        "--quiet",
    ];
    let out = aplc_with(dir.path(), &args, Some(&receiver.endpoint()));
    let stderr = text(&out.stderr);
    assert!(matches!(out.status.code(), Some(0 | 3)), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");

    let spans = receiver.spans();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    let find = |name: &str, parent: &[u8]| {
        let found: Vec<_> = spans
            .iter()
            .filter(|s| s.name == name && s.parent_span_id == parent)
            .collect();
        assert_eq!(found.len(), 1, "{name}: {names:?}");
        found[0]
    };
    let root = find("invoke_workflow root.apl", &[]);
    let a = find("step a", &root.span_id);
    let mid = find("invoke_workflow mid", &a.span_id);
    let m = find("step m", &mid.span_id);
    let grandchild = find("invoke_workflow leaf", &m.span_id);
    assert_eq!(
        string(grandchild, "aplc.agent.path").as_deref(),
        Some("mid/leaf")
    );
    find("chat gpt-4o", &find("step l", &grandchild.span_id).span_id);
    let b = find("step b", &root.span_id);
    let tools: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "execute_tool ask")
        .collect();
    assert_eq!(tools.len(), 2, "{names:?}");
    for tool in tools {
        assert_eq!(tool.parent_span_id, b.span_id);
        find("invoke_workflow leaf", &tool.span_id);
    }
    // Every span opened was ended (only ended spans are exported): 3 runs of the leaf,
    // 2 of whose ran a step with a call, mid with one, the root with two.
    assert_eq!(names.len(), 17, "{names:?}");
}

//! Child runs in traces and live events (`spec/agents.md`, `spec/telemetry.md` "Spans"):
//! a linked root → mid → leaf tree, run with telemetry to an in-process OTLP receiver.
//! A child's `invoke_workflow` span nests under its caller's step span (`call_agent`)
//! or the `execute_tool` span of its call (an agent tool), its own spans under it; a
//! failed child's span is marked so; a run abandoned inside a child, or resumed inside
//! a grandchild, ends every span it opened. A streamed child call's deltas carry the
//! child's path.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use aplc_runtime::Redactor;
use aplc_runtime::driver::{self, Scripted, Toolbox};
use aplc_runtime::telemetry::{RunDetails, Telemetry, TelemetryConfig, TelemetryFlags};
use aplc_test_support::otlp::{Receiver, string};
use aplc_vm::bundle::Bundle;
use aplc_vm::tools::ToolSpec;
use aplc_vm::{Event, EventKind, Program, RunOptions, ScriptedProvider};
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use serde_json::json;

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

/// The root with `mid` and `leaf` linked into its bundle, loaded from its bytes as a
/// shipped bundle is.
fn program() -> Arc<Program> {
    let root = linked_tree();
    let bytes = aplc_vm::bundle::encode(&root).expect("encodes");
    Arc::new(Program::load(&bytes).expect("loads"))
}

/// The `ask` agent tool; the machine runs `leaf` for its calls, never this closure.
fn toolbox() -> Toolbox {
    let spec = ToolSpec::new(json!({"name": "ask", "parameters": {"type": "object"}}))
        .unwrap()
        .agent("leaf");
    let mut toolbox = Toolbox::new();
    toolbox
        .register_fn(spec, |_, _| Err("the machine runs the agent".into()))
        .unwrap();
    toolbox
}

/// Root `a`, mid `m`, leaf `l` under mid, root `b` (two `ask` calls: the first runs the
/// leaf, the second leaves out its input, so that child fails), the leaf of `c1`. Each
/// answer is streamed as one delta.
fn model() -> Scripted {
    let ask = |id: &str, arguments: serde_json::Value| {
        json!({"id": id, "type": "function",
               "function": {"name": "ask", "arguments": arguments.to_string()}})
    };
    let calls = json!({"tool_calls": [ask("c1", json!({"word": "hi"})), ask("c2", json!({}))]});
    let script = json!(["one", "two", "three", calls, "four"]);
    Scripted::new(ScriptedProvider::from_json(&script.to_string()).unwrap()).streaming(true)
}

fn telemetry(endpoint: &str) -> Telemetry {
    let endpoint = endpoint.to_owned();
    let env = move |name: &str| match name {
        "OTEL_EXPORTER_OTLP_ENDPOINT" => Some(endpoint.clone()),
        "OTEL_SERVICE_NAME" => Some("agent-spans-test".into()),
        _ => None,
    };
    let flags = TelemetryFlags {
        otel: false,
        capture_content: false,
    };
    let config = TelemetryConfig::resolve(&env, flags)
        .unwrap()
        .config
        .unwrap();
    Telemetry::start(&config, &|_| None).unwrap()
}

fn details(agent: Option<&str>) -> RunDetails {
    RunDetails {
        parent: None,
        run_id: None,
        agent: agent.map(str::to_owned),
        redactor: Redactor::default(),
    }
}

/// Runs the tree traced (unless `telemetry` is `None`); returns every event it made.
async fn run(telemetry: Option<&Telemetry>) -> Vec<Event> {
    let trace = telemetry.map(|t| t.run(details(None)));
    let model = model();
    let provider = aplc_runtime::telemetry::RunTrace::provider_of(trace.as_ref(), &model);
    let mut events = Vec::new();
    let mut listener = |event: &Event| {
        if let Some(trace) = &trace {
            trace.on_event(event);
        }
        events.push(event.clone());
    };
    let outcome = driver::run_with_listener(
        program(),
        RunOptions::default(),
        &provider,
        &toolbox(),
        &mut listener,
    )
    .await;
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    events
}

/// The spans `events` make in a trace of their own, after `then` (say, an abandon).
fn spans_of(
    events: &[Event],
    agent: Option<&str>,
    then: impl FnOnce(&aplc_runtime::telemetry::RunTrace),
) -> Vec<Span> {
    let receiver = Receiver::start(200);
    let telemetry = telemetry(&receiver.endpoint());
    let trace = telemetry.run(details(agent));
    for event in events {
        trace.on_event(event);
    }
    then(&trace);
    telemetry.shutdown(Duration::from_secs(10)).unwrap();
    receiver.spans()
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn one<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    let found = named(spans, name);
    let [span] = found[..] else {
        panic!("one `{name}` span: {:?}", names(spans));
    };
    span
}

fn names(spans: &[Span]) -> Vec<&str> {
    spans.iter().map(|s| s.name.as_str()).collect()
}

/// The spans whose parent is `parent`.
fn under<'a>(spans: &'a [Span], parent: &Span) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|s| s.parent_span_id == parent.span_id)
        .collect()
}

/// The one span named `name` under `parent`.
fn one_under<'a>(spans: &'a [Span], parent: &Span, name: &str) -> &'a Span {
    let found: Vec<&Span> = under(spans, parent)
        .into_iter()
        .filter(|s| s.name == name)
        .collect();
    let [span] = found[..] else {
        panic!("one `{name}` under `{}`: {:?}", parent.name, names(spans));
    };
    span
}

fn failed(span: &Span) -> bool {
    span.status
        .as_ref()
        .is_some_and(|s| s.code == StatusCode::Error as i32)
}

/// Every span is inside its parent's time, in one trace.
fn nested_in_time(spans: &[Span]) {
    for span in spans {
        assert_eq!(span.trace_id, spans[0].trace_id);
        assert!(
            span.start_time_unix_nano <= span.end_time_unix_nano,
            "{}",
            span.name
        );
        if let Some(parent) = spans.iter().find(|p| p.span_id == span.parent_span_id) {
            assert!(
                span.start_time_unix_nano >= parent.start_time_unix_nano,
                "{}",
                span.name
            );
            assert!(
                span.end_time_unix_nano <= parent.end_time_unix_nano,
                "{}",
                span.name
            );
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn child_runs_nest_under_the_step_or_tool_call_that_ran_them() {
    let receiver = Receiver::start(200);
    let telemetry = telemetry(&receiver.endpoint());
    run(Some(&telemetry)).await;
    telemetry.shutdown(Duration::from_secs(10)).unwrap();
    let spans = receiver.spans();
    nested_in_time(&spans);

    let root = one(&spans, "invoke_workflow root.apl");
    assert!(root.parent_span_id.is_empty());
    let a = one_under(&spans, root, "step a");
    let b = one_under(&spans, root, "step b");
    // `call_agent`: mid under step a, its step and call under it, and the grandchild
    // under mid's step.
    let mid = one_under(&spans, a, "invoke_workflow mid");
    assert_eq!(string(mid, "aplc.agent.path").as_deref(), Some("mid"));
    assert_eq!(string(mid, "gen_ai.agent.name").as_deref(), Some("mid"));
    assert_eq!(
        string(mid, "aplc.run.outcome").as_deref(),
        Some("completed")
    );
    assert!(!failed(mid));
    let m = one_under(&spans, mid, "step m");
    one_under(&spans, m, "chat gpt-4o");
    let grandchild = one_under(&spans, m, "invoke_workflow leaf");
    assert_eq!(
        string(grandchild, "aplc.agent.path").as_deref(),
        Some("mid/leaf")
    );
    let l = one_under(&spans, grandchild, "step l");
    one_under(&spans, l, "chat gpt-4o");
    // The agent tool: each call's child under its `execute_tool` span.
    let tools = named(&spans, "execute_tool ask");
    assert_eq!(tools.len(), 2, "{:?}", names(&spans));
    assert!(tools.iter().all(|t| t.parent_span_id == b.span_id));
    let call = |id: &str| {
        *tools
            .iter()
            .find(|t| string(t, "gen_ai.tool.call.id").as_deref() == Some(id))
            .unwrap()
    };
    let ran = one_under(&spans, call("c1"), "invoke_workflow leaf");
    assert_eq!(string(ran, "aplc.agent.path").as_deref(), Some("leaf"));
    assert!(!failed(ran));
    let l = one_under(&spans, ran, "step l");
    one_under(&spans, l, "chat gpt-4o");
    // A child that fails: its span is marked as a failed run's is, and so is the call.
    let refused = one_under(&spans, call("c2"), "invoke_workflow leaf");
    assert!(failed(refused));
    assert_eq!(
        string(refused, "error.type").as_deref(),
        Some("missing_input")
    );
    assert_eq!(
        string(refused, "aplc.run.outcome").as_deref(),
        Some("failed")
    );
    assert!(failed(call("c2")));
    // The root's own calls stay under its steps, and nothing else was opened.
    one_under(&spans, a, "chat gpt-4o");
    one_under(&spans, b, "chat gpt-4o");
    assert_eq!(named(&spans, "invoke_workflow leaf").len(), 3);
    assert_eq!(named(&spans, "chat gpt-4o").len(), 5);
}

#[tokio::test(flavor = "current_thread")]
async fn a_streamed_child_calls_deltas_carry_its_path() {
    let events = run(None).await;
    let deltas: Vec<(Option<&str>, &str)> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ProviderDelta { text, .. } => Some((e.path.as_deref(), text.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(
        deltas,
        [
            (None, "one"),
            (Some("mid"), "two"),
            (Some("mid/leaf"), "three"),
            (Some("leaf"), "four"),
        ]
    );
    // Each delta has the path of the `provider_call` whose `seq` it repeats.
    for delta in events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::ProviderDelta { .. }))
    {
        let call = events
            .iter()
            .find(|e| e.seq == delta.seq && matches!(e.kind, EventKind::ProviderCall { .. }))
            .unwrap();
        assert_eq!(call.path, delta.path);
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_run_abandoned_inside_a_grandchild_ends_every_span_failed() {
    let events = run(None).await;
    // Stopped just after the grandchild's provider call.
    let stop = events
        .iter()
        .position(|e| {
            e.path.as_deref() == Some("mid/leaf")
                && matches!(e.kind, EventKind::ProviderCall { .. })
        })
        .unwrap();
    // (Not checked for times: replayed faster than they were made, the events' times
    // pass the wall clock the abandon ends the spans at.)
    let spans = spans_of(&events[..=stop], None, |trace| trace.abandon("interrupted"));
    let root = one(&spans, "invoke_workflow root.apl");
    let a = one_under(&spans, root, "step a");
    let mid = one_under(&spans, a, "invoke_workflow mid");
    let m = one_under(&spans, mid, "step m");
    let leaf = one_under(&spans, m, "invoke_workflow leaf");
    let l = one_under(&spans, leaf, "step l");
    let chat = one_under(&spans, l, "chat gpt-4o");
    for span in [root, a, mid, m, leaf, l, chat] {
        assert!(failed(span), "{}", span.name);
        assert_eq!(string(span, "error.type").as_deref(), Some("interrupted"));
    }
    // And the chats of steps a and m, which had ended.
    assert_eq!(spans.len(), 9, "{:?}", names(&spans));
}

#[tokio::test(flavor = "current_thread")]
async fn a_run_resumed_inside_a_grandchild_opens_its_callers_late() {
    let events = run(None).await;
    // A resume goes on inside the grandchild, without the events before.
    let from = events
        .iter()
        .position(|e| e.path.as_deref() == Some("mid/leaf"))
        .unwrap();
    let spans = spans_of(&events[from..], Some("root.apl"), |_| {});
    nested_in_time(&spans);
    let root = one(&spans, "invoke_workflow root.apl");
    assert!(root.parent_span_id.is_empty());
    let mid = one_under(&spans, root, "invoke_workflow mid");
    let leaf = one_under(&spans, mid, "invoke_workflow leaf");
    for span in [root, mid, leaf] {
        assert_eq!(
            otlp_bool(span, "aplc.run.resumed"),
            Some(true),
            "{}",
            span.name
        );
    }
    assert_eq!(string(leaf, "aplc.agent.path").as_deref(), Some("mid/leaf"));
    assert!(!failed(mid) && !failed(leaf));
    one_under(&spans, leaf, "step l");
    // The root goes on after its child as usual: step b and its tool calls' children.
    let b = one_under(&spans, root, "step b");
    assert_eq!(under(&spans, b).len(), 3, "{:?}", names(&spans));
}

fn otlp_bool(span: &Span, key: &str) -> Option<bool> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    match aplc_test_support::otlp::attribute(span, key) {
        Some(Value::BoolValue(b)) => Some(*b),
        _ => None,
    }
}

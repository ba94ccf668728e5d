//! OpenTelemetry export end to end: a run with a loop (one step entered twice through
//! `next_step`), a tool call and a provider error, exported over OTLP/HTTP to an
//! in-process receiver that decodes the protobuf. Checks the span tree, names, kinds and
//! attributes, the metrics, content capture (off by default; redacted when on), joining
//! an incoming `traceparent`, and an unreachable collector.

use std::sync::Arc;
use std::time::Duration;

use aplc_runtime::Redactor;
use aplc_runtime::driver::{self, BoxFuture, CallContext, Provider, Scripted, Toolbox};
use aplc_runtime::telemetry::{Parent, RunDetails, Telemetry, TelemetryConfig, TelemetryFlags};
use aplc_test_support::otlp::{self, Receiver, int, string};
use aplc_vm::tools::{ToolOrigin, ToolSpec};
use aplc_vm::{Completion, Program, ProviderError, ProviderRequest, RunOptions, ScriptedProvider};
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use serde_json::json;

const SECRET: &str = "sk-test-0123456789abcdefSECRET";

const AGENT: &str = "\
# pre: work
{{ inc_context('turn') }}
{{ set_context('temperature', 0.5) }}
{{ set_context('max_tokens', 64) }}

# prompt: work
## user
Turn {{ turn }}. The key is {{ key }}.

# post: work
{% if turn < 2 %}
{{ set_context('next_step', 'work') }}
{% endif %}
";

fn program() -> Arc<Program> {
    let mut options = aplc_compiler::Options::default();
    options.inputs.push("key".into());
    let compiled = aplc_compiler::compile(AGENT, "looper.apl", &options);
    let bundle = compiled.bundle.expect("the agent compiles");
    Arc::new(Program::from_bundle(bundle, Default::default()).expect("loads"))
}

fn options() -> RunOptions {
    let mut context = serde_json::Map::new();
    context.insert("key".into(), json!(SECRET));
    RunOptions::default().with_context_json(&context)
}

/// The scripted answers, served as the OpenAI provider would name itself.
struct Model(Scripted);

impl Provider for Model {
    fn complete<'a>(
        &'a self,
        request: &'a ProviderRequest,
        call: &'a CallContext,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        self.0.complete(request, call)
    }

    fn provider_name(&self, _model: &str) -> Option<&'static str> {
        Some("openai")
    }
}

/// Turn 1 asks for the `add` tool (and echoes the key); turn 2 fails with a server error.
fn model() -> Model {
    let script = json!([
        {
            "id": "chatcmpl-1",
            "model": "gpt-4o-2024-08-06",
            "choices": [{
                "message": {
                    "role": "assistant",
                    "content": format!("adding; the key was {SECRET}"),
                    "tool_calls": [{
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "add", "arguments": "{\"a\": 1, \"b\": 2}"}
                    }]
                },
                "finish_reason": "tool_calls"
            }],
            "usage": {"prompt_tokens": 12, "completion_tokens": 7}
        },
        {"error": {"message": "HTTP 500: upstream failed", "kind": "server"}}
    ]);
    let script = ScriptedProvider::from_json(&script.to_string()).unwrap();
    Model(Scripted::new(script))
}

fn toolbox() -> Toolbox {
    toolbox_from(None)
}

/// The `add` tool, from `origin` (an MCP server's, for the MCP attributes).
fn toolbox_from(origin: Option<ToolOrigin>) -> Toolbox {
    let descriptor = json!({
        "name": "add",
        "description": "Adds",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
    });
    let mut spec = ToolSpec::new(descriptor).unwrap();
    if let Some(origin) = origin {
        spec = spec.with_origin(origin);
    }
    let mut toolbox = Toolbox::new();
    toolbox
        .register_fn(spec, |args, _| {
            Ok(json!(
                args["a"].as_f64().unwrap_or(0.0) + args["b"].as_f64().unwrap_or(0.0)
            ))
        })
        .unwrap();
    toolbox
}

fn telemetry(endpoint: &str, capture_content: bool) -> Telemetry {
    let endpoint = endpoint.to_owned();
    let env = move |name: &str| match name {
        "OTEL_EXPORTER_OTLP_ENDPOINT" => Some(endpoint.clone()),
        "OTEL_EXPORTER_OTLP_HEADERS" => Some("authorization=Bearer%20collector-token".into()),
        "OTEL_SERVICE_NAME" => Some("telemetry-test".into()),
        _ => None,
    };
    let flags = TelemetryFlags {
        otel: false,
        capture_content,
    };
    let config = TelemetryConfig::resolve(&env, flags)
        .unwrap()
        .config
        .unwrap();
    Telemetry::start(&config, &|_| None).unwrap()
}

/// Runs the agent with telemetry and flushes; returns the run's outcome.
async fn traced_run(telemetry: &Telemetry, parent: Option<Parent>) -> aplc_vm::RunOutcome {
    traced_run_with(telemetry, parent, &toolbox()).await
}

/// [`traced_run`] with these tools.
async fn traced_run_with(
    telemetry: &Telemetry,
    parent: Option<Parent>,
    toolbox: &Toolbox,
) -> aplc_vm::RunOutcome {
    let joined = parent.as_ref().map(Parent::trace_id);
    let trace = telemetry.run(RunDetails {
        parent,
        run_id: None,
        agent: None,
        redactor: Redactor::new([SECRET]),
    });
    let model = model();
    let provider = trace.provider(&model);
    let mut listener = |event: &aplc_vm::Event| trace.on_event(event);
    let outcome =
        driver::run_with_listener(program(), options(), &provider, toolbox, &mut listener).await;
    // The run's trace id outlives its span: a server hands it back to its caller.
    let trace_id = trace.trace_id().expect("the run span started");
    assert!(joined.is_none_or(|joined| joined == trace_id));
    outcome
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

#[tokio::test(flavor = "current_thread")]
async fn a_run_becomes_a_tree_of_genai_spans() {
    let receiver = Receiver::start(200);
    let telemetry = telemetry(&receiver.endpoint(), false);
    let outcome = traced_run(&telemetry, None).await;
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    telemetry.shutdown(Duration::from_secs(10)).unwrap();

    let spans = receiver.spans();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(spans.len(), 6, "{names:?}");
    let [run] = named(&spans, "invoke_workflow looper.apl")[..] else {
        panic!("one run span: {names:?}");
    };
    let steps = named(&spans, "step work");
    let chats = named(&spans, "chat gpt-4o");
    let [tool] = named(&spans, "execute_tool add")[..] else {
        panic!("one tool span: {names:?}");
    };
    assert_eq!((steps.len(), chats.len()), (2, 2), "{names:?}");

    // One trace; run > step > (chat | execute_tool).
    assert!(spans.iter().all(|s| s.trace_id == run.trace_id));
    assert!(run.parent_span_id.is_empty());
    assert!(steps.iter().all(|s| s.parent_span_id == run.span_id));
    let first = steps
        .iter()
        .find(|s| int(s, "aplc.step.runs") == Some(0))
        .unwrap();
    let second = steps
        .iter()
        .find(|s| int(s, "aplc.step.runs") == Some(1))
        .unwrap();
    let ok_chat = chats
        .iter()
        .find(|s| s.parent_span_id == first.span_id)
        .unwrap();
    let failed_chat = chats
        .iter()
        .find(|s| s.parent_span_id == second.span_id)
        .unwrap();
    assert_eq!(tool.parent_span_id, first.span_id);

    // Kinds and times: children inside their parents.
    assert_eq!(run.kind, SpanKind::Internal as i32);
    assert_eq!(first.kind, SpanKind::Internal as i32);
    assert_eq!(ok_chat.kind, SpanKind::Client as i32);
    assert_eq!(tool.kind, SpanKind::Internal as i32);
    for (child, parent) in [
        (*first, run),
        (*second, run),
        (*ok_chat, *first),
        (tool, *first),
    ] {
        assert!(child.start_time_unix_nano >= parent.start_time_unix_nano);
        assert!(child.end_time_unix_nano <= parent.end_time_unix_nano);
        assert!(child.start_time_unix_nano <= child.end_time_unix_nano);
    }
    assert!(second.start_time_unix_nano >= first.end_time_unix_nano);

    // The run.
    assert_eq!(
        string(run, "gen_ai.operation.name").as_deref(),
        Some("invoke_workflow")
    );
    assert_eq!(
        string(run, "gen_ai.agent.name").as_deref(),
        Some("looper.apl")
    );
    assert_eq!(
        string(run, "aplc.run.outcome").as_deref(),
        Some("completed_with_errors")
    );
    assert_eq!(int(run, "aplc.run.steps"), Some(2));
    assert_eq!(int(run, "gen_ai.usage.input_tokens"), Some(12));
    assert!(string(run, "aplc.bundle.hash").is_some_and(|h| h.len() == 64));
    assert_eq!(string(first, "aplc.step.name").as_deref(), Some("work"));

    // The provider calls.
    assert_eq!(
        string(ok_chat, "gen_ai.operation.name").as_deref(),
        Some("chat")
    );
    assert_eq!(
        string(ok_chat, "gen_ai.provider.name").as_deref(),
        Some("openai")
    );
    assert_eq!(
        string(ok_chat, "gen_ai.request.model").as_deref(),
        Some("gpt-4o")
    );
    assert_eq!(
        string(ok_chat, "gen_ai.response.model").as_deref(),
        Some("gpt-4o-2024-08-06")
    );
    assert_eq!(
        string(ok_chat, "gen_ai.response.id").as_deref(),
        Some("chatcmpl-1")
    );
    assert_eq!(int(ok_chat, "gen_ai.request.max_tokens"), Some(64));
    assert!(matches!(
        otlp::attribute(ok_chat, "gen_ai.request.temperature"),
        Some(opentelemetry_proto::tonic::common::v1::any_value::Value::DoubleValue(t)) if *t == 0.5
    ));
    let reasons = format!(
        "{:?}",
        otlp::attribute(ok_chat, "gen_ai.response.finish_reasons")
    );
    assert!(reasons.contains("tool_calls"), "{reasons}");
    assert_eq!(int(ok_chat, "gen_ai.usage.input_tokens"), Some(12));
    assert_eq!(int(ok_chat, "gen_ai.usage.output_tokens"), Some(7));
    assert!(string(ok_chat, "error.type").is_none());
    assert_eq!(string(failed_chat, "error.type").as_deref(), Some("server"));
    let status = failed_chat.status.clone().unwrap();
    assert_eq!(status.code, StatusCode::Error as i32);
    assert!(
        status.message.contains("upstream failed"),
        "{}",
        status.message
    );

    // The tool call.
    assert_eq!(
        string(tool, "gen_ai.operation.name").as_deref(),
        Some("execute_tool")
    );
    assert_eq!(string(tool, "gen_ai.tool.name").as_deref(), Some("add"));
    assert_eq!(
        string(tool, "gen_ai.tool.call.id").as_deref(),
        Some("call_1")
    );

    // No content by default, and never a secret or the collector's token.
    for span in &spans {
        assert!(string(span, "gen_ai.input.messages").is_none());
        assert!(string(span, "gen_ai.output.messages").is_none());
    }
    let requests = receiver.requests();
    assert!(
        requests
            .iter()
            .all(|r| !String::from_utf8_lossy(&r.body).contains(SECRET))
    );
    assert!(
        requests
            .iter()
            .all(|r| r.headers.get("authorization").map(String::as_str)
                == Some("Bearer collector-token"))
    );
    assert!(requests.iter().all(
        |r| r.headers.get("content-type").map(String::as_str) == Some("application/x-protobuf")
    ));
    assert_eq!(receiver.service_name().as_deref(), Some("telemetry-test"));

    // The two GenAI client metrics.
    let metrics = receiver.metrics();
    assert!(
        metrics.contains(&("gen_ai.client.operation.duration".into(), "s".into())),
        "{metrics:?}"
    );
    assert!(
        metrics.contains(&("gen_ai.client.token.usage".into(), "{token}".into())),
        "{metrics:?}"
    );
}

/// An MCP server's tool (`spec/mcp.md`): its `execute_tool` span also carries the MCP
/// conventions' `mcp.method.name` and the server's name; other tools' spans carry neither.
#[tokio::test(flavor = "current_thread")]
async fn an_mcp_tool_span_names_its_server() {
    let receiver = Receiver::start(200);
    let telemetry = telemetry(&receiver.endpoint(), false);
    let origin = ToolOrigin::Mcp {
        server: "counter".into(),
    };
    traced_run_with(&telemetry, None, &toolbox_from(Some(origin))).await;
    telemetry.shutdown(Duration::from_secs(10)).unwrap();
    let spans = receiver.spans();
    let [tool] = named(&spans, "execute_tool add")[..] else {
        panic!("one tool span");
    };
    assert_eq!(string(tool, "mcp.server.name").as_deref(), Some("counter"));
    assert_eq!(
        string(tool, "mcp.method.name").as_deref(),
        Some("tools/call")
    );
    assert_eq!(
        string(tool, "gen_ai.operation.name").as_deref(),
        Some("execute_tool")
    );

    let receiver = Receiver::start(200);
    let telemetry = self::telemetry(&receiver.endpoint(), false);
    traced_run(&telemetry, None).await;
    telemetry.shutdown(Duration::from_secs(10)).unwrap();
    let spans = receiver.spans();
    let [tool] = named(&spans, "execute_tool add")[..] else {
        panic!("one tool span");
    };
    assert!(string(tool, "mcp.server.name").is_none());
    assert!(string(tool, "mcp.method.name").is_none());
}

#[tokio::test(flavor = "current_thread")]
async fn content_is_recorded_on_request_and_redacted() {
    let receiver = Receiver::start(200);
    let telemetry = telemetry(&receiver.endpoint(), true);
    traced_run(&telemetry, None).await;
    telemetry.shutdown(Duration::from_secs(10)).unwrap();

    let spans = receiver.spans();
    let chats = named(&spans, "chat gpt-4o");
    let input = chats
        .iter()
        .find_map(|s| string(s, "gen_ai.input.messages"))
        .unwrap();
    let input: serde_json::Value = serde_json::from_str(&input).unwrap();
    assert_eq!(input[0]["role"], "user");
    let text = input[0]["parts"][0]["content"].as_str().unwrap();
    assert!(text.starts_with("Turn "), "{text}");
    assert!(text.contains("The key is <redacted>"), "{text}");
    let output = chats
        .iter()
        .find_map(|s| string(s, "gen_ai.output.messages"))
        .unwrap();
    assert!(
        output.contains("tool_call") && output.contains("adding"),
        "{output}"
    );
    assert!(output.contains("the key was <redacted>"), "{output}");
    for request in receiver.requests() {
        assert!(!String::from_utf8_lossy(&request.body).contains(SECRET));
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_run_with_a_traceparent_joins_that_trace() {
    let receiver = Receiver::start(200);
    let telemetry = telemetry(&receiver.endpoint(), false);
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let (parent, warning) = Parent::parse(traceparent, Some("vendor=value")).unwrap();
    assert!(warning.is_none());
    traced_run(&telemetry, Some(parent)).await;
    telemetry.shutdown(Duration::from_secs(10)).unwrap();

    let spans = receiver.spans();
    let run = named(&spans, "invoke_workflow looper.apl")[0];
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    assert!(
        spans
            .iter()
            .all(|s| hex(&s.trace_id) == "4bf92f3577b34da6a3ce929d0e0e4736")
    );
    assert_eq!(hex(&run.parent_span_id), "00f067aa0ba902b7");
}

#[test]
fn malformed_trace_contexts_are_refused_clearly() {
    for bad in [
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        "00-é-x-y",
    ] {
        let error = Parent::parse(bad, None).unwrap_err().to_string();
        assert!(error.starts_with("malformed traceparent"), "{bad}: {error}");
    }
    // A later version may carry more fields; a bad tracestate is dropped with a warning.
    let good = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-more";
    let (_, warning) = Parent::parse(good, Some("not a tracestate")).unwrap();
    assert!(warning.unwrap().starts_with("malformed tracestate"));
}

#[tokio::test(flavor = "current_thread")]
async fn an_unreachable_collector_is_one_error_at_shutdown_and_the_run_is_unharmed() {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let telemetry = telemetry(&format!("http://127.0.0.1:{port}"), false);
    let outcome = traced_run(&telemetry, None).await;
    assert!(outcome.error.is_none());
    let error = telemetry
        .shutdown(Duration::from_secs(10))
        .unwrap_err()
        .to_string();
    assert!(error.contains("could not export telemetry"), "{error}");
    assert!(!error.contains("collector-token"), "{error}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_collector_that_refuses_is_reported() {
    let receiver = Receiver::start(400);
    let telemetry = telemetry(&receiver.endpoint(), false);
    traced_run(&telemetry, None).await;
    let error = telemetry
        .shutdown(Duration::from_secs(10))
        .unwrap_err()
        .to_string();
    assert!(error.contains("400"), "{error}");
}

/// [`model`], except that its second call never answers: the run "crashes" there.
struct Hanging {
    inner: Model,
    calls: std::sync::atomic::AtomicU64,
    hung: Arc<tokio::sync::Notify>,
}

impl Provider for Hanging {
    fn complete<'a>(
        &'a self,
        request: &'a ProviderRequest,
        call: &'a CallContext,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        Box::pin(async move {
            if self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 1 {
                self.hung.notify_one();
                std::future::pending::<()>().await;
            }
            self.inner.complete(request, call).await
        })
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_resumed_durable_run_has_a_run_span_of_its_own() {
    use aplc_runtime::durable::{self, DurableOptions, NewDurableRun};
    use aplc_runtime::store::{self, StoreUrl};

    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("telemetry-resume");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let store = store::open(&StoreUrl::Sqlite(dir.join("runs.db")))
        .await
        .unwrap();
    let config = DurableOptions::default();

    // The first attempt journals the first step, then hangs in the second call: dropped.
    let hung = Arc::new(tokio::sync::Notify::new());
    let hanging = Hanging {
        inner: model(),
        calls: Default::default(),
        hung: hung.clone(),
    };
    let run = NewDurableRun {
        id: "traced".into(),
        program: program(),
        options: options(),
    };
    let tools = toolbox();
    tokio::select! {
        finished = durable::start(store.as_ref(), run, &hanging, &tools, None, &config) => {
            panic!("the run should hang: {:?}", finished.map(|_| ()));
        }
        () = hung.notified() => {}
    }

    let receiver = Receiver::start(200);
    let telemetry = telemetry(&receiver.endpoint(), false);
    let reopened = durable::reopen(store.as_ref(), "traced", None, &tools, &config)
        .await
        .unwrap();
    let model = model();
    model.0.skip(reopened.replayed_provider_calls());
    let trace = telemetry.run(RunDetails {
        parent: None,
        run_id: Some("traced".into()),
        agent: Some("looper.apl".into()),
        redactor: Redactor::new([SECRET]),
    });
    let provider = trace.provider(&model);
    let mut listener = |event: &aplc_vm::Event| trace.on_event(event);
    let _finished = reopened
        .run(&provider, &tools, Some(&mut listener))
        .await
        .unwrap();
    telemetry.shutdown(Duration::from_secs(10)).unwrap();

    let spans = receiver.spans();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    let [run] = named(&spans, "invoke_workflow looper.apl")[..] else {
        panic!("one run span: {names:?}");
    };
    assert!(matches!(
        otlp::attribute(run, "aplc.run.resumed"),
        Some(opentelemetry_proto::tonic::common::v1::any_value::Value::BoolValue(true))
    ));
    assert_eq!(string(run, "aplc.run.id").as_deref(), Some("traced"));
    assert_eq!(
        string(run, "aplc.run.outcome").as_deref(),
        Some("completed_with_errors")
    );
    // The call that was in flight is sent again, live: it fails, as scripted.
    let failed = spans
        .iter()
        .find(|s| string(s, "error.type").as_deref() == Some("server"))
        .unwrap_or_else(|| panic!("the resent call failed: {names:?}"));
    assert!(spans.iter().all(|s| s.trace_id == run.trace_id));
    // It belongs to the step the run was in, whose span starts with the resumed run.
    let step = spans
        .iter()
        .find(|s| s.span_id == failed.parent_span_id)
        .unwrap();
    assert_eq!(step.name, "step work");
    assert_eq!(step.parent_span_id, run.span_id);
    assert!(matches!(
        otlp::attribute(step, "aplc.step.resumed"),
        Some(opentelemetry_proto::tonic::common::v1::any_value::Value::BoolValue(true))
    ));
    assert_eq!(failed.name, "chat gpt-4o");
    assert!(step.start_time_unix_nano >= run.start_time_unix_nano);
    assert!(failed.start_time_unix_nano >= step.start_time_unix_nano);
    assert!(failed.end_time_unix_nano <= step.end_time_unix_nano);
}

/// Approves every request, as `reviewer`.
#[derive(Debug)]
struct Approver;

impl aplc_runtime::human::Answerer for Approver {
    fn answer<'a>(
        &'a self,
        pending: &'a [aplc_runtime::human::Pending],
    ) -> BoxFuture<'a, Vec<aplc_vm::human::HumanAnswer>> {
        Box::pin(async move {
            pending
                .iter()
                .map(|p| aplc_vm::human::HumanAnswer {
                    id: p.request.id.clone(),
                    reply: aplc_vm::human::Reply::Approve {
                        approved: true,
                        reason: None,
                    },
                    by: "reviewer".into(),
                    answered_at_ms: 1,
                })
                .collect()
        })
    }
}

/// A request and its answer are span events on the step that asked (`spec/human.md`).
#[tokio::test(flavor = "current_thread")]
async fn a_request_and_its_answer_are_events_of_the_step() {
    let receiver = Receiver::start(200);
    let telemetry = telemetry(&receiver.endpoint(), false);
    let trace = telemetry.run(RunDetails {
        parent: None,
        run_id: None,
        agent: None,
        redactor: Redactor::new([SECRET]),
    });
    let mut toolbox = Toolbox::new();
    let spec = ToolSpec::new(json!({"name": "add", "parameters": {"type": "object"}}))
        .unwrap()
        .requires_approval(aplc_vm::tools::Approval::default());
    toolbox.register_fn(spec, |_, _| Ok(json!(3))).unwrap();
    let model = model();
    let provider = trace.provider(&model);
    let mut listener = |event: &aplc_vm::Event| trace.on_event(event);
    let outcome = driver::run_with_answerer(
        program(),
        options(),
        &provider,
        &toolbox,
        Some(&mut listener),
        &Approver,
    )
    .await;
    assert_eq!(
        outcome.history[0]
            .get_attr("result_tool_calls")
            .ok()
            .map(|v| v.len()),
        Some(Some(1))
    );
    telemetry.shutdown(Duration::from_secs(10)).unwrap();
    let spans = receiver.spans();
    let step = named(&spans, "step work")[0];
    let events: Vec<&str> = step.events.iter().map(|e| e.name.as_str()).collect();
    assert!(
        events.starts_with(&["aplc.phase.pre", "aplc.phase.prompt"])
            && events.contains(&"aplc.input.requested")
            && events.contains(&"aplc.input.received"),
        "{events:?}"
    );
    let received = step
        .events
        .iter()
        .find(|e| e.name == "aplc.input.received")
        .unwrap();
    let by = received
        .attributes
        .iter()
        .find(|kv| kv.key == "aplc.input.by")
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.clone());
    assert_eq!(
        by,
        Some(
            opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(
                "reviewer".into()
            )
        )
    );
}

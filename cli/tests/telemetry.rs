//! `aplc run` with OpenTelemetry export: spans reach an in-process OTLP/HTTP receiver
//! before the process exits (a loop, two tool calls, one failing, and a failed provider
//! call), an incoming `TRACEPARENT` is joined, an unreachable collector is one warning,
//! and bad settings are clear errors.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use aplc_test_support::otlp::{Receiver, int, string};

/// The variables a test sets itself: none leaks in from the environment of `cargo test`.
const OTEL_VARIABLES: [&str; 9] = [
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_SERVICE_NAME",
    "OTEL_SDK_DISABLED",
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
    "TRACEPARENT",
    "TRACESTATE",
];

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/events")
}

/// `aplc run` on the events fixture with `env` and `extra` flags.
fn run(env: &[(&str, &str)], extra: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_aplc"));
    command.current_dir(fixture()).args([
        "run",
        "agent.apl",
        "--mock",
        "mock.json",
        "--tools",
        "tools.json",
        "--quiet",
    ]);
    command.args(extra).env("NO_COLOR", "1");
    for name in OTEL_VARIABLES {
        command.env_remove(name);
    }
    for (name, value) in env {
        command.env(name, value);
    }
    let out = command.output().expect("aplc runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    out
}

#[test]
fn aplc_run_exports_the_span_tree_before_it_exits() {
    let receiver = Receiver::start(200);
    let endpoint = receiver.endpoint();
    let out = run(
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_SERVICE_NAME", "cli-test"),
            (
                "TRACEPARENT",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
        ],
        &[],
    );
    // The last step's provider call failed: exit 3, and the export does not change it.
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!String::from_utf8_lossy(&out.stderr).contains("warning"));

    let spans = receiver.spans();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    let count = |name: &str| names.iter().filter(|n| **n == name).count();
    assert_eq!(count("invoke_workflow agent.apl"), 1, "{names:?}");
    assert_eq!(count("step work"), 2, "{names:?}");
    assert_eq!(count("step finish"), 1, "{names:?}");
    assert_eq!(count("chat gpt-4o"), 3, "{names:?}");
    assert_eq!(count("execute_tool add"), 1, "{names:?}");
    assert_eq!(count("execute_tool fail"), 1, "{names:?}");
    assert_eq!(spans.len(), 9, "{names:?}");
    assert_eq!(receiver.service_name().as_deref(), Some("cli-test"));
    let metrics = receiver.metrics();
    assert!(
        metrics
            .iter()
            .any(|(name, _)| name == "gen_ai.client.token.usage"),
        "{metrics:?}"
    );
    assert!(receiver.requests().iter().all(
        |r| r.headers.get("content-type").map(String::as_str) == Some("application/x-protobuf")
    ));

    let run = spans
        .iter()
        .find(|s| s.name.starts_with("invoke_workflow"))
        .unwrap();
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    assert_eq!(hex(&run.trace_id), "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(hex(&run.parent_span_id), "b7ad6b7169203331");
    assert_eq!(
        string(run, "aplc.run.outcome").as_deref(),
        Some("completed_with_errors")
    );
    let steps: Vec<_> = spans
        .iter()
        .filter(|s| s.name.starts_with("step "))
        .collect();
    assert!(steps.iter().all(|s| s.parent_span_id == run.span_id));
    let runs: Vec<i64> = steps
        .iter()
        .filter_map(|s| int(s, "aplc.step.runs"))
        .collect();
    assert!(runs.contains(&1), "the loop's second entry: {runs:?}");
    for span in spans
        .iter()
        .filter(|s| s.name.starts_with("chat ") || s.name.starts_with("execute_tool "))
    {
        assert!(
            steps.iter().any(|s| s.span_id == span.parent_span_id),
            "{}",
            span.name
        );
    }
    let failed_tool = spans
        .iter()
        .find(|s| s.name == "execute_tool fail")
        .unwrap();
    assert_eq!(
        string(failed_tool, "error.type").as_deref(),
        Some("tool_error")
    );
    let finish = spans.iter().find(|s| s.name == "step finish").unwrap();
    let failed_chat = spans
        .iter()
        .find(|s| s.name == "chat gpt-4o" && s.parent_span_id == finish.span_id)
        .unwrap();
    assert_eq!(string(failed_chat, "error.type").as_deref(), Some("other"));
    assert!(string(failed_chat, "gen_ai.input.messages").is_none());
}

#[test]
fn content_capture_is_opt_in() {
    let receiver = Receiver::start(200);
    let endpoint = receiver.endpoint();
    run(
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)],
        &["--otel-content"],
    );
    let spans = receiver.spans();
    let input = spans
        .iter()
        .find_map(|s| string(s, "gen_ai.input.messages"))
        .expect("content was captured");
    assert!(input.contains("add the numbers"), "{input}");
}

#[test]
fn an_unreachable_collector_is_one_warning_and_the_run_goes_on() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let out = run(
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=collector-secret"),
        ],
        &["--otel"],
    );
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr
            .matches("warning: could not export telemetry")
            .count(),
        1,
        "{stderr}"
    );
    assert!(!stderr.contains("collector-secret"), "{stderr}");
}

#[test]
fn sdk_disabled_and_bad_settings() {
    let receiver = Receiver::start(200);
    let endpoint = receiver.endpoint();
    let out = run(
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_SDK_DISABLED", "true"),
        ],
        &["--otel"],
    );
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--otel is ignored"));
    assert!(receiver.requests().is_empty());

    let out = run(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://collector")], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("OTEL_EXPORTER_OTLP_ENDPOINT must be an http")
    );

    let out = run(
        &[
            ("OTEL_EXPORTER_OTLP_HEADERS", "token"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("entry 1 is not `key=value`"));

    // A malformed TRACEPARENT is ignored with a warning: the run still exports, in a
    // trace of its own.
    let out = run(
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("TRACEPARENT", "garbage"),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("TRACEPARENT ignored: malformed"));
    assert_eq!(receiver.spans().len(), 9);
}

/// `aplc run` in `dir` with the spans going to `receiver`.
fn command_in(dir: &Path, receiver: &Receiver, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_aplc"));
    command
        .current_dir(dir)
        .arg("run")
        .args(args)
        .env("NO_COLOR", "1");
    for name in OTEL_VARIABLES {
        command.env_remove(name);
    }
    command.env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint());
    command
}

/// A one-step agent whose answer calls a tool that sleeps 10 s, in a fresh directory.
fn slow_agent(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("agent.apl"), "# prompt: wait\nWait for it.\n").unwrap();
    let mock = r#"[{"content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "slow", "arguments": "{}"}}]}]"#;
    std::fs::write(dir.join("mock.json"), mock).unwrap();
    let tool = fixture().join("../tools/tool.py");
    let tools = serde_json::json!({
        "slow": {"command": ["python3", tool, "slow"], "timeout_ms": 60000,
                 "descriptor": {"name": "slow", "description": "Sleeps.",
                                "parameters": {"type": "object", "properties": {}}}}
    });
    std::fs::write(dir.join("tools.json"), tools.to_string()).unwrap();
    dir
}

#[test]
fn ctrl_c_still_flushes_the_spans_marked_interrupted() {
    let receiver = Receiver::start(200);
    let dir = slow_agent("telemetry-ctrl-c");
    let child = command_in(
        &dir,
        &receiver,
        &[
            "agent.apl",
            "--mock",
            "mock.json",
            "--tools",
            "tools.json",
            "--quiet",
        ],
    )
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    // Whenever the signal lands (before or during the tool call), the run is cut short.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let signalled = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(signalled.success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let spans = receiver.spans();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    let run = spans
        .iter()
        .find(|s| s.name == "invoke_workflow agent.apl")
        .unwrap_or_else(|| panic!("no run span: {names:?}"));
    assert_eq!(
        string(run, "error.type").as_deref(),
        Some("interrupted"),
        "{names:?}"
    );
    assert!(spans.iter().any(|s| s.name == "step wait"), "{names:?}");
}

#[test]
fn a_durable_run_carries_its_run_id() {
    let receiver = Receiver::start(200);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("telemetry-durable");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let store = format!("sqlite:{}", dir.join("runs.db").display());
    let out = command_in(
        &fixture(),
        &receiver,
        &[
            "agent.apl",
            "--mock",
            "mock.json",
            "--tools",
            "tools.json",
            "--quiet",
            "--store",
            &store,
            "--run-id",
            "traced-run",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let spans = receiver.spans();
    let run = spans
        .iter()
        .find(|s| s.name == "invoke_workflow agent.apl")
        .unwrap();
    assert_eq!(string(run, "aplc.run.id").as_deref(), Some("traced-run"));
    assert_eq!(spans.len(), 9);
}

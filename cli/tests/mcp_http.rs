//! MCP servers over streamable HTTP (spec/mcp.md) through the `aplc` binary, against the
//! Python fixtures of `fixtures/mcp/` (official SDK, PyPI `mcp`) served on 127.0.0.1
//! behind a bearer token that aplc sends from `headers_env`.
//!
//! They need `APLC_MCP_PYTHON` (`.ci/run` sets it) and fail without it:
//! `APLC_MCP_PYTHON=/tmp/mcpvenv/bin/python cargo test -p aplc --test mcp_http`.

use std::path::Path;
use std::process::{Command, Output};

use aplc_test_support::mcp::{HttpServer, calls, context, failed_with, results, run_args};
use aplc_test_support::otlp::Receiver;
use aplc_test_support::{aplc, scratch_in};
use serde_json::{Value as Json, json};

/// The bearer token the servers require; long enough to be redacted (8+ characters).
const TOKEN: &str = "mcp-http-token-0123456789abcdef";
const AGENT: &str = "# prompt: go\nUse the tools.\n";

/// A manifest with one HTTP server `name` at `url`, its `Authorization` header from
/// `REMOTE_AUTH`, and `extra` keys.
fn remote(name: &str, url: &str, extra: Json) -> Json {
    let mut server = json!({"url": url, "headers_env": {"Authorization": "REMOTE_AUTH"},
                            "startup_timeout_ms": 60000});
    if let (Some(server), Json::Object(extra)) = (server.as_object_mut(), extra) {
        server.extend(extra);
    }
    json!({"mcpServers": {name: server}})
}

/// `aplc run` in `dir` with `REMOTE_AUTH` = `auth` (unset when `None`), plus `args`.
fn command(dir: &Path, mock: Json, manifest: Json, auth: Option<&str>, args: &[String]) -> Command {
    let mut run = run_args(dir, AGENT, &mock, &manifest);
    run.extend(args.iter().cloned());
    let run: Vec<&str> = run.iter().map(String::as_str).collect();
    let mut command = aplc!(dir, &run);
    command.env("NO_COLOR", "1").env_remove("REMOTE_AUTH");
    if let Some(auth) = auth {
        command.env("REMOTE_AUTH", auth);
    }
    command
}

/// [`command`] without extra arguments, run; it must not panic.
fn run(dir: &Path, mock: Json, manifest: Json, auth: Option<&str>) -> Output {
    finished(command(dir, mock, manifest, auth, &[]))
}

fn finished(mut command: Command) -> Output {
    let out = command.output().expect("aplc runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    out
}

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

/// How many side effects the counter server made.
fn count(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("count"))
        .map(|text| text.lines().count())
        .unwrap_or(0)
}

/// The counter server over HTTP, counting in `dir/count`.
fn counter(dir: &Path) -> HttpServer {
    let file = dir.join("count").to_string_lossy().into_owned();
    HttpServer::start("counter_server.py", TOKEN, &[("COUNTER_FILE", &file)])
}

#[test]
fn calls_over_http_map_results_and_run_a_side_effect_once() {
    let dir = scratch_in!("mcp_http", "calls");
    let server = counter(&dir);
    let mock = calls(&[
        ("add", json!({"a": 40, "b": 2})),
        ("greet", json!({"name": "Ada"})),
        ("fail", json!({"reason": "testing"})),
        ("bump", json!({})),
        ("add", json!({"a": "forty", "b": 2})),
    ]);
    let out = run(
        &dir,
        mock,
        remote("counter", &server.url(), json!({})),
        Some(&bearer()),
    );
    let results = results(&context(&out));
    assert_eq!(results[0], (json!({"sum": 42}), false));
    assert_eq!(results[1], (json!("Hello, Ada!"), false));
    assert!(
        failed_with(&results[2], "failed on purpose: testing"),
        "{results:?}"
    );
    assert_eq!(results[3], (json!("count=1"), false));
    // Refused by the `inputSchema` before the call: the server never sees it.
    assert!(
        failed_with(&results[4], "`add`: invalid arguments"),
        "{results:?}"
    );
    assert_eq!(count(&dir), 1);
}

#[test]
fn a_bad_or_missing_token_is_a_start_error_naming_the_server() {
    let dir = scratch_in!("mcp_http", "token");
    let server = counter(&dir);
    let manifest = remote("remote", &server.url(), json!({}));
    let mock = calls(&[("bump", json!({}))]);
    let wrong = "Bearer wrong-token-abcdefghijklmnop";
    let out = run(&dir, mock.clone(), manifest.clone(), Some(wrong));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("MCP server `remote`: did not initialize: Auth required"),
        "{stderr}"
    );
    assert!(!stderr.contains("wrong-token"), "{stderr}");

    let out = run(&dir, mock, manifest, None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "MCP server `remote`: `headers_env`: the variable `REMOTE_AUTH` (header \
             `Authorization`) is not set"
        ),
        "{stderr}"
    );
    assert_eq!(count(&dir), 0);
}

#[test]
fn a_slow_call_times_out_and_the_session_goes_on() {
    let dir = scratch_in!("mcp_http", "timeout");
    let server = counter(&dir);
    let manifest = remote("counter", &server.url(), json!({"timeout_ms": 500}));
    let mock = calls(&[
        ("sleep", json!({"seconds": 30})),
        ("add", json!({"a": 1, "b": 1})),
    ]);
    let started = std::time::Instant::now();
    let results = results(&context(&run(&dir, mock, manifest, Some(&bearer()))));
    assert!(started.elapsed() < std::time::Duration::from_secs(25));
    assert!(
        failed_with(&results[0], "timed out after 500 ms (MCP server `counter`"),
        "{results:?}"
    );
    assert_eq!(results[1], (json!({"sum": 2}), false));
}

#[test]
fn a_server_killed_mid_call_fails_that_call_and_the_next_ones() {
    let dir = scratch_in!("mcp_http", "crash");
    let mut server = counter(&dir);
    let manifest = remote("counter", &server.url(), json!({"timeout_ms": 20000}));
    let mock = calls(&[
        ("add", json!({"a": 1, "b": 1})),
        ("crash", json!({})),
        ("add", json!({"a": 2, "b": 2})),
    ]);
    let started = std::time::Instant::now();
    let results = results(&context(&run(&dir, mock, manifest, Some(&bearer()))));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(18),
        "a call waited for its timeout"
    );
    assert_eq!(results[0], (json!({"sum": 2}), false));
    // The call in flight and the next one fail at once, naming the server (the next one
    // with `could not connect`, or a reset if the server's socket was still closing).
    for failed in &results[1..] {
        assert!(failed_with(failed, "MCP server `counter`"), "{results:?}");
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !server.exited() {
        assert!(
            std::time::Instant::now() < deadline,
            "the server did not exit"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn tools_list_is_followed_through_its_pages() {
    let dir = scratch_in!("mcp_http", "pages");
    let log = dir.join("list").to_string_lossy().into_owned();
    let server = HttpServer::start("paged_server.py", TOKEN, &[("LIST_LOG", &log)]);
    let manifest = remote("paged", &server.url(), json!({"prefix": "p_"}));
    let mock = calls(&[("p_tool_4", json!({})), ("p_tool_0", json!({}))]);
    let context = context(&run(&dir, mock, manifest, Some(&bearer())));
    assert_eq!(
        results(&context),
        vec![(json!("4"), false), (json!("0"), false)]
    );
    let names: Vec<&str> = context["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t["function"]["name"].as_str())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        names,
        ["p_tool_0", "p_tool_1", "p_tool_2", "p_tool_3", "p_tool_4"]
    );
    // Three pages of two, asked for with no cursor, then each `nextCursor`.
    let cursors = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(cursors, "-\n2\n4\n");
}

#[test]
fn a_header_secret_never_appears_in_output_events_store_or_traces() {
    let dir = scratch_in!("mcp_http", "secret");
    let server = counter(&dir);
    let otlp = Receiver::start(200);
    let manifest = remote("counter", &server.url(), json!({}));
    // The server hands the token back in a result: aplc redacts it.
    let mock = calls(&[("leak", json!({})), ("add", json!({"a": 1, "b": 2}))]);
    let events = dir.join("events.jsonl");
    let store = dir.join("runs.db");
    let args = [
        "--events".to_string(),
        events.to_string_lossy().into_owned(),
        "--store".to_string(),
        format!("sqlite:{}", store.to_string_lossy()),
    ];
    let mut command = command(&dir, mock, manifest, Some(&bearer()), &args);
    command
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.endpoint())
        .env("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true");
    let out = finished(command);
    let results = results(&context(&out));
    let leaked = results[0].0.as_str().unwrap_or_default();
    assert!(
        leaked.starts_with("my token is") && leaked.ends_with("<redacted>"),
        "{results:?}"
    );
    assert_eq!(results[1], (json!({"sum": 3}), false));
    // Every place a run writes to, as bytes.
    let mut places: Vec<(String, Vec<u8>)> = vec![
        ("stdout".into(), out.stdout.clone()),
        ("stderr".into(), out.stderr.clone()),
    ];
    for file in [&events, &store] {
        let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(!bytes.is_empty(), "{} is empty", file.display());
        places.push((file.display().to_string(), bytes));
    }
    // A WAL the store has not checkpointed holds the newest pages.
    if let Ok(wal) = std::fs::read(dir.join("runs.db-wal")) {
        places.push(("runs.db-wal".into(), wal));
    }
    let spans = otlp.requests();
    assert!(
        spans.iter().any(|r| r.path == "/v1/traces"),
        "no trace was exported"
    );
    for request in spans {
        places.push((request.path.clone(), request.body.clone()));
    }
    for (place, bytes) in &places {
        let text = String::from_utf8_lossy(bytes);
        assert!(!text.contains(TOKEN), "the token is in {place}");
        assert!(
            !text.contains(&TOKEN[..16]),
            "part of the token is in {place}"
        );
    }
}

#[test]
fn a_server_that_never_answers_is_a_start_error_at_its_startup_timeout() {
    let dir = scratch_in!("mcp_http", "mute");
    // Accepts connections and reads, never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/mcp", listener.local_addr().expect("address"));
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    let manifest = remote("mute", &url, json!({"startup_timeout_ms": 500}));
    let started = std::time::Instant::now();
    let out = run(&dir, calls(&[]), manifest, Some(&bearer()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "MCP server `mute`: did not initialize and list its tools within 500 ms \
             (`startup_timeout_ms`)"
        ),
        "{stderr}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
}

//! `aplc mcp` (spec/mcp.md §3): the agents of `fixtures/mcp/agents/` served as MCP tools,
//! driven by the official Python client (PyPI `mcp`: `ClientSession` over `stdio_client`
//! and over streamable HTTP) through `fixtures/mcp/agents_client.py`, with the scripted
//! provider (a `mock` route per model): no network beyond 127.0.0.1.
//!
//! The interpreter with `mcp` installed is `APLC_MCP_PYTHON` (`.ci/run` makes a venv and
//! sets it). Without it these tests fail, never skip:
//! `python3 -m venv /tmp/mcpvenv && /tmp/mcpvenv/bin/pip install mcp`, then
//! `APLC_MCP_PYTHON=/tmp/mcpvenv/bin/python cargo test -p aplc --test mcp_agents`.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use aplc_test_support::mcp::python;
use aplc_test_support::process::root;
use serde_json::{Value as Json, json};

/// A bearer token of `--listen` (also a secret: redacted wherever it appears).
const TOKEN: &str = "mcp-test-token-5e2a9c41d7";
/// A provider key in the environment: a secret the answers quote, never shown.
const KEY: &str = "sk-mcp-agents-test-0123456789abcdef";

/// A scratch directory with `agents/` (the fixture agents, `greet` as a bundle built by
/// `aplc build`), `providers.json` (a mock route per model: the JSON agent's answers,
/// then the text agent's, which quote [`KEY`]) and `calls.json`.
fn scratch(name: &str, calls: &Json) -> PathBuf {
    let dir = aplc_test_support::scratch_in!("mcp_agents", name);
    let agents = dir.join("agents");
    std::fs::create_dir_all(&agents).expect("agents dir");
    let fixtures = root().join("fixtures/mcp/agents");
    for agent in ["haiku.apl", "broken.apl"] {
        std::fs::copy(fixtures.join(agent), agents.join(agent)).expect("agent");
    }
    let built = Command::new(env!("CARGO_BIN_EXE_aplc"))
        .arg("build")
        .arg(fixtures.join("greet.apl"))
        .arg("-o")
        .arg(agents.join("greet.aplb"))
        .output()
        .expect("aplc build");
    assert!(built.status.success(), "{built:?}");
    let answers = |texts: &[&str]| -> Vec<Json> { texts.iter().map(|t| json!(t)).collect() };
    let providers = json!({"routes": [
        {"model": "json-model", "kind": "mock",
         "responses": answers(&[r#"{"haiku": "old pond", "lines": 3}"#, r#"{"haiku": "again"}"#])},
        {"model": "*", "kind": "mock",
         "responses": answers(&[&format!("hello Ada, your key is {KEY}"), "hello again"])},
    ]});
    std::fs::write(dir.join("providers.json"), providers.to_string()).expect("providers");
    std::fs::write(dir.join("calls.json"), calls.to_string()).expect("calls");
    dir
}

/// `aplc mcp` in `dir` with these extra arguments, as the client script starts it (or
/// as a test does), with a clean environment but for [`KEY`].
fn aplc_mcp_args(extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["mcp", "--agents", "agents", "--providers", "providers.json"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// The client script, in `dir`, with `args` after `calls.json`; its parsed stdout.
fn client(dir: &Path, args: &[String]) -> Json {
    let script = root().join("fixtures/mcp/agents_client.py");
    let output = run_bounded(
        Command::new(python())
            .current_dir(dir)
            .arg(script)
            .arg("calls.json")
            .args(args)
            .env("OPENAI_API_KEY", KEY)
            .env("RUST_LOG", "info")
            .env_remove("APLC_STORE"),
    );
    assert!(
        output.status.success(),
        "the client failed ({:?}):\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// Runs `command` to its end, killing it past a generous deadline (a hang fails the
/// test instead of the whole suite).
fn run_bounded(command: &mut Command) -> Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let stdout = drain(child.stdout.take().expect("stdout"));
    let stderr = drain(child.stderr.take().expect("stderr"));
    let status = wait_bounded(&mut child, Duration::from_secs(120));
    Output {
        status,
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    }
}

/// Reads `pipe` to its end on a thread of its own.
fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        bytes
    })
}

/// Waits for `child` to exit; kills it and fails past `limit`.
fn wait_bounded(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the process did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The tool named `name` of a listing.
fn tool<'a>(out: &'a Json, name: &str) -> &'a Json {
    out["tools"]
        .as_array()
        .and_then(|tools| tools.iter().find(|t| t["name"] == name))
        .unwrap_or_else(|| panic!("no tool `{name}`: {out}"))
}

/// The text of a call result's only content.
fn text(result: &Json) -> &str {
    assert_eq!(
        result["content"].as_array().map(Vec::len),
        Some(1),
        "{result}"
    );
    assert_eq!(result["content"][0]["type"], "text", "{result}");
    result["content"][0]["text"].as_str().unwrap_or_default()
}

#[test]
fn stdio_lists_the_agents_and_runs_them_as_durable_runs() {
    let calls = json!([
        {"name": "haiku", "arguments": {"topic": "rust", "lines": 3}},
        {"name": "greet", "arguments": {"name": "Ada"}},
        {"name": "broken", "arguments": {}},
        {"name": "haiku", "arguments": {"topic": "rust"}},
        {"name": "haiku", "arguments": {"topic": "rust", "lines": 3, "extra": 1}},
        {"name": "greet", "arguments": {"context_history": []}},
        {"name": "nope", "arguments": {}},
    ]);
    let dir = scratch("stdio", &calls);
    let mut args = vec!["stdio".to_string(), env!("CARGO_BIN_EXE_aplc").to_string()];
    args.extend(aplc_mcp_args(&["--store", "sqlite:runs.db"]));
    let out = client(&dir, &args);

    assert_eq!(out["server"]["name"], "aplc", "{out}");
    let names: Vec<&str> = out["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["broken", "greet", "haiku"], "{out}");
    let haiku = tool(&out, "haiku");
    assert_eq!(
        haiku["description"],
        "Writes a haiku about a topic, as JSON."
    );
    assert_eq!(
        haiku["inputSchema"],
        json!({"type": "object", "properties": {"topic": {}, "lines": {}},
               "required": ["topic", "lines"], "additionalProperties": false})
    );
    // No inputs declared: any object. No comment: a description of its own.
    let greet = tool(&out, "greet");
    assert_eq!(greet["inputSchema"], json!({"type": "object"}));
    assert_eq!(greet["description"], "Runs the APL agent `greet`.");
    // A bundle keeps its description (built from source in `broken`'s case at load).
    assert_eq!(
        tool(&out, "broken")["description"],
        "Always fails: its post phase jumps to a step that does not exist."
    );

    let results = out["calls"].as_array().expect("calls");
    // `result_json`: structured content, and the same JSON as text.
    let structured = &results[0];
    assert_eq!(structured["isError"], false, "{structured}");
    let expected = json!({"haiku": "old pond", "lines": 3});
    assert_eq!(structured["structuredContent"], expected);
    let as_text: Json = serde_json::from_str(text(structured)).expect("JSON text");
    assert_eq!(as_text, expected);
    // `result_text` (from a bundle), with the provider key redacted.
    let plain = &results[1];
    assert_eq!(plain["isError"], false, "{plain}");
    assert!(plain.get("structuredContent").is_none(), "{plain}");
    assert_eq!(text(plain), "hello Ada, your key is <redacted>");
    // A failed run, a missing input, an undeclared argument, a name a run cannot set.
    let failures = [
        (2, "Unknown step: nowhere (in step `go`)"),
        (3, "missing input: lines"),
        (
            4,
            "agent `haiku` takes no argument `extra`; its inputs: topic, lines",
        ),
        (5, "`context` cannot set `context_history`"),
    ];
    for (index, message) in failures {
        let result = &results[index];
        assert_eq!(result["isError"], true, "{result}");
        assert!(text(result).starts_with(message), "{result}");
    }
    // An unknown tool is a protocol error, and the session goes on.
    let unknown = results[6]["protocolError"].as_str().unwrap_or_default();
    assert!(unknown.contains("unknown tool `nope`"), "{}", results[6]);

    // `--store`: each call that ran is a durable run: listed, finished, its answer kept.
    let listed = aplc_test_support::process::succeed(&mut aplc_test_support::aplc!(
        &dir,
        &["runs", "list", "--store", "sqlite:runs.db"]
    ));
    let listing = String::from_utf8_lossy(&listed.stdout);
    let rows: Vec<&str> = listing.lines().filter(|l| l.contains(".apl")).collect();
    assert_eq!(rows.len(), 3, "{listing}");
    for agent in ["haiku.apl", "greet.apl", "broken.apl"] {
        assert!(rows.iter().any(|r| r.contains(agent)), "{listing}");
    }
    assert!(
        rows.iter()
            .any(|r| r.contains("broken.apl") && r.contains("failed")),
        "{listing}"
    );
}

/// `aplc mcp --listen 127.0.0.1:0`, with [`TOKEN`] accepted; killed when dropped.
struct HttpServer {
    child: Child,
    url: String,
}

impl HttpServer {
    fn start(dir: &Path) -> HttpServer {
        let mut child = Command::new(env!("CARGO_BIN_EXE_aplc"))
            .current_dir(dir)
            .args(aplc_mcp_args(&["--listen", "127.0.0.1:0"]))
            .env("APLC_SERVE_TOKENS", TOKEN)
            .env("OPENAI_API_KEY", KEY)
            .env_remove("APLC_STORE")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn aplc mcp");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read the address");
        let Some(url) = line.trim().strip_prefix("listening on ") else {
            let _ = child.kill();
            panic!("aplc mcp did not start: {line:?}");
        };
        HttpServer {
            url: url.to_string(),
            child,
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn streamable_http_serves_the_agents_behind_bearer_tokens() {
    let calls = json!([
        {"name": "haiku", "arguments": {"topic": "rust", "lines": 3}},
        {"name": "broken", "arguments": {}},
    ]);
    let dir = scratch("http", &calls);
    let mut server = HttpServer::start(&dir);
    let args = ["http".to_string(), server.url.clone(), TOKEN.to_string()];
    let out = client(&dir, &args);
    assert_eq!(
        tool(&out, "haiku")["inputSchema"]["required"],
        json!(["topic", "lines"])
    );
    let results = out["calls"].as_array().expect("calls");
    assert_eq!(
        results[0]["structuredContent"],
        json!({"haiku": "old pond", "lines": 3})
    );
    assert_eq!(results[1]["isError"], true, "{}", results[1]);

    // Hostile requests: each gets a clear refusal, and the server goes on serving.
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}});
    let (status, body) = post(&server.url, None, &initialize.to_string());
    assert_eq!(status, 401, "{body}");
    assert!(
        body.contains("missing `Authorization: Bearer TOKEN`"),
        "{body}"
    );
    let (status, body) = post(&server.url, Some("wrong-token"), &initialize.to_string());
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("not accepted"), "{body}");
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"greet","arguments":{{"x":"{}"}}}}}}"#,
        "a".repeat(2 << 20)
    );
    let (status, _) = post(&server.url, Some(TOKEN), &huge);
    assert_eq!(status, 413);
    let not_an_object = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "greet", "arguments": [1, 2]}});
    let (status, body) = post(&server.url, Some(TOKEN), &not_an_object.to_string());
    let answer: Json = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(status, 200, "{body}");
    assert_eq!(answer["error"]["code"], -32602, "{body}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("`arguments`, an object"), "{body}");
    let (status, body) = post(&server.url, Some(TOKEN), "{not json");
    assert!(
        status >= 400 || body.contains("\"error\""),
        "{status}: {body}"
    );

    let again = client(&dir, &args);
    assert_eq!(again["tools"].as_array().map(Vec::len), Some(3), "{again}");
    assert!(server.child.try_wait().expect("wait").is_none(), "it died");
}

/// POSTs `body` to the MCP endpoint as a streamable-HTTP client would; the status and
/// the body of the answer. Blocking std sockets: the server runs in another process.
fn post(url: &str, token: Option<&str>, body: &str) -> (u16, String) {
    let address = url
        .strip_prefix("http://")
        .and_then(|rest| rest.split('/').next())
        .expect("an http URL");
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\n{auth}Content-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).expect("send the head");
    // The server may answer (413) before the whole body is sent, and close.
    let _ = stream.write_all(body.as_bytes());
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string());
    (status, body)
}

#[test]
fn listen_without_a_token_is_refused() {
    let dir = scratch("no_token", &json!([]));
    let output = run_bounded(
        Command::new(env!("CARGO_BIN_EXE_aplc"))
            .current_dir(&dir)
            .args(aplc_mcp_args(&["--listen", "127.0.0.1:0"]))
            .env_remove("APLC_SERVE_TOKENS"),
    );
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no bearer tokens"), "{stderr}");
}

/// `aplc mcp` over stdio, driven by hand: the initialize handshake, then a listing.
fn stdio_session(dir: &Path) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_aplc"))
        .current_dir(dir)
        .args(aplc_mcp_args(&[]))
        .env_remove("APLC_STORE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn aplc mcp");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let stdin = child.stdin.as_mut().expect("stdin");
    let messages = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    ];
    for message in messages {
        writeln!(stdin, "{message}").expect("write");
    }
    stdin.flush().expect("flush");
    for id in [1, 2] {
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read an answer");
        let answer: Json = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(answer["id"], id, "{answer}");
        assert!(answer.get("result").is_some(), "{answer}");
    }
    (child, stdout)
}

#[test]
fn the_end_of_input_ends_the_stdio_server_cleanly() {
    let dir = scratch("eof", &json!([]));
    let (mut child, _stdout) = stdio_session(&dir);
    drop(child.stdin.take());
    let status = wait_bounded(&mut child, Duration::from_secs(60));
    assert_eq!(status.code(), Some(0));

    // A client that leaves before it initializes: the same clean end.
    let output = run_bounded(
        Command::new(env!("CARGO_BIN_EXE_aplc"))
            .current_dir(&dir)
            .args(aplc_mcp_args(&[])),
    );
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(output.stdout.is_empty(), "{output:?}");
}

#[test]
fn sigterm_and_sigint_stop_the_stdio_server() {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let dir = scratch(&format!("signal_{signal}"), &json!([]));
        let (mut child, _stdout) = stdio_session(&dir);
        let pid = i32::try_from(child.id()).expect("pid");
        // SAFETY: `kill` with the pid of a child this test started and has not reaped.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        let status = wait_bounded(&mut child, Duration::from_secs(60));
        assert_eq!(status.code(), Some(0), "signal {signal}");
    }
}

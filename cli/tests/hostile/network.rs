//! Hostile input: providers, HTTP and tools (issue #9: F10–F13, F19, F20, proxies). Every
//! server here is a thread on 127.0.0.1; see `spec/limits.md`, "Providers, HTTP and
//! tools" and "Secrets and redaction".

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};

use crate::harness::{Capped, Caps, aplc_in, scratch, write};

// ---------------------------------------------------------------------------------------
// A scriptable server on 127.0.0.1.

/// One request as the server read it: the request line, the headers and the body.
#[derive(Debug, Clone)]
struct Seen {
    line: String,
    head: String,
    body: String,
}

/// What a handler does with a connection once it has read the request.
type Handler = Arc<dyn Fn(&Seen, &mut TcpStream) + Send + Sync>;

/// A server that answers every connection with `handler` and records what it was sent.
struct Server {
    addr: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Server {
    fn start(handler: impl Fn(&Seen, &mut TcpStream) + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("local address").to_string();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let handler: Handler = Arc::new(handler);
        let log = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let (handler, log) = (handler.clone(), log.clone());
                std::thread::spawn(move || {
                    let Some(request) = read_request(&stream) else {
                        return;
                    };
                    log.lock().unwrap().push(request.clone());
                    handler(&request, &mut stream);
                });
            }
        });
        Server { addr, seen }
    }

    /// Answers every request with `status` and `body` (JSON).
    fn answering(status: u16, body: String) -> Server {
        Server::start(move |_, stream| respond(stream, status, &[], &body))
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn read_request(stream: &TcpStream) -> Option<Seen> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut head = String::new();
    let mut length = 0;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).ok()? == 0 || header == "\r\n" {
            break;
        }
        if let Some(v) = header.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        head.push_str(&header);
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(Seen {
        line: line.trim_end().to_owned(),
        head,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

fn respond(stream: &mut TcpStream, status: u16, headers: &[(&str, &str)], body: &str) {
    let mut text = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str("\r\n");
    text.push_str(body);
    let _ = stream.write_all(text.as_bytes());
}

fn completion(text: &str) -> String {
    json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": text},
            "finish_reason": "stop"}]})
    .to_string()
}

/// An address nobody listens on.
fn closed_port() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    drop(listener);
    format!("http://{addr}")
}

fn caps() -> Caps {
    Caps {
        time: Duration::from_secs(60),
        ..Caps::default()
    }
}

fn run(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Capped {
    let file = dir.join("agent.apl").to_string_lossy().into_owned();
    let mut all = vec!["run", file.as_str()];
    all.extend_from_slice(args);
    // The developer's own proxy settings must not change what these tests see.
    let mut env = env.to_vec();
    for name in [
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
    ] {
        if !env.iter().any(|(n, _)| *n == name) {
            env.push((name, ""));
        }
    }
    let out = aplc_in(&all, caps(), None, &env);
    out.assert_clean_exit();
    out
}

// ---------------------------------------------------------------------------------------
// F10 and F11: no run of 16 characters of a secret appears anywhere.

/// Fails if any 16-character window of `secret` appears in `text`, in any letter case.
#[track_caller]
fn assert_no_part_of(secret: &str, text: &str, what: &str) {
    let lower = text.to_ascii_lowercase();
    let secret = secret.to_ascii_lowercase();
    for start in 0..=secret.len().saturating_sub(16) {
        let window = &secret[start..(start + 16).min(secret.len())];
        assert!(
            !lower.contains(window),
            "{what} holds `{window}` (characters {start}.. of a secret):\n{text}"
        );
    }
}

/// Two steps: the first calls model `bad` (a failing HTTP route), the second model
/// `good` (a mock) whose answer calls the `with_context` tool `dump`, which writes the
/// context it receives to `dump.json`.
fn leak_agent(dir: &Path, bad_route: Json) -> (String, String) {
    write(
        dir,
        "agent.apl",
        "# pre: first\n{{ set_context('model', 'bad') }}\n\n# prompt: first\n## user\nhi\n\n\
         # post: first\n{{ set_context('carried', errors) }}\n{{ set_context('next_step', 'second') }}\n\n\
         # pre: second\n{{ set_context('model', 'good') }}\n{{ set_context('allowed_tools', ['dump']) }}\n\n\
         # prompt: second\n## user\nnow dump\n",
    );
    let tool_call = json!({"tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "dump", "arguments": "{}"}}]});
    let providers = json!({"routes": [
        bad_route,
        {"model": "good", "kind": "mock", "responses": [tool_call, "done"]},
    ]});
    let providers = write(dir, "providers.json", providers.to_string());
    let dump = dir.join("dump.json").to_string_lossy().into_owned();
    let tools = json!({"dump": {
        "command": ["sh", "-c", format!("cat > '{dump}'; echo '\"dumped\"'")],
        "with_context": true,
        "descriptor": {"name": "dump", "parameters": {"type": "object", "properties": {}}},
    }});
    let tools = write(dir, "tools.json", tools.to_string());
    (providers, tools)
}

/// Runs the leak agent with `--json` and checks stdout, stderr and what the tool got.
fn assert_secret_never_shown(name: &str, secret: &str, route: Json, env: &[(&str, &str)]) {
    let dir = scratch(name);
    let (providers, tools) = leak_agent(&dir, route);
    let out = run(
        &dir,
        &["--providers", &providers, "--tools", &tools, "--json"],
        env,
    );
    let dumped = std::fs::read_to_string(dir.join("dump.json")).unwrap_or_default();
    assert!(
        dumped.contains("HTTP 401"),
        "the tool did not get the provider's error (exit {:?}):\n{dumped}\nstderr:\n{}",
        out.code,
        out.stderr
    );
    assert!(
        out.stdout.contains("HTTP 401"),
        "stdout:\n{}\nstderr:\n{}",
        out.stdout,
        out.stderr
    );
    assert_no_part_of(secret, &out.stdout, "stdout (--json)");
    assert_no_part_of(secret, &out.stderr, "stderr");
    assert_no_part_of(secret, &dumped, "the with_context tool's input");
}

/// A key of `len` characters that is easy to recognise.
fn long_key(len: usize) -> String {
    let mut key = String::from("sk-proj-");
    let alphabet = b"abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789";
    let mut state = 0x2545_f491_u64;
    while key.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        key.push(alphabet[(state % alphabet.len() as u64) as usize] as char);
    }
    key
}

#[test]
fn f10_a_key_quoted_after_a_long_preamble_never_leaks() {
    let key = long_key(164);
    let preamble = "Incorrect API key provided. The gateway received the following credential: ";
    let preamble = format!("{preamble:.<80}");
    assert_eq!(preamble.len(), 80);
    let body = json!({"error": {"message": format!("{preamble}{key}")}}).to_string();
    let server = Server::answering(401, body);
    let route = json!({"model": "bad", "kind": "openai", "base_url": server.url(),
                       "api_key_env": "HOSTILE_KEY", "max_retries": 0});
    assert_secret_never_shown("f10", &key, route, &[("HOSTILE_KEY", &key)]);
}

#[test]
fn f11_a_bearer_header_value_echoed_alone_never_leaks() {
    let token = long_key(48);
    let body = json!({"error": {"message": format!("token {token} is revoked")}}).to_string();
    let server = Server::answering(401, body);
    let route = json!({"model": "bad", "kind": "openai", "base_url": server.url(),
                       "headers_env": {"Authorization": "HOSTILE_AUTH"}, "max_retries": 0});
    let bearer = format!("Bearer {token}");
    assert_secret_never_shown("f11-bearer", &token, route, &[("HOSTILE_AUTH", &bearer)]);
}

#[test]
fn f11_a_key_echoed_in_upper_case_never_leaks() {
    let key = long_key(51);
    let body =
        json!({"error": {"message": format!("KEY {} UNKNOWN", key.to_uppercase())}}).to_string();
    let server = Server::answering(401, body);
    let route = json!({"model": "bad", "kind": "openai", "base_url": server.url(),
                       "api_key_env": "HOSTILE_KEY", "max_retries": 0});
    assert_secret_never_shown("f11-upper", &key, route, &[("HOSTILE_KEY", &key)]);
}

#[test]
fn f11_a_secret_in_the_base_url_query_never_leaks() {
    let secret = long_key(40);
    let dir = scratch("f11-query");
    write(&dir, "agent.apl", "# prompt: p\n## user\nhi\n");
    let base = format!("{}/?key={secret}", closed_port());
    let out = run(&dir, &["--base-url", &base], &[("OPENAI_API_KEY", "")]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("query"), "{}", out.stderr);
    assert_no_part_of(&secret, &out.stderr, "stderr");
    assert_no_part_of(&secret, &out.stdout, "stdout");
    // The same in a providers file.
    let providers = json!({"routes": [{"model": "*", "kind": "openai", "base_url": base}]});
    let providers = write(&dir, "providers.json", providers.to_string());
    let out = run(&dir, &["--providers", &providers], &[]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert_no_part_of(&secret, &out.stderr, "stderr");
}

// ---------------------------------------------------------------------------------------
// Proxies: loopback is never proxied.

#[test]
fn http_proxy_never_sees_loopback_requests_or_the_key() {
    let key = long_key(40);
    let proxy = Server::answering(502, "{\"error\": \"proxy\"}".into());
    let server = Server::answering(200, completion("direct"));
    let dir = scratch("proxy-loopback");
    write(&dir, "agent.apl", "# prompt: p\n## user\nhi\n");
    for host in ["127.0.0.1", "localhost"] {
        let base = server.url().replace("127.0.0.1", host);
        let out = run(
            &dir,
            &["--base-url", &base],
            &[
                ("OPENAI_API_KEY", &key),
                ("HTTP_PROXY", &proxy.url()),
                ("http_proxy", &proxy.url()),
                ("ALL_PROXY", &proxy.url()),
            ],
        );
        assert_eq!(out.code, Some(0), "{host}: {}", out.stderr);
        assert_eq!(out.stdout.trim(), "direct", "{host}");
    }
    assert!(proxy.seen().is_empty(), "the proxy got {:?}", proxy.seen());
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert!(
        seen[0].head.to_ascii_lowercase().contains(&format!(
            "authorization: bearer {}",
            key.to_ascii_lowercase()
        )),
        "{}",
        seen[0].head
    );
}

#[test]
fn http_proxy_is_still_used_for_other_hosts() {
    let proxy = Server::answering(200, completion("via proxy"));
    let dir = scratch("proxy-remote");
    write(&dir, "agent.apl", "# prompt: p\n## user\nhi\n");
    let out = run(
        &dir,
        &["--base-url", "http://api.example.invalid"],
        &[
            ("OPENAI_API_KEY", "sk-0123456789abcdef"),
            ("HTTP_PROXY", &proxy.url()),
        ],
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout.trim(), "via proxy");
    let seen = proxy.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].line,
        "POST http://api.example.invalid/v1/chat/completions HTTP/1.1"
    );
}

// ---------------------------------------------------------------------------------------
// F12, F19, F20: HTTP and command tools.

/// A one-step agent whose mock answer calls `tool` with `arguments`; returns the run and
/// its final context.
fn call_tool(name: &str, tool: Json, arguments: &str) -> (Capped, Json) {
    let dir = scratch(name);
    write(
        &dir,
        "agent.apl",
        "# pre: p\n{{ set_context('allowed_tools', ['t']) }}\n\n# prompt: p\n## user\ngo\n",
    );
    let call = json!({"tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "t", "arguments": arguments}}]});
    let mock = write(&dir, "mock.json", json!([call, "done"]).to_string());
    let mut tool = tool;
    tool["descriptor"] = json!({"name": "t", "parameters": {"type": "object"}});
    let tools = write(&dir, "tools.json", json!({"t": tool}).to_string());
    let out = run(&dir, &["--mock", &mock, "--tools", &tools, "--json"], &[]);
    let context: Json = serde_json::from_str(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON context ({e}); exit {:?}; stderr:\n{}",
            out.code, out.stderr
        )
    });
    (out, context)
}

/// The first tool result: its content and whether it is an error.
fn tool_result(context: &Json) -> (Json, bool) {
    let result = &context["result_tool_calls"][0];
    (
        result["content"].clone(),
        result["with_error"].as_bool().unwrap_or(false),
    )
}

#[test]
fn f12_an_endless_http_tool_body_is_cut_off() {
    let server = Server::start(|_, stream| {
        let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                    transfer-encoding: chunked\r\n\r\n";
        if stream.write_all(head.as_bytes()).is_err() {
            return;
        }
        let chunk = format!("{:x}\r\n{}\r\n", 64 * 1024, "7".repeat(64 * 1024));
        // Until the client hangs up.
        while stream.write_all(chunk.as_bytes()).is_ok() {}
    });
    let started = Instant::now();
    let (out, context) = call_tool(
        "f12-endless",
        json!({"url": server.url(), "timeout_ms": 30000}),
        "{}",
    );
    let (content, with_error) = tool_result(&context);
    assert!(with_error, "{content}");
    assert!(
        content.as_str().unwrap_or_default().contains("larger than"),
        "{content}\n{}",
        out.stderr
    );
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn f12_a_cross_origin_redirect_is_not_followed() {
    let elsewhere = Server::answering(200, "{\"stolen\": true}".into());
    let target = format!("{}/collect", elsewhere.url());
    let server = Server::start(move |_, stream| respond(stream, 307, &[("location", &target)], ""));
    let (_, context) = call_tool(
        "f12-307",
        json!({"url": server.url(), "with_context": true}),
        "{}",
    );
    let (content, with_error) = tool_result(&context);
    assert!(with_error, "{content}");
    assert!(
        content.as_str().unwrap_or_default().contains("307"),
        "{content}"
    );
    assert!(elsewhere.seen().is_empty(), "{:?}", elsewhere.seen());
    assert_eq!(server.seen().len(), 1);
}

#[test]
fn f12_a_redirect_that_would_turn_the_post_into_a_get_is_an_error() {
    let server = Server::start(|seen, stream| {
        if seen.line.starts_with("POST /start") {
            respond(stream, 302, &[("location", "/landing")], "");
        } else {
            respond(stream, 200, &[], "{\"landed\": true}");
        }
    });
    let (_, context) = call_tool(
        "f12-302",
        json!({"url": format!("{}/start", server.url())}),
        "{}",
    );
    let (content, with_error) = tool_result(&context);
    assert!(with_error, "{content}");
    assert!(
        content.as_str().unwrap_or_default().contains("302"),
        "{content}"
    );
    assert!(
        server.seen().iter().all(|s| s.line.starts_with("POST")),
        "{:?}",
        server.seen()
    );
}

#[test]
fn f12_a_same_origin_307_is_followed_with_the_same_post() {
    let server = Server::start(|seen, stream| {
        if seen.line.starts_with("POST /old") {
            respond(stream, 307, &[("location", "/new")], "");
        } else {
            respond(stream, 200, &[], &json!({"echo": seen.body}).to_string());
        }
    });
    let (_, context) = call_tool(
        "f12-307-same",
        json!({"url": format!("{}/old", server.url())}),
        "{\"n\": 1}",
    );
    let (content, with_error) = tool_result(&context);
    assert!(!with_error, "{content}");
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen[1].line.starts_with("POST /new"), "{seen:?}");
    assert_eq!(seen[1].body, seen[0].body);
}

#[test]
fn f19_an_http_tool_names_the_cause_of_a_failure() {
    let (_, context) = call_tool("f19", json!({"url": closed_port()}), "{}");
    let (content, with_error) = tool_result(&context);
    assert!(with_error);
    let text = content.as_str().unwrap_or_default().to_lowercase();
    assert!(text.contains("connection refused"), "{content}");
}

#[test]
fn f20_integers_beyond_64_bits_in_tool_arguments_are_refused() {
    let dir = scratch("f20-int-tool");
    let echo = write(&dir, "echo.sh", "cat\n");
    let (_, context) = call_tool(
        "f20-int",
        json!({"command": ["sh", echo]}),
        "{\"n\": 123456789012345678901234567890}",
    );
    let (content, with_error) = tool_result(&context);
    assert!(with_error, "{content}");
    let text = content.as_str().unwrap_or_default();
    assert!(text.contains("123456789012345678901234567890"), "{text}");
    // Integers that fit are passed exactly.
    let (_, context) = call_tool(
        "f20-int-ok",
        json!({"command": ["sh", echo]}),
        "{\"big\": 18446744073709551615, \"small\": -9223372036854775808, \"s\": \"1e999999999999999999999\"}",
    );
    let (content, with_error) = tool_result(&context);
    assert!(!with_error, "{content}");
    assert_eq!(
        content["arguments"],
        json!({"big": 18446744073709551615u64, "small": i64::MIN, "s": "1e999999999999999999999"})
    );
}

#[test]
fn f20_non_utf8_tool_output_is_an_error_naming_the_byte() {
    let (_, context) = call_tool(
        "f20-utf8",
        json!({"command": ["sh", "-c", "printf 'ok \\377 no'"]}),
        "{}",
    );
    let (content, with_error) = tool_result(&context);
    assert!(with_error, "{content}");
    let text = content.as_str().unwrap_or_default();
    assert!(text.contains("UTF-8") && text.contains("byte 3"), "{text}");

    let server = Server::start(|_, stream| {
        let _ = stream.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 4\r\n\
              connection: close\r\n\r\nab\xfe\xff",
        );
    });
    let (_, context) = call_tool("f20-utf8-http", json!({"url": server.url()}), "{}");
    let (content, with_error) = tool_result(&context);
    assert!(with_error, "{content}");
    let text = content.as_str().unwrap_or_default();
    assert!(text.contains("UTF-8") && text.contains("byte 2"), "{text}");
}

// ---------------------------------------------------------------------------------------
// F13: tool processes never outlive their call or aplc.

/// Whether process `pid` still runs (a zombie waiting for its reaper does not count).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// Waits up to 5 s for `pid` to be gone.
fn gone(pid: i32) -> bool {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Waits up to 10 s for `path` to hold two pids (the tool's shell, then its grandchild).
fn pids_in(path: &Path) -> Vec<i32> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        if let Ok(text) = std::fs::read_to_string(path) {
            let pids: Vec<i32> = text
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect();
            if pids.len() == 2 {
                return pids;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the tool never wrote its pids to {}", path.display());
}

/// A tool that starts a grandchild in the background, writes both pids, and waits.
fn spawning_tool(dir: &Path, timeout_ms: u64) -> Json {
    let pids = dir.join("pids").to_string_lossy().into_owned();
    json!({
        "command": ["sh", "-c", format!("sleep 300 & echo $$ $! > '{pids}.tmp'; mv '{pids}.tmp' '{pids}'; wait")],
        "timeout_ms": timeout_ms,
    })
}

#[test]
fn f13_a_timed_out_tool_is_killed_with_its_grandchildren() {
    let dir = scratch("f13-timeout-pids");
    let (_, context) = call_tool("f13-timeout", spawning_tool(&dir, 700), "{}");
    let (content, with_error) = tool_result(&context);
    assert!(with_error, "{content}");
    assert!(content.as_str().unwrap_or_default().contains("timed out"));
    for pid in pids_in(&dir.join("pids")) {
        assert!(gone(pid), "process {pid} survived the tool's timeout");
    }
}

#[test]
fn f13_sigterm_and_sigint_to_aplc_kill_running_tools() {
    for (signal, code) in [(libc::SIGTERM, 143), (libc::SIGINT, 130)] {
        let dir = scratch(&format!("f13-signal-{signal}"));
        write(
            &dir,
            "agent.apl",
            "# pre: p\n{{ set_context('allowed_tools', ['t']) }}\n\n# prompt: p\n## user\ngo\n",
        );
        let call = json!({"tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "t", "arguments": "{}"}}]});
        let mock = write(&dir, "mock.json", json!([call, "done"]).to_string());
        let mut tool = spawning_tool(&dir, 60_000);
        tool["descriptor"] = json!({"name": "t", "parameters": {"type": "object"}});
        let tools = write(&dir, "tools.json", json!({"t": tool}).to_string());
        let mut child = Command::new(env!("CARGO_BIN_EXE_aplc"))
            .args([
                "run",
                &dir.join("agent.apl").to_string_lossy(),
                "--mock",
                &mock,
                "--tools",
                &tools,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("aplc starts");
        let pids = pids_in(&dir.join("pids"));
        // SAFETY: `kill` on a child we started and have not waited for.
        unsafe {
            libc::kill(child.id() as i32, signal);
        }
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            if started.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                panic!("aplc did not exit after signal {signal}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            let _ = pipe.read_to_string(&mut stderr);
        }
        assert_eq!(status.code(), Some(code), "signal {signal}: {stderr}");
        for pid in pids {
            assert!(gone(pid), "process {pid} survived signal {signal} to aplc");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Command tools and the run's secrets: tools do not inherit the variables that hold
// provider keys, and what a tool prints is redacted before it reaches `errors`.

/// A python3 command tool that says which provider variables it inherited, prints the
/// `OPENAI_API_KEY` it sees and the secret given as its argument (a test-only route: the
/// manifest's argv) in both cases, to stderr, and fails.
fn leaking_tool(secret: &str) -> Json {
    let script = "import os, sys\n\
        seen = [n for n in ('OPENAI_API_KEY', 'HOSTILE_ROUTE_KEY') if n in os.environ]\n\
        print('inherited:', seen, file=sys.stderr)\n\
        print('env key:', os.environ.get('OPENAI_API_KEY'), file=sys.stderr)\n\
        print('given:', sys.argv[1], sys.argv[1].upper(), file=sys.stderr)\n\
        sys.exit(1)\n";
    json!({"command": ["python3", "-c", script, secret],
           "descriptor": {"name": "t", "parameters": {"type": "object"}}})
}

/// Checks a run of [`leaking_tool`]: the tool failed, saw no provider variable, and no
/// 16-character run of any secret is in stdout or stderr.
#[track_caller]
fn assert_tool_leaked_nothing(out: &Capped, secrets: &[&str]) {
    assert!(
        out.stdout.contains("inherited: []"),
        "the tool inherited a provider variable (exit {:?}):\n{}\nstderr:\n{}",
        out.code,
        out.stdout,
        out.stderr
    );
    assert!(
        out.stdout.contains("failed with exit status 1"),
        "{}",
        out.stdout
    );
    for secret in secrets {
        assert_no_part_of(secret, &out.stdout, "stdout (--json)");
        assert_no_part_of(secret, &out.stderr, "stderr");
    }
}

/// A one-step agent that calls tool `t`.
fn tool_agent(dir: &Path) -> Json {
    write(
        dir,
        "agent.apl",
        "# pre: p\n{{ set_context('allowed_tools', ['t']) }}\n\n# prompt: p\n## user\ngo\n",
    );
    json!({"tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "t", "arguments": "{}"}}]})
}

#[test]
fn command_tools_get_no_provider_keys_and_their_errors_are_redacted() {
    let openai_key = long_key(60);
    // A second secret with no run in common with the first.
    let route_key: String = long_key(52).chars().rev().collect();
    let dir = scratch("tool-secrets-providers");
    let call = tool_agent(&dir);
    let providers = json!({"routes": [
        {"model": "unused", "kind": "openai", "base_url": closed_port(),
         "api_key_env": "HOSTILE_ROUTE_KEY"},
        {"model": "*", "kind": "mock", "responses": [call, "done"]},
    ]});
    let providers = write(&dir, "providers.json", providers.to_string());
    let tools = write(
        &dir,
        "tools.json",
        json!({"t": leaking_tool(&route_key)}).to_string(),
    );
    let out = run(
        &dir,
        &["--providers", &providers, "--tools", &tools, "--json"],
        &[
            ("OPENAI_API_KEY", &openai_key),
            ("HOSTILE_ROUTE_KEY", &route_key),
        ],
    );
    assert_tool_leaked_nothing(&out, &[&openai_key, &route_key]);
}

#[test]
fn command_tools_never_see_or_show_the_api_key_flag() {
    let flag_key = long_key(44);
    let env_key: String = long_key(58).chars().rev().collect();
    let dir = scratch("tool-secrets-flag");
    let call = tool_agent(&dir);
    let calls = Arc::new(Mutex::new(0));
    let server = Server::start(move |_, stream| {
        let mut calls = calls.lock().unwrap();
        *calls += 1;
        let body = if *calls == 1 {
            json!({"choices": [{"index": 0, "message": {"role": "assistant",
                   "content": null, "tool_calls": call["tool_calls"]},
                   "finish_reason": "tool_calls"}]})
            .to_string()
        } else {
            completion("done")
        };
        respond(stream, 200, &[], &body);
    });
    let tools = write(
        &dir,
        "tools.json",
        json!({"t": leaking_tool(&flag_key)}).to_string(),
    );
    let out = run(
        &dir,
        &[
            "--api-key",
            &flag_key,
            "--base-url",
            &server.url(),
            "--tools",
            &tools,
            "--json",
        ],
        &[("OPENAI_API_KEY", &env_key)],
    );
    assert_tool_leaked_nothing(&out, &[&flag_key, &env_key]);
}

//! `aplc serve` with MCP servers in its tool manifest (spec/mcp.md, "Hosts that live
//! long"; spec/serve.md): the binary on a free port of 127.0.0.1, a fake model that calls
//! the MCP tool, and `fixtures/mcp/counter_server.py` (PyPI `mcp`) as the server.
//!
//! The server is started through `sh`, which counts its starts in a file and refuses to
//! start while a `block` file exists: a test can tell that runs share one process, and
//! hold a restart back long enough to see the server down.
//!
//! Needs `APLC_MCP_PYTHON` (a Python with `mcp`; `.ci/run` makes the venv); fails without.

use aplc_test_support::http::read_request;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aplc_test_support::mcp::python;
use serde_json::{Value as Json, json};

const TOKEN: &str = "test-token-mcp-7c2e";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A fake OpenAI-compatible model: asks for `tool` until the request carries the tool's
/// result, then answers "done".
fn model(tool: &'static str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream);
                while let Some((_, body)) = read_request(&mut reader) {
                    let message = if body.contains("\"role\":\"tool\"") {
                        json!({"role": "assistant", "content": "done"})
                    } else {
                        let call = json!({"id": "c1", "type": "function",
                                          "function": {"name": tool, "arguments": "{}"}});
                        json!({"role": "assistant", "content": null, "tool_calls": [call]})
                    };
                    let answer = json!({
                        "id": "cmpl-1", "object": "chat.completion", "model": "fake",
                        "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    })
                    .to_string();
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
                        answer.len()
                    );
                    if reader.get_mut().write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

/// A scratch directory with the agent and the providers file.
fn scratch_dir(name: &str, model: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("serve-mcp")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("agents")).expect("scratch dir");
    std::fs::write(
        dir.join("agents/bump.apl"),
        "# prompt: go\nBump the counter.\n",
    )
    .unwrap();
    let providers = json!({"routes": [{"model": "*", "kind": "openai", "base_url": model}]});
    std::fs::write(dir.join("providers.json"), providers.to_string()).unwrap();
    dir
}

/// [`scratch_dir`] with the counter server in the tool manifest.
fn scratch(name: &str, model: &str) -> PathBuf {
    let dir = scratch_dir(name, model);
    let path = |file: &str| dir.join(file).to_string_lossy().into_owned();
    // `sh` counts the starts, refuses to start while `block` exists, then becomes the
    // server (`exec`: the pid it writes is the process aplc started).
    let script = "echo start >> \"$STARTS\"; test -e \"$BLOCK\" && exit 1; exec \"$0\" \"$@\"";
    let server = json!({
        "command": "sh",
        "args": ["-c", script, python(),
                 root().join("fixtures/mcp/counter_server.py").to_string_lossy()],
        "env": {"COUNTER_FILE": path("count"), "PID_FILE": path("pid"),
                "STARTS": path("starts"), "BLOCK": path("block")},
        "prefix": "c_",
        "tools": ["bump"],
        "startup_timeout_ms": 60000,
    });
    let manifest = json!({"mcpServers": {"counter": server}});
    std::fs::write(dir.join("tools.json"), manifest.to_string()).unwrap();
    dir
}

/// A running `aplc serve`, killed when dropped.
struct Server {
    child: Child,
    url: String,
    log: Arc<Mutex<String>>,
}

impl Server {
    fn start(dir: &Path) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_aplc"))
            .current_dir(dir)
            .args(["serve", "--agents", "agents", "--store", "sqlite:runs.db"])
            .args(["--listen", "127.0.0.1:0", "--providers", "providers.json"])
            .args(["--tools", "tools.json"])
            .env("APLC_SERVE_TOKENS", TOKEN)
            .env("RUST_LOG", "info")
            .env_remove("OPENAI_API_KEY")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn aplc serve");
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().expect("stderr");
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read the address");
        let Some(url) = line.trim().strip_prefix("listening on ") else {
            let status = child.wait().expect("wait");
            // The reader thread takes the rest of stderr once the process is gone.
            std::thread::sleep(Duration::from_millis(200));
            panic!(
                "aplc serve did not start ({status}): {}",
                log.lock().unwrap()
            );
        };
        Server {
            url: url.to_string(),
            child,
            log,
        }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// SIGTERM, then the exit code.
    fn terminate(mut self) -> Option<i32> {
        let pid = i32::try_from(self.child.id()).expect("pid");
        // SAFETY: `kill` with a child's pid and a signal number has no memory effects.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        self.child.wait().expect("wait").code()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

/// Runs the agent to its end; the final run (its `context` has `result_tool_calls`).
async fn run(server: &Server) -> Json {
    let response = http()
        .post(format!("{}/v1/agents/bump/runs?wait=true", server.url))
        .bearer_auth(TOKEN)
        .json(&json!({"context": {}}))
        .send()
        .await
        .expect("POST");
    let status = response.status().as_u16();
    let run: Json = response.json().await.expect("a JSON run");
    assert_eq!(status, 200, "{run}\nlog:\n{}", server.log());
    assert_eq!(run["status"], "completed", "{run}");
    run
}

/// The content of the run's one tool call, and whether it failed.
fn tool_result(run: &Json) -> (String, bool) {
    let call = &run["context"]["result_tool_calls"][0];
    let content = call["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no tool result in {run}"));
    (content.to_string(), call["with_error"] == json!(true))
}

async fn metrics(server: &Server) -> String {
    let response = http()
        .get(format!("{}/metrics", server.url))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("GET /metrics");
    response.text().await.expect("metrics text")
}

/// Waits (a minute at most) until `/metrics` has every line of `lines`.
async fn until_metrics(server: &Server, lines: &[&str]) -> String {
    let started = Instant::now();
    loop {
        let text = metrics(server).await;
        if lines.iter().all(|line| text.lines().any(|l| l == *line)) {
            return text;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{lines:?} not in /metrics:\n{text}\nlog:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (a minute at most) until the server's log has `text`.
async fn until_logged(server: &Server, text: &str) {
    let started = Instant::now();
    while !server.log().contains(text) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{text:?} is not in the log:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn lines(dir: &Path, file: &str) -> usize {
    std::fs::read_to_string(dir.join(file))
        .map(|text| text.lines().count())
        .unwrap_or(0)
}

fn pid(dir: &Path) -> i32 {
    let text = std::fs::read_to_string(dir.join("pid")).expect("the server's pid file");
    text.trim().parse().expect("a pid")
}

/// The process is gone (or a zombie waiting for an init that reaps late), within 10 s.
fn gone(pid: i32) -> bool {
    let stat = format!("/proc/{pid}/stat");
    let alive = || std::fs::read_to_string(&stat).is_ok_and(|s| !s.contains(") Z "));
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    !alive()
}

#[tokio::test]
async fn runs_share_one_server_that_is_restarted_when_it_dies() {
    let model = model("c_bump");
    let dir = scratch("share-restart", &model);
    let server = Server::start(&dir);
    until_metrics(
        &server,
        &[
            "aplc_mcp_server_up{server=\"counter\"} 1",
            "aplc_mcp_server_restarts_total{server=\"counter\"} 0",
        ],
    )
    .await;

    // Two runs, one server process: the side effects add up, and it started once.
    assert_eq!(tool_result(&run(&server).await), ("count=1".into(), false));
    assert_eq!(tool_result(&run(&server).await), ("count=2".into(), false));
    assert_eq!(lines(&dir, "starts"), 1, "the server started again");
    let first = pid(&dir);

    // It dies, and cannot start again while `block` exists: it shows as down, and a
    // call fails at once rather than waiting for it.
    std::fs::write(dir.join("block"), "").unwrap();
    // SAFETY: `kill` with a pid and a signal number has no memory effects.
    unsafe { libc::kill(first, libc::SIGKILL) };
    until_metrics(&server, &["aplc_mcp_server_up{server=\"counter\"} 0"]).await;
    let (message, failed) = tool_result(&run(&server).await);
    assert!(failed, "{message}");
    assert_eq!(
        message,
        "tool execution failed: `c_bump`: MCP server `counter` is restarting"
    );

    // Once it can (after a restart that failed), it comes back (a new process), and
    // calls work again.
    until_logged(&server, "MCP server did not restart").await;
    std::fs::remove_file(dir.join("block")).unwrap();
    let text = until_metrics(
        &server,
        &[
            "aplc_mcp_server_up{server=\"counter\"} 1",
            "aplc_mcp_server_restarts_total{server=\"counter\"} 1",
        ],
    )
    .await;
    assert!(text.contains("# TYPE aplc_mcp_server_up gauge"), "{text}");
    assert_eq!(tool_result(&run(&server).await), ("count=3".into(), false));
    let second = pid(&dir);
    assert_ne!(first, second);
    let starts = lines(&dir, "starts");
    assert!(starts >= 3, "{starts} starts; log:\n{}", server.log());
    let log = server.log();
    for line in [
        "MCP servers started",
        "MCP server exited",
        "MCP server did not restart",
        "MCP server restarted",
    ] {
        assert!(log.contains(line), "{line:?} is not in the log:\n{log}");
    }

    // SIGTERM: the server ends, and its MCP server with it.
    assert_eq!(server.terminate(), Some(0));
    assert!(gone(second), "the MCP server {second} outlived aplc serve");
}

#[test]
fn a_server_that_does_not_start_stops_aplc_serve_before_it_listens() {
    let model = model("c_bump");
    let dir = scratch("no-start", &model);
    std::fs::write(dir.join("block"), "").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_aplc"))
        .current_dir(&dir)
        .args(["serve", "--agents", "agents", "--store", "sqlite:runs.db"])
        .args(["--listen", "127.0.0.1:0", "--providers", "providers.json"])
        .args(["--tools", "tools.json"])
        .env("APLC_SERVE_TOKENS", TOKEN)
        .env_remove("OPENAI_API_KEY")
        .output()
        .expect("aplc serve runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(!stdout.contains("listening on"), "{stdout}");
    assert!(
        stderr.contains("MCP server `counter`: did not initialize"),
        "{stderr}"
    );
}

/// A server that lists `a`, or `b` once the file `SHIFT` names exists.
const SHIFTY: &str = r#"
import os
try:
    from mcp.server.mcpserver import MCPServer as Server
except ImportError:
    from mcp.server.fastmcp import FastMCP as Server
server = Server("shifty")
if os.path.exists(os.environ["SHIFT"]):
    @server.tool(structured_output=False)
    def b() -> str:
        return "b"
else:
    @server.tool(structured_output=False)
    def a() -> str:
        return "a"
with open(os.environ["PID_FILE"], "w") as f:
    f.write(str(os.getpid()))
server.run()
"#;

#[tokio::test]
async fn a_server_that_lists_other_tools_after_a_restart_keeps_the_first_offer() {
    let model = model("a");
    let dir = scratch_dir("tools-changed", &model);
    let path = |file: &str| dir.join(file).to_string_lossy().into_owned();
    let server = json!({"command": python(), "args": ["-c", SHIFTY],
                        "env": {"SHIFT": path("shift"), "PID_FILE": path("pid")},
                        "startup_timeout_ms": 60000});
    let manifest = json!({"mcpServers": {"shifty": server}});
    std::fs::write(dir.join("tools.json"), manifest.to_string()).unwrap();
    let server = Server::start(&dir);
    assert_eq!(tool_result(&run(&server).await), ("a".into(), false));

    std::fs::write(dir.join("shift"), "").unwrap();
    // SAFETY: `kill` with a pid and a signal number has no memory effects.
    unsafe { libc::kill(pid(&dir), libc::SIGKILL) };
    until_metrics(
        &server,
        &[
            "aplc_mcp_server_up{server=\"shifty\"} 1",
            "aplc_mcp_server_restarts_total{server=\"shifty\"} 1",
        ],
    )
    .await;
    until_logged(&server, "lists other tools since it restarted").await;
    // The runs are still offered `a` (not `b`); a call to it says why it fails.
    let (message, failed) = tool_result(&run(&server).await);
    assert!(failed, "{message}");
    assert!(
        message.ends_with("MCP server `shifty` no longer lists `a` since it restarted"),
        "{message}"
    );
    let second = pid(&dir);
    assert_eq!(server.terminate(), Some(0));
    assert!(gone(second), "the MCP server {second} outlived aplc serve");
}

/// SIGINT while a server starts ends `aplc serve` at once, and the server with it.
#[test]
fn sigint_while_a_server_starts_stops_it_and_the_server() {
    let model = model("c_bump");
    let dir = scratch_dir("sigint-start", &model);
    let pid_file = dir.join("pid").to_string_lossy().into_owned();
    // Never initializes: it only sleeps, as the process `sh` becomes.
    let server = json!({"command": "sh", "args": ["-c", "echo $$ > \"$PID_FILE\"; exec sleep 120"],
                        "env": {"PID_FILE": pid_file}, "startup_timeout_ms": 120000});
    let manifest = json!({"mcpServers": {"sleepy": server}});
    std::fs::write(dir.join("tools.json"), manifest.to_string()).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_aplc"))
        .current_dir(&dir)
        .args(["serve", "--agents", "agents", "--store", "sqlite:runs.db"])
        .args(["--listen", "127.0.0.1:0", "--providers", "providers.json"])
        .args(["--tools", "tools.json"])
        .env("APLC_SERVE_TOKENS", TOKEN)
        .env_remove("OPENAI_API_KEY")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn aplc serve");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read_to_string(dir.join("pid")).map_or(true, |p| p.trim().is_empty()) {
        assert!(Instant::now() < deadline, "the MCP server never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let sleepy = pid(&dir);
    let aplc = i32::try_from(child.id()).expect("pid");
    // SAFETY: `kill` with a child's pid and a signal number has no memory effects.
    unsafe { libc::kill(aplc, libc::SIGINT) };
    let output = child.wait_with_output().expect("wait");
    assert_eq!(output.status.code(), Some(0));
    assert!(!String::from_utf8_lossy(&output.stdout).contains("listening on"));
    assert!(gone(sleepy), "the MCP server {sleepy} outlived aplc serve");
}

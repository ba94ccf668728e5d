//! MCP servers for the tests of `spec/mcp.md`: the interpreters and binaries `.ci/run`
//! installs (found through variables; a test fails, never skips, without them), the
//! Python fixtures of `fixtures/mcp/` served over streamable HTTP, and the JSON of a
//! scripted provider's tool calls and of a run's results.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};

use crate::process::root;

/// The Python interpreter that has PyPI's `mcp` (`APLC_MCP_PYTHON`); panics (the test
/// fails) without it.
pub fn python() -> String {
    let python = required(
        "APLC_MCP_PYTHON",
        "a Python with the `mcp` package (python3 -m venv /tmp/mcpvenv && \
         /tmp/mcpvenv/bin/pip install mcp; APLC_MCP_PYTHON=/tmp/mcpvenv/bin/python)",
    );
    let check = Command::new(&python)
        .args(["-c", "import mcp"])
        .output()
        .unwrap_or_else(|e| panic!("APLC_MCP_PYTHON={python} does not run: {e}"));
    assert!(
        check.status.success(),
        "APLC_MCP_PYTHON={python} cannot import `mcp`: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    python
}

/// npm's `@modelcontextprotocol/server-everything` binary (`APLC_MCP_EVERYTHING`, which
/// `.ci/run` installs from `fixtures/mcp/package-lock.json`); panics without it.
pub fn everything() -> String {
    let binary = required(
        "APLC_MCP_EVERYTHING",
        "the path of `mcp-server-everything` (cd fixtures/mcp && npm ci; \
         APLC_MCP_EVERYTHING=$PWD/node_modules/.bin/mcp-server-everything)",
    );
    assert!(
        Path::new(&binary).is_file(),
        "APLC_MCP_EVERYTHING={binary} is not a file"
    );
    binary
}

fn required(variable: &str, what: &str) -> String {
    std::env::var(variable)
        .unwrap_or_else(|_| panic!("{variable} is not set: these tests need {what}"))
}

/// A file of `fixtures/mcp/`, as a string for a manifest.
pub fn fixture(name: &str) -> String {
    root()
        .join("fixtures/mcp")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// A Python fixture (`counter_server.py`, `paged_server.py`) serving streamable HTTP on
/// 127.0.0.1, behind a bearer token; killed when dropped.
pub struct HttpServer {
    child: Child,
    port: u16,
}

impl HttpServer {
    /// Starts `fixtures/mcp/{script} --http PORT` with `MCP_TOKEN=token` and `env`, and
    /// waits (up to a minute) until it accepts connections.
    pub fn start(script: &str, token: &str, env: &[(&str, &str)]) -> HttpServer {
        let port = free_port();
        let child = Command::new(python())
            .arg(fixture(script))
            .args(["--http", &port.to_string()])
            .env("MCP_TOKEN", token)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{script} does not start: {e}"));
        let mut server = HttpServer { child, port };
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect_timeout(&address, Duration::from_secs(1)).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("{script} exited at start: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "{script} never listened on {port}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    /// Its endpoint, `http://127.0.0.1:PORT/mcp`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// Whether its process has exited.
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port nobody listens on now (the kernel's choice, released for the server to take).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("its address").port()
}

/// A scripted provider's answers: one asking for these tool calls `(name, arguments)`,
/// then the default text answer.
pub fn calls(calls: &[(&str, Json)]) -> Json {
    let calls: Vec<Json> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, arguments))| {
            json!({"id": format!("call_{i}"), "type": "function",
                   "function": {"name": name, "arguments": arguments.to_string()}})
        })
        .collect();
    json!([{"content": null, "tool_calls": calls}])
}

/// The final context `aplc run --json` printed; the run must have gone to its end (exit
/// 0, or 3 when its last step ended with errors, as a failed tool call does).
pub fn context(out: &Output) -> Json {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        matches!(out.status.code(), Some(0 | 3)),
        "{:?}; stderr:\n{stderr}",
        out.status
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON context ({e}); stderr:\n{stderr}"))
}

/// `(content, with_error)` of each `result_tool_calls` entry of a context.
pub fn results(context: &Json) -> Vec<(Json, bool)> {
    context["result_tool_calls"]
        .as_array()
        .unwrap_or_else(|| panic!("no result_tool_calls in {context}"))
        .iter()
        .map(|r| (r["content"].clone(), r["with_error"] == json!(true)))
        .collect()
}

/// Whether a failed result's message contains `text`.
pub fn failed_with(result: &(Json, bool), text: &str) -> bool {
    result.1 && result.0.as_str().is_some_and(|m| m.contains(text))
}

/// `agent`, `mock` and `manifest` written to `dir` (`agent.apl`, `mock.json`,
/// `tools.json`), and `aplc run agent.apl --mock mock.json --tools tools.json --json`
/// with those paths, to run with [`crate::aplc!`] or [`crate::process::command`].
pub fn run_args(dir: &Path, agent: &str, mock: &Json, manifest: &Json) -> Vec<String> {
    let write = |name: &str, text: &str| -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {name}: {e}"));
        path
    };
    let agent = write("agent.apl", agent);
    let mock = write("mock.json", &mock.to_string());
    let tools = write("tools.json", &manifest.to_string());
    let p = |path: PathBuf| path.to_string_lossy().into_owned();
    vec![
        "run".into(),
        p(agent),
        "--mock".into(),
        p(mock),
        "--tools".into(),
        p(tools),
        "--json".into(),
    ]
}

/// `fixtures/mcp/counter_server.py`.
pub fn server_script() -> String {
    fixture("counter_server.py")
}

/// The counter server's manifest entry, counting its side effects in `dir/count` and
/// writing its pid to `dir/server.pid`, with the keys of `extra` on top.
pub fn counter(dir: &Path, extra: Json) -> Json {
    let mut server = json!({
        "command": python(),
        "args": [server_script()],
        "env": {
            "COUNTER_FILE": dir.join("count").to_string_lossy(),
            "PID_FILE": dir.join("server.pid").to_string_lossy(),
        },
        "startup_timeout_ms": 60000,
    });
    if let (Some(server), Json::Object(extra)) = (server.as_object_mut(), extra) {
        server.extend(extra);
    }
    server
}

/// How many side effects the server made.
pub fn count(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("count"))
        .map(|text| text.lines().count())
        .unwrap_or(0)
}

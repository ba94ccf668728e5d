//! What the MCP tests share (`tests/mcp.rs`, `tests/mcp_durable.rs`): the Python that runs the test
//! server, the server's manifest entry, its side-effect count, and a scripted answer that
//! asks for tool calls.
//!
//! The interpreter with PyPI's `mcp` installed is `APLC_MCP_PYTHON` (`.ci/run` makes a
//! venv and sets it). Without it the tests fail, never skip.

use std::path::Path;
use std::process::Command;

use serde_json::{Value as Json, json};

/// The Python interpreter that has the `mcp` package; panics (the test fails) without it.
pub fn python() -> String {
    let python = std::env::var("APLC_MCP_PYTHON").unwrap_or_else(|_| {
        panic!(
            "APLC_MCP_PYTHON is not set: these tests need a Python with the `mcp` package \
             (python3 -m venv /tmp/mcpvenv && /tmp/mcpvenv/bin/pip install mcp; \
             APLC_MCP_PYTHON=/tmp/mcpvenv/bin/python)"
        )
    });
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

/// `fixtures/mcp/counter_server.py`.
pub fn server_script() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/mcp/counter_server.py")
        .to_string_lossy()
        .into_owned()
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

/// One provider answer asking for these tool calls, `(name, arguments)`, with the ids
/// `call_0`, `call_1`, …
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

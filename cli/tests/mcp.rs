//! MCP tools (spec/mcp.md) through the `aplc` binary, against a real MCP server over
//! stdio: `fixtures/mcp/counter_server.py`, on the official Python SDK (PyPI `mcp`).
//!
//! The interpreter with `mcp` installed is `APLC_MCP_PYTHON` (`.ci/run` makes a venv and
//! sets it). Without it these tests fail, never skip:
//! `python3 -m venv /tmp/mcpvenv && /tmp/mcpvenv/bin/pip install mcp`, then
//! `APLC_MCP_PYTHON=/tmp/mcpvenv/bin/python cargo test -p aplc --test mcp`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value as Json, json};

use aplc_test_support::mcp::{calls, context, count, counter, python, results};

/// A scratch directory of its own for each test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("aplc-mcp-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `agent` with `--mock mock --tools manifest --json` in `dir`, with `env` set.
fn run(dir: &Path, agent: &str, mock: Json, manifest: Json, env: &[(&str, &str)]) -> Output {
    std::fs::write(dir.join("agent.apl"), agent).unwrap();
    std::fs::write(dir.join("mock.json"), mock.to_string()).unwrap();
    std::fs::write(dir.join("tools.json"), manifest.to_string()).unwrap();
    let p = |f: &str| dir.join(f).to_string_lossy().into_owned();
    let out = Command::new(env!("CARGO_BIN_EXE_aplc"))
        .args(["run", &p("agent.apl"), "--mock", &p("mock.json")])
        .args(["--tools", &p("tools.json"), "--json"])
        .env("NO_COLOR", "1")
        .envs(env.iter().copied())
        .output()
        .expect("aplc runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    out
}

const AGENT: &str = "# prompt: go\nUse the tools.\n";

#[test]
fn the_model_calls_mcp_tools_end_to_end() {
    let dir = scratch("e2e");
    let manifest = json!({"mcpServers": {"counter": counter(&dir, json!({"prefix": "c_"}))}});
    let mock = calls(&[
        ("c_add", json!({"a": 40, "b": 2})),
        ("c_greet", json!({"name": "Ada"})),
        ("c_fail", json!({"reason": "testing"})),
        ("c_bump", json!({})),
        ("c_add", json!({"a": "forty", "b": 2})),
        ("c_env", json!({"name": "OPENAI_API_KEY"})),
        ("c_env", json!({"name": "COUNTER_FILE"})),
        ("add", json!({"a": 1, "b": 2})),
    ]);
    let secret = "sk-mcp-test-0123456789abcdefghij";
    let out = run(&dir, AGENT, mock, manifest, &[("OPENAI_API_KEY", secret)]);
    let context = context(&out);
    let results = results(&context);
    assert_eq!(results.len(), 8, "{results:?}");
    // Structured content, as the server's JSON.
    assert_eq!(results[0], (json!({"sum": 42}), false));
    // Text content.
    assert_eq!(results[1], (json!("Hello, Ada!"), false));
    // `isError: true`: a failed call with the server's text.
    assert!(results[2].1, "{results:?}");
    assert!(
        results[2]
            .0
            .as_str()
            .is_some_and(|m| m.contains("failed on purpose: testing")),
        "{results:?}"
    );
    // A side effect, once.
    assert_eq!(results[3], (json!("count=1"), false));
    // The schema is the server's `inputSchema`: a violation is refused before the call.
    assert!(results[4].1, "{results:?}");
    assert!(
        results[4]
            .0
            .as_str()
            .is_some_and(|m| m.contains("`c_add`: invalid arguments")),
        "{results:?}"
    );
    // The server inherits aplc's environment minus every secret variable, plus its `env`.
    assert_eq!(results[5], (json!("unset"), false));
    assert_eq!(results[6], (json!("set"), false));
    // The model sees prefixed names only.
    assert!(
        results[7]
            .0
            .as_str()
            .is_some_and(|m| m.contains("no tool with this name")),
        "{results:?}"
    );
    assert_eq!(count(&dir), 1);
    // Offered like manifest tools: name, description, parameters from the server.
    let tools = context["tools"].as_array().cloned().unwrap_or_default();
    let add = tools
        .iter()
        .find(|t| t["function"]["name"] == json!("c_add"))
        .unwrap_or_else(|| panic!("no c_add in {tools:?}"));
    assert_eq!(add["function"]["description"], json!("Add two integers."));
    assert_eq!(
        add["function"]["parameters"]["required"],
        json!(["a", "b"]),
        "{add}"
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains(secret));
}

#[test]
#[cfg(target_os = "linux")]
fn no_server_outlives_aplc() {
    let dir = scratch("lifetime");
    let pid_file = dir.join("pid").to_string_lossy().into_owned();
    let mut server = counter(&dir, json!({}));
    server["env"]["PID_FILE"] = json!(pid_file);
    let manifest = json!({"mcpServers": {"counter": server}});
    let mock = calls(&[("add", json!({"a": 1, "b": 1}))]);
    let results = results(&context(&run(&dir, AGENT, mock, manifest, &[])));
    assert_eq!(results[0], (json!({"sum": 2}), false));
    let pid = std::fs::read_to_string(&pid_file).unwrap_or_else(|e| panic!("no pid: {e}"));
    let proc = format!("/proc/{}", pid.trim());
    // aplc has exited: its server is gone (or at most a zombie of an init that reaps late).
    let alive =
        || std::fs::read_to_string(format!("{proc}/stat")).is_ok_and(|stat| !stat.contains(") Z "));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while alive() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(!alive(), "the MCP server {pid} outlived aplc");
}

#[test]
fn allowed_tools_refuses_an_mcp_tool_before_the_call() {
    let dir = scratch("allowed");
    let manifest = json!({"mcpServers": {"counter": counter(&dir, json!({}))}});
    let agent = "# pre: go\n{{ set_context('allowed_tools', ['add']) }}\n# prompt: go\nGo.\n";
    let mock = calls(&[("bump", json!({})), ("add", json!({"a": 1, "b": 1}))]);
    let results = results(&context(&run(&dir, agent, mock, manifest, &[])));
    assert!(results[0].1, "{results:?}");
    assert!(
        results[0]
            .0
            .as_str()
            .is_some_and(|m| m.contains("allowed_tools")),
        "{results:?}"
    );
    assert_eq!(results[1], (json!({"sum": 2}), false));
    assert_eq!(count(&dir), 0, "the refused call reached the server");
}

#[test]
fn tools_filters_and_a_slow_call_times_out() {
    let dir = scratch("timeout");
    let server = counter(&dir, json!({"tools": ["sleep"], "timeout_ms": 500}));
    let manifest = json!({"mcpServers": {"counter": server}});
    let mock = calls(&[
        ("sleep", json!({"seconds": 30})),
        ("add", json!({"a": 1, "b": 1})),
    ]);
    let started = std::time::Instant::now();
    let results = results(&context(&run(&dir, AGENT, mock, manifest, &[])));
    assert!(started.elapsed() < std::time::Duration::from_secs(25));
    assert!(results[0].1, "{results:?}");
    assert!(
        results[0]
            .0
            .as_str()
            .is_some_and(|m| m.contains("timed out after 500 ms")),
        "{results:?}"
    );
    assert!(
        results[1]
            .0
            .as_str()
            .is_some_and(|m| m.contains("no tool with this name")),
        "{results:?}"
    );
}

#[test]
fn a_server_that_crashes_mid_call_fails_that_call_and_the_next_ones() {
    let dir = scratch("crash");
    let manifest = json!({"mcpServers": {"counter": counter(&dir, json!({"timeout_ms": 10000}))}});
    let mock = calls(&[
        ("add", json!({"a": 1, "b": 1})),
        ("crash", json!({})),
        ("add", json!({"a": 2, "b": 2})),
    ]);
    let started = std::time::Instant::now();
    let results = results(&context(&run(&dir, AGENT, mock, manifest, &[])));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(9),
        "a call waited for its timeout"
    );
    assert_eq!(results[0], (json!({"sum": 2}), false));
    for failed in &results[1..] {
        assert!(failed.1, "{results:?}");
        assert!(
            failed
                .0
                .as_str()
                .is_some_and(|m| m.contains("MCP server `counter`")),
            "{results:?}"
        );
    }
}

#[test]
fn two_tools_with_one_name_are_a_manifest_error_naming_both_servers() {
    let dir = scratch("duplicate");
    let manifest = json!({"mcpServers": {
        "one": counter(&dir, json!({"tools": ["add"]})),
        "two": counter(&dir, json!({"tools": ["add", "greet"]})),
    }});
    let out = run(&dir, AGENT, calls(&[]), manifest, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "two tools are named `add`: one from MCP server `one`, one from MCP server `two`"
        ),
        "{stderr}"
    );
}

#[test]
fn a_server_that_fails_to_start_is_an_error_naming_it() {
    let dir = scratch("broken");
    let manifest = json!({"mcpServers": {"broken": {
        "command": python(),
        "args": ["-c", "import sys; sys.stderr.write('no luck today'); sys.exit(3)"],
    }}});
    let out = run(&dir, AGENT, calls(&[]), manifest, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("MCP server `broken`"), "{stderr}");
    assert!(stderr.contains("no luck today"), "{stderr}");

    let manifest = json!({"mcpServers": {"missing": {"command": "/nonexistent/mcp-server"}}});
    let out = run(&dir, AGENT, calls(&[]), manifest, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("MCP server `missing`: cannot start"),
        "{stderr}"
    );

    let manifest = json!({"mcpServers": {"mute": {
        "command": python(), "args": ["-c", "import time; time.sleep(100)"],
        "startup_timeout_ms": 500,
    }}});
    let started = std::time::Instant::now();
    let out = run(&dir, AGENT, calls(&[]), manifest, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "MCP server `mute`: did not start, initialize and list its tools within 500 ms"
        ),
        "{stderr}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(20));

    let manifest = json!({"mcpServers": {"counter": counter(&dir, json!({"tools": ["nope"]}))}});
    let out = run(&dir, AGENT, calls(&[]), manifest, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr
            .contains("MCP server `counter`: `tools` names `nope`, which the server does not list"),
        "{stderr}"
    );

    let manifest = json!({"mcpServers": {"bad": {"command": "x", "timeout_ms": 0}}});
    let out = run(&dir, AGENT, calls(&[]), manifest, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("MCP server `bad`: `timeout_ms` must be at least 1"),
        "{stderr}"
    );
}

#[test]
#[cfg(target_os = "linux")]
fn sigint_while_a_server_starts_stops_aplc_and_the_server() {
    let dir = scratch("sigint");
    let pid_file = dir.join("pid");
    let script = format!(
        "import os, time; open({:?}, 'w').write(str(os.getpid())); time.sleep(100)",
        pid_file.to_string_lossy()
    );
    let manifest = json!({"mcpServers": {"slow": {
        "command": python(), "args": ["-c", script], "startup_timeout_ms": 60000,
    }}});
    std::fs::write(dir.join("agent.apl"), AGENT).unwrap();
    std::fs::write(dir.join("mock.json"), calls(&[]).to_string()).unwrap();
    std::fs::write(dir.join("tools.json"), manifest.to_string()).unwrap();
    let p = |f: &str| dir.join(f).to_string_lossy().into_owned();
    let aplc = Command::new(env!("CARGO_BIN_EXE_aplc"))
        .args(["run", &p("agent.apl"), "--mock", &p("mock.json")])
        .args(["--tools", &p("tools.json")])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("aplc starts");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let pid = loop {
        if let Ok(pid) = std::fs::read_to_string(&pid_file)
            && !pid.is_empty()
        {
            break pid;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the server never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let sent = Command::new("kill")
        .args(["-INT", &aplc.id().to_string()])
        .status();
    assert!(sent.is_ok_and(|s| s.success()));
    let out = aplc.wait_with_output().expect("aplc exits");
    assert_eq!(out.status.code(), Some(130), "{out:?}");
    let proc = format!("/proc/{}/stat", pid.trim());
    let alive = || std::fs::read_to_string(&proc).is_ok_and(|stat| !stat.contains(") Z "));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while alive() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(!alive(), "the MCP server {pid} outlived aplc");
}

/// An MCP server's tool with `approval` waits for a person before it runs
/// (`spec/human.md` §1.1): with nobody to ask and no store the run fails and the tool
/// never ran; with a store it pauses (exit 4) with the request committed.
#[test]
fn an_mcp_tool_that_needs_approval_waits_for_a_person() {
    let dir = scratch("approval");
    let server = counter(
        &dir,
        json!({"approval": ["bump"], "approval_timeout_ms": 60000}),
    );
    let manifest = json!({"mcpServers": {"counter": server}});
    let mock = calls(&[("add", json!({"a": 1, "b": 2})), ("bump", json!({}))]);
    let out = run(&dir, AGENT, mock.clone(), manifest.clone(), &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the run needs input (1-2 (approval"),
        "{stderr}"
    );
    assert_eq!(count(&dir), 0, "a tool waiting for approval never runs");

    let store = format!("sqlite:{}", dir.join("runs.db").display());
    let p = |f: &str| dir.join(f).to_string_lossy().into_owned();
    let out = Command::new(env!("CARGO_BIN_EXE_aplc"))
        .args(["run", &p("agent.apl"), "--mock", &p("mock.json")])
        .args(["--tools", &p("tools.json"), "--store", &store])
        .env("NO_COLOR", "1")
        .output()
        .expect("aplc runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(
        stderr.contains("waiting for input: 1-2 (approval: Approve a call of `bump`?)"),
        "{stderr}"
    );
    assert_eq!(count(&dir), 0);
}

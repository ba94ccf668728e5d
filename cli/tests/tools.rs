//! Native tools through the `aplc` binary: real subprocess tools (a Python script that
//! exists on a stock machine), HTTP tools against an in-process server, every failure
//! path, ordering, `allowed_tools`, `with_context` and idempotent reuse.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value as Json, json};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tools")
}

/// A scratch directory with a copy of the tool script.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("aplc-tools-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(fixtures().join("tool.py"), dir.join("tool.py")).unwrap();
    dir
}

fn aplc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aplc"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("aplc runs")
}

/// Writes an agent, its mock responses and a manifest into `dir`, runs it with `--json`,
/// and returns the exit code and the final context.
fn run_agent(dir: &Path, agent: &str, mock: Json, manifest: Json, extra: &[&str]) -> (i32, Json) {
    let (code, context, _) = run_agent_env(dir, agent, mock, manifest, extra, &[]);
    (code, context)
}

/// [`run_agent`] with more environment variables; also returns the whole output.
fn run_agent_env(
    dir: &Path,
    agent: &str,
    mock: Json,
    manifest: Json,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (i32, Json, Output) {
    std::fs::write(dir.join("agent.apl"), agent).unwrap();
    std::fs::write(dir.join("mock.json"), mock.to_string()).unwrap();
    std::fs::write(dir.join("tools.json"), manifest.to_string()).unwrap();
    let p = |f: &str| dir.join(f).to_string_lossy().into_owned();
    let (a, m, t) = (p("agent.apl"), p("mock.json"), p("tools.json"));
    let mut args = vec![
        "run",
        a.as_str(),
        "--mock",
        m.as_str(),
        "--tools",
        t.as_str(),
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = Command::new(env!("CARGO_BIN_EXE_aplc"))
        .args(&args)
        .env("NO_COLOR", "1")
        .envs(env.iter().copied())
        .output()
        .expect("aplc runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let context = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON context ({e}); stderr:\n{stderr}"));
    (out.status.code().unwrap_or(-1), context, out)
}

fn python_tool(mode: &str, descriptor: Json) -> Json {
    json!({"command": ["python3", "tool.py", mode], "cwd": ".", "timeout_ms": 10000, "descriptor": descriptor})
}

fn object_params(props: Json, required: &[&str]) -> Json {
    json!({"type": "object", "properties": props, "required": required})
}

/// An assistant message calling tools: (id, name, arguments-as-written).
fn calls(list: &[(&str, &str, &str)]) -> Json {
    let calls: Vec<Json> = list
        .iter()
        .map(|(id, name, args)| {
            json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
        })
        .collect();
    json!({"tool_calls": calls})
}

const ONE_STEP: &str = "# prompt: go\nUse your tools.\n";

#[test]
fn spec_5_calculator_through_the_cli() {
    let dir = fixtures();
    let p = |f: &str| dir.join(f).to_string_lossy().into_owned();
    let out = aplc(&[
        "run",
        &p("calc.apl"),
        "--mock",
        &p("calc.mock.json"),
        "--tools",
        &p("tools.json"),
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ctx: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        ctx["result_tool_calls"],
        json!([{"role": "tool", "tool_call_id": "call_abc123", "content": 42, "with_error": false}])
    );
    // describe_tools: only the allowed tool, in the Chat Completions format.
    assert_eq!(ctx["tools"].as_array().unwrap().len(), 1);
    assert_eq!(ctx["tools"][0]["type"], "function");
    assert_eq!(ctx["tools"][0]["function"]["name"], "calc");
}

#[test]
fn tool_loop_feeds_results_back_and_reuses_idempotent_results() {
    let dir = fixtures();
    let p = |f: &str| dir.join(f).to_string_lossy().into_owned();
    let out = aplc(&[
        "run",
        &p("weather_loop.apl"),
        "--mock",
        &p("weather_loop.mock.json"),
        "--tools",
        &p("tools.json"),
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ctx: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(ctx["result_text"], "Paris is 21 °C and Oslo is 4 °C.");
    assert_eq!(ctx["global_runs"], 3);
    let transcript = ctx["transcript"].as_array().unwrap();
    let ids: Vec<&str> = transcript
        .iter()
        .map(|c| c["tool_call_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["w1", "w2", "w3", "w4"]);
    assert_eq!(transcript[1]["with_error"], true);
    assert_eq!(transcript[2]["reused"], true, "Paris was looked up before");
    assert!(transcript[0].get("reused").is_none());
    let last_prompt = &ctx["prompts"].as_array().unwrap().last().unwrap()["content"];
    assert!(
        last_prompt
            .as_str()
            .unwrap()
            .contains("w4: {'city': 'oslo', 'celsius': 4}")
    );
}

#[test]
fn every_failure_path_records_a_failed_result_and_the_run_continues() {
    let dir = scratch("failures");
    let touch = || {
        python_tool(
            "touch",
            json!({"name": "touch", "parameters": object_params(json!({"path": {"type": "string"}}), &["path"])}),
        )
    };
    let manifest = json!({
        "touch": touch(),
        "fail": python_tool("fail", json!({"name": "fail"})),
        "text": python_tool("text", json!({"name": "text"})),
        "ghost": {"command": ["/nonexistent/aplc-tool"], "descriptor": {"name": "ghost"}},
    });
    let response = calls(&[
        ("c1", "nope", "{}"),
        ("c2", "touch", "{not json"),
        ("c3", "touch", "[1, 2]"),
        ("c4", "touch", "{\"path\": 7}"),
        ("c5", "fail", "{}"),
        ("c6", "text", "{}"),
        ("c7", "ghost", "{}"),
        ("c8", "touch", "{\"path\": \"made.txt\"}"),
    ]);
    let agent =
        "# prompt: go\nUse your tools.\n# post: go\n{{ set_context('seen', errors | length) }}\n";
    let (code, ctx) = run_agent(&dir, agent, json!([response]), manifest, &[]);
    assert_eq!(code, 3, "the step ended with errors, but the run completed");
    let results = ctx["result_tool_calls"].as_array().unwrap();
    let ids: Vec<&str> = results
        .iter()
        .map(|r| r["tool_call_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        ["c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8"],
        "one result per call, in order"
    );
    let content = |i: usize| {
        results[i]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    for (i, needle) in [
        (0, "no tool with this name is registered"),
        (1, "not valid JSON"),
        (2, "must be a JSON object"),
        (3, "invalid arguments"),
        (4, "exit status 3: the tool broke on purpose"),
        (6, "cannot start `/nonexistent/aplc-tool`"),
    ] {
        assert_eq!(results[i]["with_error"], true, "call {i}");
        assert!(content(i).contains(needle), "call {i}: {}", content(i));
        assert!(
            content(i).starts_with("tool execution failed: `"),
            "call {i}"
        );
    }
    assert_eq!(results[5]["with_error"], false);
    assert_eq!(results[5]["content"], "plain words, not JSON");
    assert_eq!(results[7]["content"], json!({"touched": "made.txt"}));
    // The post phase saw every failure in `errors`.
    assert_eq!(ctx["seen"], 6);
    assert_eq!(
        ctx["context_history"][0]["errors"]
            .as_array()
            .unwrap()
            .len(),
        6
    );
    // Invalid calls never executed the tool; the valid one did.
    assert!(dir.join("made.txt").exists());
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        5,
        "agent, mock, manifest, tool.py, made.txt"
    );
}

#[test]
fn allowed_tools_is_a_security_boundary() {
    let dir = scratch("allowed");
    let manifest = json!({
        "touch": python_tool(
            "touch",
            json!({"name": "touch", "parameters": object_params(json!({"path": {"type": "string"}}), &["path"])}),
        ),
        "text": python_tool("text", json!({"name": "text"})),
    });
    let agent = "# pre: go\n{{ set_context('allowed_tools', ['text']) }}\n# prompt: go\nGo.\n";
    let response = calls(&[
        ("c1", "touch", "{\"path\": \"forbidden.txt\"}"),
        ("c2", "text", "{}"),
    ]);
    let (code, ctx) = run_agent(&dir, agent, json!([response]), manifest.clone(), &[]);
    assert_eq!(code, 3);
    assert!(
        !dir.join("forbidden.txt").exists(),
        "a disallowed tool must not run"
    );
    let results = &ctx["result_tool_calls"];
    assert!(
        results[0]["content"]
            .as_str()
            .unwrap()
            .contains("allowed_tools")
    );
    assert_eq!(results[1]["with_error"], false);
    assert_eq!(
        ctx["tools"].as_array().unwrap().len(),
        1,
        "only `text` is described"
    );

    // Not a list: nothing is allowed.
    let agent = "# pre: go\n{{ set_context('allowed_tools', 'touch') }}\n# prompt: go\nGo.\n";
    let response = calls(&[("c1", "touch", "{\"path\": \"forbidden.txt\"}")]);
    let (_, ctx) = run_agent(&dir, agent, json!([response]), manifest.clone(), &[]);
    assert!(!dir.join("forbidden.txt").exists());
    assert!(
        ctx["result_tool_calls"][0]["content"]
            .as_str()
            .unwrap()
            .contains("must be a list")
    );

    // Allowed (empty list = all): it runs.
    let response = calls(&[("c1", "touch", "{\"path\": \"allowed.txt\"}")]);
    let (code, _) = run_agent(&dir, ONE_STEP, json!([response]), manifest, &[]);
    assert_eq!(code, 0);
    assert!(dir.join("allowed.txt").exists());
}

#[test]
fn with_context_passes_the_variables_and_no_secrets() {
    let dir = scratch("context");
    let mut with = python_tool("context", json!({"name": "ctx"}));
    with["with_context"] = json!(true);
    let manifest = json!({"ctx": with, "plain": python_tool("context", json!({"name": "plain"}))});
    let agent = "# pre: go\n{{ set_context('model', 'test-model') }}\n# prompt: go\nGo.\n";
    let response = calls(&[("a", "ctx", "{}"), ("b", "plain", "{}")]);
    let (_, ctx) = run_agent(
        &dir,
        agent,
        json!([response]),
        manifest,
        &["--api-key", "sk-secret"],
    );
    let results = &ctx["result_tool_calls"];
    assert_eq!(results[0]["content"]["has_context"], true);
    assert_eq!(results[0]["content"]["model"], "test-model");
    assert_eq!(results[0]["content"]["keys_without_secrets"], json!([]));
    assert_eq!(results[1]["content"]["has_context"], false);
}

#[test]
fn idempotent_results_are_reused_not_re_executed_and_failures_are_not_cached() {
    let dir = scratch("idempotent");
    let params = object_params(
        json!({"key": {"type": "string"}, "noise": {"type": "integer"}}),
        &["key"],
    );
    let mut by_key = python_tool(
        "count",
        json!({"name": "by_key", "parameters": params.clone()}),
    );
    by_key["idempotent"] = json!({"key": ["key"]});
    let mut auto = python_tool("count", json!({"name": "auto", "parameters": params}));
    auto["idempotent"] = json!({"key": "auto", "ttl_ms": 600000});
    let mut flaky = python_tool("fail", json!({"name": "flaky"}));
    flaky["idempotent"] = json!({"key": "auto"});
    let manifest = json!({"by_key": by_key, "auto": auto, "flaky": flaky});
    let response = calls(&[
        ("1", "by_key", "{\"key\": \"a\", \"noise\": 1}"),
        ("2", "by_key", "{\"noise\": 2, \"key\": \"a\"}"),
        ("3", "auto", "{\"key\": \"a\", \"noise\": 1}"),
        ("4", "auto", "{\"noise\": 1, \"key\": \"a\"}"),
        ("5", "auto", "{\"key\": \"a\", \"noise\": 2}"),
        ("6", "flaky", "{}"),
        ("7", "flaky", "{}"),
    ]);
    let (_, ctx) = run_agent(&dir, ONE_STEP, json!([response]), manifest, &[]);
    let reused: Vec<bool> = ctx["result_tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.get("reused") == Some(&json!(true)))
        .collect();
    assert_eq!(reused, [false, true, false, true, false, false, false]);
    let executions = std::fs::read_to_string(dir.join("count.log"))
        .unwrap()
        .lines()
        .count();
    assert_eq!(
        executions, 3,
        "calls 1, 3 and 5 executed; 2 and 4 were reused"
    );
    assert_eq!(
        ctx["context_history"][0]["errors"]
            .as_array()
            .unwrap()
            .len(),
        2,
        "both flaky calls ran"
    );
}

#[test]
fn slow_tools_are_killed_at_their_timeout() {
    let dir = scratch("slow");
    let mut slow = python_tool("slow", json!({"name": "slow"}));
    slow["timeout_ms"] = json!(300);
    let started = std::time::Instant::now();
    let (code, ctx) = run_agent(
        &dir,
        ONE_STEP,
        json!([calls(&[("s", "slow", "{}")])]),
        json!({"slow": slow}),
        &[],
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(8),
        "the tool was not killed"
    );
    assert_eq!(code, 3);
    assert!(
        ctx["result_tool_calls"][0]["content"]
            .as_str()
            .unwrap()
            .contains("timed out after 300 ms")
    );
}

/// Issue #22 F13: a tool that prints its result and exits while a background child keeps
/// its stdout open returns that result when it exits (not at its timeout), and the child
/// is killed with the tool's process group.
#[test]
fn a_tool_that_leaves_a_background_child_returns_its_result_and_the_child_dies() {
    let dir = scratch("background");
    let tool = json!({
        "command": ["sh", "-c", "(sleep 303 & echo $! > sleep.pid) ; echo '\"started\"'"],
        "cwd": ".",
        "timeout_ms": 20000,
        "descriptor": {"name": "starter"},
    });
    let (code, ctx) = run_agent(
        &dir,
        ONE_STEP,
        json!([calls(&[("s", "starter", "{}")])]),
        json!({"starter": tool}),
        &[],
    );
    assert_eq!(
        ctx["result_tool_calls"][0],
        json!({"role": "tool", "tool_call_id": "s", "content": "started", "with_error": false}),
        "{ctx}"
    );
    assert_eq!(code, 0);
    let pid: i32 = std::fs::read_to_string(dir.join("sleep.pid"))
        .expect("the tool wrote the background pid")
        .trim()
        .parse()
        .expect("a pid");
    // SIGKILL takes effect at once, but the process may take a moment to go on a loaded
    // machine: wait for it, boundedly.
    let started = std::time::Instant::now();
    while alive(pid) {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "the background `sleep 303` (pid {pid}) outlived the tool call"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// True while process `pid` runs. A zombie has ended: where PID 1 does not reap orphans
/// (some containers), `kill(pid, 0)` still finds it, so its state is read too.
fn alive(pid: i32) -> bool {
    // SAFETY: `kill` with signal 0 only checks that the process exists.
    let exists = unsafe { libc::kill(pid, 0) } == 0;
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .next()?
                .to_owned();
            Some(state == "Z" || state == "X")
        })
        .unwrap_or(false);
    exists && !zombie
}

/// Issue #22 R2: command tools inherit none of the variables aplc treats as secret (the
/// store URL, OTLP headers, serve tokens, provider keys), and a secret value a tool
/// prints anyway (read from a file here) is redacted from the result, `--json`, the
/// events and the journal.
#[test]
fn command_tools_never_see_or_show_the_store_otlp_or_token_secrets() {
    let dir = scratch("secrets");
    const PASSWORD: &str = "hunter2hunter2";
    const OTLP: &str = "sekrit-otlp-token-31337";
    const SERVE: &str = "serve-token-0a1b2c3d";
    const ANTHROPIC: &str = "sk-ant-from-env-998877";
    let store_url = format!("postgres://u:{PASSWORD}@127.0.0.1/x");
    let otlp = format!("authorization=Bearer {OTLP}");
    let env = [
        ("APLC_STORE", store_url.as_str()),
        ("OTEL_EXPORTER_OTLP_HEADERS", otlp.as_str()),
        ("APLC_SERVE_TOKENS", SERVE),
        ("ANTHROPIC_API_KEY", ANTHROPIC),
    ];
    // The tool prints its whole environment, then the secrets it finds in a file.
    std::fs::write(
        dir.join("leak.txt"),
        format!("{PASSWORD} {OTLP} {SERVE} {ANTHROPIC}"),
    )
    .unwrap();
    let tool = json!({
        "command": ["sh", "-c", "env; cat leak.txt"],
        "cwd": ".",
        "descriptor": {"name": "envdump"},
    });
    let events = dir.join("events.jsonl").to_string_lossy().into_owned();
    let store = format!("sqlite:{}", dir.join("runs.db").display());
    let (code, ctx, out) = run_agent_env(
        &dir,
        ONE_STEP,
        json!([calls(&[("e", "envdump", "{}")])]),
        json!({"envdump": tool}),
        &["--events", &events, "--store", &store],
        &env,
    );
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    let content = ctx["result_tool_calls"][0]["content"]
        .as_str()
        .expect("the tool's output")
        .to_string();
    for (name, _) in env {
        assert!(
            !content.contains(&format!("{name}=")),
            "{name} reached the tool: {content}"
        );
    }
    assert!(
        content.contains("PATH="),
        "the tool has an environment: {content}"
    );
    // What the tool printed of the file is redacted (a space next to a secret may go
    // with it: `Bearer <token>`'s windows hold the space).
    assert!(content.contains("<redacted>"), "{content}");
    let mut journal = std::fs::read(dir.join("runs.db")).expect("the journal");
    journal.extend(std::fs::read(dir.join("runs.db-wal")).unwrap_or_default());
    let texts = [
        ("stdout", String::from_utf8_lossy(&out.stdout).into_owned()),
        ("stderr", String::from_utf8_lossy(&out.stderr).into_owned()),
        ("events", std::fs::read_to_string(&events).expect("events")),
        ("journal", String::from_utf8_lossy(&journal).into_owned()),
    ];
    for (what, text) in texts {
        for secret in [PASSWORD, OTLP, SERVE, ANTHROPIC] {
            assert!(!text.contains(secret), "{secret} is in the {what}");
        }
    }
}

#[test]
fn tool_output_is_capped() {
    let dir = scratch("flood");
    let flood = python_tool("flood", json!({"name": "flood"}));
    let (code, ctx) = run_agent(
        &dir,
        ONE_STEP,
        json!([calls(&[("f", "flood", "{}")])]),
        json!({"flood": flood}),
        &[],
    );
    assert_eq!(code, 3);
    let content = ctx["result_tool_calls"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(content.contains("more than 1048576 bytes"), "{content}");
}

#[test]
fn the_run_deadline_stops_a_tool() {
    let dir = scratch("deadline");
    let slow = python_tool("slow", json!({"name": "slow"}));
    let (code, ctx) = run_agent(
        &dir,
        ONE_STEP,
        json!([calls(&[("s", "slow", "{}")])]),
        json!({"slow": slow}),
        &["--timeout", "400"],
    );
    assert_eq!(code, 1, "the run timed out");
    assert!(ctx["context_history"].as_array().unwrap().is_empty());
}

#[test]
fn manifest_errors_are_usage_errors() {
    let dir = scratch("manifest");
    for (manifest, needle) in [
        (
            json!({"t": {"descriptor": {"name": "t"}}}),
            "exactly one of `command` or `url`",
        ),
        (
            json!({"t": {"command": ["x"], "url": "http://x", "descriptor": {}}}),
            "exactly one",
        ),
        (
            json!({"t": {"command": ["x"], "descriptor": {}, "colour": 1}}),
            "unknown field `colour`",
        ),
        (
            json!({"t": {"command": ["x"], "descriptor": {"name": "u"}}}),
            "manifest key is `t`",
        ),
        (
            json!({"t": {"command": [], "descriptor": {}}}),
            "must start with a program",
        ),
        (
            json!({"t": {"command": ["x"], "descriptor": {"parameters": {"type": 5}}}}),
            "invalid `parameters` schema",
        ),
        (
            json!({"t": {"command": ["x"], "descriptor": {}, "idempotent": {"key": "always"}}}),
            "\"auto\"",
        ),
        (
            json!({"t": {"url": "ftp://x", "descriptor": {}}}),
            "http or https",
        ),
        (json!([1]), "invalid tool manifest"),
    ] {
        std::fs::write(dir.join("agent.apl"), ONE_STEP).unwrap();
        std::fs::write(dir.join("mock.json"), "[\"hi\"]").unwrap();
        std::fs::write(dir.join("tools.json"), manifest.to_string()).unwrap();
        let p = |f: &str| dir.join(f).to_string_lossy().into_owned();
        let out = aplc(&[
            "run",
            &p("agent.apl"),
            "--mock",
            &p("mock.json"),
            "--tools",
            &p("tools.json"),
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{manifest}: {stderr}");
        assert!(
            stderr.contains(needle),
            "{manifest}: expected `{needle}` in {stderr}"
        );
    }
}

/// A one-request-at-a-time HTTP server on 127.0.0.1 answering with `responder`. Stops
/// after `requests` requests. Returns the base URL.
fn http_server(requests: usize, responder: fn(&Json) -> Option<(u16, String)>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(requests) {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut length = 0;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            let request: Json = serde_json::from_slice(&body).unwrap_or(Json::Null);
            match responder(&request) {
                Some((status, body)) => {
                    let _ = write!(
                        stream,
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                }
                // Never answer: hold the connection until the client gives up.
                None => std::thread::sleep(std::time::Duration::from_secs(5)),
            }
        }
    });
    format!("http://{addr}")
}

#[test]
fn http_tools() {
    let ok = http_server(1, |req| {
        let n = req["arguments"]["n"].as_i64()?;
        let model = req["context"]["model"].clone();
        Some((200, json!({"double": n * 2, "model": model}).to_string()))
    });
    let broken = http_server(1, |_| Some((503, "{\"error\": \"overloaded\"}".into())));
    let silent = http_server(1, |_| None);
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        drop(l);
        format!("http://{a}")
    };
    let tool = |url: &str, name: &str| json!({"url": url, "timeout_ms": 500, "with_context": true, "descriptor": {"name": name}});
    let manifest = json!({
        "ok": tool(&format!("{ok}/double"), "ok"),
        "broken": tool(&broken, "broken"),
        "silent": tool(&silent, "silent"),
        "closed": tool(&closed, "closed"),
    });
    let response = calls(&[
        ("1", "ok", "{\"n\": 21}"),
        ("2", "broken", "{}"),
        ("3", "silent", "{}"),
        ("4", "closed", "{}"),
    ]);
    let dir = scratch("http");
    let (code, ctx) = run_agent(&dir, ONE_STEP, json!([response]), manifest, &[]);
    assert_eq!(code, 3);
    let r = &ctx["result_tool_calls"];
    assert_eq!(r[0]["content"], json!({"double": 42, "model": "gpt-4o"}));
    assert_eq!(r[0]["with_error"], false);
    let content = |i: usize| r[i]["content"].as_str().unwrap().to_string();
    assert!(
        content(1).contains("503") && content(1).contains("overloaded"),
        "{}",
        content(1)
    );
    assert!(content(2).contains("timed out"), "{}", content(2));
    // The cause is kept (issue #9, F19).
    assert!(
        content(3).contains("could not connect") && content(3).contains("Connection refused"),
        "{}",
        content(3)
    );
}

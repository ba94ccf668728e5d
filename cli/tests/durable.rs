//! Durable runs end to end (issue #12 §5): `aplc run --store` against a fake
//! OpenAI-compatible server on 127.0.0.1 that answers slowly, SIGKILLed while a call is in
//! flight, then `aplc resume`d. For SQLite and for a throwaway PostgreSQL cluster.

use aplc_test_support::http::read_request;
use aplc_test_support::pg;
use aplc_test_support::process::{final_context, kill9, root, strip_times, succeed, wait_for};
use aplc_test_support::{aplc, scratch_in};

use std::io::{BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value as Json, json};

/// What a test waits for at most (60 s).
const WAIT: Duration = Duration::from_secs(60);

const TURNS: u64 = 6;

// ---------------------------------------------------------------------------------------
// A fake model: a thread per connection on 127.0.0.1.

/// Answers every chat completion after `delay_ms` with a call of the `count` tool for the
/// turn the request's last user message names, and "turn N" as text: the same request
/// always gets the same answer. Records every request body.
struct Model {
    url: String,
    bodies: Arc<Mutex<Vec<String>>>,
    delay_ms: Arc<AtomicU64>,
}

impl Model {
    fn start(ledger: &Path) -> Model {
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let (log, delay) = (bodies.clone(), delay_ms.clone());
        let ledger = ledger.display().to_string();
        let url = serve_http(move |_, body| {
            log.lock().unwrap().push(body.to_owned());
            std::thread::sleep(Duration::from_millis(delay.load(Ordering::SeqCst)));
            (200, answer(body, &ledger))
        });
        Model {
            url,
            bodies,
            delay_ms,
        }
    }

    fn bodies(&self) -> Vec<String> {
        self.bodies.lock().unwrap().clone()
    }

    fn clear(&self) {
        self.bodies.lock().unwrap().clear();
    }

    fn delay(&self, ms: u64) {
        self.delay_ms.store(ms, Ordering::SeqCst);
    }
}

/// Serves HTTP/1.1 on 127.0.0.1, a thread per connection, answering every request with
/// `respond(head, body)`: a status and a JSON body. Returns the base URL.
fn serve_http(respond: impl Fn(&str, &str) -> (u16, Json) + Send + Sync + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let respond = Arc::new(respond);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let respond = respond.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream);
                while let Some((head, body)) = read_request(&mut reader) {
                    let (status, answer) = respond(&head, &body);
                    let reason = if status == 200 { "OK" } else { "Error" };
                    let answer = answer.to_string();
                    let reply = format!(
                        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
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

fn answer(body: &str, ledger: &str) -> Json {
    let request: Json = serde_json::from_str(body).unwrap_or(Json::Null);
    let turn = request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_str())
        .filter_map(|text| text.trim().strip_prefix("Turn "))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter_map(|n| n.parse::<u64>().ok())
        .next_back()
        .unwrap_or(0);
    let arguments = json!({"key": format!("t{turn}"), "ledger": ledger}).to_string();
    json!({
        "id": format!("cmpl-{turn}"),
        "object": "chat.completion",
        "model": "fake",
        "choices": [{
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": format!("turn {turn}"),
                "tool_calls": [{
                    "id": format!("call-{turn}"),
                    "type": "function",
                    "function": {"name": "count", "arguments": arguments},
                }],
            },
        }],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
    })
}

// ---------------------------------------------------------------------------------------
// The agent, its tools and the aplc binary.

/// A scratch directory for one test, emptied first.
fn scratch(name: &str) -> PathBuf {
    scratch_in!("durable", name)
}

/// Writes the tool manifest (`count` or `count_slow`, never idempotent) and the context.
fn setup(dir: &Path, mode: &str) {
    let tool = root().join("fixtures/tools/tool.py");
    let manifest = json!({
        "count": {
            "command": ["python3", tool, mode],
            "timeout_ms": 20_000,
            "descriptor": {
                "description": "Count a turn",
                "parameters": {
                    "type": "object",
                    "properties": {"key": {"type": "string"}, "ledger": {"type": "string"}},
                    "required": ["key", "ledger"],
                },
            },
        }
    });
    std::fs::write(dir.join("tools.json"), manifest.to_string()).unwrap();
    std::fs::write(
        dir.join("context.json"),
        json!({"turns": TURNS}).to_string(),
    )
    .unwrap();
}

fn agent() -> String {
    root()
        .join("fixtures/durable/crash_loop.apl")
        .display()
        .to_string()
}

/// `aplc run` of the agent, with `extra` flags (a store, a run id).
fn run_command(dir: &Path, model: &Model, extra: &[&str]) -> Command {
    let agent = agent();
    let mut args = vec![
        "run",
        agent.as_str(),
        "--json",
        "--quiet",
        "--context",
        "context.json",
        "--tools",
        "tools.json",
        "--base-url",
        &model.url,
    ];
    args.extend_from_slice(extra);
    aplc!(dir, &args)
}

fn resume_command(dir: &Path, model: &Model, store: &str, id: &str) -> Command {
    aplc!(
        dir,
        &[
            "resume",
            id,
            "--store",
            store,
            "--json",
            "--quiet",
            "--tools",
            "tools.json",
            "--base-url",
            &model.url,
        ],
    )
}

fn ledger_lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|text| text.lines().count())
        .unwrap_or(0)
}

/// The uninterrupted run: its final context and the requests it made.
fn baseline(dir: &Path, model: &Model, ledger: &Path) -> (Json, Vec<String>) {
    model.clear();
    let output = succeed(&mut run_command(dir, model, &[]));
    assert_eq!(
        ledger_lines(ledger),
        TURNS as usize,
        "one tool run per turn"
    );
    std::fs::remove_file(ledger).unwrap();
    (final_context(&output), model.bodies())
}

// ---------------------------------------------------------------------------------------
// The scenarios, for any store.

/// Kill during a provider call in the middle of the loop, then resume: the same final
/// context as an uninterrupted run; every journaled request sent exactly once (only the
/// call in flight is sent twice); the non-idempotent tool ran once per call.
fn crash_during_provider_call(name: &str, store: &str) {
    let dir = scratch(name);
    setup(&dir, "count");
    let ledger = dir.join("ledger.log");
    let model = Model::start(&ledger);
    let (expected, expected_requests) = baseline(&dir, &model, &ledger);
    assert_eq!(expected_requests.len(), TURNS as usize);

    model.clear();
    model.delay(400);
    let child = run_command(
        &dir,
        &model,
        &["--store", store, "--run-id", "crash-provider"],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("spawn aplc");
    // The third request is being answered, slowly: kill aplc while it waits.
    wait_for("the third request", WAIT, || model.bodies().len() >= 3);
    kill9(child);
    assert_eq!(
        ledger_lines(&ledger),
        2,
        "two turns' tools ran before the kill"
    );

    model.delay(0);
    let output = succeed(&mut resume_command(&dir, &model, store, "crash-provider"));
    assert_eq!(
        final_context(&output),
        expected,
        "the resumed run ends as the uninterrupted one"
    );
    assert_eq!(
        ledger_lines(&ledger),
        TURNS as usize,
        "each tool call ran exactly once"
    );

    let sent = model.bodies();
    let mut distinct = sent.clone();
    distinct.sort();
    distinct.dedup();
    let mut expected_distinct = expected_requests.clone();
    expected_distinct.sort();
    assert_eq!(
        distinct, expected_distinct,
        "the same requests as the uninterrupted run"
    );
    assert_eq!(
        sent.len(),
        TURNS as usize + 1,
        "only the call in flight at the kill is sent again"
    );
    assert_eq!(sent[2], sent[3], "the call in flight is the one sent again");

    // The store has it, finished.
    let show = succeed(&mut aplc!(
        &dir,
        &["runs", "show", "crash-provider", "--store", store],
    ));
    let show = String::from_utf8_lossy(&show.stdout);
    assert!(show.contains("status:   completed"), "{show}");
    assert!(show.contains(&format!("steps:    {TURNS}")), "{show}");
    let list = succeed(&mut aplc!(&dir, &["runs", "list", "--store", store]));
    let list = String::from_utf8_lossy(&list.stdout);
    let row = list
        .lines()
        .find(|line| line.starts_with("crash-provider "))
        .unwrap_or_else(|| panic!("the run is listed:\n{list}"));
    assert!(
        row.contains("crash_loop.apl") && row.contains("completed"),
        "{row}"
    );
    let events = succeed(&mut aplc!(
        &dir,
        &["runs", "events", "crash-provider", "--store", store],
    ));
    let events: Vec<Json> = String::from_utf8_lossy(&events.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("JSON Lines"))
        .collect();
    for (i, event) in events.iter().enumerate() {
        assert_eq!(
            event["seq"],
            json!(i),
            "events numbered without gaps or repeats"
        );
    }
    assert_eq!(events.first().unwrap()["type"], "run_started");
    assert_eq!(events.last().unwrap()["type"], "run_finished");
    let mut again = resume_command(&dir, &model, store, "crash-provider");
    let output = again.output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("already finished"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Kill while the non-idempotent tool runs: the resume does not run it again, the call
/// resolves as failed with the interruption, and the run goes on to the end.
fn crash_during_tool_call(name: &str, store: &str) {
    let dir = scratch(name);
    setup(&dir, "count_slow");
    let ledger = dir.join("ledger.log");
    let model = Model::start(&ledger);
    let child = run_command(&dir, &model, &["--store", store, "--run-id", "crash-tool"])
        .env("APLC_TEST_TOOL_SLEEP", "2")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn aplc");
    // The third turn's tool has started (its line is written) and sleeps.
    wait_for("the third tool run", WAIT, || ledger_lines(&ledger) >= 3);
    kill9(child);

    let output =
        succeed(resume_command(&dir, &model, store, "crash-tool").env("APLC_TEST_TOOL_SLEEP", "0"));
    assert_eq!(
        ledger_lines(&ledger),
        TURNS as usize,
        "the interrupted call did not run again"
    );
    let context = final_context(&output);
    let third = &context["context_history"][2]["result_tool_calls"][0];
    assert_eq!(third["tool_call_id"], "call-3", "{third}");
    assert_eq!(third["with_error"], true, "{third}");
    let content = third["content"].as_str().unwrap_or_default();
    assert!(
        content.contains("interrupted; not retried because the tool is not idempotent"),
        "{content}"
    );
    assert_eq!(context["turn"], TURNS, "the run went on to the end");
}

/// Two resumes of one run at once: one takes it, the other is refused with a clear error.
fn concurrent_resume(name: &str, store: &str) {
    let dir = scratch(name);
    setup(&dir, "count");
    let ledger = dir.join("ledger.log");
    let model = Model::start(&ledger);
    model.delay(300);
    let child = run_command(&dir, &model, &["--store", store, "--run-id", "twice"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn aplc");
    wait_for("the second request", WAIT, || model.bodies().len() >= 2);
    kill9(child);

    let spawn = || {
        resume_command(&dir, &model, store, "twice")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn aplc resume")
    };
    let (first, second) = (spawn(), spawn());
    let outputs = [
        first.wait_with_output().unwrap(),
        second.wait_with_output().unwrap(),
    ];
    let won: Vec<_> = outputs.iter().filter(|o| o.status.success()).collect();
    let lost: Vec<_> = outputs.iter().filter(|o| !o.status.success()).collect();
    assert_eq!(
        won.len(),
        1,
        "exactly one resume takes the run: {outputs:?}"
    );
    assert_eq!(lost.len(), 1);
    let stderr = String::from_utf8_lossy(&lost[0].stderr);
    assert_eq!(lost[0].status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("being advanced by another process"),
        "{stderr}"
    );
    assert_eq!(ledger_lines(&ledger), TURNS as usize, "no tool ran twice");
}

// ---------------------------------------------------------------------------------------
// Group commit (issue #24): a long loop of instant scripted answers runs ahead of its
// store, committing in groups; SIGKILLed again and again in the middle of it.

/// Iterations of the group loop, and how often its model calls the logging tool.
const GROUP_STEPS: u64 = 4000;
const GROUP_TOOL_EVERY: u64 = 40;

/// The message a non-idempotent tool call in flight at a crash resolves with.
const INTERRUPTED: &str = "interrupted; not retried because the tool is not idempotent";

/// The scripted answers (distinct, so a resume that skips the wrong number of them ends
/// another way), the `log` tool (never idempotent: it appends its request to
/// `ledger.log`, a line per execution) and the context.
fn group_setup(dir: &Path) {
    let answers: Vec<Json> = (1..=GROUP_STEPS)
        .map(|i| {
            if i % GROUP_TOOL_EVERY == GROUP_TOOL_EVERY / 2 {
                let arguments = json!({ "key": format!("k{i}") }).to_string();
                json!({"content": null, "tool_calls": [{
                    "id": format!("call-{i}"), "type": "function",
                    "function": {"name": "log", "arguments": arguments},
                }]})
            } else {
                json!(format!("a{i}"))
            }
        })
        .collect();
    std::fs::write(dir.join("mock.json"), Json::from(answers).to_string()).unwrap();
    // It pauses after logging for `GROUP_PAUSE` seconds: a kill can land while it runs.
    let log = "cat >> ledger.log && echo >> ledger.log && sleep \"${GROUP_PAUSE:-0}\" \
               && echo '{\"logged\": true}'";
    let manifest = json!({"log": {
        "command": ["sh", "-c", log],
        "timeout_ms": 20_000,
        "descriptor": {
            "description": "Log a key",
            "parameters": {
                "type": "object",
                "properties": {"key": {"type": "string"}},
                "required": ["key"],
            },
        },
    }});
    std::fs::write(dir.join("tools.json"), manifest.to_string()).unwrap();
    let context = json!({ "limit": GROUP_STEPS }).to_string();
    std::fs::write(dir.join("context.json"), context).unwrap();
}

/// The flags every run and resume of the group loop takes.
const GROUP_FLAGS: [&str; 6] = [
    "--json",
    "--quiet",
    "--tools",
    "tools.json",
    "--mock",
    "mock.json",
];

fn group_run(dir: &Path, extra: &[&str]) -> Command {
    let agent = root().join("fixtures/durable/group_loop.apl");
    let agent = agent.display().to_string();
    let max_steps = (2 * GROUP_STEPS).to_string();
    let mut args = vec!["run", agent.as_str(), "--context", "context.json"];
    args.extend_from_slice(&["--max-steps", &max_steps]);
    args.extend_from_slice(&GROUP_FLAGS);
    args.extend_from_slice(extra);
    aplc!(dir, &args)
}

fn group_resume(dir: &Path, store: &str, id: &str) -> Command {
    let mut args = vec!["resume", id, "--store", store];
    args.extend_from_slice(&GROUP_FLAGS);
    aplc!(dir, &args)
}

/// The keys the `log` tool logged, one per execution, in order.
fn ledger_keys(dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join("ledger.log")).unwrap_or_default();
    text.lines()
        .filter(|line| !line.is_empty())
        .map(|line| {
            let request: Json = serde_json::from_str(line).expect("a logged request");
            request["arguments"]["key"]
                .as_str()
                .expect("a key")
                .to_string()
        })
        .collect()
}

/// The `log` calls of `context`'s history whose result is the interruption, by history
/// index and key. Each is put back as the uninterrupted run (`expected`) has it: its
/// result and errors, and the next step's prompt that shows the result.
fn put_back_interrupted(context: &mut Json, expected: &Json) -> Vec<String> {
    let mut keys = Vec::new();
    let count = context["context_history"].as_array().map_or(0, Vec::len);
    for h in 0..count {
        let step = &context["context_history"][h];
        let interrupted = step["result_tool_calls"].as_array().is_some_and(|calls| {
            calls.iter().any(|call| {
                call["content"]
                    .as_str()
                    .is_some_and(|c| c.contains(INTERRUPTED))
            })
        });
        if !interrupted {
            continue;
        }
        keys.push(format!("k{}", step["i"]));
        let (done, next) = (
            &expected["context_history"][h],
            &expected["context_history"][h + 1],
        );
        let history = &mut context["context_history"];
        history[h]["result_tool_calls"] = done["result_tool_calls"].clone();
        history[h]["errors"] = done["errors"].clone();
        history[h + 1]["prompts"] = next["prompts"].clone();
    }
    keys
}

/// Kills the durable group loop three times while it runs ahead of its store (after a few
/// more of its tool calls are visible each time: each is committed before it runs),
/// resuming it after each kill, then lets a resume finish it. It ends as an uninterrupted
/// run does, with the scripted answers skipped where the journal left off (a call that
/// was in flight at a kill resolves as interrupted: at most one per kill); no tool call
/// ran twice, and every call the run reports as done ran exactly once.
fn crash_in_a_group(name: &str, store: &str) {
    let dir = scratch(name);
    group_setup(&dir);
    let output = succeed(&mut group_run(&dir, &[]));
    let expected = final_context(&output);
    let all: Vec<String> = ledger_keys(&dir);
    assert_eq!(all.len() as u64, GROUP_STEPS / GROUP_TOOL_EVERY);
    std::fs::remove_file(dir.join("ledger.log")).unwrap();

    let mut child = group_run(&dir, &["--store", store, "--run-id", "group"]);
    // The first and last kills land mostly while a tool call pauses, the second mostly
    // between tool calls, where the run goes on ahead of its commits.
    for (kill, pause) in [(1, "0.1"), (2, "0"), (3, "0.1")] {
        let child_process = child
            .env("GROUP_PAUSE", pause)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn aplc");
        wait_for("more tool calls", WAIT, || {
            ledger_keys(&dir).len() >= 5 * kill
        });
        kill9(child_process);
        child = group_resume(&dir, store, "group");
    }
    let mut resumed = final_context(&succeed(&mut group_resume(&dir, store, "group")));

    let interrupted = put_back_interrupted(&mut resumed, &expected);
    assert!(
        interrupted.len() <= 3,
        "one call in flight per kill at most: {interrupted:?}"
    );
    assert!(
        resumed == expected,
        "the resumed run ends as the uninterrupted one"
    );
    let ledger = ledger_keys(&dir);
    for key in &all {
        let runs = ledger.iter().filter(|logged| *logged == key).count();
        if interrupted.contains(key) {
            assert!(runs <= 1, "the interrupted call `{key}` ran {runs} times");
        } else {
            assert_eq!(runs, 1, "the call `{key}` ran {runs} times: {ledger:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// SQLite.

fn sqlite(name: &str) -> String {
    let dir = scratch(&format!("{name}-db"));
    format!("sqlite:{}", dir.join("runs.db").display())
}

#[test]
fn sqlite_crash_during_a_provider_call_resumes_without_repeating_calls() {
    crash_during_provider_call("sqlite-provider", &sqlite("sqlite-provider"));
}

#[test]
fn sqlite_crash_during_a_tool_call_does_not_run_it_twice() {
    crash_during_tool_call("sqlite-tool", &sqlite("sqlite-tool"));
}

#[test]
fn sqlite_crash_in_a_group_of_uncommitted_steps_repeats_no_tool_call() {
    crash_in_a_group("sqlite-group", &sqlite("sqlite-group"));
}

#[test]
fn sqlite_concurrent_resumes_one_wins() {
    concurrent_resume("sqlite-twice", &sqlite("sqlite-twice"));
}

// ---------------------------------------------------------------------------------------
// PostgreSQL: one throwaway cluster for this test binary, a database per test.

#[test]
fn postgres_crash_during_a_provider_call_resumes_without_repeating_calls() {
    let url = pg::shared().database("crash_provider");
    crash_during_provider_call("pg-provider", &url);
}

#[test]
fn postgres_crash_during_a_tool_call_does_not_run_it_twice() {
    let url = pg::shared().database("crash_tool");
    crash_during_tool_call("pg-tool", &url);
}

#[test]
fn postgres_crash_in_a_group_of_uncommitted_steps_repeats_no_tool_call() {
    let url = pg::shared().database("group");
    crash_in_a_group("pg-group", &url);
}

#[test]
fn postgres_concurrent_resumes_one_wins() {
    let url = pg::shared().database("twice");
    concurrent_resume("pg-twice", &url);
}

// ---------------------------------------------------------------------------------------
// Bad stores and bad requests, through the command line.

#[test]
fn bad_stores_and_unknown_runs_get_clear_errors() {
    let dir = scratch("bad-stores");
    let foreign = dir.join("foreign.db");
    std::fs::write(
        &foreign,
        b"this is not a database, just text that is long enough. ".repeat(100),
    )
    .unwrap();
    let store = format!("sqlite:{}", foreign.display());
    let output = aplc!(&dir, &["runs", "list", "--store", &store])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("not an aplc run store") || stderr.contains("corrupt"),
        "{stderr}"
    );

    let good = sqlite("bad-stores-good");
    let output = aplc!(&dir, &["runs", "show", "nope", "--store", &good])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no run `nope`"), "{stderr}");

    let output = aplc!(&dir, &["runs", "list", "--store", "mysql://x"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("invalid store URL"), "{stderr}");

    // A password in the URL never shows, even when the server is not there.
    let output = aplc!(
        &dir,
        &[
            "runs",
            "list",
            "--store",
            "postgres://aplc:hunter2-secret@127.0.0.1:1/db",
        ],
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("hunter2-secret"), "{stderr}");
}

/// A key a server echoes into its error never reaches the store: not in the journal, the
/// events or the outcome.
#[test]
fn secrets_never_reach_the_store() {
    const KEY: &str = "sk-test-durable-0123456789abcdefSECRET";
    let dir = scratch("secrets");
    setup(&dir, "count");
    // Echo the request's headers, key and all, as a 400 error body.
    let url = serve_http(|head, _| {
        (
            400,
            json!({"error": {"message": format!("bad request: {head}")}}),
        )
    });
    let db = dir.join("runs.db");
    let store = format!("sqlite:{}", db.display());
    let agent = agent();
    let output = aplc!(
        &dir,
        &[
            "run",
            &agent,
            "--json",
            "--quiet",
            "--context",
            "context.json",
            "--tools",
            "tools.json",
            "--base-url",
            &url,
            "--store",
            &store,
            "--run-id",
            "secret",
        ],
    )
    .env("OPENAI_API_KEY", KEY)
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains(KEY), "{stderr}");
    let events = succeed(&mut aplc!(
        &dir,
        &["runs", "events", "secret", "--store", &store],
    ));
    let events = String::from_utf8_lossy(&events.stdout);
    assert!(
        events.contains("bad request"),
        "the error is journaled: {events}"
    );
    // Every byte the store wrote: the database, its WAL, the lock files.
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            let bytes = std::fs::read(&path).unwrap();
            let text = String::from_utf8_lossy(&bytes);
            assert!(!text.contains(KEY), "{} holds the key", path.display());
        }
    }
}

/// `APLC_STORE` is the default store of every command, and `--mock` runs journal too: a
/// resumed scripted run goes on where its script left off.
#[test]
fn aplc_store_sets_the_default_store() {
    let dir = scratch("env-store");
    let store = sqlite("env-store");
    let fixture = root().join("fixtures/run/loop_by_runs.apl");
    let mock = root().join("fixtures/run/loop_by_runs.mock.json");
    let (fixture, mock) = (fixture.display().to_string(), mock.display().to_string());
    let output = succeed(
        aplc!(
            &dir,
            &[
                "run", &fixture, "--mock", &mock, "--run-id", "from-env", "--quiet",
            ],
        )
        .env("APLC_STORE", &store),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("run id: from-env"), "{stderr}");
    let list = succeed(aplc!(&dir, &["runs", "list"]).env("APLC_STORE", &store));
    let list = String::from_utf8_lossy(&list.stdout);
    assert!(
        list.lines()
            .any(|l| l.starts_with("from-env ") && l.contains("completed")),
        "{list}"
    );
    // The whole final context, history included, is rebuilt from the journal.
    let show =
        succeed(aplc!(&dir, &["runs", "show", "from-env", "--json"]).env("APLC_STORE", &store));
    let context: Json = serde_json::from_slice(&show.stdout).unwrap();
    let plain = succeed(&mut aplc!(
        &dir,
        &["run", &fixture, "--mock", &mock, "--json", "--quiet"],
    ));
    let mut expected: Json = serde_json::from_slice(&plain.stdout).unwrap();
    let mut context = context;
    strip_times(&mut expected);
    strip_times(&mut context);
    assert_eq!(context, expected);
}

/// `--max-uncommitted 0` is a window of nothing: the run waits for every commit before it
/// goes on, so an instant scripted loop makes at least one commit per step (with the
/// default window it makes a few dozen for the whole run; not asserted: that depends on
/// the machine's speed).
#[test]
fn a_window_of_zero_commits_every_step() {
    let dir = scratch_in!("durable", "window_zero");
    let agent = root().join("benches/agents/self_loop.apl");
    std::fs::write(dir.join("limit.json"), r#"{"limit": 40}"#).unwrap();
    std::fs::write(dir.join("ok.json"), json!(vec!["ok"; 41]).to_string()).unwrap();
    let store = format!("sqlite:{}", dir.join("bench.db").display());
    let agent = agent.display().to_string();
    let report = succeed(&mut aplc!(
        &dir,
        &[
            "bench",
            &agent,
            "--mock",
            "ok.json",
            "--context",
            "limit.json",
            "-n",
            "2",
            "--warmup",
            "0",
            "--store",
            &store,
            "--max-uncommitted",
            "0",
            "--json",
        ]
    ));
    let report: Json = serde_json::from_slice(&report.stdout).expect("one JSON object");
    assert_eq!(report["max_uncommitted"], 0, "{report}");
    assert_eq!(report["steps_per_run"], 40.0, "{report}");
    let commits = report["commits_per_run"].as_f64().unwrap_or_default();
    assert!(commits >= 40.0, "{commits} commits for 40 steps: {report}");
}

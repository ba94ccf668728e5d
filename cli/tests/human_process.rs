//! People in the loop with real processes (spec/human.md §4.1, §5), against a fake
//! OpenAI-compatible model on 127.0.0.1 that logs every request: `aplc resume` SIGKILLed
//! after it took an answer, on SQLite and PostgreSQL; `--input-file`; a refused resume
//! that stores nothing; and a person at a terminal (a pseudo-terminal driven by
//! `tests/support/on_pty.py`): the three kinds, Ctrl-C, the progress line, and a run
//! SIGKILLed while it asks.

use std::io::{BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aplc_test_support::http::read_request;
use aplc_test_support::pg;
use aplc_test_support::process::{final_context, kill9, root, wait_for};
use aplc_test_support::{aplc, scratch_in};
use serde_json::{Value as Json, json};

/// What a test waits for at most (60 s).
const WAIT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------
// A fake model for fixtures/human/refund.apl: its answer depends only on the request, so
// a request sent again gets the same answer. It logs every request body, and can hold
// one request (by its number since the last `clear`) until released.

struct Model {
    url: String,
    bodies: Arc<Mutex<Vec<String>>>,
    hang_on: Arc<AtomicUsize>,
    released: Arc<AtomicBool>,
}

impl Model {
    fn start() -> Model {
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let hang_on = Arc::new(AtomicUsize::new(0));
        let released = Arc::new(AtomicBool::new(false));
        let (log, hang, free) = (bodies.clone(), hang_on.clone(), released.clone());
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let respond = Arc::new(move |body: &str| {
            let number = {
                let mut log = log.lock().unwrap();
                log.push(body.to_owned());
                log.len()
            };
            if number == hang.load(Ordering::SeqCst) {
                let start = Instant::now();
                while !free.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(120) {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            completion(body)
        });
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let respond = respond.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream);
                    while let Some((_, body)) = read_request(&mut reader) {
                        let answer = respond(&body).to_string();
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
        Model {
            url,
            bodies,
            hang_on,
            released,
        }
    }

    fn bodies(&self) -> Vec<String> {
        self.bodies.lock().unwrap().clone()
    }

    /// Forgets the requests so far; request `hang_on` from now on (1 is the next one) is
    /// held until [`Model::release`] (0: none).
    fn clear(&self, hang_on: usize) {
        self.bodies.lock().unwrap().clear();
        self.released.store(false, Ordering::SeqCst);
        self.hang_on.store(hang_on, Ordering::SeqCst);
    }

    fn release(&self) {
        self.released.store(true, Ordering::SeqCst);
    }
}

/// What fixtures/human/refund.mock.json answers, chosen by what the request holds: the
/// report step's prompt, the human tool's result (`c5:`), the first round's (`c1:`).
fn completion(body: &str) -> Json {
    let call = |id: &str, name: &str, arguments: Json| {
        json!({"id": id, "type": "function",
               "function": {"name": name, "arguments": arguments.to_string()}})
    };
    let (content, calls) = if body.contains("(confirmed:") {
        (json!("Summary sent."), Json::Null)
    } else if body.contains("c5:") {
        (json!("Refunded A-17; B-2 was denied."), Json::Null)
    } else if body.contains("c1:") {
        let ask = call("c5", "ask_user", json!({"question": "Why 500 EUR?"}));
        (Json::Null, json!([ask]))
    } else {
        let calls = json!([
            call("c1", "lookup", json!({"order": "A-17"})),
            call("c2", "refund", json!({"order": "A-17", "amount": 20})),
            call("c3", "refund", json!({"order": "B-2", "amount": 500})),
            call("c4", "refund", json!({"order": "B-2"})),
        ]);
        (Json::Null, calls)
    };
    let mut message = json!({"role": "assistant", "content": content});
    if !calls.is_null() {
        message["tool_calls"] = calls;
    }
    json!({
        "id": "cmpl", "object": "chat.completion", "model": "fake",
        "choices": [{"index": 0, "message": message,
                     "finish_reason": if message.get("tool_calls").is_some() { "tool_calls" } else { "stop" }}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
    })
}

// ---------------------------------------------------------------------------------------
// The agent and the aplc binary.

/// A scratch copy of fixtures/human: the agent, its tools (each run logged to
/// `tools.log`), its mock.
fn fixture(name: &str) -> PathBuf {
    let dir = scratch_in!("human-process", name);
    for file in ["refund.apl", "refund.mock.json", "tools.json", "tool.py"] {
        std::fs::copy(root().join("fixtures/human").join(file), dir.join(file)).unwrap();
    }
    dir
}

/// `aplc ARGS --tools tools.json --base-url MODEL --store STORE --quiet`.
fn aplc_on(dir: &Path, model: &Model, store: &str, args: &[&str]) -> Command {
    let mut all = args.to_vec();
    all.extend([
        "--tools",
        "tools.json",
        "--base-url",
        &model.url,
        "--store",
        store,
        "--quiet",
    ]);
    let mut command = aplc!(dir, &all);
    command.env("APLC_TOOL_LOG", dir.join("tools.log"));
    command
}

#[track_caller]
fn exits(command: &mut Command, code: i32) -> Output {
    let output = command.output().expect("run aplc");
    assert_eq!(
        output.status.code(),
        Some(code),
        "stderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The refunds `tools.log` recorded, emptying it.
fn take_refunds(dir: &Path) -> Vec<Json> {
    let log = dir.join("tools.log");
    let runs = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    runs.lines()
        .map(|line| serde_json::from_str::<Json>(line).unwrap())
        .filter(|run| run["tool"] == "refund")
        .collect()
}

const DENY: &str = "1-3=over the limit";

/// After the first pause: the rest of the run, answered as soon as it asks. Its final
/// context.
fn answer_the_rest(dir: &Path, model: &Model, store: &str, id: &str) -> Json {
    let out = exits(
        &mut aplc_on(
            dir,
            model,
            store,
            &["resume", id, "--input", "2-1=\"why not\""],
        ),
        4,
    );
    assert!(
        stderr(&out).contains("waiting for input: 3-0 (input:"),
        "{}",
        stderr(&out)
    );
    let out = exits(
        &mut aplc_on(
            dir,
            model,
            store,
            &["resume", id, "--input", "3-0=true", "--json"],
        ),
        0,
    );
    final_context(&out)
}

/// The events `aplc runs events` lists of `type`, as (request id, by).
fn requests_and_answers(dir: &Path, store: &str, id: &str, kind: &str) -> Vec<String> {
    let out = exits(
        &mut aplc!(dir, &["runs", "events", id, "--store", store]),
        0,
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str::<Json>(line).unwrap())
        .filter(|event| event["type"] == kind)
        .map(|event| event["id"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Pause, answer, SIGKILL `aplc resume` while the model call after the answered round
/// hangs, resume again: the run ends as one answered at once, no provider call made
/// before the kill's call is sent again, the approved refund ran once, and no request
/// is asked or answered twice.
fn killed_after_an_answer(name: &str, store: &str) {
    let dir = fixture(name);
    let model = Model::start();

    // Answered at once (each pause answered as it comes, nothing killed).
    let out = exits(
        &mut aplc_on(
            &dir,
            &model,
            store,
            &["run", "refund.apl", "--run-id", "once"],
        ),
        4,
    );
    assert!(
        stderr(&out).contains("waiting for input: 1-2 (approval:"),
        "{}",
        stderr(&out)
    );
    let out = exits(
        &mut aplc_on(
            &dir,
            &model,
            store,
            &["resume", "once", "--approve", "1-2", "--deny", DENY],
        ),
        4,
    );
    assert!(
        stderr(&out).contains("waiting for input: 2-1 (tool:"),
        "{}",
        stderr(&out)
    );
    let expected = answer_the_rest(&dir, &model, store, "once");
    let expected_requests = model.bodies();
    assert_eq!(expected_requests.len(), 4, "four model calls in all");
    assert!(
        expected_requests[1]
            .contains("tool execution failed: `refund`: denied by reviewer: over the limit"),
        "the denial reached the model's next request: {}",
        expected_requests[1]
    );
    assert_eq!(take_refunds(&dir).len(), 1, "the approved refund ran");

    // Killed after it took the answers, while the next model call hangs.
    model.clear(2);
    exits(
        &mut aplc_on(
            &dir,
            &model,
            store,
            &["run", "refund.apl", "--run-id", "kill"],
        ),
        4,
    );
    let child = aplc_on(
        &dir,
        &model,
        store,
        &["resume", "kill", "--approve", "1-2", "--deny", DENY],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("spawn aplc");
    wait_for("the model call after the answered round", WAIT, || {
        model.bodies().len() >= 2
    });
    kill9(child);
    model.release();
    assert_eq!(
        take_refunds(&dir),
        [json!({"tool": "refund", "arguments": {"order": "A-17", "amount": 20}})],
        "the approved refund ran before the kill"
    );

    // Resumed without answers: the answers were taken already, so it goes on to the
    // human tool's question and asks nothing of the first round again.
    let out = exits(&mut aplc_on(&dir, &model, store, &["resume", "kill"]), 4);
    let err = stderr(&out);
    assert!(err.contains("waiting for input: 2-1 (tool:"), "{err}");
    assert!(!err.contains("1-2") && !err.contains("1-3"), "{err}");
    let ended = answer_the_rest(&dir, &model, store, "kill");
    assert_eq!(
        ended, expected,
        "the same final context as the run answered at once"
    );
    assert!(
        take_refunds(&dir).is_empty(),
        "the refund did not run again"
    );

    let sent = model.bodies();
    assert_eq!(
        sent.len(),
        5,
        "only the call in flight at the kill is sent again"
    );
    assert_eq!(
        sent[0], expected_requests[0],
        "the call before the pause, sent once"
    );
    assert_eq!(
        sent[1], sent[2],
        "the call in flight at the kill is the one sent again"
    );
    assert_eq!(
        sent[2..],
        expected_requests[1..],
        "then the same calls as the run answered at once"
    );

    for kind in ["input_requested", "input_received"] {
        assert_eq!(
            requests_and_answers(&dir, store, "kill", kind),
            ["1-2", "1-3", "2-1", "3-0"],
            "each request {kind} once"
        );
    }
}

#[test]
fn sqlite_a_kill_after_an_answer_repeats_no_call_and_asks_nothing_again() {
    let dir = scratch_in!("human-process", "sqlite-kill-db");
    let store = format!("sqlite:{}", dir.join("runs.db").display());
    killed_after_an_answer("sqlite-kill", &store);
}

#[test]
fn postgres_a_kill_after_an_answer_repeats_no_call_and_asks_nothing_again() {
    let store = pg::shared().database("human_kill");
    killed_after_an_answer("pg-kill", &store);
}

/// A resume refused for its flags (here: the tool flags forgotten) stores none of the
/// answers it was given: the same command, corrected, takes them.
#[test]
fn a_refused_resume_stores_no_answer() {
    let dir = fixture("refused-resume");
    let model = Model::start();
    let store = format!("sqlite:{}", dir.join("runs.db").display());
    exits(
        &mut aplc_on(
            &dir,
            &model,
            &store,
            &["run", "refund.apl", "--run-id", "r"],
        ),
        4,
    );
    let forgot_tools = &[
        "resume",
        "r",
        "--store",
        &store,
        "--base-url",
        &model.url,
        "--approve",
        "1-2",
    ];
    let out = exits(&mut aplc!(&dir, forgot_tools), 2);
    assert!(stderr(&out).contains("tools differ"), "{}", stderr(&out));
    let out = exits(
        &mut aplc_on(&dir, &model, &store, &["resume", "r", "--approve", "1-2"]),
        4,
    );
    let err = stderr(&out);
    assert!(err.contains("waiting for input: 1-3"), "{err}");
    assert!(!err.contains("waiting for input: 1-2"), "{err}");
}

/// `--input-file` reads each entry by the kind of its request: `true` approves an
/// approval and answers a yes-or-no question (a boolean schema) with `true`.
#[test]
fn an_input_file_answers_by_the_kind_of_each_request() {
    let dir = fixture("input-file");
    let model = Model::start();
    let store = format!("sqlite:{}", dir.join("runs.db").display());
    let resume = |file: &str, json: Json| {
        std::fs::write(dir.join(file), json.to_string()).unwrap();
        aplc_on(&dir, &model, &store, &["resume", "f", "--input-file", file])
    };
    exits(
        &mut aplc_on(
            &dir,
            &model,
            &store,
            &["run", "refund.apl", "--run-id", "f"],
        ),
        4,
    );
    // `runs show` says what each request is about, for the one who answers.
    let shown = exits(
        &mut aplc!(&dir, &["runs", "show", "f", "--store", &store]),
        0,
    );
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("status:   waiting"), "{shown}");
    assert!(
        shown.contains("waiting for input: 1-3 (approval: Approve a call of `refund`?)\n  step `act`, tool `refund` {\"order\":\"B-2\",\"amount\":500}, requested 20"),
        "{shown}"
    );
    let first = json!({"1-2": true, "1-3": {"approve": false, "reason": "over the limit"}});
    exits(&mut resume("first.json", first), 4);
    exits(&mut resume("second.json", json!({"2-1": "why not"})), 4);
    let out = exits(&mut resume("third.json", json!({"3-0": true})), 0);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "Summary sent.");
    assert_eq!(
        take_refunds(&dir).len(),
        1,
        "one refund approved, one denied"
    );
}

// ---------------------------------------------------------------------------------------
// A person at a terminal: aplc on a pseudo-terminal (python3's `pty`).

/// One question on the terminal and what to type: `quiet_ms` watches the terminal that
/// long first, for anything drawn over the question.
fn step(expect: &str, send: &str) -> Json {
    json!({"expect": expect, "send": send})
}

/// Runs `aplc ARGS` on a pseudo-terminal in `dir`, typing as `steps` say; the driver's
/// report, and aplc's stdout.
fn on_terminal(dir: &Path, args: &[&str], steps: Vec<Json>, end_within_s: u64) -> (Json, String) {
    let mut argv = vec![env!("CARGO_BIN_EXE_aplc").to_owned()];
    argv.extend(args.iter().map(|a| a.to_string()));
    let spec = json!({
        "argv": argv,
        "cwd": dir,
        "stdout": dir.join("stdout.txt"),
        "env": {"APLC_TOOL_LOG": dir.join("tools.log")},
        "steps": steps,
        "end_within_s": end_within_s,
    });
    let driver = root().join("cli/tests/support/on_pty.py");
    let out = Command::new("python3")
        .arg(driver)
        .arg(spec.to_string())
        .output()
        .expect("python3 runs the pty driver");
    let report: Json = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "the pty driver failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let stdout = std::fs::read_to_string(dir.join("stdout.txt")).unwrap_or_default();
    (report, stdout)
}

const APPROVE: &str = "approve? [y/n] ";
const VALUE: &str = "answer (text or JSON): ";

/// The three kinds answered on the terminal, without a store: a wrong key, a denial
/// with its reason, text for a string, a value that fails the schema asked again.
#[test]
fn a_person_answers_the_three_kinds_on_the_terminal() {
    let dir = fixture("terminal");
    let (report, stdout) = on_terminal(
        &dir,
        &[
            "run",
            "refund.apl",
            "--tools",
            "tools.json",
            "--mock",
            "refund.mock.json",
            "--json",
            "--quiet",
            "--as",
            "bob",
            "--events",
            "events.jsonl",
        ],
        vec![
            step(APPROVE, "maybe\n"),
            step("answer y or n", "y\n"),
            step(APPROVE, "n\n"),
            step("reason", "over the limit\n"),
            step("Why 500 EUR?", ""),
            step(VALUE, "the customer asked twice\n"),
            step("Send the summary to the customer?", "maybe\n"),
            step("does not match its schema", "true\n"),
        ],
        60,
    );
    assert_eq!(report["code"], json!(0), "{report}");
    let context: Json = serde_json::from_str(&stdout).expect("--json prints the context");
    assert_eq!(context["human_input"], json!(true));
    assert_eq!(context["result_text"], "Summary sent.");
    let transcript = context["transcript"].to_string();
    assert!(
        transcript.contains("denied by reviewer: over the limit"),
        "{transcript}"
    );
    assert!(
        transcript.contains("the customer asked twice"),
        "{transcript}"
    );
    let events = std::fs::read_to_string(dir.join("events.jsonl")).unwrap();
    let by: Vec<(String, String)> = events
        .lines()
        .map(|line| serde_json::from_str::<Json>(line).unwrap())
        .filter(|e| e["type"] == "input_received")
        .map(|e| {
            (
                e["id"].as_str().unwrap().into(),
                e["by"].as_str().unwrap().into(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = ["1-2", "1-3", "2-1", "3-0"]
        .iter()
        .map(|id| (id.to_string(), "bob".to_string()))
        .collect();
    assert_eq!(by, expected);
}

/// Ctrl-C while the terminal waits for an answer stops aplc at once (exit 130), as it
/// does while the run waits for a model: the read of the answer does not hold it.
#[test]
fn ctrl_c_at_a_question_stops_aplc() {
    let dir = fixture("ctrl-c");
    let store = format!("sqlite:{}", dir.join("runs.db").display());
    let (report, _) = on_terminal(
        &dir,
        &[
            "run",
            "refund.apl",
            "--tools",
            "tools.json",
            "--mock",
            "refund.mock.json",
            "--quiet",
            "--store",
            &store,
            "--run-id",
            "c",
        ],
        vec![step(APPROVE, "\x03")],
        20,
    );
    assert_eq!(report["code"], json!(130), "{report}");
    assert!(
        report["seen"]
            .as_str()
            .unwrap()
            .contains("interrupted by SIGINT"),
        "{report}"
    );
}

/// With the progress line on (stderr is a terminal, no --quiet), nothing is drawn over
/// a question while it waits for an answer.
#[test]
fn the_progress_line_does_not_draw_over_a_question() {
    let dir = fixture("progress");
    let (report, _) = on_terminal(
        &dir,
        &[
            "run",
            "refund.apl",
            "--tools",
            "tools.json",
            "--mock",
            "refund.mock.json",
        ],
        vec![
            json!({"expect": APPROVE, "send": "y\n", "quiet_ms": 1500}),
            step(APPROVE, "y\n"),
            step(VALUE, "\"ok\"\n"),
            step(VALUE, "true\n"),
        ],
        60,
    );
    assert_eq!(report["code"], json!(0), "{report}");
    assert_eq!(
        report["drawn"],
        json!([]),
        "drawn over the question: {report}"
    );
    // Each question starts on a line of its own, the progress line cleared before it.
    let seen = report["seen"].as_str().unwrap();
    let questions: Vec<&str> = seen.split("input requested: ").collect();
    assert_eq!(questions.len(), 5, "{seen}");
    for before in &questions[..4] {
        let line = before.rsplit(['\n', '\x1b']).next().unwrap_or_default();
        assert!(
            line.trim_start_matches("[2K").trim().is_empty(),
            "a question shares its line with `{line}`: {seen}"
        );
    }
}

/// `aplc run --store` asking on a terminal, SIGKILLed while the person thinks: its
/// requests were committed before anyone was asked, so `aplc resume` answers them, and
/// the run goes on without sending the model's first call again.
#[test]
fn a_run_killed_while_it_asks_on_a_terminal_is_answered_by_resume() {
    let dir = fixture("terminal-kill");
    let model = Model::start();
    let store = format!("sqlite:{}", dir.join("runs.db").display());
    let (report, _) = on_terminal(
        &dir,
        &[
            "run",
            "refund.apl",
            "--tools",
            "tools.json",
            "--base-url",
            &model.url,
            "--store",
            &store,
            "--run-id",
            "k",
            "--quiet",
        ],
        vec![json!({"expect": APPROVE, "send": "", "kill9": true})],
        60,
    );
    assert_eq!(report["killed"], json!(true), "{report}");
    let shown = exits(
        &mut aplc!(&dir, &["runs", "show", "k", "--store", &store]),
        0,
    );
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("waiting for input: 1-2"), "{shown}");
    assert!(shown.contains("waiting for input: 1-3"), "{shown}");
    let out = exits(
        &mut aplc_on(
            &dir,
            &model,
            &store,
            &["resume", "k", "--approve", "1-2", "--deny", DENY],
        ),
        4,
    );
    assert!(
        stderr(&out).contains("waiting for input: 2-1"),
        "{}",
        stderr(&out)
    );
    let sent = model.bodies();
    assert_eq!(sent.len(), 2, "the first call is not sent again");
    assert!(sent[1].contains("denied by reviewer: over the limit"));
    assert_eq!(take_refunds(&dir).len(), 1);
}

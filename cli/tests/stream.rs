//! `aplc run --stream` against a fake OpenAI-compatible server on 127.0.0.1 that streams
//! (issue #13 §1): each call's text reaches stdout as it arrives, calls separated by a
//! newline, and `--json` still prints the final context, the same as without `--stream`.

use aplc_test_support::http::read_request;

use std::io::{BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value as Json, json};

/// Two calls: the step runs again once.
const AGENT: &str = "# prompt: a\n## user\nhi\n\n# post: a\n\
                     {% if runs < 2 %}{{ set_context('next_step', 'a') }}{% endif %}\n";

/// Each call's text, in the pieces the server streams.
const PIECES: [[&str; 2]; 2] = [["Hello, ", "world"], ["Second ", "answer"]];

/// The fake model. With a gate, the first call's stream stops after its first piece
/// until the test opens the gate (or a minute passes, so a broken aplc fails the test
/// instead of hanging it).
struct Model {
    url: String,
    calls: Arc<AtomicUsize>,
    /// Whether the gate was opened by the test (`Some(true)`) or timed out.
    gate_opened: Arc<Mutex<Option<bool>>>,
}

impl Model {
    fn start(gate: Option<Receiver<()>>) -> Model {
        let pieces = PIECES
            .iter()
            .map(|call| call.iter().map(|p| p.to_string()).collect())
            .collect();
        Model::serving(gate, pieces)
    }

    /// A model answering call `i` with `pieces[i]` (the last one for later calls).
    fn serving(gate: Option<Receiver<()>>, pieces: Vec<Vec<String>>) -> Model {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let calls = Arc::new(AtomicUsize::new(0));
        let gate_opened = Arc::new(Mutex::new(None));
        let (counter, opened) = (calls.clone(), gate_opened.clone());
        let gate = Mutex::new(gate);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let mut reader = BufReader::new(stream);
                while let Some((_, body)) = read_request(&mut reader) {
                    let call = counter.fetch_add(1, Ordering::SeqCst);
                    let request: Json = serde_json::from_str(&body).unwrap_or(Json::Null);
                    let out = reader.get_mut();
                    let pieces: Vec<&str> = pieces[call.min(pieces.len() - 1)]
                        .iter()
                        .map(String::as_str)
                        .collect();
                    let ok = if request["stream"] == json!(true) {
                        let wait = |piece: usize| {
                            if call != 0 || piece != 0 {
                                return;
                            }
                            if let Some(gate) = gate.lock().unwrap().take() {
                                let by_test = gate.recv_timeout(Duration::from_secs(60)).is_ok();
                                *opened.lock().unwrap() = Some(by_test);
                            }
                        };
                        stream_answer(out, &pieces, wait)
                    } else {
                        whole_answer(out, &pieces.concat())
                    };
                    if ok.is_err() {
                        break;
                    }
                }
            }
        });
        Model {
            url,
            calls,
            gate_opened,
        }
    }
}

fn usage() -> Json {
    json!({"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5})
}

fn whole_answer(out: &mut TcpStream, text: &str) -> std::io::Result<()> {
    let body = json!({
        "id": "c", "object": "chat.completion", "model": "fake",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}],
        "usage": usage(),
    })
    .to_string();
    write!(
        out,
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// A chunked event stream of `pieces`; `wait(i)` runs after piece `i` is flushed.
fn stream_answer(
    out: &mut TcpStream,
    pieces: &[&str],
    wait: impl Fn(usize),
) -> std::io::Result<()> {
    let chunk = |out: &mut TcpStream, data: Json| -> std::io::Result<()> {
        let event = format!("data: {data}\n\n");
        write!(out, "{:x}\r\n{event}\r\n", event.len())?;
        out.flush()
    };
    let base = |choices: Json| json!({"id": "c", "object": "chat.completion.chunk", "model": "fake", "choices": choices});
    write!(
        out,
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )?;
    chunk(
        out,
        base(json!([{"index": 0, "delta": {"role": "assistant", "content": ""}}])),
    )?;
    for (i, piece) in pieces.iter().enumerate() {
        chunk(
            out,
            base(json!([{"index": 0, "delta": {"content": piece}}])),
        )?;
        wait(i);
    }
    chunk(
        out,
        base(json!([{"index": 0, "delta": {}, "finish_reason": "stop"}])),
    )?;
    let mut last = base(json!([]));
    last["usage"] = usage();
    chunk(out, last)?;
    let done = "data: [DONE]\n\n";
    write!(out, "{:x}\r\n{done}\r\n0\r\n\r\n", done.len())?;
    out.flush()
}

fn agent_file(dir: &tempfile::TempDir) -> String {
    let path = dir.path().join("stream.apl");
    std::fs::write(&path, AGENT).expect("write the agent");
    path.display().to_string()
}

fn aplc(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_aplc"));
    command.args(args).env_remove("OPENAI_API_KEY");
    command
}

fn run(args: &[&str]) -> Output {
    aplc(args).output().expect("aplc runs")
}

/// The context without its times.
fn without_times(mut json: Json) -> Json {
    fn strip(json: &mut Json) {
        match json {
            Json::Object(map) => {
                map.remove("time_elapsed");
                map.remove("time_elapsed_global");
                map.values_mut().for_each(strip);
            }
            Json::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut json);
    json
}

#[test]
fn stream_prints_each_calls_text_as_it_arrives() {
    let dir = tempfile::tempdir().unwrap();
    let agent = agent_file(&dir);
    let (open, gate): (Sender<()>, Receiver<()>) = channel();
    let model = Model::start(Some(gate));
    let mut child = aplc(&[
        "run",
        &agent,
        "--base-url",
        &model.url,
        "--api-key",
        "k",
        "--stream",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("aplc starts");
    let mut stdout = child.stdout.take().expect("stdout");
    // The first piece is on stdout while the server still holds back the rest.
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    while !seen.ends_with(b"Hello, ") {
        match stdout.read(&mut byte) {
            Ok(1) => seen.push(byte[0]),
            _ => break,
        }
    }
    assert_eq!(String::from_utf8_lossy(&seen), "Hello, ");
    let _ = open.send(());
    stdout.read_to_end(&mut seen).expect("the rest of stdout");
    let status = child.wait().expect("aplc ends");
    let mut stderr = String::new();
    let _ = child
        .stderr
        .take()
        .map(|mut e| e.read_to_string(&mut stderr));
    assert!(status.success(), "{stderr}");
    assert_eq!(
        *model.gate_opened.lock().unwrap(),
        Some(true),
        "the first piece reached stdout before the rest was sent"
    );
    // Each call's text, then a newline; the final `result_text` is not repeated.
    assert_eq!(
        String::from_utf8_lossy(&seen),
        "Hello, world\nSecond answer\n"
    );
    assert_eq!(model.calls.load(Ordering::SeqCst), 2);
}

#[test]
fn stream_with_json_prints_the_same_final_context() {
    let dir = tempfile::tempdir().unwrap();
    let agent = agent_file(&dir);
    let model = Model::start(None);
    let plain = run(&[
        "run",
        &agent,
        "--base-url",
        &model.url,
        "--api-key",
        "k",
        "--json",
    ]);
    assert!(
        plain.status.success(),
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );
    let expected: Json = serde_json::from_slice(&plain.stdout).expect("the context");
    let events = dir.path().join("events.jsonl");
    let events_arg = events.display().to_string();
    // A fresh server: its first call answers with the first text again.
    let model = Model::start(None);
    let streamed = run(&[
        "run",
        &agent,
        "--base-url",
        &model.url,
        "--api-key",
        "k",
        "--json",
        "--stream",
        "--events",
        &events_arg,
    ]);
    assert!(
        streamed.status.success(),
        "{}",
        String::from_utf8_lossy(&streamed.stderr)
    );
    let out = String::from_utf8_lossy(&streamed.stdout);
    let json = out
        .strip_prefix("Hello, world\nSecond answer\n")
        .unwrap_or_else(|| panic!("the streamed text comes first: {out}"));
    let context: Json = serde_json::from_str(json).expect("then the context");
    assert_eq!(without_times(context), without_times(expected));
    // The events file has the deltas; `aplc trace` reads past them.
    let lines = std::fs::read_to_string(&events).expect("events");
    assert_eq!(lines.matches("\"type\":\"provider_delta\"").count(), 4);
    let trace = run(&["trace", &events_arg]);
    assert!(
        trace.status.success(),
        "{}",
        String::from_utf8_lossy(&trace.stderr)
    );
    assert!(String::from_utf8_lossy(&trace.stdout).contains("provider calls  2 (0 failed)"));
}

#[test]
fn stream_with_mock_sends_each_answer_whole() {
    let dir = tempfile::tempdir().unwrap();
    let agent = agent_file(&dir);
    let mock = dir.path().join("mock.json");
    std::fs::write(&mock, r#"["one", "two"]"#).unwrap();
    let o = run(&[
        "run",
        &agent,
        "--mock",
        &mock.display().to_string(),
        "--stream",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "one\ntwo\n");
}

#[test]
fn stream_works_for_journaled_runs_and_journals_no_deltas() {
    let dir = tempfile::tempdir().unwrap();
    let agent = agent_file(&dir);
    let mock = dir.path().join("mock.json");
    std::fs::write(&mock, r#"["one", "two"]"#).unwrap();
    let store = format!("sqlite:{}", dir.path().join("runs.db").display());
    let o = run(&[
        "run",
        &agent,
        "--mock",
        &mock.display().to_string(),
        "--stream",
        "--store",
        &store,
        "--run-id",
        "s1",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "one\ntwo\n");
    let events = run(&["runs", "events", "s1", "--store", &store]);
    assert!(
        events.status.success(),
        "{}",
        String::from_utf8_lossy(&events.stderr)
    );
    let events = String::from_utf8_lossy(&events.stdout);
    assert!(events.contains("\"type\":\"provider_call\""), "{events}");
    assert!(!events.contains("provider_delta"), "{events}");
}

#[test]
fn a_key_split_across_deltas_is_redacted_in_the_events_file() {
    let dir = tempfile::tempdir().unwrap();
    let agent = agent_file(&dir);
    let key = "sk-test-0123456789abcdefghijklmnop";
    // The model echoes the key, cut into pieces shorter than a redaction run.
    let pieces: Vec<String> = format!("your key is {key}, keep it safe")
        .chars()
        .collect::<Vec<char>>()
        .chunks(5)
        .map(|c| c.iter().collect())
        .collect();
    let model = Model::serving(None, vec![pieces]);
    let events = dir.path().join("events.jsonl");
    let events_arg = events.display().to_string();
    let o = run(&[
        "run",
        &agent,
        "--base-url",
        &model.url,
        "--api-key",
        key,
        "--stream",
        "--events",
        &events_arg,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines = std::fs::read_to_string(&events).expect("events");
    for window in key.as_bytes().windows(16) {
        let window = std::str::from_utf8(window).unwrap();
        assert!(!lines.contains(window), "a run of the key leaked: {lines}");
    }
    // The deltas of each call, joined, are the redacted text.
    let text: String = lines
        .lines()
        .map(|line| serde_json::from_str::<Json>(line).unwrap())
        .filter(|event| event["type"] == "provider_delta")
        .map(|event| event["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        text,
        "your key is <redacted>, keep it safe".repeat(2),
        "{lines}"
    );
}

//! The `aplc serve` tests' fixtures: a fake OpenAI-compatible model on 127.0.0.1 that logs
//! every request, `aplc serve` as a child process, and a client with the token. Shared by
//! `serve.rs` and `serve_human.rs` (each test binary uses a part of it).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aplc_test_support::http::read_request;
use serde_json::{Value as Json, json};

pub const TOKEN: &str = "test-token-4f1d";

// ---------------------------------------------------------------------------------------
// A fake model: a thread per connection on 127.0.0.1.

/// Answers every chat completion after `delay_ms` with "answer to: PROMPT", and records
/// the prompt of every request. Each answer names its request in its `model` field
/// ([`answer_tag`]), which journals keep: a test can tell which request's answer a run
/// journaled.
#[derive(Clone)]
pub struct Model {
    pub url: String,
    pub prompts: Arc<Mutex<Vec<Request>>>,
    pub delay_ms: Arc<AtomicU64>,
}

impl Model {
    pub fn start() -> Model {
        Model::answering(|body| {
            let prompt = last_user_message(body);
            json!({"role": "assistant", "content": format!("answer to: {prompt}")})
        })
    }

    /// A model whose answer to each request (its body) is `message`.
    pub fn answering(message: fn(&str) -> Json) -> Model {
        let prompts = Arc::new(Mutex::new(Vec::new()));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let (log, delay) = (prompts.clone(), delay_ms.clone());
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (log, delay) = (log.clone(), delay.clone());
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream);
                    while let Some((_, body)) = read_request(&mut reader) {
                        let prompt = last_user_message(&body);
                        let number = {
                            let mut log = log.lock().unwrap();
                            let number = log.len();
                            log.push(Request {
                                at: Instant::now(),
                                prompt: prompt.clone(),
                                number,
                            });
                            number
                        };
                        std::thread::sleep(Duration::from_millis(delay.load(Ordering::SeqCst)));
                        let answer = json!({
                            "id": "cmpl-1",
                            "object": "chat.completion",
                            "model": answer_tag(number),
                            "choices": [{
                                "index": 0,
                                "finish_reason": "stop",
                                "message": message(&body),
                            }],
                            "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
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
        Model {
            url,
            prompts,
            delay_ms,
        }
    }

    pub fn prompts(&self) -> Vec<String> {
        self.requests().into_iter().map(|r| r.prompt).collect()
    }

    /// Every request, in the order they arrived.
    pub fn requests(&self) -> Vec<Request> {
        self.prompts.lock().unwrap().clone()
    }

    /// The prompts that name run `tag`.
    pub fn prompts_of(&self, tag: &str) -> Vec<String> {
        let needle = format!("run {tag} turn ");
        self.prompts()
            .into_iter()
            .filter(|p| p.contains(&needle))
            .collect()
    }

    pub fn delay(&self, ms: u64) {
        self.delay_ms.store(ms, Ordering::SeqCst);
    }
}

/// A request the fake model answered.
#[derive(Clone, Debug)]
pub struct Request {
    pub at: Instant,
    pub prompt: String,
    /// Its place in the order of arrival.
    pub number: usize,
}

/// The `model` the fake model answers request `number` with: delimited, so that no tag is
/// a prefix of another when a test looks for it in a journal's bytes.
pub fn answer_tag(number: usize) -> String {
    format!("fake<{number}>")
}

pub fn last_user_message(body: &str) -> String {
    let request: Json = serde_json::from_str(body).unwrap_or(Json::Null);
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_str())
        .next_back()
        .unwrap_or("")
        .trim()
        .to_string()
}

// ---------------------------------------------------------------------------------------
// The server: `aplc serve` as a child process.

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A scratch directory for one test, emptied first, with `agents/turns.apl` and a
/// providers file routing every model to `model`.
pub fn scratch(name: &str, model: &Model) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("serve")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("agents")).expect("scratch dir");
    std::fs::copy(
        root().join("fixtures/serve/turns.apl"),
        dir.join("agents/turns.apl"),
    )
    .expect("agent");
    let providers = json!({"routes": [{"model": "*", "kind": "openai", "base_url": model.url}]});
    std::fs::write(dir.join("providers.json"), providers.to_string()).expect("providers");
    dir
}

/// A running `aplc serve`, killed when dropped.
pub struct Server {
    pub child: Child,
    pub url: String,
    pub log: Arc<Mutex<String>>,
}

impl Server {
    pub fn start(dir: &Path, extra: &[&str]) -> Server {
        Server::start_on(dir, "sqlite:runs.db", extra)
    }

    pub fn start_on(dir: &Path, store: &str, extra: &[&str]) -> Server {
        Server::start_with(dir, store, extra, &[])
    }

    /// [`Server::start_on`] with more environment variables.
    pub fn start_with(dir: &Path, store: &str, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut command = Server::command(dir, store, extra);
        command.envs(env.iter().copied());
        Server::launch(command)
    }

    /// The `aplc serve` command line of a test.
    pub fn command(dir: &Path, store: &str, extra: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_aplc"));
        command
            .current_dir(dir)
            .args(["serve", "--agents", "agents", "--store", store])
            .args(["--listen", "127.0.0.1:0", "--providers", "providers.json"])
            .args(extra)
            .env("APLC_SERVE_TOKENS", TOKEN)
            .env("RUST_LOG", "info")
            .env_remove("OPENAI_API_KEY");
        command
    }

    /// Starts `command` and waits for the address it listens on.
    pub fn launch(mut command: Command) -> Server {
        let mut child = command
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
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "aplc serve did not start: {line:?}\n{}",
                log.lock().unwrap()
            );
        };
        Server {
            url: url.to_string(),
            child,
            log,
        }
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then the exit code.
    pub fn terminate(mut self) -> Option<i32> {
        let pid = i32::try_from(self.child.id()).expect("pid");
        // SAFETY: `kill` with a child's pid and a signal number has no memory effects.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let status = self.child.wait().expect("wait");
        status.code()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A plain HTTP client (reqwest is built without a default TLS provider: `ring` is
/// installed, as the runtime does, though every request here is plain HTTP).
pub fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

/// A client with the token.
pub struct Client {
    pub http: reqwest::Client,
    pub base: String,
}

impl Client {
    pub fn new(server: &Server) -> Client {
        Client {
            http: http(),
            base: server.url.clone(),
        }
    }

    pub async fn get(&self, path: &str) -> (u16, Json) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("GET");
        status_json(response).await
    }

    pub async fn post(&self, path: &str, body: &Json) -> (u16, Json) {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .expect("POST");
        status_json(response).await
    }

    /// Submits a run of `turns` with `tag`; the answer's status and body.
    pub async fn submit(&self, tag: &str, turns: u64, wait: bool) -> (u16, Json) {
        let path = if wait {
            "/v1/agents/turns/runs?wait=true"
        } else {
            "/v1/agents/turns/runs"
        };
        self.post(path, &json!({"context": {"turns": turns, "tag": tag}}))
            .await
    }

    /// Polls the run until its status is final (or panics after a minute).
    pub async fn until_final(&self, id: &str) -> Json {
        self.until(id, |run| {
            ["completed", "failed", "cancelled"].contains(&run["status"].as_str().unwrap_or(""))
        })
        .await
    }

    pub async fn until(&self, id: &str, done: impl Fn(&Json) -> bool) -> Json {
        let started = Instant::now();
        loop {
            let (status, run) = self.get(&format!("/v1/runs/{id}")).await;
            assert_eq!(status, 200, "{run}");
            if done(&run) {
                return run;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "run {id} is still {run}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The run's SSE stream until it ends: `(id, event)` per message.
    pub async fn events(&self, id: &str, last_event_id: Option<u64>) -> Vec<(Option<u64>, Json)> {
        let mut request = self
            .http
            .get(format!("{}/v1/runs/{id}/events", self.base))
            .bearer_auth(TOKEN);
        if let Some(last) = last_event_id {
            request = request.header("Last-Event-ID", last.to_string());
        }
        let mut response = request.send().await.expect("GET events");
        assert_eq!(response.status().as_u16(), 200);
        let mut text = String::new();
        while let Some(chunk) = response.chunk().await.expect("SSE chunk") {
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
        parse_sse(&text)
    }
}

pub async fn status_json(response: reqwest::Response) -> (u16, Json) {
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    let json = serde_json::from_str(&text).unwrap_or(Json::String(text));
    (status, json)
}

pub fn parse_sse(text: &str) -> Vec<(Option<u64>, Json)> {
    let mut events = Vec::new();
    for block in text.split("\n\n") {
        let mut id = None;
        let mut data = None;
        for line in block.lines() {
            if let Some(value) = line.strip_prefix("id:") {
                id = value.trim().parse().ok();
            } else if let Some(value) = line.strip_prefix("data:") {
                data = Some(serde_json::from_str(value.trim()).expect("event JSON"));
            }
        }
        if let Some(data) = data {
            events.push((id, data));
        }
    }
    events
}

/// What a kill then a resume may ask the model again (`spec/durability.md`, "When the
/// journal commits"): every prompt of `expected` was asked; only a suffix of `before`
/// (what was asked before the kill: the call in flight, and answers the group commit
/// had not yet made durable) was asked again, each at most twice; `first` exactly once.
pub fn check_asked_again(prompts: &[String], before: &[String], expected: &[String], first: &str) {
    let mut counts: std::collections::HashMap<&str, usize> = Default::default();
    for prompt in prompts {
        *counts.entry(prompt.as_str()).or_default() += 1;
    }
    let mut distinct: Vec<&str> = counts.keys().copied().collect();
    distinct.sort();
    let mut expected: Vec<&str> = expected.iter().map(String::as_str).collect();
    expected.sort();
    assert_eq!(distinct, expected, "{prompts:?}");
    let repeated: Vec<&str> = counts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(p, _)| *p)
        .collect();
    assert!(counts.values().all(|n| *n <= 2), "{prompts:?}");
    let tail = &before[before.len().saturating_sub(repeated.len())..];
    for prompt in &repeated {
        assert!(
            tail.iter().any(|p| p == prompt),
            "{prompt} repeated: {prompts:?}"
        );
    }
    assert_eq!(counts.get(first), Some(&1), "{prompts:?}");
}

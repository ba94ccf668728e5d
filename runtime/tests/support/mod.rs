//! A scripted HTTP/1.1 server on 127.0.0.1 for the provider tests.
//!
//! Each request gets the next scripted [`Reply`] and is recorded (method, path, headers,
//! body) for the test to assert on. One request per connection (`Connection: close`), so
//! the order of replies is the order of requests. Only what the tests need: no chunked
//! request bodies, no keep-alive, no TLS. [`Reply::Stream`] answers with an event
//! stream, chunk by chunk, and [`run_agent`] runs one agent through a provider with its
//! events, for the streaming tests.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aplc_runtime::driver::{Provider, Toolbox, run_with_listener};
use aplc_vm::tools::ToolSpec;
use aplc_vm::{Event, EventKind, Program, RunOptions, RunOutcome};
use serde_json::{Value as Json, json};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// What the server does with one request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// Answers with this status, these extra headers and this body.
    Respond {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    /// Reads the request and never answers (the connection stays open).
    Hang,
    /// Reads the request and closes the connection without a word.
    Close,
    /// Answers 200 with a chunked `text/event-stream` body: each piece is one HTTP
    /// chunk, written and flushed in turn; then ends as `end` says.
    Stream {
        pieces: Vec<Vec<u8>>,
        end: StreamEnd,
    },
}

/// How a [`Reply::Stream`] ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEnd {
    /// The last chunk, then the connection closes: a complete body.
    Finish,
    /// The connection closes without the last chunk: a body cut short.
    Drop,
    /// Nothing more is sent, and the connection stays open: a stalled stream.
    Hang,
}

impl Reply {
    /// A JSON body with `status`.
    pub fn json(status: u16, body: serde_json::Value) -> Reply {
        Reply::text(status, &body.to_string())
    }

    /// Any body with `status`.
    pub fn text(status: u16, body: &str) -> Reply {
        Reply::Respond {
            status,
            headers: Vec::new(),
            body: body.to_owned(),
        }
    }

    /// A minimal valid chat completion whose assistant text is `text`.
    pub fn completion(text: &str) -> Reply {
        Reply::json(
            200,
            serde_json::json!({
                "id": "chatcmpl-test",
                "object": "chat.completion",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            }),
        )
    }

    /// A complete event stream of `body`, cut into pieces of `size` bytes (so events,
    /// lines and characters are split across chunks).
    pub fn stream(body: &str, size: usize) -> Reply {
        Reply::stream_then(body, size, StreamEnd::Finish)
    }

    /// [`Reply::stream`], ending as `end` says.
    pub fn stream_then(body: &str, size: usize, end: StreamEnd) -> Reply {
        Reply::Stream {
            pieces: body
                .as_bytes()
                .chunks(size.max(1))
                .map(<[u8]>::to_vec)
                .collect(),
            end,
        }
    }

    /// Adds a response header.
    pub fn header(mut self, name: &str, value: &str) -> Reply {
        if let Reply::Respond { headers, .. } = &mut self {
            headers.push((name.to_owned(), value.to_owned()));
        }
        self
    }
}

/// One request as the server received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    /// Names in lower case, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Recorded {
    /// The first header called `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("the request body is JSON")
    }
}

/// The running server; stops when dropped.
pub struct Server {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<Recorded>>>,
    task: JoinHandle<()>,
}

impl Server {
    /// Starts serving `replies` in order; once they run out, every request gets a 500.
    pub async fn start(replies: Vec<Reply>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("local address");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let recorded = requests.clone();
        let task = tokio::spawn(async move {
            let mut replies = replies.into_iter();
            // Connections of `Hang` replies, kept open until the server stops.
            let mut hanging = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                let reply = replies.next().unwrap_or_else(|| {
                    Reply::json(
                        500,
                        serde_json::json!({"error": {"message": "test server: no more replies"}}),
                    )
                });
                if let Some(stream) = serve(stream, reply, &recorded).await {
                    hanging.push(stream);
                }
            }
        });
        Server {
            addr,
            requests,
            task,
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The requests received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads one request, records it and answers as `reply` says. Returns the stream when it
/// must stay open.
async fn serve(
    stream: TcpStream,
    reply: Reply,
    recorded: &Mutex<Vec<Recorded>>,
) -> Option<BufReader<TcpStream>> {
    let mut stream = BufReader::new(stream);
    let request = read_request(&mut stream).await?;
    recorded.lock().unwrap().push(request);
    match reply {
        Reply::Hang => Some(stream),
        Reply::Close => None,
        Reply::Stream { pieces, end } => {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                        transfer-encoding: chunked\r\nconnection: close\r\n\r\n";
            let out = stream.get_mut();
            let _ = out.write_all(head.as_bytes()).await;
            for piece in pieces.iter().filter(|p| !p.is_empty()) {
                let _ = out
                    .write_all(format!("{:x}\r\n", piece.len()).as_bytes())
                    .await;
                let _ = out.write_all(piece).await;
                let _ = out.write_all(b"\r\n").await;
                let _ = out.flush().await;
            }
            match end {
                StreamEnd::Finish => {
                    let _ = out.write_all(b"0\r\n\r\n").await;
                    let _ = out.shutdown().await;
                    None
                }
                StreamEnd::Drop => {
                    let _ = out.shutdown().await;
                    None
                }
                StreamEnd::Hang => Some(stream),
            }
        }
        Reply::Respond {
            status,
            headers,
            body,
        } => {
            let mut head = format!(
                "HTTP/1.1 {status} Scripted\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\nconnection: close\r\n",
                body.len()
            );
            for (name, value) in headers {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
            head.push_str("\r\n");
            let stream = stream.get_mut();
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(body.as_bytes()).await;
            let _ = stream.shutdown().await;
            None
        }
    }
}

/// Reads the request line, the headers and a `content-length` body.
async fn read_request(stream: &mut BufReader<TcpStream>) -> Option<Recorded> {
    let mut line = String::new();
    stream.read_line(&mut line).await.ok()?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_owned();
    let path = parts.next()?.to_owned();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if stream.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':')?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    let length = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await.ok()?;
    Some(Recorded {
        method,
        path,
        headers,
        body,
    })
}

// ---------------------------------------------------------------------------------------
// Streaming: one agent run through a provider, with its events.

/// One step: the model answers with text and an `add` tool call, which runs.
const AGENT: &str = "# prompt: ask\n## user\nAdd 1 and 2, please.\n";

/// Runs [`AGENT`] with `provider` and an `add` tool, within `timeout`: the outcome and
/// every event the listener got.
pub async fn run_agent(provider: &dyn Provider, timeout: Duration) -> (RunOutcome, Vec<Event>) {
    let compiled = aplc_compiler::compile(AGENT, "stream.apl", &Default::default());
    let bundle = compiled.bundle.expect("the agent compiles");
    let program = Arc::new(Program::from_bundle(bundle, Default::default()).expect("loads"));
    let spec = ToolSpec::new(json!({
        "name": "add",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "number"}, "b": {"type": "number"}}},
    }))
    .expect("a valid descriptor");
    let mut toolbox = Toolbox::new();
    toolbox
        .register_fn(spec, |args, _| {
            let sum = args["a"].as_f64().unwrap_or(0.0) + args["b"].as_f64().unwrap_or(0.0);
            Ok(json!(sum))
        })
        .expect("registers");
    let options = RunOptions {
        timeout,
        ..RunOptions::default()
    };
    let mut events = Vec::new();
    let outcome = run_with_listener(program, options, provider, &toolbox, &mut |e: &Event| {
        events.push(e.clone())
    })
    .await;
    (outcome, events)
}

/// The final context without its times, to compare two runs.
pub fn final_context(outcome: &RunOutcome) -> Json {
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
    let mut json = outcome.context_json();
    strip(&mut json);
    json
}

/// Checks the `provider_delta` events of a run (each carries its call's `provider_call`
/// `seq` and counts from 0 within the call, and comes before the call's
/// `provider_result`; the other events' `seq`s have no gaps) and returns each call's
/// text, in order.
pub fn streamed_texts(events: &[Event]) -> Vec<String> {
    let mut texts: Vec<String> = Vec::new();
    let mut call: Option<u64> = None;
    let mut next_index = 0;
    let mut next_seq = 0;
    for event in events {
        match &event.kind {
            EventKind::ProviderDelta { index, text, .. } => {
                assert_eq!(Some(event.seq), call, "a delta carries its call's seq");
                assert_eq!(*index, next_index, "deltas count from 0 within a call");
                next_index += 1;
                texts.last_mut().expect("a call").push_str(text);
                continue;
            }
            EventKind::ProviderCall { .. } => {
                call = Some(event.seq);
                next_index = 0;
                texts.push(String::new());
            }
            EventKind::ProviderResult { .. } => call = None,
            _ => {}
        }
        assert_eq!(event.seq, next_seq, "no gaps in the other events' seq");
        next_seq += 1;
    }
    texts
}

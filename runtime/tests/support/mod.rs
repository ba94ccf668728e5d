//! A scripted HTTP/1.1 server on 127.0.0.1 for the provider tests.
//!
//! Each request gets the next scripted [`Reply`] and is recorded (method, path, headers,
//! body) for the test to assert on. One request per connection (`Connection: close`), so
//! the order of replies is the order of requests. Only what the tests need: no chunked
//! request bodies, no keep-alive, no TLS.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

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

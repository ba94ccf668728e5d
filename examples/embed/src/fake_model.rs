//! A tiny OpenAI-compatible chat server on 127.0.0.1, standing in for a real model.
//!
//! It answers `POST /v1/chat/completions` like a model that knows one trick: when it is
//! offered tools and the last user message names an order number but carries no
//! "Order details:", it calls the first tool with `{"order_id": <that number>}`;
//! otherwise it answers in text. One request per connection (`Connection: close`); no
//! TLS, chunked bodies or keep-alive: only what the example needs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value as Json, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The key the fake server expects, as `Authorization: Bearer <key>`.
pub const API_KEY: &str = "fake-key";

/// The running server; it stops when dropped.
pub struct FakeModel {
    addr: SocketAddr,
    requests: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl FakeModel {
    /// Binds a free port on 127.0.0.1 and starts serving.
    pub async fn start() -> std::io::Result<FakeModel> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let requests = Arc::new(AtomicUsize::new(0));
        let counter = requests.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::Relaxed);
                // Each connection on its own task: the agents call concurrently.
                tokio::spawn(async move {
                    // A broken connection only fails that one request.
                    let _ = serve(stream).await;
                });
            }
        });
        Ok(FakeModel {
            addr,
            requests,
            task,
        })
    }

    /// `http://127.0.0.1:<port>`, for `OpenAiConfig::base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How many requests the server has received.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::Relaxed)
    }
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads one request and answers it.
async fn serve(stream: TcpStream) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream);
    let mut request_line = String::new();
    reader.read_line(&mut request_line).await?;
    let mut content_length = 0usize;
    let mut authorized = false;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await? == 0 || line.trim_end().is_empty() {
            break;
        }
        if let Some((name, value)) = line.trim_end().split_once(':') {
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                content_length = value.parse().unwrap_or(0);
            } else if name.eq_ignore_ascii_case("authorization") {
                authorized = value == format!("Bearer {API_KEY}");
            }
        }
    }
    let mut body = vec![0; content_length.min(1 << 20)];
    reader.read_exact(&mut body).await?;

    let (status, reply) = if !request_line.starts_with("POST /v1/chat/completions ") {
        (404, json!({"error": {"message": "not found"}}))
    } else if !authorized {
        (401, json!({"error": {"message": "bad API key"}}))
    } else {
        match serde_json::from_slice::<Json>(&body) {
            Ok(request) => (200, complete(&request)),
            Err(e) => (400, json!({"error": {"message": e.to_string()}})),
        }
    };
    let body = reply.to_string();
    let head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        if status == 200 { "OK" } else { "Error" },
        body.len()
    );
    let mut stream = reader.into_inner();
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

/// The model's answer to one chat request.
fn complete(request: &Json) -> Json {
    let user = request["messages"]
        .as_array()
        .and_then(|messages| messages.iter().rev().find(|m| m["role"] == "user"))
        .map(|m| text_of(&m["content"]))
        .unwrap_or_default();
    let tool = request["tools"]
        .as_array()
        .and_then(|tools| tools.first())
        .and_then(|t| t["function"]["name"].as_str());
    let order = user
        .split(|c: char| !c.is_ascii_digit())
        .find(|digits| !digits.is_empty())
        .and_then(|digits| digits.parse::<u64>().ok());
    let message = match (tool, order) {
        (Some(tool), Some(order)) if !user.contains("Order details:") => json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [{
                "id": format!("call_{order}"),
                "type": "function",
                "function": {"name": tool, "arguments": json!({"order_id": order}).to_string()}
            }]
        }),
        _ => {
            let details = user
                .lines()
                .find_map(|line| line.strip_prefix("Order details: "))
                .unwrap_or("please send your order number.");
            json!({"role": "assistant", "content": format!("Thanks for waiting: {details}")})
        }
    };
    json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": request["model"],
        "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    })
}

/// A message's text: a string, or the text parts of a list of parts.
fn text_of(content: &Json) -> String {
    match content {
        Json::String(s) => s.clone(),
        Json::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

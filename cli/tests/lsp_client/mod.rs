//! A minimal LSP client for the tests: `aplc lsp` as a child process, JSON-RPC frames
//! (`Content-Length` headers) over its stdin and stdout, a reader thread that hands
//! every message to the test, and bounded waits for answers and notifications.

#![allow(dead_code)] // Each test binary uses part of it.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// How long any answer may take: generous, for a loaded 2-core machine.
pub const WAIT: Duration = Duration::from_secs(60);

pub struct Client {
    child: Child,
    stdin: ChildStdin,
    messages: Receiver<Value>,
    /// Notifications received while waiting for something else, oldest first.
    pending: Vec<Value>,
    next_id: i64,
    version: i64,
}

impl Client {
    /// Starts `aplc lsp` and initializes it.
    pub fn start(envs: &[(&str, &str)]) -> Client {
        let mut command = Command::new(env!("CARGO_BIN_EXE_aplc"));
        command
            .arg("lsp")
            .envs(envs.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = command.spawn().expect("start aplc lsp");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, messages) = channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            while let Some(message) = read_frame(&mut reader) {
                if tx.send(message).is_err() {
                    break;
                }
            }
        });
        let mut client = Client {
            child,
            stdin,
            messages,
            pending: Vec::new(),
            next_id: 0,
            version: 1,
        };
        let init = client.request(
            "initialize",
            json!({"processId": null, "rootUri": null, "capabilities": {}}),
        );
        assert!(init["result"]["capabilities"].is_object(), "{init}");
        client.notify("initialized", json!({}));
        client
    }

    pub fn notify(&mut self, method: &str, params: Value) {
        self.write(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    /// Sends a request and waits for its response (the whole response object).
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.write(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        self.wait(&format!("the answer to {method}"), |m| m["id"] == json!(id))
    }

    /// The result of a request that must succeed.
    pub fn result(&mut self, method: &str, params: Value) -> Value {
        let response = self.request(method, params);
        assert!(
            response.get("error").is_none(),
            "{method} failed: {response}"
        );
        response["result"].clone()
    }

    /// Opens `text` as document `uri`.
    pub fn open(&mut self, uri: &str, text: &str) {
        self.notify(
            "textDocument/didOpen",
            json!({"textDocument": {"uri": uri, "languageId": "aplc", "version": 1, "text": text}}),
        );
    }

    /// Waits for the diagnostics of `uri` at `version`.
    pub fn diagnostics(&mut self, uri: &str, version: i64) -> Vec<Value> {
        let found = self.wait(&format!("diagnostics of {uri} v{version}"), |m| {
            m["method"] == "textDocument/publishDiagnostics"
                && m["params"]["uri"] == uri
                && m["params"]["version"] == json!(version)
        });
        found["params"]["diagnostics"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Waits for a message that `matches`, keeping the others for later waits.
    pub fn wait(&mut self, what: &str, matches: impl Fn(&Value) -> bool) -> Value {
        if let Some(i) = self.pending.iter().position(&matches) {
            return self.pending.remove(i);
        }
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.messages.recv_timeout(left) {
                Ok(m) if matches(&m) => return m,
                Ok(m) => self.pending.push(m),
                Err(RecvTimeoutError::Timeout) => panic!("timed out waiting for {what}"),
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("aplc lsp exited while waiting for {what}")
                }
            }
        }
    }

    /// True when a message already received and not yet taken matches.
    pub fn pending_has(&mut self, matches: impl Fn(&Value) -> bool) -> bool {
        while let Ok(m) = self.messages.try_recv() {
            self.pending.push(m);
        }
        self.pending.iter().any(matches)
    }

    /// A fresh document version for the next change (2, 3, …).
    pub fn next_version(&mut self) -> i64 {
        self.version += 1;
        self.version
    }

    /// Shuts the server down as a client does; it must exit with success.
    pub fn shutdown(mut self) {
        let answer = self.request("shutdown", Value::Null);
        assert_eq!(answer["result"], Value::Null, "{answer}");
        self.notify("exit", Value::Null);
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                assert!(status.success(), "aplc lsp exited with {status}");
                return;
            }
            assert!(Instant::now() < deadline, "aplc lsp did not exit");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Writes raw bytes to the server, framing and all.
    pub fn write_raw(&mut self, bytes: &[u8]) {
        self.stdin.write_all(bytes).expect("write to aplc lsp");
        self.stdin.flush().expect("flush");
    }

    fn write(&mut self, message: &Value) {
        let body = message.to_string();
        let frame = format!("Content-Length: {}\r\n\r\n{body}", body.len());
        self.write_raw(frame.as_bytes());
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // A test that failed midway leaves no server behind.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn read_frame(reader: &mut impl BufRead) -> Option<Value> {
    let mut length = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some(n) = line.strip_prefix("Content-Length: ") {
            length = n.parse::<usize>().ok();
        }
    }
    let mut body = vec![0; length?];
    reader.read_exact(&mut body).ok()?;
    serde_json::from_slice(&body).ok()
}

/// The UTF-16 position of byte `offset` in `text`, computed independently of the server.
pub fn position(text: &str, offset: usize) -> Value {
    let before = &text[..offset];
    let line = before.matches('\n').count();
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    json!({"line": line, "character": before[start..].encode_utf16().count()})
}

/// The position of the `nth` (0-based) occurrence of `needle` in `text`, plus `delta`
/// bytes.
pub fn at(text: &str, needle: &str, nth: usize, delta: usize) -> Value {
    let offset = text
        .match_indices(needle)
        .nth(nth)
        .unwrap_or_else(|| panic!("`{needle}` #{nth} not in the fixture"))
        .0;
    position(text, offset + delta)
}

/// A document URI for a file name.
pub fn uri(name: &str) -> String {
    format!("file:///work/{name}")
}

/// The byte offset of the UTF-16 `position` in `text` (the inverse of [`position`]),
/// as a client applying an edit computes it.
pub fn offset(text: &str, position: &Value) -> usize {
    let (Some(line), Some(character)) = (position["line"].as_u64(), position["character"].as_u64())
    else {
        panic!("not a position: {position}");
    };
    let start: usize = text
        .split_inclusive('\n')
        .take(line as usize)
        .map(str::len)
        .sum();
    let mut units = 0;
    for (i, c) in text[start..].char_indices() {
        if units >= character as usize || c == '\n' {
            return start + i;
        }
        units += c.len_utf16();
    }
    text.len()
}

/// `text` with one LSP `TextEdit` applied.
pub fn apply(text: &str, edit: &Value) -> String {
    let start = offset(text, &edit["range"]["start"]);
    let end = offset(text, &edit["range"]["end"]);
    let mut out = text.to_string();
    out.replace_range(start..end, edit["newText"].as_str().expect("newText"));
    out
}

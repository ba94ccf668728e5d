//! Tool manifests (`aplc run --tools tools.json`) and the two kinds of tool they declare:
//! subprocess commands and HTTP endpoints (feature `driver`; HTTP tools need `http`).
//!
//! ```json
//! {
//!   "calc":    {"command": ["python3", "calc.py"], "cwd": ".", "descriptor": {...},
//!               "with_context": false, "timeout_ms": 30000,
//!               "idempotent": {"key": "auto", "ttl_ms": 60000}},
//!   "weather": {"url": "http://127.0.0.1:8080/weather", "descriptor": {...}}
//! }
//! ```
//!
//! A command runs in `cwd` when given (relative to the manifest's folder), else in the
//! current directory. Both kinds receive `{"arguments": {...}}` as JSON, plus `"context": {...}` when
//! `with_context` is true. The manifest is the only place tools come from on the
//! command line; it never contains secrets, and nothing from it is printed but names.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value as Json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::driver::{BoxFuture, Tool, Toolbox};
use crate::tools::{Idempotency, IdempotencyKey, ToolInvocation, ToolSpec};

/// Default time a tool may take.
pub const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_millis(30_000);
/// The most a command tool may write to stdout, and to stderr.
pub const MAX_TOOL_OUTPUT: usize = 1024 * 1024;

/// One manifest entry, as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    command: Option<Vec<String>>,
    cwd: Option<PathBuf>,
    url: Option<String>,
    descriptor: Json,
    #[serde(default)]
    with_context: bool,
    timeout_ms: Option<u64>,
    idempotent: Option<IdempotentEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IdempotentEntry {
    key: KeyEntry,
    ttl_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum KeyEntry {
    Word(String),
    Params(Vec<String>),
}

/// Builds a toolbox from a JSON manifest: an object from tool name to entry. `base` is the
/// manifest's folder, against which a relative `cwd` is resolved.
pub fn toolbox_from_manifest(text: &str, base: &Path) -> Result<Toolbox, String> {
    let raw: serde_json::Map<String, Json> =
        serde_json::from_str(text).map_err(|e| format!("invalid tool manifest: {e}"))?;
    let mut toolbox = Toolbox::new();
    for (name, value) in raw {
        let entry: Entry =
            serde_json::from_value(value).map_err(|e| format!("tool `{name}`: {e}"))?;
        let (spec, tool) =
            entry_tool(&name, entry, base).map_err(|e| format!("tool `{name}`: {e}"))?;
        toolbox.register(spec, tool)?;
    }
    Ok(toolbox)
}

fn entry_tool(name: &str, entry: Entry, base: &Path) -> Result<(ToolSpec, Arc<dyn Tool>), String> {
    let mut descriptor = entry.descriptor;
    match descriptor.get("name") {
        None => {
            if let Json::Object(map) = &mut descriptor {
                map.insert("name".into(), Json::String(name.to_string()));
            }
        }
        Some(Json::String(n)) if n == name => {}
        Some(other) => {
            return Err(format!(
                "`descriptor.name` is {other}, but the manifest key is `{name}`"
            ));
        }
    }
    let mut spec = ToolSpec::new(descriptor)?.with_context(entry.with_context);
    if let Some(idem) = entry.idempotent {
        let key = match idem.key {
            KeyEntry::Word(w) if w == "auto" => IdempotencyKey::Auto,
            KeyEntry::Word(w) => {
                return Err(format!(
                    "`idempotent.key` must be \"auto\" or a list of parameter names, found \"{w}\""
                ));
            }
            KeyEntry::Params(p) if p.is_empty() => {
                return Err("`idempotent.key` lists no parameters".into());
            }
            KeyEntry::Params(p) => IdempotencyKey::Params(p),
        };
        spec = spec.idempotent(Idempotency {
            key,
            ttl: idem.ttl_ms.map(Duration::from_millis),
        });
    }
    let timeout = entry
        .timeout_ms
        .map(Duration::from_millis)
        .unwrap_or(DEFAULT_TOOL_TIMEOUT);
    let tool: Arc<dyn Tool> = match (entry.command, entry.url) {
        (Some(argv), None) => {
            if argv.first().is_none_or(|p| p.is_empty()) {
                return Err("`command` must start with a program".into());
            }
            let cwd = entry.cwd.map(|dir| base.join(dir));
            Arc::new(CommandTool { argv, cwd, timeout })
        }
        (None, Some(_)) if entry.cwd.is_some() => {
            return Err("`cwd` applies to `command` tools only".into());
        }
        (None, Some(url)) => http_tool(url, timeout)?,
        _ => return Err("give exactly one of `command` or `url`".into()),
    };
    Ok((spec, tool))
}

/// The JSON a tool receives.
fn request_body(invocation: &ToolInvocation) -> Json {
    let mut body = serde_json::Map::new();
    body.insert("arguments".into(), invocation.arguments.clone());
    if let Some(context) = &invocation.context {
        body.insert("context".into(), context.clone());
    }
    Json::Object(body)
}

/// A subprocess: argv spawned directly (no shell), the request on stdin, the result on
/// stdout.
#[derive(Debug)]
pub struct CommandTool {
    argv: Vec<String>,
    cwd: Option<PathBuf>,
    timeout: Duration,
}

impl CommandTool {
    /// A command tool running `argv` (in `cwd`, if given) with a per-call timeout.
    pub fn new(argv: Vec<String>, cwd: Option<PathBuf>, timeout: Duration) -> CommandTool {
        CommandTool { argv, cwd, timeout }
    }

    async fn run(&self, invocation: &ToolInvocation) -> Result<Json, String> {
        let program = &self.argv[0];
        let mut command = tokio::process::Command::new(program);
        if let Some(dir) = &self.cwd {
            command.current_dir(dir);
        }
        let mut child = command
            .args(&self.argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start `{program}`: {e}"))?;
        let input = serde_json::to_vec(&request_body(invocation)).unwrap_or_default();
        let (Some(mut stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err("cannot connect to the tool's standard streams".into());
        };
        let write = async move {
            // A tool that exits without reading its input is not an error here: its exit
            // status says how it went.
            let _ = stdin.write_all(&input).await;
            drop(stdin);
        };
        let work = async {
            let ((), out, err, status) =
                tokio::join!(write, capped(stdout), capped(stderr), child.wait());
            (out, err, status)
        };
        let (out, err, status) = match tokio::time::timeout(self.timeout, work).await {
            Ok(done) => done,
            Err(_) => {
                let _ = child.kill().await;
                return Err(format!(
                    "timed out after {} ms and was killed",
                    self.timeout.as_millis()
                ));
            }
        };
        let status = status.map_err(|e| format!("cannot wait for `{program}`: {e}"))?;
        let (out, err) = (out?, err?);
        if !status.success() {
            let code = status
                .code()
                .map(|c| format!("exit status {c}"))
                .unwrap_or_else(|| "a signal".to_string());
            let stderr = String::from_utf8_lossy(&err);
            let stderr = stderr.trim();
            return Err(if stderr.is_empty() {
                format!("`{program}` failed with {code}")
            } else {
                format!("`{program}` failed with {code}: {}", excerpt(stderr))
            });
        }
        let text = String::from_utf8_lossy(&out);
        Ok(serde_json::from_str(text.trim())
            .unwrap_or_else(|_| Json::String(text.trim_end().to_string())))
    }
}

impl Tool for CommandTool {
    fn call<'a>(&'a self, invocation: &'a ToolInvocation) -> BoxFuture<'a, Result<Json, String>> {
        Box::pin(self.run(invocation))
    }
}

/// Reads a stream to its end, failing once it passes [`MAX_TOOL_OUTPUT`].
async fn capped(stream: impl tokio::io::AsyncRead + Unpin) -> Result<Vec<u8>, String> {
    let mut buf = Vec::new();
    let mut limited = stream.take(MAX_TOOL_OUTPUT as u64 + 1);
    limited
        .read_to_end(&mut buf)
        .await
        .map_err(|e| format!("cannot read the tool's output: {e}"))?;
    if buf.len() > MAX_TOOL_OUTPUT {
        return Err(format!("the tool wrote more than {MAX_TOOL_OUTPUT} bytes"));
    }
    Ok(buf)
}

/// The start of a long message, for error texts.
fn excerpt(text: &str) -> String {
    const MAX: usize = 2000;
    if text.len() <= MAX {
        return text.to_string();
    }
    let mut end = MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &text[..end], text.len())
}

#[cfg(feature = "http")]
fn http_tool(url: String, timeout: Duration) -> Result<Arc<dyn Tool>, String> {
    let parsed = reqwest::Url::parse(&url).map_err(|e| format!("invalid `url`: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!(
            "`url` must be http or https, found {}",
            parsed.scheme()
        ));
    }
    Ok(Arc::new(HttpTool {
        url: parsed,
        client: crate::manifest::http::client(timeout)?,
    }))
}

#[cfg(not(feature = "http"))]
fn http_tool(_url: String, _timeout: Duration) -> Result<Arc<dyn Tool>, String> {
    Err("HTTP tools need aplc-vm's `http` feature".into())
}

/// An HTTP endpoint: the request is POSTed as JSON; a 2xx response's body is the result.
#[cfg(feature = "http")]
#[derive(Debug)]
pub struct HttpTool {
    url: reqwest::Url,
    client: reqwest::Client,
}

#[cfg(feature = "http")]
impl HttpTool {
    async fn run(&self, invocation: &ToolInvocation) -> Result<Json, String> {
        let response = self
            .client
            .post(self.url.clone())
            .json(&request_body(invocation))
            .send()
            .await
            .map_err(|e| {
                if e.is_timeout() {
                    "the request timed out".to_string()
                } else {
                    format!("request failed: {}", e.without_url())
                }
            })?;
        let status = response.status();
        let body = response
            .text()
            .await
            .map_err(|e| format!("cannot read the response: {}", e.without_url()))?;
        if !status.is_success() {
            return Err(format!("HTTP {status}: {}", excerpt(body.trim())));
        }
        Ok(serde_json::from_str(&body).unwrap_or(Json::String(body)))
    }
}

#[cfg(feature = "http")]
impl Tool for HttpTool {
    fn call<'a>(&'a self, invocation: &'a ToolInvocation) -> BoxFuture<'a, Result<Json, String>> {
        Box::pin(self.run(invocation))
    }
}

#[cfg(feature = "http")]
mod http {
    use std::time::Duration;

    /// A reqwest client on rustls with the `ring` provider.
    pub(super) fn client(timeout: Duration) -> Result<reqwest::Client, String> {
        // Installing the process-wide provider fails if one is installed already; then
        // that one is used, which is just as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
        reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| format!("cannot build an HTTP client: {e}"))
    }
}

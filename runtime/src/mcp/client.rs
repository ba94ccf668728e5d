//! The MCP client (feature `mcp`): stdio servers started as child processes on rmcp,
//! the official Rust SDK, streamable-HTTP servers connected to (`http.rs`), and their
//! tools as [`Tool`]s.
//!
//! Everything a server sends is outside input: results are mapped through their JSON
//! form (never unwrapped), listing is bounded in pages and tools, and the SDK's line
//! reader refuses a message past its 16 MiB line limit. A server's stderr is kept only as
//! a short tail, for the message of a server that fails to start.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aplc_vm::tools::{Idempotency, IdempotencyKey, ToolInvocation, ToolOrigin, ToolSpec};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;
use serde_json::Value as Json;
use tokio::io::AsyncReadExt;

use super::progress::{self, Service};
use super::{McpError, McpServer, McpTransport};
use crate::future::BoxFuture;
use crate::native::{ProgressSink, Tool};
use crate::process::ProcessGroup;
use crate::redact::Redactor;

/// This build has an MCP client.
pub(crate) const ENABLED: bool = true;

/// How much of a server's stderr is kept (its end), for error messages.
const STDERR_TAIL: usize = 2000;

/// One running server: its session and its process group (none over HTTP), killed when
/// this is dropped (when the last of its tools is), so no child outlives the toolbox.
pub(crate) struct McpSessions {
    server: String,
    service: Service,
    _group: ProcessGroup,
}

/// A tool of a running server.
struct McpTool {
    session: Arc<McpSessions>,
    /// The server's name for it (without the prefix).
    remote: String,
    timeout: Duration,
}

/// Starts every server in order, each within its `startup_timeout`, and returns its tools:
/// `(server, descriptor, implementation)`. The first server that fails is the error; the
/// ones already started stop when their tools are dropped.
pub(crate) async fn start(
    servers: &[McpServer],
    hidden_env: &[String],
    redactor: &Redactor,
) -> Result<Vec<(String, ToolSpec, Arc<dyn Tool>)>, McpError> {
    let mut all = Vec::new();
    for server in servers {
        all.extend(start_one(server, hidden_env, redactor).await?.1);
    }
    Ok(all)
}

/// Starts one server: its session (which the supervisor of `aplc serve` watches) and
/// its tools, as [`start`] gives them.
pub(crate) async fn start_one(
    server: &McpServer,
    hidden_env: &[String],
    redactor: &Redactor,
) -> Result<Started, McpError> {
    let fail = |message: String| McpError::Start {
        server: server.name.clone(),
        message: redactor.redact(&message),
    };
    let (url, headers_env) = match &server.transport {
        McpTransport::Http { url, headers_env } => (url, headers_env),
        McpTransport::Stdio { command, args, env } => {
            return start_stdio(server, command, args, env, hidden_env, redactor).await;
        }
    };
    let (service, listed) = super::http::connect(server, url, headers_env, redactor).await?;
    offer(server, service, listed, ProcessGroup(None), &fail)
}

/// Spawns a stdio server in its own process group, initializes it and lists its tools
/// within its `startup_timeout` (a failure carries the end of its stderr); its tools.
async fn start_stdio(
    server: &McpServer,
    command: &str,
    args: &[String],
    env: &[(String, String)],
    hidden_env: &[String],
    redactor: &Redactor,
) -> Result<Started, McpError> {
    let fail = |message: String| McpError::Start {
        server: server.name.clone(),
        message: redactor.redact(&message),
    };
    let mut cmd = tokio::process::Command::new(command);
    cmd.args(args);
    for name in hidden_env {
        cmd.env_remove(name);
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    cmd.kill_on_drop(true);
    // Its own process group, as command tools: the processes it starts die with it, and
    // the terminal's Ctrl-C reaches aplc, which stops it.
    #[cfg(unix)]
    cmd.process_group(0);
    let (transport, stderr) = TokioChildProcess::builder(cmd)
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| fail(format!("cannot start `{command}`: {e}")))?;
    let group = ProcessGroup(transport.id());
    let tail = Arc::new(Mutex::new(Vec::new()));
    let reading = stderr.map(|stderr| tokio::spawn(keep_tail(stderr, tail.clone())));
    let with_tail = |message: String| {
        let tail = tail.lock().map(|t| t.clone()).unwrap_or_default();
        let tail = String::from_utf8_lossy(&tail);
        let tail = tail.trim();
        if tail.is_empty() {
            fail(message)
        } else {
            fail(format!("{message}; its stderr ends with: {tail}"))
        }
    };
    let startup = async {
        let service = progress::Client::default()
            .serve(transport)
            .await
            .map_err(|e| format!("did not initialize: {e}"))?;
        let tools = super::listing::list_tools(&service).await?;
        Ok::<_, String>((service, tools))
    };
    let (service, listed) = match tokio::time::timeout(server.startup_timeout, startup).await {
        Ok(Ok(started)) => started,
        Ok(Err(message)) => {
            stopped(&group, reading).await;
            return Err(with_tail(message));
        }
        Err(_) => {
            stopped(&group, reading).await;
            return Err(with_tail(format!(
                "did not start, initialize and list its tools within {} ms \
                 (`startup_timeout_ms`)",
                server.startup_timeout.as_millis()
            )));
        }
    };
    offer(server, service, listed, group, &fail)
}

/// A started server's tools, filtered by its `tools`.
fn offer(
    server: &McpServer,
    service: Service,
    listed: Vec<Json>,
    group: ProcessGroup,
    fail: &dyn Fn(String) -> McpError,
) -> Result<Started, McpError> {
    let session = Arc::new(McpSessions {
        server: server.name.clone(),
        service,
        _group: group,
    });
    if let Some(wanted) = &server.tools
        && let Some(missing) = wanted.iter().find(|w| {
            !listed
                .iter()
                .any(|t| t.get("name").and_then(Json::as_str) == Some(w))
        })
    {
        return Err(McpError::UnknownTool {
            server: server.name.clone(),
            tool: missing.clone(),
        });
    }
    let mut tools: Vec<(String, ToolSpec, Arc<dyn Tool>)> = Vec::new();
    for tool in listed {
        let Some(remote) = tool.get("name").and_then(Json::as_str) else {
            return Err(fail("`tools/list` gave a tool without a name".into()));
        };
        if server
            .tools
            .as_ref()
            .is_some_and(|wanted| !wanted.iter().any(|w| w == remote))
        {
            continue;
        }
        let name = format!("{}{remote}", server.prefix);
        let mut descriptor = serde_json::Map::new();
        descriptor.insert("name".into(), Json::String(name.clone()));
        if let Some(description) = tool.get("description").filter(|d| d.is_string()) {
            descriptor.insert("description".into(), description.clone());
        }
        if let Some(schema) = tool.get("inputSchema") {
            descriptor.insert("parameters".into(), schema.clone());
        }
        let mut spec = ToolSpec::new(Json::Object(descriptor))
            .map_err(|error| McpError::Descriptor {
                server: server.name.clone(),
                tool: name.clone(),
                error,
            })?
            .with_origin(ToolOrigin::Mcp {
                server: server.name.clone(),
            });
        if server.approval.includes(remote) {
            spec = spec.requires_approval(aplc_vm::tools::Approval {
                timeout: server.approval_timeout,
            });
        }
        if server.idempotent.includes(remote, tool.get("annotations")) {
            spec = spec.idempotent(Idempotency {
                key: IdempotencyKey::Auto,
                ttl: None,
            });
        }
        let implementation = McpTool {
            session: session.clone(),
            remote: remote.to_owned(),
            timeout: server.timeout,
        };
        tools.push((server.name.clone(), spec, Arc::new(implementation)));
    }
    Ok((session, tools))
}

impl McpSessions {
    /// True once the session has ended: the server exited or closed its stdout (the
    /// SDK's loop stopped reading). The supervisor of `aplc serve` restarts it then.
    pub(crate) fn closed(&self) -> bool {
        self.service.peer().is_transport_closed()
    }
}

/// Kills a server that failed to start and gives the reader of its stderr a moment to
/// take what the server wrote last (its stderr closes with the group).
async fn stopped(group: &ProcessGroup, reading: Option<tokio::task::JoinHandle<()>>) {
    group.kill();
    if let Some(reading) = reading {
        let _ = tokio::time::timeout(Duration::from_millis(500), reading).await;
    }
}

/// Reads a server's stderr to its end, keeping the last [`STDERR_TAIL`] bytes.
async fn keep_tail(mut stderr: tokio::process::ChildStderr, tail: Arc<Mutex<Vec<u8>>>) {
    let mut chunk = [0u8; 4096];
    while let Ok(n) = stderr.read(&mut chunk).await {
        if n == 0 {
            return;
        }
        let Ok(mut tail) = tail.lock() else { return };
        tail.extend_from_slice(&chunk[..n]);
        let excess = tail.len().saturating_sub(STDERR_TAIL);
        tail.drain(..excess);
    }
}

impl McpTool {
    async fn run(
        &self,
        invocation: &ToolInvocation,
        progress: Option<&ProgressSink>,
    ) -> Result<Json, String> {
        let mut params = CallToolRequestParams::new(self.remote.clone());
        params.arguments = match &invocation.arguments {
            Json::Object(map) => Some(map.clone()),
            _ => None,
        };
        // Dropping the request on a timeout sends `notifications/cancelled`.
        let call = progress::call_tool(&self.session.service, params, progress);
        let result = match tokio::time::timeout(self.timeout, call).await {
            Err(_) => {
                return Err(format!(
                    "timed out after {} ms (MCP server `{}`; the call was cancelled)",
                    self.timeout.as_millis(),
                    self.session.server
                ));
            }
            Ok(Err(e)) => {
                let e = super::http::call_error(&e);
                return Err(format!("MCP server `{}`: {e}", self.session.server));
            }
            Ok(Ok(result)) => result,
        };
        let result = serde_json::to_value(&result).map_err(|e| {
            format!(
                "MCP server `{}`: unreadable result: {e}",
                self.session.server
            )
        })?;
        map_result(&result)
    }
}

impl Tool for McpTool {
    fn call<'a>(&'a self, invocation: &'a ToolInvocation) -> BoxFuture<'a, Result<Json, String>> {
        Box::pin(self.run(invocation, None))
    }

    fn call_with_progress<'a>(
        &'a self,
        invocation: &'a ToolInvocation,
        progress: Option<&'a ProgressSink>,
    ) -> BoxFuture<'a, Result<Json, String>> {
        Box::pin(self.run(invocation, progress))
    }
}

/// A `tools/call` result as the run sees it: `structuredContent` if present, else the
/// text contents joined by newlines (with other contents, a list of items where images,
/// audio and resources are small descriptors with their MIME types, never their data);
/// `isError: true` is a failure whose message is the text.
pub(crate) fn map_result(result: &Json) -> Result<Json, String> {
    let content = result
        .get("content")
        .and_then(Json::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let texts: Vec<&str> = content
        .iter()
        .filter_map(|c| c.get("text").and_then(Json::as_str))
        .collect();
    if result.get("isError").and_then(Json::as_bool) == Some(true) {
        let text = texts.join("\n");
        return Err(if text.trim().is_empty() {
            "the MCP tool reported an error without a message".to_string()
        } else {
            text
        });
    }
    if let Some(structured) = result.get("structuredContent").filter(|s| !s.is_null()) {
        return Ok(structured.clone());
    }
    if texts.len() == content.len() {
        return Ok(Json::String(texts.join("\n")));
    }
    Ok(Json::Array(content.iter().map(descriptor).collect()))
}

/// A content item, small: text kept, anything else by its type, MIME type and URI.
fn descriptor(item: &Json) -> Json {
    let kind = item.get("type").and_then(Json::as_str).unwrap_or("unknown");
    if kind == "text" {
        return item.clone();
    }
    let mut small = serde_json::Map::new();
    small.insert("type".into(), Json::String(kind.to_owned()));
    let resource = item.get("resource");
    for key in ["mimeType", "uri", "name"] {
        if let Some(value) = item
            .get(key)
            .or_else(|| resource.and_then(|r| r.get(key)))
            .filter(|v| v.is_string())
        {
            small.insert(key.into(), value.clone());
        }
    }
    Json::Object(small)
}

/// One started server: its session, and its tools as `(server, descriptor,
/// implementation)`.
pub(crate) type Started = (Arc<McpSessions>, Vec<(String, ToolSpec, Arc<dyn Tool>)>);

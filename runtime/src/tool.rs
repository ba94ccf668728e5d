//! The tool side of a run: the [`Toolbox`] of a run's tools (the [`Tool`] trait is in
//! `native.rs`, a leaf that MCP's and the manifest's tools share).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use aplc_vm::tools::{ToolInvocation, ToolRegistry, ToolSpec, ToolSpecError};
use serde_json::Value as Json;

use crate::future::BoxFuture;
pub use crate::native::{ProgressSink, Tool};
use crate::redact::Redactor;
use crate::session::{RunClock, Stopped, ToolRunner};

/// The longest progress message an event carries, in characters.
pub const PROGRESS_MESSAGE_CHARS: usize = 1000;

/// A tool written as an async closure: `|arguments, context| async move { … }`.
struct FnTool<F>(F);

impl<F, Fut> Tool for FnTool<F>
where
    F: Fn(Json, Option<Json>) -> Fut + Send + Sync,
    Fut: Future<Output = Result<Json, String>> + Send + 'static,
{
    fn call<'a>(&'a self, invocation: &'a ToolInvocation) -> BoxFuture<'a, Result<Json, String>> {
        Box::pin((self.0)(
            invocation.arguments.clone(),
            invocation.context.clone(),
        ))
    }
}

/// The tools of a run: descriptors (for the machine) and implementations (for the driver).
#[derive(Default, Clone)]
pub struct Toolbox {
    /// Shared with every run's options: registering copies it only while a run holds it.
    registry: Arc<ToolRegistry>,
    tools: HashMap<String, Arc<dyn Tool>>,
    /// Applied to every result and error message before the machine sees it.
    redactor: Redactor,
    /// MCP servers of the manifest not started yet ([`Toolbox::start_mcp`]), and the
    /// variables their children do not inherit.
    pending_mcp: Arc<(Vec<crate::mcp::McpServer>, Vec<String>)>,
}

impl std::fmt::Debug for Toolbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Toolbox")
            .field("registry", &self.registry)
            .finish_non_exhaustive()
    }
}

impl Toolbox {
    /// No tools.
    pub fn new() -> Toolbox {
        Toolbox::default()
    }

    /// Registers a tool implementation under its descriptor.
    pub fn register(&mut self, spec: ToolSpec, tool: Arc<dyn Tool>) -> Result<(), ToolSpecError> {
        let name = spec.name().to_string();
        Arc::make_mut(&mut self.registry).register(spec)?;
        self.tools.insert(name, tool);
        Ok(())
    }

    /// Registers an async closure `|arguments, context| async move { … }`.
    pub fn register_async<F, Fut>(&mut self, spec: ToolSpec, f: F) -> Result<(), ToolSpecError>
    where
        F: Fn(Json, Option<Json>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Json, String>> + Send + 'static,
    {
        self.register(spec, Arc::new(FnTool(f)))
    }

    /// Registers a plain closure `|arguments, context| -> Result<Json, String>`.
    pub fn register_fn<F>(&mut self, spec: ToolSpec, f: F) -> Result<(), ToolSpecError>
    where
        F: Fn(Json, Option<Json>) -> Result<Json, String> + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        self.register_async(spec, move |args, ctx| {
            let f = f.clone();
            async move { f(args, ctx) }
        })
    }

    /// Declares MCP servers whose tools [`Toolbox::start_mcp`] will register; their
    /// children run without the variables `hidden_env` names (the secrets), as command
    /// tools do.
    pub fn add_mcp_servers(
        &mut self,
        servers: Vec<crate::mcp::McpServer>,
        hidden_env: Vec<String>,
    ) {
        let pending = Arc::make_mut(&mut self.pending_mcp);
        pending.0.extend(servers);
        pending.1 = hidden_env;
    }

    /// The MCP servers declared and not started yet.
    pub fn pending_mcp_servers(&self) -> &[crate::mcp::McpServer] {
        &self.pending_mcp.0
    }

    /// Starts the MCP servers declared ([`Toolbox::add_mcp_servers`]; a manifest's
    /// `mcpServers`): each is started, initialized and listed, and its tools are
    /// registered like any other, so every check of a call applies to them. The servers
    /// stop when the last clone of this toolbox holding their tools is dropped. Must run
    /// on the tokio runtime that will run the calls. Nothing to do without servers.
    pub async fn start_mcp(&mut self) -> Result<(), crate::mcp::McpError> {
        if self.pending_mcp.0.is_empty() {
            return Ok(());
        }
        let (servers, hidden) = (*self.pending_mcp).clone();
        let started = crate::mcp::start(&servers, &hidden, &self.redactor).await?;
        self.register_mcp(started)
    }

    /// [`Toolbox::start_mcp`] for a host that outlives its runs (`aplc serve`): the
    /// servers are started once and supervised (spec/mcp.md, "Hosts that live long"),
    /// so a server whose child dies is restarted with backoff while this toolbox's
    /// clones keep offering the tools of the first start. `listener` hears each
    /// restart. The servers stop when the returned host is stopped or dropped.
    pub async fn start_mcp_supervised(
        &mut self,
        listener: crate::mcp::McpListener,
    ) -> Result<crate::mcp::McpHost, crate::mcp::McpError> {
        if self.pending_mcp.0.is_empty() {
            return Ok(crate::mcp::McpHost::default());
        }
        let (servers, hidden) = (*self.pending_mcp).clone();
        let (host, started) =
            crate::mcp::supervisor_start(&servers, &hidden, &self.redactor, listener).await?;
        self.register_mcp(started)?;
        Ok(host)
    }

    /// Registers the tools of started MCP servers after the manifest's own, refusing two
    /// with one name; the servers are no longer pending.
    fn register_mcp(
        &mut self,
        started: Vec<(String, ToolSpec, Arc<dyn Tool>)>,
    ) -> Result<(), crate::mcp::McpError> {
        let mut origin: HashMap<String, String> = self
            .tools
            .keys()
            .map(|name| (name.clone(), "the manifest".to_string()))
            .collect();
        for (server, spec, tool) in started {
            let name = spec.name().to_string();
            let here = format!("MCP server `{server}`");
            if let Some(first) = origin.get(&name) {
                return Err(crate::mcp::McpError::Duplicate {
                    name,
                    first: first.clone(),
                    second: here,
                });
            }
            origin.insert(name.clone(), here);
            self.register(spec, tool)
                .map_err(|error| crate::mcp::McpError::Descriptor {
                    server,
                    tool: name,
                    error,
                })?;
        }
        self.pending_mcp = Arc::default();
        Ok(())
    }

    /// The descriptors, for [`RunOptions::tools`] (an `Arc` clone, not a copy).
    pub fn registry(&self) -> Arc<ToolRegistry> {
        self.registry.clone()
    }

    /// Redacts every tool result and error message with `redactor` before it reaches the
    /// run (`result_tool_calls`, `errors`, the idempotency cache): a tool may print a
    /// secret it found, or one a server echoed to it. The CLI passes the run's provider
    /// secrets.
    pub fn redact_with(&mut self, redactor: Redactor) {
        self.redactor = redactor;
    }

    /// Calls the tool `invocation` names, with no deadline of its own (a host that drives
    /// a run itself keeps the run's deadline: Python): its result, redacted.
    pub async fn call(&self, invocation: &ToolInvocation) -> Result<Json, String> {
        let result = match self.tools.get(&invocation.name) {
            Some(tool) => tool.call(invocation).await,
            None => Err("the tool has a descriptor but no implementation".to_string()),
        };
        self.redacted(result)
    }

    /// True if the tool `name` is declared idempotent: running it twice does no harm.
    pub(crate) fn is_idempotent(&self, name: &str) -> bool {
        self.registry
            .get(name)
            .is_some_and(|spec| spec.idempotency().is_some())
    }

    /// `result` with every secret the toolbox knows replaced.
    fn redacted(&self, result: Result<Json, String>) -> Result<Json, String> {
        match result {
            Ok(json) => Ok(self.redactor.redact_json(json)),
            Err(message) => Err(self.redactor.redact(&message)),
        }
    }

    /// Number of tools.
    pub fn len(&self) -> usize {
        self.registry.len()
    }

    /// True without tools.
    pub fn is_empty(&self) -> bool {
        self.registry.is_empty()
    }
}

/// The session runs a run's tool calls through this (it relays their progress).
impl ToolRunner for Toolbox {
    /// Runs the tool `invocation` asks for until the run's deadline or cancel, reporting
    /// its progress to `progress`: its result, redacted, or why it was dropped.
    async fn run(
        &self,
        invocation: &ToolInvocation,
        clock: &RunClock,
        progress: Option<&ProgressSink>,
    ) -> Result<Result<Json, String>, Stopped> {
        let result = match self.tools.get(&invocation.name) {
            Some(tool) => {
                clock
                    .until_stopped(tool.call_with_progress(invocation, progress))
                    .await?
            }
            None => Err("the tool has a descriptor but no implementation".to_string()),
        };
        Ok(self.redacted(result))
    }

    /// A tool's progress `message` as an event may carry it: one line, redacted, at
    /// most [`PROGRESS_MESSAGE_CHARS`] characters (a tool's text is outside input).
    fn progress_message(&self, message: &str) -> String {
        self.redactor.clip(message, PROGRESS_MESSAGE_CHARS)
    }
}

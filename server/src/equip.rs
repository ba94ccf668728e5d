//! The server's provider and tools, from its own files and environment: a request can set
//! neither.
//!
//! A providers file (spec/providers.md) routes models to providers, reading each route's
//! key from the variable it names; without one, the OpenAI API with `OPENAI_API_KEY`.
//! Every variable read for a key is a secret, as are the tokens, the store's password and
//! the environment's secrets ([`Secrets`]): their values are redacted from what runs
//! journal (errors, events, outcomes) and command tools do not inherit the variables.

use std::path::Path;
use std::sync::Arc;

use aplc_runtime::Secrets;
use aplc_runtime::driver::{Provider, Toolbox};
use aplc_runtime::durable::DurableOptions;
use aplc_runtime::equip::{Builder, ProcessEnvironment, Source};
use aplc_runtime::mcp::{McpEvent, McpHost};

use crate::ServeError;

/// What every run of the server uses.
pub(crate) struct Equipment {
    pub(crate) provider: Arc<dyn Provider>,
    pub(crate) toolbox: Arc<Toolbox>,
    /// Journaling options, with the redactor of every secret.
    pub(crate) durable: DurableOptions,
}

impl Equipment {
    /// The provider and tools of `providers` and `tools`. `secrets` holds every secret the
    /// server knows besides those (the environment's, the tokens, the store's password);
    /// the variables the providers file reads are added to it.
    pub(crate) fn load(
        providers: Option<&Path>,
        tools: Option<&Path>,
        secrets: Secrets,
    ) -> Result<Self, ServeError> {
        let equipment = Builder::new(secrets)
            .providers(providers.map(|path| Source::File(path.to_owned())))
            .tools(tools.map(Path::to_owned))
            // `start_mcp` starts them, once, before the server listens.
            .mcp(true)
            .build(&ProcessEnvironment)
            .map_err(|e| ServeError::Config(e.to_string()))?;
        if equipment.no_key {
            tracing::warn!("no OPENAI_API_KEY and no --providers file: provider calls will fail");
        }
        let mut durable = DurableOptions::default();
        durable.redactor = equipment.redactor;
        Ok(Equipment {
            provider: equipment.provider,
            toolbox: Arc::new(equipment.toolbox),
            durable,
        })
    }

    /// Starts the MCP servers of the tool manifest (spec/mcp.md), once for every run of
    /// the server, and supervises them: a server whose child dies is restarted with
    /// backoff, each change logged. Before the toolbox is shared.
    pub(crate) async fn start_mcp(&mut self) -> Result<McpHost, ServeError> {
        let Some(toolbox) = Arc::get_mut(&mut self.toolbox) else {
            return Err(ServeError::Io(
                "the tools are shared before their MCP servers started".into(),
            ));
        };
        let servers = toolbox.pending_mcp_servers().len();
        if servers == 0 {
            return Ok(McpHost::default());
        }
        let host = toolbox
            .start_mcp_supervised(Arc::new(log_mcp_event))
            .await
            .map_err(ServeError::Mcp)?;
        tracing::info!(servers, tools = toolbox.len(), "MCP servers started");
        Ok(host)
    }
}

/// Logs a supervised MCP server's change.
fn log_mcp_event(event: &McpEvent<'_>) {
    match event {
        McpEvent::Exited { server } => {
            tracing::warn!(server, "MCP server exited: restarting it");
        }
        McpEvent::Restarted {
            server,
            restarts,
            tools_changed,
        } => {
            tracing::info!(server, restarts, "MCP server restarted");
            if *tools_changed {
                tracing::warn!(
                    server,
                    "MCP server lists other tools since it restarted: runs keep the tools \
                     of its first start, and calls to a tool it no longer lists fail"
                );
            }
        }
        McpEvent::RestartFailed {
            server,
            error,
            retry_in,
        } => {
            tracing::warn!(
                server,
                error = %error,
                retry_in_ms = retry_in.as_millis() as u64,
                "MCP server did not restart"
            );
        }
        _ => {}
    }
}

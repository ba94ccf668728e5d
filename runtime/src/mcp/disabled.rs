//! Without the `mcp` feature: no client. A manifest with servers is refused when it is
//! read ([`crate::manifest::ManifestError::McpDisabled`]); an embedder that declares
//! servers by hand gets this error when they would start.

use std::sync::Arc;

use aplc_vm::tools::ToolSpec;

use super::{McpError, McpServer};
use crate::native::Tool;
use crate::redact::Redactor;

/// This build has no MCP client.
pub(crate) const ENABLED: bool = false;

/// Refuses the first server: this build cannot start it.
pub(crate) async fn start(
    servers: &[McpServer],
    _hidden_env: &[String],
    _redactor: &Redactor,
) -> Result<Vec<(String, ToolSpec, Arc<dyn Tool>)>, McpError> {
    match servers.first() {
        Some(server) => Err(McpError::Unsupported {
            server: server.name.clone(),
            what: "MCP (this aplc was built without the `mcp` feature)",
        }),
        None => Ok(Vec::new()),
    }
}

/// No session can exist in this build.
pub(crate) enum McpSessions {}

impl McpSessions {
    pub(crate) fn closed(&self) -> bool {
        match *self {}
    }
}

/// Refuses the server: this build cannot start it.
pub(crate) async fn start_one(
    server: &McpServer,
    hidden_env: &[String],
    redactor: &Redactor,
) -> Result<Started, McpError> {
    start(std::slice::from_ref(server), hidden_env, redactor).await?;
    Err(McpError::Unsupported {
        server: server.name.clone(),
        what: "MCP (this aplc was built without the `mcp` feature)",
    })
}

/// One started server: its session, and its tools as `(server, descriptor,
/// implementation)`.
pub(crate) type Started = (Arc<McpSessions>, Vec<(String, ToolSpec, Arc<dyn Tool>)>);

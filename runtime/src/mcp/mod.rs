//! MCP servers declared in a tool manifest (`mcpServers`, `spec/mcp.md`): their
//! configuration as written, checked here (always compiled, so a manifest is judged the
//! same in every build), and, with the `mcp` feature, the client that starts them (stdio
//! children and streamable-HTTP sessions) and offers their tools through the
//! [`crate::tool::Toolbox`].
//!
//! ```json
//! {"mcpServers": {
//!    "time":   {"command": "python3", "args": ["-m", "mcp_server_time"], "env": {"X": "1"},
//!               "tools": ["now"], "prefix": "time_", "timeout_ms": 30000,
//!               "idempotent": true, "startup_timeout_ms": 10000},
//!    "remote": {"url": "http://127.0.0.1:9000/mcp", "headers_env": {"Authorization": "VAR"}}
//! }}
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value as Json;

#[cfg(feature = "mcp")]
mod client;
#[cfg(feature = "mcp")]
mod http;
#[cfg(feature = "mcp")]
mod listing;
#[cfg(feature = "mcp")]
mod progress;
#[cfg(feature = "mcp")]
pub(crate) use client::{ENABLED, McpSessions, Started, start, start_one};
#[cfg(not(feature = "mcp"))]
mod disabled;
#[cfg(not(feature = "mcp"))]
pub(crate) use disabled::{ENABLED, McpSessions, Started, start, start_one};
mod supervisor;
pub(crate) use supervisor::start as supervisor_start;
pub use supervisor::{McpEvent, McpHost, McpListener, ServerHealth};

/// Default time one `tools/call` may take.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_millis(30_000);
/// Default time a server has to start, initialize and list its tools.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_millis(10_000);

/// One server of `mcpServers`, as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    command: Option<String>,
    args: Option<Vec<String>>,
    env: Option<BTreeMap<String, String>>,
    url: Option<String>,
    headers_env: Option<BTreeMap<String, String>>,
    tools: Option<Vec<String>>,
    prefix: Option<String>,
    timeout_ms: Option<u64>,
    idempotent: Option<IdempotentEntry>,
    startup_timeout_ms: Option<u64>,
    /// `"required"` (every tool) or the tools (by the server's names) a person approves
    /// before each call (`spec/human.md` §1.1).
    approval: Option<ApprovalEntry>,
    approval_timeout_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ApprovalEntry {
    Word(String),
    Tools(Vec<String>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum IdempotentEntry {
    All(bool),
    Tools(Vec<String>),
}

/// An MCP server of the manifest, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct McpServer {
    /// Its key in `mcpServers`, which names it in every message.
    pub name: String,
    /// How to reach it.
    pub transport: McpTransport,
    /// The tools to offer (by the server's names); `None`: all of them.
    pub tools: Option<Vec<String>>,
    /// Put before each tool's name, for the name the model sees.
    pub prefix: String,
    /// How long one call may take.
    pub timeout: Duration,
    /// Which tools may be called again after a crash.
    pub idempotent: IdempotentTools,
    /// How long starting, initializing and listing may take.
    pub startup_timeout: Duration,
    /// Which tools a person approves before each call (`spec/human.md` §1.1).
    pub approval: ApprovalTools,
    /// How long an approval request waits before the call counts as denied.
    pub approval_timeout: Option<Duration>,
}

/// Which of a server's tools wait for a person's approval.
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub enum ApprovalTools {
    /// None (no `approval`).
    #[default]
    None,
    /// All of them (`"required"`).
    All,
    /// These (by the server's names).
    Listed(Vec<String>),
}

impl ApprovalTools {
    /// Whether the tool `name` (the server's name) waits for approval.
    pub fn includes(&self, name: &str) -> bool {
        match self {
            ApprovalTools::None => false,
            ApprovalTools::All => true,
            ApprovalTools::Listed(names) => names.iter().any(|n| n == name),
        }
    }
}

/// How an MCP server is reached.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum McpTransport {
    /// A child process speaking over its stdin and stdout.
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Literal variables set for it, on top of aplc's environment minus the secrets.
        env: Vec<(String, String)>,
    },
    /// Streamable HTTP: requests to one endpoint, with the headers `headers_env` names.
    Http {
        /// The endpoint.
        url: String,
        /// Header name to the variable that holds its value (a secret).
        headers_env: Vec<(String, String)>,
    },
}

/// Which of a server's tools are idempotent.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum IdempotentTools {
    /// Those whose annotations say `idempotentHint: true` and not `destructiveHint: true`.
    FromAnnotations,
    /// All of them (`true`).
    All,
    /// None of them (`false`).
    None,
    /// These (by the server's names).
    Listed(Vec<String>),
}

impl IdempotentTools {
    /// Whether the tool `name` (the server's name), with these MCP `annotations`, is
    /// idempotent.
    pub fn includes(&self, name: &str, annotations: Option<&Json>) -> bool {
        match self {
            IdempotentTools::All => true,
            IdempotentTools::None => false,
            IdempotentTools::Listed(names) => names.iter().any(|n| n == name),
            IdempotentTools::FromAnnotations => {
                let hint = |key: &str| annotations.and_then(|a| a.get(key)).and_then(Json::as_bool);
                hint("idempotentHint") == Some(true) && hint("destructiveHint") != Some(true)
            }
        }
    }
}

/// What is wrong with one server of `mcpServers`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// A key is unknown, missing or of the wrong type (serde's message names it).
    #[error("{0}")]
    Shape(#[source] serde_json::Error),
    /// Neither or both of `command` and `url`.
    #[error("give exactly one of `command` (a stdio server) or `url` (an HTTP server)")]
    CommandOrUrl,
    /// `command` is empty.
    #[error("`command` must name a program")]
    NoProgram,
    /// A stdio key on an HTTP server, or the other way round.
    #[error("`{key}` applies to {applies} servers only")]
    WrongTransport {
        /// The key.
        key: &'static str,
        /// `stdio` or `url`.
        applies: &'static str,
    },
    /// `url` does not parse.
    #[error("invalid `url`: {0}")]
    Url(String),
    /// `url` is not http or https.
    #[error("`url` must be http or https, found {0}")]
    Scheme(String),
    /// A timeout of zero.
    #[error("`{0}` must be at least 1")]
    ZeroTimeout(&'static str),
    /// A name in `env` or `headers_env` that cannot be one.
    #[error("`{key}` has an invalid name {name:?}")]
    BadName {
        /// `env` or `headers_env`.
        key: &'static str,
        /// The name, as written (never a value).
        name: String,
    },
    /// A server name that is empty.
    #[error("a server name must not be empty")]
    EmptyName,
    /// `approval` is neither `"required"` nor a list of tool names.
    #[error("`approval` must be \"required\" or a list of tool names, found \"{0}\"")]
    ApprovalWord(String),
    /// `approval_timeout_ms` without `approval`.
    #[error("`approval_timeout_ms` needs `approval`")]
    ApprovalTimeoutAlone,
}

/// Parses the value of `mcpServers`: an object from server name to entry. Errors name the
/// server.
pub fn parse_servers(value: Json) -> Result<Vec<McpServer>, (Option<String>, ServerError)> {
    let Json::Object(map) = value else {
        return Err((
            None,
            ServerError::Shape(serde::de::Error::custom(
                "`mcpServers` must be an object from server name to server",
            )),
        ));
    };
    map.into_iter()
        .map(|(name, value)| parse_server(&name, value).map_err(|e| (Some(name), e)))
        .collect()
}

fn parse_server(name: &str, value: Json) -> Result<McpServer, ServerError> {
    if name.is_empty() {
        return Err(ServerError::EmptyName);
    }
    let entry: Entry = serde_json::from_value(value).map_err(ServerError::Shape)?;
    let transport = match (entry.command, entry.url) {
        (Some(command), None) => {
            if command.is_empty() {
                return Err(ServerError::NoProgram);
            }
            if entry.headers_env.is_some() {
                return Err(ServerError::WrongTransport {
                    key: "headers_env",
                    applies: "`url`",
                });
            }
            let env: Vec<(String, String)> = entry.env.unwrap_or_default().into_iter().collect();
            if let Some((bad, _)) = env
                .iter()
                .find(|(k, _)| k.is_empty() || k.contains(['=', '\0']))
            {
                return Err(ServerError::BadName {
                    key: "env",
                    name: bad.clone(),
                });
            }
            McpTransport::Stdio {
                command,
                args: entry.args.unwrap_or_default(),
                env,
            }
        }
        (None, Some(url)) => {
            for (key, given) in [("args", entry.args.is_some()), ("env", entry.env.is_some())] {
                if given {
                    return Err(ServerError::WrongTransport {
                        key,
                        applies: "`command` (stdio)",
                    });
                }
            }
            let parsed = reqwest::Url::parse(&url).map_err(|e| ServerError::Url(e.to_string()))?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(ServerError::Scheme(parsed.scheme().to_owned()));
            }
            let headers_env: Vec<(String, String)> =
                entry.headers_env.unwrap_or_default().into_iter().collect();
            for (header, variable) in &headers_env {
                if reqwest::header::HeaderName::from_bytes(header.as_bytes()).is_err() {
                    return Err(ServerError::BadName {
                        key: "headers_env",
                        name: header.clone(),
                    });
                }
                if variable.is_empty() || variable.contains(['=', '\0']) {
                    return Err(ServerError::BadName {
                        key: "headers_env",
                        name: variable.clone(),
                    });
                }
            }
            McpTransport::Http { url, headers_env }
        }
        _ => return Err(ServerError::CommandOrUrl),
    };
    let millis = |key: &'static str, value: Option<u64>, default: Duration| match value {
        Some(0) => Err(ServerError::ZeroTimeout(key)),
        Some(ms) => Ok(Duration::from_millis(ms)),
        None => Ok(default),
    };
    Ok(McpServer {
        name: name.to_owned(),
        transport,
        tools: entry.tools,
        prefix: entry.prefix.unwrap_or_default(),
        timeout: millis("timeout_ms", entry.timeout_ms, DEFAULT_CALL_TIMEOUT)?,
        idempotent: match entry.idempotent {
            None => IdempotentTools::FromAnnotations,
            Some(IdempotentEntry::All(true)) => IdempotentTools::All,
            Some(IdempotentEntry::All(false)) => IdempotentTools::None,
            Some(IdempotentEntry::Tools(names)) => IdempotentTools::Listed(names),
        },
        startup_timeout: millis(
            "startup_timeout_ms",
            entry.startup_timeout_ms,
            DEFAULT_STARTUP_TIMEOUT,
        )?,
        approval: match entry.approval {
            None if entry.approval_timeout_ms.is_some() => {
                return Err(ServerError::ApprovalTimeoutAlone);
            }
            None => ApprovalTools::None,
            Some(ApprovalEntry::Word(word)) if word == "required" => ApprovalTools::All,
            Some(ApprovalEntry::Word(word)) => return Err(ServerError::ApprovalWord(word)),
            Some(ApprovalEntry::Tools(names)) => ApprovalTools::Listed(names),
        },
        approval_timeout: match entry.approval_timeout_ms {
            Some(0) => return Err(ServerError::ZeroTimeout("approval_timeout_ms")),
            ms => ms.map(Duration::from_millis),
        },
    })
}

/// Why the MCP servers of a toolbox could not be started, or their tools offered. Every
/// message names the server; none holds a secret's value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The server could not be started, initialized or listed.
    #[error("MCP server `{server}`: {message}")]
    Start {
        /// The server's name.
        server: String,
        /// What went wrong (redacted; with the end of its stderr when it has one).
        message: String,
    },
    /// Two tools end up with one model-facing name.
    #[error("two tools are named `{name}`: one from {first}, one from {second}")]
    Duplicate {
        /// The model-facing name.
        name: String,
        /// Where the first comes from (`MCP server \`a\`` or `the manifest`).
        first: String,
        /// Where the second comes from.
        second: String,
    },
    /// A tool's descriptor is refused (its name or schema).
    #[error("MCP server `{server}`: tool `{tool}`: {error}")]
    Descriptor {
        /// The server's name.
        server: String,
        /// The model-facing name.
        tool: String,
        /// What is wrong.
        error: aplc_vm::tools::ToolSpecError,
    },
    /// `tools` names a tool the server does not have.
    #[error("MCP server `{server}`: `tools` names `{tool}`, which the server does not list")]
    UnknownTool {
        /// The server's name.
        server: String,
        /// The name, as written in `tools`.
        tool: String,
    },
    /// The server cannot be started by this build (without the `mcp` feature).
    #[error("MCP server `{server}`: {what} servers are not supported yet")]
    Unsupported {
        /// The server's name.
        server: String,
        /// The transport.
        what: &'static str,
    },
    /// A variable of `headers_env` is not set, or its value cannot be sent. Names the
    /// variable, never its value.
    #[error(
        "MCP server `{server}`: `headers_env`: the variable `{variable}` (header `{header}`) {problem}"
    )]
    Header {
        /// The server's name.
        server: String,
        /// The header's name.
        header: String,
        /// The variable's name.
        variable: String,
        /// What is wrong with it.
        problem: &'static str,
    },
}

impl McpError {
    /// True for the errors of the manifest itself, or of the variables it names (exit 2
    /// on the command line, as a provider's missing key), false for a server that failed.
    pub fn is_manifest_error(&self) -> bool {
        matches!(
            self,
            McpError::Duplicate { .. }
                | McpError::Descriptor { .. }
                | McpError::UnknownTool { .. }
                | McpError::Unsupported { .. }
                | McpError::Header { .. }
        )
    }
}

#[cfg(test)]
mod tests;

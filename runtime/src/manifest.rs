//! Tool manifests (`aplc run --tools tools.json`) and the two kinds of tool they declare:
//! subprocess commands and HTTP endpoints.
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
//! Command tools run without the environment variables the caller names as holding
//! secrets (`hidden_env`; the CLI, `aplc serve` and `aplc test` pass
//! [`crate::Secrets::variables`]).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value as Json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::future::BoxFuture;
use crate::http::HttpClient;
use crate::process::ProcessGroup;
use crate::tool::{Tool, Toolbox};
use aplc_vm::tools::{
    Approval, HumanTool, Idempotency, IdempotencyKey, ToolInvocation, ToolSpec, ToolSpecError,
};

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
    /// Required, but for an `agent` tool (its agent's declared inputs stand in).
    descriptor: Option<Json>,
    #[serde(default)]
    with_context: bool,
    timeout_ms: Option<u64>,
    idempotent: Option<IdempotentEntry>,
    /// `"required"`: a person approves each call (`spec/human.md` §1.1).
    approval: Option<String>,
    approval_timeout_ms: Option<u64>,
    /// A tool whose result a person gives (`spec/human.md` §1.2).
    human: Option<HumanEntry>,
    /// A tool that runs this agent (`spec/agents.md` §1.2).
    agent: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HumanEntry {
    prompt: String,
    result_schema: Option<Json>,
    timeout_ms: Option<u64>,
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

/// Why a tool manifest was refused. Every message names the tool and the key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    /// The text is not a JSON object.
    #[error("invalid tool manifest: {0}")]
    NotJson(#[source] serde_json::Error),
    /// One entry is wrong.
    #[error("tool `{name}`: {error}")]
    Tool {
        /// The manifest key.
        name: String,
        /// What is wrong with its entry.
        error: EntryError,
    },
    /// Two entries declare the same tool.
    #[error(transparent)]
    Register(ToolSpecError),
    /// `mcpServers`, or one server of it, is wrong (`spec/mcp.md`).
    #[error("{}: {error}", match server {
        Some(name) => format!("MCP server `{name}`"),
        None => "`mcpServers`".to_string(),
    })]
    McpServer {
        /// The server's key; `None` when `mcpServers` itself is wrong.
        server: Option<String>,
        /// What is wrong.
        error: crate::mcp::ServerError,
    },
    /// The manifest declares MCP servers, but this build has no MCP client.
    #[error("`mcpServers`: this aplc was built without the `mcp` feature")]
    McpDisabled,
}

/// The key of a manifest that declares MCP servers rather than a tool.
pub const MCP_SERVERS_KEY: &str = "mcpServers";

/// The MCP servers a manifest declares (`mcpServers`; none without the key), checked, for
/// a host that must know them before the toolbox is built (to record the secrets they
/// name).
pub fn mcp_servers(text: &str) -> Result<Vec<crate::mcp::McpServer>, ManifestError> {
    let mut raw: serde_json::Map<String, Json> =
        serde_json::from_str(text).map_err(ManifestError::NotJson)?;
    match raw.remove(MCP_SERVERS_KEY) {
        Some(value) => crate::mcp::parse_servers(value)
            .map_err(|(server, error)| ManifestError::McpServer { server, error }),
        None => Ok(Vec::new()),
    }
}

/// What is wrong with one manifest entry.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EntryError {
    /// A key is unknown, missing or of the wrong type (serde's message names it).
    #[error("{0}")]
    Shape(#[source] serde_json::Error),
    /// `descriptor.name` is not the manifest key.
    #[error("`descriptor.name` is {found}, but the manifest key is `{name}`")]
    NameMismatch {
        /// `descriptor.name`, as JSON.
        found: Json,
        /// The manifest key.
        name: String,
    },
    /// The descriptor is refused ([`ToolSpec::new`]).
    #[error(transparent)]
    Descriptor(ToolSpecError),
    /// `idempotent.key` is a word other than `auto`.
    #[error("`idempotent.key` must be \"auto\" or a list of parameter names, found \"{0}\"")]
    KeyWord(String),
    /// `idempotent.key` is an empty list.
    #[error("`idempotent.key` lists no parameters")]
    NoKeyParameters,
    /// `command` is empty or starts with an empty program.
    #[error("`command` must start with a program")]
    NoProgram,
    /// `cwd` on a `url` tool.
    #[error("`cwd` applies to `command` tools only")]
    CwdWithUrl,
    /// Neither or both of `command` and `url`.
    #[error("give exactly one of `command` or `url`")]
    CommandOrUrl,
    /// `url` does not parse.
    #[error("invalid `url`: {0}")]
    Url(String),
    /// `url` is not http or https.
    #[error("`url` must be http or https, found {0}")]
    Scheme(String),
    /// The HTTP client for `url` tools could not be built.
    #[error(transparent)]
    Http(crate::http::HttpClientError),
    /// `approval` is a word other than `required`.
    #[error("`approval` must be \"required\", found \"{0}\"")]
    ApprovalWord(String),
    /// `approval_timeout_ms` without `approval`.
    #[error("`approval_timeout_ms` needs `\"approval\": \"required\"`")]
    ApprovalTimeoutAlone,
    /// A `human` tool with a `command`, a `url` or other keys that run a program.
    #[error("a `human` tool is answered by a person: it takes no `{0}`")]
    HumanWith(&'static str),
    /// A timeout of 0 ms.
    #[error("`{0}` must be a positive number of milliseconds")]
    ZeroTimeout(&'static str),
    /// No `descriptor`, on a tool that is not an `agent` tool.
    #[error("missing field `descriptor`")]
    NoDescriptor,
    /// An `agent` tool with a `command`, a `url` or other keys that run a program.
    #[error("an `agent` tool runs its agent: it takes no `{0}`")]
    AgentWith(&'static str),
    /// `agent` is not an agent's name.
    #[error("`agent` must name an agent (letters, digits, `-`, `_`, `.`), found {0:?}")]
    AgentName(String),
}

/// Builds a toolbox from a JSON manifest: an object from tool name to entry. `base` is the
/// manifest's folder, against which a relative `cwd` is resolved. Command tools run
/// without the environment variables named in `hidden_env` (those that hold secrets,
/// [`crate::Secrets::variables`]: a tool has no business reading them, and what it prints
/// may be shown).
///
/// HTTP tools get one client, built on first need; [`toolbox_from_manifest_with_client`]
/// passes one in instead (to share it with the provider).
pub fn toolbox_from_manifest(
    text: &str,
    base: &Path,
    hidden_env: &[String],
) -> Result<Toolbox, ManifestError> {
    toolbox_with(text, base, None, hidden_env)
}

/// [`toolbox_from_manifest`], with HTTP tools sending through `client`.
pub fn toolbox_from_manifest_with_client(
    text: &str,
    base: &Path,
    client: &HttpClient,
    hidden_env: &[String],
) -> Result<Toolbox, ManifestError> {
    toolbox_with(text, base, Some(client.clone()), hidden_env)
}

fn toolbox_with(
    text: &str,
    base: &Path,
    client: Option<HttpClient>,
    hidden_env: &[String],
) -> Result<Toolbox, ManifestError> {
    let mut client = client;
    let mut raw: serde_json::Map<String, Json> =
        serde_json::from_str(text).map_err(ManifestError::NotJson)?;
    let mut toolbox = Toolbox::new();
    if let Some(servers) = raw.remove(MCP_SERVERS_KEY) {
        let servers = crate::mcp::parse_servers(servers)
            .map_err(|(server, error)| ManifestError::McpServer { server, error })?;
        if !servers.is_empty() {
            if !crate::mcp::ENABLED {
                return Err(ManifestError::McpDisabled);
            }
            toolbox.add_mcp_servers(servers, hidden_env.to_vec());
        }
    }
    for (name, value) in raw {
        let (spec, tool) = serde_json::from_value(value)
            .map_err(EntryError::Shape)
            .and_then(|entry| entry_tool(&name, entry, base, &mut client, hidden_env))
            .map_err(|error| ManifestError::Tool {
                name: name.clone(),
                error,
            })?;
        toolbox
            .register(spec, tool)
            .map_err(ManifestError::Register)?;
    }
    Ok(toolbox)
}

fn entry_tool(
    name: &str,
    entry: Entry,
    base: &Path,
    client: &mut Option<HttpClient>,
    hidden_env: &[String],
) -> Result<(ToolSpec, Arc<dyn Tool>), EntryError> {
    if let Some(agent) = entry.agent.clone() {
        return agent_tool(name, agent, entry);
    }
    let mut descriptor = entry.descriptor.ok_or(EntryError::NoDescriptor)?;
    name_descriptor(name, &mut descriptor)?;
    let mut spec = ToolSpec::new(descriptor)
        .map_err(EntryError::Descriptor)?
        .with_context(entry.with_context);
    let idempotent_given = entry.idempotent.is_some();
    if let Some(idem) = entry.idempotent {
        let key = match idem.key {
            KeyEntry::Word(w) if w == "auto" => IdempotencyKey::Auto,
            KeyEntry::Word(w) => return Err(EntryError::KeyWord(w)),
            KeyEntry::Params(p) if p.is_empty() => return Err(EntryError::NoKeyParameters),
            KeyEntry::Params(p) => IdempotencyKey::Params(p),
        };
        spec = spec.idempotent(Idempotency {
            key,
            ttl: idem.ttl_ms.map(Duration::from_millis),
        });
    }
    if let Some(human) = entry.human {
        let given = [
            ("command", entry.command.is_some()),
            ("url", entry.url.is_some()),
            ("cwd", entry.cwd.is_some()),
            ("timeout_ms", entry.timeout_ms.is_some()),
            ("idempotent", idempotent_given),
            ("approval", entry.approval.is_some()),
            ("approval_timeout_ms", entry.approval_timeout_ms.is_some()),
        ];
        if let Some((key, _)) = given.iter().find(|(_, given)| *given) {
            return Err(EntryError::HumanWith(key));
        }
        return human_tool(name, spec, human);
    }
    spec = approval(spec, entry.approval, entry.approval_timeout_ms)?;
    let timeout = entry
        .timeout_ms
        .map(Duration::from_millis)
        .unwrap_or(DEFAULT_TOOL_TIMEOUT);
    let tool: Arc<dyn Tool> = match (entry.command, entry.url) {
        (Some(argv), None) => {
            if argv.first().is_none_or(|p| p.is_empty()) {
                return Err(EntryError::NoProgram);
            }
            let cwd = entry.cwd.map(|dir| base.join(dir));
            Arc::new(CommandTool::new(argv, cwd, timeout).hide_env(hidden_env.to_vec()))
        }
        (None, Some(_)) if entry.cwd.is_some() => return Err(EntryError::CwdWithUrl),
        (None, Some(url)) => http_tool(url, timeout, client)?,
        _ => return Err(EntryError::CommandOrUrl),
    };
    Ok((spec, tool))
}

/// Names `descriptor` after its manifest key, or checks the name it has.
fn name_descriptor(name: &str, descriptor: &mut Json) -> Result<(), EntryError> {
    match descriptor.get("name") {
        None => {
            if let Json::Object(map) = descriptor {
                map.insert("name".into(), Json::String(name.to_string()));
            }
            Ok(())
        }
        Some(Json::String(n)) if n == name => Ok(()),
        Some(other) => Err(EntryError::NameMismatch {
            found: other.clone(),
            name: name.to_owned(),
        }),
    }
}

/// An agent tool: the machine runs its agent for each call (`spec/agents.md` §1.2), so
/// its implementation is never called.
fn agent_tool(
    name: &str,
    agent: String,
    entry: Entry,
) -> Result<(ToolSpec, Arc<dyn Tool>), EntryError> {
    let given = [
        ("command", entry.command.is_some()),
        ("url", entry.url.is_some()),
        ("cwd", entry.cwd.is_some()),
        ("timeout_ms", entry.timeout_ms.is_some()),
        ("idempotent", entry.idempotent.is_some()),
        ("approval", entry.approval.is_some()),
        ("approval_timeout_ms", entry.approval_timeout_ms.is_some()),
        ("human", entry.human.is_some()),
        ("with_context", entry.with_context),
    ];
    if let Some((key, _)) = given.iter().find(|(_, given)| *given) {
        return Err(EntryError::AgentWith(key));
    }
    if !aplc_vm::names::is_agent_name(&agent) {
        return Err(EntryError::AgentName(agent));
    }
    let spec = match entry.descriptor {
        Some(mut descriptor) => {
            name_descriptor(name, &mut descriptor)?;
            ToolSpec::new(descriptor)
                .map_err(EntryError::Descriptor)?
                .agent(agent.as_str())
        }
        None => ToolSpec::for_agent(name, &agent).map_err(EntryError::Descriptor)?,
    };
    let tool: Arc<dyn Tool> = Arc::new(AgentRun(agent));
    Ok((spec, tool))
}

/// The implementation an agent tool registers: the machine runs the agent instead.
struct AgentRun(String);

impl Tool for AgentRun {
    fn call<'a>(&'a self, _invocation: &'a ToolInvocation) -> BoxFuture<'a, Result<Json, String>> {
        Box::pin(async move {
            Err(format!(
                "the agent `{}` runs inside the run, not as a tool",
                self.0
            ))
        })
    }
}

/// Makes `spec` wait for a person's approval if `approval` says so.
fn approval(
    spec: ToolSpec,
    approval: Option<String>,
    timeout_ms: Option<u64>,
) -> Result<ToolSpec, EntryError> {
    match approval {
        None if timeout_ms.is_some() => Err(EntryError::ApprovalTimeoutAlone),
        None => Ok(spec),
        Some(word) if word == "required" => Ok(spec.requires_approval(Approval {
            timeout: positive_ms(timeout_ms, "approval_timeout_ms")?,
        })),
        Some(word) => Err(EntryError::ApprovalWord(word)),
    }
}

/// `ms` as a duration, refusing 0.
fn positive_ms(ms: Option<u64>, key: &'static str) -> Result<Option<Duration>, EntryError> {
    match ms {
        Some(0) => Err(EntryError::ZeroTimeout(key)),
        ms => Ok(ms.map(Duration::from_millis)),
    }
}

/// A human tool: its spec says a person answers, and its implementation is never
/// called (the machine asks the person instead of calling it).
fn human_tool(
    name: &str,
    spec: ToolSpec,
    human: HumanEntry,
) -> Result<(ToolSpec, Arc<dyn Tool>), EntryError> {
    let spec = spec
        .human(HumanTool {
            prompt: human.prompt,
            result_schema: human.result_schema,
            timeout: positive_ms(human.timeout_ms, "human.timeout_ms")?,
        })
        .map_err(EntryError::Descriptor)?;
    let tool: Arc<dyn Tool> = Arc::new(PersonTool(name.to_owned()));
    Ok((spec, tool))
}

/// The implementation a human tool registers: a person gives its results, so the run
/// never calls it; a driver that did would get this error rather than a made-up result.
struct PersonTool(String);

impl Tool for PersonTool {
    fn call<'a>(&'a self, _invocation: &'a ToolInvocation) -> BoxFuture<'a, Result<Json, String>> {
        Box::pin(async move { Err(format!("`{}` is answered by a person, not run", self.0)) })
    }
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
    /// Environment variables the process does not inherit.
    hidden_env: Vec<String>,
}

impl CommandTool {
    /// A command tool running `argv` (in `cwd`, if given) with a per-call timeout. It
    /// inherits aplc's environment, but for [`CommandTool::hide_env`].
    pub fn new(argv: Vec<String>, cwd: Option<PathBuf>, timeout: Duration) -> CommandTool {
        CommandTool {
            argv,
            cwd,
            timeout,
            hidden_env: Vec::new(),
        }
    }

    /// Runs the process without these environment variables (the run's secrets).
    pub fn hide_env(mut self, names: Vec<String>) -> CommandTool {
        self.hidden_env = names;
        self
    }

    async fn run(&self, invocation: &ToolInvocation) -> Result<Json, String> {
        let program = &self.argv[0];
        let mut command = tokio::process::Command::new(program);
        if let Some(dir) = &self.cwd {
            command.current_dir(dir);
        }
        for name in &self.hidden_env {
            command.env_remove(name);
        }
        command
            .args(&self.argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // Its own process group, so that the processes it starts can be killed with it.
        #[cfg(unix)]
        command.process_group(0);
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot start `{program}`: {e}"))?;
        // Kills the whole group when this call ends in any way: done, timed out, or
        // dropped because the run ended or aplc was interrupted. (After a normal exit the
        // group's id stays reserved while any member lives, so the kill reaches only the
        // tool's own leftovers.)
        let group = ProcessGroup(child.id());
        let input = serde_json::to_vec(&request_body(invocation)).unwrap_or_default();
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err("cannot connect to the tool's standard streams".into());
        };
        let deadline = tokio::time::Instant::now() + self.timeout;
        let pipes = (stdin, stdout, stderr);
        let Some(Collected { status, out, err }) =
            collect(&mut child, pipes, &group, input, deadline).await
        else {
            group.kill();
            let _ = child.kill().await;
            return Err(format!(
                "timed out after {} ms and was killed",
                self.timeout.as_millis()
            ));
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
        let text = utf8_output(out)?;
        Ok(serde_json::from_str(text.trim())
            .unwrap_or_else(|_| Json::String(text.trim_end().to_string())))
    }
}

/// How long the pipes of a tool that has exited may stay open before its process group
/// is killed: what the tool wrote before it exited is already in the pipe, so this only
/// waits for a background process that keeps the pipe open (and is then killed).
const OUTPUT_GRACE: Duration = Duration::from_millis(300);

/// A command tool's stdin, stdout and stderr.
type Pipes = (
    tokio::process::ChildStdin,
    tokio::process::ChildStdout,
    tokio::process::ChildStderr,
);

/// What a command tool's process left: its exit status, stdout and stderr.
struct Collected {
    status: std::io::Result<std::process::ExitStatus>,
    out: Result<Vec<u8>, String>,
    err: Result<Vec<u8>, String>,
}

/// Writes `input` to the child's stdin and reads its stdout and stderr until it exits
/// (`None` if `deadline` comes first). The result is taken when the tool's own process
/// exits, not when its pipes close: a background process it started may keep them open.
/// Past the exit, the pipes get [`OUTPUT_GRACE`] to close; then the group is killed
/// (`spec/tools.md`: it ends with the call) and what was read is the output.
async fn collect(
    child: &mut tokio::process::Child,
    (mut stdin, stdout, stderr): Pipes,
    group: &ProcessGroup,
    input: Vec<u8>,
    deadline: tokio::time::Instant,
) -> Option<Collected> {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (status, read) = {
        let write = async move {
            // A tool that exits without reading its input is not an error here: its exit
            // status says how it went.
            let _ = stdin.write_all(&input).await;
            drop(stdin);
        };
        let streams = async {
            let ((), out, err) =
                tokio::join!(write, capped(stdout, &mut out), capped(stderr, &mut err));
            (out, err)
        };
        let mut streams = std::pin::pin!(streams);
        let first = tokio::time::timeout_at(deadline, async {
            tokio::select! {
                status = child.wait() => Ok(status),
                read = &mut streams => Err(read),
            }
        })
        .await
        .ok()?;
        match first {
            Ok(status) => (status, after_exit(group, streams.as_mut()).await),
            Err(read) => (
                tokio::time::timeout_at(deadline, child.wait()).await.ok()?,
                Some(read),
            ),
        }
    };
    // Pipes still open after the kill (held by a process that left the group) are left:
    // what was read from them is the output.
    let (out_read, err_read) = read.unwrap_or((Ok(()), Ok(())));
    Some(Collected {
        status,
        out: out_read.map(|()| out),
        err: err_read.map(|()| err),
    })
}

/// The end of a tool's output once its process has exited: the pipes get
/// [`OUTPUT_GRACE`] to close, then the group is killed (closing the pipes its background
/// processes held) and they get as long again. `None` if they are still open.
async fn after_exit<F: Future + Unpin>(group: &ProcessGroup, mut streams: F) -> Option<F::Output> {
    if let Ok(read) = tokio::time::timeout(OUTPUT_GRACE, &mut streams).await {
        return Some(read);
    }
    group.kill();
    tokio::time::timeout(OUTPUT_GRACE, streams).await.ok()
}

/// A tool's output as text; bytes that are not UTF-8 are an error naming where, never
/// silently replaced.
fn utf8_output(bytes: Vec<u8>) -> Result<String, String> {
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "the tool's output is not valid UTF-8: byte {} of {} starts an invalid sequence",
            e.utf8_error().valid_up_to(),
            e.as_bytes().len()
        )
    })
}

impl Tool for CommandTool {
    fn call<'a>(&'a self, invocation: &'a ToolInvocation) -> BoxFuture<'a, Result<Json, String>> {
        Box::pin(self.run(invocation))
    }
}

/// Reads a stream to its end into `buf`, failing once it passes [`MAX_TOOL_OUTPUT`]. What
/// was read stays in `buf` if the reading is dropped before the end.
async fn capped(
    mut stream: impl tokio::io::AsyncRead + Unpin,
    buf: &mut Vec<u8>,
) -> Result<(), String> {
    let mut chunk = [0u8; 8192];
    loop {
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| format!("cannot read the tool's output: {e}"))?;
        if n == 0 {
            return Ok(());
        }
        if buf.len() + n > MAX_TOOL_OUTPUT {
            return Err(format!("the tool wrote more than {MAX_TOOL_OUTPUT} bytes"));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
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

fn http_tool(
    url: String,
    timeout: Duration,
    client: &mut Option<HttpClient>,
) -> Result<Arc<dyn Tool>, EntryError> {
    let parsed = reqwest::Url::parse(&url).map_err(|e| EntryError::Url(e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(EntryError::Scheme(parsed.scheme().to_owned()));
    }
    let client = match client {
        Some(client) => client.clone(),
        None => client
            .insert(HttpClient::new().map_err(EntryError::Http)?)
            .clone(),
    };
    Ok(Arc::new(HttpTool {
        url: parsed,
        client,
        timeout,
    }))
}

/// An HTTP endpoint: the request is POSTed as JSON; a 2xx response's body is the result.
///
/// It is sent with the shared [`HttpClient`]: a same-origin 307 or 308 is followed, any
/// other redirect is an error, and a body larger than [`crate::http::MAX_BODY_BYTES`] is
/// an error, found while streaming.
#[derive(Debug)]
pub struct HttpTool {
    url: reqwest::Url,
    client: HttpClient,
    timeout: Duration,
}

impl HttpTool {
    async fn run(&self, invocation: &ToolInvocation) -> Result<Json, String> {
        use crate::http;

        let mut response = self
            .client
            .inner()
            .post(self.url.clone())
            .timeout(self.timeout)
            .json(&request_body(invocation))
            .send()
            .await
            .map_err(|e| http::error_text(&e))?;
        let status = response.status();
        if status.is_redirection() {
            let to = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(|l| format!(" to `{}`", excerpt(l)))
                .unwrap_or_default();
            return Err(format!(
                "HTTP {status}: redirected{to}; only same-origin 307 and 308 redirects are \
                 followed"
            ));
        }
        let body = http::read_body(&mut response)
            .await
            .map_err(|e| format!("cannot read the response: {}", e.text()))?;
        if !status.is_success() {
            return Err(format!(
                "HTTP {status}: {}",
                excerpt(String::from_utf8_lossy(&body).trim())
            ));
        }
        let text = utf8_output(body)?;
        Ok(serde_json::from_str(&text).unwrap_or(Json::String(text)))
    }
}

impl Tool for HttpTool {
    fn call<'a>(&'a self, invocation: &'a ToolInvocation) -> BoxFuture<'a, Result<Json, String>> {
        Box::pin(self.run(invocation))
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_command_tool_does_not_inherit_hidden_variables() {
        // `HOME` stands in for a provider key: it is set in any test environment, and
        // the test need not change the process's environment to have one.
        let script = r#"echo "HOME=${HOME-unset} PATH=${PATH:+set}""#;
        let argv = vec!["/bin/sh".to_string(), "-c".to_string(), script.to_string()];
        let invocation = ToolInvocation {
            id: "1".into(),
            name: "t".into(),
            arguments: serde_json::json!({}),
            context: None,
        };
        let tool = CommandTool::new(argv, None, DEFAULT_TOOL_TIMEOUT).hide_env(vec!["HOME".into()]);
        assert_eq!(
            tool.run(&invocation).await,
            Ok(Json::String("HOME=unset PATH=set".into()))
        );
    }

    #[test]
    fn agent_entries_take_no_program_and_may_leave_out_the_descriptor() {
        let build = |text: &str| toolbox_from_manifest(text, Path::new("."), &[]);
        let toolbox = build(
            r#"{"translate": {"agent": "translator"},
                "summarize": {"agent": "summarizer", "descriptor": {"parameters": {"type": "object"}}}}"#,
        )
        .unwrap();
        let registry = toolbox.registry();
        assert!(registry.has_agent_tools());
        assert_eq!(
            registry.get("translate").unwrap().agent_tool(),
            Some("translator")
        );
        assert_eq!(
            registry.get("summarize").unwrap().agent_tool(),
            Some("summarizer")
        );
        for (text, says) in [
            (
                r#"{"t": {"agent": "a", "command": ["x"]}}"#,
                "takes no `command`",
            ),
            (
                r#"{"t": {"agent": "a", "idempotent": {"key": "auto"}}}"#,
                "takes no `idempotent`",
            ),
            (r#"{"t": {"agent": "../a"}}"#, "`agent` must name an agent"),
            (r#"{"t": {"command": ["x"]}}"#, "missing field `descriptor`"),
        ] {
            let Err(error) = build(text) else {
                panic!("{text} is refused")
            };
            let error = error.to_string();
            assert!(error.contains(says), "{text}: {error}");
        }
    }
}

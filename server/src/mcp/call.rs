//! The MCP server's handler: lists the agents as tools and runs one per call.
//!
//! A call's arguments are checked as `aplc serve` checks a request's `context` (names a
//! run can set, every declared input present) plus the tool's schema (no argument the
//! agent does not declare, when it declares any); a failed check, like a failed run, is
//! a tool result with `isError: true`, so the calling model reads why. An unknown tool
//! is a protocol error (`-32602`), as the MCP specification asks.

use std::sync::Arc;
use std::time::Duration;

use aplc_runtime::driver;
use aplc_runtime::durable::{self, NewDurableRun};
use aplc_runtime::store::RunStore;
use aplc_vm::{RunOptions, RunOutcome};
use rmcp::ErrorData as McpError;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, CustomRequest,
    CustomResult, ErrorCode, Implementation, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{MaybeSendFuture, RequestContext, RoleServer};
use serde_json::{Map, Value};

use crate::agents::{Agent, Agents};
use crate::equip::Equipment;

/// The agents of a directory as the tools of an MCP server.
#[derive(Clone)]
pub(crate) struct AgentTools {
    agents: Arc<Agents>,
    equipment: Arc<Equipment>,
    /// With a store, every call is a durable run in it.
    store: Option<Arc<dyn RunStore>>,
}

impl AgentTools {
    pub(crate) fn new(
        agents: Arc<Agents>,
        equipment: Arc<Equipment>,
        store: Option<Arc<dyn RunStore>>,
    ) -> AgentTools {
        AgentTools {
            agents,
            equipment,
            store,
        }
    }

    /// Runs `agent` with `arguments` as its initial context; the tool result.
    async fn call(&self, agent: &Agent, arguments: Map<String, Value>) -> CallToolResult {
        if let Err(problem) = check_arguments(agent, &arguments) {
            return self.failed(&problem);
        }
        let options = RunOptions {
            timeout: Duration::from_millis(crate::api::DEFAULT_TIMEOUT_MS),
            agents: crate::api::served_agents_of(&self.agents, &self.equipment, agent),
            ..RunOptions::default()
        }
        .with_context_json(&arguments);
        let equipment = &*self.equipment;
        let outcome = match &self.store {
            None => {
                driver::run_with_tools(
                    agent.program.clone(),
                    options,
                    &*equipment.provider,
                    &equipment.toolbox,
                )
                .await
            }
            Some(store) => {
                let run = NewDurableRun {
                    id: durable::new_run_id(),
                    program: agent.program.clone(),
                    options,
                };
                let id = run.id.clone();
                tracing::info!(run_id = %id, agent = %agent.name, "run started");
                let started = durable::start(
                    &**store,
                    run,
                    &*equipment.provider,
                    &equipment.toolbox,
                    None,
                    &equipment.durable,
                )
                .await;
                match started {
                    Ok(durable::Ended::Finished(finished)) => finished.outcome,
                    // An MCP client cannot answer: the run waits in the store for an
                    // answer through `aplc resume` or the service (spec/human.md).
                    Ok(durable::Ended::Waiting(waiting)) => {
                        let lines: Vec<String> =
                            waiting.pending.iter().map(|p| p.waiting_line()).collect();
                        return self.failed(&format!(
                            "run `{id}` is waiting for a person: {}",
                            lines.join("; ")
                        ));
                    }
                    // The store failed: the run stays resumable from its last commit.
                    Err(e) => return self.failed(&format!("run `{id}`: {e}")),
                }
            }
        };
        self.result_of(agent, &outcome)
    }

    /// `result_json` as structured content (and as text, for clients that read only
    /// text) when the run set one, else `result_text`; a failed run is an error result.
    /// Redacted: a secret a run saw never reaches the client.
    fn result_of(&self, agent: &Agent, outcome: &RunOutcome) -> CallToolResult {
        if let Some(error) = &outcome.error {
            tracing::info!(agent = %agent.name, error = %error.kind.as_str(), "run failed");
            return self.failed(&run_error_text(error));
        }
        let redactor = &self.equipment.durable.redactor;
        let mut variables = match outcome.variables_json() {
            Value::Object(variables) => variables,
            _ => Map::new(),
        };
        match variables.remove(aplc_vm::names::RESULT_JSON) {
            Some(json) if !json.is_null() => CallToolResult::structured(redactor.redact_json(json)),
            _ => CallToolResult::success(vec![ContentBlock::text(
                redactor.redact(&outcome.result_text()),
            )]),
        }
    }

    /// An error result with `message`, redacted.
    fn failed(&self, message: &str) -> CallToolResult {
        let message = self.equipment.durable.redactor.redact(message);
        CallToolResult::error(vec![ContentBlock::text(message)])
    }
}

impl rmcp::ServerHandler for AgentTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("aplc", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Each tool runs an APL agent with its arguments as the run's initial context.",
            )
    }

    fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<ListToolsResult, McpError>> + MaybeSendFuture + '_ {
        let tools: Vec<Tool> = self
            .agents
            .list()
            .iter()
            .map(|agent| super::tools::tool_of(agent))
            .collect();
        std::future::ready(Ok(ListToolsResult::with_all_items(tools)))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.agents
            .get(name)
            .map(|agent| super::tools::tool_of(&agent))
    }

    /// Runs the agent; a call the client cancels (`notifications/cancelled`) drops its
    /// run, as a cancelled `aplc run` does (a durable one stays resumable).
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let Some(agent) = self.agents.get(&request.name) else {
            return Err(McpError::invalid_params(
                format!(
                    "unknown tool `{}`",
                    aplc_vm::text::truncate_chars(&request.name, 100)
                ),
                None,
            ));
        };
        let arguments = request.arguments.unwrap_or_default();
        tokio::select! {
            result = self.call(&agent, arguments) => Ok(result.into()),
            () = context.ct.cancelled() => Err(McpError::internal_error(
                "the call was cancelled by the client",
                None,
            )),
        }
    }

    /// A request rmcp could not parse as one it knows comes here: for `tools/call`,
    /// params of the wrong shape (`arguments` not an object, no `name`), which rmcp
    /// would answer with a bare "method not found: tools/call".
    fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<CustomResult, McpError>> + MaybeSendFuture + '_ {
        let error = if request.method == "tools/call" {
            McpError::new(
                ErrorCode::INVALID_PARAMS,
                "tools/call: `params` must be an object with `name`, a tool's name, and \
                 optionally `arguments`, an object",
                None,
            )
        } else {
            McpError::new(
                ErrorCode::METHOD_NOT_FOUND,
                format!(
                    "unknown method `{}`",
                    aplc_vm::text::truncate_chars(&request.method, 100)
                ),
                None,
            )
        };
        std::future::ready(Err(error))
    }
}

/// Why `arguments` cannot start a run of `agent`: a name a run cannot set, an argument
/// the agent does not declare (when it declares inputs), or a missing input.
fn check_arguments(agent: &Agent, arguments: &Map<String, Value>) -> Result<(), String> {
    if let Some(problem) = crate::agents::unsettable(arguments) {
        return Err(problem);
    }
    if !agent.inputs.is_empty()
        && let Some(extra) = arguments.keys().find(|k| !agent.inputs.contains(k))
    {
        return Err(format!(
            "agent `{}` takes no argument `{extra}`; its inputs: {}",
            agent.name,
            agent.inputs.join(", ")
        ));
    }
    let missing = agent.missing_inputs(arguments);
    if missing.is_empty() {
        return Ok(());
    }
    Err(missing
        .iter()
        .map(|input| format!("missing input: {input}"))
        .collect::<Vec<_>>()
        .join("\n"))
}

/// A run error as the caller reads it: the message, with the step it happened in.
fn run_error_text(error: &aplc_vm::RunError) -> String {
    match &error.step {
        Some(step) => format!("{} (in step `{step}`)", error.message),
        None => error.message.clone(),
    }
}

//! Embedding aplc in a Rust service: load an agent once, run it many times at once.
//!
//! [`SupportAgent`] is what a service keeps in its shared state: the compiled
//! [`Program`] (immutable, `Send + Sync`, every template compiled once), one HTTP
//! provider (one connection pool for every run) and one [`Toolbox`] with a Rust closure
//! tool. [`SupportAgent::reply`] is what a request handler calls: it starts one run with
//! the request's inputs and maps the outcome to a reply or a typed error.
//!
//! [`fake_model`] is a tiny OpenAI-compatible server on 127.0.0.1 so that the example
//! (and its test, which CI runs) needs no network and no API key. Point
//! [`SupportAgent::new`] at `https://api.openai.com` and a real key, and nothing else
//! changes.

pub mod fake_model;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use aplc_compiler::{Options, Severity, compile, render};
use aplc_runtime::driver::{self, Toolbox};
use aplc_runtime::openai::{OpenAiConfig, OpenAiProvider};
use aplc_vm::tools::ToolSpec;
use aplc_vm::{Limits, Program, RunErrorKind, RunOptions};
use serde_json::{Value as Json, json};

/// The agent's source, compiled when the service starts.
pub const AGENT_SOURCE: &str = include_str!("../agent.apl");

/// An agent loaded once and shared by every request.
pub struct SupportAgent {
    program: Arc<Program>,
    provider: OpenAiProvider,
    tools: Toolbox,
}

/// Why a reply could not be produced, by whose fault: a service maps these to status
/// codes from the kind, never from message text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyError {
    /// The request lacked a declared input (`missing input: ticket`): a client error.
    BadRequest(String),
    /// The run failed (timeout, budget, unknown step), or it finished but its last step
    /// ended with errors (a provider or tool failure): a server-side error.
    Failed(String),
}

impl SupportAgent {
    /// Compiles the agent and sets up the provider and the tools. Call once at start-up.
    pub fn new(base_url: &str, api_key: &str) -> Result<SupportAgent, String> {
        let program = Arc::new(load_program(AGENT_SOURCE, "agent.apl")?);
        let provider = OpenAiProvider::new(
            OpenAiConfig::new()
                .base_url(base_url)
                .api_key(api_key)
                .request_timeout(Duration::from_secs(30)),
        )
        .map_err(|e| e.to_string())?;
        Ok(SupportAgent {
            program,
            provider,
            tools: toolbox()?,
        })
    }

    /// Runs the agent for one ticket. `None` shows what a request without the declared
    /// input gets: the run fails before any provider call.
    pub async fn reply(&self, ticket: Option<&str>) -> Result<String, ReplyError> {
        let mut inputs = serde_json::Map::new();
        if let Some(ticket) = ticket {
            inputs.insert("ticket".into(), Json::from(ticket));
        }
        let options = RunOptions {
            timeout: Duration::from_secs(60),
            max_runs: Some(4),
            ..RunOptions::default()
        }
        .with_context_json(&inputs);
        // `Program` is behind an `Arc`: starting a run copies no templates.
        let outcome =
            driver::run_with_tools(self.program.clone(), options, &self.provider, &self.tools)
                .await;
        if let Some(error) = outcome.error {
            return Err(match error.kind {
                RunErrorKind::MissingInput | RunErrorKind::InvalidOptions => {
                    ReplyError::BadRequest(error.message)
                }
                _ => ReplyError::Failed(error.message),
            });
        }
        if !outcome.last_step_errors.is_empty() {
            return Err(ReplyError::Failed(outcome.last_step_errors.join("; ")));
        }
        Ok(outcome.result_text())
    }
}

/// Compiles `.apl` source into a program, or returns the rendered diagnostics.
///
/// A service that deploys bundles built with `aplc build` calls
/// `Program::load(&bytes)` instead; it then needs only `aplc-vm`.
pub fn load_program(source: &str, file_name: &str) -> Result<Program, String> {
    let compilation = compile(source, file_name, &Options::default());
    // Warnings are worth failing on at start-up: they are usually a typo in the agent.
    if compilation
        .diagnostics
        .iter()
        .any(|d| d.severity == Severity::Warning)
        || compilation.has_errors()
    {
        return Err(render(&compilation.diagnostics, file_name, source, false));
    }
    let bundle = compilation
        .bundle
        .ok_or_else(|| format!("{file_name}: no bundle"))?;
    Program::from_bundle(bundle, Limits::default()).map_err(|e| e.to_string())
}

/// The tools: `lookup_order`, a Rust closure over the service's own data.
fn toolbox() -> Result<Toolbox, String> {
    let orders: Arc<HashMap<u64, &'static str>> = Arc::new(HashMap::from([
        (40, "being packed"),
        (41, "shipped"),
        (42, "delivered"),
        (43, "refunded"),
    ]));
    let spec = ToolSpec::new(json!({
        "name": "lookup_order",
        "description": "The status of an order",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "integer"}},
            "required": ["order_id"],
            "additionalProperties": false
        }
    }))
    .map_err(|e| e.to_string())?;
    let mut tools = Toolbox::new();
    // The machine has checked the arguments against `parameters` before the call, so
    // `order_id` is an integer here; an unknown order is an ordinary tool error.
    tools
        .register_fn(spec, move |arguments, _context| {
            let id = arguments["order_id"].as_u64().unwrap_or_default();
            match orders.get(&id) {
                Some(status) => Ok(json!({"id": id, "status": status})),
                None => Err(format!("no order {id}")),
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(tools)
}

/// The example end to end: starts the fake model, loads the agent, runs `tickets` at
/// once, and returns the replies in ticket order.
pub async fn demo(tickets: &[String]) -> Result<Vec<Result<String, ReplyError>>, String> {
    let model = fake_model::FakeModel::start()
        .await
        .map_err(|e| format!("cannot start the fake model server: {e}"))?;
    let agent = Arc::new(SupportAgent::new(&model.base_url(), fake_model::API_KEY)?);
    let mut runs = tokio::task::JoinSet::new();
    for (i, ticket) in tickets.iter().enumerate() {
        let agent = agent.clone();
        let ticket = ticket.clone();
        runs.spawn(async move { (i, agent.reply(Some(&ticket)).await) });
    }
    let mut replies = vec![Err(ReplyError::Failed("not run".into())); tickets.len()];
    while let Some(joined) = runs.join_next().await {
        let (i, reply) = joined.map_err(|e| format!("a run panicked: {e}"))?;
        replies[i] = reply;
    }
    Ok(replies)
}

//! The stored form of a durable run's options and tools: what a resume (or `aplc runs
//! show`) needs to rebuild them, and nothing secret.

use std::time::Duration;

use serde_json::{Value as Json, json};

use super::{DurableError, DurableOptions};
use crate::driver::Toolbox;
use aplc_vm::RunOptions;
use aplc_vm::tools::{
    Approval, HumanTool, Idempotency, IdempotencyKey, ToolOrigin, ToolRegistry, ToolSpec,
};

/// What identifies a run's tools: names, descriptors, `with_context`, idempotency and,
/// for an MCP server's tool, the server's name (its events name it). A resume with other
/// tools would replay into a different run.
pub(super) fn tools_fingerprint(toolbox: &Toolbox) -> Json {
    let registry = toolbox.registry();
    let mut names: Vec<&str> = registry.names().collect();
    names.sort_unstable();
    Json::Array(
        names
            .into_iter()
            .filter_map(|name| registry.get(name))
            .map(|spec| {
                let idempotency = spec.idempotency().map(|idem| {
                    let key = match &idem.key {
                        IdempotencyKey::Auto => json!("auto"),
                        IdempotencyKey::Params(params) => json!(params),
                    };
                    let ttl = idem
                        .ttl
                        .map(|ttl| u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
                    json!({ "key": key, "ttl_ms": ttl })
                });
                let mut tool = json!({
                    "descriptor": spec.descriptor(),
                    "with_context": spec.with_context_enabled(),
                    "idempotency": idempotency,
                });
                // Only tools with an origin have the key, so a journal written before
                // origins existed still matches its tools.
                if let Some(origin) = spec.origin() {
                    tool["origin"] = json!({"source": origin.source(), "server": origin.server()});
                }
                // The same for people in the loop: a resume must ask the same questions.
                if let Some(approval) = spec.approval() {
                    tool["approval"] = json!({"timeout_ms": approval.timeout.map(ms)});
                }
                if let Some(human) = spec.human_tool() {
                    tool["human"] = json!({
                        "prompt": human.prompt,
                        "result_schema": human.result_schema,
                        "timeout_ms": human.timeout.map(ms),
                    });
                }
                tool
            })
            .collect(),
    )
}

/// A duration in whole milliseconds, saturating.
fn ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The tool descriptors of [`tools_fingerprint`], as a registry: enough to replay a run
/// for inspection, without the tools themselves.
pub(super) fn registry_from_fingerprint(fingerprint: &Json) -> Result<ToolRegistry, String> {
    let mut registry = ToolRegistry::new();
    let tools = fingerprint.as_array().ok_or("the tools are not a list")?;
    for tool in tools {
        let descriptor = tool
            .get("descriptor")
            .cloned()
            .ok_or("a tool has no descriptor")?;
        let mut spec = ToolSpec::new(descriptor)
            .map_err(|e| e.to_string())?
            .with_context(tool.get("with_context").and_then(Json::as_bool) == Some(true));
        if let Some(idem) = tool.get("idempotency").filter(|i| !i.is_null()) {
            let key = match idem.get("key") {
                Some(Json::Array(params)) => IdempotencyKey::Params(
                    params
                        .iter()
                        .map(|p| p.as_str().map(str::to_owned).ok_or("a bad key parameter"))
                        .collect::<Result<_, _>>()?,
                ),
                _ => IdempotencyKey::Auto,
            };
            let ttl = idem
                .get("ttl_ms")
                .and_then(Json::as_u64)
                .map(Duration::from_millis);
            spec = spec.idempotent(Idempotency { key, ttl });
        }
        if let Some(server) = tool
            .get("origin")
            .filter(|o| o.get("source").and_then(Json::as_str) == Some("mcp"))
            .and_then(|o| o.get("server"))
            .and_then(Json::as_str)
        {
            spec = spec.with_origin(ToolOrigin::Mcp {
                server: server.to_owned(),
            });
        }
        let timeout = |json: &Json| {
            json.get("timeout_ms")
                .and_then(Json::as_u64)
                .map(Duration::from_millis)
        };
        if let Some(approval) = tool.get("approval") {
            spec = spec.requires_approval(Approval {
                timeout: timeout(approval),
            });
        }
        if let Some(human) = tool.get("human") {
            spec = spec
                .human(HumanTool {
                    prompt: human
                        .get("prompt")
                        .and_then(Json::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                    result_schema: human.get("result_schema").filter(|s| !s.is_null()).cloned(),
                    timeout: timeout(human),
                })
                .map_err(|e| e.to_string())?;
        }
        registry.register(spec).map_err(|e| e.to_string())?;
    }
    Ok(registry)
}

/// The stored form of a run's options: what a resume needs to rebuild them. No secret is
/// among them (`with_context` is the caller's data; keys live in providers).
pub(super) fn options_json(
    options: &RunOptions,
    toolbox: &Toolbox,
    config: &DurableOptions,
) -> Json {
    let context: serde_json::Map<String, Json> = options
        .with_context
        .iter()
        .map(|(name, value)| {
            let json = serde_json::to_value(value).unwrap_or(Json::Null);
            (name.clone(), json)
        })
        .collect();
    json!({
        "with_context": context,
        "timeout_ms": u64::try_from(options.timeout.as_millis()).unwrap_or(u64::MAX),
        "max_runs": options.max_runs,
        "max_steps": options.max_steps,
        "max_agent_depth": options.max_agent_depth,
        "phase_times": options.phase_times,
        "checkpoint_every": config.checkpoint_every,
        "tools": tools_fingerprint(toolbox),
    })
}

/// Rebuilds the run options from [`options_json`].
pub(super) fn options_from_json(id: &str, json: &Json) -> Result<RunOptions, DurableError> {
    let bad = |what: &str| DurableError::Journal {
        id: id.to_owned(),
        message: format!("stored run options: {what}"),
    };
    let object = json.as_object().ok_or_else(|| bad("not an object"))?;
    let context = object
        .get("with_context")
        .and_then(Json::as_object)
        .ok_or_else(|| bad("no with_context"))?;
    let timeout = object
        .get("timeout_ms")
        .and_then(Json::as_u64)
        .ok_or_else(|| bad("no timeout_ms"))?;
    let max_steps = object
        .get("max_steps")
        .and_then(Json::as_u64)
        .ok_or_else(|| bad("no max_steps"))?;
    let max_runs = match object.get("max_runs") {
        None | Some(Json::Null) => None,
        Some(value) => Some(value.as_u64().ok_or_else(|| bad("bad max_runs"))?),
    };
    // Runs stored before sub-agents have none: the default.
    let max_agent_depth = match object.get("max_agent_depth") {
        None | Some(Json::Null) => aplc_vm::DEFAULT_MAX_AGENT_DEPTH,
        Some(value) => value
            .as_u64()
            .and_then(|depth| u32::try_from(depth).ok())
            .ok_or_else(|| bad("bad max_agent_depth"))?,
    };
    // Runs stored before it had their events on, so phase times (`spec/durability.md`,
    // "Events").
    let phase_times = match object.get("phase_times") {
        None | Some(Json::Null) => true,
        Some(value) => value.as_bool().ok_or_else(|| bad("bad phase_times"))?,
    };
    Ok(RunOptions {
        timeout: Duration::from_millis(timeout),
        max_runs,
        max_steps,
        max_agent_depth,
        phase_times,
        ..RunOptions::default()
    }
    .with_context_json(context))
}

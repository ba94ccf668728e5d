//! Native tools (§5, §2.2.2–§2.2.4): what the machine knows about them.
//!
//! This is the pure half: descriptors, the checks that run before a tool may execute,
//! and the idempotency ledger. Executing a tool is I/O, so the machine hands each
//! approved call to its driver as [`crate::Action::CallTool`]; the driver's `Toolbox`
//! holds the implementations.
//!
//! Failure semantics follow the tool-runtime seed: a tool failure never aborts the run;
//! parameters are validated before the handler runs; the deadline is checked before every
//! call; successful results are cached under a canonical hash of their arguments.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value as Json;

use crate::provider::exchange::ToolDefinition;

/// One registered tool: its OpenAI function descriptor and how to call it.
#[derive(Clone)]
pub struct ToolSpec {
    name: String,
    descriptor: Json,
    /// `{"type": "function", "function": descriptor}` as a template value, built once:
    /// `describe_tools` runs before every provider call.
    described: minijinja::Value,
    /// The typed definition the provider request carries, built once too.
    definition: ToolDefinition,
    with_context: bool,
    idempotency: Option<Idempotency>,
    validator: Option<Arc<jsonschema::Validator>>,
    origin: Option<ToolOrigin>,
    /// A person approves each call before it runs (`spec/human.md` §1.1).
    approval: Option<Approval>,
    /// A person gives each call's result (`spec/human.md` §1.2).
    human: Option<HumanTool>,
    /// An agent runs for each call, its arguments as its context (`spec/agents.md` §1.2).
    agent: Option<String>,
    /// The descriptor was left out: the parameters come from the agent's declared
    /// inputs once the run knows the agent ([`ToolRegistry::with_agent_inputs`]).
    agent_inputs: bool,
}

impl std::fmt::Debug for ToolSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolSpec")
            .field("name", &self.name)
            .field("with_context", &self.with_context)
            .field("idempotency", &self.idempotency)
            .field("origin", &self.origin)
            .field("approval", &self.approval)
            .field("human", &self.human)
            .field("agent", &self.agent)
            .finish_non_exhaustive()
    }
}

/// Why a tool descriptor was refused ([`ToolSpec::new`]) or a tool could not be added to a
/// registry ([`ToolRegistry::register`]). Each names the tool once it has a name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolSpecError {
    /// The descriptor is not a JSON object.
    #[error("a tool descriptor must be a JSON object")]
    NotAnObject,
    /// The descriptor has no `name`, or not a non-empty string.
    #[error("a tool descriptor needs a non-empty string `name`")]
    NoName,
    /// `description` is there but not a string.
    #[error("tool `{name}`: `description` must be a string")]
    Description {
        /// The tool.
        name: String,
    },
    /// `parameters` is an object but not a JSON Schema the validator compiles.
    #[error("tool `{name}`: invalid `parameters` schema: {message}")]
    Schema {
        /// The tool.
        name: String,
        /// What the schema compiler said.
        message: String,
    },
    /// `parameters` is there but not an object.
    #[error("tool `{name}`: `parameters` must be a JSON Schema object")]
    ParametersNotAnObject {
        /// The tool.
        name: String,
    },
    /// A registry already has a tool of this name.
    #[error("tool `{name}` is registered twice")]
    Duplicate {
        /// The tool.
        name: String,
    },
}

/// Where a tool comes from, when its host says: the machine copies it into the tool's
/// `tool_call` events (`source`, `server`; `spec/events.md`). A tool without one (a
/// manifest's command tool, a tool an embedder registers) has `null` there.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ToolOrigin {
    /// A tool of an MCP server (`spec/mcp.md`).
    Mcp {
        /// The server's name: its key in the manifest's `mcpServers`.
        server: String,
    },
}

impl ToolOrigin {
    /// The `source` of a `tool_call` event: `mcp`.
    pub fn source(&self) -> &'static str {
        match self {
            ToolOrigin::Mcp { .. } => "mcp",
        }
    }

    /// The `server` of a `tool_call` event: the MCP server's name.
    pub fn server(&self) -> Option<&str> {
        match self {
            ToolOrigin::Mcp { server } => Some(server),
        }
    }
}

/// A tool whose calls a person approves before they run (`"approval": "required"`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Approval {
    /// How long a request waits (`approval_timeout_ms`); then the call counts as denied.
    pub timeout: Option<Duration>,
}

/// A tool whose result a person gives (a manifest's `human` entry).
#[derive(Debug, Clone, PartialEq)]
pub struct HumanTool {
    /// What the person reads.
    pub prompt: String,
    /// What the answer must satisfy.
    pub result_schema: Option<Json>,
    /// How long a request waits; then the call fails.
    pub timeout: Option<Duration>,
}

/// When a tool's successful results may be reused within a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idempotency {
    /// Which arguments make up the key.
    pub key: IdempotencyKey,
    /// How long a cached result stays valid; `None` is the whole run.
    pub ttl: Option<Duration>,
}

/// The arguments an idempotency key is computed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdempotencyKey {
    /// Every argument.
    Auto,
    /// Only these parameters (a missing one counts as `null`).
    Params(Vec<String>),
}

impl ToolSpec {
    /// A tool from its OpenAI function descriptor (`{"name", "description",
    /// "parameters", "strict"?}`). The `parameters` schema is compiled here, so an invalid
    /// schema is an error at registration, not at the first call.
    pub fn new(descriptor: Json) -> Result<ToolSpec, ToolSpecError> {
        let Json::Object(map) = &descriptor else {
            return Err(ToolSpecError::NotAnObject);
        };
        let name = match map.get("name") {
            Some(Json::String(s)) if !s.is_empty() => s.clone(),
            _ => return Err(ToolSpecError::NoName),
        };
        if let Some(d) = map.get("description")
            && !d.is_string()
        {
            return Err(ToolSpecError::Description { name });
        }
        let validator = match map.get("parameters") {
            None => None,
            Some(schema @ Json::Object(_)) => Some(Arc::new(
                jsonschema::validator_for(schema).map_err(|e| ToolSpecError::Schema {
                    message: e.to_string(),
                    name: name.clone(),
                })?,
            )),
            Some(_) => return Err(ToolSpecError::ParametersNotAnObject { name }),
        };
        let described = crate::template::store::value_from_json(
            &serde_json::json!({"type": "function", "function": descriptor}),
        );
        let definition = ToolDefinition {
            name: name.clone(),
            description: map
                .get("description")
                .and_then(Json::as_str)
                .unwrap_or_default()
                .to_owned(),
            parameters: map.get("parameters").cloned().unwrap_or(Json::Null),
            strict: map.get("strict").and_then(Json::as_bool),
        };
        Ok(ToolSpec {
            name,
            descriptor,
            described,
            definition,
            with_context: false,
            idempotency: None,
            validator,
            origin: None,
            approval: None,
            human: None,
            agent: None,
            agent_inputs: false,
        })
    }

    /// An agent tool (see [`ToolSpec::agent`]) whose manifest entry has no descriptor:
    /// until a run knows the agent, it takes any object; then its parameters are the
    /// agent's declared inputs, all required, and its description the agent's.
    pub fn for_agent(name: &str, agent: &str) -> Result<ToolSpec, ToolSpecError> {
        let descriptor = serde_json::json!({
            "name": name,
            "description": format!("Runs the agent `{agent}`."),
            "parameters": {"type": "object"},
        });
        let mut spec = ToolSpec::new(descriptor)?.agent(agent);
        spec.agent_inputs = true;
        Ok(spec)
    }

    /// Makes each call of the tool a run of the agent `name`, with the call's arguments as
    /// its initial context (`spec/agents.md` §1.2). The child's own tools, approvals and
    /// people are its business: the call itself is never idempotent and needs no
    /// approval, so both are dropped.
    pub fn agent(mut self, name: impl Into<String>) -> ToolSpec {
        self.agent = Some(name.into());
        self.idempotency = None;
        self.approval = None;
        self.human = None;
        self
    }

    /// The agent each call runs, for an agent tool.
    pub fn agent_tool(&self) -> Option<&str> {
        self.agent.as_deref()
    }

    /// This agent tool with its parameters made from `inputs`, the agent's declared
    /// inputs, and the agent's `description` if it has one.
    fn with_inputs(&self, inputs: &[String], description: Option<&str>) -> ToolSpec {
        let properties: serde_json::Map<String, Json> = inputs
            .iter()
            .map(|input| (input.clone(), serde_json::json!({})))
            .collect();
        let descriptor = serde_json::json!({
            "name": self.name,
            "description": description
                .map(str::to_owned)
                .unwrap_or_else(|| format!("Runs the agent `{}`.", self.agent.as_deref().unwrap_or(""))),
            "parameters": {"type": "object", "properties": properties, "required": inputs},
        });
        match ToolSpec::new(descriptor) {
            Ok(mut spec) => {
                spec.agent = self.agent.clone();
                spec.with_context = self.with_context;
                spec.origin = self.origin.clone();
                spec
            }
            // The descriptor is made here, valid by construction; keep the tool as it was
            // rather than lose it.
            Err(_) => self.clone(),
        }
    }

    /// Makes every call of the tool wait for a person's approval.
    pub fn requires_approval(mut self, approval: Approval) -> ToolSpec {
        self.approval = Some(approval);
        self
    }

    /// Makes the tool's result a person's answer. Its `result_schema` must be a JSON
    /// Schema. A human tool is never idempotent and needs no approval: both are dropped.
    pub fn human(mut self, human: HumanTool) -> Result<ToolSpec, ToolSpecError> {
        if let Some(schema) = &human.result_schema {
            crate::provider::human::compile_schema(schema).map_err(|message| {
                ToolSpecError::Schema {
                    name: self.name.clone(),
                    message: format!("`result_schema`: {message}"),
                }
            })?;
        }
        self.human = Some(human);
        self.idempotency = None;
        self.approval = None;
        Ok(self)
    }

    /// Whether, and how, calls wait for a person's approval.
    pub fn approval(&self) -> Option<&Approval> {
        self.approval.as_ref()
    }

    /// The human tool's settings, if a person gives its results.
    pub fn human_tool(&self) -> Option<&HumanTool> {
        self.human.as_ref()
    }

    /// Passes the run's context to the tool with its arguments.
    pub fn with_context(mut self, yes: bool) -> ToolSpec {
        self.with_context = yes;
        self
    }

    /// Lets successful results be reused within a run.
    pub fn idempotent(mut self, idempotency: Idempotency) -> ToolSpec {
        self.idempotency = Some(idempotency);
        self
    }

    /// Says where the tool comes from, for its events.
    pub fn with_origin(mut self, origin: ToolOrigin) -> ToolSpec {
        self.origin = Some(origin);
        self
    }

    /// Where the tool comes from, if its host said.
    pub fn origin(&self) -> Option<&ToolOrigin> {
        self.origin.as_ref()
    }

    /// Whether the tool receives the run's context.
    pub fn with_context_enabled(&self) -> bool {
        self.with_context
    }

    /// How the tool is idempotent, if it is declared so.
    pub fn idempotency(&self) -> Option<&Idempotency> {
        self.idempotency.as_ref()
    }

    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The OpenAI function descriptor.
    pub fn descriptor(&self) -> &Json {
        &self.descriptor
    }
}

/// The tools a run may offer to the model.
#[derive(Debug, Clone, Default)]
pub struct ToolRegistry {
    tools: Vec<ToolSpec>,
    by_name: HashMap<String, usize>,
    /// Every tool's definition, in registration order: what a request offers when every
    /// tool is allowed, shared by an `Arc` clone.
    definitions: Arc<[ToolDefinition]>,
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> ToolRegistry {
        ToolRegistry::default()
    }

    /// Adds a tool; a second tool with the same name is an error.
    pub fn register(&mut self, spec: ToolSpec) -> Result<(), ToolSpecError> {
        if self.by_name.contains_key(&spec.name) {
            return Err(ToolSpecError::Duplicate { name: spec.name });
        }
        self.by_name.insert(spec.name.clone(), self.tools.len());
        self.tools.push(spec);
        self.definitions = self.tools.iter().map(|t| t.definition.clone()).collect();
        Ok(())
    }

    /// This registry with the agent tools that left out their descriptor given the
    /// declared inputs of their agent (`inputs` looks an agent up: its inputs and its
    /// description); `None` if there is none to change, so a run without such tools
    /// shares the registry as it is.
    pub fn with_agent_inputs<'a>(
        &self,
        inputs: impl Fn(&str) -> Option<(&'a [String], Option<&'a str>)>,
    ) -> Option<ToolRegistry> {
        if !self.tools.iter().any(|t| t.agent_inputs) {
            return None;
        }
        let mut registry = ToolRegistry::new();
        for spec in &self.tools {
            let spec = match (spec.agent_inputs, spec.agent.as_deref().and_then(&inputs)) {
                (true, Some((inputs, description))) => spec.with_inputs(inputs, description),
                _ => spec.clone(),
            };
            // The names were unique in `self`.
            let _ = registry.register(spec);
        }
        Some(registry)
    }

    /// True if a tool of the registry runs an agent ([`ToolSpec::agent`]).
    pub fn has_agent_tools(&self) -> bool {
        self.tools.iter().any(|t| t.agent.is_some())
    }

    /// The tool called `name`.
    pub fn get(&self, name: &str) -> Option<&ToolSpec> {
        self.by_name.get(name).map(|&i| &self.tools[i])
    }

    /// The tools' names, in registration order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.iter().map(|t| t.name.as_str())
    }

    /// Number of tools.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// True without tools.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// `describe_tools` (§2.2.1): the descriptors of the allowed tools, in registration
    /// order, in the Chat Completions format `{"type": "function", "function": {...}}`.
    pub fn describe(&self, allowed: &Allowed) -> Vec<minijinja::Value> {
        self.tools
            .iter()
            .filter(|t| allowed.permits(&t.name))
            .map(|t| t.described.clone())
            .collect()
    }

    /// The typed definitions of the allowed tools, in registration order, for the
    /// provider request. When every tool is allowed this is an `Arc` clone.
    pub fn definitions(&self, allowed: &Allowed) -> Arc<[ToolDefinition]> {
        match allowed {
            Allowed::All => self.definitions.clone(),
            _ => self
                .tools
                .iter()
                .filter(|t| allowed.permits(&t.name))
                .map(|t| t.definition.clone())
                .collect(),
        }
    }
}

/// The `allowed_tools` variable, read once per call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allowed {
    /// Empty list: every registered tool.
    All,
    /// Only these.
    Only(Vec<String>),
    /// Not a list of strings: nothing is allowed (it is a security boundary).
    Invalid(String),
}

impl Allowed {
    /// Reads the `allowed_tools` value.
    pub fn from_value(value: Option<&minijinja::Value>) -> Allowed {
        let Some(value) = value.filter(|v| !v.is_none() && !v.is_undefined()) else {
            return Allowed::All;
        };
        if value.kind() != minijinja::value::ValueKind::Seq {
            return Allowed::Invalid(format!(
                "`allowed_tools` must be a list of tool names, found {}",
                crate::text::value_kind(value)
            ));
        }
        let mut names = Vec::new();
        for item in value.try_iter().into_iter().flatten() {
            match item.as_str() {
                Some(s) => names.push(s.to_string()),
                None => {
                    return Allowed::Invalid(format!(
                        "`allowed_tools` must be a list of tool names, found an item `{item}`"
                    ));
                }
            }
        }
        if names.is_empty() {
            Allowed::All
        } else {
            Allowed::Only(names)
        }
    }

    /// Whether a tool called `name` may run.
    pub fn permits(&self, name: &str) -> bool {
        match self {
            Allowed::All => true,
            Allowed::Only(names) => names.iter().any(|n| n == name),
            Allowed::Invalid(_) => false,
        }
    }
}

/// A tool call the machine approved: the driver executes it and hands back the result.
#[derive(Debug, Clone)]
pub struct ToolInvocation {
    /// The tool call id exactly as the model gave it.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments: a JSON object that passed the tool's `parameters` schema.
    pub arguments: Json,
    /// The run's variables, when the tool is registered `with_context`. Never holds
    /// secrets: they are not variables.
    pub context: Option<Json>,
}

/// Checks a call before it may run. `Ok` holds the parsed arguments.
pub(crate) fn check_call(
    registry: &ToolRegistry,
    allowed: &Allowed,
    name: &str,
    arguments: &Json,
) -> Result<Json, String> {
    let Some(spec) = registry.get(name) else {
        return Err(if registry.is_empty() {
            "no tools are registered".to_string()
        } else {
            "no tool with this name is registered".to_string()
        });
    };
    if let Allowed::Invalid(why) = allowed {
        return Err(format!("refused: {why}"));
    }
    if !allowed.permits(name) {
        return Err("refused: the tool is not in `allowed_tools`".to_string());
    }
    let args = match arguments {
        Json::String(text) if text.trim().is_empty() => Json::Object(Default::default()),
        Json::String(text) => {
            let args = serde_json::from_str::<Json>(text)
                .map_err(|e| format!("`arguments` is not valid JSON: {e}"))?;
            // serde_json reads an integer beyond 64 bits as the nearest float: the tool
            // would get a different number than the model wrote. Refuse it instead.
            if let Some(integer) = oversized_integer(text) {
                return Err(format!(
                    "`arguments` holds the integer {integer}, outside the 64-bit integer \
                     range; it would reach the tool rounded, so the call is refused"
                ));
            }
            args
        }
        other => other.clone(),
    };
    if !args.is_object() {
        return Err(format!(
            "`arguments` must be a JSON object, found {}",
            crate::text::json_kind(&args)
        ));
    }
    if let Some(validator) = &spec.validator {
        let problems: Vec<String> =
            crate::provider::human::schema_problems(validator, &args).collect();
        if !problems.is_empty() {
            return Err(format!("invalid arguments: {}", problems.join("; ")));
        }
    }
    Ok(args)
}

/// The first integer literal in the JSON `text` (outside strings) that is neither an
/// `i64` nor a `u64`, shortened for messages. `text` is valid JSON.
fn oversized_integer(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'"' => {
                // Skip the string, escapes included.
                at += 1;
                while at < bytes.len() && bytes[at] != b'"' {
                    at += if bytes[at] == b'\\' { 2 } else { 1 };
                }
                at += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = at;
                while at < bytes.len()
                    && matches!(bytes[at], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    at += 1;
                }
                let number = &text[start..at];
                let integer = !number.contains(['.', 'e', 'E']);
                if integer && number.parse::<i64>().is_err() && number.parse::<u64>().is_err() {
                    return Some(if number.len() > 40 {
                        format!("{}… ({} digits)", &number[..40], number.len())
                    } else {
                        number.to_owned()
                    });
                }
            }
            _ => at += 1,
        }
    }
    None
}

/// The per-run idempotency ledger: successful results by tool and argument hash, with
/// the run-relative time each was stored at.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    entries: HashMap<String, (Json, Duration)>,
}

impl Ledger {
    /// The key of a call, if the tool is idempotent.
    pub fn key(spec: &ToolSpec, args: &Json) -> Option<String> {
        let idem = spec.idempotency.as_ref()?;
        let keyed = match &idem.key {
            IdempotencyKey::Auto => args.clone(),
            IdempotencyKey::Params(params) => Json::Object(
                params
                    .iter()
                    .map(|p| (p.clone(), args.get(p).cloned().unwrap_or(Json::Null)))
                    .collect(),
            ),
        };
        let mut canonical = String::new();
        write_canonical(&mut canonical, &keyed);
        let hash = xxhash_rust::xxh3::xxh3_128(canonical.as_bytes());
        Some(format!("{}:{hash:032x}", spec.name))
    }

    /// A cached result that is still fresh at `now`.
    pub fn get(&self, spec: &ToolSpec, key: &str, now: Duration) -> Option<&Json> {
        let (value, stored) = self.entries.get(key)?;
        let ttl = spec.idempotency.as_ref()?.ttl;
        match ttl {
            Some(ttl) if now.saturating_sub(*stored) >= ttl => None,
            _ => Some(value),
        }
    }

    /// Every entry, sorted by key (checkpoints write them in a stable order).
    pub(crate) fn entries(&self) -> Vec<(&str, &Json, Duration)> {
        let mut entries: Vec<_> = (self.entries.iter())
            .map(|(key, (value, stored))| (key.as_str(), value, *stored))
            .collect();
        entries.sort_by(|a, b| a.0.cmp(b.0));
        entries
    }

    /// Remembers a successful result.
    pub fn put(&mut self, key: String, value: Json, now: Duration) {
        self.entries.insert(key, (value, now));
    }
}

/// JSON with object keys sorted, so equal arguments hash equally whatever their order.
fn write_canonical(out: &mut String, value: &Json) {
    match value {
        Json::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{}:", Json::String(k.clone()));
                write_canonical(out, &map[k]);
            }
            out.push('}');
        }
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(out, item);
            }
            out.push(']');
        }
        other => {
            let _ = write!(out, "{other}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn calc() -> ToolSpec {
        ToolSpec::new(json!({
            "name": "calc",
            "description": "Add two numbers",
            "parameters": {
                "type": "object",
                "properties": {"num1": {"type": "integer"}, "num2": {"type": "integer"}},
                "required": ["num1", "num2"],
                "additionalProperties": false
            }
        }))
        .unwrap()
    }

    fn registry() -> ToolRegistry {
        let mut r = ToolRegistry::new();
        r.register(calc()).unwrap();
        r.register(ToolSpec::new(json!({"name": "echo"})).unwrap())
            .unwrap();
        r
    }

    #[test]
    fn integers_beyond_64_bits_in_arguments_are_refused() {
        let r = registry();
        let check = |args: &str| check_call(&r, &Allowed::All, "echo", &json!(args));
        for (args, integer) in [
            (
                r#"{"n": 123456789012345678901234567890}"#,
                "123456789012345678901234567890",
            ),
            (
                r#"{"a": [1, {"b": -9223372036854775809}]}"#,
                "-9223372036854775809",
            ),
            (r#"{"n": 18446744073709551616}"#, "18446744073709551616"),
        ] {
            let e = check(args).unwrap_err();
            assert!(e.contains(integer) && e.contains("64-bit"), "{args}: {e}");
        }
        let long = format!(r#"{{"n": {}}}"#, "9".repeat(5000));
        let e = check(&long).unwrap_err();
        assert!(e.len() < 300, "{e}");
        // In range, in strings, or written as floats: passed on as they are.
        let ok = check(
            r#"{"u": 18446744073709551615, "i": -9223372036854775808, "s": "123456789012345678901234567890 \" 99999999999999999999", "f": 1.5e300}"#,
        )
        .unwrap();
        assert_eq!(ok["u"], json!(u64::MAX));
        assert_eq!(ok["i"], json!(i64::MIN));
        assert_eq!(ok["f"], json!(1.5e300));
    }

    #[test]
    fn descriptors_are_checked() {
        let error = |descriptor| ToolSpec::new(descriptor).unwrap_err();
        assert_eq!(error(json!("calc")), ToolSpecError::NotAnObject);
        assert_eq!(error(json!({"description": "x"})), ToolSpecError::NoName);
        let name = || "x".to_owned();
        assert_eq!(
            error(json!({"name": "x", "parameters": 3})),
            ToolSpecError::ParametersNotAnObject { name: name() }
        );
        let e = error(json!({"name": "x", "parameters": {"type": 12}}));
        assert!(matches!(&e, ToolSpecError::Schema { name, .. } if name == "x"));
        assert!(
            e.to_string()
                .starts_with("tool `x`: invalid `parameters` schema: "),
            "{e}"
        );
        let mut r = registry();
        let e = r.register(calc()).unwrap_err();
        assert_eq!(e.to_string(), "tool `calc` is registered twice");
    }

    #[test]
    fn describe_filters_by_allowed_tools() {
        let r = registry();
        assert_eq!(r.describe(&Allowed::All).len(), 2);
        let only = r.describe(&Allowed::Only(vec!["echo".into()]));
        let only: Vec<Json> = only
            .iter()
            .map(|v| serde_json::to_value(v).unwrap())
            .collect();
        assert_eq!(
            only,
            vec![json!({"type": "function", "function": {"name": "echo"}})]
        );
        assert!(r.describe(&Allowed::Invalid("x".into())).is_empty());
    }

    #[test]
    fn allowed_tools_values() {
        use minijinja::Value;
        assert_eq!(Allowed::from_value(None), Allowed::All);
        assert_eq!(Allowed::from_value(Some(&Value::from(()))), Allowed::All);
        assert_eq!(
            Allowed::from_value(Some(&Value::from(Vec::<Value>::new()))),
            Allowed::All
        );
        assert_eq!(
            Allowed::from_value(Some(&Value::from(vec![Value::from("calc")]))),
            Allowed::Only(vec!["calc".into()])
        );
        assert!(matches!(
            Allowed::from_value(Some(&Value::from("calc"))),
            Allowed::Invalid(_)
        ));
        assert!(matches!(
            Allowed::from_value(Some(&Value::from(vec![Value::from(1)]))),
            Allowed::Invalid(_)
        ));
    }

    #[test]
    fn checks_before_a_call() {
        let r = registry();
        let all = Allowed::All;
        let ok = check_call(&r, &all, "calc", &json!("{\"num1\": 40, \"num2\": 2}"));
        assert_eq!(ok.unwrap(), json!({"num1": 40, "num2": 2}));
        // Some servers send arguments as an object.
        assert!(check_call(&r, &all, "calc", &json!({"num1": 1, "num2": 2})).is_ok());
        assert!(check_call(&r, &all, "echo", &json!("")).is_ok());

        let err = |name: &str, args: Json, allowed: &Allowed| {
            check_call(&r, allowed, name, &args).unwrap_err()
        };
        assert!(err("nope", json!("{}"), &all).contains("no tool with this name"));
        assert!(
            check_call(&ToolRegistry::new(), &all, "calc", &json!("{}"))
                .unwrap_err()
                .contains("no tools are registered")
        );
        let only_echo = Allowed::Only(vec!["echo".into()]);
        assert!(err("calc", json!("{}"), &only_echo).contains("allowed_tools"));
        assert!(err("calc", json!("{not json"), &all).contains("not valid JSON"));
        assert!(err("calc", json!("[1, 2]"), &all).contains("must be a JSON object"));
        let e = err("calc", json!("{\"num1\": \"x\", \"num2\": 2}"), &all);
        assert!(
            e.contains("invalid arguments") && e.contains("/num1"),
            "{e}"
        );
        assert!(err("calc", json!("{\"num1\": 1}"), &all).contains("num2"));
    }

    #[test]
    fn ledger_keys_are_canonical_and_ttl_expires() {
        let auto = calc().idempotent(Idempotency {
            key: IdempotencyKey::Auto,
            ttl: Some(Duration::from_millis(100)),
        });
        let a = Ledger::key(&auto, &json!({"num1": 1, "num2": 2})).unwrap();
        let b = Ledger::key(&auto, &json!({"num2": 2, "num1": 1})).unwrap();
        let c = Ledger::key(&auto, &json!({"num1": 1, "num2": 3})).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(Ledger::key(&calc(), &json!({})).is_none(), "not idempotent");

        let by_param = calc().idempotent(Idempotency {
            key: IdempotencyKey::Params(vec!["num1".into()]),
            ttl: None,
        });
        assert_eq!(
            Ledger::key(&by_param, &json!({"num1": 1, "num2": 2})),
            Ledger::key(&by_param, &json!({"num1": 1, "num2": 9}))
        );

        let mut ledger = Ledger::default();
        let t0 = Duration::from_secs(5);
        ledger.put(a.clone(), json!(3), t0);
        assert_eq!(
            ledger.get(&auto, &a, t0 + Duration::from_millis(99)),
            Some(&json!(3))
        );
        assert_eq!(ledger.get(&auto, &a, t0 + Duration::from_millis(100)), None);
    }
}

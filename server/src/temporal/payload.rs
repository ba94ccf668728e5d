//! What goes through Temporal: the workflow's input and result, and the activities'
//! inputs and results, as JSON payloads (Temporal's default `json/plain` encoding, so
//! the `temporal` CLI and any SDK read and write them).
//!
//! None holds a secret: a provider call names its model (the worker's providers file
//! routes it and holds the keys), a tool call names its tool; results are redacted by the
//! worker that made them.

use std::sync::Arc;

use aplc_vm::tools::ToolInvocation;
use aplc_vm::{
    Completion, Message, OutputFormat, ProviderError, ProviderRequest, Sampling, ToolDefinition,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

/// `apl.Run`'s input: `{"agent", "context", "options"}` (and, after a continue-as-new,
/// what the run carries over).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunInput {
    /// The agent's name in the worker's directory.
    pub agent: String,
    /// The run's initial context.
    #[serde(default)]
    pub context: Map<String, Json>,
    /// The run's limits.
    #[serde(default)]
    pub options: RunInputOptions,
    /// Set by the run itself when it continues as new: where it goes on from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<Resume>,
}

/// What a run carries across continue-as-new (spec/temporal.md §6): a reference to its
/// checkpoints in the worker's store and a few counters, never the checkpoints: the
/// payload stays small however long the run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resume {
    /// The run's key in the store: `temporal/WORKFLOW_ID/FIRST_RUN_ID`.
    pub key: String,
    /// How many checkpoints of the run the store holds; the newest is the one to go on
    /// from.
    pub checkpoints: u64,
    /// The bundle the run is pinned to.
    pub bundle_hash: String,
    /// The run's clock at the checkpoint, in milliseconds.
    pub elapsed_ms: u64,
    /// `apl.status`'s counters so far.
    pub provider_calls: u64,
    /// (As `provider_calls`.)
    pub tool_calls: u64,
}

/// `options` of [`RunInput`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunInputOptions {
    /// The run's timeout in milliseconds (workflow time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// The most steps the run may enter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u64>,
    /// At most this many steps in one workflow run: then it checkpoints and continues as
    /// new (it does sooner when Temporal suggests it, or at [`CONTINUE_AT_EVENTS`]).
    ///
    /// [`CONTINUE_AT_EVENTS`]: super::continuation::CONTINUE_AT_EVENTS
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_every: Option<u64>,
}

/// `apl.resolve`'s answer: the bundle the run is pinned to, or why there is none.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Resolved {
    /// The content hash of the agent's bundle on the worker that resolved it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle_hash: Option<String>,
    /// Why the agent cannot run (unknown, missing inputs, an unsettable context entry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `apl.provider_call`'s input: one model request, by model name.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProviderCall {
    /// The model (the providers file routes it).
    pub model: String,
    /// The messages.
    pub messages: Vec<Message>,
    /// The tools offered.
    pub tools: Vec<ToolDefinition>,
    /// The sampling parameters set.
    pub sampling: Sampling,
    /// What the text must be.
    pub output: OutputFormat,
    /// The run's time left, in milliseconds: the call's deadline.
    pub remaining_ms: u64,
}

impl ProviderCall {
    /// The call of `request`, with `remaining` time left. The request's context
    /// snapshot is not sent: no built-in provider reads it, and it would put the whole
    /// context in history at every call.
    pub fn of(request: &ProviderRequest, remaining: std::time::Duration) -> ProviderCall {
        ProviderCall {
            model: request.model.clone(),
            messages: request.messages.to_vec(),
            tools: request.tools.to_vec(),
            sampling: request.sampling.clone(),
            output: request.output.clone(),
            remaining_ms: u64::try_from(remaining.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// The request again, on the activity's side.
    pub fn request(&self) -> ProviderRequest {
        let mut request = ProviderRequest::new(
            self.model.clone(),
            Arc::<[Message]>::from(self.messages.clone()),
        );
        request.tools = Arc::from(self.tools.clone());
        request.sampling = self.sampling.clone();
        request.output = self.output.clone();
        request
    }
}

/// `apl.provider_call`'s result: the completion, or the provider's error (redacted).
pub type ProviderAnswer = Result<Completion, ProviderError>;

/// `apl.tool_call`'s input: one tool call, by tool name.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolCallInput {
    /// The call's id as the model gave it.
    pub id: String,
    /// The tool.
    pub name: String,
    /// The arguments, checked against the tool's schema by the machine.
    pub arguments: Json,
    /// The run's variables, for a tool registered `with_context`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<Json>,
    /// The run's time left, in milliseconds.
    pub remaining_ms: u64,
}

impl ToolCallInput {
    /// The input of `invocation`.
    pub fn of(invocation: &ToolInvocation, remaining: std::time::Duration) -> ToolCallInput {
        ToolCallInput {
            id: invocation.id.clone(),
            name: invocation.name.clone(),
            arguments: invocation.arguments.clone(),
            context: invocation.context.clone(),
            remaining_ms: u64::try_from(remaining.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// The invocation again, on the activity's side.
    pub fn invocation(&self) -> ToolInvocation {
        ToolInvocation {
            id: self.id.clone(),
            name: self.name.clone(),
            arguments: self.arguments.clone(),
            context: self.context.clone(),
        }
    }
}

/// `apl.tool_call`'s result: the tool's output or its error message (redacted).
pub type ToolAnswer = Result<Json, String>;

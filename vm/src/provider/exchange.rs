//! The provider boundary (§4), typed: what the machine asks a provider, what a provider
//! answers, and how a call fails.
//!
//! The machine alone decides how context variables become request fields (§2.5, §3,
//! `describe_tools`, `output_mode`): a provider reads the [`ProviderRequest`]'s fields and
//! never a context variable by name. A provider that wants the whole context (§4 says it
//! receives it) reads [`ProviderRequest::context`], read-only.
//!
//! A provider answers with a [`Completion`]; the machine alone turns it into the
//! `result_*` variables (§2.2.5, §2.2.6). Wire formats ([`crate::provider::wire`]) are pure
//! `encode(request) -> body` and `decode(body) -> Completion` functions; HTTP providers
//! add only transport, retries and auth.

use std::fmt;
use std::sync::Arc;

use serde_json::Value as Json;

/// A message's role: the role sections of §1.2, the same type the bundle stores.
pub use crate::bundle::Role;
use crate::template::store::Vars;

/// A provider call the machine asks the driver to make.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ProviderRequest {
    /// The model to call (the `model` variable).
    pub model: String,
    /// The messages (§3), attachments included: the `prompts` variable, typed.
    pub messages: Arc<[Message]>,
    /// The tools offered (after `describe_tools`, filtered by `allowed_tools`).
    pub tools: Arc<[ToolDefinition]>,
    /// Every sampling parameter of §2.5 that is set.
    pub sampling: Sampling,
    /// What the response's text must be (`output_mode`, `output_structure`).
    pub output: OutputFormat,
    /// An O(1) snapshot of the whole context, `prompts` and `tools` included, for
    /// providers that want it (§4). Read-only; providers never need it to build a request.
    pub context: Vars,
}

impl ProviderRequest {
    /// A request for `model` with `messages`: no tools, no sampling parameters, free text
    /// and an empty context. The fields are public: set the others after.
    pub fn new(model: impl Into<String>, messages: impl Into<Arc<[Message]>>) -> ProviderRequest {
        ProviderRequest {
            model: model.into(),
            messages: messages.into(),
            tools: Arc::from([]),
            sampling: Sampling::default(),
            output: OutputFormat::Text,
            context: Vars::new(),
        }
    }
}

/// One message of the request (§3).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Message {
    /// Who speaks.
    pub role: Role,
    /// What is said.
    pub content: Content,
}

impl Message {
    /// A message of `role` saying `content`.
    pub fn new(role: Role, content: Content) -> Message {
        Message { role, content }
    }

    /// A text-only message.
    pub fn text(role: Role, text: impl Into<String>) -> Message {
        Message::new(role, Content::Text(text.into()))
    }
}

/// A message's content: plain text, or parts (text and attachments, §1.2.1).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Content {
    /// Text only.
    Text(String),
    /// A list of parts, in order.
    Parts(Vec<Part>),
}

/// One content part, in a request message or a completion.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum Part {
    /// `{"type": "text", "text": …}`.
    Text(String),
    /// `{"type": "image_url", "image_url": {"url": …}}`.
    ImageUrl(String),
    /// `{"type": "audio_input", "audio_input": {"url": …}}`.
    AudioInput(String),
    /// `{"type": "file", "file": {"url": …}}` (a URL or a file id).
    File(String),
}

/// A tool the model may call: a §5 descriptor.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct ToolDefinition {
    /// The tool's name.
    pub name: String,
    /// What it does, for the model; may be empty.
    pub description: String,
    /// The JSON schema of its arguments; `null` when the descriptor has none.
    pub parameters: Json,
    /// The descriptor's `strict` flag, when it has one.
    pub strict: Option<bool>,
}

impl ToolDefinition {
    /// A tool definition without a `strict` flag.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        parameters: Json,
    ) -> ToolDefinition {
        ToolDefinition {
            name: name.into(),
            description: description.into(),
            parameters,
            strict: None,
        }
    }
}

/// The §2.5 sampling parameters that are set. A variable counts as set unless it is
/// none, undefined, or an empty string, list or map (`stop_sequences = []`,
/// `logit_bias = {}` are "unset"). Values are passed as the agent set them: the API
/// judges them, as it would for any client.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Sampling {
    /// `temperature`.
    pub temperature: Option<Json>,
    /// `max_tokens`.
    pub max_tokens: Option<Json>,
    /// `top_p`.
    pub top_p: Option<Json>,
    /// `presence_penalty`.
    pub presence_penalty: Option<Json>,
    /// `frequency_penalty`.
    pub frequency_penalty: Option<Json>,
    /// `seed`.
    pub seed: Option<Json>,
    /// `stop_sequences`.
    pub stop_sequences: Option<Json>,
    /// `logit_bias`.
    pub logit_bias: Option<Json>,
    /// `top_k`.
    pub top_k: Option<Json>,
    /// `repetition_penalty`.
    pub repetition_penalty: Option<Json>,
}

/// What the response's text must be.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum OutputFormat {
    /// Free text (`output_mode` unset or `text`).
    #[default]
    Text,
    /// Any JSON object (`json`, or `structured_output` without `output_structure`).
    JsonObject,
    /// JSON matching a schema (`structured_output` with `output_structure`).
    JsonSchema {
        /// The schema's `title` when it is a valid name (`^[a-zA-Z0-9_-]{1,64}$`),
        /// otherwise `output`.
        name: String,
        /// The schema.
        schema: Json,
    },
}

/// A provider's answer, typed (§2.2.5).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Completion {
    /// The message's role; `assistant` when the provider gave none.
    pub role: String,
    /// The content parts, in order: text, `image_url`, `audio_input`, `file`.
    pub content: Vec<Part>,
    /// The tool calls the model asked for, in order.
    pub tool_calls: Vec<ToolCall>,
    /// Token usage, when reported.
    pub usage: Option<Usage>,
    /// Why the model stopped, when reported.
    pub finish_reason: Option<FinishReason>,
    /// The model as the provider reported it.
    pub model: Option<String>,
    /// The response as received, kept for the record (`aplc run --record`, journals).
    /// `None` when a provider has nothing better to keep than the fields above.
    #[serde(skip)]
    pub raw: Option<Arc<Json>>,
}

impl Completion {
    /// A completion with `text` as its only content, from `assistant`.
    pub fn text(text: impl Into<String>) -> Completion {
        Completion {
            role: "assistant".into(),
            content: vec![Part::Text(text.into())],
            tool_calls: Vec::new(),
            usage: None,
            finish_reason: None,
            model: None,
            raw: None,
        }
    }

    /// An empty completion from `assistant`: no content, no tool calls, nothing else.
    pub fn empty() -> Completion {
        Completion {
            content: Vec::new(),
            ..Completion::text("")
        }
    }
}

/// One tool call as the model sent it (§2.2.4).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct ToolCall {
    /// The id exactly as given (§2.2.4: any string, never checked). A number id becomes
    /// its decimal spelling; a missing id becomes `""`.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments as given: usually a string holding JSON, but some servers send an
    /// object (and Anthropic always does). Missing arguments are an empty object.
    pub arguments: Json,
}

impl ToolCall {
    /// A tool call.
    pub fn new(id: impl Into<String>, name: impl Into<String>, arguments: Json) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments,
        }
    }
}

/// Token usage (§2.4.1).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Usage {
    /// Tokens in the prompt (`prompt_tokens`; Anthropic's `input_tokens`).
    pub input_tokens: Option<u64>,
    /// Tokens in the completion (`completion_tokens`; Anthropic's `output_tokens`).
    pub output_tokens: Option<u64>,
    /// The usage as the `usage` variable shows it: OpenAI-shaped (`prompt_tokens`,
    /// `completion_tokens`, `total_tokens`, and whatever else the provider reported).
    pub fields: serde_json::Map<String, Json>,
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum FinishReason {
    /// A natural end or a stop sequence (`stop`; Anthropic's `end_turn`, `stop_sequence`).
    Stop,
    /// The token cap (`length`; `max_tokens`).
    Length,
    /// The model asked for tools (`tool_calls`; `tool_use`).
    ToolCalls,
    /// A content filter (`content_filter`; `refusal`).
    ContentFilter,
    /// Anything else, as the provider spelled it.
    Other(String),
}

impl FinishReason {
    /// The OpenAI spelling (`stop`, `length`, `tool_calls`, `content_filter`), or the
    /// provider's own for [`FinishReason::Other`].
    pub fn as_str(&self) -> &str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::ContentFilter => "content_filter",
            FinishReason::Other(other) => other,
        }
    }
}

/// A failed provider call: what kind of failure, and the message (already free of
/// secrets). Nothing branches on the message's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[error("{message}")]
#[non_exhaustive]
pub struct ProviderError {
    /// What kind of failure.
    pub kind: ProviderErrorKind,
    /// What went wrong, in words.
    pub message: String,
}

impl ProviderError {
    /// A failure of `kind`.
    pub fn new(kind: ProviderErrorKind, message: impl Into<String>) -> ProviderError {
        ProviderError {
            kind,
            message: message.into(),
        }
    }
}

/// The kinds of provider failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum ProviderErrorKind {
    /// The credentials were refused (401, 403).
    Auth,
    /// Too many requests (429), after any retries.
    RateLimited,
    /// The server failed (5xx, Anthropic's 529 overloaded), after any retries.
    Server,
    /// No answer in time: the request timeout or the run's deadline.
    Timeout,
    /// The connection failed: DNS, TCP, TLS, a dropped connection, a redirect refused.
    Transport,
    /// The request was refused as invalid (another 4xx), or could not be built.
    InvalidRequest,
    /// An answer came but is not a valid response: bad JSON, a wrong shape, too large.
    InvalidResponse,
    /// A scripted provider's failure, or one a custom provider could not classify.
    Other,
}

impl ProviderErrorKind {
    /// The kind's stable name: `auth`, `rate_limited`, `server`, `timeout`, `transport`,
    /// `invalid_request`, `invalid_response` or `other` (events, traces, metrics).
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderErrorKind::Auth => "auth",
            ProviderErrorKind::RateLimited => "rate_limited",
            ProviderErrorKind::Server => "server",
            ProviderErrorKind::Timeout => "timeout",
            ProviderErrorKind::Transport => "transport",
            ProviderErrorKind::InvalidRequest => "invalid_request",
            ProviderErrorKind::InvalidResponse => "invalid_response",
            ProviderErrorKind::Other => "other",
        }
    }

    /// The kind named `name` (a name [`as_str`](Self::as_str) gives), if any.
    pub fn from_name(name: &str) -> Option<ProviderErrorKind> {
        ProviderErrorKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == name)
    }

    /// Every kind, in the order of their declaration.
    pub const ALL: [ProviderErrorKind; 8] = [
        ProviderErrorKind::Auth,
        ProviderErrorKind::RateLimited,
        ProviderErrorKind::Server,
        ProviderErrorKind::Timeout,
        ProviderErrorKind::Transport,
        ProviderErrorKind::InvalidRequest,
        ProviderErrorKind::InvalidResponse,
        ProviderErrorKind::Other,
    ];
}

impl fmt::Display for ProviderErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

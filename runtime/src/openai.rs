//! The OpenAI Chat Completions provider.
//!
//! [`OpenAiProvider`] turns a [`ProviderRequest`] into `POST {base_url}/v1/chat/completions`,
//! sends it with reqwest over rustls (on `ring`), and hands the parsed JSON body back; the
//! machine reads it as §2.2.5–§2.2.6 say. Failures become [`ProviderError`]s that name the
//! HTTP status and the API's own message; 429s, 5xx and connection failures are retried
//! with exponential backoff and jitter, honouring `Retry-After`, and never past the run's
//! deadline. `spec/providers.md` is the specification: the request mapping, the error
//! texts and the retry rules.
//!
//! Sending, retrying and redacting are [`crate::transport`]'s, shared with the Anthropic
//! provider. Not in here: streaming (the machine consumes whole responses), reading API
//! keys from the environment (the CLI and [`crate::routing`] do that), and choosing a
//! provider by model name ([`crate::routing::Router`]).

use std::fmt;
use std::time::Duration;

use aplc_vm::minijinja::Value;
use aplc_vm::minijinja::value::ValueKind;
use reqwest::StatusCode;
use reqwest::header;
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value as Json;

use crate::driver::{BoxFuture, CallContext, Provider};
use crate::http::HttpClient;
use crate::redact::Redactor;
use crate::transport::{
    self, EXCERPT_CHARS, KeyHeader, MANAGED_HEADERS, Redacted, RedactedHeaders, Retries, Transport,
    excerpt, printable_url, status_text,
};
use aplc_vm::Vars;
use aplc_vm::text::json_kind as kind;
use aplc_vm::typed;
use aplc_vm::{ProviderError, ProviderRequest};

/// Where requests go when no base URL is configured (§6.1 `base_url`).
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com";
/// How long one HTTP request may take, unless configured otherwise. The run's deadline
/// caps it further.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How many times a failed request is retried (so at most three attempts in all).
pub const DEFAULT_MAX_RETRIES: u32 = 2;
/// The first backoff delay; each further retry doubles it.
pub const DEFAULT_RETRY_BASE_DELAY: Duration = Duration::from_millis(500);
/// The longest backoff delay. A server's `Retry-After` is honoured beyond it, as long as
/// the run's deadline allows.
pub const DEFAULT_RETRY_MAX_DELAY: Duration = Duration::from_secs(8);

/// How an [`OpenAiProvider`] reaches its server: the builder for
/// [`OpenAiProvider::new`].
///
/// The API key and the header values are secrets: `Debug` prints them as `<redacted>`,
/// and no error message contains them.
#[derive(Clone)]
pub struct OpenAiConfig {
    base_url: String,
    api_key: Option<String>,
    headers: Vec<(String, String)>,
    request_timeout: Duration,
    max_retries: u32,
    retry_base_delay: Duration,
    retry_max_delay: Duration,
    client: Option<HttpClient>,
}

impl Default for OpenAiConfig {
    fn default() -> Self {
        OpenAiConfig {
            base_url: DEFAULT_BASE_URL.to_owned(),
            api_key: None,
            headers: Vec::new(),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_retries: DEFAULT_MAX_RETRIES,
            retry_base_delay: DEFAULT_RETRY_BASE_DELAY,
            retry_max_delay: DEFAULT_RETRY_MAX_DELAY,
            client: None,
        }
    }
}

impl OpenAiConfig {
    /// The defaults: `https://api.openai.com`, no key, 60 s per request, 2 retries.
    pub fn new() -> OpenAiConfig {
        OpenAiConfig::default()
    }

    /// The server's base URL, e.g. `http://localhost:8080`. A URL that already ends in
    /// `/v1` is not given a second one.
    pub fn base_url(mut self, url: impl Into<String>) -> OpenAiConfig {
        self.base_url = url.into();
        self
    }

    /// The API key, sent as `Authorization: Bearer <key>`. Surrounding whitespace (a
    /// trailing newline from a file or a shell) is trimmed.
    pub fn api_key(mut self, key: impl Into<String>) -> OpenAiConfig {
        self.api_key = Some(key.into());
        self
    }

    /// An extra header sent with every request (`OpenAI-Organization`, or `api-key` for
    /// servers that take the key there). Its value is treated as a secret.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> OpenAiConfig {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// How long one HTTP request may take, from sending to the last byte of the body.
    pub fn request_timeout(mut self, timeout: Duration) -> OpenAiConfig {
        self.request_timeout = timeout;
        self
    }

    /// How many times a retryable failure is retried (0 turns retries off).
    pub fn max_retries(mut self, retries: u32) -> OpenAiConfig {
        self.max_retries = retries;
        self
    }

    /// The HTTP client to send with, so that a provider shares its connections (and its
    /// rules) with the rest of the process. Without one, [`HttpClient::new`] builds one.
    pub fn http_client(mut self, client: HttpClient) -> OpenAiConfig {
        self.client = Some(client);
        self
    }

    /// The backoff: the first delay and the longest one (before jitter).
    pub fn retry_delays(mut self, base: Duration, max: Duration) -> OpenAiConfig {
        self.retry_base_delay = base;
        self.retry_max_delay = max;
        self
    }
}

impl fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("base_url", &printable_url(&self.base_url))
            .field("api_key", &self.api_key.as_ref().map(|_| Redacted))
            .field("headers", &RedactedHeaders(&self.headers))
            .field("request_timeout", &self.request_timeout)
            .field("max_retries", &self.max_retries)
            .field("retry_base_delay", &self.retry_base_delay)
            .field("retry_max_delay", &self.retry_max_delay)
            .finish()
    }
}

/// A provider for any server that speaks the OpenAI Chat Completions API: OpenAI,
/// llama.cpp's `llama-server`, vLLM, Ollama, LiteLLM, …
///
/// Cloning is cheap and shares the connection pool.
#[derive(Clone)]
pub struct OpenAiProvider {
    /// The endpoint, the headers (the key among them), the retry rules and the
    /// redactor that scrubs every error message.
    transport: Transport,
}

impl OpenAiProvider {
    /// Checks `config` and builds the HTTP client.
    ///
    /// Errors name what is wrong (a bad URL, a header that is not valid HTTP) without
    /// repeating a secret.
    pub fn new(config: OpenAiConfig) -> Result<OpenAiProvider, String> {
        let endpoint = transport::endpoint(&config.base_url, "chat/completions")?;
        if config.request_timeout.is_zero() {
            return Err("the request timeout must be greater than zero".into());
        }
        let key_header = KeyHeader {
            name: header::AUTHORIZATION,
            shown: "Authorization",
            prefix: "Bearer ",
        };
        let (headers, secrets) = transport::request_headers(
            &config.headers,
            &[],
            &key_header,
            config.api_key.as_deref(),
        )?;
        // The shared client follows a same-origin 307 or 308 only: any other redirect
        // comes back as a 3xx, reported by the transport as a configuration error.
        let client = match config.client {
            Some(client) => client,
            None => HttpClient::new()?,
        };
        let retries = Retries {
            request_timeout: config.request_timeout,
            max_retries: config.max_retries,
            base_delay: config.retry_base_delay,
            max_delay: config.retry_max_delay,
        };
        Ok(OpenAiProvider {
            transport: Transport::new(client, endpoint, headers, &secrets, retries, error_message),
        })
    }

    /// The URL requests are posted to (`…/v1/chat/completions`).
    pub fn endpoint(&self) -> &str {
        self.transport.endpoint().as_str()
    }

    /// Sends `body` and reads the 2xx answer as a chat completion.
    async fn send(
        &self,
        body: Vec<u8>,
        deadline: std::time::Instant,
    ) -> Result<Json, typed::ProviderError> {
        let delivered = self.transport.send(body, deadline).await?;
        completion(delivered.status, &delivered.body, self.transport.redactor())
            .map_err(|message| self.transport.invalid_response(&delivered, message))
    }

    /// Replaces every run of a secret in `message` with `<redacted>`: a server may echo
    /// a header back in an error body, whole, cut or in another case.
    fn redact(&self, message: String) -> String {
        self.transport.redact(message)
    }
}

impl Provider for OpenAiProvider {
    fn call<'a>(
        &'a self,
        request: &'a ProviderRequest,
        call: &'a CallContext,
    ) -> BoxFuture<'a, Result<Json, ProviderError>> {
        Box::pin(async move {
            let body = encode_request(&request.model, &request.context).map_err(|message| {
                ProviderError {
                    message: self.redact(message),
                }
            })?;
            self.send(body, call.deadline)
                .await
                .map_err(|e| ProviderError { message: e.message })
        })
    }
}

impl fmt::Debug for OpenAiProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers = self.transport.headers();
        let custom: Vec<_> = headers
            .keys()
            .filter(|name| !MANAGED_HEADERS.contains(name) && **name != header::AUTHORIZATION)
            .map(|name| (name.as_str(), Redacted))
            .collect();
        let retries = self.transport.retries();
        f.debug_struct("OpenAiProvider")
            .field("endpoint", &self.endpoint())
            .field(
                "api_key",
                &headers
                    .contains_key(header::AUTHORIZATION)
                    .then_some(Redacted),
            )
            .field("headers", &custom)
            .field("request_timeout", &retries.request_timeout)
            .field("max_retries", &retries.max_retries)
            .finish_non_exhaustive()
    }
}

// ---------------------------------------------------------------------------------------
// The request body.

/// Context variables copied into the request when set, and the field each becomes, in
/// the order they are written.
const PARAMETERS: [(&str, &str); 10] = [
    ("temperature", "temperature"),
    ("max_tokens", "max_tokens"),
    ("top_p", "top_p"),
    ("presence_penalty", "presence_penalty"),
    ("frequency_penalty", "frequency_penalty"),
    ("seed", "seed"),
    ("stop_sequences", "stop"),
    ("logit_bias", "logit_bias"),
    ("top_k", "top_k"),
    ("repetition_penalty", "repetition_penalty"),
];

/// Encodes the Chat Completions request for `model` from the context.
///
/// The context's values are serialized straight into the body; the only JSON text that
/// is parsed is an `output_structure` given as a string.
fn encode_request(model: &str, context: &Vars) -> Result<Vec<u8>, String> {
    let request = ChatRequest::new(model, context)?;
    serde_json::to_vec(&request).map_err(|e| format!("the request could not be encoded: {e}"))
}

/// A Chat Completions request, borrowing what it can from the context.
struct ChatRequest<'a> {
    model: &'a str,
    messages: Vec<Message>,
    parameters: Vec<(&'static str, &'a Value)>,
    tools: Vec<ToolEntry>,
    response_format: Option<ResponseFormat<'a>>,
}

impl<'a> ChatRequest<'a> {
    fn new(model: &'a str, context: &'a Vars) -> Result<ChatRequest<'a>, String> {
        let parameters = PARAMETERS
            .iter()
            .filter_map(|(variable, field)| {
                context
                    .get(variable)
                    .filter(|value| is_set(value))
                    .map(|value| (*field, value))
            })
            .collect();
        Ok(ChatRequest {
            model,
            messages: messages(context.get("prompts"))?,
            parameters,
            tools: tools(context.get("tools"))?,
            response_format: response_format(context)?,
        })
    }
}

impl Serialize for ChatRequest<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("model", self.model)?;
        map.serialize_entry("messages", &self.messages)?;
        for (field, value) in &self.parameters {
            map.serialize_entry(field, value)?;
        }
        if !self.tools.is_empty() {
            map.serialize_entry("tools", &self.tools)?;
        }
        if let Some(format) = &self.response_format {
            map.serialize_entry("response_format", format)?;
        }
        map.end()
    }
}

/// One message of `messages`.
struct Message {
    role: Value,
    content: Value,
    /// `name`, `tool_calls` (assistant) and `tool_call_id` (tool), when present.
    extra: Vec<(&'static str, Value)>,
}

impl Serialize for Message {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2 + self.extra.len()))?;
        map.serialize_entry("role", &self.role)?;
        map.serialize_entry("content", &self.content)?;
        for (key, value) in &self.extra {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

/// `prompts` (§3) as API messages.
///
/// `system`, `user`, `assistant` and `developer` pass through. A `tool_result` message
/// becomes a `tool` message only when it names a `tool_call_id` that an earlier
/// assistant message in the same request called: the API rejects a `tool` message
/// without that call before it, and APL's `## tool_result` sections carry no id. Every
/// other `tool_result` message becomes a `user` message with the same content. Content
/// (a string or a list of parts) is passed through unchanged.
fn messages(prompts: Option<&Value>) -> Result<Vec<Message>, String> {
    let Some(prompts) = prompts.filter(|p| is_set(p)) else {
        return Ok(Vec::new());
    };
    if prompts.kind() != ValueKind::Seq {
        return Err(format!(
            "`prompts` must be a list of messages, found {}",
            value_kind(prompts)
        ));
    }
    let mut called: Vec<String> = Vec::new();
    let mut messages = Vec::new();
    for (index, message) in prompts.try_iter().map_err(|e| e.to_string())?.enumerate() {
        if message.kind() != ValueKind::Map {
            return Err(format!(
                "prompt message {index} must be an object, found {}",
                value_kind(&message)
            ));
        }
        let field = |name: &str| message.get_attr(name).ok().filter(is_set);
        let role = field("role")
            .and_then(|r| r.as_str().map(str::to_owned))
            .ok_or_else(|| format!("prompt message {index} has no string `role`"))?;
        let content = message.get_attr("content").unwrap_or_default();
        let content = if content.is_undefined() {
            Value::from(())
        } else {
            content
        };
        let mut extra = Vec::new();
        if let Some(name) = field("name") {
            extra.push(("name", name));
        }
        let role = match role.as_str() {
            "tool_result" | "tool" => {
                let id = field("tool_call_id")
                    .filter(|id| id.as_str().is_some_and(|id| called.iter().any(|c| c == id)));
                match id {
                    Some(id) => {
                        extra.push(("tool_call_id", id));
                        "tool".to_owned()
                    }
                    None => "user".to_owned(),
                }
            }
            "assistant" => {
                if let Some(calls) = field("tool_calls") {
                    if let Ok(iter) = calls.try_iter() {
                        called.extend(iter.filter_map(|call| {
                            call.get_attr("id")
                                .ok()
                                .and_then(|id| id.as_str().map(str::to_owned))
                        }));
                    }
                    extra.push(("tool_calls", calls));
                }
                role
            }
            _ => role,
        };
        messages.push(Message {
            role: Value::from(role),
            content,
            extra,
        });
    }
    Ok(messages)
}

/// One entry of `tools`.
enum ToolEntry {
    /// Already an API tool (`{"type": "function", "function": …}`).
    AsIs(Value),
    /// A bare function descriptor (`{"name", "description", "parameters"}`, §2.2.4),
    /// wrapped as `{"type": "function", "function": …}`.
    Function(Value),
}

impl Serialize for ToolEntry {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            ToolEntry::AsIs(tool) => tool.serialize(serializer),
            ToolEntry::Function(function) => {
                let mut map = serializer.serialize_map(Some(2))?;
                map.serialize_entry("type", "function")?;
                map.serialize_entry("function", function)?;
                map.end()
            }
        }
    }
}

/// `tools` as API tools; none when unset or empty.
fn tools(tools: Option<&Value>) -> Result<Vec<ToolEntry>, String> {
    let Some(tools) = tools.filter(|t| is_set(t)) else {
        return Ok(Vec::new());
    };
    if tools.kind() != ValueKind::Seq {
        return Err(format!(
            "`tools` must be a list of tool descriptions, found {}",
            value_kind(tools)
        ));
    }
    Ok(tools
        .try_iter()
        .map_err(|e| e.to_string())?
        .map(|tool| {
            let has = |key: &str| tool.get_attr(key).is_ok_and(|v| !v.is_undefined());
            if tool.kind() == ValueKind::Map && !has("type") && has("name") {
                ToolEntry::Function(tool)
            } else {
                ToolEntry::AsIs(tool)
            }
        })
        .collect())
}

/// `response_format`, from `output_mode` and `output_structure`.
enum ResponseFormat<'a> {
    /// `{"type": "json_object"}`.
    JsonObject,
    /// `{"type": "json_schema", "json_schema": {"name", "schema", "strict": true}}`.
    JsonSchema { name: String, schema: Schema<'a> },
}

/// A JSON schema from the context: a map, or parsed from a string.
enum Schema<'a> {
    Value(&'a Value),
    Parsed(Json),
}

impl Serialize for ResponseFormat<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        match self {
            ResponseFormat::JsonObject => map.serialize_entry("type", "json_object")?,
            ResponseFormat::JsonSchema { name, schema } => {
                map.serialize_entry("type", "json_schema")?;
                map.serialize_entry("json_schema", &JsonSchema { name, schema })?;
            }
        }
        map.end()
    }
}

/// The `json_schema` object.
struct JsonSchema<'s, 'a> {
    name: &'s str,
    schema: &'s Schema<'a>,
}

impl Serialize for JsonSchema<'_, '_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(3))?;
        map.serialize_entry("name", self.name)?;
        match self.schema {
            Schema::Value(schema) => map.serialize_entry("schema", schema)?,
            Schema::Parsed(schema) => map.serialize_entry("schema", schema)?,
        }
        map.serialize_entry("strict", &true)?;
        map.end()
    }
}

/// `output_mode` `json` asks for a JSON object; `structured_output` for the schema in
/// `output_structure` (or, without one, for any JSON object). Other modes ask nothing.
fn response_format(context: &Vars) -> Result<Option<ResponseFormat<'_>>, String> {
    let mode = context.get("output_mode");
    match mode.and_then(|m| m.as_str()) {
        Some("json") => Ok(Some(ResponseFormat::JsonObject)),
        Some("structured_output") => {
            let Some(structure) = context.get("output_structure").filter(|s| is_set(s)) else {
                return Ok(Some(ResponseFormat::JsonObject));
            };
            let schema = match structure.kind() {
                ValueKind::Map => Schema::Value(structure),
                ValueKind::String => {
                    let text = structure.as_str().unwrap_or_default();
                    let parsed: Json = serde_json::from_str(text)
                        .map_err(|e| format!("`output_structure` is not valid JSON: {e}"))?;
                    if !parsed.is_object() {
                        return Err(format!(
                            "`output_structure` must hold a JSON schema object, found {}",
                            kind(&parsed)
                        ));
                    }
                    Schema::Parsed(parsed)
                }
                _ => {
                    return Err(format!(
                        "`output_structure` must be a JSON schema object or a string holding \
                         one, found {}",
                        value_kind(structure)
                    ));
                }
            };
            let title = match &schema {
                Schema::Value(v) => v
                    .get_attr("title")
                    .ok()
                    .and_then(|t| t.as_str().map(str::to_owned)),
                Schema::Parsed(j) => j.get("title").and_then(Json::as_str).map(str::to_owned),
            };
            let name = title
                .filter(|t| is_schema_name(t))
                .unwrap_or_else(|| "output".to_owned());
            Ok(Some(ResponseFormat::JsonSchema { name, schema }))
        }
        _ => Ok(None),
    }
}

/// Whether `name` is a valid `json_schema.name` (`^[a-zA-Z0-9_-]{1,64}$`).
fn is_schema_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A variable counts as set unless it is none, undefined, or an empty string, list or
/// map (the "empty defaults" of §2.5: `stop_sequences = []`, `logit_bias = {}`).
fn is_set(value: &Value) -> bool {
    !(value.is_none() || value.is_undefined() || value.len() == Some(0))
}

/// "a string", "a list", …: how errors name the value they found.
fn value_kind(value: &Value) -> &'static str {
    match value.kind() {
        ValueKind::Undefined => "undefined",
        ValueKind::None => "none",
        ValueKind::Bool => "a boolean",
        ValueKind::Number => "a number",
        ValueKind::String => "a string",
        ValueKind::Bytes => "bytes",
        ValueKind::Seq | ValueKind::Iterable => "a list",
        ValueKind::Map => "a map",
        _ => "an object",
    }
}

// ---------------------------------------------------------------------------------------
// Responses.

/// A 2xx body: the parsed completion, or why it is not one.
fn completion(status: StatusCode, body: &[u8], redactor: &Redactor) -> Result<Json, String> {
    let status = status_text(status);
    let excerpt = |body| excerpt(body, redactor);
    let json: Json = serde_json::from_slice(body).map_err(|e| {
        format!(
            "{status}: the response is not JSON ({e}); it begins: {}",
            excerpt(body)
        )
    })?;
    match json.get("choices") {
        Some(Json::Array(_)) => Ok(json),
        Some(other) => Err(format!(
            "{status}: the response is not a chat completion (`choices` is {}): {}",
            kind(other),
            excerpt(body)
        )),
        None if error_message(&json, redactor).is_some() => Err(format!(
            "{status}: the response has no `choices`: {}",
            error_message(&json, redactor).unwrap_or_default()
        )),
        None => Err(format!(
            "{status}: the response is not a chat completion (no `choices`): {}",
            excerpt(body)
        )),
    }
}

/// `error.message` (OpenAI, llama.cpp, vLLM), `error` as a string (Ollama), or a
/// top-level `message` or `detail`.
fn error_message(json: &Json, redactor: &Redactor) -> Option<String> {
    let text = match json.get("error") {
        Some(Json::Object(error)) => error.get("message").and_then(Json::as_str),
        Some(Json::String(message)) => Some(message.as_str()),
        _ => None,
    }
    .or_else(|| json.get("message").and_then(Json::as_str))
    .or_else(|| json.get("detail").and_then(Json::as_str))?;
    Some(redactor.clip(text, EXCERPT_CHARS))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use aplc_vm::value_from_json;

    fn context(vars: Json) -> Vars {
        let mut context = Vars::new();
        for (k, v) in vars.as_object().unwrap() {
            context.insert(Arc::from(k.as_str()), value_from_json(v));
        }
        context
    }

    fn body(vars: Json) -> Json {
        serde_json::from_slice(&encode_request("m", &context(vars)).unwrap()).unwrap()
    }

    #[test]
    fn unset_parameters_are_left_out() {
        let b = body(json!({
            "prompts": [{"role": "user", "content": "hi"}],
            "temperature": null, "max_tokens": null, "stop_sequences": [],
            "logit_bias": {}, "seed": null, "top_k": null, "tools": [],
            "output_mode": null, "output_structure": null,
        }));
        assert_eq!(
            b,
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        );
    }

    #[test]
    fn schema_name_comes_from_a_valid_title() {
        let b = body(json!({
            "output_mode": "structured_output",
            "output_structure": "{\"title\": \"Person Record\", \"type\": \"object\"}",
        }));
        assert_eq!(b["response_format"]["json_schema"]["name"], "output");
        let b = body(json!({
            "output_mode": "structured_output",
            "output_structure": {"title": "person_record", "type": "object"},
        }));
        assert_eq!(b["response_format"]["json_schema"]["name"], "person_record");
    }

    #[test]
    fn bad_output_structure_is_an_error() {
        let e = encode_request(
            "m",
            &context(json!({"output_mode": "structured_output", "output_structure": "{"})),
        )
        .unwrap_err();
        assert!(
            e.starts_with("`output_structure` is not valid JSON:"),
            "{e}"
        );
        let e = encode_request(
            "m",
            &context(json!({"output_mode": "structured_output", "output_structure": 3})),
        )
        .unwrap_err();
        assert!(e.ends_with("found a number"), "{e}");
    }

    #[test]
    fn bad_configuration_is_rejected_without_secrets() {
        let key = "sk-very-secret-key-0123456789";
        let e =
            OpenAiProvider::new(OpenAiConfig::new().api_key(format!("{key}\nX: y"))).unwrap_err();
        assert!(!e.contains(key), "{e}");
        let e = OpenAiProvider::new(OpenAiConfig::new().header("api-key", format!("{key}\r\n")))
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert!(e.is_ok(), "surrounding whitespace is trimmed: {e:?}");
        let e = OpenAiProvider::new(OpenAiConfig::new().header("x-key", format!("a\n{key}")))
            .unwrap_err();
        assert_eq!(
            e,
            "the value of header `x-key` is not a valid HTTP header value"
        );
        let e = OpenAiProvider::new(OpenAiConfig::new().header("bad header", "v")).unwrap_err();
        assert_eq!(e, "`bad header` is not a valid HTTP header name");
        let e = OpenAiProvider::new(OpenAiConfig::new().header("Content-Type", "text/plain"))
            .unwrap_err();
        assert_eq!(
            e,
            "header `content-type` is set by the provider and cannot be configured"
        );
        let e = OpenAiProvider::new(
            OpenAiConfig::new()
                .api_key(key)
                .header("Authorization", "Bearer other-secret"),
        )
        .unwrap_err();
        assert!(
            e.starts_with("both an API key and an `Authorization` header"),
            "{e}"
        );
        assert_eq!(
            OpenAiProvider::new(OpenAiConfig::new().api_key("  ")).unwrap_err(),
            "the API key is empty"
        );
        assert_eq!(
            OpenAiProvider::new(OpenAiConfig::new().request_timeout(Duration::ZERO)).unwrap_err(),
            "the request timeout must be greater than zero"
        );
    }

    #[test]
    fn error_bodies() {
        let redactor = Redactor::default();
        let message = |body: &str| {
            serde_json::from_str::<Json>(body)
                .ok()
                .and_then(|json| error_message(&json, &redactor))
                .unwrap_or_else(|| excerpt(body.as_bytes(), &redactor))
        };
        assert_eq!(
            message(r#"{"error": {"message": "bad key", "type": "x"}}"#),
            "bad key"
        );
        assert_eq!(
            message(r#"{"error": "model not found"}"#),
            "model not found"
        );
        assert_eq!(
            message(r#"{"object": "error", "message": "vllm says"}"#),
            "vllm says"
        );
        assert_eq!(message("upstream\nconnect error"), "upstream connect error");
        assert_eq!(message(""), "(empty body)");
        let long = "x".repeat(500);
        assert_eq!(message(&long), format!("{}…", "x".repeat(EXCERPT_CHARS)));
    }

    #[test]
    fn redaction_replaces_every_secret() {
        let provider = OpenAiProvider::new(
            OpenAiConfig::new()
                .api_key("sk-abcdefgh12345678")
                .header("x-extra", "extra-secret-value")
                .header("x-short", "1"),
        )
        .unwrap();
        assert_eq!(
            provider.redact("a sk-abcdefgh12345678 b extra-secret-value c 1".into()),
            "a <redacted> b <redacted> c 1"
        );
    }
}

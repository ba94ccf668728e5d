//! The OpenAI Chat Completions wire format: the request body and the response, pure.
//!
//! `spec/providers.md` specifies the mapping. [`encode_request`] writes the body of
//! `POST /v1/chat/completions` from a typed [`ProviderRequest`]; [`decode_response`] and
//! [`decode_value`] read a success body into a [`Completion`]; [`response_json`] writes a
//! completion back as the §2.2.5 response dict (for `aplc run --record` and embedders).
//! [`encode_streaming_request`] and [`ChunkAssembler`] are the streamed form.
//! Status codes, error bodies and retries are the HTTP provider's, not this module's.

use std::sync::Arc;

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value as Json};

use crate::provider::exchange::{
    Completion, Content, FinishReason, Message, OutputFormat, Part, ProviderError,
    ProviderErrorKind, ProviderRequest, Role, Sampling, ToolCall, ToolDefinition, Usage,
};
use crate::text::json_kind as kind;

/// Encodes the Chat Completions request body.
///
/// Fields are written in a fixed order: `model`, `messages`, the sampling parameters
/// that are set (in §2.5's order; `stop_sequences` is sent as `stop`), `tools` when any
/// are offered, and `response_format` unless the output is free text.
pub fn encode_request(request: &ProviderRequest) -> Result<Vec<u8>, ProviderError> {
    encode(request, false)
}

/// [`encode_request`] asking for a stream: the same body, then `"stream": true` and
/// `"stream_options": {"include_usage": true}` (so the last chunk carries `usage`).
/// [`ChunkAssembler`] reads the answer.
pub fn encode_streaming_request(request: &ProviderRequest) -> Result<Vec<u8>, ProviderError> {
    encode(request, true)
}

fn encode(request: &ProviderRequest, stream: bool) -> Result<Vec<u8>, ProviderError> {
    serde_json::to_vec(&Body(request, stream)).map_err(|e| {
        ProviderError::new(
            ProviderErrorKind::InvalidRequest,
            format!("the request could not be encoded: {e}"),
        )
    })
}

/// Reads a success body: JSON with a `choices` array (see [`decode_value`]).
pub fn decode_response(body: &[u8]) -> Result<Completion, ProviderError> {
    let value: Json = serde_json::from_slice(body)
        .map_err(|e| invalid_response(format!("the response is not JSON ({e})")))?;
    let mut completion = read_completion(&value).map_err(invalid_response)?;
    completion.raw = Some(Arc::new(value));
    Ok(completion)
}

/// Reads the first choice of a parsed response (§2.2.5) into a [`Completion`] whose
/// [`raw`](Completion::raw) is `value`.
///
/// Liberal where nothing is lost: a missing role is `assistant`, a null `content` is
/// empty text, an `image_url`/`audio_input`/`file` part may carry its URL as a bare
/// string, a string inside a content list is taken as text, and parts of any other
/// `type` (`refusal`, `input_audio`, …) are ignored. Strict where data would be lost: a
/// `text` part without a string `text`, an attachment part without a URL, or a tool call
/// without `function.name` is an error rather than silently dropped. Errors are kind
/// `invalid_response` and read `invalid provider response: <what is wrong>`.
pub fn decode_value(value: &Json) -> Result<Completion, ProviderError> {
    let mut completion = read_completion(value).map_err(invalid_response)?;
    completion.raw = Some(Arc::new(value.clone()));
    Ok(completion)
}

/// The completion as a Chat Completions response (§2.2.5):
/// `{"choices": [{"message": {...}, "finish_reason"?}], "usage"?, "model"?}`.
///
/// `content` is a string when the completion is one text part, `null` when it is empty,
/// and a list of parts otherwise; `tool_calls` is there when the model asked for tools.
pub fn response_json(completion: &Completion) -> Json {
    let mut message = Map::new();
    message.insert("role".into(), Json::from(completion.role.as_str()));
    let content = match completion.content.as_slice() {
        [] => Json::Null,
        [Part::Text(text)] => Json::from(text.as_str()),
        parts => Json::Array(parts.iter().map(part_json).collect()),
    };
    message.insert("content".into(), content);
    if !completion.tool_calls.is_empty() {
        let calls = completion.tool_calls.iter().map(tool_call_json).collect();
        message.insert("tool_calls".into(), Json::Array(calls));
    }
    let mut choice = Map::new();
    choice.insert("message".into(), Json::Object(message));
    if let Some(reason) = &completion.finish_reason {
        choice.insert("finish_reason".into(), Json::from(reason.as_str()));
    }
    let mut response = Map::new();
    response.insert("choices".into(), Json::Array(vec![Json::Object(choice)]));
    if let Some(usage) = &completion.usage {
        response.insert("usage".into(), Json::Object(usage.fields.clone()));
    }
    if let Some(model) = &completion.model {
        response.insert("model".into(), Json::from(model.as_str()));
    }
    Json::Object(response)
}

/// Reads a response, without keeping it; errors are the detail after
/// `invalid provider response: ` (the scripted provider quotes them bare).
pub(crate) fn read_completion(raw: &Json) -> Result<Completion, String> {
    let message = first_message(raw)?;
    let role = match message.get("role") {
        None | Some(Json::Null) => "assistant".to_owned(),
        Some(Json::String(role)) => role.clone(),
        Some(other) => {
            return Err(format!(
                "expected `message.role` to be a string, found {}",
                kind(other)
            ));
        }
    };
    let mut completion = Completion {
        role,
        ..Completion::empty()
    };
    match message.get("content") {
        None | Some(Json::Null) => {}
        Some(Json::String(text)) => completion.content.push(Part::Text(text.clone())),
        Some(Json::Array(parts)) => {
            for (index, part) in parts.iter().enumerate() {
                if let Some(part) = read_part(index, part)? {
                    completion.content.push(part);
                }
            }
        }
        Some(other) => {
            return Err(format!(
                "expected `message.content` to be a string, an array of parts or null, found {}",
                kind(other)
            ));
        }
    }
    match message.get("tool_calls") {
        None | Some(Json::Null) => {}
        Some(Json::Array(calls)) => {
            completion.tool_calls = calls
                .iter()
                .enumerate()
                .map(|(index, call)| read_tool_call(index, call))
                .collect::<Result<_, _>>()?;
        }
        Some(other) => {
            return Err(format!(
                "expected `message.tool_calls` to be an array, found {}",
                kind(other)
            ));
        }
    }
    completion.usage = raw.get("usage").and_then(Json::as_object).map(read_usage);
    completion.finish_reason = raw
        .get("choices")
        .and_then(|c| c.get(0))
        .and_then(|c| c.get("finish_reason"))
        .and_then(Json::as_str)
        .map(finish_reason);
    completion.model = raw.get("model").and_then(Json::as_str).map(str::to_owned);
    Ok(completion)
}

// ---------------------------------------------------------------------------------------
// The request body.

/// The whole body, and whether it asks for a stream.
struct Body<'a>(&'a ProviderRequest, bool);

impl Serialize for Body<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let request = self.0;
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("model", &request.model)?;
        map.serialize_entry("messages", &Messages(&request.messages))?;
        for (field, value) in sampling_fields(&request.sampling) {
            if let Some(value) = value {
                map.serialize_entry(field, value)?;
            }
        }
        if !request.tools.is_empty() {
            map.serialize_entry("tools", &Tools(&request.tools))?;
        }
        match &request.output {
            OutputFormat::Text => {}
            OutputFormat::JsonObject => map.serialize_entry("response_format", &JsonObject)?,
            OutputFormat::JsonSchema { name, schema } => {
                map.serialize_entry("response_format", &SchemaFormat { name, schema })?;
            }
        }
        if self.1 {
            map.serialize_entry("stream", &true)?;
            map.serialize_entry("stream_options", &IncludeUsage)?;
        }
        map.end()
    }
}

/// The sampling parameters with their API field names, in the order they are written.
fn sampling_fields(s: &Sampling) -> [(&'static str, &Option<Json>); 10] {
    [
        ("temperature", &s.temperature),
        ("max_tokens", &s.max_tokens),
        ("top_p", &s.top_p),
        ("presence_penalty", &s.presence_penalty),
        ("frequency_penalty", &s.frequency_penalty),
        ("seed", &s.seed),
        ("stop", &s.stop_sequences),
        ("logit_bias", &s.logit_bias),
        ("top_k", &s.top_k),
        ("repetition_penalty", &s.repetition_penalty),
    ]
}

/// `messages`.
struct Messages<'a>(&'a [Message]);

impl Serialize for Messages<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(ApiMessage))
    }
}

/// One message. `system`, `user`, `assistant` and `developer` pass through; a
/// `tool_result` message is sent as `user`: the API's `tool` role needs the id of an
/// earlier assistant tool call, and APL's `## tool_result` sections carry none.
struct ApiMessage<'a>(&'a Message);

impl Serialize for ApiMessage<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let role = match self.0.role {
            Role::ToolResult => "user",
            role => role.as_str(),
        };
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("role", role)?;
        match &self.0.content {
            Content::Text(text) => map.serialize_entry("content", text)?,
            Content::Parts(parts) => map.serialize_entry("content", &Parts(parts))?,
        }
        map.end()
    }
}

/// Content parts.
struct Parts<'a>(&'a [Part]);

impl Serialize for Parts<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(ApiPart))
    }
}

/// `{"type": "text", "text": …}` or `{"type": kind, kind: {"url": …}}`.
struct ApiPart<'a>(&'a Part);

impl Serialize for ApiPart<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        let (kind, url) = match self.0 {
            Part::Text(text) => {
                map.serialize_entry("type", "text")?;
                map.serialize_entry("text", text)?;
                return map.end();
            }
            Part::ImageUrl(url) => ("image_url", url),
            Part::AudioInput(url) => ("audio_input", url),
            Part::File(url) => ("file", url),
        };
        map.serialize_entry("type", kind)?;
        map.serialize_entry(kind, &Url(url))?;
        map.end()
    }
}

/// `{"url": …}`.
struct Url<'a>(&'a str);

impl Serialize for Url<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(1))?;
        map.serialize_entry("url", self.0)?;
        map.end()
    }
}

/// `tools`: each `{"type": "function", "function": {"name", "description"?,
/// "parameters"?, "strict"?}}`.
struct Tools<'a>(&'a [ToolDefinition]);

impl Serialize for Tools<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(ApiTool))
    }
}

struct ApiTool<'a>(&'a ToolDefinition);

impl Serialize for ApiTool<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("type", "function")?;
        map.serialize_entry("function", &Function(self.0))?;
        map.end()
    }
}

struct Function<'a>(&'a ToolDefinition);

impl Serialize for Function<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let tool = self.0;
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("name", &tool.name)?;
        if !tool.description.is_empty() {
            map.serialize_entry("description", &tool.description)?;
        }
        if !tool.parameters.is_null() {
            map.serialize_entry("parameters", &tool.parameters)?;
        }
        if let Some(strict) = tool.strict {
            map.serialize_entry("strict", &strict)?;
        }
        map.end()
    }
}

/// `stream_options`: `{"include_usage": true}`.
struct IncludeUsage;

impl Serialize for IncludeUsage {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(1))?;
        map.serialize_entry("include_usage", &true)?;
        map.end()
    }
}

/// `response_format` for any JSON object: `{"type": "json_object"}`.
struct JsonObject;

impl Serialize for JsonObject {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(1))?;
        map.serialize_entry("type", "json_object")?;
        map.end()
    }
}

/// `response_format` for a schema: `{"type": "json_schema", "json_schema": {"name",
/// "schema", "strict": true}}`.
struct SchemaFormat<'a> {
    name: &'a str,
    schema: &'a Json,
}

impl Serialize for SchemaFormat<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("type", "json_schema")?;
        let inner = JsonSchema {
            name: self.name,
            schema: self.schema,
        };
        map.serialize_entry("json_schema", &inner)?;
        map.end()
    }
}

struct JsonSchema<'a> {
    name: &'a str,
    schema: &'a Json,
}

impl Serialize for JsonSchema<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(3))?;
        map.serialize_entry("name", self.name)?;
        map.serialize_entry("schema", self.schema)?;
        map.serialize_entry("strict", &true)?;
        map.end()
    }
}

// ---------------------------------------------------------------------------------------
// The response.

#[cold]
fn invalid_response(detail: String) -> ProviderError {
    ProviderError::new(
        ProviderErrorKind::InvalidResponse,
        format!("invalid provider response: {detail}"),
    )
}

/// The `message` of choice 0.
fn first_message(raw: &Json) -> Result<&Map<String, Json>, String> {
    let choices = match raw.get("choices") {
        Some(Json::Array(choices)) => choices,
        Some(other) if raw.is_object() => {
            return Err(format!(
                "expected `choices` to be an array, found {}",
                kind(other)
            ));
        }
        _ if raw.is_object() => {
            return Err(
                "expected an object with a `choices` array, found an object without `choices`"
                    .into(),
            );
        }
        _ => {
            return Err(format!(
                "expected an object with a `choices` array, found {}",
                kind(raw)
            ));
        }
    };
    let choice = choices.first().ok_or("`choices` is empty")?;
    if !choice.is_object() {
        return Err(format!(
            "expected choice 0 to be an object, found {}",
            kind(choice)
        ));
    }
    match choice.get("message") {
        None | Some(Json::Null) => Err("choice 0 has no `message`".into()),
        Some(Json::Object(message)) => Ok(message),
        Some(other) => Err(format!(
            "expected the `message` of choice 0 to be an object, found {}",
            kind(other)
        )),
    }
}

/// Reads content part `index`; `None` for a part type the completion has no place for.
fn read_part(index: usize, part: &Json) -> Result<Option<Part>, String> {
    let part = match part {
        Json::String(text) => return Ok(Some(Part::Text(text.clone()))),
        Json::Object(part) => part,
        other => {
            return Err(format!(
                "expected content part {index} to be an object, found {}",
                kind(other)
            ));
        }
    };
    let part_type = match part.get("type") {
        Some(Json::String(t)) => t.as_str(),
        Some(other) => {
            return Err(format!(
                "expected the `type` of content part {index} to be a string, found {}",
                kind(other)
            ));
        }
        None => return Err(format!("content part {index} has no `type`")),
    };
    let (make, url_keys): (fn(String) -> Part, &[&str]) = match part_type {
        "text" => {
            return match part.get("text") {
                Some(Json::String(text)) => Ok(Some(Part::Text(text.clone()))),
                _ => Err(format!(
                    "content part {index} of type `text` has no `text` string"
                )),
            };
        }
        "image_url" => (Part::ImageUrl, &["url"]),
        "audio_input" => (Part::AudioInput, &["url"]),
        "file" => (Part::File, &["url", "file_id"]),
        // Unknown part types (`refusal`, `input_audio`, vendor extensions) carry nothing
        // the `result_*` variables have a place for.
        _ => return Ok(None),
    };
    let url = match part.get(part_type) {
        Some(Json::String(url)) => Some(url),
        Some(Json::Object(inner)) => url_keys.iter().find_map(|key| match inner.get(*key) {
            Some(Json::String(url)) => Some(url),
            _ => None,
        }),
        _ => None,
    };
    match url {
        Some(url) => Ok(Some(make(url.clone()))),
        None => {
            let wanted: Vec<String> = url_keys
                .iter()
                .map(|key| format!("`{part_type}.{key}`"))
                .collect();
            Err(format!(
                "content part {index} of type `{part_type}` has no {} string",
                wanted.join(" or ")
            ))
        }
    }
}

/// Reads tool call `index`.
fn read_tool_call(index: usize, call: &Json) -> Result<ToolCall, String> {
    if !call.is_object() {
        return Err(format!(
            "expected tool call {index} to be an object, found {}",
            kind(call)
        ));
    }
    let id = match call.get("id") {
        None | Some(Json::Null) => String::new(),
        Some(Json::String(id)) => id.clone(),
        Some(Json::Number(id)) => id.to_string(),
        Some(other) => {
            return Err(format!(
                "expected the `id` of tool call {index} to be a string, found {}",
                kind(other)
            ));
        }
    };
    let function = match call.get("function") {
        Some(function @ Json::Object(_)) => function,
        None | Some(Json::Null) => return Err(format!("tool call {index} has no `function.name`")),
        Some(other) => {
            return Err(format!(
                "expected the `function` of tool call {index} to be an object, found {}",
                kind(other)
            ));
        }
    };
    let name = match function.get("name") {
        Some(Json::String(name)) => name.clone(),
        None | Some(Json::Null) => return Err(format!("tool call {index} has no `function.name`")),
        Some(other) => {
            return Err(format!(
                "expected the `function.name` of tool call {index} to be a string, found {}",
                kind(other)
            ));
        }
    };
    let arguments = match function.get("arguments") {
        None | Some(Json::Null) => Json::Object(Map::new()),
        Some(arguments) => arguments.clone(),
    };
    Ok(ToolCall::new(id, name, arguments))
}

/// `usage`: the object as the `usage` variable shows it, and the token counts read from it.
fn read_usage(fields: &Map<String, Json>) -> Usage {
    Usage {
        input_tokens: fields.get("prompt_tokens").and_then(Json::as_u64),
        output_tokens: fields.get("completion_tokens").and_then(Json::as_u64),
        fields: fields.clone(),
    }
}

fn finish_reason(reason: &str) -> FinishReason {
    match reason {
        "stop" => FinishReason::Stop,
        "length" => FinishReason::Length,
        "tool_calls" => FinishReason::ToolCalls,
        "content_filter" => FinishReason::ContentFilter,
        other => FinishReason::Other(other.to_owned()),
    }
}

fn part_json(part: &Part) -> Json {
    let (kind, url) = match part {
        Part::Text(text) => return serde_json::json!({"type": "text", "text": text}),
        Part::ImageUrl(url) => ("image_url", url),
        Part::AudioInput(url) => ("audio_input", url),
        Part::File(url) => ("file", url),
    };
    let mut inner = Map::new();
    inner.insert("url".into(), Json::from(url.as_str()));
    let mut map = Map::new();
    map.insert("type".into(), Json::from(kind));
    map.insert(kind.into(), Json::Object(inner));
    Json::Object(map)
}

fn tool_call_json(call: &ToolCall) -> Json {
    serde_json::json!({
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    })
}

mod stream;
pub use stream::ChunkAssembler;

#[cfg(test)]
mod tests;

//! The Anthropic Messages API (`POST /v1/messages`), as pure functions: a typed
//! [`ProviderRequest`] to a request body, a response body to a typed [`Completion`], and
//! an error body to the API's message. `spec/providers.md` ("Anthropic") specifies the
//! mapping; `aplc-runtime`'s `AnthropicProvider` adds the transport, retries and auth.
//!
//! [`encode_streaming_request`] and [`EventAssembler`] are the streamed form.
//!
//! Not in here: HTTP statuses, headers and retries, and quoting a body in an error (the
//! runtime redacts secrets before it quotes anything).

use std::sync::Arc;

use serde_json::{Map, Value as Json, json};

use crate::provider::exchange::{
    Completion, Content, FinishReason, Message, OutputFormat, Part, ProviderError,
    ProviderErrorKind, ProviderRequest, Role, ToolCall, ToolDefinition, Usage,
};
use crate::text::json_kind as kind;

/// `max_tokens` when the agent sets none: the API requires one, and 4096 is an output
/// every current Claude model allows.
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// The system instruction appended for [`OutputFormat::JsonObject`]: the API has no
/// `response_format`.
pub const JSON_OBJECT_INSTRUCTION: &str =
    "Respond with a single JSON object and nothing else: no prose, no code fence.";

/// Encodes the Messages API request body for `request`.
///
/// Fails with [`ProviderErrorKind::InvalidRequest`] when the request holds something the
/// API cannot take: an audio attachment, an attachment in a system or developer message,
/// or an attachment URL that is neither `http(s)://` nor a base64 `data:` URL.
pub fn encode_request(request: &ProviderRequest) -> Result<Vec<u8>, ProviderError> {
    encode(request, false)
}

/// [`encode_request`] asking for a stream (`"stream": true` last); [`EventAssembler`]
/// reads the answer.
pub fn encode_streaming_request(request: &ProviderRequest) -> Result<Vec<u8>, ProviderError> {
    encode(request, true)
}

fn encode(request: &ProviderRequest, stream: bool) -> Result<Vec<u8>, ProviderError> {
    let mut body = Map::new();
    body.insert("model".into(), Json::String(request.model.clone()));
    let max_tokens = request
        .sampling
        .max_tokens
        .clone()
        .unwrap_or_else(|| json!(DEFAULT_MAX_TOKENS));
    body.insert("max_tokens".into(), max_tokens);
    let (system, messages) = messages(&request.messages)?;
    if let Some(system) = system_text(system, &request.output) {
        body.insert("system".into(), Json::String(system));
    }
    body.insert("messages".into(), Json::Array(messages));
    let sampling = &request.sampling;
    for (field, value) in [
        ("temperature", &sampling.temperature),
        ("top_p", &sampling.top_p),
        ("top_k", &sampling.top_k),
    ] {
        if let Some(value) = value {
            body.insert(field.into(), value.clone());
        }
    }
    if let Some(stop) = &sampling.stop_sequences {
        // OpenAI's `stop` may be one string; Anthropic's `stop_sequences` is always a list.
        let stop = match stop {
            Json::String(_) => Json::Array(vec![stop.clone()]),
            other => other.clone(),
        };
        body.insert("stop_sequences".into(), stop);
    }
    if !request.tools.is_empty() {
        body.insert(
            "tools".into(),
            Json::Array(request.tools.iter().map(tool).collect()),
        );
    }
    if stream {
        body.insert("stream".into(), Json::Bool(true));
    }
    serde_json::to_vec(&Json::Object(body)).map_err(|e| {
        ProviderError::new(
            ProviderErrorKind::InvalidRequest,
            format!("the request could not be encoded: {e}"),
        )
    })
}

/// Decodes a Messages API response body (a 2xx one).
///
/// Fails with [`ProviderErrorKind::InvalidResponse`] when the body is not JSON, not a
/// message, or an error object. Messages do not quote the body: the caller does, after
/// redacting it.
pub fn decode_response(body: &[u8]) -> Result<Completion, ProviderError> {
    let invalid = |message: String| ProviderError::new(ProviderErrorKind::InvalidResponse, message);
    let json: Json = serde_json::from_slice(body)
        .map_err(|e| invalid(format!("the response is not JSON ({e})")))?;
    let Json::Object(object) = &json else {
        return Err(invalid(format!(
            "the response is not an Anthropic message (it is {})",
            kind(&json)
        )));
    };
    if object.get("type").and_then(Json::as_str) == Some("error") {
        let detail = error_message(&json).unwrap_or_else(|| "no message".to_owned());
        return Err(invalid(format!("the response is an error: {detail}")));
    }
    let blocks = match object.get("content") {
        Some(Json::Array(blocks)) => blocks,
        Some(other) => {
            return Err(invalid(format!(
                "the response is not an Anthropic message (`content` is {})",
                kind(other)
            )));
        }
        None => {
            return Err(invalid(
                "the response is not an Anthropic message (no `content` array)".to_owned(),
            ));
        }
    };
    let mut completion = Completion::empty();
    for (index, block) in blocks.iter().enumerate() {
        content_block(index, block, &mut completion).map_err(invalid)?;
    }
    if let Some(role) = object.get("role").and_then(Json::as_str) {
        completion.role = role.to_owned();
    }
    completion.model = object
        .get("model")
        .and_then(Json::as_str)
        .map(str::to_owned);
    completion.finish_reason = object
        .get("stop_reason")
        .and_then(Json::as_str)
        .map(finish_reason);
    completion.usage = match object.get("usage") {
        Some(Json::Object(usage)) => Some(self::usage(usage)),
        _ => None,
    };
    completion.raw = Some(Arc::new(json));
    Ok(completion)
}

/// The API's message from an error body, `{"type": "error", "error": {"type", "message"}}`,
/// as `<type>: <message>` (`overloaded_error: Overloaded`); `None` for another shape.
pub fn error_message(json: &Json) -> Option<String> {
    let error = json.get("error")?;
    let message = error.get("message").and_then(Json::as_str)?;
    Some(match error.get("type").and_then(Json::as_str) {
        Some(kind) if !kind.is_empty() => format!("{kind}: {message}"),
        _ => message.to_owned(),
    })
}

// ---------------------------------------------------------------------------------------
// The request.

/// The API's messages, and the text of every system and developer message, in order.
///
/// `tool_result` messages become user text (APL's sections carry no `tool_use_id`, as in
/// the OpenAI mapping). Consecutive messages that end up with the same role are merged,
/// since the API wants user and assistant turns to alternate. Empty text is left out (the
/// API refuses empty text blocks), and so is a message left with nothing.
fn messages(messages: &[Message]) -> Result<(Vec<String>, Vec<Json>), ProviderError> {
    let mut system = Vec::new();
    let mut turns: Vec<(&'static str, Vec<Json>)> = Vec::new();
    for (index, message) in messages.iter().enumerate() {
        let role = match message.role {
            Role::System | Role::Developer => {
                system.push(system_message(index, message)?);
                continue;
            }
            Role::Assistant => "assistant",
            _ => "user",
        };
        let blocks = blocks(index, &message.content)?;
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((last, content)) if *last == role => content.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    let turns = turns
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    Ok((system, turns))
}

/// A system or developer message's text; attachments cannot go in `system`.
fn system_message(index: usize, message: &Message) -> Result<String, ProviderError> {
    match &message.content {
        Content::Text(text) => Ok(text.clone()),
        Content::Parts(parts) => parts
            .iter()
            .map(|part| match part {
                Part::Text(text) => Ok(text.as_str()),
                _ => Err(invalid_request(format!(
                    "message {index} ({}) has an attachment: Anthropic's `system` takes \
                     text only",
                    message.role.as_str()
                ))),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|texts| texts.concat()),
    }
}

/// The top-level `system`: the system and developer texts joined by a blank line, then
/// the instruction for a JSON output format, if any.
fn system_text(mut parts: Vec<String>, output: &OutputFormat) -> Option<String> {
    match output {
        OutputFormat::Text => {}
        OutputFormat::JsonObject => parts.push(JSON_OBJECT_INSTRUCTION.to_owned()),
        OutputFormat::JsonSchema { schema, .. } => parts.push(format!(
            "Respond with a single JSON object that matches this JSON schema, and nothing \
             else: no prose, no code fence.\n{schema}"
        )),
    }
    parts.retain(|part| !part.is_empty());
    (!parts.is_empty()).then(|| parts.join("\n\n"))
}

/// A message's content as content blocks.
fn blocks(index: usize, content: &Content) -> Result<Vec<Json>, ProviderError> {
    match content {
        Content::Text(text) if text.is_empty() => Ok(Vec::new()),
        Content::Text(text) => Ok(vec![json!({"type": "text", "text": text})]),
        Content::Parts(parts) => parts
            .iter()
            .filter(|part| !matches!(part, Part::Text(text) if text.is_empty()))
            .map(|part| block(index, part))
            .collect(),
    }
}

/// One content part as a content block.
fn block(index: usize, part: &Part) -> Result<Json, ProviderError> {
    match part {
        Part::Text(text) => Ok(json!({"type": "text", "text": text})),
        Part::ImageUrl(url) => Ok(json!({"type": "image", "source": source(index, url)?})),
        Part::File(url) => Ok(json!({"type": "document", "source": source(index, url)?})),
        Part::AudioInput(_) => Err(invalid_request(format!(
            "message {index} has an audio attachment: Anthropic's Messages API takes no \
             audio input"
        ))),
    }
}

/// An attachment's `source`: a base64 `data:` URL inline, an `http(s)://` URL by
/// reference.
fn source(index: usize, url: &str) -> Result<Json, ProviderError> {
    if let Some(data) = url.strip_prefix("data:") {
        let (media_type, payload) = data
            .split_once(";base64,")
            .filter(|(media_type, _)| !media_type.is_empty())
            .ok_or_else(|| {
                invalid_request(format!(
                    "message {index}: a `data:` attachment must be base64 with a media type \
                     (`data:image/png;base64,…`)"
                ))
            })?;
        return Ok(json!({"type": "base64", "media_type": media_type, "data": payload}));
    }
    let scheme = url.split_once("://").map(|(scheme, _)| scheme);
    if matches!(scheme, Some(s) if s.eq_ignore_ascii_case("http") || s.eq_ignore_ascii_case("https"))
    {
        return Ok(json!({"type": "url", "url": url}));
    }
    Err(invalid_request(format!(
        "message {index}: Anthropic takes attachments as http(s) URLs or base64 `data:` URLs; \
         `{}` is neither",
        clip(url, 60)
    )))
}

/// A tool as `{"name", "description", "input_schema"}`; a tool without a schema takes
/// any object.
fn tool(tool: &ToolDefinition) -> Json {
    let mut entry = Map::new();
    entry.insert("name".into(), Json::String(tool.name.clone()));
    if !tool.description.is_empty() {
        entry.insert("description".into(), Json::String(tool.description.clone()));
    }
    let schema = match &tool.parameters {
        Json::Null => json!({"type": "object"}),
        schema => schema.clone(),
    };
    entry.insert("input_schema".into(), schema);
    Json::Object(entry)
}

fn invalid_request(message: String) -> ProviderError {
    ProviderError::new(ProviderErrorKind::InvalidRequest, message)
}

/// At most `max` characters of `text`, with `…` when cut.
fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

// ---------------------------------------------------------------------------------------
// The response.

/// Adds one content block to `completion`. Blocks that carry nothing for the machine
/// (`thinking`, `redacted_thinking`, server tool blocks, types added later) are skipped.
fn content_block(index: usize, block: &Json, completion: &mut Completion) -> Result<(), String> {
    let field = |name: &str| block.get(name).and_then(Json::as_str);
    match field("type") {
        Some("text") => {
            let text = field("text")
                .ok_or_else(|| format!("content block {index} (text) has no string `text`"))?;
            completion.content.push(Part::Text(text.to_owned()));
        }
        Some("tool_use") => {
            let name = field("name")
                .ok_or_else(|| format!("content block {index} (tool_use) has no string `name`"))?;
            let arguments = match block.get("input") {
                None | Some(Json::Null) => Json::Object(Map::new()),
                Some(input) => input.clone(),
            };
            let id = field("id").unwrap_or_default();
            completion
                .tool_calls
                .push(ToolCall::new(id, name, arguments));
        }
        Some(_) => {}
        None => return Err(format!("content block {index} has no string `type`")),
    }
    Ok(())
}

/// `stop_reason` as a [`FinishReason`].
fn finish_reason(reason: &str) -> FinishReason {
    match reason {
        "end_turn" | "stop_sequence" => FinishReason::Stop,
        "max_tokens" => FinishReason::Length,
        "tool_use" => FinishReason::ToolCalls,
        "refusal" => FinishReason::ContentFilter,
        other => FinishReason::Other(other.to_owned()),
    }
}

/// `usage`, with OpenAI-shaped `fields` (`prompt_tokens`, `completion_tokens`,
/// `total_tokens`) followed by every field Anthropic reported, under its own name.
fn usage(usage: &Map<String, Json>) -> Usage {
    let input_tokens = usage.get("input_tokens").and_then(Json::as_u64);
    let output_tokens = usage.get("output_tokens").and_then(Json::as_u64);
    let mut fields = Map::new();
    if let Some(input) = input_tokens {
        fields.insert("prompt_tokens".into(), json!(input));
    }
    if let Some(output) = output_tokens {
        fields.insert("completion_tokens".into(), json!(output));
    }
    if let (Some(input), Some(output)) = (input_tokens, output_tokens) {
        fields.insert("total_tokens".into(), json!(input.saturating_add(output)));
    }
    for (name, value) in usage {
        fields.entry(name.clone()).or_insert_with(|| value.clone());
    }
    Usage {
        input_tokens,
        output_tokens,
        fields,
    }
}

mod stream;
pub use stream::EventAssembler;

#[cfg(test)]
mod tests {
    use super::*;

    fn body(request: &ProviderRequest) -> Json {
        serde_json::from_slice(&encode_request(request).unwrap()).unwrap()
    }

    fn user(text: &str) -> Message {
        Message::text(Role::User, text)
    }

    #[test]
    fn minimal_request_has_the_default_max_tokens() {
        let request = ProviderRequest::new("claude-x", vec![user("hi")]);
        assert_eq!(
            String::from_utf8(encode_request(&request).unwrap()).unwrap(),
            r#"{"model":"claude-x","max_tokens":4096,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}"#
        );
    }

    #[test]
    fn system_and_developer_are_lifted_and_roles_alternate() {
        let request = ProviderRequest::new(
            "m",
            vec![
                Message::text(Role::System, "Be brief."),
                user("a"),
                Message::text(Role::Developer, "Use metric units."),
                user("b"),
                Message::text(Role::Assistant, "c"),
                Message::text(Role::ToolResult, "42"),
                user(""),
                user("d"),
            ],
        );
        assert_eq!(
            body(&request),
            json!({
                "model": "m", "max_tokens": 4096,
                "system": "Be brief.\n\nUse metric units.",
                "messages": [
                    {"role": "user", "content": [
                        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                    {"role": "assistant", "content": [{"type": "text", "text": "c"}]},
                    {"role": "user", "content": [
                        {"type": "text", "text": "42"}, {"type": "text", "text": "d"}]},
                ]
            })
        );
    }

    #[test]
    fn attachments_map_to_image_and_document_sources() {
        let request = ProviderRequest::new(
            "m",
            vec![Message::new(
                Role::User,
                Content::Parts(vec![
                    Part::Text("look".into()),
                    Part::ImageUrl("https://x.test/cat.png".into()),
                    Part::ImageUrl("data:image/png;base64,iVBORw0K".into()),
                    Part::File("https://x.test/paper.pdf".into()),
                    Part::Text(String::new()),
                ]),
            )],
        );
        assert_eq!(
            body(&request)["messages"][0]["content"],
            json!([
                {"type": "text", "text": "look"},
                {"type": "image", "source": {"type": "url", "url": "https://x.test/cat.png"}},
                {"type": "image", "source":
                    {"type": "base64", "media_type": "image/png", "data": "iVBORw0K"}},
                {"type": "document", "source": {"type": "url", "url": "https://x.test/paper.pdf"}},
            ])
        );
    }

    #[test]
    fn unsupported_attachments_are_invalid_requests() {
        let one = |part: Part| {
            let request = ProviderRequest::new(
                "m",
                vec![Message::new(Role::User, Content::Parts(vec![part]))],
            );
            encode_request(&request).unwrap_err()
        };
        let e = one(Part::AudioInput("https://x.test/a.wav".into()));
        assert_eq!(e.kind, ProviderErrorKind::InvalidRequest);
        assert_eq!(
            e.message,
            "message 0 has an audio attachment: Anthropic's Messages API takes no audio input"
        );
        let e = one(Part::File("file-abc123".into()));
        assert_eq!(e.kind, ProviderErrorKind::InvalidRequest);
        assert!(e.message.contains("`file-abc123` is neither"), "{e}");
        let e = one(Part::ImageUrl("data:;base64,xx".into()));
        assert!(
            e.message.contains("must be base64 with a media type"),
            "{e}"
        );
        let system = ProviderRequest::new(
            "m",
            vec![Message::new(
                Role::System,
                Content::Parts(vec![Part::ImageUrl("https://x.test/a.png".into())]),
            )],
        );
        let e = encode_request(&system).unwrap_err();
        assert_eq!(
            e.message,
            "message 0 (system) has an attachment: Anthropic's `system` takes text only"
        );
    }

    #[test]
    fn sampling_and_tools() {
        let mut request = ProviderRequest::new("m", vec![user("hi")]);
        request.sampling.temperature = Some(json!(0.2));
        request.sampling.max_tokens = Some(json!(50));
        request.sampling.top_p = Some(json!(0.9));
        request.sampling.top_k = Some(json!(40));
        request.sampling.stop_sequences = Some(json!("END"));
        request.sampling.seed = Some(json!(7));
        request.sampling.presence_penalty = Some(json!(0.5));
        request.sampling.frequency_penalty = Some(json!(0.5));
        request.sampling.logit_bias = Some(json!({"1": 2}));
        request.sampling.repetition_penalty = Some(json!(1.1));
        request.tools = Arc::from(vec![
            ToolDefinition::new(
                "get_weather",
                "Weather for a city",
                json!({"type": "object", "properties": {"city": {"type": "string"}}}),
            ),
            ToolDefinition::new("now", "", Json::Null),
        ]);
        assert_eq!(
            String::from_utf8(encode_request(&request).unwrap()).unwrap(),
            r#"{"model":"m","max_tokens":50,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"temperature":0.2,"top_p":0.9,"top_k":40,"stop_sequences":["END"],"tools":[{"name":"get_weather","description":"Weather for a city","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}},{"name":"now","input_schema":{"type":"object"}}]}"#
        );
    }

    #[test]
    fn json_output_formats_become_a_system_instruction() {
        let mut request = ProviderRequest::new("m", vec![user("hi")]);
        request.output = OutputFormat::JsonObject;
        assert_eq!(body(&request)["system"], JSON_OBJECT_INSTRUCTION);
        request.messages = Arc::from(vec![Message::text(Role::System, "S."), user("hi")]);
        request.output = OutputFormat::JsonSchema {
            name: "person".into(),
            schema: json!({"type": "object"}),
        };
        assert_eq!(
            body(&request)["system"],
            "S.\n\nRespond with a single JSON object that matches this JSON schema, and \
             nothing else: no prose, no code fence.\n{\"type\":\"object\"}"
        );
    }

    #[test]
    fn a_message_decodes_to_a_completion() {
        let body = json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "s"},
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                 "input": {"city": "Paris"}},
            ],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 3}
        });
        let completion = decode_response(body.to_string().as_bytes()).unwrap();
        assert_eq!(completion.role, "assistant");
        assert_eq!(completion.content, [Part::Text("Let me check.".into())]);
        assert_eq!(
            completion.tool_calls,
            [ToolCall::new(
                "toolu_1",
                "get_weather",
                json!({"city": "Paris"})
            )]
        );
        assert_eq!(completion.finish_reason, Some(FinishReason::ToolCalls));
        assert_eq!(completion.model.as_deref(), Some("claude-x"));
        let usage = completion.usage.unwrap();
        assert_eq!(
            (usage.input_tokens, usage.output_tokens),
            (Some(10), Some(5))
        );
        assert_eq!(
            Json::Object(usage.fields),
            json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
                   "input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 3})
        );
        assert_eq!(completion.raw.as_deref(), Some(&body));
    }

    #[test]
    fn stop_reasons() {
        for (reason, expected) in [
            ("end_turn", FinishReason::Stop),
            ("stop_sequence", FinishReason::Stop),
            ("max_tokens", FinishReason::Length),
            ("tool_use", FinishReason::ToolCalls),
            ("refusal", FinishReason::ContentFilter),
            ("pause_turn", FinishReason::Other("pause_turn".into())),
        ] {
            let body = json!({"content": [], "stop_reason": reason}).to_string();
            let completion = decode_response(body.as_bytes()).unwrap();
            assert_eq!(completion.finish_reason, Some(expected), "{reason}");
            assert_eq!(completion.role, "assistant");
        }
    }

    #[test]
    fn malformed_bodies_are_invalid_responses() {
        for (body, message) in [
            (
                "<html>",
                "the response is not JSON (expected value at line 1 column 1)",
            ),
            (
                "[]",
                "the response is not an Anthropic message (it is an array)",
            ),
            (
                "{}",
                "the response is not an Anthropic message (no `content` array)",
            ),
            (
                r#"{"content": "hi"}"#,
                "the response is not an Anthropic message (`content` is a string)",
            ),
            (
                r#"{"content": [{"type": "text"}]}"#,
                "content block 0 (text) has no string `text`",
            ),
            (
                r#"{"content": [{}]}"#,
                "content block 0 has no string `type`",
            ),
            (
                r#"{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}"#,
                "the response is an error: overloaded_error: Overloaded",
            ),
        ] {
            let e = decode_response(body.as_bytes()).unwrap_err();
            assert_eq!(e.kind, ProviderErrorKind::InvalidResponse, "{body}");
            assert_eq!(e.message, message, "{body}");
        }
    }

    #[test]
    fn error_bodies() {
        assert_eq!(
            error_message(&json!({"type": "error",
                "error": {"type": "rate_limit_error", "message": "slow down"}})),
            Some("rate_limit_error: slow down".into())
        );
        assert_eq!(
            error_message(&json!({"error": {"message": "plain"}})),
            Some("plain".into())
        );
        assert_eq!(error_message(&json!({"message": "x"})), None);
    }
}

//! A streamed Messages API response (`"stream": true`): its events in, text deltas and
//! the same [`Completion`] as the whole message out.
//!
//! `message_start` carries the message without content (`id`, `model`, `role`, `usage`
//! with `input_tokens`); each content block opens with `content_block_start` (a `text`
//! block, or a `tool_use` block with its `id` and `name`), grows with
//! `content_block_delta`s (`text_delta`, `input_json_delta` pieces of the tool input as
//! JSON text) and closes with `content_block_stop`; `message_delta` carries
//! `stop_reason` and the final `usage.output_tokens`; `message_stop` ends the stream.
//! `ping` and event types added later are skipped; an `error` event is the server's
//! failure.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value as Json};

use super::{content_block, error_message, finish_reason, usage};
use crate::provider::exchange::{Completion, ProviderError, ProviderErrorKind};
use crate::provider::wire::StreamAssembler;
use crate::provider::wire::sse::{SseDecoder, SseEvent};
use crate::text::json_kind as kind;

/// Assembles an Anthropic Messages stream. See the module documentation.
#[derive(Debug, Default)]
pub struct EventAssembler {
    sse: SseDecoder,
    events: Vec<SseEvent>,
    /// `message_start`'s message: the base of the assembled one.
    message: Option<Map<String, Json>>,
    blocks: BTreeMap<u64, Block>,
    usage: Map<String, Json>,
    done: bool,
}

/// A content block being assembled.
#[derive(Debug)]
struct Block {
    /// The block as `content_block_start` gave it.
    start: Map<String, Json>,
    /// The text of `text_delta`s.
    text: String,
    /// The JSON text of `input_json_delta`s; `None` without any.
    input: Option<String>,
}

impl EventAssembler {
    /// A new stream.
    pub fn new() -> EventAssembler {
        EventAssembler::default()
    }

    /// Reads one event's data.
    fn event(&mut self, event: &SseEvent, deltas: &mut Vec<String>) -> Result<(), ProviderError> {
        let invalid = |m: String| ProviderError::new(ProviderErrorKind::InvalidResponse, m);
        let json: Json = serde_json::from_str(&event.data).map_err(|e| {
            invalid(format!(
                "an event of the stream is not JSON ({e}): {}",
                clip(&event.data, 200)
            ))
        })?;
        let Json::Object(data) = json else {
            return Err(invalid(format!(
                "expected an event of the stream to be an object, found {}",
                kind(&json)
            )));
        };
        let kind_of = data
            .get("type")
            .and_then(Json::as_str)
            .unwrap_or(event.event.as_str());
        match kind_of {
            "message_start" => match data.get("message") {
                Some(Json::Object(message)) => {
                    if let Some(Json::Object(usage)) = message.get("usage") {
                        self.usage = usage.clone();
                    }
                    self.message = Some(message.clone());
                }
                _ => {
                    return Err(invalid(
                        "a `message_start` event has no `message` object".to_owned(),
                    ));
                }
            },
            "content_block_start" => {
                let index = index(&data).map_err(invalid)?;
                let Some(Json::Object(start)) = data.get("content_block") else {
                    return Err(invalid(format!(
                        "the `content_block_start` of block {index} has no `content_block` \
                         object"
                    )));
                };
                self.blocks.insert(
                    index,
                    Block {
                        start: start.clone(),
                        text: String::new(),
                        input: None,
                    },
                );
            }
            "content_block_delta" => {
                let index = index(&data).map_err(invalid)?;
                let block = self.blocks.get_mut(&index).ok_or_else(|| {
                    invalid(format!("a delta for block {index}, which never started"))
                })?;
                let delta = data.get("delta");
                let field = |name: &str| delta.and_then(|d| d.get(name)).and_then(Json::as_str);
                match field("type") {
                    Some("text_delta") => {
                        let text = field("text").ok_or_else(|| {
                            invalid(format!("a `text_delta` of block {index} has no `text`"))
                        })?;
                        block.text.push_str(text);
                        if !text.is_empty() {
                            deltas.push(text.to_owned());
                        }
                    }
                    Some("input_json_delta") => {
                        let piece = field("partial_json").ok_or_else(|| {
                            invalid(format!(
                                "an `input_json_delta` of block {index} has no `partial_json`"
                            ))
                        })?;
                        block.input.get_or_insert_default().push_str(piece);
                    }
                    // `thinking_delta`, `signature_delta`, `citations_delta`, later ones.
                    Some(_) => {}
                    None => {
                        return Err(invalid(format!(
                            "a `content_block_delta` of block {index} has no `delta.type`"
                        )));
                    }
                }
            }
            "message_delta" => {
                if let (Some(message), Some(Json::Object(delta))) =
                    (self.message.as_mut(), data.get("delta"))
                {
                    for (name, value) in delta {
                        message.insert(name.clone(), value.clone());
                    }
                }
                if let Some(Json::Object(usage)) = data.get("usage") {
                    for (name, value) in usage {
                        if !value.is_null() {
                            self.usage.insert(name.clone(), value.clone());
                        }
                    }
                }
            }
            "message_stop" => self.done = true,
            "error" => {
                let message = error_message(&Json::Object(data.clone()))
                    .unwrap_or_else(|| "no message".to_owned());
                let error_type = data
                    .get("error")
                    .and_then(|e| e.get("type"))
                    .and_then(Json::as_str);
                return Err(ProviderError::new(
                    error_kind(error_type),
                    format!("the stream reported an error: {message}"),
                ));
            }
            // `ping`, `content_block_stop` (the block is read at the end) and types added
            // later.
            _ => {}
        }
        Ok(())
    }

    /// The assembled message, read by the whole-message decoder's own rules.
    fn completion(self) -> Result<Completion, String> {
        let mut message = self
            .message
            .ok_or("the stream had no `message_start` event")?;
        let mut content = Vec::with_capacity(self.blocks.len());
        for (_, block) in self.blocks {
            let mut whole = block.start;
            match whole.get("type").and_then(Json::as_str) {
                Some("text") => {
                    let mut text = whole
                        .get("text")
                        .and_then(Json::as_str)
                        .unwrap_or_default()
                        .to_owned();
                    text.push_str(&block.text);
                    whole.insert("text".into(), Json::String(text));
                }
                Some("tool_use") => {
                    if let Some(input) = block.input.filter(|i| !i.trim().is_empty()) {
                        // Input that is not JSON goes to the machine as text, as an
                        // OpenAI call's `arguments` string does, and fails the same way.
                        let value = serde_json::from_str(&input).unwrap_or(Json::String(input));
                        whole.insert("input".into(), value);
                    }
                }
                _ => {}
            }
            content.push(Json::Object(whole));
        }
        let mut completion = Completion::empty();
        for (index, block) in content.iter().enumerate() {
            content_block(index, block, &mut completion)?;
        }
        if let Some(role) = message.get("role").and_then(Json::as_str) {
            completion.role = role.to_owned();
        }
        completion.model = message
            .get("model")
            .and_then(Json::as_str)
            .map(str::to_owned);
        completion.finish_reason = message
            .get("stop_reason")
            .and_then(Json::as_str)
            .map(finish_reason);
        completion.usage = (!self.usage.is_empty()).then(|| usage(&self.usage));
        message.insert("content".into(), Json::Array(content));
        if !self.usage.is_empty() {
            message.insert("usage".into(), Json::Object(self.usage));
        }
        completion.raw = Some(Arc::new(Json::Object(message)));
        Ok(completion)
    }

    fn dispatch(&mut self, deltas: &mut Vec<String>) -> Result<(), ProviderError> {
        let mut events = std::mem::take(&mut self.events);
        let mut result = Ok(());
        for event in &events {
            if self.done {
                break;
            }
            result = self.event(event, deltas);
            if result.is_err() {
                break;
            }
        }
        events.clear();
        self.events = events;
        result
    }
}

impl StreamAssembler for EventAssembler {
    fn feed(&mut self, chunk: &[u8], deltas: &mut Vec<String>) -> Result<(), ProviderError> {
        if self.done {
            return Ok(());
        }
        self.sse.feed(chunk, &mut self.events).map_err(invalid)?;
        self.dispatch(deltas)
    }

    fn done(&self) -> bool {
        self.done
    }

    fn finish(mut self) -> Result<Completion, ProviderError> {
        if !self.done {
            self.sse.finish(&mut self.events).map_err(invalid)?;
            self.dispatch(&mut Vec::new())?;
        }
        if !self.done {
            return Err(invalid("the stream ended before `message_stop`".to_owned()));
        }
        self.completion().map_err(invalid)
    }
}

fn invalid(message: String) -> ProviderError {
    ProviderError::new(ProviderErrorKind::InvalidResponse, message)
}

/// An event's `index`.
fn index(data: &Map<String, Json>) -> Result<u64, String> {
    data.get("index").and_then(Json::as_u64).ok_or_else(|| {
        let event = data
            .get("type")
            .and_then(Json::as_str)
            .unwrap_or("an event");
        format!("a `{event}` event has no `index`")
    })
}

/// The provider error kind of an `error` event's `error.type`, as its HTTP status
/// would have given it.
fn error_kind(error_type: Option<&str>) -> ProviderErrorKind {
    match error_type {
        Some("authentication_error" | "permission_error") => ProviderErrorKind::Auth,
        Some("rate_limit_error") => ProviderErrorKind::RateLimited,
        Some("invalid_request_error" | "not_found_error" | "request_too_large") => {
            ProviderErrorKind::InvalidRequest
        }
        _ => ProviderErrorKind::Server,
    }
}

/// At most `max` characters of `text`, with `…` when cut.
fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::provider::wire::anthropic::decode_response;

    /// A stream of `events`: one `event:`/`data:` pair each (the runtime's tests have
    /// the same helper, for their fake server).
    fn sse_body(events: &[Json]) -> String {
        let mut body = String::new();
        for event in events {
            let name = event
                .get("type")
                .and_then(Json::as_str)
                .unwrap_or("message");
            body.push_str(&format!("event: {name}\ndata: {event}\n\n"));
        }
        body
    }

    /// The events of a stream whose message is `message` (a whole Messages API response),
    /// split as the API splits it: text in pieces of `piece` characters, tool input JSON
    /// likewise.
    fn events_of(message: &Json, piece: usize) -> Vec<Json> {
        let piece = piece.max(1);
        let mut start = message.clone();
        start["content"] = json!([]);
        start["stop_reason"] = Json::Null;
        let usage = message.get("usage").cloned().unwrap_or(Json::Null);
        start["usage"] = json!({
            "input_tokens": usage.get("input_tokens").cloned().unwrap_or(Json::Null),
            "output_tokens": 1,
        });
        let mut events = vec![json!({"type": "message_start", "message": start})];
        let empty = Vec::new();
        let blocks = message
            .get("content")
            .and_then(Json::as_array)
            .unwrap_or(&empty);
        let pieces = |text: &str| -> Vec<String> {
            let chars: Vec<char> = text.chars().collect();
            chars.chunks(piece).map(|c| c.iter().collect()).collect()
        };
        for (index, block) in blocks.iter().enumerate() {
            match block.get("type").and_then(Json::as_str) {
                Some("text") => {
                    events.push(json!({"type": "content_block_start", "index": index,
                        "content_block": {"type": "text", "text": ""}}));
                    events.push(json!({"type": "ping"}));
                    for text in pieces(block["text"].as_str().unwrap_or_default()) {
                        events.push(json!({"type": "content_block_delta", "index": index,
                            "delta": {"type": "text_delta", "text": text}}));
                    }
                }
                Some("tool_use") => {
                    events.push(json!({"type": "content_block_start", "index": index,
                        "content_block": {"type": "tool_use", "id": block["id"],
                                          "name": block["name"], "input": {}}}));
                    for json in pieces(&block["input"].to_string()) {
                        events.push(json!({"type": "content_block_delta", "index": index,
                            "delta": {"type": "input_json_delta", "partial_json": json}}));
                    }
                }
                _ => events.push(json!({"type": "content_block_start", "index": index,
                    "content_block": block})),
            }
            events.push(json!({"type": "content_block_stop", "index": index}));
        }
        events.push(json!({"type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": Json::Null},
            "usage": {"output_tokens": usage.get("output_tokens").cloned().unwrap_or(Json::Null)}}));
        events.push(json!({"type": "message_stop"}));
        events
    }

    fn assemble(body: &str, step: usize) -> (Vec<String>, Result<Completion, ProviderError>) {
        let mut assembler = EventAssembler::new();
        let mut deltas = Vec::new();
        for piece in body.as_bytes().chunks(step.max(1)) {
            if let Err(e) = assembler.feed(piece, &mut deltas) {
                return (deltas, Err(e));
            }
        }
        (deltas, assembler.finish())
    }

    fn without_raw(mut completion: Completion) -> Completion {
        completion.raw = None;
        completion
    }

    fn message() -> Json {
        json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [
                {"type": "text", "text": "Let me add é."},
                {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1, "b": [2, 3]}},
            ],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 12, "output_tokens": 30},
        })
    }

    #[test]
    fn the_streaming_request_asks_for_a_stream() {
        use crate::provider::exchange::{Message, ProviderRequest, Role};
        use crate::provider::wire::anthropic::{encode_request, encode_streaming_request};
        let request = ProviderRequest::new("m", vec![Message::text(Role::User, "hi")]);
        let body: Json =
            serde_json::from_slice(&encode_streaming_request(&request).unwrap()).unwrap();
        let mut whole: Json = serde_json::from_slice(&encode_request(&request).unwrap()).unwrap();
        assert!(whole.get("stream").is_none());
        whole["stream"] = json!(true);
        assert_eq!(body, whole);
    }

    #[test]
    fn a_stream_assembles_into_the_whole_message() {
        let whole = message();
        let expected = decode_response(whole.to_string().as_bytes()).unwrap();
        let body = sse_body(&events_of(&whole, 4));
        for step in [1, 5, 64, 100_000] {
            let (deltas, completion) = assemble(&body, step);
            assert_eq!(deltas.concat(), "Let me add é.");
            let completion = completion.unwrap();
            assert_eq!(completion.raw.as_deref(), Some(&whole), "step {step}");
            assert_eq!(without_raw(completion), without_raw(expected.clone()));
        }
    }

    #[test]
    fn faults_are_errors() {
        let events = events_of(&message(), 4);
        // Cut before `message_stop`.
        let (deltas, e) = assemble(&sse_body(&events[..events.len() - 1]), 7);
        assert_eq!(deltas.concat(), "Let me add é.");
        let e = e.unwrap_err();
        assert_eq!(e.kind, ProviderErrorKind::InvalidResponse);
        assert_eq!(e.message, "the stream ended before `message_stop`");
        // A malformed event.
        let body = format!(
            "{}event: content_block_delta\ndata: {{\"type\n\n",
            sse_body(&events[..3])
        );
        let e = assemble(&body, 1000).1.unwrap_err();
        assert_eq!(e.kind, ProviderErrorKind::InvalidResponse);
        assert!(
            e.message.starts_with("an event of the stream is not JSON"),
            "{}",
            e.message
        );
        // An error event.
        let body = sse_body(&[
            events[0].clone(),
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        ]);
        let e = assemble(&body, 1000).1.unwrap_err();
        assert_eq!(e.kind, ProviderErrorKind::Server);
        assert_eq!(
            e.message,
            "the stream reported an error: overloaded_error: Overloaded"
        );
        // A delta for a block that never started.
        let body = sse_body(&[events[0].clone(), events[4].clone()]);
        assert!(
            assemble(&body, 1000)
                .1
                .unwrap_err()
                .message
                .contains("never started")
        );
    }

    #[test]
    fn tool_input_that_is_not_json_reaches_the_machine_as_text() {
        let body = sse_body(&[
            json!({"type": "message_start", "message": {"role": "assistant", "model": "m", "content": []}}),
            json!({"type": "content_block_start", "index": 0,
                   "content_block": {"type": "tool_use", "id": "t", "name": "f", "input": {}}}),
            json!({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "input_json_delta", "partial_json": "{\"a\": "}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "message_stop"}),
        ]);
        let completion = assemble(&body, 1000).1.unwrap();
        assert_eq!(completion.tool_calls[0].arguments, json!("{\"a\": "));
        assert!(completion.content.is_empty());
        assert!(completion.usage.is_none());
        // A tool without input keeps the start's `{}`.
        let body = sse_body(&[
            json!({"type": "message_start", "message": {"content": []}}),
            json!({"type": "content_block_start", "index": 0,
                   "content_block": {"type": "tool_use", "id": "t", "name": "f", "input": {}}}),
            json!({"type": "message_stop"}),
        ]);
        let completion = assemble(&body, 1000).1.unwrap();
        assert_eq!(completion.tool_calls[0].arguments, json!({}));
    }
}

//! A streamed chat completion (`"stream": true`): `chat.completion.chunk` events in,
//! text deltas and the same [`Completion`] as the whole response out.
//!
//! Each chunk's `choices[0].delta` carries a piece of the message: `role`, `content`
//! text, and `tool_calls` fragments keyed by `index` (the first fragment of a call has
//! its `id` and `function.name`, later ones pieces of `function.arguments`). The chunk
//! with `finish_reason` ends the choice; with `stream_options.include_usage` one more
//! chunk, with empty `choices`, carries `usage`; `data: [DONE]` ends the stream.
//! Choices other than 0 are ignored, as the whole-response decoder ignores them.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value as Json};

use super::{finish_reason, invalid_response, read_tool_call, read_usage, response_json};
use crate::provider::exchange::{Completion, Part, ProviderError, ProviderErrorKind};
use crate::provider::wire::StreamAssembler;
use crate::provider::wire::sse::{SseDecoder, SseEvent};
use crate::text::json_kind as kind;

/// Assembles an OpenAI chat completion stream. See the module documentation.
#[derive(Debug, Default)]
pub struct ChunkAssembler {
    sse: SseDecoder,
    events: Vec<SseEvent>,
    done: bool,
    role: Option<String>,
    /// `None` until a chunk carries content text (even empty): a message of tool calls
    /// only has `content: null`.
    content: Option<String>,
    calls: BTreeMap<u64, PartialCall>,
    finish_reason: Option<String>,
    usage: Option<Map<String, Json>>,
    model: Option<String>,
    chunks: usize,
}

/// A tool call being assembled.
#[derive(Debug, Default)]
struct PartialCall {
    id: Option<Json>,
    name: Option<String>,
    /// `None` until a fragment carries `arguments`.
    arguments: Option<String>,
}

impl ChunkAssembler {
    /// A new stream.
    pub fn new() -> ChunkAssembler {
        ChunkAssembler::default()
    }

    fn chunk(&mut self, data: &str, deltas: &mut Vec<String>) -> Result<(), String> {
        if data.trim() == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let chunk: Json = serde_json::from_str(data).map_err(|e| {
            format!(
                "chunk {} is not JSON ({e}): {}",
                self.chunks,
                clip(data, 200)
            )
        })?;
        let at = self.chunks;
        self.chunks += 1;
        let Json::Object(chunk) = chunk else {
            return Err(format!(
                "expected chunk {at} to be an object, found {}",
                kind(&chunk)
            ));
        };
        if let Some(model) = chunk.get("model").and_then(Json::as_str)
            && !model.is_empty()
        {
            self.model = Some(model.to_owned());
        }
        if let Some(Json::Object(usage)) = chunk.get("usage") {
            self.usage = Some(usage.clone());
        }
        let choices = match chunk.get("choices") {
            Some(Json::Array(choices)) => choices,
            None | Some(Json::Null) => return Ok(()),
            Some(other) => {
                return Err(format!(
                    "expected the `choices` of chunk {at} to be an array, found {}",
                    kind(other)
                ));
            }
        };
        for choice in choices {
            let index = choice.get("index").and_then(Json::as_u64).unwrap_or(0);
            if index != 0 {
                continue;
            }
            if let Some(reason) = choice.get("finish_reason").and_then(Json::as_str) {
                self.finish_reason = Some(reason.to_owned());
            }
            match choice.get("delta") {
                None | Some(Json::Null) => {}
                Some(Json::Object(delta)) => self.delta(at, delta, deltas)?,
                Some(other) => {
                    return Err(format!(
                        "expected the `delta` of chunk {at} to be an object, found {}",
                        kind(other)
                    ));
                }
            }
        }
        Ok(())
    }

    fn delta(
        &mut self,
        at: usize,
        delta: &Map<String, Json>,
        deltas: &mut Vec<String>,
    ) -> Result<(), String> {
        if let Some(role) = delta.get("role").and_then(Json::as_str) {
            self.role = Some(role.to_owned());
        }
        match delta.get("content") {
            None | Some(Json::Null) => {}
            Some(Json::String(text)) => {
                self.content.get_or_insert_default().push_str(text);
                if !text.is_empty() {
                    deltas.push(text.clone());
                }
            }
            Some(other) => {
                return Err(format!(
                    "expected the `delta.content` of chunk {at} to be a string, found {}",
                    kind(other)
                ));
            }
        }
        let calls = match delta.get("tool_calls") {
            None | Some(Json::Null) => return Ok(()),
            Some(Json::Array(calls)) => calls,
            Some(other) => {
                return Err(format!(
                    "expected the `delta.tool_calls` of chunk {at} to be an array, found {}",
                    kind(other)
                ));
            }
        };
        for (position, fragment) in calls.iter().enumerate() {
            let index = match fragment.get("index") {
                Some(Json::Number(n)) => n.as_u64().ok_or_else(|| {
                    format!("a tool call fragment of chunk {at} has an invalid `index`")
                })?,
                None | Some(Json::Null) => position as u64,
                Some(other) => {
                    return Err(format!(
                        "expected the `index` of a tool call fragment of chunk {at} to be a \
                         number, found {}",
                        kind(other)
                    ));
                }
            };
            let call = self.calls.entry(index).or_default();
            if let Some(id) = fragment.get("id").filter(|id| !id.is_null())
                && id.as_str() != Some("")
            {
                call.id = Some(id.clone());
            }
            let Some(function) = fragment.get("function").filter(|f| !f.is_null()) else {
                continue;
            };
            match function.get("name") {
                None | Some(Json::Null) => {}
                Some(Json::String(name)) => call.name.get_or_insert_default().push_str(name),
                Some(other) => {
                    return Err(format!(
                        "expected the `function.name` of tool call {index} to be a string, \
                         found {}",
                        kind(other)
                    ));
                }
            }
            match function.get("arguments") {
                None | Some(Json::Null) => {}
                Some(Json::String(piece)) => {
                    call.arguments.get_or_insert_default().push_str(piece);
                }
                Some(other) => {
                    return Err(format!(
                        "expected the `function.arguments` of tool call {index} to be a \
                         string, found {}",
                        kind(other)
                    ));
                }
            }
        }
        Ok(())
    }

    /// The assembled message as the whole response would have carried it, read by the
    /// whole-response decoder's own rules (so a call without a name fails the same way).
    fn completion(self) -> Result<Completion, String> {
        let mut completion = Completion {
            role: self.role.unwrap_or_else(|| "assistant".to_owned()),
            ..Completion::empty()
        };
        // Servers open a tool-call message with `content: ""`; the whole response has
        // `content: null` there.
        match self.content {
            Some(text) if text.is_empty() && !self.calls.is_empty() => {}
            Some(text) => completion.content.push(Part::Text(text)),
            None => {}
        }
        for (position, (_, call)) in self.calls.into_iter().enumerate() {
            let mut function = Map::new();
            if let Some(name) = call.name {
                function.insert("name".into(), Json::String(name));
            }
            if let Some(arguments) = call.arguments {
                function.insert("arguments".into(), Json::String(arguments));
            }
            let mut whole = Map::new();
            if let Some(id) = call.id {
                whole.insert("id".into(), id);
            }
            whole.insert("function".into(), Json::Object(function));
            completion
                .tool_calls
                .push(read_tool_call(position, &Json::Object(whole))?);
        }
        completion.usage = self.usage.as_ref().map(read_usage);
        completion.finish_reason = self.finish_reason.as_deref().map(finish_reason);
        completion.model = self.model;
        completion.raw = Some(Arc::new(response_json(&completion)));
        Ok(completion)
    }
}

impl StreamAssembler for ChunkAssembler {
    fn feed(&mut self, chunk: &[u8], deltas: &mut Vec<String>) -> Result<(), ProviderError> {
        if self.done {
            return Ok(());
        }
        self.sse
            .feed(chunk, &mut self.events)
            .map_err(invalid_response)?;
        self.dispatch(deltas)
    }

    fn done(&self) -> bool {
        self.done
    }

    fn finish(mut self) -> Result<Completion, ProviderError> {
        if !self.done {
            let mut deltas = Vec::new();
            self.sse
                .finish(&mut self.events)
                .map_err(invalid_response)?;
            self.dispatch(&mut deltas)?;
        }
        if !self.done {
            return Err(invalid_response(
                "the stream ended before `data: [DONE]`".to_owned(),
            ));
        }
        self.completion().map_err(invalid_response)
    }
}

impl ChunkAssembler {
    /// Reads the events the SSE decoder completed; an `error` object in a chunk is the
    /// server's failure, reported with its message.
    fn dispatch(&mut self, deltas: &mut Vec<String>) -> Result<(), ProviderError> {
        let events = std::mem::take(&mut self.events);
        for event in &events {
            if self.done {
                break;
            }
            if let Some(message) = error_event(&event.data) {
                return Err(ProviderError::new(
                    ProviderErrorKind::Server,
                    format!("the stream reported an error: {message}"),
                ));
            }
            self.chunk(&event.data, deltas).map_err(invalid_response)?;
        }
        self.events = events;
        self.events.clear();
        Ok(())
    }
}

/// The message of a chunk that is an error (`{"error": {"message"}}` or `{"error":
/// "…"}`), if it is one.
fn error_event(data: &str) -> Option<String> {
    if !data.contains("\"error\"") {
        return None;
    }
    let json: Json = serde_json::from_str(data).ok()?;
    match json.get("error")? {
        Json::Object(error) => Some(
            error
                .get("message")
                .and_then(Json::as_str)
                .unwrap_or("no message")
                .to_owned(),
        ),
        Json::String(message) => Some(message.clone()),
        _ => None,
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
    use crate::provider::wire::openai::decode_response;

    /// Feeds `body` in pieces of `step` bytes; the deltas and the completion.
    fn assemble(body: &str, step: usize) -> (Vec<String>, Result<Completion, ProviderError>) {
        let mut assembler = ChunkAssembler::new();
        let mut deltas = Vec::new();
        for piece in body.as_bytes().chunks(step.max(1)) {
            if let Err(e) = assembler.feed(piece, &mut deltas) {
                return (deltas, Err(e));
            }
        }
        (deltas, assembler.finish())
    }

    fn sse(chunks: &[Json]) -> String {
        let mut body = String::new();
        for chunk in chunks {
            body.push_str(&format!("data: {chunk}\n\n"));
        }
        body.push_str("data: [DONE]\n\n");
        body
    }

    fn without_raw(mut completion: Completion) -> Completion {
        completion.raw = None;
        completion
    }

    #[test]
    fn text_usage_and_finish_reason_match_the_whole_response() {
        let base = json!({"id": "c1", "object": "chat.completion.chunk", "model": "gpt-x"});
        let chunk = |choices: Json, usage: Json| {
            let mut c = base.clone();
            c["choices"] = choices;
            c["usage"] = usage;
            c
        };
        let body = sse(&[
            chunk(
                json!([{"index": 0, "delta": {"role": "assistant", "content": ""}}]),
                Json::Null,
            ),
            chunk(
                json!([{"index": 0, "delta": {"content": "Hel"}}]),
                Json::Null,
            ),
            chunk(
                json!([{"index": 0, "delta": {"content": "lo é"}}]),
                Json::Null,
            ),
            chunk(
                json!([{"index": 0, "delta": {}, "finish_reason": "stop"}]),
                Json::Null,
            ),
            chunk(
                json!([]),
                json!({"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}),
            ),
        ]);
        let whole = json!({
            "id": "c1", "object": "chat.completion", "model": "gpt-x",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello é"},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        });
        let expected = without_raw(decode_response(whole.to_string().as_bytes()).unwrap());
        for step in [1, 2, 7, 1000] {
            let (deltas, completion) = assemble(&body, step);
            assert_eq!(deltas.concat(), "Hello é");
            assert_eq!(without_raw(completion.unwrap()), expected, "step {step}");
        }
        let (deltas, _) = assemble(&body, 1000);
        assert_eq!(deltas, ["Hel", "lo é"]);
    }

    #[test]
    fn tool_call_fragments_assemble_in_index_order() {
        let body = sse(&[
            json!({"model": "m", "choices": [{"index": 0, "delta": {"role": "assistant", "content": null,
                "tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                "function": {"name": "add", "arguments": ""}}]}}]}),
            json!({"model": "m", "choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "function": {"arguments": "{\"a\": 1,"}}]}}]}),
            json!({"model": "m", "choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 1, "id": "call_b", "function": {"name": "now", "arguments": "{}"}},
                {"index": 0, "function": {"arguments": " \"b\": 2}"}}]}}]}),
            json!({"model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
        ]);
        let whole = json!({"model": "m", "choices": [{"message": {"role": "assistant", "content": null,
            "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 1, \"b\": 2}"}},
                {"id": "call_b", "type": "function", "function": {"name": "now", "arguments": "{}"}}]},
            "finish_reason": "tool_calls"}]});
        let expected = without_raw(decode_response(whole.to_string().as_bytes()).unwrap());
        for step in [1, 3, 1000] {
            let (deltas, completion) = assemble(&body, step);
            assert!(deltas.is_empty());
            assert_eq!(without_raw(completion.unwrap()), expected);
        }
    }

    #[test]
    fn faults_are_errors() {
        let text = json!({"choices": [{"delta": {"content": "hi"}}]});
        // No `[DONE]`.
        let (deltas, e) = assemble(&format!("data: {text}\n\n"), 5);
        assert_eq!(deltas, ["hi"]);
        let e = e.unwrap_err();
        assert_eq!(e.kind, ProviderErrorKind::InvalidResponse);
        assert_eq!(
            e.message,
            "invalid provider response: the stream ended before `data: [DONE]`"
        );
        // A malformed chunk.
        let (_, e) = assemble(&format!("data: {text}\n\ndata: {{\"choices\": [\n\n"), 1000);
        let e = e.unwrap_err();
        assert_eq!(e.kind, ProviderErrorKind::InvalidResponse);
        assert!(
            e.message
                .starts_with("invalid provider response: chunk 1 is not JSON"),
            "{}",
            e.message
        );
        // An error object.
        let (_, e) = assemble("data: {\"error\": {\"message\": \"overloaded\"}}\n\n", 1000);
        let e = e.unwrap_err();
        assert_eq!(e.kind, ProviderErrorKind::Server);
        assert_eq!(e.message, "the stream reported an error: overloaded");
        // A tool call without a name fails as in a whole response.
        let (_, e) = assemble(
            &sse(&[
                json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}]}),
            ]),
            1000,
        );
        assert_eq!(
            e.unwrap_err().message,
            "invalid provider response: tool call 0 has no `function.name`"
        );
        // Wrong types.
        let (_, e) = assemble(
            &sse(&[json!({"choices": [{"delta": {"content": 3}}]})]),
            1000,
        );
        assert!(
            e.unwrap_err()
                .message
                .contains("`delta.content` of chunk 0")
        );
    }

    #[test]
    fn the_streaming_request_asks_for_a_stream_with_usage() {
        use crate::provider::exchange::{Message, ProviderRequest, Role};
        use crate::provider::wire::openai::{encode_request, encode_streaming_request};
        let request = ProviderRequest::new("m", vec![Message::text(Role::User, "hi")]);
        let body: Json =
            serde_json::from_slice(&encode_streaming_request(&request).unwrap()).unwrap();
        assert_eq!(body["stream"], json!(true));
        assert_eq!(body["stream_options"], json!({"include_usage": true}));
        let whole: Json = serde_json::from_slice(&encode_request(&request).unwrap()).unwrap();
        assert!(whole.get("stream").is_none() && whole.get("stream_options").is_none());
        let mut whole = whole;
        whole["stream"] = json!(true);
        whole["stream_options"] = json!({"include_usage": true});
        assert_eq!(body, whole, "the same body otherwise");
    }

    #[test]
    fn data_after_done_is_ignored() {
        let body = format!(
            "{}data: not json\n\n",
            sse(&[json!({"choices": [{"delta": {"content": "a"}}]})])
        );
        let (_, completion) = assemble(&body, 4);
        assert_eq!(completion.unwrap().content, vec![Part::Text("a".into())]);
    }
}

//! The scripted provider: canned completions handed out in order, with no I/O at all.
//!
//! Performing a provider call is the driver's job, not this file's: the machine hands out
//! a [`ProviderRequest`](crate::ProviderRequest) and takes a [`Completion`] (or a
//! [`ProviderError`]) back.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::provider::exchange::{Completion, ProviderError, ProviderErrorKind};
use crate::provider::wire::openai::read_completion;
use crate::text::json_kind as kind;

/// Canned provider responses, handed out in order: for tests, `--mock` and benches.
///
/// The script is a JSON array (or a list of values) whose entries are each one of:
///
/// * a string: the assistant's text,
///   `{"choices": [{"message": {"role": "assistant", "content": <string>}}]}`;
/// * an assistant message, an object with `content` and/or `tool_calls` and optionally
///   `role` (default `"assistant"`) and `usage` (moved to the response level);
/// * a full response, an object with `choices`: read as the OpenAI wire format reads a
///   response body, and kept as the completion's `raw`. One that does not read is kept
///   too, as a failed call (kind `invalid_response`, the message the HTTP provider would
///   give), so a script can feed the machine a malformed response on purpose;
/// * `{"error": "<message>"}` (or `{"error": {"message": "<message>"}}`): that call fails
///   with a [`ProviderError`] of kind `other` carrying the message. `{"error":
///   {"message": …, "kind": "rate_limited"}}` gives the failure that kind (any name of
///   [`ProviderErrorKind::as_str`]).
///
/// Every entry is checked and decoded when the script is built, so a call costs a clone;
/// errors name the entry by its 0-based index (`mock entry 3: …`). Each [`next_response`](Self::next_response) call
/// consumes one entry; after the last one every call fails with `mock provider
/// exhausted`. Entries are shared, so cloning a provider is cheap, and each clone keeps
/// its own position.
#[derive(Debug, Clone, Default)]
pub struct ScriptedProvider {
    /// The normalized entries.
    entries: Arc<[Entry]>,
    /// Index of the next entry to hand out.
    cursor: usize,
}

/// Why a script (`--mock` answers, a mock route's `responses`) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScriptError {
    /// The text is not JSON (serde's message, with the line and column).
    #[error("mock responses are not valid JSON: {0}")]
    NotJson(String),
    /// The JSON is not an array.
    #[error("mock responses: expected a JSON array of entries, found {0}")]
    NotAnArray(&'static str),
    /// One entry is not an answer the machine can read.
    #[error("mock entry {index}: {message}")]
    Entry {
        /// The entry's position, from 0.
        index: usize,
        /// What is wrong with it.
        message: String,
    },
}

impl ScriptedProvider {
    /// Reads a script from JSON text: an array of entries (see the type's docs).
    pub fn from_json(text: &str) -> Result<ScriptedProvider, ScriptError> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| ScriptError::NotJson(e.to_string()))?;
        match value {
            Value::Array(entries) => ScriptedProvider::from_entries(entries),
            other => Err(ScriptError::NotAnArray(kind(&other))),
        }
    }

    /// Builds a script from already-parsed entries (see the type's docs).
    pub fn from_entries(entries: Vec<Value>) -> Result<ScriptedProvider, ScriptError> {
        let entries = entries
            .into_iter()
            .enumerate()
            .map(|(index, entry)| {
                normalize(entry).map_err(|message| ScriptError::Entry { index, message })
            })
            .collect::<Result<Arc<[Entry]>, ScriptError>>()?;
        Ok(ScriptedProvider { entries, cursor: 0 })
    }

    /// Hands out the next completion, or the scripted error, and moves past it.
    pub fn next_response(&mut self) -> Result<Completion, ProviderError> {
        let Some(entry) = self.entries.get(self.cursor) else {
            return Err(ProviderError::new(
                ProviderErrorKind::Other,
                "mock provider exhausted",
            ));
        };
        self.cursor += 1;
        entry.clone()
    }

    /// How many entries are left to hand out.
    pub fn remaining(&self) -> usize {
        self.entries.len() - self.cursor
    }

    /// Starts again from the first entry, e.g. before the next run of a benchmark.
    pub fn rewind(&mut self) {
        self.cursor = 0;
    }

    /// How many entries the script has, handed out or not.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the script has no entries at all.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// One decoded script entry: what the call returns.
type Entry = Result<Completion, ProviderError>;

/// The keys an assistant-message entry may have. Anything else is more likely a typo
/// (`tool_call`) than an intent, and a full response is there for everything else.
const MESSAGE_KEYS: [&str; 4] = ["role", "content", "tool_calls", "usage"];

/// Recognizes, checks and decodes one entry, or says why it is not one.
fn normalize(entry: Value) -> Result<Entry, String> {
    let mut object = match entry {
        Value::String(text) => {
            let raw = wrap(assistant_message(Value::String(text)));
            return decode(raw);
        }
        Value::Object(object) => object,
        other => {
            return Err(format!(
                "expected a string, an assistant message, a full response or \
                     {{\"error\": …}}, found {}",
                kind(&other)
            ));
        }
    };
    if object.contains_key("choices") {
        let raw = Value::Object(object);
        return Ok(read_completion(&raw)
            .map(|completion| Completion {
                raw: Some(Arc::new(raw.clone())),
                ..completion
            })
            .map_err(|detail| {
                ProviderError::new(
                    ProviderErrorKind::InvalidResponse,
                    format!("invalid provider response: {detail}"),
                )
            }));
    }
    if let Some(error) = object.get("error") {
        if let Some(extra) = object.keys().find(|k| *k != "error") {
            return Err(format!("unexpected key `{extra}` next to `error`"));
        }
        return scripted_error(error).map(Err);
    }
    if !object.contains_key("content") && !object.contains_key("tool_calls") {
        return Err(
            "expected a string, an assistant message, a full response or \
                 {\"error\": …}, found an object without `choices`, `content`, \
                 `tool_calls` or `error`"
                .into(),
        );
    }
    if let Some(extra) = object.keys().find(|k| !MESSAGE_KEYS.contains(&k.as_str())) {
        return Err(format!(
            "unexpected key `{extra}` in an assistant message \
                 (expected `role`, `content`, `tool_calls` or `usage`)"
        ));
    }
    let usage = object.shift_remove("usage");
    if !object.contains_key("role") {
        // Put `role` first, as providers do, so dumps of the script read naturally.
        let mut message = Map::with_capacity(object.len() + 1);
        message.insert("role".into(), Value::from("assistant"));
        message.extend(object);
        object = message;
    }
    let mut response = wrap(Value::Object(object));
    if let Some(usage) = usage {
        if !usage.is_object() {
            return Err(format!(
                "expected `usage` to be an object, found {}",
                kind(&usage)
            ));
        }
        if let Value::Object(response) = &mut response {
            response.insert("usage".into(), usage);
        }
    }
    // A hand-written message should be one the machine can read; check it now rather
    // than in the middle of a run.
    decode(response)
}

/// A hand-written response, decoded; one the machine could not read is a script error.
fn decode(raw: Value) -> Result<Entry, String> {
    let completion = read_completion(&raw)?;
    Ok(Ok(Completion {
        raw: Some(Arc::new(raw)),
        ..completion
    }))
}

/// The failure an `error` entry scripts.
fn scripted_error(error: &Value) -> Result<ProviderError, String> {
    match error {
        Value::String(message) => Ok(ProviderError::new(
            ProviderErrorKind::Other,
            message.clone(),
        )),
        Value::Object(inner) => {
            let Some(Value::String(message)) = inner.get("message") else {
                return Err("expected `error.message` to be a string".into());
            };
            let kind = match inner.get("kind") {
                None => ProviderErrorKind::Other,
                Some(Value::String(name)) => {
                    ProviderErrorKind::from_name(name).ok_or_else(|| {
                        let names: Vec<&str> =
                            ProviderErrorKind::ALL.iter().map(|k| k.as_str()).collect();
                        format!(
                            "unknown `error.kind` `{name}` (expected one of {})",
                            names.join(", ")
                        )
                    })?
                }
                Some(other) => {
                    return Err(format!(
                        "expected `error.kind` to be a string, found {}",
                        kind(other)
                    ));
                }
            };
            Ok(ProviderError::new(kind, message.clone()))
        }
        other => Err(format!(
            "expected `error` to be a string, found {}",
            kind(other)
        )),
    }
}

/// `{"role": "assistant", "content": content}`.
fn assistant_message(content: Value) -> Value {
    let mut message = Map::with_capacity(2);
    message.insert("role".into(), Value::from("assistant"));
    message.insert("content".into(), content);
    Value::Object(message)
}

/// `{"choices": [{"message": message}]}`.
fn wrap(message: Value) -> Value {
    let mut choice = Map::with_capacity(1);
    choice.insert("message".into(), message);
    let mut response = Map::with_capacity(1);
    response.insert("choices".into(), Value::Array(vec![Value::Object(choice)]));
    Value::Object(response)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn script(text: &str) -> ScriptedProvider {
        ScriptedProvider::from_json(text).unwrap()
    }

    fn rejected(text: &str) -> String {
        ScriptedProvider::from_json(text).unwrap_err().to_string()
    }

    /// The next completion's `raw`, as JSON text.
    fn next_raw(p: &mut ScriptedProvider) -> String {
        p.next_response().unwrap().raw.unwrap().to_string()
    }

    fn other(message: &str) -> ProviderError {
        ProviderError::new(ProviderErrorKind::Other, message)
    }

    #[test]
    fn is_clone_send_sync() {
        fn check<T: Clone + Send + Sync + 'static>() {}
        check::<ScriptedProvider>();
    }

    #[test]
    fn string_entry_is_assistant_text() {
        let mut p = script(r#"["Hello!"]"#);
        let completion = p.clone().next_response().unwrap();
        assert_eq!(completion.content, [crate::Part::Text("Hello!".into())]);
        assert_eq!(completion.role, "assistant");
        assert_eq!(
            next_raw(&mut p),
            r#"{"choices":[{"message":{"role":"assistant","content":"Hello!"}}]}"#
        );
    }

    #[test]
    fn assistant_message_entry() {
        let mut p = script(
            r#"[
                {"content": "Hi"},
                {"tool_calls": [{"id": "c1", "type": "function",
                                 "function": {"name": "calc", "arguments": "{}"}}]},
                {"role": "model", "content": [{"type": "text", "text": "x"}],
                 "usage": {"total_tokens": 3}}
            ]"#,
        );
        assert_eq!(
            next_raw(&mut p),
            r#"{"choices":[{"message":{"role":"assistant","content":"Hi"}}]}"#
        );
        let calls = p.next_response().unwrap();
        assert_eq!(
            *calls.raw.unwrap(),
            json!({"choices": [{"message": {"role": "assistant", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{}"}}
            ]}}]})
        );
        assert_eq!(
            calls.tool_calls,
            [crate::ToolCall::new("c1", "calc", json!("{}"))]
        );
        let third = p.next_response().unwrap();
        assert_eq!(
            third.raw.as_ref().unwrap().to_string(),
            r#"{"choices":[{"message":{"role":"model","content":[{"type":"text","text":"x"}]}}],"usage":{"total_tokens":3}}"#
        );
        assert_eq!(third.role, "model");
        assert_eq!(third.usage.unwrap().fields.len(), 1);
    }

    #[test]
    fn full_response_entry_is_kept_as_is() {
        let full = json!({
            "choices": [{"message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
            "id": "chatcmpl-1"
        });
        // Even a malformed one, so scripts can exercise the machine's error path.
        let broken = json!({"choices": []});
        let mut p = ScriptedProvider::from_entries(vec![full.clone(), broken.clone()]).unwrap();
        let completion = p.next_response().unwrap();
        assert_eq!(*completion.raw.unwrap(), full);
        assert_eq!(completion.finish_reason, Some(crate::FinishReason::Stop));
        assert_eq!(completion.usage.unwrap().input_tokens, Some(1));
        assert_eq!(
            p.next_response(),
            Err(ProviderError::new(
                ProviderErrorKind::InvalidResponse,
                "invalid provider response: `choices` is empty"
            ))
        );
    }

    #[test]
    fn error_entry() {
        let mut p = script(
            r#"[{"error": "rate limited"}, {"error": {"message": "boom", "code": 1}}, "ok",
                {"error": {"message": "slow down", "kind": "rate_limited"}}]"#,
        );
        assert_eq!(p.next_response(), Err(other("rate limited")));
        assert_eq!(p.next_response().unwrap_err().to_string(), "boom");
        assert!(p.next_response().is_ok());
        assert_eq!(
            p.next_response(),
            Err(ProviderError::new(
                ProviderErrorKind::RateLimited,
                "slow down"
            ))
        );
    }

    #[test]
    fn exhaustion_and_counts() {
        let mut p = script(r#"["a", "b"]"#);
        assert_eq!((p.len(), p.remaining(), p.is_empty()), (2, 2, false));
        p.next_response().unwrap();
        assert_eq!(p.remaining(), 1);
        p.next_response().unwrap();
        assert_eq!(p.remaining(), 0);
        for _ in 0..2 {
            assert_eq!(p.next_response(), Err(other("mock provider exhausted")));
        }
        assert_eq!((p.len(), p.remaining()), (2, 0));

        let mut empty = script("[]");
        assert!(empty.is_empty());
        assert_eq!(
            empty.next_response().unwrap_err().message,
            "mock provider exhausted"
        );
        assert!(ScriptedProvider::default().is_empty());
    }

    #[test]
    fn rewind_starts_again() {
        let mut p = script(r#"["a", {"error": "e"}]"#);
        let first = p.next_response();
        let _ = p.next_response();
        assert!(p.next_response().is_err());
        p.rewind();
        assert_eq!(p.remaining(), 2);
        assert_eq!(p.next_response(), first);
        assert_eq!(p.next_response().unwrap_err().message, "e");
    }

    #[test]
    fn clones_keep_their_own_position() {
        let mut a = script(r#"["1", "2"]"#);
        a.next_response().unwrap();
        let mut b = a.clone();
        b.rewind();
        assert_eq!(a.remaining(), 1);
        assert_eq!(b.remaining(), 2);
    }

    #[test]
    fn bad_input_is_rejected() {
        assert_eq!(
            rejected("{not json"),
            "mock responses are not valid JSON: key must be a string at line 1 column 2"
        );
        assert_eq!(
            rejected(r#"{"choices": []}"#),
            "mock responses: expected a JSON array of entries, found an object"
        );
        assert_eq!(
            rejected(r#""hi""#),
            "mock responses: expected a JSON array of entries, found a string"
        );
    }

    #[test]
    fn bad_entries_are_rejected_by_index() {
        let any = "expected a string, an assistant message, a full response or {\"error\": …}";
        let cases = [
            (
                r#"["a", "b", "c", 3]"#,
                format!("mock entry 3: {any}, found a number"),
            ),
            ("[null]", format!("mock entry 0: {any}, found null")),
            ("[[]]", format!("mock entry 0: {any}, found an array")),
            ("[true]", format!("mock entry 0: {any}, found a boolean")),
            (
                r#"["ok", {"role": "assistant"}]"#,
                format!(
                    "mock entry 1: {any}, found an object without `choices`, `content`, \
                     `tool_calls` or `error`"
                ),
            ),
            (
                r#"[{"error": 5}]"#,
                "mock entry 0: expected `error` to be a string, found a number".into(),
            ),
            (
                r#"[{"error": {"code": 5}}]"#,
                "mock entry 0: expected `error.message` to be a string".into(),
            ),
            (
                r#"[{"error": {"message": "x", "kind": "bad"}}]"#,
                "mock entry 0: unknown `error.kind` `bad` (expected one of auth, rate_limited, \
                 server, timeout, transport, invalid_request, invalid_response, other)"
                    .into(),
            ),
            (
                r#"[{"error": {"message": "x", "kind": 1}}]"#,
                "mock entry 0: expected `error.kind` to be a string, found a number".into(),
            ),
            (
                r#"[{"error": "x", "content": "y"}]"#,
                "mock entry 0: unexpected key `content` next to `error`".into(),
            ),
            (
                r#"[{"content": "x", "tool_call": []}]"#,
                "mock entry 0: unexpected key `tool_call` in an assistant message \
                 (expected `role`, `content`, `tool_calls` or `usage`)"
                    .into(),
            ),
            (
                r#"[{"content": "x", "usage": 3}]"#,
                "mock entry 0: expected `usage` to be an object, found a number".into(),
            ),
            (
                r#"[{"content": 3}]"#,
                "mock entry 0: expected `message.content` to be a string, an array of parts \
                 or null, found a number"
                    .into(),
            ),
            (
                r#"[{"tool_calls": [{"id": "c1", "function": {"arguments": "{}"}}]}]"#,
                "mock entry 0: tool call 0 has no `function.name`".into(),
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(rejected(text), expected, "{text}");
        }
    }
}

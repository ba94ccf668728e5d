//! What the machine asks a provider, what it gets back, and the scripted provider.
//!
//! Performing a provider call is the driver's job, not this file's: the machine only
//! hands out a [`ProviderRequest`] and takes the raw response (or a [`ProviderError`])
//! back. [`ScriptedProvider`] answers from a fixed list, with no I/O at all.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::response::parse_completion;
use crate::store::Vars;
use crate::text::json_kind as kind;

/// A provider call the machine asks the driver to make.
#[derive(Debug, Clone)]
pub struct ProviderRequest {
    /// The model to call (`model` variable).
    pub model: String,
    /// An O(1) snapshot of the whole context, `prompts` and `tools` included.
    pub context: Vars,
}

/// A failed provider call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ProviderError {
    /// What went wrong, in words.
    pub message: String,
}

/// Canned provider responses, handed out in order: for tests, `--mock` and benches.
///
/// The script is a JSON array (or a list of values) whose entries are each one of:
///
/// * a string: the assistant's text,
///   `{"choices": [{"message": {"role": "assistant", "content": <string>}}]}`;
/// * an assistant message, an object with `content` and/or `tool_calls` and optionally
///   `role` (default `"assistant"`) and `usage` (moved to the response level);
/// * a full response, an object with `choices`: returned exactly as written, so a
///   script can also feed the machine a malformed response on purpose;
/// * `{"error": "<message>"}` (or `{"error": {"message": "<message>"}}`): that call fails
///   with a [`ProviderError`] carrying the message.
///
/// Every entry is checked when the script is built, and errors name the entry by its
/// 0-based index (`mock entry 3: …`). Each [`next_response`](Self::next_response) call
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

impl ScriptedProvider {
    /// Reads a script from JSON text: an array of entries (see the type's docs).
    pub fn from_json(text: &str) -> Result<ScriptedProvider, String> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| format!("mock responses are not valid JSON: {e}"))?;
        match value {
            Value::Array(entries) => ScriptedProvider::from_entries(entries),
            other => Err(format!(
                "mock responses: expected a JSON array of entries, found {}",
                kind(&other)
            )),
        }
    }

    /// Builds a script from already-parsed entries (see the type's docs).
    pub fn from_entries(entries: Vec<Value>) -> Result<ScriptedProvider, String> {
        let entries = entries
            .into_iter()
            .enumerate()
            .map(|(index, entry)| {
                Entry::normalize(entry).map_err(|why| format!("mock entry {index}: {why}"))
            })
            .collect::<Result<Arc<[Entry]>, String>>()?;
        Ok(ScriptedProvider { entries, cursor: 0 })
    }

    /// Hands out the next response, or the scripted error, and moves past it.
    pub fn next_response(&mut self) -> Result<Value, ProviderError> {
        let Some(entry) = self.entries.get(self.cursor) else {
            return Err(ProviderError {
                message: "mock provider exhausted".into(),
            });
        };
        self.cursor += 1;
        match entry {
            Entry::Response(response) => Ok(response.clone()),
            Entry::Error(message) => Err(ProviderError {
                message: message.clone(),
            }),
        }
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

/// One normalized script entry.
#[derive(Debug, Clone, PartialEq)]
enum Entry {
    /// A whole provider response.
    Response(Value),
    /// A failed call, with its message.
    Error(String),
}

/// The keys an assistant-message entry may have. Anything else is more likely a typo
/// (`tool_call`) than an intent, and a full response is there for everything else.
const MESSAGE_KEYS: [&str; 4] = ["role", "content", "tool_calls", "usage"];

impl Entry {
    /// Recognizes and checks one entry, or says why it is not one.
    fn normalize(entry: Value) -> Result<Entry, String> {
        let mut object = match entry {
            Value::String(text) => {
                return Ok(Entry::Response(wrap(assistant_message(Value::String(
                    text,
                )))));
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
            return Ok(Entry::Response(Value::Object(object)));
        }
        if let Some(error) = object.get("error") {
            if let Some(extra) = object.keys().find(|k| *k != "error") {
                return Err(format!("unexpected key `{extra}` next to `error`"));
            }
            return match error {
                Value::String(message) => Ok(Entry::Error(message.clone())),
                Value::Object(inner) => match inner.get("message") {
                    Some(Value::String(message)) => Ok(Entry::Error(message.clone())),
                    _ => Err("expected `error.message` to be a string".into()),
                },
                other => Err(format!(
                    "expected `error` to be a string, found {}",
                    kind(other)
                )),
            };
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
        parse_completion(&response).map_err(|e| {
            e.strip_prefix("invalid provider response: ")
                .unwrap_or(&e)
                .to_owned()
        })?;
        Ok(Entry::Response(response))
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
        ScriptedProvider::from_json(text).unwrap_err()
    }

    #[test]
    fn is_clone_send_sync() {
        fn check<T: Clone + Send + Sync + 'static>() {}
        check::<ScriptedProvider>();
    }

    #[test]
    fn string_entry_is_assistant_text() {
        let mut p = script(r#"["Hello!"]"#);
        assert_eq!(
            p.next_response().unwrap().to_string(),
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
            p.next_response().unwrap().to_string(),
            r#"{"choices":[{"message":{"role":"assistant","content":"Hi"}}]}"#
        );
        assert_eq!(
            p.next_response().unwrap(),
            json!({"choices": [{"message": {"role": "assistant", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{}"}}
            ]}}]})
        );
        assert_eq!(
            p.next_response().unwrap().to_string(),
            r#"{"choices":[{"message":{"role":"model","content":[{"type":"text","text":"x"}]}}],"usage":{"total_tokens":3}}"#
        );
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
        assert_eq!(p.next_response(), Ok(full));
        assert_eq!(p.next_response(), Ok(broken));
    }

    #[test]
    fn error_entry() {
        let mut p = script(
            r#"[{"error": "rate limited"}, {"error": {"message": "boom", "code": 1}}, "ok"]"#,
        );
        assert_eq!(
            p.next_response(),
            Err(ProviderError {
                message: "rate limited".into()
            })
        );
        assert_eq!(p.next_response().unwrap_err().to_string(), "boom");
        assert!(p.next_response().is_ok());
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
            assert_eq!(
                p.next_response(),
                Err(ProviderError {
                    message: "mock provider exhausted".into()
                })
            );
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

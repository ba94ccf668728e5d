//! Reading a provider response into the `result_*` variables (§2.2.5, §2.2.6), and
//! parsing and validating JSON output for `output_mode` `json` / `structured_output`.
//!
//! Everything here reads data from outside the process, so nothing panics: every
//! function returns an error that says what was expected and what was found. Tool calls
//! are only read here; running them is the machine's job.

use serde_json::Value;

use crate::text::json_kind as kind;

/// The parts of a provider response the machine keeps (§2.2.6).
#[allow(dead_code)]
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Completion {
    /// `message.role`; `"assistant"` when absent or null.
    pub role: String,
    /// A string `content` as-is; for a list of parts, the `text` of every `text` part
    /// joined with a newline (as the reference runtime does); `""` when `content` is null
    /// or absent.
    pub text: String,
    /// How many text parts `text` was joined from.
    text_parts: usize,
    /// URLs of the `image_url` parts, in order.
    pub image_urls: Vec<String>,
    /// URLs of the `audio_input` parts, in order.
    pub audio_inputs: Vec<String>,
    /// URLs (or file ids) of the `file` parts, in order.
    pub files: Vec<String>,
    /// The tool calls the model asked for, in order.
    pub tool_calls: Vec<ToolCall>,
    /// The response's `usage` object, when there is one.
    pub usage: Option<Value>,
}

/// One tool call as the model sent it (§2.2.4).
#[allow(dead_code)]
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolCall {
    /// The id exactly as given (§2.2.4: any string, never checked). A number id becomes
    /// its decimal spelling; a missing or null id becomes `""`.
    pub id: String,
    /// `function.name`.
    pub name: String,
    /// `function.arguments` as given: usually a string of JSON, but some servers send an
    /// object. Missing or null arguments become an empty object, so callers only ever
    /// see those two shapes.
    pub arguments: Value,
}

/// Reads the first choice of an OpenAI-style response (§2.2.5).
///
/// Liberal where nothing is lost: a missing role is `assistant`, a null `content` is
/// empty text, an `image_url`/`audio_input`/`file` part may carry its URL as a bare
/// string, a string inside a content list is taken as text, and parts of any other
/// `type` (`refusal`, `input_audio`, …) are ignored. Strict where data would be lost: a
/// `text` part without a string `text`, an attachment part without a URL, or a tool call
/// without `function.name` is an error rather than silently dropped.
#[allow(dead_code)]
pub(crate) fn parse_completion(raw: &Value) -> Result<Completion, String> {
    let choices = match raw.get("choices") {
        Some(Value::Array(choices)) => choices,
        Some(other) if raw.is_object() => {
            return Err(invalid(format!(
                "expected `choices` to be an array, found {}",
                kind(other)
            )));
        }
        _ if raw.is_object() => {
            return Err(invalid(
                "expected an object with a `choices` array, found an object without `choices`",
            ));
        }
        _ => {
            return Err(invalid(format!(
                "expected an object with a `choices` array, found {}",
                kind(raw)
            )));
        }
    };
    let choice = choices
        .first()
        .ok_or_else(|| invalid("`choices` is empty"))?;
    if !choice.is_object() {
        return Err(invalid(format!(
            "expected choice 0 to be an object, found {}",
            kind(choice)
        )));
    }
    let message = match choice.get("message") {
        None | Some(Value::Null) => return Err(invalid("choice 0 has no `message`")),
        Some(message @ Value::Object(_)) => message,
        Some(other) => {
            return Err(invalid(format!(
                "expected the `message` of choice 0 to be an object, found {}",
                kind(other)
            )));
        }
    };

    let role = match message.get("role") {
        None | Some(Value::Null) => "assistant".to_owned(),
        Some(Value::String(role)) => role.clone(),
        Some(other) => {
            return Err(invalid(format!(
                "expected `message.role` to be a string, found {}",
                kind(other)
            )));
        }
    };

    let mut completion = Completion {
        role,
        text: String::new(),
        text_parts: 0,
        image_urls: Vec::new(),
        audio_inputs: Vec::new(),
        files: Vec::new(),
        tool_calls: Vec::new(),
        usage: raw.get("usage").filter(|u| u.is_object()).cloned(),
    };

    match message.get("content") {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => completion.text.clone_from(text),
        Some(Value::Array(parts)) => {
            for (index, part) in parts.iter().enumerate() {
                read_part(index, part, &mut completion)?;
            }
        }
        Some(other) => {
            return Err(invalid(format!(
                "expected `message.content` to be a string, an array of parts or null, found {}",
                kind(other)
            )));
        }
    }

    match message.get("tool_calls") {
        None | Some(Value::Null) => {}
        Some(Value::Array(calls)) => {
            completion.tool_calls = calls
                .iter()
                .enumerate()
                .map(|(index, call)| read_tool_call(index, call))
                .collect::<Result<_, _>>()?;
        }
        Some(other) => {
            return Err(invalid(format!(
                "expected `message.tool_calls` to be an array, found {}",
                kind(other)
            )));
        }
    }

    Ok(completion)
}

/// Parses a model's text as the JSON object `output_mode` `json` asks for.
///
/// One Markdown code fence around the whole text (` ```json … ``` ` or ` ``` … ``` `)
/// is tolerated, because models often add one. Line and column in errors refer to the
/// original text, fence included.
#[allow(dead_code)]
pub(crate) fn parse_json_output(text: &str) -> Result<Value, String> {
    let body = strip_fence(text);
    let value: Value = serde_json::from_str(body).map_err(|e| json_error(text, body, &e))?;
    if value.is_object() {
        Ok(value)
    } else {
        Err(format!(
            "invalid JSON output: expected a JSON object, found {}",
            kind(&value)
        ))
    }
}

/// Validates `value` against the `output_structure` schema (§2.2.6 step 5).
///
/// `schema` is the variable converted to JSON: the schema itself as an object, or a
/// string holding it as JSON text. Every violation is reported, each as one message
/// naming the instance path. A schema that cannot be used is one error. The schema is
/// compiled on every call: this runs once per provider call, next to a network round
/// trip, so a cache would not pay for itself.
#[allow(dead_code)]
pub(crate) fn validate_output(value: &Value, schema: &Value) -> Result<(), Vec<String>> {
    let invalid_schema = |why: String| {
        vec![format!(
            "schema validation failed: invalid output_structure: {why}"
        )]
    };
    let parsed;
    let schema = match schema {
        Value::String(text) => {
            parsed =
                serde_json::from_str::<Value>(text).map_err(|e| invalid_schema(e.to_string()))?;
            &parsed
        }
        other => other,
    };
    if !schema.is_object() {
        return Err(invalid_schema(format!(
            "expected a JSON Schema object, found {}",
            kind(schema)
        )));
    }
    let validator = jsonschema::validator_for(schema).map_err(|e| invalid_schema(e.to_string()))?;
    let errors: Vec<String> = validator
        .iter_errors(value)
        .map(|error| {
            let path = error.instance_path().as_str();
            let at = if path.is_empty() { "the root" } else { path };
            format!("schema validation failed: at {at}: {error}")
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// An "invalid provider response" error.
#[cold]
fn invalid(detail: impl std::fmt::Display) -> String {
    format!("invalid provider response: {detail}")
}

/// Appends one text part, newline-separated from the previous one.
fn push_text(completion: &mut Completion, text: &str) {
    if completion.text_parts > 0 {
        completion.text.push('\n');
    }
    completion.text.push_str(text);
    completion.text_parts += 1;
}

/// Reads content part `index` into `completion`.
fn read_part(index: usize, part: &Value, completion: &mut Completion) -> Result<(), String> {
    let part = match part {
        Value::String(text) => {
            push_text(completion, text);
            return Ok(());
        }
        Value::Object(part) => part,
        other => {
            return Err(invalid(format!(
                "expected content part {index} to be an object, found {}",
                kind(other)
            )));
        }
    };
    let part_type = match part.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(other) => {
            return Err(invalid(format!(
                "expected the `type` of content part {index} to be a string, found {}",
                kind(other)
            )));
        }
        None => return Err(invalid(format!("content part {index} has no `type`"))),
    };
    let (target, url_keys): (&mut Vec<String>, &[&str]) = match part_type {
        "text" => {
            return match part.get("text") {
                Some(Value::String(text)) => {
                    push_text(completion, text);
                    Ok(())
                }
                _ => Err(invalid(format!(
                    "content part {index} of type `text` has no `text` string"
                ))),
            };
        }
        "image_url" => (&mut completion.image_urls, &["url"]),
        "audio_input" => (&mut completion.audio_inputs, &["url"]),
        "file" => (&mut completion.files, &["url", "file_id"]),
        // Unknown part types (`refusal`, `input_audio`, vendor extensions) carry nothing
        // the `result_*` variables have a place for.
        _ => return Ok(()),
    };
    let url = match part.get(part_type) {
        Some(Value::String(url)) => Some(url),
        Some(Value::Object(inner)) => url_keys.iter().find_map(|key| match inner.get(*key) {
            Some(Value::String(url)) => Some(url),
            _ => None,
        }),
        _ => None,
    };
    match url {
        Some(url) => {
            target.push(url.clone());
            Ok(())
        }
        None => {
            let wanted: Vec<String> = url_keys
                .iter()
                .map(|key| format!("`{part_type}.{key}`"))
                .collect();
            Err(invalid(format!(
                "content part {index} of type `{part_type}` has no {} string",
                wanted.join(" or ")
            )))
        }
    }
}

/// Reads tool call `index`.
fn read_tool_call(index: usize, call: &Value) -> Result<ToolCall, String> {
    if !call.is_object() {
        return Err(invalid(format!(
            "expected tool call {index} to be an object, found {}",
            kind(call)
        )));
    }
    let id = match call.get("id") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(id)) => id.clone(),
        Some(Value::Number(id)) => id.to_string(),
        Some(other) => {
            return Err(invalid(format!(
                "expected the `id` of tool call {index} to be a string, found {}",
                kind(other)
            )));
        }
    };
    let function = match call.get("function") {
        Some(function @ Value::Object(_)) => function,
        None | Some(Value::Null) => {
            return Err(invalid(format!("tool call {index} has no `function.name`")));
        }
        Some(other) => {
            return Err(invalid(format!(
                "expected the `function` of tool call {index} to be an object, found {}",
                kind(other)
            )));
        }
    };
    let name = match function.get("name") {
        Some(Value::String(name)) => name.clone(),
        None | Some(Value::Null) => {
            return Err(invalid(format!("tool call {index} has no `function.name`")));
        }
        Some(other) => {
            return Err(invalid(format!(
                "expected the `function.name` of tool call {index} to be a string, found {}",
                kind(other)
            )));
        }
    };
    let arguments = match function.get("arguments") {
        None | Some(Value::Null) => Value::Object(serde_json::Map::new()),
        Some(arguments) => arguments.clone(),
    };
    Ok(ToolCall {
        id,
        name,
        arguments,
    })
}

/// The text inside one Markdown code fence around all of `text`, or `text` unchanged.
fn strip_fence(text: &str) -> &str {
    let trimmed = text.trim();
    let Some(rest) = trimmed.strip_prefix("```") else {
        return text;
    };
    let Some(inner) = rest.strip_suffix("```") else {
        return text;
    };
    // The info string (`json`, `JSON`, `jsonc`…) runs to the first character that
    // cannot be part of a language name; JSON never starts with one of those.
    let info_len = inner
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '+'))
        .unwrap_or(inner.len());
    &inner[info_len..]
}

/// An "invalid JSON output" error whose line and column refer to `text`, given that
/// `body` (a slice of `text`) is what was parsed.
#[cold]
fn json_error(text: &str, body: &str, error: &serde_json::Error) -> String {
    let position = format!(" at line {} column {}", error.line(), error.column());
    let message = error.to_string();
    let Some(bare) = message.strip_suffix(&position) else {
        return format!("invalid JSON output: {message}");
    };
    // `body` is a sub-slice of `text`, so its offset is a pointer difference.
    let offset = (body.as_ptr() as usize).saturating_sub(text.as_ptr() as usize);
    let before = text.get(..offset).unwrap_or("");
    let lines_before = before.matches('\n').count();
    let line = error.line() + lines_before;
    let column = if error.line() == 1 {
        error.column() + before.len() - before.rfind('\n').map_or(0, |i| i + 1)
    } else {
        error.column()
    };
    format!("invalid JSON output: {bare} at line {line} column {column}")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ok(raw: Value) -> Completion {
        parse_completion(&raw).unwrap()
    }

    fn err(raw: Value) -> String {
        parse_completion(&raw).unwrap_err()
    }

    fn text_response(content: Value) -> Value {
        json!({"choices": [{"message": {"role": "assistant", "content": content}}]})
    }

    #[test]
    fn spec_example_response() {
        let completion = ok(json!({
            "choices": [{
                "message": {
                    "role": "assistant",
                    "content": "Hello! I'm doing well, thank you for asking.",
                    "tool_calls": [{
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "calc", "arguments": "{\"num1\": 40, \"num2\": 2}"}
                    }]
                }
            }],
            "usage": {"prompt_tokens": 10, "completion_tokens": 15, "total_tokens": 25}
        }));
        assert_eq!(
            completion,
            Completion {
                role: "assistant".into(),
                text: "Hello! I'm doing well, thank you for asking.".into(),
                text_parts: 0,
                image_urls: vec![],
                audio_inputs: vec![],
                files: vec![],
                tool_calls: vec![ToolCall {
                    id: "call_1".into(),
                    name: "calc".into(),
                    arguments: json!("{\"num1\": 40, \"num2\": 2}"),
                }],
                usage: Some(
                    json!({"prompt_tokens": 10, "completion_tokens": 15, "total_tokens": 25})
                ),
            }
        );
    }

    #[test]
    fn only_the_first_choice_is_read() {
        let completion = ok(json!({"choices": [
            {"message": {"content": "first"}},
            {"message": {"content": "second"}}
        ]}));
        assert_eq!(completion.text, "first");
    }

    #[test]
    fn role_defaults_to_assistant() {
        assert_eq!(
            ok(json!({"choices": [{"message": {"content": "x"}}]})).role,
            "assistant"
        );
        assert_eq!(
            ok(json!({"choices": [{"message": {"role": null, "content": "x"}}]})).role,
            "assistant"
        );
        assert_eq!(
            ok(json!({"choices": [{"message": {"role": "model", "content": "x"}}]})).role,
            "model"
        );
    }

    #[test]
    fn null_or_absent_content_is_empty_text() {
        assert_eq!(ok(text_response(Value::Null)).text, "");
        assert_eq!(ok(json!({"choices": [{"message": {}}]})).text, "");
    }

    #[test]
    fn content_parts() {
        let completion = ok(text_response(json!([
            {"type": "text", "text": "Good morning! "},
            {"type": "image_url", "image_url": {"url": "https://e.com/1.png", "detail": "high"}},
            {"type": "refusal", "refusal": "ignored"},
            {"type": "text", "text": "Here you go."},
            {"type": "image_url", "image_url": "https://e.com/2.png"},
            {"type": "audio_input", "audio_input": {"url": "https://e.com/a.mp3"}},
            {"type": "audio_input", "audio_input": "https://e.com/b.mp3"},
            {"type": "file", "file": {"url": "https://e.com/f.pdf"}},
            {"type": "file", "file": {"file_id": "file-123"}},
            {"type": "file", "file": "https://e.com/g.csv"},
            "!"
        ])));
        assert_eq!(completion.text, "Good morning! \nHere you go.\n!");
        assert_eq!(
            completion.image_urls,
            ["https://e.com/1.png", "https://e.com/2.png"]
        );
        assert_eq!(
            completion.audio_inputs,
            ["https://e.com/a.mp3", "https://e.com/b.mp3"]
        );
        assert_eq!(
            completion.files,
            ["https://e.com/f.pdf", "file-123", "https://e.com/g.csv"]
        );
    }

    #[test]
    fn usage_only_when_an_object() {
        let mut raw = text_response(json!("x"));
        assert_eq!(ok(raw.clone()).usage, None);
        raw["usage"] = json!(null);
        assert_eq!(ok(raw.clone()).usage, None);
        raw["usage"] = json!(12);
        assert_eq!(ok(raw.clone()).usage, None);
        raw["usage"] = json!({"total_tokens": 3});
        assert_eq!(ok(raw).usage, Some(json!({"total_tokens": 3})));
    }

    #[test]
    fn tool_call_shapes() {
        let completion = ok(json!({"choices": [{"message": {
            "content": null,
            "tool_calls": [
                {"id": "any string at all", "type": "function", "function": {"name": "a", "arguments": "{}"}},
                {"id": 7, "function": {"name": "b", "arguments": {"x": 1}}},
                {"function": {"name": "c"}},
                {"id": null, "function": {"name": "d", "arguments": null}}
            ]
        }}]}));
        let calls: Vec<_> = completion
            .tool_calls
            .iter()
            .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.clone()))
            .collect();
        assert_eq!(
            calls,
            [
                ("any string at all", "a", json!("{}")),
                ("7", "b", json!({"x": 1})),
                ("", "c", json!({})),
                ("", "d", json!({})),
            ]
        );
        assert_eq!(completion.text, "");
        let empty = ok(json!({"choices": [{"message": {"content": "x", "tool_calls": null}}]}));
        assert!(empty.tool_calls.is_empty());
    }

    #[test]
    fn malformed_responses() {
        let p = "invalid provider response: ";
        let cases = [
            (
                json!("hello"),
                "expected an object with a `choices` array, found a string",
            ),
            (
                json!(null),
                "expected an object with a `choices` array, found null",
            ),
            (
                json!([1]),
                "expected an object with a `choices` array, found an array",
            ),
            (
                json!({}),
                "expected an object with a `choices` array, found an object without `choices`",
            ),
            (
                json!({"choices": {}}),
                "expected `choices` to be an array, found an object",
            ),
            (json!({"choices": []}), "`choices` is empty"),
            (
                json!({"choices": [3]}),
                "expected choice 0 to be an object, found a number",
            ),
            (json!({"choices": [{}]}), "choice 0 has no `message`"),
            (
                json!({"choices": [{"message": null}]}),
                "choice 0 has no `message`",
            ),
            (
                json!({"choices": [{"message": "hi"}]}),
                "expected the `message` of choice 0 to be an object, found a string",
            ),
            (
                json!({"choices": [{"message": {"role": 1}}]}),
                "expected `message.role` to be a string, found a number",
            ),
            (
                text_response(json!(true)),
                "expected `message.content` to be a string, an array of parts or null, found a boolean",
            ),
            (
                text_response(json!([null])),
                "expected content part 0 to be an object, found null",
            ),
            (
                text_response(json!([{"text": "x"}])),
                "content part 0 has no `type`",
            ),
            (
                text_response(json!([{"type": 1}])),
                "expected the `type` of content part 0 to be a string, found a number",
            ),
            (
                text_response(json!(["a", {"type": "text", "text": 5}])),
                "content part 1 of type `text` has no `text` string",
            ),
            (
                text_response(json!([{"type": "image_url", "image_url": {}}])),
                "content part 0 of type `image_url` has no `image_url.url` string",
            ),
            (
                text_response(json!([{"type": "audio_input"}])),
                "content part 0 of type `audio_input` has no `audio_input.url` string",
            ),
            (
                text_response(json!([{"type": "file", "file": {"url": 3}}])),
                "content part 0 of type `file` has no `file.url` or `file.file_id` string",
            ),
            (
                json!({"choices": [{"message": {"tool_calls": {}}}]}),
                "expected `message.tool_calls` to be an array, found an object",
            ),
            (
                json!({"choices": [{"message": {"tool_calls": ["x"]}}]}),
                "expected tool call 0 to be an object, found a string",
            ),
            (
                json!({"choices": [{"message": {"tool_calls": [
                    {"function": {"name": "a"}},
                    {"id": "c2", "function": {"arguments": "{}"}}
                ]}}]}),
                "tool call 1 has no `function.name`",
            ),
            (
                json!({"choices": [{"message": {"tool_calls": [{"id": "c"}]}}]}),
                "tool call 0 has no `function.name`",
            ),
            (
                json!({"choices": [{"message": {"tool_calls": [{"function": "f"}]}}]}),
                "expected the `function` of tool call 0 to be an object, found a string",
            ),
            (
                json!({"choices": [{"message": {"tool_calls": [{"function": {"name": ["f"]}}]}}]}),
                "expected the `function.name` of tool call 0 to be a string, found an array",
            ),
            (
                json!({"choices": [{"message": {"tool_calls": [{"id": true, "function": {"name": "f"}}]}}]}),
                "expected the `id` of tool call 0 to be a string, found a boolean",
            ),
        ];
        for (raw, expected) in cases {
            assert_eq!(err(raw.clone()), format!("{p}{expected}"), "{raw}");
        }
    }

    #[test]
    fn json_output_plain_and_fenced() {
        let expected = json!({"name": "Ada", "age": 36});
        for text in [
            r#"{"name": "Ada", "age": 36}"#,
            "\n  {\"name\": \"Ada\", \"age\": 36}\n",
            "```json\n{\"name\": \"Ada\", \"age\": 36}\n```",
            "```JSON\n{\"name\": \"Ada\", \"age\": 36}\n```\n",
            "  ```\n{\"name\": \"Ada\", \"age\": 36}\n```",
            "```json {\"name\": \"Ada\", \"age\": 36}```",
            "```\r\n{\"name\": \"Ada\", \"age\": 36}\r\n```",
        ] {
            assert_eq!(parse_json_output(text), Ok(expected.clone()), "{text}");
        }
    }

    #[test]
    fn json_output_keeps_key_order() {
        let value = parse_json_output(r#"{"z": 1, "a": 2}"#).unwrap();
        assert_eq!(value.to_string(), r#"{"z":1,"a":2}"#);
    }

    #[test]
    fn json_output_errors() {
        assert_eq!(
            parse_json_output("[1, 2]"),
            Err("invalid JSON output: expected a JSON object, found an array".into())
        );
        assert_eq!(
            parse_json_output("```json\n\"text\"\n```"),
            Err("invalid JSON output: expected a JSON object, found a string".into())
        );
        assert_eq!(
            parse_json_output("Sure! {\"a\": 1}"),
            Err("invalid JSON output: expected value at line 1 column 1".into())
        );
        assert_eq!(
            parse_json_output(""),
            Err("invalid JSON output: EOF while parsing a value at line 1 column 0".into())
        );
        // Only one fence is removed.
        assert!(parse_json_output("```json\n```json\n{}\n```\n```").is_err());
        // Two objects are not one.
        assert_eq!(
            parse_json_output("{}\n{}"),
            Err("invalid JSON output: trailing characters at line 2 column 1".into())
        );
    }

    #[test]
    fn json_output_error_positions_refer_to_the_original_text() {
        assert_eq!(
            parse_json_output("```json\n{\"a\": 1,\n \"b\": }\n```"),
            Err("invalid JSON output: expected value at line 3 column 7".into())
        );
        assert_eq!(
            parse_json_output("```json {\"a\" 1}```"),
            Err("invalid JSON output: expected `:` at line 1 column 14".into())
        );
    }

    #[test]
    fn validate_accepts_valid_output() {
        let schema = json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name"]
        });
        let value = json!({"name": "Ada", "age": 36});
        assert_eq!(validate_output(&value, &schema), Ok(()));
        assert_eq!(validate_output(&value, &json!(schema.to_string())), Ok(()));
        assert_eq!(validate_output(&value, &json!({})), Ok(()));
    }

    #[test]
    fn validate_reports_every_violation_with_its_path() {
        let schema = json!({
            "type": "object",
            "properties": {
                "age": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string"}}
            },
            "required": ["name"]
        });
        let errors = validate_output(&json!({"age": "x", "tags": ["a", 2]}), &schema).unwrap_err();
        let mut errors = errors;
        errors.sort();
        assert_eq!(
            errors,
            [
                r#"schema validation failed: at /age: "x" is not of type "integer""#,
                r#"schema validation failed: at /tags/1: 2 is not of type "string""#,
                r#"schema validation failed: at the root: "name" is a required property"#,
            ]
        );
    }

    #[test]
    fn validate_schema_given_as_text() {
        let schema = json!(r#"{"type": "object", "properties": {"age": {"type": "integer"}}}"#);
        assert_eq!(
            validate_output(&json!({"age": "x"}), &schema),
            Err(vec![
                r#"schema validation failed: at /age: "x" is not of type "integer""#.into()
            ])
        );
    }

    #[test]
    fn validate_rejects_unusable_schemas() {
        let value = json!({});
        let p = "schema validation failed: invalid output_structure: ";
        assert_eq!(
            validate_output(&value, &json!("{not json")),
            Err(vec![format!("{p}key must be a string at line 1 column 2")])
        );
        assert_eq!(
            validate_output(&value, &json!("[1]")),
            Err(vec![format!(
                "{p}expected a JSON Schema object, found an array"
            )])
        );
        assert_eq!(
            validate_output(&value, &json!(null)),
            Err(vec![format!(
                "{p}expected a JSON Schema object, found null"
            )])
        );
        assert_eq!(
            validate_output(&value, &json!(5)),
            Err(vec![format!(
                "{p}expected a JSON Schema object, found a number"
            )])
        );
        let errors = validate_output(&value, &json!({"type": "no-such-type"})).unwrap_err();
        assert_eq!(errors.len(), 1);
        assert!(errors[0].starts_with(p), "{errors:?}");
        let errors =
            validate_output(&value, &json!({"$ref": "https://example.com/s.json"})).unwrap_err();
        assert_eq!(errors.len(), 1);
        assert!(errors[0].starts_with(p), "{errors:?}");
    }
}

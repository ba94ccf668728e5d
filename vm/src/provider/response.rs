//! Parsing and validating a response's JSON output for `output_mode` `json` /
//! `structured_output` (§2.2.6 steps 5 and 7).
//!
//! Everything here reads data from outside the process, so nothing panics: every
//! function returns an error that says what was expected and what was found. Reading the
//! response itself is the wire format's job (`crate::provider::wire`).

use serde_json::Value;

use crate::text::json_kind as kind;

/// Parses a model's text as the JSON object `output_mode` `json` asks for.
///
/// One Markdown code fence around the whole text (` ```json … ``` ` or ` ``` … ``` `)
/// is tolerated, because models often add one. Line and column in errors refer to the
/// original text, fence included.
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

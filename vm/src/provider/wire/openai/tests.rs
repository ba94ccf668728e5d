//! Unit tests of the OpenAI wire format: every encoding rule, every response shape and
//! every decoding error, without I/O.

use std::sync::Arc;

use serde_json::{Value as Json, json};

use super::*;
use crate::provider::exchange::{
    Content, Message, OutputFormat, Part, Role, Sampling, ToolDefinition,
};
use crate::provider::request::build_request;
use crate::template::store::{Vars, value_from_json};

fn ok(raw: Json) -> Completion {
    decode_value(&raw).unwrap()
}

fn err(raw: Json) -> ProviderError {
    decode_value(&raw).unwrap_err()
}

fn text_response(content: Json) -> Json {
    json!({"choices": [{"message": {"role": "assistant", "content": content}}]})
}

fn text_of(completion: &Completion) -> Vec<&str> {
    completion
        .content
        .iter()
        .filter_map(|p| match p {
            Part::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

/// A request with `messages` and `tools`, its other fields from `vars`.
fn request(messages: Vec<Message>, tools: Vec<ToolDefinition>, vars: Json) -> ProviderRequest {
    let mut context = Vars::new();
    for (name, value) in vars.as_object().unwrap() {
        context.insert(name.as_str(), value_from_json(value));
    }
    let model = context
        .get("model")
        .and_then(|m| m.as_str().map(str::to_owned))
        .unwrap_or_else(|| "gpt-4o".into());
    build_request(model, context, messages.into(), tools.into()).unwrap()
}

fn encoded(request: &ProviderRequest) -> String {
    String::from_utf8(encode_request(request).unwrap()).unwrap()
}

fn user(text: &str) -> Message {
    Message::new(Role::User, Content::Text(text.into()))
}

// ---------------------------------------------------------------------------------------
// Encoding.

#[test]
fn minimal_request() {
    assert_eq!(
        encoded(&request(vec![user("How are you?")], vec![], json!({}))),
        r#"{"model":"gpt-4o","messages":[{"role":"user","content":"How are you?"}]}"#
    );
}

#[test]
fn roles_and_tool_result_as_user() {
    let messages = vec![
        Message::new(Role::System, Content::Text("Be brief.".into())),
        Message::new(Role::Developer, Content::Text("JSON.".into())),
        user("40 + 2?"),
        Message::new(Role::Assistant, Content::Text("Let me see.".into())),
        Message::new(Role::ToolResult, Content::Text("42".into())),
    ];
    assert_eq!(
        encoded(&request(messages, vec![], json!({"model": "local"}))),
        concat!(
            r#"{"model":"local","messages":[{"role":"system","content":"Be brief."},"#,
            r#"{"role":"developer","content":"JSON."},{"role":"user","content":"40 + 2?"},"#,
            r#"{"role":"assistant","content":"Let me see."},{"role":"user","content":"42"}]}"#
        )
    );
}

#[test]
fn attachments_are_content_parts() {
    let parts = vec![
        Part::Text("Describe these.".into()),
        Part::ImageUrl("https://e.com/a.png".into()),
        Part::AudioInput("https://e.com/a.mp3".into()),
        Part::File("https://e.com/a.pdf".into()),
    ];
    let message = Message::new(Role::User, Content::Parts(parts));
    let body: Json =
        serde_json::from_str(&encoded(&request(vec![message], vec![], json!({})))).unwrap();
    assert_eq!(
        body["messages"][0]["content"],
        json!([
            {"type": "text", "text": "Describe these."},
            {"type": "image_url", "image_url": {"url": "https://e.com/a.png"}},
            {"type": "audio_input", "audio_input": {"url": "https://e.com/a.mp3"}},
            {"type": "file", "file": {"url": "https://e.com/a.pdf"}},
        ])
    );
}

#[test]
fn sampling_fields_in_order_and_stop_renamed() {
    let vars = json!({
        "temperature": 0.2, "max_tokens": 50, "top_p": 0.9, "presence_penalty": 0.5,
        "frequency_penalty": -0.5, "seed": 7, "stop_sequences": ["END", "\n\n"],
        "logit_bias": {"50256": -100}, "top_k": 40, "repetition_penalty": 1.1,
    });
    assert_eq!(
        encoded(&request(vec![user("hi")], vec![], vars)),
        r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"temperature":0.2,"max_tokens":50,"top_p":0.9,"presence_penalty":0.5,"frequency_penalty":-0.5,"seed":7,"stop":["END","\n\n"],"logit_bias":{"50256":-100},"top_k":40,"repetition_penalty":1.1}"#
    );
    let mut bare = request(vec![user("hi")], vec![], json!({}));
    bare.sampling = Sampling::default();
    assert!(!encoded(&bare).contains("temperature"));
}

#[test]
fn tools_are_functions() {
    let calc = ToolDefinition::new("calc", "Adds.", json!({"type": "object"}));
    let mut bare = ToolDefinition::new("now", "", Json::Null);
    bare.strict = Some(true);
    assert_eq!(
        encoded(&request(vec![user("hi")], vec![calc, bare], json!({}))),
        concat!(
            r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"tools":["#,
            r#"{"type":"function","function":{"name":"calc","description":"Adds.","parameters":{"type":"object"}}},"#,
            r#"{"type":"function","function":{"name":"now","strict":true}}]}"#
        )
    );
}

#[test]
fn response_formats() {
    let schema = json!({"type": "object"});
    let cases = [
        (OutputFormat::Text, None),
        (
            OutputFormat::JsonObject,
            Some(json!({"type": "json_object"})),
        ),
        (
            OutputFormat::JsonSchema {
                name: "output".into(),
                schema: schema.clone(),
            },
            Some(json!({"type": "json_schema",
                        "json_schema": {"name": "output", "schema": schema, "strict": true}})),
        ),
    ];
    for (format, expected) in cases {
        let mut request = request(vec![user("hi")], vec![], json!({}));
        request.output = format;
        let body: Json = serde_json::from_str(&encoded(&request)).unwrap();
        assert_eq!(body.get("response_format"), expected.as_ref());
    }
}

#[test]
fn empty_context_gives_no_messages() {
    let request = request(vec![], vec![], json!({}));
    assert_eq!(encoded(&request), r#"{"model":"gpt-4o","messages":[]}"#);
    let _ = Arc::clone(&request.messages);
}

// ---------------------------------------------------------------------------------------
// Decoding.

#[test]
fn spec_example_response() {
    let raw = json!({
        "choices": [{
            "message": {
                "role": "assistant",
                "content": "Hello! I'm doing well, thank you for asking.",
                "tool_calls": [{
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "calc", "arguments": "{\"num1\": 40, \"num2\": 2}"}
                }]
            },
            "finish_reason": "tool_calls"
        }],
        "model": "gpt-4o-2024",
        "usage": {"prompt_tokens": 10, "completion_tokens": 15, "total_tokens": 25}
    });
    let completion = ok(raw.clone());
    assert_eq!(completion.role, "assistant");
    assert_eq!(
        completion.content,
        [Part::Text(
            "Hello! I'm doing well, thank you for asking.".into()
        )]
    );
    assert_eq!(
        completion.tool_calls,
        [ToolCall::new(
            "call_1",
            "calc",
            json!("{\"num1\": 40, \"num2\": 2}")
        )]
    );
    let usage = completion.usage.clone().unwrap();
    assert_eq!(
        (usage.input_tokens, usage.output_tokens),
        (Some(10), Some(15))
    );
    assert_eq!(Json::Object(usage.fields), raw["usage"]);
    assert_eq!(completion.finish_reason, Some(FinishReason::ToolCalls));
    assert_eq!(completion.model.as_deref(), Some("gpt-4o-2024"));
    assert_eq!(completion.raw.as_deref(), Some(&raw));
}

#[test]
fn decode_response_reads_bytes() {
    let completion = decode_response(br#"{"choices":[{"message":{"content":"hi"}}]}"#).unwrap();
    assert_eq!(text_of(&completion), ["hi"]);
    let error = decode_response(b"<html>").unwrap_err();
    assert_eq!(error.kind, ProviderErrorKind::InvalidResponse);
    assert!(
        error
            .message
            .starts_with("invalid provider response: the response is not JSON ("),
        "{error}"
    );
}

#[test]
fn finish_reasons() {
    for (text, reason) in [
        ("stop", FinishReason::Stop),
        ("length", FinishReason::Length),
        ("tool_calls", FinishReason::ToolCalls),
        ("content_filter", FinishReason::ContentFilter),
        ("other", FinishReason::Other("other".into())),
    ] {
        let raw = json!({"choices": [{"message": {"content": "x"}, "finish_reason": text}]});
        assert_eq!(ok(raw).finish_reason, Some(reason));
    }
}

#[test]
fn only_the_first_choice_is_read() {
    let completion = ok(json!({"choices": [
        {"message": {"content": "first"}},
        {"message": {"content": "second"}}
    ]}));
    assert_eq!(text_of(&completion), ["first"]);
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
fn null_or_absent_content_is_empty() {
    assert!(ok(text_response(Json::Null)).content.is_empty());
    assert!(ok(json!({"choices": [{"message": {}}]})).content.is_empty());
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
    assert_eq!(
        completion.content,
        [
            Part::Text("Good morning! ".into()),
            Part::ImageUrl("https://e.com/1.png".into()),
            Part::Text("Here you go.".into()),
            Part::ImageUrl("https://e.com/2.png".into()),
            Part::AudioInput("https://e.com/a.mp3".into()),
            Part::AudioInput("https://e.com/b.mp3".into()),
            Part::File("https://e.com/f.pdf".into()),
            Part::File("file-123".into()),
            Part::File("https://e.com/g.csv".into()),
            Part::Text("!".into()),
        ]
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
    let usage = ok(raw).usage.unwrap();
    assert_eq!(Json::Object(usage.fields), json!({"total_tokens": 3}));
    assert_eq!(usage.input_tokens, None);
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
    assert!(completion.content.is_empty());
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
        let error = err(raw.clone());
        assert_eq!(error.kind, ProviderErrorKind::InvalidResponse, "{raw}");
        assert_eq!(error.message, format!("{p}{expected}"), "{raw}");
    }
}

// ---------------------------------------------------------------------------------------
// The response dict.

#[test]
fn response_json_round_trips() {
    for raw in [
        json!({"choices": [{"message": {"role": "assistant", "content": "hi"},
                            "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
               "model": "m"}),
        json!({"choices": [{"message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": "c1", "type": "function",
                            "function": {"name": "calc", "arguments": "{}"}}]}}]}),
        json!({"choices": [{"message": {"role": "user", "content": [
            {"type": "text", "text": "a"},
            {"type": "image_url", "image_url": {"url": "https://e.com/1.png"}}]}}]}),
    ] {
        assert_eq!(response_json(&ok(raw.clone())), raw);
    }
    assert_eq!(
        response_json(&Completion::text("x")),
        json!({"choices": [{"message": {"role": "assistant", "content": "x"}}]})
    );
}

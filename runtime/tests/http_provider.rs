//! The OpenAI-compatible HTTP provider and the router, against a scripted HTTP server on
//! 127.0.0.1: the exact request JSON for each mapping rule (spec/providers.md §1–§3),
//! failures and retries (§4), routing (§5), and that secrets never leak (§6).
//!
//! Requests are built as the machine builds them (`aplc_vm::build_request` over a
//! context), so the JSON pinned here is what a run sends.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use aplc_runtime::driver::{BoxFuture, CallContext, DeltaSink, Provider, Scripted};
use aplc_runtime::openai::{OpenAiConfig, OpenAiProvider};
use aplc_runtime::routing::Router;
use aplc_vm::minijinja::Value;
use aplc_vm::{
    Completion, Content, Message, Part, ProviderError, ProviderErrorKind, ProviderRequest, Role,
    ScriptedProvider, ToolDefinition, Vars, build_request, user_defaults,
};
use serde::Deserialize;
use serde_json::{Value as Json, json};
use support::{Reply, Server, StreamEnd};

/// The API key of every test: it must never appear in an error or in `Debug` output.
const KEY: &str = "sk-test-0123456789abcdef-SECRET";

/// A context as the machine builds it: every default, plus `overrides`.
fn context(overrides: Json) -> Vars {
    let mut vars = Vars::new();
    for (name, value) in user_defaults() {
        vars.insert(Arc::from(name), value);
    }
    // Executor variables that must never be sent.
    for (name, value) in [
        ("prompts", json!([])),
        ("tools", json!([])),
        ("errors", json!([])),
        ("result_text", json!("")),
        ("runs", json!(0)),
        ("context_history", json!([])),
    ] {
        vars.insert(Arc::from(name), from_json(&value));
    }
    for (name, value) in overrides.as_object().expect("overrides are an object") {
        vars.insert(Arc::from(name.as_str()), from_json(value));
    }
    vars
}

/// A template value from JSON, as the machine stores values.
fn from_json(json: &Json) -> Value {
    Value::deserialize(json).expect("every JSON value is a template value")
}

/// A request and the deadline of its call.
struct Call {
    request: ProviderRequest,
    deadline: Instant,
}

/// `provider.call(&request(…))`: one `complete` with the call's deadline.
trait CallExt {
    fn call<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Result<Completion, ProviderError>>;
}

impl<P: Provider> CallExt for P {
    fn call<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        Box::pin(async move {
            let context = CallContext::new(call.deadline);
            self.complete(&call.request, &context).await
        })
    }
}

fn request(overrides: Json) -> Call {
    request_with_deadline(overrides, Duration::from_secs(5))
}

/// The request the machine builds from the context: `prompts` and `tools` given as JSON
/// here become the typed messages and tool definitions the machine would have.
fn request_with_deadline(overrides: Json, within: Duration) -> Call {
    let messages: Vec<Message> = overrides
        .get("prompts")
        .and_then(Json::as_array)
        .map(|prompts| prompts.iter().map(message).collect())
        .unwrap_or_default();
    let tools: Vec<ToolDefinition> = overrides
        .get("tools")
        .and_then(Json::as_array)
        .map(|tools| tools.iter().map(tool).collect())
        .unwrap_or_default();
    let context = context(overrides);
    let model = context
        .get("model")
        .and_then(|m| m.as_str().map(str::to_owned))
        .unwrap_or_default();
    let request = build_request(model, context, Arc::from(messages), Arc::from(tools))
        .expect("the request builds");
    Call {
        request,
        deadline: Instant::now() + within,
    }
}

/// A `prompts` entry as a typed message.
fn message(json: &Json) -> Message {
    let role = match json["role"].as_str().expect("a role") {
        "system" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "developer" => Role::Developer,
        "tool_result" => Role::ToolResult,
        other => panic!("no role {other}"),
    };
    let content = match &json["content"] {
        Json::String(text) => Content::Text(text.clone()),
        Json::Array(parts) => Content::Parts(
            parts
                .iter()
                .map(|part| {
                    let url = |kind: &str| part[kind]["url"].as_str().unwrap().to_owned();
                    match part["type"].as_str().unwrap() {
                        "text" => Part::Text(part["text"].as_str().unwrap().to_owned()),
                        "image_url" => Part::ImageUrl(url("image_url")),
                        "audio_input" => Part::AudioInput(url("audio_input")),
                        "file" => Part::File(url("file")),
                        other => panic!("no part type {other}"),
                    }
                })
                .collect(),
        ),
        other => panic!("no content {other}"),
    };
    Message::new(role, content)
}

/// A tool descriptor (bare, or wrapped as an API tool) as a typed definition.
fn tool(json: &Json) -> ToolDefinition {
    let function = json.get("function").unwrap_or(json);
    ToolDefinition::new(
        function["name"].as_str().unwrap(),
        function["description"].as_str().unwrap_or_default(),
        function["parameters"].clone(),
    )
}

/// The completion's text.
fn text(completion: &Completion) -> &str {
    match completion.content.as_slice() {
        [Part::Text(text)] => text,
        other => panic!("not one text part: {other:?}"),
    }
}

/// A provider for `server` with short delays, so failure tests stay fast.
fn config(server: &Server) -> OpenAiConfig {
    OpenAiConfig::new()
        .base_url(server.base_url())
        .api_key(KEY)
        .request_timeout(Duration::from_secs(2))
        .retry_delays(Duration::from_millis(10), Duration::from_millis(40))
}

fn provider(server: &Server) -> OpenAiProvider {
    OpenAiProvider::new(config(server)).unwrap()
}

/// Sends `overrides` as one request and returns the JSON body the server received.
async fn sent_body(overrides: Json) -> Json {
    let server = Server::start(vec![Reply::completion("ok")]).await;
    provider(&server)
        .call(&request(overrides))
        .await
        .expect("the call succeeds");
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    requests[0].json()
}

/// The error message of a failed call; it must not contain the key.
async fn failure(provider: &OpenAiProvider, request: &Call) -> String {
    let message = provider
        .call(request)
        .await
        .expect_err("the call fails")
        .message;
    assert!(!message.contains(KEY), "the key leaked: {message}");
    message
}

fn user(text: &str) -> Json {
    json!([{"role": "user", "content": text}])
}

// ---------------------------------------------------------------------------------------
// The request.

#[tokio::test]
async fn minimal_request_leaves_out_every_unset_variable() {
    let server = Server::start(vec![Reply::completion("Hello!")]).await;
    let response = provider(&server)
        .call(&request(json!({"prompts": user("How are you?")})))
        .await
        .unwrap();
    assert_eq!(text(&response), "Hello!");
    assert_eq!(
        response.raw.as_ref().unwrap()["choices"][0]["message"]["content"],
        "Hello!",
        "the response is kept as received"
    );
    let requests = server.requests();
    let sent = &requests[0];
    assert_eq!(sent.method, "POST");
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(
        sent.header("authorization"),
        Some(&*format!("Bearer {KEY}"))
    );
    assert_eq!(sent.header("content-type"), Some("application/json"));
    assert_eq!(sent.header("accept"), Some("application/json"));
    assert!(sent.header("user-agent").unwrap().starts_with("aplc/"));
    assert_eq!(
        String::from_utf8(sent.body.clone()).unwrap(),
        r#"{"model":"gpt-4o","messages":[{"role":"user","content":"How are you?"}]}"#
    );
}

#[tokio::test]
async fn roles_pass_through_and_tool_result_becomes_user() {
    let body = sent_body(json!({
        "model": "local-model",
        "prompts": [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": "Answer in JSON."},
            {"role": "user", "content": "What is 40 + 2?"},
            {"role": "assistant", "content": "Let me calculate."},
            {"role": "tool_result", "content": "[{\"tool_call_id\": \"c1\", \"content\": 42}]"},
        ]
    }))
    .await;
    assert_eq!(
        body,
        json!({
            "model": "local-model",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "developer", "content": "Answer in JSON."},
                {"role": "user", "content": "What is 40 + 2?"},
                {"role": "assistant", "content": "Let me calculate."},
                {"role": "user", "content": "[{\"tool_call_id\": \"c1\", \"content\": 42}]"},
            ]
        })
    );
}

#[tokio::test]
async fn attachments_pass_through_as_content_parts() {
    let parts = json!([
        {"type": "text", "text": "Describe these."},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        {"type": "audio_input", "audio_input": {"url": "https://example.com/a.mp3"}},
        {"type": "file", "file": {"url": "https://example.com/a.pdf"}},
    ]);
    let body = sent_body(json!({"prompts": [{"role": "user", "content": parts}]})).await;
    assert_eq!(
        body,
        json!({"model": "gpt-4o", "messages": [{"role": "user", "content": parts}]})
    );
}

#[tokio::test]
async fn sampling_parameters_are_sent_when_set() {
    let body = sent_body(json!({
        "prompts": user("hi"),
        "temperature": 0.2,
        "max_tokens": 50,
        "top_p": 0.9,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "seed": 7,
        "stop_sequences": ["END", "\n\n"],
        "logit_bias": {"50256": -100},
        "top_k": 40,
        "repetition_penalty": 1.1,
    }))
    .await;
    // Exact text: the order of the fields and the numbers as the context holds them.
    assert_eq!(
        body.to_string(),
        r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"temperature":0.2,"max_tokens":50,"top_p":0.9,"presence_penalty":0.5,"frequency_penalty":-0.5,"seed":7,"stop":["END","\n\n"],"logit_bias":{"50256":-100},"top_k":40,"repetition_penalty":1.1}"#
    );
    // Zero is a value, not "unset".
    let body = sent_body(json!({"prompts": user("hi"), "temperature": 0, "seed": 0})).await;
    assert_eq!(body["temperature"], 0);
    assert_eq!(body["seed"], 0);
}

#[tokio::test]
async fn tools_are_sent_when_there_are_any() {
    let api_tool = json!({"type": "function", "function": {
        "name": "calc", "description": "Adds.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}});
    let bare = json!({"name": "now", "description": "The time.", "parameters": {"type": "object"}});
    let body = sent_body(json!({"prompts": user("hi"), "tools": [api_tool, bare]})).await;
    assert_eq!(
        body,
        json!({
            "model": "gpt-4o",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [api_tool, {"type": "function", "function": bare}],
        })
    );
}

#[tokio::test]
async fn output_modes_set_the_response_format() {
    let schema = json!({"type": "object", "properties": {"name": {"type": "string"}},
                        "required": ["name"], "additionalProperties": false});
    let cases = [
        (json!({"output_mode": "text"}), None),
        (
            json!({"output_mode": "json"}),
            Some(json!({"type": "json_object"})),
        ),
        (
            json!({"output_mode": "structured_output", "output_structure": schema}),
            Some(json!({"type": "json_schema",
                        "json_schema": {"name": "output", "schema": schema, "strict": true}})),
        ),
        (
            json!({"output_mode": "structured_output", "output_structure": schema.to_string()}),
            Some(json!({"type": "json_schema",
                        "json_schema": {"name": "output", "schema": schema, "strict": true}})),
        ),
        (
            json!({"output_mode": "structured_output"}),
            Some(json!({"type": "json_object"})),
        ),
    ];
    for (mut overrides, expected) in cases {
        overrides["prompts"] = user("Give me JSON.");
        let body = sent_body(overrides.clone()).await;
        assert_eq!(
            body.get("response_format"),
            expected.as_ref(),
            "{overrides}"
        );
    }
}

#[tokio::test]
async fn invalid_output_structure_is_refused_before_any_provider() {
    // The core refuses to build the request, so no provider is ever asked.
    let overrides = json!({"output_mode": "structured_output", "output_structure": "{not json"});
    let context = context(overrides);
    let error = build_request("gpt-4o".into(), context, Arc::from([]), Arc::from([]))
        .expect_err("the request cannot be built");
    assert_eq!(error.kind, ProviderErrorKind::InvalidRequest);
    assert_eq!(
        error.message,
        "`output_structure` is not valid JSON: key must be a string at line 1 column 2"
    );
}

#[tokio::test]
async fn base_url_ending_in_v1_is_not_doubled() {
    let server = Server::start(vec![Reply::completion("a"), Reply::completion("b")]).await;
    for base in [
        format!("{}/v1", server.base_url()),
        format!("{}/v1/", server.base_url()),
    ] {
        let provider = OpenAiProvider::new(OpenAiConfig::new().base_url(base)).unwrap();
        provider
            .call(&request(json!({"prompts": user("hi")})))
            .await
            .unwrap();
    }
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    for sent in requests {
        assert_eq!(sent.path, "/v1/chat/completions");
        // No key configured: no Authorization header.
        assert_eq!(sent.header("authorization"), None);
    }
}

#[tokio::test]
async fn configured_headers_are_sent() {
    let server = Server::start(vec![Reply::completion("ok")]).await;
    let provider = OpenAiProvider::new(
        OpenAiConfig::new()
            .base_url(server.base_url())
            .header("api-key", "azure-style-secret-key")
            .header("OpenAI-Organization", "org-123"),
    )
    .unwrap();
    provider
        .call(&request(json!({"prompts": user("hi")})))
        .await
        .unwrap();
    let sent = &server.requests()[0];
    assert_eq!(sent.header("api-key"), Some("azure-style-secret-key"));
    assert_eq!(sent.header("openai-organization"), Some("org-123"));
}

// ---------------------------------------------------------------------------------------
// Failures and retries.

#[tokio::test]
async fn server_error_is_retried_and_the_retry_succeeds() {
    let server = Server::start(vec![
        Reply::json(500, json!({"error": {"message": "internal"}})),
        Reply::completion("second time lucky"),
    ])
    .await;
    let response = provider(&server)
        .call(&request(json!({"prompts": user("hi")})))
        .await
        .unwrap();
    assert_eq!(text(&response), "second time lucky");
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[0].body, requests[1].body,
        "the retry sends the same request"
    );
}

#[tokio::test]
async fn retry_after_seconds_is_honoured() {
    let server = Server::start(vec![
        Reply::json(429, json!({"error": {"message": "Rate limit reached"}}))
            .header("Retry-After", "1"),
        Reply::completion("ok"),
    ])
    .await;
    let started = Instant::now();
    provider(&server)
        .call(&request(json!({"prompts": user("hi")})))
        .await
        .unwrap();
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(950),
        "waited only {waited:?}"
    );
    assert!(waited < Duration::from_millis(1900), "waited {waited:?}");
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn retry_after_replaces_the_backoff() {
    // A backoff of a minute would not fit the deadline; `Retry-After: 0` does.
    let server = Server::start(vec![
        Reply::json(503, json!({"error": {"message": "overloaded"}})).header("retry-after", "0"),
        Reply::completion("ok"),
    ])
    .await;
    let provider = OpenAiProvider::new(
        config(&server).retry_delays(Duration::from_secs(60), Duration::from_secs(60)),
    )
    .unwrap();
    let started = Instant::now();
    provider
        .call(&request(json!({"prompts": user("hi")})))
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn retry_after_past_the_deadline_is_not_waited_for() {
    let server = Server::start(vec![
        Reply::json(429, json!({"error": {"message": "slow down"}})).header("Retry-After", "30"),
    ])
    .await;
    let started = Instant::now();
    let message = failure(
        &provider(&server),
        &request_with_deadline(json!({"prompts": user("hi")}), Duration::from_secs(2)),
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(
        message,
        format!(
            "HTTP 429 Too Many Requests: slow down (POST {}/v1/chat/completions; not retried: \
             the server asked to wait 30000 ms, past the run's deadline)",
            server.base_url()
        )
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn unauthorized_is_not_retried_and_names_status_and_api_message() {
    // OpenAI quotes (part of) the key back; a server could quote all of it.
    let server = Server::start(vec![Reply::json(
        401,
        json!({"error": {"message": format!("Incorrect API key provided: {KEY}."),
                         "type": "invalid_request_error", "code": "invalid_api_key"}}),
    )])
    .await;
    let message = failure(&provider(&server), &request(json!({"prompts": user("hi")}))).await;
    assert_eq!(
        message,
        format!(
            "HTTP 401 Unauthorized: Incorrect API key provided: <redacted>. \
             (POST {}/v1/chat/completions)",
            server.base_url()
        )
    );
    assert_eq!(server.requests().len(), 1, "a 401 is not retried");
}

#[tokio::test]
async fn other_client_errors_are_not_retried() {
    let server = Server::start(vec![Reply::json(
        400,
        json!({"error": {"message": "'developer' is not a valid role", "type": "invalid_request_error"}}),
    )])
    .await;
    let message = failure(&provider(&server), &request(json!({"prompts": user("hi")}))).await;
    assert!(
        message.starts_with("HTTP 400 Bad Request: 'developer' is not a valid role (POST "),
        "{message}"
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn redirects_are_not_followed() {
    let server = Server::start(vec![
        Reply::text(301, "").header("Location", "http://127.0.0.1:1/elsewhere"),
        Reply::completion("never reached"),
    ])
    .await;
    let message = failure(&provider(&server), &request(json!({"prompts": user("hi")}))).await;
    assert_eq!(
        message,
        format!(
            "HTTP 301 Moved Permanently: redirected to `http://127.0.0.1:1/elsewhere`; only \
             same-origin 307 and 308 redirects are followed, check the base URL (POST \
             {}/v1/chat/completions)",
            server.base_url()
        )
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn retries_stop_after_max_retries() {
    let server = Server::start(vec![
        Reply::text(502, "<html>Bad Gateway</html>"),
        Reply::text(502, "<html>Bad Gateway</html>"),
        Reply::text(502, "<html>Bad Gateway</html>"),
        Reply::completion("never reached"),
    ])
    .await;
    let message = failure(&provider(&server), &request(json!({"prompts": user("hi")}))).await;
    assert_eq!(
        message,
        format!(
            "HTTP 502 Bad Gateway: <html>Bad Gateway</html> (POST {}/v1/chat/completions; gave \
             up after 3 attempts)",
            server.base_url()
        )
    );
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test]
async fn non_json_body_is_an_error_with_an_excerpt() {
    let server = Server::start(vec![Reply::text(
        200,
        "<html>\n<body>It works!</body>\n</html>",
    )])
    .await;
    let message = failure(&provider(&server), &request(json!({"prompts": user("hi")}))).await;
    assert_eq!(
        message,
        format!(
            "HTTP 200 OK: the response is not JSON (expected value at line 1 column 1); it \
             begins: <html> <body>It works!</body> </html> (POST {}/v1/chat/completions)",
            server.base_url()
        )
    );
    assert_eq!(server.requests().len(), 1, "a broken 200 is not retried");
}

#[tokio::test]
async fn response_without_choices_is_an_error() {
    let server = Server::start(vec![
        Reply::json(200, json!({"id": "x", "object": "chat.completion"})),
        Reply::json(200, json!({"error": {"message": "model is loading"}})),
    ])
    .await;
    let provider = provider(&server);
    let message = failure(&provider, &request(json!({"prompts": user("hi")}))).await;
    assert_eq!(
        message,
        format!(
            "HTTP 200 OK: the response is not a chat completion (no `choices`): \
             {{\"id\":\"x\",\"object\":\"chat.completion\"}} (POST {}/v1/chat/completions)",
            server.base_url()
        )
    );
    let message = failure(&provider, &request(json!({"prompts": user("hi")}))).await;
    assert!(
        message.starts_with("HTTP 200 OK: the response has no `choices`: model is loading (POST"),
        "{message}"
    );
}

#[tokio::test]
async fn a_server_that_never_answers_times_out() {
    let server = Server::start(vec![Reply::Hang, Reply::Hang]).await;
    let provider = OpenAiProvider::new(
        config(&server)
            .request_timeout(Duration::from_millis(200))
            .max_retries(1),
    )
    .unwrap();
    let started = Instant::now();
    let message = failure(&provider, &request(json!({"prompts": user("hi")}))).await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(2),
        "{took:?}"
    );
    assert_eq!(
        message,
        format!(
            "no response within the request timeout of 200 ms (POST {}/v1/chat/completions; \
             gave up after 2 attempts)",
            server.base_url()
        )
    );
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn the_run_deadline_caps_the_request_timeout() {
    let server = Server::start(vec![Reply::Hang]).await;
    let started = Instant::now();
    let message = failure(
        &provider(&server),
        &request_with_deadline(json!({"prompts": user("hi")}), Duration::from_millis(300)),
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(
        message.starts_with("no response before the run's deadline ("),
        "{message}"
    );
    assert_eq!(server.requests().len(), 1, "nothing is left to retry with");

    let passed = Call {
        deadline: Instant::now(),
        ..request(json!({"prompts": user("hi")}))
    };
    let message = failure(&provider(&server), &passed).await;
    assert!(
        message.starts_with("the run's deadline passed before the request was sent (POST"),
        "{message}"
    );
}

#[tokio::test]
async fn connection_failures_are_retried_then_reported() {
    // A port nobody listens on: bind one, then close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let provider = OpenAiProvider::new(
        OpenAiConfig::new()
            .base_url(format!("http://127.0.0.1:{port}"))
            .api_key(KEY)
            .max_retries(1)
            .retry_delays(Duration::from_millis(10), Duration::from_millis(10)),
    )
    .unwrap();
    let message = failure(&provider, &request(json!({"prompts": user("hi")}))).await;
    assert!(message.starts_with("could not connect: "), "{message}");
    assert!(
        message.ends_with(&format!(
            "(POST http://127.0.0.1:{port}/v1/chat/completions; gave up after 2 attempts)"
        )),
        "{message}"
    );
}

#[tokio::test]
async fn a_dropped_connection_is_retried() {
    let server = Server::start(vec![Reply::Close, Reply::completion("ok")]).await;
    let response = provider(&server)
        .call(&request(json!({"prompts": user("hi")})))
        .await
        .unwrap();
    assert_eq!(text(&response), "ok");
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn secrets_never_appear_in_debug_output() {
    let config = OpenAiConfig::new()
        .base_url("http://127.0.0.1:9")
        .api_key(KEY)
        .header("api-key", "header-secret-value");
    let provider = OpenAiProvider::new(config.clone()).unwrap();
    let router = Router::single(Arc::new(provider.clone()));
    for debug in [
        format!("{config:?}"),
        format!("{config:#?}"),
        format!("{provider:?}"),
        format!("{provider:#?}"),
        format!("{router:?}"),
    ] {
        assert!(!debug.contains(KEY), "{debug}");
        assert!(!debug.contains("header-secret-value"), "{debug}");
        assert!(!debug.contains("SECRET"), "{debug}");
    }
    assert_eq!(
        format!("{provider:?}"),
        "OpenAiProvider { endpoint: \"http://127.0.0.1:9/v1/chat/completions\", api_key: \
         Some(<redacted>), headers: [(\"api-key\", <redacted>)], request_timeout: 60s, \
         max_retries: 2, stream: false, .. }"
    );
}

// ---------------------------------------------------------------------------------------
// Routing.

#[tokio::test]
async fn router_picks_the_first_matching_route() {
    let server = Server::start(vec![Reply::completion("from http")]).await;
    let config = json!({"routes": [
        {"model": "gpt-4o-mini", "kind": "mock", "responses": ["mini"]},
        {"model": "gpt-*", "kind": "mock", "responses": ["any gpt", "any gpt again"]},
        {"model": ["llama-*", "qwen?"], "kind": "openai", "base_url": server.base_url(),
         "api_key_env": "LOCAL_KEY", "timeout_ms": 2000, "max_retries": 0}
    ]});
    let env = |name: &str| (name == "LOCAL_KEY").then(|| KEY.to_string());
    let router = Router::from_config_json(&config.to_string(), &env).unwrap();
    let text = |response: Completion| text(&response).to_owned();
    let call = |model: &str| request(json!({"model": model, "prompts": user("hi")}));
    assert_eq!(
        text(router.call(&call("gpt-4o-mini")).await.unwrap()),
        "mini"
    );
    assert_eq!(text(router.call(&call("gpt-4o")).await.unwrap()), "any gpt");
    // Each route keeps its own script: the exact route has run out.
    assert_eq!(
        router.call(&call("gpt-4o-mini")).await.unwrap_err().message,
        "mock provider exhausted"
    );
    assert_eq!(
        text(router.call(&call("qwen3")).await.unwrap()),
        "from http"
    );
    let sent = &server.requests()[0];
    assert_eq!(sent.json()["model"], "qwen3");
    assert_eq!(
        sent.header("authorization"),
        Some(&*format!("Bearer {KEY}"))
    );

    let error = router.call(&call("claude-3")).await.unwrap_err();
    assert_eq!(
        error.message,
        "no provider for model `claude-3` (routes: `gpt-4o-mini`, `gpt-*`, `llama-*`, `qwen?`)"
    );
}

#[tokio::test]
async fn router_for_rust_embedders() {
    let script = |text: &str| {
        Arc::new(Scripted::new(
            ScriptedProvider::from_json(&json!([text]).to_string()).unwrap(),
        ))
    };
    let router = Router::new()
        .with_provider("gpt-4o", script("exact"))
        .with_provider("*", script("fallback"));
    let call = |model: &str| request(json!({"model": model}));
    let text = |response: Completion| text(&response).to_owned();
    assert_eq!(text(router.call(&call("gpt-4o")).await.unwrap()), "exact");
    assert_eq!(text(router.call(&call("other")).await.unwrap()), "fallback");

    let single = Router::single(script("only"));
    assert_eq!(text(single.call(&call("anything")).await.unwrap()), "only");

    let empty = Router::new();
    assert_eq!(
        empty.call(&call("gpt-4o")).await.unwrap_err().message,
        "no provider for model `gpt-4o` (no routes are configured)"
    );
}

#[tokio::test]
async fn a_completion_that_does_not_decode_is_an_invalid_response() {
    let server = Server::start(vec![Reply::json(200, json!({"choices": [{"message": 3}]}))]).await;
    let error = provider(&server)
        .call(&request(json!({"prompts": user("hi")})))
        .await
        .expect_err("the body is not a completion");
    assert_eq!(error.kind, ProviderErrorKind::InvalidResponse);
    assert_eq!(
        error.message,
        "invalid provider response: expected the `message` of choice 0 to be an object, \
         found a number"
    );
    assert_eq!(server.requests().len(), 1, "a decoded 200 is not retried");
}

// ---------------------------------------------------------------------------------------
// Streaming (spec/providers.md, "Streaming").

/// The answer of the streaming tests, whole: text, an `add` call, usage.
fn whole_answer() -> Json {
    json!({
        "id": "chatcmpl-s", "object": "chat.completion", "model": "gpt-stream",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "Let me add those: one moment.",
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "add", "arguments": "{\"a\": 1, \"b\": 2}"}}]}}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 9, "total_tokens": 20},
    })
}

/// The same answer as a chunk stream: text in pieces of 5 characters, the arguments in
/// pieces of 4, then the finish reason, the usage chunk and `[DONE]`.
fn streamed_answer() -> String {
    let chunk = |delta: Json, finish: Json| {
        json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "model": "gpt-stream",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let mut chunks = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Json::Null,
    )];
    let text: Vec<char> = "Let me add those: one moment.".chars().collect();
    for piece in text.chunks(5) {
        let piece: String = piece.iter().collect();
        chunks.push(chunk(json!({"content": piece}), Json::Null));
    }
    chunks.push(chunk(
        json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                               "function": {"name": "add", "arguments": ""}}]}),
        Json::Null,
    ));
    let arguments: Vec<char> = "{\"a\": 1, \"b\": 2}".chars().collect();
    for piece in arguments.chunks(4) {
        let piece: String = piece.iter().collect();
        chunks.push(chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
            Json::Null,
        ));
    }
    chunks.push(chunk(json!({}), json!("tool_calls")));
    let mut usage = json!({"id": "chatcmpl-s", "object": "chat.completion.chunk",
                           "model": "gpt-stream", "choices": []});
    usage["usage"] = whole_answer()["usage"].clone();
    chunks.push(usage);
    let mut body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    body.push_str("data: [DONE]\n\n");
    body
}

/// The first `n` events of [`streamed_answer`] (each ends in a blank line).
fn streamed_prefix(n: usize) -> String {
    streamed_answer().split_inclusive("\n\n").take(n).collect()
}

/// Calls `provider` with a delta sink: the result and the deltas it sent.
async fn call_streamed(
    provider: &OpenAiProvider,
    call: &Call,
) -> (Result<Completion, ProviderError>, Vec<String>) {
    let (sink, mut receiver) = DeltaSink::channel(1024);
    let context = CallContext::new(call.deadline).with_deltas(sink);
    let result = provider.complete(&call.request, &context).await;
    let mut deltas = Vec::new();
    while let Ok(text) = receiver.try_recv() {
        deltas.push(text);
    }
    (result, deltas)
}

fn streaming(server: &Server) -> OpenAiProvider {
    OpenAiProvider::new(config(server).stream(true)).unwrap()
}

#[tokio::test]
async fn a_streamed_run_ends_with_the_same_context_and_relays_its_deltas() {
    let server = Server::start(vec![Reply::json(200, whole_answer())]).await;
    let (whole, _) = support::run_agent(&provider(&server), Duration::from_secs(10)).await;
    assert!(whole.error.is_none(), "{:?}", whole.error);
    // Pieces of 7 bytes: events, lines and JSON split across HTTP chunks.
    let server = Server::start(vec![Reply::stream(&streamed_answer(), 7)]).await;
    let (streamed, events) = support::run_agent(&streaming(&server), Duration::from_secs(10)).await;
    assert_eq!(
        support::final_context(&streamed),
        support::final_context(&whole)
    );
    assert_eq!(
        support::streamed_texts(&events),
        ["Let me add those: one moment."]
    );
    let sent = server.requests()[0].json();
    assert_eq!(sent["stream"], json!(true));
    assert_eq!(sent["stream_options"], json!({"include_usage": true}));
}

#[tokio::test]
async fn a_streamed_call_assembles_text_tool_calls_and_usage() {
    let server = Server::start(vec![Reply::stream(&streamed_answer(), 3)]).await;
    let (result, deltas) = call_streamed(&streaming(&server), &request(json!({}))).await;
    let completion = result.expect("the stream assembles");
    let mut expected = aplc_vm::wire::openai::decode_value(&whole_answer()).unwrap();
    expected.raw = None;
    let mut got = completion.clone();
    got.raw = None;
    assert_eq!(got, expected);
    assert_eq!(deltas.concat(), "Let me add those: one moment.");
    assert_eq!(deltas.len(), 6);
}

#[tokio::test]
async fn an_error_status_before_the_stream_is_retried() {
    let server = Server::start(vec![
        Reply::json(503, json!({"error": {"message": "busy"}})),
        Reply::stream(&streamed_answer(), 64),
    ])
    .await;
    let (result, deltas) = call_streamed(&streaming(&server), &request(json!({}))).await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(deltas.concat(), "Let me add those: one moment.");
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn a_stream_dropped_before_its_first_delta_is_retried() {
    let server = Server::start(vec![
        Reply::stream_then(&streamed_prefix(1), 64, StreamEnd::Drop),
        Reply::stream(&streamed_answer(), 64),
    ])
    .await;
    let (result, deltas) = call_streamed(&streaming(&server), &request(json!({}))).await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(deltas.concat(), "Let me add those: one moment.");
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn a_stream_dropped_after_a_delta_fails_without_a_retry() {
    let server = Server::start(vec![
        Reply::stream_then(&streamed_prefix(3), 64, StreamEnd::Drop),
        Reply::stream(&streamed_answer(), 64),
    ])
    .await;
    let provider = streaming(&server);
    let (result, deltas) = call_streamed(&provider, &request(json!({}))).await;
    let e = result.expect_err("the stream broke off");
    assert_eq!(e.kind, ProviderErrorKind::Transport, "{}", e.message);
    assert!(
        e.message
            .starts_with("HTTP 200 OK: the stream broke off after"),
        "{}",
        e.message
    );
    assert!(
        e.message
            .contains("not retried: its text had begun to stream"),
        "{}",
        e.message
    );
    assert!(!e.message.contains(KEY));
    assert_eq!(deltas, ["Let m", "e add"]);
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn a_malformed_chunk_is_an_invalid_response() {
    let body = format!("{}data: {{\"choices\": [\n\n", streamed_prefix(2));
    let server = Server::start(vec![Reply::stream(&body, 64)]).await;
    let (result, deltas) = call_streamed(&streaming(&server), &request(json!({}))).await;
    let e = result.expect_err("a malformed chunk");
    assert_eq!(e.kind, ProviderErrorKind::InvalidResponse);
    assert!(
        e.message
            .starts_with("HTTP 200 OK: invalid provider response: chunk 2 is not JSON"),
        "{}",
        e.message
    );
    assert_eq!(deltas, ["Let m"]);
    assert_eq!(server.requests().len(), 1);
    // A stream that ends without `[DONE]` is cut short too.
    let server = Server::start(vec![Reply::stream(&streamed_prefix(4), 64)]).await;
    let (result, _) = call_streamed(&streaming(&server), &request(json!({}))).await;
    let e = result.expect_err("no [DONE]");
    assert_eq!(e.kind, ProviderErrorKind::InvalidResponse);
    assert!(
        e.message.contains("the stream ended before `data: [DONE]`"),
        "{}",
        e.message
    );
}

#[tokio::test]
async fn a_stalled_stream_times_out_without_a_retry() {
    let server = Server::start(vec![
        Reply::stream_then(&streamed_prefix(2), 64, StreamEnd::Hang),
        Reply::stream(&streamed_answer(), 64),
    ])
    .await;
    let provider = OpenAiProvider::new(
        config(&server)
            .stream(true)
            .request_timeout(Duration::from_millis(300)),
    )
    .unwrap();
    let (result, deltas) = call_streamed(&provider, &request(json!({}))).await;
    let e = result.expect_err("the stream stalled");
    assert_eq!(e.kind, ProviderErrorKind::Timeout);
    assert!(
        e.message
            .starts_with("the stream did not end within the request timeout of 300 ms"),
        "{}",
        e.message
    );
    assert_eq!(deltas, ["Let m"]);
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn a_stall_is_bounded_by_the_run_timeout_and_no_partial_text_reaches_the_context() {
    let server = Server::start(vec![Reply::stream_then(
        &streamed_prefix(3),
        64,
        StreamEnd::Hang,
    )])
    .await;
    let (outcome, events) =
        support::run_agent(&streaming(&server), Duration::from_millis(400)).await;
    let error = outcome.error.as_ref().expect("the run timed out");
    assert_eq!(
        error.kind,
        aplc_vm::RunErrorKind::Timeout,
        "{}",
        error.message
    );
    assert_eq!(support::streamed_texts(&events), ["Let me add"]);
    assert_eq!(outcome.result_text(), "");
}

#[tokio::test]
async fn a_failed_stream_leaves_an_error_and_no_text() {
    let server = Server::start(vec![Reply::stream_then(
        &streamed_prefix(3),
        64,
        StreamEnd::Drop,
    )])
    .await;
    let (outcome, events) = support::run_agent(&streaming(&server), Duration::from_secs(10)).await;
    assert!(outcome.error.is_none());
    assert_eq!(outcome.result_text(), "");
    assert_eq!(
        outcome.last_step_errors.len(),
        1,
        "{:?}",
        outcome.last_step_errors
    );
    assert!(outcome.last_step_errors[0].contains("the stream broke off"));
    assert_eq!(support::streamed_texts(&events), ["Let me add"]);
    let result = events
        .iter()
        .find_map(|e| match &e.kind {
            aplc_vm::EventKind::ProviderResult { error, .. } => error.clone(),
            _ => None,
        })
        .expect("the call's result has its error");
    assert_eq!(result.kind, "transport");
}

#[tokio::test]
async fn a_server_that_does_not_stream_is_read_whole() {
    let server = Server::start(vec![Reply::json(200, whole_answer())]).await;
    let (result, deltas) = call_streamed(&streaming(&server), &request(json!({}))).await;
    let mut completion = result.expect("a whole answer");
    let mut expected = aplc_vm::wire::openai::decode_value(&whole_answer()).unwrap();
    completion.raw = None;
    expected.raw = None;
    assert_eq!(completion, expected);
    assert_eq!(deltas, ["Let me add those: one moment."]);
    assert_eq!(
        server.requests()[0].header("accept"),
        Some("text/event-stream")
    );
}

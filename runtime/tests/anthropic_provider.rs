//! The Anthropic Messages API provider against a scripted HTTP server on 127.0.0.1: the
//! exact request JSON and headers, a tool use round trip, failures and their kinds (401,
//! 429 with `retry-after`, 529 overloaded, malformed bodies, timeouts), and that the key
//! never leaks (spec/providers.md, "Anthropic").

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use aplc_runtime::anthropic::{AnthropicConfig, AnthropicProvider};
use aplc_runtime::driver::{CallContext, DeltaSink, Provider};
use aplc_vm::{
    Completion, Content, FinishReason, Message, Part, ProviderError, ProviderErrorKind,
    ProviderRequest, Role, ToolCall, ToolDefinition,
};
use serde_json::{Value as Json, json};
use support::{Reply, Server, StreamEnd};

/// The API key of every test: it must never appear in an error or in `Debug` output.
const KEY: &str = "sk-ant-test-0123456789abcdef-SECRET";

fn config(server: &Server) -> AnthropicConfig {
    AnthropicConfig::new()
        .base_url(server.base_url())
        .api_key(KEY)
        .request_timeout(Duration::from_secs(2))
        .retry_delays(Duration::from_millis(10), Duration::from_millis(40))
}

fn provider(server: &Server) -> AnthropicProvider {
    AnthropicProvider::new(config(server)).unwrap()
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

fn hello() -> ProviderRequest {
    ProviderRequest::new("claude-test", vec![Message::text(Role::User, "Hello")])
}

/// A Messages API answer with `content` blocks and `stop_reason`.
fn message(content: Json, stop_reason: &str) -> Reply {
    Reply::json(
        200,
        json!({
            "id": "msg_test", "type": "message", "role": "assistant",
            "model": "claude-test-20250101", "content": content,
            "stop_reason": stop_reason, "stop_sequence": null,
            "usage": {"input_tokens": 12, "output_tokens": 7}
        }),
    )
}

fn text_reply(text: &str) -> Reply {
    message(json!([{"type": "text", "text": text}]), "end_turn")
}

/// An Anthropic error body.
fn error_reply(status: u16, kind: &str, text: &str) -> Reply {
    Reply::json(
        status,
        json!({"type": "error", "error": {"type": kind, "message": text}}),
    )
}

/// The error of a failed call; its message must not contain the key.
async fn failure(provider: &AnthropicProvider, request: &ProviderRequest) -> ProviderError {
    let error = provider
        .complete(request, deadline())
        .await
        .expect_err("the call fails");
    assert!(!error.message.contains(KEY), "the key leaked: {error}");
    assert!(
        !format!("{error:?}").contains(KEY),
        "the key leaked: {error:?}"
    );
    error
}

// ---------------------------------------------------------------------------------------
// The request.

#[tokio::test]
async fn the_request_maps_system_tools_images_and_sampling() {
    let server = Server::start(vec![text_reply("Hi!")]).await;
    let mut request = ProviderRequest::new(
        "claude-test",
        vec![
            Message::text(Role::System, "You are terse."),
            Message::new(
                Role::User,
                Content::Parts(vec![
                    Part::Text("What is this?".into()),
                    Part::ImageUrl("https://img.test/cat.png".into()),
                ]),
            ),
            Message::text(Role::Developer, "Answer in French."),
        ],
    );
    request.tools = Arc::from(vec![ToolDefinition::new(
        "lookup",
        "Looks a word up",
        json!({"type": "object", "properties": {"word": {"type": "string"}},
               "required": ["word"]}),
    )]);
    request.sampling.temperature = Some(json!(0.3));
    request.sampling.max_tokens = Some(json!(256));
    request.sampling.top_p = Some(json!(0.8));
    request.sampling.top_k = Some(json!(20));
    request.sampling.stop_sequences = Some(json!(["END"]));
    request.sampling.seed = Some(json!(1));
    request.sampling.frequency_penalty = Some(json!(0.1));
    let completion = provider(&server)
        .complete(&request, deadline())
        .await
        .unwrap();
    assert_eq!(completion.content, [Part::Text("Hi!".into())]);
    assert_eq!(completion.finish_reason, Some(FinishReason::Stop));
    assert_eq!(completion.model.as_deref(), Some("claude-test-20250101"));
    let usage = completion.usage.unwrap();
    assert_eq!(
        Json::Object(usage.fields),
        json!({"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19,
               "input_tokens": 12, "output_tokens": 7})
    );

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let sent = &requests[0];
    assert_eq!(sent.method, "POST");
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.header("x-api-key"), Some(KEY));
    assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(sent.header("content-type"), Some("application/json"));
    assert_eq!(sent.header("authorization"), None);
    assert_eq!(
        String::from_utf8(sent.body.clone()).unwrap(),
        r#"{"model":"claude-test","max_tokens":256,"system":"You are terse.\n\nAnswer in French.","messages":[{"role":"user","content":[{"type":"text","text":"What is this?"},{"type":"image","source":{"type":"url","url":"https://img.test/cat.png"}}]}],"temperature":0.3,"top_p":0.8,"top_k":20,"stop_sequences":["END"],"tools":[{"name":"lookup","description":"Looks a word up","input_schema":{"type":"object","properties":{"word":{"type":"string"}},"required":["word"]}}]}"#
    );
}

#[tokio::test]
async fn a_tool_use_round_trip() {
    let server = Server::start(vec![
        message(
            json!([
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_01", "name": "lookup",
                 "input": {"word": "chat"}}
            ]),
            "tool_use",
        ),
        text_reply("A cat."),
    ])
    .await;
    let provider = provider(&server);
    let mut request = ProviderRequest::new(
        "claude-test",
        vec![Message::text(Role::User, "What is a chat?")],
    );
    request.tools = Arc::from(vec![ToolDefinition::new(
        "lookup",
        "",
        json!({"type": "object"}),
    )]);
    let first = provider.complete(&request, deadline()).await.unwrap();
    assert_eq!(first.content, [Part::Text("Let me look.".into())]);
    assert_eq!(
        first.tool_calls,
        [ToolCall::new("toolu_01", "lookup", json!({"word": "chat"}))]
    );
    assert_eq!(first.finish_reason, Some(FinishReason::ToolCalls));

    // The machine's next request: the assistant's text, then the tool's result as a
    // `tool_result` section, which carries no id and so goes as user text.
    request.messages = Arc::from(vec![
        Message::text(Role::User, "What is a chat?"),
        Message::text(Role::Assistant, "Let me look."),
        Message::text(Role::ToolResult, "chat (fr): cat"),
    ]);
    let second: Completion = provider.complete(&request, deadline()).await.unwrap();
    assert_eq!(second.content, [Part::Text("A cat.".into())]);
    let body = server.requests()[1].json();
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "What is a chat?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}]},
            {"role": "user", "content": [{"type": "text", "text": "chat (fr): cat"}]},
        ])
    );
}

#[tokio::test]
async fn an_unsendable_request_fails_before_sending() {
    let server = Server::start(vec![]).await;
    let request = ProviderRequest::new(
        "claude-test",
        vec![Message::new(
            Role::User,
            Content::Parts(vec![Part::AudioInput("https://a.test/x.wav".into())]),
        )],
    );
    let error = failure(&provider(&server), &request).await;
    assert_eq!(error.kind, ProviderErrorKind::InvalidRequest);
    assert_eq!(
        error.message,
        "message 0 has an audio attachment: Anthropic's Messages API takes no audio input"
    );
    assert!(server.requests().is_empty());
}

// ---------------------------------------------------------------------------------------
// Failures.

#[tokio::test]
async fn unauthorized_is_auth_and_not_retried() {
    let server = Server::start(vec![error_reply(
        401,
        "authentication_error",
        &format!("invalid x-api-key {KEY}"),
    )])
    .await;
    let error = failure(&provider(&server), &hello()).await;
    assert_eq!(error.kind, ProviderErrorKind::Auth);
    assert_eq!(
        error.message,
        format!(
            "HTTP 401 Unauthorized: authentication_error: invalid x-api-key <redacted> \
             (POST {}/v1/messages)",
            server.base_url()
        )
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn rate_limited_is_retried_after_the_retry_after_delay() {
    let server = Server::start(vec![
        error_reply(429, "rate_limit_error", "slow down").header("retry-after", "1"),
        text_reply("ok"),
    ])
    .await;
    let started = Instant::now();
    let completion = provider(&server)
        .complete(&hello(), deadline())
        .await
        .unwrap();
    let waited = started.elapsed();
    assert_eq!(completion.content, [Part::Text("ok".into())]);
    assert!(
        waited >= Duration::from_millis(950),
        "waited only {waited:?}"
    );
    assert!(waited < Duration::from_millis(1900), "waited {waited:?}");
    assert_eq!(server.requests().len(), 2);
    assert_eq!(server.requests()[0].body, server.requests()[1].body);
}

#[tokio::test]
async fn rate_limited_without_retries_left_is_rate_limited() {
    let server = Server::start(vec![error_reply(429, "rate_limit_error", "slow down")]).await;
    let provider = AnthropicProvider::new(config(&server).max_retries(0)).unwrap();
    let error = failure(&provider, &hello()).await;
    assert_eq!(error.kind, ProviderErrorKind::RateLimited);
    assert!(
        error
            .message
            .starts_with("HTTP 429 Too Many Requests: rate_limit_error: slow down (POST "),
        "{error}"
    );
}

#[tokio::test]
async fn overloaded_is_a_server_error_and_is_retried() {
    let server = Server::start(vec![
        error_reply(529, "overloaded_error", "Overloaded"),
        text_reply("ok"),
    ])
    .await;
    let completion = provider(&server)
        .complete(&hello(), deadline())
        .await
        .unwrap();
    assert_eq!(completion.content, [Part::Text("ok".into())]);
    assert_eq!(server.requests().len(), 2);

    let server = Server::start(vec![
        error_reply(529, "overloaded_error", "Overloaded"),
        error_reply(529, "overloaded_error", "Overloaded"),
        error_reply(529, "overloaded_error", "Overloaded"),
    ])
    .await;
    let error = failure(&provider(&server), &hello()).await;
    assert_eq!(error.kind, ProviderErrorKind::Server);
    assert_eq!(
        error.message,
        format!(
            "HTTP 529: overloaded_error: Overloaded (POST {}/v1/messages; gave up after 3 \
             attempts)",
            server.base_url()
        )
    );
}

#[tokio::test]
async fn other_client_errors_are_invalid_requests() {
    let server = Server::start(vec![error_reply(
        400,
        "invalid_request_error",
        "max_tokens: Field required",
    )])
    .await;
    let error = failure(&provider(&server), &hello()).await;
    assert_eq!(error.kind, ProviderErrorKind::InvalidRequest);
    assert!(
        error.message.starts_with(
            "HTTP 400 Bad Request: invalid_request_error: max_tokens: Field required (POST "
        ),
        "{error}"
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn malformed_bodies_are_invalid_responses() {
    let server = Server::start(vec![
        Reply::text(200, "<html>It works!</html>"),
        // An OpenAI chat completion is not an Anthropic message.
        Reply::completion("hi"),
    ])
    .await;
    let provider = provider(&server);
    let error = failure(&provider, &hello()).await;
    assert_eq!(error.kind, ProviderErrorKind::InvalidResponse);
    assert_eq!(
        error.message,
        format!(
            "HTTP 200 OK: the response is not JSON (expected value at line 1 column 1); it \
             begins: <html>It works!</html> (POST {}/v1/messages)",
            server.base_url()
        )
    );
    let error = failure(&provider, &hello()).await;
    assert_eq!(error.kind, ProviderErrorKind::InvalidResponse);
    assert!(
        error.message.starts_with(
            "HTTP 200 OK: the response is not an Anthropic message (no `content` array); it \
             begins: {\"id\":\"chatcmpl-test\""
        ),
        "{error}"
    );
    assert_eq!(server.requests().len(), 2, "broken answers are not retried");
}

#[tokio::test]
async fn timeouts_and_dropped_connections() {
    let server = Server::start(vec![Reply::Close, Reply::Hang]).await;
    let provider = AnthropicProvider::new(
        config(&server)
            .request_timeout(Duration::from_millis(200))
            .max_retries(1),
    )
    .unwrap();
    let error = failure(&provider, &hello()).await;
    assert_eq!(error.kind, ProviderErrorKind::Timeout);
    assert_eq!(
        error.message,
        format!(
            "no response within the request timeout of 200 ms (POST {}/v1/messages; gave \
             up after 2 attempts)",
            server.base_url()
        )
    );
    assert_eq!(
        server.requests().len(),
        2,
        "the dropped connection was retried"
    );
}

#[tokio::test]
async fn the_key_never_appears_in_debug_output() {
    let config = AnthropicConfig::new()
        .base_url("http://127.0.0.1:9")
        .api_key(KEY)
        .header("anthropic-beta", "header-secret-value");
    let provider = AnthropicProvider::new(config.clone()).unwrap();
    for debug in [
        format!("{config:?}"),
        format!("{config:#?}"),
        format!("{provider:?}"),
        format!("{provider:#?}"),
    ] {
        assert!(!debug.contains(KEY), "{debug}");
        assert!(!debug.contains("SECRET"), "{debug}");
        assert!(!debug.contains("header-secret-value"), "{debug}");
    }
    assert_eq!(
        format!("{provider:?}"),
        "AnthropicProvider { endpoint: \"http://127.0.0.1:9/v1/messages\", api_key: \
         Some(<redacted>), api_version: Some(\"2023-06-01\"), headers: [(\"anthropic-beta\", \
         <redacted>)], request_timeout: 60s, max_retries: 2, stream: false, .. }"
    );
}

/// A providers file with `kind: "anthropic"` routes a model to the Anthropic provider,
/// with the key from the environment in `x-api-key`: the route the CLI and embedders use.
#[tokio::test]
async fn a_providers_file_routes_claude_models_to_anthropic() {
    use aplc_runtime::driver::{CallContext, Provider};
    use aplc_runtime::routing::Router;

    let server = Server::start(vec![text_reply("Bonjour")]).await;
    let config = json!({"routes": [
        {"model": "claude-*", "kind": "anthropic", "base_url": server.base_url(),
         "api_key_env": "TEST_ANTHROPIC_KEY", "max_retries": 0},
        {"model": "*", "kind": "mock", "responses": ["the fallback"]},
    ]});
    let env = |name: &str| (name == "TEST_ANTHROPIC_KEY").then(|| KEY.to_string());
    let router = Router::from_config_json(&config.to_string(), &env).unwrap();
    assert!(!format!("{router:?}").contains(KEY));
    let call = CallContext::new(deadline());
    let completion = router.complete(&hello(), &call).await.unwrap();
    assert_eq!(completion.content, [Part::Text("Bonjour".into())]);
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].header("x-api-key"), Some(KEY));
    assert_eq!(requests[0].json()["model"], "claude-test");
}

// ---------------------------------------------------------------------------------------
// Streaming (spec/providers.md, "Streaming").

/// The answer of the streaming tests, whole: text, an `add` tool use, usage.
fn whole_message() -> Json {
    json!({
        "id": "msg_s", "type": "message", "role": "assistant", "model": "claude-stream",
        "content": [
            {"type": "text", "text": "Let me add those: one moment."},
            {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1, "b": 2}},
        ],
        "stop_reason": "tool_use", "stop_sequence": null,
        "usage": {"input_tokens": 11, "output_tokens": 9},
    })
}

/// The same message as the API streams it: text in pieces of 5 characters, the input
/// JSON in pieces of 5.
fn streamed_events() -> Vec<Json> {
    events_of(&whole_message(), 5)
}

fn streaming(server: &Server) -> AnthropicProvider {
    AnthropicProvider::new(config(server).stream(true)).unwrap()
}

/// Calls `provider` with a delta sink: the result and the deltas it sent.
async fn call_streamed(
    provider: &AnthropicProvider,
) -> (Result<Completion, ProviderError>, Vec<String>) {
    let (sink, mut receiver) = DeltaSink::channel(1024);
    let context = CallContext::new(deadline()).with_deltas(sink);
    let result = Provider::complete(provider, &hello(), &context).await;
    let mut deltas = Vec::new();
    while let Ok(text) = receiver.try_recv() {
        deltas.push(text);
    }
    (result, deltas)
}

#[tokio::test]
async fn a_streamed_run_ends_with_the_same_context_and_relays_its_deltas() {
    let server = Server::start(vec![Reply::json(200, whole_message())]).await;
    let (whole, _) = support::run_agent(&provider(&server), Duration::from_secs(10)).await;
    assert!(whole.error.is_none(), "{:?}", whole.error);
    let body = sse_body(&streamed_events());
    let server = Server::start(vec![Reply::stream(&body, 7)]).await;
    let (streamed, events) = support::run_agent(&streaming(&server), Duration::from_secs(10)).await;
    assert_eq!(
        support::final_context(&streamed),
        support::final_context(&whole)
    );
    assert_eq!(
        support::streamed_texts(&events),
        ["Let me add those: one moment."]
    );
    assert_eq!(server.requests()[0].json()["stream"], json!(true));
}

#[tokio::test]
async fn a_streamed_call_assembles_the_whole_message() {
    let server = Server::start(vec![Reply::stream(&sse_body(&streamed_events()), 3)]).await;
    let (result, deltas) = call_streamed(&streaming(&server)).await;
    let completion = result.expect("the stream assembles");
    let expected =
        aplc_vm::wire::anthropic::decode_response(whole_message().to_string().as_bytes()).unwrap();
    assert_eq!(completion, expected);
    assert_eq!(completion.finish_reason, Some(FinishReason::ToolCalls));
    assert_eq!(deltas.len(), 6);
}

#[tokio::test]
async fn an_overloaded_event_before_any_text_is_retried() {
    let events = streamed_events();
    let overloaded = sse_body(&[
        events[0].clone(),
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ]);
    let server = Server::start(vec![
        Reply::stream(&overloaded, 64),
        Reply::stream(&sse_body(&events), 64),
    ])
    .await;
    let (result, deltas) = call_streamed(&streaming(&server)).await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(deltas.concat(), "Let me add those: one moment.");
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn mid_stream_faults_are_final() {
    let events = streamed_events();
    // Dropped after two text deltas (message_start, block start, ping, two deltas).
    let server = Server::start(vec![
        Reply::stream_then(&sse_body(&events[..5]), 64, StreamEnd::Drop),
        Reply::stream(&sse_body(&events), 64),
    ])
    .await;
    let (result, deltas) = call_streamed(&streaming(&server)).await;
    let e = result.expect_err("the stream broke off");
    assert_eq!(e.kind, ProviderErrorKind::Transport, "{}", e.message);
    assert!(
        e.message
            .contains("not retried: its text had begun to stream"),
        "{}",
        e.message
    );
    assert!(!e.message.contains(KEY));
    assert_eq!(deltas, ["Let m", "e add"]);
    assert_eq!(server.requests().len(), 1);
    // An error event after text.
    let mut cut = events[..5].to_vec();
    cut.push(json!({"type": "error", "error": {"type": "api_error", "message": "boom"}}));
    let server = Server::start(vec![Reply::stream(&sse_body(&cut), 64)]).await;
    let e = call_streamed(&streaming(&server))
        .await
        .0
        .expect_err("an error event");
    assert_eq!(e.kind, ProviderErrorKind::Server);
    assert!(
        e.message
            .starts_with("HTTP 200 OK: the stream reported an error: api_error: boom"),
        "{}",
        e.message
    );
    assert_eq!(server.requests().len(), 1);
    // A malformed event, and a stream without `message_stop`.
    let body = format!(
        "{}event: content_block_delta\ndata: {{oops\n\n",
        sse_body(&events[..4])
    );
    let server = Server::start(vec![Reply::stream(&body, 64)]).await;
    let e = call_streamed(&streaming(&server))
        .await
        .0
        .expect_err("malformed");
    assert_eq!(e.kind, ProviderErrorKind::InvalidResponse);
    assert!(
        e.message.contains("an event of the stream is not JSON"),
        "{}",
        e.message
    );
    let server = Server::start(vec![Reply::stream(
        &sse_body(&events[..events.len() - 1]),
        64,
    )])
    .await;
    let e = call_streamed(&streaming(&server))
        .await
        .0
        .expect_err("no message_stop");
    assert_eq!(e.kind, ProviderErrorKind::InvalidResponse);
    assert!(
        e.message.contains("the stream ended before `message_stop`"),
        "{}",
        e.message
    );
    // A stall, bounded by the run's timeout; the machine never sees the partial text.
    let server = Server::start(vec![Reply::stream_then(
        &sse_body(&events[..5]),
        64,
        StreamEnd::Hang,
    )])
    .await;
    let (outcome, run_events) =
        support::run_agent(&streaming(&server), Duration::from_millis(400)).await;
    let error = outcome.error.as_ref().expect("the run timed out");
    assert_eq!(
        error.kind,
        aplc_vm::RunErrorKind::Timeout,
        "{}",
        error.message
    );
    assert_eq!(support::streamed_texts(&run_events), ["Let me add"]);
    assert_eq!(outcome.result_text(), "");
}

/// A stream of `events`: one `event:`/`data:` pair each.
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

#[tokio::test]
async fn a_server_that_does_not_stream_is_read_whole() {
    let server = Server::start(vec![
        Reply::json(200, whole_message()),
        Reply::json(
            200,
            json!({"type": "error", "error": {"type": "x", "message": "nope"}}),
        ),
    ])
    .await;
    let provider = streaming(&server);
    let (result, deltas) = call_streamed(&provider).await;
    assert_eq!(result.expect("a whole answer").tool_calls.len(), 1);
    assert_eq!(deltas, ["Let me add those: one moment."]);
    let e = call_streamed(&provider).await.0.expect_err("an error body");
    assert_eq!(e.kind, ProviderErrorKind::InvalidResponse);
    assert!(
        e.message
            .starts_with("HTTP 200 OK: the response is an error: x: nope"),
        "{}",
        e.message
    );
}

//! The OpenAI Chat Completions provider.
//!
//! [`OpenAiProvider`] encodes a [`ProviderRequest`] with `aplc_vm::wire::openai`, posts it
//! to `{base_url}/v1/chat/completions` with reqwest over rustls (on `ring`), and decodes
//! the answer into a [`Completion`] with the same module. Failures become [`ProviderError`]s that name the
//! HTTP status and the API's own message; 429s, 5xx and connection failures are retried
//! with exponential backoff and jitter, honouring `Retry-After`, and never past the run's
//! deadline. `spec/providers.md` is the specification: the request mapping, the error
//! texts and the retry rules.
//!
//! This module adds only auth and the endpoint: the request and response JSON are the
//! sans-IO core's (`aplc_vm::wire::openai`), and sending, retrying and redacting are
//! [`crate::transport`]'s, shared with the Anthropic provider. With
//! [`OpenAiConfig::stream`], the answer is streamed (`spec/providers.md`, "Streaming"):
//! the core's `ChunkAssembler` turns the chunks into text deltas and the same
//! completion. Not in here: reading API
//! keys from the environment (the CLI and [`crate::routing`] do that), and choosing a
//! provider by model name ([`crate::routing::Router`]).

use std::fmt;
use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header;
use serde_json::Value as Json;

use crate::future::BoxFuture;
pub use crate::http::ConfigError;
use crate::http::HttpClient;
use crate::provider::{CallContext, Provider};
use crate::redact::Redactor;
use crate::transport::{
    self, EXCERPT_CHARS, KeyHeader, MANAGED_HEADERS, Redacted, RedactedHeaders, Retries, Transport,
    excerpt, printable_url, status_text,
};
use aplc_vm::text::json_kind as kind;
use aplc_vm::wire;
use aplc_vm::wire::openai::ChunkAssembler;
use aplc_vm::{Completion, ProviderError, ProviderErrorKind, ProviderRequest};

/// Where requests go when no base URL is configured (§6.1 `base_url`).
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com";
/// How long one HTTP request may take, unless configured otherwise. The run's deadline
/// caps it further.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How many times a failed request is retried (so at most three attempts in all).
pub const DEFAULT_MAX_RETRIES: u32 = 2;
/// The first backoff delay; each further retry doubles it.
pub const DEFAULT_RETRY_BASE_DELAY: Duration = Duration::from_millis(500);
/// The longest backoff delay. A server's `Retry-After` is honoured beyond it, as long as
/// the run's deadline allows.
pub const DEFAULT_RETRY_MAX_DELAY: Duration = Duration::from_secs(8);

/// How an [`OpenAiProvider`] reaches its server: the builder for
/// [`OpenAiProvider::new`].
///
/// The API key and the header values are secrets: `Debug` prints them as `<redacted>`,
/// and no error message contains them.
#[derive(Clone)]
pub struct OpenAiConfig {
    base_url: String,
    api_key: Option<String>,
    headers: Vec<(String, String)>,
    request_timeout: Duration,
    max_retries: u32,
    retry_base_delay: Duration,
    retry_max_delay: Duration,
    client: Option<HttpClient>,
    stream: bool,
}

impl Default for OpenAiConfig {
    fn default() -> Self {
        OpenAiConfig {
            base_url: DEFAULT_BASE_URL.to_owned(),
            api_key: None,
            headers: Vec::new(),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_retries: DEFAULT_MAX_RETRIES,
            retry_base_delay: DEFAULT_RETRY_BASE_DELAY,
            retry_max_delay: DEFAULT_RETRY_MAX_DELAY,
            client: None,
            stream: false,
        }
    }
}

impl OpenAiConfig {
    /// The defaults: `https://api.openai.com`, no key, 60 s per request, 2 retries.
    pub fn new() -> OpenAiConfig {
        OpenAiConfig::default()
    }

    /// The server's base URL, e.g. `http://localhost:8080`. A URL that already ends in
    /// `/v1` is not given a second one.
    pub fn base_url(mut self, url: impl Into<String>) -> OpenAiConfig {
        self.base_url = url.into();
        self
    }

    /// The API key, sent as `Authorization: Bearer <key>`. Surrounding whitespace (a
    /// trailing newline from a file or a shell) is trimmed.
    pub fn api_key(mut self, key: impl Into<String>) -> OpenAiConfig {
        self.api_key = Some(key.into());
        self
    }

    /// An extra header sent with every request (`OpenAI-Organization`, or `api-key` for
    /// servers that take the key there). Its value is treated as a secret.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> OpenAiConfig {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// How long one HTTP request may take, from sending to the last byte of the body.
    pub fn request_timeout(mut self, timeout: Duration) -> OpenAiConfig {
        self.request_timeout = timeout;
        self
    }

    /// How many times a retryable failure is retried (0 turns retries off).
    pub fn max_retries(mut self, retries: u32) -> OpenAiConfig {
        self.max_retries = retries;
        self
    }

    /// The HTTP client to send with, so that a provider shares its connections (and its
    /// rules) with the rest of the process. Without one, [`HttpClient::new`] builds one.
    pub fn http_client(mut self, client: HttpClient) -> OpenAiConfig {
        self.client = Some(client);
        self
    }

    /// The backoff: the first delay and the longest one (before jitter).
    pub fn retry_delays(mut self, base: Duration, max: Duration) -> OpenAiConfig {
        self.retry_base_delay = base;
        self.retry_max_delay = max;
        self
    }

    /// Streams each answer (`"stream": true`), sending its text to the call's delta
    /// sink as it arrives; the completion is the same as without (`spec/providers.md`,
    /// "Streaming"). Off by default.
    pub fn stream(mut self, stream: bool) -> OpenAiConfig {
        self.stream = stream;
        self
    }
}

impl fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("base_url", &printable_url(&self.base_url))
            .field("api_key", &self.api_key.as_ref().map(|_| Redacted))
            .field("headers", &RedactedHeaders(&self.headers))
            .field("request_timeout", &self.request_timeout)
            .field("max_retries", &self.max_retries)
            .field("retry_base_delay", &self.retry_base_delay)
            .field("retry_max_delay", &self.retry_max_delay)
            .field("stream", &self.stream)
            .finish()
    }
}

/// A provider for any server that speaks the OpenAI Chat Completions API: OpenAI,
/// llama.cpp's `llama-server`, vLLM, Ollama, LiteLLM, …
///
/// Cloning is cheap and shares the connection pool.
#[derive(Clone)]
pub struct OpenAiProvider {
    /// The endpoint, the headers (the key among them), the retry rules and the
    /// redactor that scrubs every error message.
    transport: Transport,
    stream: bool,
}

impl OpenAiProvider {
    /// Checks `config` and builds the HTTP client.
    ///
    /// Errors name what is wrong (a bad URL, a header that is not valid HTTP) without
    /// repeating a secret.
    pub fn new(config: OpenAiConfig) -> Result<OpenAiProvider, ConfigError> {
        let endpoint = transport::endpoint(&config.base_url, "chat/completions")?;
        if config.request_timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout);
        }
        let key_header = KeyHeader {
            name: header::AUTHORIZATION,
            shown: "Authorization",
            prefix: "Bearer ",
        };
        let (headers, secrets) = transport::request_headers(
            &config.headers,
            &[],
            &key_header,
            config.api_key.as_deref(),
        )?;
        // The shared client follows a same-origin 307 or 308 only: any other redirect
        // comes back as a 3xx, reported by the transport as a configuration error.
        let client = match config.client {
            Some(client) => client,
            None => HttpClient::new()?,
        };
        let retries = Retries {
            request_timeout: config.request_timeout,
            max_retries: config.max_retries,
            base_delay: config.retry_base_delay,
            max_delay: config.retry_max_delay,
        };
        Ok(OpenAiProvider {
            transport: Transport::new(client, endpoint, headers, &secrets, retries, error_message),
            stream: config.stream,
        })
    }

    /// The URL requests are posted to (`…/v1/chat/completions`).
    pub fn endpoint(&self) -> &str {
        self.transport.endpoint().as_str()
    }

    /// Sends `body` and reads the 2xx answer as a chat completion.
    async fn send(
        &self,
        body: Vec<u8>,
        deadline: std::time::Instant,
    ) -> Result<Completion, ProviderError> {
        let delivered = self.transport.send(body, deadline).await?;
        let json = completion(delivered.status, &delivered.body, self.transport.redactor())
            .map_err(|message| self.transport.invalid_response(&delivered, message))?;
        // A JSON body with `choices` that is still not a completion is the model's
        // answer, not the transport's: its message is the machine's usual one (§2.2.5).
        wire::openai::decode_value(&json)
            .map_err(|e| ProviderError::new(e.kind, self.redact(e.message)))
    }

    /// A whole 2xx body where a stream was asked for; errors as [`Self::send`]'s (the
    /// transport adds the trailer and redacts).
    fn whole(&self, status: StatusCode, body: &[u8]) -> Result<Completion, ProviderError> {
        let json = completion(status, body, self.transport.redactor())
            .map_err(|message| ProviderError::new(ProviderErrorKind::InvalidResponse, message))?;
        wire::openai::decode_value(&json)
    }

    /// Replaces every run of a secret in `message` with `<redacted>`: a server may echo
    /// a header back in an error body, whole, cut or in another case.
    fn redact(&self, message: String) -> String {
        self.transport.redact(message)
    }
}

impl Provider for OpenAiProvider {
    fn complete<'a>(
        &'a self,
        request: &'a ProviderRequest,
        call: &'a CallContext,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        Box::pin(async move {
            if self.stream {
                let body = wire::openai::encode_streaming_request(request)
                    .map_err(|e| ProviderError::new(e.kind, self.redact(e.message)))?;
                let deltas = call.deltas.as_ref();
                let whole = |status, body: &[u8]| self.whole(status, body);
                return self
                    .transport
                    .stream(body, call.deadline, ChunkAssembler::new, &whole, deltas)
                    .await;
            }
            let body = wire::openai::encode_request(request)
                .map_err(|e| ProviderError::new(e.kind, self.redact(e.message)))?;
            self.send(body, call.deadline).await
        })
    }

    fn provider_name(&self, _model: &str) -> Option<&'static str> {
        Some("openai")
    }
}

impl fmt::Debug for OpenAiProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers = self.transport.headers();
        let custom: Vec<_> = headers
            .keys()
            .filter(|name| !MANAGED_HEADERS.contains(name) && **name != header::AUTHORIZATION)
            .map(|name| (name.as_str(), Redacted))
            .collect();
        let retries = self.transport.retries();
        f.debug_struct("OpenAiProvider")
            .field("endpoint", &self.endpoint())
            .field(
                "api_key",
                &headers
                    .contains_key(header::AUTHORIZATION)
                    .then_some(Redacted),
            )
            .field("headers", &custom)
            .field("request_timeout", &retries.request_timeout)
            .field("max_retries", &retries.max_retries)
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

// ---------------------------------------------------------------------------------------
// Responses.

/// A 2xx body: the parsed completion, or why it is not one.
fn completion(status: StatusCode, body: &[u8], redactor: &Redactor) -> Result<Json, String> {
    let status = status_text(status);
    let excerpt = |body| excerpt(body, redactor);
    let json: Json = serde_json::from_slice(body).map_err(|e| {
        format!(
            "{status}: the response is not JSON ({e}); it begins: {}",
            excerpt(body)
        )
    })?;
    match json.get("choices") {
        Some(Json::Array(_)) => Ok(json),
        Some(other) => Err(format!(
            "{status}: the response is not a chat completion (`choices` is {}): {}",
            kind(other),
            excerpt(body)
        )),
        None if error_message(&json, redactor).is_some() => Err(format!(
            "{status}: the response has no `choices`: {}",
            error_message(&json, redactor).unwrap_or_default()
        )),
        None => Err(format!(
            "{status}: the response is not a chat completion (no `choices`): {}",
            excerpt(body)
        )),
    }
}

/// `error.message` (OpenAI, llama.cpp, vLLM), `error` as a string (Ollama), or a
/// top-level `message` or `detail`.
fn error_message(json: &Json, redactor: &Redactor) -> Option<String> {
    let text = match json.get("error") {
        Some(Json::Object(error)) => error.get("message").and_then(Json::as_str),
        Some(Json::String(message)) => Some(message.as_str()),
        _ => None,
    }
    .or_else(|| json.get("message").and_then(Json::as_str))
    .or_else(|| json.get("detail").and_then(Json::as_str))?;
    Some(redactor.clip(text, EXCERPT_CHARS))
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn bad_configuration_is_rejected_without_secrets() {
        let key = "sk-very-secret-key-0123456789";
        let e = OpenAiProvider::new(OpenAiConfig::new().api_key(format!("{key}\nX: y")))
            .unwrap_err()
            .to_string();
        assert!(!e.contains(key), "{e}");
        let e = OpenAiProvider::new(OpenAiConfig::new().header("api-key", format!("{key}\r\n")))
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert!(e.is_ok(), "surrounding whitespace is trimmed: {e:?}");
        let e = OpenAiProvider::new(OpenAiConfig::new().header("x-key", format!("a\n{key}")))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "the value of header `x-key` is not a valid HTTP header value"
        );
        let e = OpenAiProvider::new(OpenAiConfig::new().header("bad header", "v"))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "`bad header` is not a valid HTTP header name");
        let e = OpenAiProvider::new(OpenAiConfig::new().header("Content-Type", "text/plain"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "header `content-type` is set by the provider and cannot be configured"
        );
        let e = OpenAiProvider::new(
            OpenAiConfig::new()
                .api_key(key)
                .header("Authorization", "Bearer other-secret"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("both an API key and an `Authorization` header"),
            "{e}"
        );
        assert_eq!(
            OpenAiProvider::new(OpenAiConfig::new().api_key("  "))
                .unwrap_err()
                .to_string(),
            "the API key is empty"
        );
        assert_eq!(
            OpenAiProvider::new(OpenAiConfig::new().request_timeout(Duration::ZERO))
                .unwrap_err()
                .to_string(),
            "the request timeout must be greater than zero"
        );
    }

    #[test]
    fn error_bodies() {
        let redactor = Redactor::default();
        let message = |body: &str| {
            serde_json::from_str::<Json>(body)
                .ok()
                .and_then(|json| error_message(&json, &redactor))
                .unwrap_or_else(|| excerpt(body.as_bytes(), &redactor))
        };
        assert_eq!(
            message(r#"{"error": {"message": "bad key", "type": "x"}}"#),
            "bad key"
        );
        assert_eq!(
            message(r#"{"error": "model not found"}"#),
            "model not found"
        );
        assert_eq!(
            message(r#"{"object": "error", "message": "vllm says"}"#),
            "vllm says"
        );
        assert_eq!(message("upstream\nconnect error"), "upstream connect error");
        assert_eq!(message(""), "(empty body)");
        let long = "x".repeat(500);
        assert_eq!(message(&long), format!("{}…", "x".repeat(EXCERPT_CHARS)));
    }

    #[test]
    fn redaction_replaces_every_secret() {
        let provider = OpenAiProvider::new(
            OpenAiConfig::new()
                .api_key("sk-abcdefgh12345678")
                .header("x-extra", "extra-secret-value")
                .header("x-short", "1"),
        )
        .unwrap();
        assert_eq!(
            provider.redact("a sk-abcdefgh12345678 b extra-secret-value c 1".into()),
            "a <redacted> b <redacted> c 1"
        );
    }
}

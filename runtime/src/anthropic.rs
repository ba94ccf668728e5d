//! The Anthropic Messages API provider, so Claude models work without a proxy.
//!
//! [`AnthropicProvider`] encodes a typed [`ProviderRequest`] with
//! [`aplc_vm::wire::anthropic`], posts it to `{base_url}/v1/messages` with the
//! `x-api-key` and `anthropic-version` headers through the shared [`crate::transport`]
//! (the same retries, deadline, error texts and redaction as the OpenAI provider), and
//! decodes the answer into a [`Completion`]. `spec/providers.md` ("Anthropic") is the
//! specification.
//!
//! Not in here: the mapping itself (pure, in the core), reading the key from the
//! environment ([`crate::routing`] and the CLI do that). With
//! [`AnthropicConfig::stream`] the answer is streamed (`spec/providers.md`, "Streaming").

use std::fmt;
use std::time::{Duration, Instant};

use aplc_vm::wire::anthropic as wire;
use aplc_vm::{Completion, ProviderError, ProviderRequest};
use reqwest::StatusCode;
use reqwest::header::{HeaderName, HeaderValue};
use serde_json::Value as Json;

use crate::future::BoxFuture;
use crate::http::HttpClient;
use crate::openai::{
    ConfigError, DEFAULT_MAX_RETRIES, DEFAULT_REQUEST_TIMEOUT, DEFAULT_RETRY_BASE_DELAY,
    DEFAULT_RETRY_MAX_DELAY,
};
use crate::provider::{CallContext, Provider};
use crate::redact::Redactor;
use crate::transport::{
    self, EXCERPT_CHARS, KeyHeader, Redacted, RedactedHeaders, Retries, Transport, excerpt,
    printable_url, status_text,
};

/// Where requests go when no base URL is configured.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The `anthropic-version` header sent unless configured otherwise.
pub const DEFAULT_API_VERSION: &str = "2023-06-01";

/// The header that carries the key.
const API_KEY_HEADER: HeaderName = HeaderName::from_static("x-api-key");
/// The header that names the API version; set with [`AnthropicConfig::api_version`].
const VERSION_HEADER: HeaderName = HeaderName::from_static("anthropic-version");

/// How an [`AnthropicProvider`] reaches its server: the builder for
/// [`AnthropicProvider::new`], shaped like [`crate::openai::OpenAiConfig`].
///
/// The API key and the header values are secrets: `Debug` prints them as `<redacted>`,
/// and no error message contains them.
#[derive(Clone)]
pub struct AnthropicConfig {
    base_url: String,
    api_key: Option<String>,
    api_version: String,
    headers: Vec<(String, String)>,
    request_timeout: Duration,
    max_retries: u32,
    retry_base_delay: Duration,
    retry_max_delay: Duration,
    client: Option<HttpClient>,
    stream: bool,
}

impl Default for AnthropicConfig {
    fn default() -> Self {
        AnthropicConfig {
            base_url: DEFAULT_BASE_URL.to_owned(),
            api_key: None,
            api_version: DEFAULT_API_VERSION.to_owned(),
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

impl AnthropicConfig {
    /// The defaults: `https://api.anthropic.com`, no key, version `2023-06-01`, 60 s per
    /// request, 2 retries.
    pub fn new() -> AnthropicConfig {
        AnthropicConfig::default()
    }

    /// The server's base URL. A URL that already ends in `/v1` is not given a second one.
    pub fn base_url(mut self, url: impl Into<String>) -> AnthropicConfig {
        self.base_url = url.into();
        self
    }

    /// The API key, sent as `x-api-key`. Surrounding whitespace is trimmed.
    pub fn api_key(mut self, key: impl Into<String>) -> AnthropicConfig {
        self.api_key = Some(key.into());
        self
    }

    /// The `anthropic-version` header (default `2023-06-01`).
    pub fn api_version(mut self, version: impl Into<String>) -> AnthropicConfig {
        self.api_version = version.into();
        self
    }

    /// An extra header sent with every request (`anthropic-beta`, or `Authorization` for
    /// a gateway). Its value is treated as a secret.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> AnthropicConfig {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// How long one HTTP request may take, from sending to the last byte of the body.
    pub fn request_timeout(mut self, timeout: Duration) -> AnthropicConfig {
        self.request_timeout = timeout;
        self
    }

    /// How many times a retryable failure is retried (0 turns retries off).
    pub fn max_retries(mut self, retries: u32) -> AnthropicConfig {
        self.max_retries = retries;
        self
    }

    /// The HTTP client to send with, shared with the rest of the process. Without one,
    /// [`HttpClient::new`] builds one.
    pub fn http_client(mut self, client: HttpClient) -> AnthropicConfig {
        self.client = Some(client);
        self
    }

    /// The backoff: the first delay and the longest one (before jitter).
    pub fn retry_delays(mut self, base: Duration, max: Duration) -> AnthropicConfig {
        self.retry_base_delay = base;
        self.retry_max_delay = max;
        self
    }

    /// Streams each answer (`"stream": true`), sending its text to the call's delta
    /// sink as it arrives; the completion is the same as without (`spec/providers.md`,
    /// "Streaming"). Off by default.
    pub fn stream(mut self, stream: bool) -> AnthropicConfig {
        self.stream = stream;
        self
    }
}

impl fmt::Debug for AnthropicConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnthropicConfig")
            .field("base_url", &printable_url(&self.base_url))
            .field("api_key", &self.api_key.as_ref().map(|_| Redacted))
            .field("api_version", &self.api_version)
            .field("headers", &RedactedHeaders(&self.headers))
            .field("request_timeout", &self.request_timeout)
            .field("max_retries", &self.max_retries)
            .field("retry_base_delay", &self.retry_base_delay)
            .field("retry_max_delay", &self.retry_max_delay)
            .field("stream", &self.stream)
            .finish()
    }
}

/// A provider for the Anthropic Messages API.
///
/// Cloning is cheap and shares the connection pool.
#[derive(Clone)]
pub struct AnthropicProvider {
    /// The endpoint, the headers (the key among them), the retry rules and the
    /// redactor that scrubs every error message.
    transport: Transport,
    /// Custom header names, for `Debug`.
    custom_headers: Vec<String>,
    stream: bool,
}

impl AnthropicProvider {
    /// Checks `config` and builds the HTTP client.
    ///
    /// Errors name what is wrong (a bad URL, a header that is not valid HTTP) without
    /// repeating a secret.
    pub fn new(config: AnthropicConfig) -> Result<AnthropicProvider, ConfigError> {
        let endpoint = transport::endpoint(&config.base_url, "messages")?;
        if config.request_timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout);
        }
        let key_header = KeyHeader {
            name: API_KEY_HEADER,
            shown: "x-api-key",
            prefix: "",
        };
        let (mut headers, secrets) = transport::request_headers(
            &config.headers,
            &[VERSION_HEADER],
            &key_header,
            config.api_key.as_deref(),
        )?;
        let version = HeaderValue::from_str(config.api_version.trim())
            .map_err(|_| ConfigError::ApiVersion)?;
        headers.insert(VERSION_HEADER, version);
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
        Ok(AnthropicProvider {
            transport: Transport::new(client, endpoint, headers, &secrets, retries, api_message),
            custom_headers: config.headers.iter().map(|(n, _)| n.clone()).collect(),
            stream: config.stream,
        })
    }

    /// The URL requests are posted to (`…/v1/messages`).
    pub fn endpoint(&self) -> &str {
        self.transport.endpoint().as_str()
    }

    /// Makes one call: encodes `request`, sends it (retrying as `spec/providers.md` §4
    /// says, never past `deadline`) and decodes the answer.
    pub async fn complete(
        &self,
        request: &ProviderRequest,
        deadline: Instant,
    ) -> Result<Completion, ProviderError> {
        self.call(request, &CallContext::new(deadline)).await
    }

    /// [`AnthropicProvider::complete`] with the driver's call context: streamed (the
    /// text to `call.deltas`) if the provider is configured to.
    async fn call(
        &self,
        request: &ProviderRequest,
        call: &CallContext,
    ) -> Result<Completion, ProviderError> {
        let deadline = call.deadline;
        if self.stream {
            let body = wire::encode_streaming_request(request)
                .map_err(|e| ProviderError::new(e.kind, self.transport.redact(e.message)))?;
            let deltas = call.deltas.as_ref();
            let whole = |status, body: &[u8]| self.whole(status, body);
            return self
                .transport
                .stream(body, deadline, wire::EventAssembler::new, &whole, deltas)
                .await;
        }
        let body = wire::encode_request(request)
            .map_err(|e| ProviderError::new(e.kind, self.transport.redact(e.message)))?;
        let delivered = self.transport.send(body, deadline).await?;
        self.whole(delivered.status, &delivered.body)
            .map_err(|e| self.transport.invalid_response(&delivered, e.message))
    }

    /// Decodes a whole 2xx body; an error names the status and quotes the body's start
    /// (redacted).
    fn whole(&self, status: StatusCode, body: &[u8]) -> Result<Completion, ProviderError> {
        wire::decode_response(body).map_err(|e| {
            let message = format!(
                "{}: {}; it begins: {}",
                status_text(status),
                e.message,
                excerpt(body, self.transport.redactor())
            );
            ProviderError::new(e.kind, message)
        })
    }
}

impl fmt::Debug for AnthropicProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers = self.transport.headers();
        let custom: Vec<_> = self
            .custom_headers
            .iter()
            .map(|name| (name.as_str(), Redacted))
            .collect();
        let retries = self.transport.retries();
        f.debug_struct("AnthropicProvider")
            .field("endpoint", &self.endpoint())
            .field(
                "api_key",
                &headers.contains_key(API_KEY_HEADER).then_some(Redacted),
            )
            .field("api_version", &headers.get(VERSION_HEADER))
            .field("headers", &custom)
            .field("request_timeout", &retries.request_timeout)
            .field("max_retries", &retries.max_retries)
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

/// The API's message from an error body (`{"type": "error", "error": {"type",
/// "message"}}`), redacted, then cut.
fn api_message(json: &Json, redactor: &Redactor) -> Option<String> {
    wire::error_message(json).map(|message| redactor.clip(&message, EXCERPT_CHARS))
}

impl Provider for AnthropicProvider {
    fn complete<'a>(
        &'a self,
        request: &'a ProviderRequest,
        call: &'a CallContext,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        Box::pin(self.call(request, call))
    }

    fn provider_name(&self, _model: &str) -> Option<&'static str> {
        Some("anthropic")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_and_defaults() {
        let provider = AnthropicProvider::new(AnthropicConfig::new()).unwrap();
        assert_eq!(provider.endpoint(), "https://api.anthropic.com/v1/messages");
        let provider =
            AnthropicProvider::new(AnthropicConfig::new().base_url("http://h:1/v1/")).unwrap();
        assert_eq!(provider.endpoint(), "http://h:1/v1/messages");
    }

    #[test]
    fn bad_configuration_is_rejected_without_secrets() {
        let key = "sk-ant-very-secret-0123456789";
        let e = AnthropicProvider::new(AnthropicConfig::new().api_key(format!("{key}\nX: y")))
            .unwrap_err()
            .to_string();
        assert!(!e.contains(key), "{e}");
        let e = AnthropicProvider::new(
            AnthropicConfig::new()
                .api_key(key)
                .header("x-api-key", "other"),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "both an API key and an `x-api-key` header are configured: use one of them"
        );
        let e = AnthropicProvider::new(AnthropicConfig::new().header("anthropic-version", "1"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "header `anthropic-version` is set by the provider and cannot be configured"
        );
        let e = AnthropicProvider::new(AnthropicConfig::new().api_version("a\nb"))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "the API version is not a valid HTTP header value");
    }
}

//! The OpenAI Chat Completions provider.
//!
//! [`OpenAiProvider`] encodes a [`ProviderRequest`] with the pure wire format
//! ([`aplc_vm::wire::openai`]), sends it as `POST {base_url}/v1/chat/completions` with
//! reqwest over rustls (on `ring`), and decodes the body into a [`Completion`] with the
//! same module. Failures become [`ProviderError`]s that name the
//! HTTP status and the API's own message; 429s, 5xx and connection failures are retried
//! with exponential backoff and jitter, honouring `Retry-After`, and never past the run's
//! deadline. `spec/providers.md` is the specification: the request mapping, the error
//! texts and the retry rules.
//!
//! This module adds only transport, retries and auth: it reads the clock, sleeps and uses
//! the network, which is why it lives in `aplc-runtime` and not in the sans-IO core. Not in
//! here: the request and response JSON (`aplc_vm::wire::openai`), streaming (the machine
//! consumes whole responses),
//! reading API keys from the environment (the CLI and [`crate::routing`] do that), and
//! choosing a provider by model name ([`crate::routing::Router`]).

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::header::{self, HeaderMap, HeaderName, HeaderValue};
use reqwest::{StatusCode, Url};
use serde_json::Value as Json;

use crate::driver::{BoxFuture, CallContext, Provider};
use crate::http::{self, BodyError, HttpClient, MAX_BODY_BYTES};
use crate::redact::{REDACTED, Redactor};
use aplc_vm::text::json_kind as kind;
use aplc_vm::wire;
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
            .finish()
    }
}

/// A provider for any server that speaks the OpenAI Chat Completions API: OpenAI,
/// llama.cpp's `llama-server`, vLLM, Ollama, LiteLLM, …
///
/// Cloning is cheap and shares the connection pool.
#[derive(Clone)]
pub struct OpenAiProvider {
    client: HttpClient,
    endpoint: Url,
    headers: HeaderMap,
    /// Scrubs the key and header values from every error message.
    redactor: Redactor,
    request_timeout: Duration,
    max_retries: u32,
    retry_base_delay: Duration,
    retry_max_delay: Duration,
}

impl OpenAiProvider {
    /// Checks `config` and builds the HTTP client.
    ///
    /// Errors name what is wrong (a bad URL, a header that is not valid HTTP) without
    /// repeating a secret.
    pub fn new(config: OpenAiConfig) -> Result<OpenAiProvider, String> {
        let endpoint = endpoint(&config.base_url)?;
        if config.request_timeout.is_zero() {
            return Err("the request timeout must be greater than zero".into());
        }
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        let mut secrets: Vec<&str> = Vec::new();
        for (name, value) in &config.headers {
            let header_name = HeaderName::from_bytes(name.trim().as_bytes())
                .map_err(|_| format!("`{name}` is not a valid HTTP header name"))?;
            if MANAGED_HEADERS.contains(&header_name) {
                return Err(format!(
                    "header `{header_name}` is set by the provider and cannot be configured"
                ));
            }
            if header_name == header::AUTHORIZATION && config.api_key.is_some() {
                return Err(
                    "both an API key and an `Authorization` header are configured: \
                            use one of them"
                        .into(),
                );
            }
            let mut header_value = HeaderValue::from_str(value.trim()).map_err(|_| {
                format!("the value of header `{header_name}` is not a valid HTTP header value")
            })?;
            header_value.set_sensitive(true);
            headers.append(header_name, header_value);
            secrets.push(value.trim());
        }
        if let Some(key) = &config.api_key {
            let key = key.trim();
            if key.is_empty() {
                return Err("the API key is empty".into());
            }
            let mut value = HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| {
                "the API key is not a valid HTTP header value (it holds a line break or \
                 another control character)"
                    .to_string()
            })?;
            value.set_sensitive(true);
            headers.insert(header::AUTHORIZATION, value);
            secrets.push(key);
        }
        // The shared client follows a same-origin 307 or 308 only: any other redirect
        // comes back as a 3xx, reported below as a configuration error.
        let client = match config.client {
            Some(client) => client,
            None => HttpClient::new()?,
        };
        Ok(OpenAiProvider {
            client,
            endpoint,
            headers,
            redactor: Redactor::new(secrets),
            request_timeout: config.request_timeout,
            max_retries: config.max_retries,
            retry_base_delay: config.retry_base_delay,
            retry_max_delay: config.retry_max_delay.max(config.retry_base_delay),
        })
    }

    /// The URL requests are posted to (`…/v1/chat/completions`).
    pub fn endpoint(&self) -> &str {
        self.endpoint.as_str()
    }

    /// Sends `body` until it succeeds, fails for good, runs out of retries or would pass
    /// `deadline`.
    async fn send(&self, body: Vec<u8>, deadline: std::time::Instant) -> Result<Json, String> {
        let deadline = tokio::time::Instant::from_std(deadline);
        let mut attempts = 0u32;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(self.gave_up(
                    "the run's deadline passed before the request was sent".into(),
                    attempts,
                    None,
                ));
            }
            attempts += 1;
            let limit = self.request_timeout.min(left);
            let failure = match tokio::time::timeout(limit, self.attempt(body.clone())).await {
                Ok(Ok(response)) => return Ok(response),
                Ok(Err(failure)) => failure,
                Err(_) if limit < self.request_timeout => Failure {
                    // Nothing is left to retry with.
                    message: format!(
                        "no response before the run's deadline ({} ms)",
                        millis(limit)
                    ),
                    retry: false,
                    retry_after: None,
                },
                Err(_) => Failure {
                    message: format!(
                        "no response within the request timeout of {} ms",
                        millis(limit)
                    ),
                    retry: true,
                    retry_after: None,
                },
            };
            if !failure.retry || attempts > self.max_retries {
                return Err(self.gave_up(failure.message, attempts, None));
            }
            let delay = failure
                .retry_after
                .unwrap_or_else(|| self.backoff(attempts - 1));
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if delay >= left {
                let why = match failure.retry_after {
                    Some(after) => format!(
                        "not retried: the server asked to wait {} ms, past the run's deadline",
                        millis(after)
                    ),
                    None => "not retried: the next attempt would start past the run's deadline"
                        .to_owned(),
                };
                return Err(self.gave_up(failure.message, attempts, Some(&why)));
            }
            tokio::time::sleep(delay).await;
        }
    }

    /// One HTTP exchange.
    async fn attempt(&self, body: Vec<u8>) -> Result<Json, Failure> {
        let mut response = self
            .client
            .inner()
            .post(self.endpoint.clone())
            .headers(self.headers.clone())
            .body(body)
            .send()
            .await
            .map_err(Failure::transport)?;
        let status = response.status();
        let retry_after = retry_after(response.headers(), SystemTime::now());
        let location = response
            .headers()
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = read_body(&mut response).await?;
        if status.is_success() {
            return completion(status, &body, &self.redactor).map_err(Failure::fatal);
        }
        let retry = status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error();
        let detail = if status.is_redirection() {
            let to = location
                .map(|l: String| format!(" to `{}`", self.redactor.clip(&l, EXCERPT_CHARS)))
                .unwrap_or_default();
            format!(
                "redirected{to}; only same-origin 307 and 308 redirects are followed, check \
                 the base URL"
            )
        } else {
            api_message(&body, &self.redactor)
        };
        Err(Failure {
            message: format!("{}: {detail}", status_text(status)),
            retry,
            retry_after: retry_after.filter(|_| retry),
        })
    }

    /// The backoff before retry number `retry + 1`: exponential, capped, with jitter.
    fn backoff(&self, retry: u32) -> Duration {
        let exponential = self
            .retry_base_delay
            .saturating_mul(1u32 << retry.min(20))
            .min(self.retry_max_delay);
        // "Equal jitter": half fixed, half random, so clients that failed together spread
        // out without any of them retrying at once.
        exponential / 2 + exponential.mul_f64(fastrand::f64() / 2.0)
    }

    /// The final message: what failed, where, and how often it was tried.
    fn gave_up(&self, message: String, attempts: u32, note: Option<&str>) -> String {
        let mut trailer = format!("POST {}", self.endpoint);
        if attempts > 1 {
            trailer.push_str(&format!("; gave up after {attempts} attempts"));
        }
        if let Some(note) = note {
            trailer.push_str("; ");
            trailer.push_str(note);
        }
        self.redact(format!("{message} ({trailer})"))
    }

    /// Replaces every run of a secret in `message` with `<redacted>`: a server may echo
    /// a header back in an error body, whole, cut or in another case.
    fn redact(&self, message: String) -> String {
        self.redactor.redact(&message)
    }
}

impl Provider for OpenAiProvider {
    fn complete<'a>(
        &'a self,
        request: &'a ProviderRequest,
        call: &'a CallContext,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        Box::pin(async move {
            let body = wire::openai::encode_request(request)
                .map_err(|e| ProviderError::new(e.kind, self.redact(e.message)))?;
            // The transport's failures are classified by status in `transport.rs` (issue
            // #11, part C); until then they are kind `other`.
            let response = self
                .send(body, call.deadline)
                .await
                .map_err(|message| ProviderError::new(ProviderErrorKind::Other, message))?;
            wire::openai::decode_value(&response)
                .map_err(|e| ProviderError::new(e.kind, self.redact(e.message)))
        })
    }
}

impl fmt::Debug for OpenAiProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let custom: Vec<_> = self
            .headers
            .keys()
            .filter(|name| !MANAGED_HEADERS.contains(name) && **name != header::AUTHORIZATION)
            .map(|name| (name.as_str(), Redacted))
            .collect();
        f.debug_struct("OpenAiProvider")
            .field("endpoint", &self.endpoint.as_str())
            .field(
                "api_key",
                &self
                    .headers
                    .contains_key(header::AUTHORIZATION)
                    .then_some(Redacted),
            )
            .field("headers", &custom)
            .field("request_timeout", &self.request_timeout)
            .field("max_retries", &self.max_retries)
            .finish_non_exhaustive()
    }
}

// ---------------------------------------------------------------------------------------
// Responses and failures.

/// Headers the provider sets itself.
const MANAGED_HEADERS: [HeaderName; 5] = [
    header::CONTENT_TYPE,
    header::CONTENT_LENGTH,
    header::HOST,
    header::TRANSFER_ENCODING,
    header::ACCEPT,
];

/// How much of a body an error message quotes (after redaction).
const EXCERPT_CHARS: usize = 200;

/// A failed attempt.
struct Failure {
    message: String,
    /// Whether another attempt might succeed (429, 5xx, transport failures).
    retry: bool,
    /// The delay the server asked for.
    retry_after: Option<Duration>,
}

impl Failure {
    fn fatal(message: String) -> Failure {
        Failure {
            message,
            retry: false,
            retry_after: None,
        }
    }

    /// A request that got no (complete) response.
    fn transport(error: reqwest::Error) -> Failure {
        Failure {
            message: http::error_text(&error),
            // A certificate the platform does not trust stays untrusted on the next try.
            retry: !error.is_builder() && !is_tls_error(&error),
            retry_after: None,
        }
    }
}

/// Whether a TLS error (an untrusted certificate, a failed handshake) caused `error`.
fn is_tls_error(error: &reqwest::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = cause {
        if current.is::<rustls::Error>() {
            return true;
        }
        // tokio-rustls wraps rustls errors in `io::Error`s (hyper wraps those once more),
        // and an `io::Error`'s `source` skips the error it wraps.
        cause = match current
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => current.source(),
        };
    }
    false
}

/// Reads the body, up to [`MAX_BODY_BYTES`].
async fn read_body(response: &mut reqwest::Response) -> Result<Vec<u8>, Failure> {
    let status = response.status();
    http::read_body(response).await.map_err(|e| match e {
        BodyError::TooLarge => Failure::fatal(format!(
            "{}: the response body is larger than {} MiB",
            status_text(status),
            MAX_BODY_BYTES >> 20
        )),
        BodyError::Failed(e) => Failure::transport(e),
    })
}

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

/// The API's message from an error body, or an excerpt of the body; redacted, then cut.
fn api_message(body: &[u8], redactor: &Redactor) -> String {
    serde_json::from_slice::<Json>(body)
        .ok()
        .and_then(|json| error_message(&json, redactor))
        .unwrap_or_else(|| excerpt(body, redactor))
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

/// The start of a body, on one line, redacted, for an error message.
fn excerpt(body: &[u8], redactor: &Redactor) -> String {
    if body.iter().all(u8::is_ascii_whitespace) {
        return "(empty body)".into();
    }
    // Only the start is quoted: decoding the rest of a large body would be wasted.
    let head = &body[..body.len().min(64 * 1024)];
    redactor.clip(&String::from_utf8_lossy(head), EXCERPT_CHARS)
}

/// `HTTP 429 Too Many Requests`.
fn status_text(status: StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("HTTP {} {reason}", status.as_u16()),
        None => format!("HTTP {}", status.as_u16()),
    }
}

/// The delay a 429 or 503 response asks for: `retry-after-ms` (OpenAI), else
/// `Retry-After` in seconds or as an HTTP date.
fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = text("retry-after-ms").and_then(|v| v.parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64((ms / 1000.0).min(u32::MAX as f64)));
    }
    let value = text("retry-after")?;
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = parse_http_date(value)?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Parses an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the HTTP-date format servers
/// must send (RFC 9110 §5.6.7). The two obsolete formats are not accepted.
fn parse_http_date(text: &str) -> Option<SystemTime> {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (_weekday, rest) = text.split_once(", ")?;
    let mut fields = rest.split(' ');
    let day: u32 = fields.next()?.parse().ok()?;
    let month = fields.next()?;
    let month = MONTHS.iter().position(|m| *m == month)? as u32 + 1;
    let year: i64 = fields.next()?.parse().ok()?;
    let mut time = fields.next()?.split(':');
    let mut part = |max: u64| time.next()?.parse::<u64>().ok().filter(|v| *v <= max);
    let (hour, minute, second) = (part(23)?, part(59)?, part(60)?);
    if fields.next() != Some("GMT") || fields.next().is_some() || !(1..=31).contains(&day) {
        return None;
    }
    // A hostile year (`99999999999999`) must not overflow: every step is checked, and a
    // date too far ahead for `SystemTime` is no delay at all.
    let days = days_from_civil(year, month, day)?;
    let seconds = u64::try_from(days)
        .ok()?
        .checked_mul(86_400)?
        .checked_add(hour * 3600 + minute * 60 + second)?;
    UNIX_EPOCH.checked_add(Duration::from_secs(seconds))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm);
/// `None` when a step would overflow.
fn days_from_civil(year: i64, month: u32, day: u32) -> Option<i64> {
    let year = if month <= 2 {
        year.checked_sub(1)?
    } else {
        year
    };
    let era = year.div_euclid(400);
    let year_of_era = year.rem_euclid(400);
    let month = i64::from(month);
    let day_of_year =
        (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era.checked_mul(146_097)?
        .checked_add(day_of_era)?
        .checked_sub(719_468)
}

// ---------------------------------------------------------------------------------------
// Configuration helpers.

/// `{base_url}/v1/chat/completions`, without doubling a trailing `/v1`.
fn endpoint(base_url: &str) -> Result<Url, String> {
    let text = base_url.trim();
    let shown = printable_url(text);
    let mut url = Url::parse(text).map_err(|e| format!("invalid base URL `{shown}`: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "invalid base URL `{shown}`: expected an http:// or https:// URL"
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(
            "invalid base URL: credentials in the URL are not supported; use an API \
                    key or a header"
                .into(),
        );
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!(
            "invalid base URL `{shown}`: a base URL has no query string or fragment"
        ));
    }
    let path = url.path().trim_end_matches('/');
    let path = if path.ends_with("/v1") {
        format!("{path}/chat/completions")
    } else {
        format!("{path}/v1/chat/completions")
    };
    url.set_path(&path);
    Ok(url)
}

/// A URL for messages and `Debug`: a user name or password, a query string and a
/// fragment (any of which may hold a key, as in `?key=…`) are shown as `<redacted>`.
fn printable_url(text: &str) -> String {
    // The query and fragment first: they may hold an `@` too.
    let (text, tail) = match text.find(['?', '#']) {
        Some(at) => (&text[..at], format!("{}{REDACTED}", &text[at..at + 1])),
        None => (text, String::new()),
    };
    let shown = match text.split_once("://") {
        Some((scheme, rest)) => {
            let authority_end = rest.find('/').unwrap_or(rest.len());
            match rest[..authority_end].rfind('@') {
                Some(at) => format!("{scheme}://{REDACTED}@{}", &rest[at + 1..]),
                None => text.to_owned(),
            }
        }
        None if text.contains('@') => REDACTED.to_owned(),
        None => text.to_owned(),
    };
    shown + &tail
}

fn millis(duration: Duration) -> u128 {
    duration.as_millis()
}

/// Prints as `<redacted>`.
struct Redacted;

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

/// Header names with redacted values.
struct RedactedHeaders<'a>(&'a [(String, String)]);

impl fmt::Debug for RedactedHeaders<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(name, _)| (name, Redacted)))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        let cases = [
            (
                "https://api.openai.com",
                "https://api.openai.com/v1/chat/completions",
            ),
            (
                "https://api.openai.com/",
                "https://api.openai.com/v1/chat/completions",
            ),
            (
                "http://localhost:8080/v1",
                "http://localhost:8080/v1/chat/completions",
            ),
            (
                "http://localhost:8080/v1/",
                "http://localhost:8080/v1/chat/completions",
            ),
            (
                "http://h/proxy/openai",
                "http://h/proxy/openai/v1/chat/completions",
            ),
            (" http://h:1/api/v1 ", "http://h:1/api/v1/chat/completions"),
        ];
        for (base, expected) in cases {
            assert_eq!(endpoint(base).unwrap().as_str(), expected, "{base}");
        }
        for (base, error) in [
            ("localhost:8080", "expected an http:// or https:// URL"),
            ("ftp://h", "expected an http:// or https:// URL"),
            ("http://h/?key=1", "no query string"),
            ("nonsense", "invalid base URL `nonsense`"),
        ] {
            let e = endpoint(base).unwrap_err();
            assert!(e.contains(error), "{base}: {e}");
        }
        let e = endpoint("https://user:sk-secret-1234@h").unwrap_err();
        assert!(!e.contains("sk-secret"), "{e}");
    }

    #[test]
    fn printable_urls_hide_credentials() {
        assert_eq!(
            printable_url("https://u:p@h/x@y"),
            "https://<redacted>@h/x@y"
        );
        assert_eq!(printable_url("https://h/a@b"), "https://h/a@b");
        assert_eq!(printable_url("u:p@h"), "<redacted>");
        assert_eq!(
            printable_url("http://h:1/v1?key=sk-0123456789abcdef&x=1#frag"),
            "http://h:1/v1?<redacted>"
        );
        assert_eq!(printable_url("https://h#a@b"), "https://h#<redacted>");
        let e = endpoint("http://h/?key=sk-0123456789abcdef").unwrap_err();
        assert_eq!(
            e,
            "invalid base URL `http://h/?<redacted>`: a base URL has no query string or fragment"
        );
    }

    #[test]
    fn retry_after_forms() {
        let now = UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (k, v) in pairs {
                map.insert(*k, HeaderValue::from_static(v));
            }
            map
        };
        assert_eq!(
            retry_after(&headers(&[("retry-after", "3")]), now),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            retry_after(
                &headers(&[("retry-after", "Sun, 06 Nov 1994 08:49:47 GMT")]),
                now
            ),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            retry_after(
                &headers(&[("retry-after", "Sun, 06 Nov 1994 08:49:00 GMT")]),
                now
            ),
            Some(Duration::ZERO)
        );
        assert_eq!(
            retry_after(
                &headers(&[("retry-after-ms", "250"), ("retry-after", "9")]),
                now
            ),
            Some(Duration::from_millis(250))
        );
        assert_eq!(retry_after(&headers(&[("retry-after", "soon")]), now), None);
        assert_eq!(retry_after(&headers(&[]), now), None);
    }

    #[test]
    fn far_future_retry_after_dates_do_not_overflow() {
        let now = UNIX_EPOCH + Duration::from_secs(784_111_777);
        for date in [
            "Sun, 06 Nov 99999999999999 08:49:37 GMT",
            "Sun, 06 Nov 9223372036854775807 08:49:37 GMT",
            "Sun, 06 Nov -9223372036854775808 08:49:37 GMT",
            "Sun, 06 Nov 584554051223 08:49:37 GMT",
        ] {
            let mut map = HeaderMap::new();
            map.insert("retry-after", HeaderValue::from_str(date).unwrap());
            // A date too far ahead to represent is no usable delay; one before the epoch
            // is in the past.
            let delay = retry_after(&map, now);
            assert!(
                delay.is_none() || delay == Some(Duration::ZERO),
                "{date}: {delay:?}"
            );
        }
    }

    #[test]
    fn http_dates() {
        let at = |s| parse_http_date(s).map(|t| t.duration_since(UNIX_EPOCH).unwrap().as_secs());
        assert_eq!(at("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(at("Sun, 06 Nov 1994 08:49:37 GMT"), Some(784_111_777));
        assert_eq!(at("Tue, 29 Feb 2000 12:00:00 GMT"), Some(951_825_600));
        assert_eq!(at("Sunday, 06-Nov-94 08:49:37 GMT"), None);
        assert_eq!(at("Sun Nov  6 08:49:37 1994"), None);
        assert_eq!(at("Sun, 06 Nov 1994 24:00:00 GMT"), None);
        assert_eq!(at("Sun, 06 Nov 1994 08:49:37 UTC"), None);
    }

    #[test]
    fn error_bodies() {
        let message = |body: &str| api_message(body.as_bytes(), &Redactor::default());
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
    fn backoff_grows_and_is_capped() {
        let provider = OpenAiProvider::new(
            OpenAiConfig::new()
                .base_url("http://127.0.0.1:9")
                .retry_delays(Duration::from_millis(100), Duration::from_millis(300)),
        )
        .unwrap();
        for _ in 0..50 {
            let first = provider.backoff(0);
            assert!((50..=100).contains(&first.as_millis()), "{first:?}");
            let second = provider.backoff(1);
            assert!((100..=200).contains(&second.as_millis()), "{second:?}");
            let capped = provider.backoff(30);
            assert!((150..=300).contains(&capped.as_millis()), "{capped:?}");
        }
    }

    #[test]
    fn bad_configuration_is_rejected_without_secrets() {
        let key = "sk-very-secret-key-0123456789";
        let e =
            OpenAiProvider::new(OpenAiConfig::new().api_key(format!("{key}\nX: y"))).unwrap_err();
        assert!(!e.contains(key), "{e}");
        let e = OpenAiProvider::new(OpenAiConfig::new().header("api-key", format!("{key}\r\n")))
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert!(e.is_ok(), "surrounding whitespace is trimmed: {e:?}");
        let e = OpenAiProvider::new(OpenAiConfig::new().header("x-key", format!("a\n{key}")))
            .unwrap_err();
        assert_eq!(
            e,
            "the value of header `x-key` is not a valid HTTP header value"
        );
        let e = OpenAiProvider::new(OpenAiConfig::new().header("bad header", "v")).unwrap_err();
        assert_eq!(e, "`bad header` is not a valid HTTP header name");
        let e = OpenAiProvider::new(OpenAiConfig::new().header("Content-Type", "text/plain"))
            .unwrap_err();
        assert_eq!(
            e,
            "header `content-type` is set by the provider and cannot be configured"
        );
        let e = OpenAiProvider::new(
            OpenAiConfig::new()
                .api_key(key)
                .header("Authorization", "Bearer other-secret"),
        )
        .unwrap_err();
        assert!(
            e.starts_with("both an API key and an `Authorization` header"),
            "{e}"
        );
        assert_eq!(
            OpenAiProvider::new(OpenAiConfig::new().api_key("  ")).unwrap_err(),
            "the API key is empty"
        );
        assert_eq!(
            OpenAiProvider::new(OpenAiConfig::new().request_timeout(Duration::ZERO)).unwrap_err(),
            "the request timeout must be greater than zero"
        );
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

//! The HTTP exchange every HTTP provider shares: one JSON `POST`, retried until it
//! succeeds, fails for good, runs out of retries or would pass the run's deadline.
//!
//! [`Transport::send`] hands back a 2xx body as bytes, or a [`ProviderError`] whose kind
//! follows the failure (401/403 auth, 429 rate_limited, 5xx server, timeouts timeout,
//! connect/TLS/redirect transport, other 4xx invalid_request) and whose message is
//! redacted and ends in the `(POST <endpoint>[; gave up after N attempts][; not retried:
//! …])` trailer of `spec/providers.md` §4. Backoff is exponential with jitter and honours
//! `retry-after-ms` and `Retry-After` (seconds or an HTTP date).
//!
//! Not in here: what the body means. Each provider passes how to read the API's message
//! out of an error body, and decodes a 2xx body itself (its wire format).

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use aplc_vm::wire::StreamAssembler;
use aplc_vm::{Completion, ProviderError, ProviderErrorKind};
use reqwest::header::{self, HeaderMap, HeaderName, HeaderValue};
use reqwest::{StatusCode, Url};
use serde_json::Value as Json;

use crate::http::{self, BodyError, ConfigError, HttpClient, MAX_BODY_BYTES};
use crate::provider::DeltaSink;
use crate::redact::{REDACTED, Redactor};

mod retry_after;
use retry_after::retry_after;

/// How much of a body an error message quotes (after redaction).
pub(crate) const EXCERPT_CHARS: usize = 200;

/// Headers every HTTP provider sets itself.
pub(crate) const MANAGED_HEADERS: [HeaderName; 5] = [
    header::CONTENT_TYPE,
    header::CONTENT_LENGTH,
    header::HOST,
    header::TRANSFER_ENCODING,
    header::ACCEPT,
];

/// Reads the API's own message out of an error body, redacted and clipped with the
/// redactor given; `None` when the body has no message in the provider's shape.
pub(crate) type ApiMessage = fn(&Json, &Redactor) -> Option<String>;

/// A provider's decoder of a whole 2xx body (its status and bytes), for a streamed
/// request that got one; its error's message should name the status.
pub(crate) type WholeBody<'a> =
    &'a (dyn Fn(StatusCode, &[u8]) -> Result<Completion, ProviderError> + Sync);

/// The `Accept` header of a streamed request.
const STREAM_ACCEPT: Option<HeaderValue> = Some(HeaderValue::from_static("text/event-stream"));

/// How long each attempt may take and how often and how patiently to retry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Retries {
    /// How long one HTTP request may take, from sending to the last byte of the body.
    pub request_timeout: Duration,
    /// How many times a retryable failure is retried.
    pub max_retries: u32,
    /// The first backoff delay.
    pub base_delay: Duration,
    /// The longest backoff delay (before jitter).
    pub max_delay: Duration,
}

/// A provider's connection to its endpoint: the client, the headers (the key among
/// them), the retry rules, and the redactor that scrubs every message it returns.
#[derive(Clone)]
pub(crate) struct Transport {
    client: HttpClient,
    endpoint: Url,
    headers: HeaderMap,
    redactor: Redactor,
    retries: Retries,
    api_message: ApiMessage,
}

/// A 2xx answer: its status, its body, and how many attempts it took.
pub(crate) struct Delivered {
    pub status: StatusCode,
    pub body: Vec<u8>,
    attempts: u32,
}

impl Transport {
    /// A transport posting to `endpoint` with `headers`; `secrets` are redacted from
    /// every message. A `max_delay` below `base_delay` is raised to it.
    pub(crate) fn new(
        client: HttpClient,
        endpoint: Url,
        headers: HeaderMap,
        secrets: &[String],
        mut retries: Retries,
        api_message: ApiMessage,
    ) -> Transport {
        retries.max_delay = retries.max_delay.max(retries.base_delay);
        Transport {
            client,
            endpoint,
            headers,
            redactor: Redactor::new(secrets.iter().map(String::as_str)),
            retries,
            api_message,
        }
    }

    /// The URL requests are posted to.
    pub(crate) fn endpoint(&self) -> &Url {
        &self.endpoint
    }

    /// The headers sent with every request.
    pub(crate) fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The retry rules.
    pub(crate) fn retries(&self) -> Retries {
        self.retries
    }

    /// The redactor for this transport's secrets.
    pub(crate) fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    /// Replaces every run of a secret in `message` with `<redacted>`: a server may echo
    /// a header back in an error body, whole, cut or in another case.
    pub(crate) fn redact(&self, message: String) -> String {
        self.redactor.redact(&message)
    }

    /// Sends `body` until it succeeds, fails for good, runs out of retries or would pass
    /// `deadline`.
    pub(crate) async fn send(
        &self,
        body: Vec<u8>,
        deadline: Instant,
    ) -> Result<Delivered, ProviderError> {
        let ((status, body), attempts) = self
            .retrying(deadline, None, || self.attempt(body.clone()))
            .await?;
        Ok(Delivered {
            status,
            body,
            attempts,
        })
    }

    /// Sends `body`, a request for a stream, and assembles the answer with a fresh
    /// assembler from `assembler` per attempt, sending its text deltas to `deltas`.
    ///
    /// Retried as [`Transport::send`] is until the first text delta arrives; after it,
    /// any failure is final (a listener has seen the text). The whole stream counts
    /// against [`MAX_BODY_BYTES`] and the request timeout, as a whole body does.
    ///
    /// A server that answers with a whole JSON body instead (`Content-Type:
    /// application/json`: it does not stream) is read with `whole`, the provider's
    /// decoder of a whole 2xx body, and its text goes out as one delta.
    pub(crate) async fn stream<A: StreamAssembler>(
        &self,
        body: Vec<u8>,
        deadline: Instant,
        assembler: impl Fn() -> A,
        whole: WholeBody<'_>,
        deltas: Option<&DeltaSink>,
    ) -> Result<Completion, ProviderError> {
        let started = AtomicBool::new(false);
        let (completion, _) = self
            .retrying(deadline, Some(&started), || {
                self.stream_attempt(body.clone(), assembler(), whole, deltas, &started)
            })
            .await?;
        Ok(completion)
    }

    /// Runs `attempt` until it succeeds, fails for good, runs out of retries or would
    /// pass `deadline`; its result and the number of attempts. Once `streamed` is set,
    /// nothing is retried.
    async fn retrying<T, F, Fut>(
        &self,
        deadline: Instant,
        streamed: Option<&AtomicBool>,
        mut attempt: F,
    ) -> Result<(T, u32), ProviderError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        let what = if streamed.is_some() {
            "the stream did not end"
        } else {
            "no response"
        };
        let deadline = tokio::time::Instant::from_std(deadline);
        let mut attempts = 0u32;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(self.gave_up(
                    Failure::fatal(
                        ProviderErrorKind::Timeout,
                        "the run's deadline passed before the request was sent".into(),
                    ),
                    attempts,
                    None,
                ));
            }
            attempts += 1;
            let timeout = self.retries.request_timeout;
            let limit = timeout.min(left);
            let failure = match tokio::time::timeout(limit, attempt()).await {
                Ok(Ok(done)) => return Ok((done, attempts)),
                Ok(Err(failure)) => failure,
                // Nothing is left to retry with.
                Err(_) if limit < timeout => Failure::fatal(
                    ProviderErrorKind::Timeout,
                    format!(
                        "{what} before the run's deadline ({} ms)",
                        limit.as_millis()
                    ),
                ),
                Err(_) => Failure {
                    kind: ProviderErrorKind::Timeout,
                    message: format!(
                        "{what} within the request timeout of {} ms",
                        limit.as_millis()
                    ),
                    retry: true,
                    retry_after: None,
                },
            };
            if failure.retry && streamed.is_some_and(|s| s.load(Ordering::Relaxed)) {
                let note = "not retried: its text had begun to stream";
                return Err(self.gave_up(failure, attempts, Some(note)));
            }
            if !failure.retry || attempts > self.retries.max_retries {
                return Err(self.gave_up(failure, attempts, None));
            }
            let delay = failure
                .retry_after
                .unwrap_or_else(|| self.backoff(attempts - 1));
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if delay >= left {
                let why = match failure.retry_after {
                    Some(after) => format!(
                        "not retried: the server asked to wait {} ms, past the run's deadline",
                        after.as_millis()
                    ),
                    None => "not retried: the next attempt would start past the run's deadline"
                        .to_owned(),
                };
                return Err(self.gave_up(failure, attempts, Some(&why)));
            }
            tokio::time::sleep(delay).await;
        }
    }

    /// The error for a 2xx answer the provider could not decode: kind invalid_response,
    /// `message` (which should name the status) with the trailer, redacted.
    pub(crate) fn invalid_response(&self, delivered: &Delivered, message: String) -> ProviderError {
        self.gave_up(
            Failure::fatal(ProviderErrorKind::InvalidResponse, message),
            delivered.attempts,
            None,
        )
    }

    /// One HTTP exchange: the status and body of a 2xx answer, or why there is none.
    async fn attempt(&self, body: Vec<u8>) -> Result<(StatusCode, Vec<u8>), Failure> {
        let mut response = self.post(body, None).await?;
        let status = response.status();
        if !status.is_success() {
            return Err(self.refused(response).await);
        }
        let body = read_body(&mut response).await?;
        Ok((status, body))
    }

    /// One streamed exchange: a 2xx answer's events assembled (their text deltas sent to
    /// `deltas` as they come, `started` set at the first), or why there is none.
    async fn stream_attempt<A: StreamAssembler>(
        &self,
        body: Vec<u8>,
        mut assembler: A,
        whole: WholeBody<'_>,
        deltas: Option<&DeltaSink>,
        started: &AtomicBool,
    ) -> Result<Completion, Failure> {
        let mut response = self.post(body, STREAM_ACCEPT).await?;
        let status = response.status();
        if !status.is_success() {
            return Err(self.refused(response).await);
        }
        let is_json = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.trim_start().starts_with("application/json"));
        if is_json {
            let body = read_body(&mut response).await?;
            let completion = whole(status, &body).map_err(|e| Failure::fatal(e.kind, e.message))?;
            let text = text_of(&completion);
            if !text.is_empty() {
                started.store(true, Ordering::Relaxed);
                if let Some(sink) = deltas {
                    sink.send(text).await;
                }
            }
            return Ok(completion);
        }
        let status = status_text(status);
        let assembly = |e: ProviderError| Failure {
            // An error event is the server's failure; before any text, it is retried
            // as the same failure with an HTTP status would be.
            retry: matches!(
                e.kind,
                ProviderErrorKind::Server | ProviderErrorKind::RateLimited
            ),
            kind: e.kind,
            message: format!("{status}: {}", e.message),
            retry_after: None,
        };
        let mut read = 0usize;
        let mut texts = Vec::new();
        while !assembler.done() {
            let chunk = match response.chunk().await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => break,
                Err(e) => {
                    let mut failure = Failure::transport(e);
                    failure.message = format!(
                        "{status}: the stream broke off after {read} bytes: {}",
                        failure.message
                    );
                    return Err(failure);
                }
            };
            read += chunk.len();
            if read > MAX_BODY_BYTES {
                return Err(Failure::fatal(
                    ProviderErrorKind::InvalidResponse,
                    format!(
                        "{status}: the stream is larger than {} MiB",
                        MAX_BODY_BYTES >> 20
                    ),
                ));
            }
            // The text before a fault in the same chunk goes out too: it arrived.
            let fed = assembler.feed(&chunk, &mut texts);
            for text in texts.drain(..) {
                started.store(true, Ordering::Relaxed);
                if let Some(sink) = deltas {
                    sink.send(text).await;
                }
            }
            fed.map_err(assembly)?;
        }
        assembler.finish().map_err(assembly)
    }

    /// Sends the request; a failure to get any response is a transport failure.
    /// `accept` replaces the JSON `Accept` header.
    async fn post(
        &self,
        body: Vec<u8>,
        accept: Option<HeaderValue>,
    ) -> Result<reqwest::Response, Failure> {
        let mut headers = self.headers.clone();
        if let Some(accept) = accept {
            headers.insert(header::ACCEPT, accept);
        }
        self.client
            .inner()
            .post(self.endpoint.clone())
            .headers(headers)
            .body(body)
            .send()
            .await
            .map_err(Failure::transport)
    }

    /// The failure of a non-2xx answer, its body read for the API's message.
    async fn refused(&self, mut response: reqwest::Response) -> Failure {
        let status = response.status();
        let retry_after = retry_after(response.headers(), SystemTime::now());
        let location = response
            .headers()
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = match read_body(&mut response).await {
            Ok(body) => body,
            Err(failure) => return failure,
        };
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
            self.api_message(&body)
        };
        Failure {
            kind: status_kind(status),
            message: format!("{}: {detail}", status_text(status)),
            retry,
            retry_after: retry_after.filter(|_| retry),
        }
    }

    /// The API's message from an error body, or an excerpt of the body; redacted, then
    /// cut.
    fn api_message(&self, body: &[u8]) -> String {
        serde_json::from_slice::<Json>(body)
            .ok()
            .and_then(|json| (self.api_message)(&json, &self.redactor))
            .unwrap_or_else(|| excerpt(body, &self.redactor))
    }

    /// The backoff before retry number `retry + 1`: exponential, capped, with jitter.
    fn backoff(&self, retry: u32) -> Duration {
        let exponential = self
            .retries
            .base_delay
            .saturating_mul(1u32 << retry.min(20))
            .min(self.retries.max_delay);
        // "Equal jitter": half fixed, half random, so clients that failed together spread
        // out without any of them retrying at once.
        exponential / 2 + exponential.mul_f64(fastrand::f64() / 2.0)
    }

    /// The final error: what failed, where, and how often it was tried.
    fn gave_up(&self, failure: Failure, attempts: u32, note: Option<&str>) -> ProviderError {
        let mut trailer = format!("POST {}", self.endpoint);
        if attempts > 1 {
            trailer.push_str(&format!("; gave up after {attempts} attempts"));
        }
        if let Some(note) = note {
            trailer.push_str("; ");
            trailer.push_str(note);
        }
        ProviderError::new(
            failure.kind,
            self.redact(format!("{} ({trailer})", failure.message)),
        )
    }
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transport")
            .field("endpoint", &self.endpoint.as_str())
            .field("retries", &self.retries)
            .finish_non_exhaustive()
    }
}

/// The kind of a failure with a non-2xx `status`.
fn status_kind(status: StatusCode) -> ProviderErrorKind {
    match status.as_u16() {
        401 | 403 => ProviderErrorKind::Auth,
        429 => ProviderErrorKind::RateLimited,
        500..=599 => ProviderErrorKind::Server,
        300..=399 => ProviderErrorKind::Transport,
        400..=499 => ProviderErrorKind::InvalidRequest,
        _ => ProviderErrorKind::InvalidResponse,
    }
}

// ---------------------------------------------------------------------------------------
// Configuration helpers, shared by the providers' constructors.

/// `{base_url}/v1/{path}`, without doubling a trailing `/v1`; a URL with credentials, a
/// query string or a fragment is refused without showing them.
pub(crate) fn endpoint(base_url: &str, path: &str) -> Result<Url, ConfigError> {
    let text = base_url.trim();
    let invalid = |reason: String| ConfigError::BaseUrl {
        url: printable_url(text),
        reason,
    };
    let mut url = Url::parse(text).map_err(|e| invalid(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid("expected an http:// or https:// URL".into()));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ConfigError::Credentials);
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid("a base URL has no query string or fragment".into()));
    }
    let base = url.path().trim_end_matches('/');
    let full = if base.ends_with("/v1") {
        format!("{base}/{path}")
    } else {
        format!("{base}/v1/{path}")
    };
    url.set_path(&full);
    Ok(url)
}

/// How a provider sends its API key.
pub(crate) struct KeyHeader {
    /// The header that carries the key (`authorization`, `x-api-key`).
    pub name: HeaderName,
    /// How errors spell that header (`Authorization`).
    pub shown: &'static str,
    /// What precedes the key in the value (`Bearer `), if anything.
    pub prefix: &'static str,
}

/// The headers of every request: JSON content type and accept, the configured ones, and
/// the key. Returns them with the secrets to redact (the key and every header value).
///
/// Errors name what is wrong (a bad header name or value, a header the provider sets
/// itself, two keys) without repeating a secret.
pub(crate) fn request_headers(
    configured: &[(String, String)],
    managed: &[HeaderName],
    key_header: &KeyHeader,
    key: Option<&str>,
) -> Result<(HeaderMap, Vec<String>), ConfigError> {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
    let mut secrets = Vec::new();
    for (name, value) in configured {
        let header_name = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| ConfigError::HeaderName(name.clone()))?;
        if MANAGED_HEADERS.contains(&header_name) || managed.contains(&header_name) {
            return Err(ConfigError::ManagedHeader(header_name.to_string()));
        }
        if header_name == key_header.name && key.is_some() {
            return Err(ConfigError::KeyAndHeader(key_header.shown));
        }
        let mut header_value = HeaderValue::from_str(value.trim())
            .map_err(|_| ConfigError::HeaderValue(header_name.to_string()))?;
        header_value.set_sensitive(true);
        headers.append(header_name, header_value);
        secrets.push(value.trim().to_owned());
    }
    if let Some(key) = key {
        let key = key.trim();
        if key.is_empty() {
            return Err(ConfigError::EmptyKey);
        }
        let mut value = HeaderValue::from_str(&format!("{}{key}", key_header.prefix))
            .map_err(|_| ConfigError::KeyValue)?;
        value.set_sensitive(true);
        headers.insert(key_header.name.clone(), value);
        secrets.push(key.to_owned());
    }
    Ok((headers, secrets))
}

/// A URL for messages and `Debug`: a user name or password, a query string and a
/// fragment (any of which may hold a key, as in `?key=…`) are shown as `<redacted>`.
pub(crate) fn printable_url(text: &str) -> String {
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

/// Prints as `<redacted>`.
pub(crate) struct Redacted;

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

/// Header names with redacted values.
pub(crate) struct RedactedHeaders<'a>(pub &'a [(String, String)]);

impl fmt::Debug for RedactedHeaders<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(name, _)| (name, Redacted)))
            .finish()
    }
}

// ---------------------------------------------------------------------------------------
// Failures and bodies.

/// A failed attempt.
struct Failure {
    kind: ProviderErrorKind,
    message: String,
    /// Whether another attempt might succeed (429, 5xx, transport failures).
    retry: bool,
    /// The delay the server asked for.
    retry_after: Option<Duration>,
}

impl Failure {
    fn fatal(kind: ProviderErrorKind, message: String) -> Failure {
        Failure {
            kind,
            message,
            retry: false,
            retry_after: None,
        }
    }

    /// A request that got no (complete) response.
    fn transport(error: reqwest::Error) -> Failure {
        Failure {
            kind: ProviderErrorKind::Transport,
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
        BodyError::TooLarge => Failure::fatal(
            ProviderErrorKind::InvalidResponse,
            format!(
                "{}: the response body is larger than {} MiB",
                status_text(status),
                MAX_BODY_BYTES >> 20
            ),
        ),
        BodyError::Failed(e) => Failure::transport(e),
    })
}

/// The text parts of `completion`, joined.
fn text_of(completion: &Completion) -> String {
    completion
        .content
        .iter()
        .filter_map(|part| match part {
            aplc_vm::Part::Text(text) => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

/// The start of a body, on one line, redacted, for an error message.
pub(crate) fn excerpt(body: &[u8], redactor: &Redactor) -> String {
    if body.iter().all(u8::is_ascii_whitespace) {
        return "(empty body)".into();
    }
    // Only the start is quoted: decoding the rest of a large body would be wasted.
    let head = &body[..body.len().min(64 * 1024)];
    redactor.clip(&String::from_utf8_lossy(head), EXCERPT_CHARS)
}

/// `HTTP 429 Too Many Requests`.
pub(crate) fn status_text(status: StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("HTTP {} {reason}", status.as_u16()),
        None => format!("HTTP {}", status.as_u16()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transport(retries: Retries) -> Transport {
        Transport::new(
            HttpClient::new().unwrap(),
            endpoint("http://127.0.0.1:9", "messages").unwrap(),
            HeaderMap::new(),
            &["sk-abcdefgh12345678".to_owned()],
            retries,
            |_, _| None,
        )
    }

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
            assert_eq!(
                endpoint(base, "chat/completions").unwrap().as_str(),
                expected,
                "{base}"
            );
        }
        for (base, error) in [
            ("localhost:8080", "expected an http:// or https:// URL"),
            ("ftp://h", "expected an http:// or https:// URL"),
            ("http://h/?key=1", "no query string"),
            ("nonsense", "invalid base URL `nonsense`"),
        ] {
            let e = endpoint(base, "chat/completions").unwrap_err().to_string();
            assert!(e.contains(error), "{base}: {e}");
        }
        let e = endpoint("https://user:sk-secret-1234@h", "messages")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("sk-secret"), "{e}");
        assert_eq!(
            endpoint("http://h:1/v1/", "messages").unwrap().as_str(),
            "http://h:1/v1/messages"
        );
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
        let e = endpoint("http://h/?key=sk-0123456789abcdef", "messages")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "invalid base URL `http://h/?<redacted>`: a base URL has no query string or fragment"
        );
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let transport = transport(Retries {
            request_timeout: Duration::from_secs(1),
            max_retries: 2,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(300),
        });
        for _ in 0..50 {
            let first = transport.backoff(0);
            assert!((50..=100).contains(&first.as_millis()), "{first:?}");
            let second = transport.backoff(1);
            assert!((100..=200).contains(&second.as_millis()), "{second:?}");
            let capped = transport.backoff(30);
            assert!((150..=300).contains(&capped.as_millis()), "{capped:?}");
        }
    }

    #[test]
    fn statuses_have_kinds() {
        for (status, kind) in [
            (401, ProviderErrorKind::Auth),
            (403, ProviderErrorKind::Auth),
            (429, ProviderErrorKind::RateLimited),
            (500, ProviderErrorKind::Server),
            (529, ProviderErrorKind::Server),
            (301, ProviderErrorKind::Transport),
            (400, ProviderErrorKind::InvalidRequest),
            (404, ProviderErrorKind::InvalidRequest),
        ] {
            let status = StatusCode::from_u16(status).unwrap();
            assert_eq!(status_kind(status), kind, "{status}");
        }
    }

    #[test]
    fn key_headers_and_conflicts() {
        let key_header = KeyHeader {
            name: HeaderName::from_static("x-api-key"),
            shown: "x-api-key",
            prefix: "",
        };
        let managed = [HeaderName::from_static("anthropic-version")];
        let (headers, secrets) = request_headers(
            &[("anthropic-beta".into(), " b1 ".into())],
            &managed,
            &key_header,
            Some(" sk-ant-1 "),
        )
        .unwrap();
        assert_eq!(headers["x-api-key"], "sk-ant-1");
        assert!(headers["x-api-key"].is_sensitive());
        assert_eq!(headers["anthropic-beta"], "b1");
        assert_eq!(secrets, ["b1", "sk-ant-1"]);
        let e = request_headers(
            &[("X-Api-Key".into(), "k".into())],
            &managed,
            &key_header,
            Some("sk"),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "both an API key and an `x-api-key` header are configured: use one of them"
        );
        let e = request_headers(
            &[("anthropic-version".into(), "1".into())],
            &managed,
            &key_header,
            None,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "header `anthropic-version` is set by the provider and cannot be configured"
        );
    }
}

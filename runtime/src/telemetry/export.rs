//! OTLP/HTTP export through our reqwest client: `opentelemetry-http`'s `HttpClient`,
//! implemented on a runtime of its own.
//!
//! The SDK's batch span processor and periodic metric reader export from threads of
//! their own with `futures_executor::block_on`, where no tokio runtime runs: a reqwest
//! future polled there has no reactor. So each request is spawned on a small runtime
//! (one worker thread) that this module owns, and the SDK's thread only waits for it.
//! It also keeps export off the run's runtime: on a current-thread runtime a flush
//! that waited for the run's own reactor would deadlock.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use opentelemetry_http::{HttpError, Request, Response};

use super::TelemetryError;

/// How long one export request may take (connect, send, answer).
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The most of a collector's answer that is read: it is a small protobuf message, and
/// only its status matters.
const MAX_ANSWER_BYTES: usize = 64 << 10;

/// Sends export requests with our reqwest client on the export runtime, remembering the
/// first failure for the one warning `Telemetry::shutdown` gives.
#[derive(Clone)]
pub(crate) struct OtlpClient {
    client: reqwest::Client,
    runtime: Arc<ExportRuntime>,
    failure: Arc<Mutex<Option<String>>>,
}

impl fmt::Debug for OtlpClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OtlpClient").finish_non_exhaustive()
    }
}

impl OtlpClient {
    /// A client on a new export runtime; proxies as `crate::http::HttpClient` reads them.
    pub(crate) fn new(env: &dyn Fn(&str) -> Option<String>) -> Result<OtlpClient, TelemetryError> {
        let client = crate::http::HttpClient::with_env(env)?.inner().clone();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("aplc-otlp")
            .enable_all()
            .build()
            .map_err(|e| TelemetryError::Setup {
                what: "telemetry export runtime",
                message: e.to_string(),
            })?;
        Ok(OtlpClient {
            client,
            runtime: Arc::new(ExportRuntime(Some(runtime))),
            failure: Arc::new(Mutex::new(None)),
        })
    }

    /// The first export failure, shared with the caller that reports it.
    pub(crate) fn failures(&self) -> Arc<Mutex<Option<String>>> {
        self.failure.clone()
    }

    fn remember(&self, message: &str) {
        let mut failure = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        if failure.is_none() {
            *failure = Some(message.to_owned());
        }
    }
}

#[async_trait]
impl opentelemetry_http::HttpClient for OtlpClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let Some(handle) = self.runtime.handle() else {
            return Err("the telemetry export runtime is shut down".into());
        };
        let target = shown_url(&request.uri().to_string());
        let task = handle.spawn(send(self.client.clone(), request));
        let result = match task.await {
            Ok(result) => result,
            Err(e) => Err(format!("the export task failed: {e}")),
        };
        match result {
            Ok(response) if response.status().is_success() => Ok(response),
            Ok(response) => {
                self.remember(&format!("{target} answered {}", response.status()));
                Ok(response)
            }
            Err(message) => {
                self.remember(&format!("{target}: {message}"));
                Err(message.into())
            }
        }
    }
}

/// POSTs `request` and reads at most [`MAX_ANSWER_BYTES`] of the answer. Errors never
/// name a header: the headers hold the collector's credentials.
async fn send(client: reqwest::Client, request: Request<Bytes>) -> Result<Response<Bytes>, String> {
    let (parts, body) = request.into_parts();
    let mut response = client
        .request(parts.method, parts.uri.to_string())
        .headers(parts.headers)
        .timeout(REQUEST_TIMEOUT)
        .body(body)
        .send()
        .await
        .map_err(|e| crate::http::error_text(&e))?;
    let status = response.status();
    let mut answer = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| crate::http::error_text(&e))?
    {
        let room = MAX_ANSWER_BYTES.saturating_sub(answer.len());
        answer.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if room <= chunk.len() {
            break;
        }
    }
    Response::builder()
        .status(status)
        .body(Bytes::from(answer))
        .map_err(|e| format!("the collector's answer is unusable: {e}"))
}

/// `url` without its user name and password, for messages.
fn shown_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut parsed) => {
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            parsed.to_string()
        }
        Err(_) => "the collector".to_owned(),
    }
}

/// The export runtime. Dropped without waiting (`shutdown_background`): it may be
/// dropped inside the run's async context, where blocking on a runtime's shutdown panics,
/// and by then every export has been waited for or timed out.
struct ExportRuntime(Option<tokio::runtime::Runtime>);

impl ExportRuntime {
    fn handle(&self) -> Option<&tokio::runtime::Handle> {
        self.0.as_ref().map(tokio::runtime::Runtime::handle)
    }
}

impl Drop for ExportRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

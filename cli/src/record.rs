//! `aplc run --record FILE`: keeps the provider's responses of a run, in order, and
//! writes them as a JSON array that `--mock` and a test's `responses = { file = … }`
//! replay.
//!
//! Only what the provider returned is kept: the response bodies (or `{"error": …}` for a
//! failed call), never the requests, so API keys and headers cannot reach the file. A
//! call cut off by the run timeout returned nothing and is not recorded.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Mutex;

use aplc_runtime::driver::{BoxFuture, CallContext, Provider};
use aplc_vm::wire::openai::response_json;
use aplc_vm::{Completion, ProviderError, ProviderErrorKind, ProviderRequest};
use serde_json::{Value as Json, json};

use crate::Failure;
use crate::input::write_atomically;

/// A provider that passes every call through and, when recording, keeps each result.
pub(crate) struct Recorder {
    inner: Box<dyn Provider>,
    /// `None` when not recording.
    entries: Option<Mutex<Vec<Json>>>,
}

impl Recorder {
    pub fn new(inner: Box<dyn Provider>, recording: bool) -> Recorder {
        Recorder {
            inner,
            entries: recording.then(|| Mutex::new(Vec::new())),
        }
    }

    /// Writes the recording after the run's output was printed, and picks the result:
    /// a recording that cannot be written fails the command (exit 1), but never hides
    /// why the run itself failed.
    pub fn write_after(
        &self,
        path: &Path,
        result: Result<ExitCode, Failure>,
    ) -> Result<ExitCode, Failure> {
        match (self.write(path), result) {
            (Ok(()), result) => result,
            (Err(failure), Ok(_)) => Err(failure),
            (Err(failure), Err(run_failure)) => {
                eprintln!("error: {}", failure.message);
                Err(run_failure)
            }
        }
    }

    /// Writes the recorded entries to `path` atomically (a temporary file in the same
    /// directory, renamed over `path`), so a reader never sees half a file.
    fn write(&self, path: &Path) -> Result<(), Failure> {
        let entries = match &self.entries {
            Some(entries) => entries.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            None => Vec::new(),
        };
        let mut text = serde_json::to_string_pretty(&Json::Array(entries))
            .map_err(|e| Failure::run(format!("cannot encode the recorded responses: {e}")))?;
        text.push('\n');
        write_atomically(path, text.as_bytes())
            .map_err(|e| Failure::run(format!("cannot write {}: {e}", path.display())))?;
        Ok(())
    }
}

impl Provider for Recorder {
    fn complete<'a>(
        &'a self,
        request: &'a ProviderRequest,
        call: &'a CallContext,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        Box::pin(async move {
            let result = self.inner.complete(request, call).await;
            if let Some(entries) = &self.entries {
                // The scripted provider's entry forms: a full response is replayed exactly
                // as written, and `{"error": …}` fails that call with the same message
                // (and kind).
                let entry = match &result {
                    Ok(completion) => recorded_response(completion),
                    Err(error) if error.kind == ProviderErrorKind::Other => {
                        json!({ "error": error.message })
                    }
                    Err(error) => {
                        json!({ "error": {"message": error.message, "kind": error.kind.as_str()} })
                    }
                };
                entries
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(entry);
            }
            result
        })
    }

    fn provider_name(&self, model: &str) -> Option<&'static str> {
        self.inner.provider_name(model)
    }
}

/// The response as received when it is a Chat Completions response (the OpenAI-compatible
/// and scripted providers keep one), otherwise the completion written in that format.
fn recorded_response(completion: &Completion) -> Json {
    match completion.raw.as_deref() {
        Some(raw) if raw.get("choices").is_some_and(Json::is_array) => raw.clone(),
        _ => response_json(completion),
    }
}

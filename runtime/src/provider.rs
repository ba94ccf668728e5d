//! The provider side of a run: the [`Provider`] trait, what a call knows of its run
//! ([`CallContext`], with the [`DeltaSink`] of a streaming answer), and [`Scripted`], the
//! provider of `--mock` answers.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aplc_vm::{Completion, ProviderError, ProviderRequest, ScriptedProvider};

use crate::future::BoxFuture;

/// What a provider call needs besides the request: what the driver knows about the run.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CallContext {
    /// When the run times out. A provider must not retry or wait past it.
    pub deadline: Instant,
    /// Where a streaming provider sends the text of its answer as it arrives; `None`
    /// when nobody listens (the provider still streams if configured to, silently).
    pub deltas: Option<DeltaSink>,
}

impl CallContext {
    /// A call that must be over by `deadline`.
    pub fn new(deadline: Instant) -> CallContext {
        CallContext {
            deadline,
            deltas: None,
        }
    }

    /// The same call, sending text deltas to `sink`.
    pub fn with_deltas(mut self, sink: DeltaSink) -> CallContext {
        self.deltas = Some(sink);
        self
    }
}

/// The sending end of a provider call's text deltas: a bounded channel, so a slow
/// listener slows the stream (and the run) instead of growing a buffer.
#[derive(Debug, Clone)]
pub struct DeltaSink(tokio::sync::mpsc::Sender<String>);

impl DeltaSink {
    /// A sink and its receiver, holding at most `capacity` deltas (at least one).
    pub fn channel(capacity: usize) -> (DeltaSink, tokio::sync::mpsc::Receiver<String>) {
        let (sender, receiver) = tokio::sync::mpsc::channel(capacity.max(1));
        (DeltaSink(sender), receiver)
    }

    /// Sends one delta, waiting while the queue is full. A receiver that is gone is not
    /// the provider's problem: the delta is dropped.
    pub async fn send(&self, text: String) {
        let _ = self.0.send(text).await;
    }
}

/// An LLM provider (§4): takes the machine's typed request, returns a typed completion.
pub trait Provider: Send + Sync {
    /// Calls the model. Errors become entries in `errors`; the step goes on.
    fn complete<'a>(
        &'a self,
        request: &'a ProviderRequest,
        call: &'a CallContext,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>>;

    /// Who serves `model`, as the GenAI semantic conventions spell it (`openai`,
    /// `anthropic`): telemetry's `gen_ai.provider.name`. `None` when unknown.
    fn provider_name(&self, _model: &str) -> Option<&'static str> {
        None
    }
}

/// A shared provider is a provider: an embedder keeps a handle on it (to inspect or
/// configure it) while a run uses it.
impl<P: Provider + ?Sized> Provider for Arc<P> {
    fn complete<'a>(
        &'a self,
        request: &'a ProviderRequest,
        call: &'a CallContext,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        (**self).complete(request, call)
    }

    fn provider_name(&self, model: &str) -> Option<&'static str> {
        (**self).provider_name(model)
    }
}

/// A [`ScriptedProvider`] behind a lock, optionally sleeping to simulate model latency.
#[derive(Debug)]
pub struct Scripted {
    script: Mutex<ScriptedProvider>,
    latency: Duration,
    stream: bool,
}

impl Scripted {
    /// Serves `script`'s entries in order.
    pub fn new(script: ScriptedProvider) -> Scripted {
        Scripted {
            script: Mutex::new(script),
            latency: Duration::ZERO,
            stream: false,
        }
    }

    /// Skips the next `n` entries, as if they had been served: a resumed durable run
    /// goes on where the script left off.
    pub fn skip(&self, n: u64) {
        let mut script = self.script.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..n {
            let _ = script.next_response();
        }
    }

    /// Sleeps `latency` before each answer.
    pub fn with_latency(mut self, latency: Duration) -> Scripted {
        self.latency = latency;
        self
    }

    /// Streams like an HTTP provider: each answer's text goes out as one delta before
    /// the answer, so `aplc run --stream` behaves the same offline.
    pub fn streaming(mut self, stream: bool) -> Scripted {
        self.stream = stream;
        self
    }
}

impl Provider for Scripted {
    fn complete<'a>(
        &'a self,
        _request: &'a ProviderRequest,
        call: &'a CallContext,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        Box::pin(async move {
            if !self.latency.is_zero() {
                tokio::time::sleep(self.latency).await;
            }
            let answer = self
                .script
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .next_response();
            if let (true, Some(sink), Ok(completion)) = (self.stream, &call.deltas, &answer) {
                let text: String = completion
                    .content
                    .iter()
                    .filter_map(|part| match part {
                        aplc_vm::Part::Text(text) => Some(text.as_str()),
                        _ => None,
                    })
                    .collect();
                if !text.is_empty() {
                    sink.send(text).await;
                }
            }
            answer
        })
    }
}

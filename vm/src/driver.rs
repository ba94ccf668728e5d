//! The tokio driver: performs the I/O a [`Machine`] asks for.
//!
//! Providers are object-safe async traits, so drivers and embedders can mix HTTP
//! providers, scripted ones and Rust closures. This module is behind the `driver` feature;
//! the machine itself builds without it.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::machine::{Action, Machine, RunOptions, RunOutcome};
use crate::program::Program;
use crate::provider::{ProviderError, ProviderRequest, ScriptedProvider};

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An LLM provider (§4): takes the context, returns an OpenAI-style response.
pub trait Provider: Send + Sync {
    /// Calls the model. Errors become entries in `errors`; the step goes on.
    fn call<'a>(
        &'a self,
        request: &'a ProviderRequest,
    ) -> BoxFuture<'a, Result<serde_json::Value, ProviderError>>;
}

/// A [`ScriptedProvider`] behind a lock, optionally sleeping to simulate model latency.
#[derive(Debug)]
pub struct Scripted {
    script: Mutex<ScriptedProvider>,
    latency: Duration,
}

impl Scripted {
    /// Serves `script`'s entries in order.
    pub fn new(script: ScriptedProvider) -> Scripted {
        Scripted {
            script: Mutex::new(script),
            latency: Duration::ZERO,
        }
    }

    /// Sleeps `latency` before each answer.
    pub fn with_latency(mut self, latency: Duration) -> Scripted {
        self.latency = latency;
        self
    }
}

impl Provider for Scripted {
    fn call<'a>(
        &'a self,
        _request: &'a ProviderRequest,
    ) -> BoxFuture<'a, Result<serde_json::Value, ProviderError>> {
        Box::pin(async move {
            if !self.latency.is_zero() {
                tokio::time::sleep(self.latency).await;
            }
            self.script
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .next_response()
        })
    }
}

/// Runs `program` to the end with `provider`, enforcing the run timeout.
pub async fn run(
    program: Arc<Program>,
    options: RunOptions,
    provider: &dyn Provider,
) -> RunOutcome {
    let mut machine = Machine::new(program, options, now());
    loop {
        match machine.poll(now()) {
            Action::CallProvider(request) => {
                let deadline = machine.deadline();
                match tokio::time::timeout_at(deadline.into(), provider.call(&request)).await {
                    Ok(result) => machine.handle_provider_response(now(), result),
                    // The timer fired at the deadline, so that is the earliest "now".
                    Err(_) => machine.handle_timeout(now().max(deadline)),
                }
            }
            Action::Continue => {}
            Action::Done => return machine.into_outcome(),
        }
    }
}

/// The current time on tokio's clock, which the driver's timers use too (and which tests
/// can pause and advance).
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

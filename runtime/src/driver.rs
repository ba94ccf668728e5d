//! The tokio driver: performs the I/O a [`Machine`] asks for.
//!
//! Providers and tools are object-safe async traits, so drivers and embedders can mix
//! HTTP providers, scripted ones, subprocess tools and Rust closures. The machine itself
//! lives in `aplc-vm`, which has no async runtime at all.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value as Json;

use crate::redact::Redactor;
use aplc_vm::Program;
use aplc_vm::tools::{ToolInvocation, ToolRegistry, ToolSpec, ToolSpecError};
use aplc_vm::{Action, Event, EventKind, Machine, RunOptions, RunOutcome};
use aplc_vm::{Completion, ProviderError, ProviderRequest, ScriptedProvider};

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

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

/// How many deltas wait between a provider and a listener before the provider waits.
const DELTA_QUEUE: usize = 32;

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

/// Receives a run's events, in order, on the driver's task (see `spec/events.md`).
///
/// A callback rather than a channel: it costs nothing per event beyond the call, it keeps
/// the order without a queue, and it is where backpressure belongs (a slow listener slows
/// the run instead of growing a buffer). An embedder that wants a channel sends from it:
/// `&mut |event: &Event| { let _ = tx.send(event.clone()); }`. It should be quick: the
/// run waits for it, and the run's timeout keeps counting.
pub type Listener<'a> = &'a mut (dyn FnMut(&Event) + Send);

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

/// A native tool (§5): takes checked arguments (and the context, for `with_context`
/// tools), returns a JSON result or an error message. A failure never aborts the run.
pub trait Tool: Send + Sync {
    /// Runs the tool.
    fn call<'a>(&'a self, invocation: &'a ToolInvocation) -> BoxFuture<'a, Result<Json, String>>;
}

/// A tool written as an async closure: `|arguments, context| async move { … }`.
struct FnTool<F>(F);

impl<F, Fut> Tool for FnTool<F>
where
    F: Fn(Json, Option<Json>) -> Fut + Send + Sync,
    Fut: Future<Output = Result<Json, String>> + Send + 'static,
{
    fn call<'a>(&'a self, invocation: &'a ToolInvocation) -> BoxFuture<'a, Result<Json, String>> {
        Box::pin((self.0)(
            invocation.arguments.clone(),
            invocation.context.clone(),
        ))
    }
}

/// The tools of a run: descriptors (for the machine) and implementations (for the driver).
#[derive(Default, Clone)]
pub struct Toolbox {
    /// Shared with every run's options: registering copies it only while a run holds it.
    registry: Arc<ToolRegistry>,
    tools: HashMap<String, Arc<dyn Tool>>,
    /// Applied to every result and error message before the machine sees it.
    redactor: Redactor,
}

impl std::fmt::Debug for Toolbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Toolbox")
            .field("registry", &self.registry)
            .finish_non_exhaustive()
    }
}

impl Toolbox {
    /// No tools.
    pub fn new() -> Toolbox {
        Toolbox::default()
    }

    /// Registers a tool implementation under its descriptor.
    pub fn register(&mut self, spec: ToolSpec, tool: Arc<dyn Tool>) -> Result<(), ToolSpecError> {
        let name = spec.name().to_string();
        Arc::make_mut(&mut self.registry).register(spec)?;
        self.tools.insert(name, tool);
        Ok(())
    }

    /// Registers an async closure `|arguments, context| async move { … }`.
    pub fn register_async<F, Fut>(&mut self, spec: ToolSpec, f: F) -> Result<(), ToolSpecError>
    where
        F: Fn(Json, Option<Json>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Json, String>> + Send + 'static,
    {
        self.register(spec, Arc::new(FnTool(f)))
    }

    /// Registers a plain closure `|arguments, context| -> Result<Json, String>`.
    pub fn register_fn<F>(&mut self, spec: ToolSpec, f: F) -> Result<(), ToolSpecError>
    where
        F: Fn(Json, Option<Json>) -> Result<Json, String> + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        self.register_async(spec, move |args, ctx| {
            let f = f.clone();
            async move { f(args, ctx) }
        })
    }

    /// The descriptors, for [`RunOptions::tools`] (an `Arc` clone, not a copy).
    pub fn registry(&self) -> Arc<ToolRegistry> {
        self.registry.clone()
    }

    /// Redacts every tool result and error message with `redactor` before it reaches the
    /// run (`result_tool_calls`, `errors`, the idempotency cache): a tool may print a
    /// secret it found, or one a server echoed to it. The CLI passes the run's provider
    /// secrets.
    pub fn redact_with(&mut self, redactor: Redactor) {
        self.redactor = redactor;
    }

    /// Runs the tool `invocation` asks for until the run's deadline or cancel: its
    /// result, redacted, or why it was dropped.
    pub(crate) async fn run(
        &self,
        invocation: &ToolInvocation,
        clock: &RunClock,
    ) -> Result<Result<Json, String>, Stopped> {
        let result = match self.tools.get(&invocation.name) {
            Some(tool) => clock.until_stopped(tool.call(invocation)).await?,
            None => Err("the tool has a descriptor but no implementation".to_string()),
        };
        Ok(self.redacted(result))
    }

    /// True if the tool `name` is declared idempotent: running it twice does no harm.
    pub(crate) fn is_idempotent(&self, name: &str) -> bool {
        self.registry
            .get(name)
            .is_some_and(|spec| spec.idempotency().is_some())
    }

    /// `result` with every secret the toolbox knows replaced.
    fn redacted(&self, result: Result<Json, String>) -> Result<Json, String> {
        match result {
            Ok(json) => Ok(self.redactor.redact_json(json)),
            Err(message) => Err(self.redactor.redact(&message)),
        }
    }

    /// Number of tools.
    pub fn len(&self) -> usize {
        self.registry.len()
    }

    /// True without tools.
    pub fn is_empty(&self) -> bool {
        self.registry.is_empty()
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

/// Runs `program` to the end with `provider` and no tools, enforcing the run timeout.
pub async fn run(
    program: Arc<Program>,
    options: RunOptions,
    provider: &dyn Provider,
) -> RunOutcome {
    run_with_tools(program, options, provider, &Toolbox::new()).await
}

/// Runs `program` to the end with `provider` and `toolbox`, enforcing the run timeout.
///
/// The toolbox's descriptors replace `options.tools`. The timeout holds even inside a
/// render: a watchdog thread sets the run's [`Machine::deadline_flag`] at the deadline.
/// Cancelling through `options.interrupt` ([`Interrupt::cancel`](crate::Interrupt::cancel))
/// stops the run at its next instruction, within a few hundred template instructions
/// mid-render, or at once while the driver awaits a provider or a tool (the call is
/// dropped; a command tool's process group is killed with it). Nobody listens,
/// so `options.events` is turned off: use [`run_with_listener`] for the events.
pub async fn run_with_tools(
    program: Arc<Program>,
    mut options: RunOptions,
    provider: &dyn Provider,
    toolbox: &Toolbox,
) -> RunOutcome {
    options.events = false;
    drive(program, options, provider, toolbox, None).await
}

/// [`run_with_tools`], handing every event of the run to `listener` as it happens
/// (`options.events` is turned on). The last event is `run_finished`. A provider that
/// streams gets a [`DeltaSink`] in its [`CallContext`], and its text reaches the
/// listener as `provider_delta` events (`spec/events.md`, "Streaming deltas").
pub async fn run_with_listener(
    program: Arc<Program>,
    mut options: RunOptions,
    provider: &dyn Provider,
    toolbox: &Toolbox,
    listener: Listener<'_>,
) -> RunOutcome {
    options.events = true;
    drive(program, options, provider, toolbox, Some(listener)).await
}

async fn drive(
    program: Arc<Program>,
    mut options: RunOptions,
    provider: &dyn Provider,
    toolbox: &Toolbox,
    mut listener: Option<Listener<'_>>,
) -> RunOutcome {
    options.tools = toolbox.registry();
    let mut machine = Machine::new(program, options);
    let clock = RunClock::start(&machine, Duration::ZERO);
    let mut relay = listener.as_ref().map(|_| DeltaRelay::new(&clock));
    let deliver = |machine: &mut Machine,
                   listener: &mut Option<Listener<'_>>,
                   relay: &mut Option<DeltaRelay>| {
        if let (Some(listener), Some(relay)) = (listener.as_mut(), relay.as_mut()) {
            machine.drain_events().for_each(|event| {
                relay.saw(&event);
                listener(&event);
            });
        }
    };
    deliver(&mut machine, &mut listener, &mut relay);
    loop {
        let action = machine.poll(clock.now());
        deliver(&mut machine, &mut listener, &mut relay);
        match action {
            Action::CallProvider(request) => {
                let relayed = relay.as_mut().zip(listener.as_mut());
                match call_provider(provider, &request, &clock, relayed).await {
                    Ok(result) => machine.handle_provider_response(clock.now(), result),
                    Err(Stopped::Deadline) => machine.handle_timeout(clock.timed_out_at()),
                    Err(Stopped::Interrupted) => {}
                }
            }
            Action::CallTool(invocation) => match toolbox.run(&invocation, &clock).await {
                Ok(result) => machine.handle_tool_result(clock.now(), result),
                Err(Stopped::Deadline) => machine.handle_timeout(clock.timed_out_at()),
                Err(Stopped::Interrupted) => {}
            },
            Action::Continue => continue,
            Action::Done => return machine.into_outcome(),
        }
        deliver(&mut machine, &mut listener, &mut relay);
    }
}

/// Carries a run's text deltas from its provider calls to its listener as
/// `provider_delta` events. One per run that has a listener: a run without one builds
/// no channel and sends its providers no sink.
pub(crate) struct DeltaRelay {
    receiver: tokio::sync::mpsc::Receiver<String>,
    /// The run's call context, with the sending end.
    call: CallContext,
    /// The `seq` and step of the last `provider_call` seen.
    seq: u64,
    step: String,
}

impl DeltaRelay {
    pub(crate) fn new(clock: &RunClock) -> DeltaRelay {
        let (sink, receiver) = DeltaSink::channel(DELTA_QUEUE);
        DeltaRelay {
            receiver,
            call: clock.call().clone().with_deltas(sink),
            seq: 0,
            step: String::new(),
        }
    }

    /// Notes the call the next deltas belong to.
    pub(crate) fn saw(&mut self, event: &Event) {
        if let EventKind::ProviderCall { step, .. } = &event.kind {
            self.seq = event.seq;
            self.step.clone_from(step);
        }
    }
}

/// Calls `provider` until the run's deadline or cancel (then why it stopped). With a relay,
/// the provider gets its sink, and every delta it sends reaches the listener, in order,
/// before the answer goes back to the machine.
pub(crate) async fn call_provider(
    provider: &dyn Provider,
    request: &ProviderRequest,
    clock: &RunClock,
    relayed: Option<(&mut DeltaRelay, &mut Listener<'_>)>,
) -> Result<Result<Completion, ProviderError>, Stopped> {
    let Some((relay, listener)) = relayed else {
        return clock
            .until_stopped(provider.complete(request, clock.call()))
            .await;
    };
    let DeltaRelay {
        receiver,
        call,
        seq,
        step,
    } = relay;
    let mut index = 0u64;
    let mut emit = |text: String| {
        listener(&Event::provider_delta(*seq, clock.now(), step, index, text));
        index += 1;
    };
    let answer = clock.until_stopped(provider.complete(request, call));
    tokio::pin!(answer);
    loop {
        tokio::select! {
            biased;
            result = &mut answer => {
                // What the provider sent before it returned is still queued.
                while let Ok(text) = receiver.try_recv() {
                    emit(text);
                }
                return result;
            }
            Some(text) = receiver.recv() => emit(text),
        }
    }
}

/// A run's clock and deadline, as a driver keeps them.
///
/// The machine's time is `offset` (where a resumed run left off; zero for a new one)
/// plus the time since the clock started, on tokio's clock, which the timers use too
/// (and which tests can pause and advance).
pub(crate) struct RunClock {
    start: tokio::time::Instant,
    offset: Duration,
    /// The run's deadline on tokio's clock, for timers.
    deadline: tokio::time::Instant,
    /// The same deadline in machine time.
    machine_deadline: Duration,
    call: CallContext,
    /// The embedder's cancel flag ([`Machine::cancel_flag`]).
    cancel: aplc_vm::Interrupt,
    _watchdog: crate::watchdog::Armed,
}

/// Why an awaited call did not finish: it was dropped, and the machine must hear why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stopped {
    /// The run's deadline came first: [`Machine::handle_timeout`], journaled.
    Deadline,
    /// The run was cancelled (or its embedder set the flag): nothing is handed in or
    /// journaled for the call; the next [`Machine::poll`] ends the run as the flag says.
    Interrupted,
}

impl RunClock {
    /// Starts the clock of `machine`, which reads `offset` now, and arms its watchdog.
    pub(crate) fn start(machine: &Machine, offset: Duration) -> RunClock {
        let start = tokio::time::Instant::now();
        let remaining = machine.deadline().saturating_sub(offset);
        let deadline = start
            .checked_add(remaining)
            .unwrap_or_else(|| start + FAR_FUTURE);
        // A render blocks this thread, and on a current-thread runtime no tokio timer can
        // fire meanwhile: a watchdog thread sets the run's interrupt flag at the deadline.
        // It counts on the real clock from now, so a test's paused tokio clock cannot make
        // it fire early or late by more than the test's own drift.
        let watch_at = Instant::now()
            .checked_add(remaining)
            .unwrap_or_else(|| Instant::now() + FAR_FUTURE);
        RunClock {
            start,
            offset,
            deadline,
            machine_deadline: machine.deadline(),
            call: CallContext::new(deadline.into_std()),
            cancel: machine.cancel_flag().clone(),
            _watchdog: crate::watchdog::arm(watch_at, machine.deadline_flag()),
        }
    }

    /// The machine's time now.
    pub(crate) fn now(&self) -> Duration {
        self.offset + self.start.elapsed()
    }

    /// The time to report a timeout at: the timer fired at the deadline, so that is the
    /// earliest "now".
    pub(crate) fn timed_out_at(&self) -> Duration {
        self.now().max(self.machine_deadline)
    }

    /// What a provider call needs to know of the run.
    pub(crate) fn call(&self) -> &CallContext {
        &self.call
    }

    /// `work`'s output, or why it was dropped: the run's deadline or its cancel came
    /// first. This is the one place a driver awaits a provider or a tool, so every host
    /// (the CLI, the service's workers, the durable driver) stops a call the same way.
    pub(crate) async fn until_stopped<T>(
        &self,
        work: impl Future<Output = T>,
    ) -> Result<T, Stopped> {
        tokio::select! {
            // A call that finished as the flag was set still counts: its answer is real.
            biased;
            out = tokio::time::timeout_at(self.deadline, work) => out.map_err(|_| Stopped::Deadline),
            _ = self.cancel.interrupted() => Err(Stopped::Interrupted),
        }
    }
}

/// Stands in for a deadline too far away to represent (a timeout of `Duration::MAX`).
const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// Sends `deltas` numbered deltas, far more than the queue holds, then answers with
    /// their concatenation; notes whether it got a sink.
    struct Chatty {
        deltas: usize,
        had_sink: AtomicBool,
    }

    impl Provider for Chatty {
        fn complete<'a>(
            &'a self,
            _request: &'a ProviderRequest,
            call: &'a CallContext,
        ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
            Box::pin(async move {
                self.had_sink.store(call.deltas.is_some(), Ordering::SeqCst);
                let mut text = String::new();
                for n in 0..self.deltas {
                    let piece = format!("{n} ");
                    text.push_str(&piece);
                    if let Some(sink) = &call.deltas {
                        sink.send(piece).await;
                    }
                }
                Ok(Completion::text(text))
            })
        }
    }

    fn program() -> Arc<Program> {
        let compiled =
            aplc_compiler::compile("# prompt: a\n## user\nhi\n", "a.apl", &Default::default());
        Arc::new(
            Program::from_bundle(compiled.bundle.expect("compiles"), Default::default())
                .expect("loads"),
        )
    }

    #[tokio::test]
    async fn deltas_reach_the_listener_in_order_through_the_bounded_queue() {
        let provider = Chatty {
            deltas: DELTA_QUEUE * 10,
            had_sink: AtomicBool::new(false),
        };
        let mut deltas = Vec::new();
        let mut listener = |event: &Event| {
            if let EventKind::ProviderDelta { index, text, .. } = &event.kind {
                deltas.push((*index, text.clone()));
            }
        };
        let outcome = run_with_listener(
            program(),
            RunOptions::default(),
            &provider,
            &Toolbox::new(),
            &mut listener,
        )
        .await;
        assert!(provider.had_sink.load(Ordering::SeqCst));
        assert_eq!(deltas.len(), DELTA_QUEUE * 10);
        assert!(
            deltas
                .iter()
                .enumerate()
                .all(|(n, (index, text))| { *index == n as u64 && *text == format!("{n} ") })
        );
        let streamed: String = deltas.into_iter().map(|(_, text)| text).collect();
        assert_eq!(outcome.result_text(), streamed);
    }

    #[tokio::test]
    async fn without_a_listener_a_provider_gets_no_sink() {
        let provider = Chatty {
            deltas: 3,
            had_sink: AtomicBool::new(true),
        };
        let outcome = run(program(), RunOptions::default(), &provider).await;
        assert!(outcome.error.is_none());
        assert!(!provider.had_sink.load(Ordering::SeqCst));
    }

    /// Takes the call and never answers.
    struct Hung;

    impl Provider for Hung {
        fn complete<'a>(
            &'a self,
            _request: &'a ProviderRequest,
            _call: &'a CallContext,
        ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
            Box::pin(std::future::pending())
        }
    }

    /// Issue #22 R5: a cancel drops the call in flight; the run ends `cancelled`, not at
    /// its (here an hour away) deadline, and its events say so.
    #[tokio::test]
    async fn a_cancel_drops_the_provider_call_in_flight() {
        let options = RunOptions {
            timeout: Duration::from_secs(3600),
            ..RunOptions::default()
        };
        let interrupt = options.interrupt.clone();
        let mut events = Vec::new();
        let mut listener = |event: &Event| {
            if matches!(event.kind, EventKind::ProviderCall { .. }) {
                interrupt.cancel();
            }
            events.push(event.to_json());
        };
        let toolbox = Toolbox::new();
        let run = run_with_listener(program(), options, &Hung, &toolbox, &mut listener);
        let outcome = tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .expect("the cancel ended the run");
        let error = outcome.error.expect("cancelled");
        assert_eq!(error.kind, aplc_vm::RunErrorKind::Cancelled);
        let result = events.iter().find(|e| e["type"] == "provider_result");
        assert_eq!(
            result.expect("a provider_result")["error"]["kind"],
            "cancelled"
        );
        assert_eq!(events.last().expect("events")["outcome"], "cancelled");
    }
}

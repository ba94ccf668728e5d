//! The tokio driver: the one loop that performs what a run session asks for.
//!
//! Providers and tools are object-safe async traits ([`Provider`], [`Tool`]), so drivers
//! and embedders can mix HTTP providers, scripted ones, subprocess tools and Rust
//! closures. The machine itself lives in `aplc-vm`, which has no async runtime at all;
//! the [`RunSession`] around it lives in [`crate::session`].

use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

pub use crate::future::BoxFuture;
pub use crate::human::{Answerer, Nobody, Pending};
pub use crate::provider::{CallContext, DeltaSink, Provider, Scripted};
use crate::recorder::{INTERRUPTED_TOOL, Window};
pub use crate::session::Listener;
use crate::session::{Next, Observer, RunSession};
use crate::store::Batch;
pub use crate::tool::{Tool, Toolbox};
use aplc_vm::Program;
use aplc_vm::{Action, Machine, RunOptions, RunOutcome};

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
    drive_in_memory(program, options, provider, toolbox, None, &Nobody).await
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
    drive_in_memory(program, options, provider, toolbox, Some(listener), &Nobody).await
}

/// [`run_with_tools`] (or [`run_with_listener`], with a listener) whose requests for a
/// person (`spec/human.md`) `answerer` answers, in this process. A request it leaves
/// unanswered ends the run with [`RunErrorKind::InputUnavailable`](aplc_vm::RunErrorKind):
/// an in-memory run has nowhere to wait.
pub async fn run_with_answerer(
    program: Arc<Program>,
    mut options: RunOptions,
    provider: &dyn Provider,
    toolbox: &Toolbox,
    listener: Option<Listener<'_>>,
    answerer: &dyn Answerer,
) -> RunOutcome {
    options.events = listener.is_some();
    drive_in_memory(program, options, provider, toolbox, listener, answerer).await
}

async fn drive_in_memory(
    program: Arc<Program>,
    mut options: RunOptions,
    provider: &dyn Provider,
    toolbox: &Toolbox,
    listener: Option<Listener<'_>>,
    answerer: &dyn Answerer,
) -> RunOutcome {
    options.tools = toolbox.registry();
    let machine = Machine::new(program, options);
    let observer = listener.map(|listener| Box::new(listener) as Observer<'_>);
    let session = RunSession::new(machine, observer);
    match drive(session, provider, toolbox, &InMemory, answerer).await {
        Ok(Ended::Finished(outcome)) => outcome,
        // An in-memory journal is not durable, so a run without answers ends instead.
        Ok(Ended::Waiting(_)) => RunOutcome::unfinished("the run paused without a store"),
        Err(never) => match never {},
    }
}

/// How a driven run stopped: over, or waiting for a person (durable runs only).
#[derive(Debug)]
pub(crate) enum Ended {
    /// The run is over.
    Finished(RunOutcome),
    /// The run waits on these requests; its journal is committed with them.
    Waiting(Vec<Pending>),
}

/// Where a run's journal goes: nowhere for an in-memory run, the run's store for a
/// durable one ([`crate::durable`]).
pub(crate) trait Journal {
    /// Why a commit failed.
    type Error;

    /// Commits `batch` (nothing to do for `None`).
    fn commit(&self, batch: Option<Batch>) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// How far the run may go on ahead of its commits.
    fn window(&self) -> Window {
        Window::UNBOUNDED
    }

    /// True if the run can wait for a person in its store: then a request nobody
    /// answers pauses it, and answers go through the store, which takes one per request.
    fn durable(&self) -> bool {
        false
    }

    /// When the run first paused on request `id`, if it did before (kept across
    /// restarts).
    fn requested_at(&self, id: &str) -> Option<i64> {
        let _ = id;
        None
    }

    /// Offers `answer` to the store, which keeps the first answer per request.
    fn offer(
        &self,
        answer: &aplc_vm::human::HumanAnswer,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        let _ = answer;
        async { Ok(()) }
    }

    /// The answers the store holds for the run's pending requests, in order.
    fn stored_answers(
        &self,
    ) -> impl Future<Output = Result<Vec<aplc_vm::human::HumanAnswer>, Self::Error>> + Send {
        async { Ok(Vec::new()) }
    }
}

/// The journal of an in-memory run: it keeps nothing, and its session records nothing.
struct InMemory;

impl Journal for InMemory {
    type Error = std::convert::Infallible;

    async fn commit(&self, _batch: Option<Batch>) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// The one loop that drives a run: asks the session for its next action, performs it
/// with `provider` or `toolbox`, and hands the answer back, until the run is done.
///
/// A durable session's journal is committed in groups (`spec/durability.md`, "When the
/// journal commits"): at most one commit is in flight, so batches reach the store in
/// order, and the run goes on while it lands. At a provider call (or an idempotent
/// tool's), what the session recorded since the last group is queued behind the commit
/// in flight ([`Commits`]), and the call races the commits without waiting for them:
/// each queued group goes out as soon as the one before it lands. The run waits for everything to
/// be committed only where something outside it depends on it: before a non-idempotent
/// tool runs (so a tool in flight at a crash is known to be in flight), as soon as its
/// result is back, and with the outcome at the end. And it waits for the commit in flight
/// when it holds more than the journal's [`Window`] (in the session and the queue), so it
/// cannot outrun its store. A
/// crash loses at most the provider answers of the groups not committed: a resume asks
/// for them again. A tool call that was in flight at a crash runs again only if the tool
/// is idempotent; otherwise it resolves as a failed call.
pub(crate) async fn drive<J: Journal + Sync>(
    mut session: RunSession<'_>,
    provider: &dyn Provider,
    toolbox: &Toolbox,
    journal: &J,
    answerer: &dyn Answerer,
) -> Result<Ended, J::Error> {
    let mut commits = Commits::new(journal);
    loop {
        let Next { action, in_flight } = session.next_action();
        match action {
            Action::AwaitInput if session.machine().cancel_flag().reason().is_some() => {
                // Cancelled while it waits (the service's cancel of a waiting run): the
                // poll, journaled, ends the run `cancelled` without an answer.
                session.poll_to_end();
            }
            Action::AwaitInput => {
                let pending = pending_requests(&session, journal);
                if journal.durable() {
                    // The requests are committed before anyone is asked: a crash while
                    // a person thinks loses nothing, and the store can take answers.
                    session.set_pending(pending.iter().map(Pending::to_json).collect());
                    commits.flush(&mut session).await?;
                }
                let answers = gather_answers(journal, answerer, &pending).await?;
                if answers.is_empty() {
                    if journal.durable() {
                        return Ok(Ended::Waiting(pending));
                    }
                    session.abandon_input(crate::human::nobody_message(&pending));
                    continue;
                }
                for answer in answers {
                    // Answers that do not fit their request never reach the journal.
                    if session.machine().check_answer(&answer).is_ok() {
                        session.answer_person(answer);
                    }
                }
                if session.machine().expecting() != aplc_vm::Expecting::Answer && journal.durable()
                {
                    session.set_pending(Vec::new());
                }
            }
            Action::CallProvider(request) => {
                commits.begin(&mut session).await?;
                let answer = commits
                    .race(session.call_provider(provider, &request))
                    .await?;
                session.provider_answered(answer);
                commits.keep_within_window(&mut session).await?;
            }
            Action::CallTool(invocation) if toolbox.is_idempotent(&invocation.name) => {
                commits.begin(&mut session).await?;
                let answer = commits
                    .race(session.call_tool(toolbox, &invocation))
                    .await?;
                session.tool_answered(answer);
                commits.keep_within_window(&mut session).await?;
            }
            Action::CallTool(invocation) => {
                if in_flight {
                    session.answer_tool(Err(INTERRUPTED_TOOL.to_string()));
                    commits.flush(&mut session).await?;
                    continue;
                }
                commits.flush(&mut session).await?;
                let answer = session.call_tool(toolbox, &invocation).await;
                let returned = answer.is_ok();
                session.tool_answered(answer);
                if returned {
                    commits.flush(&mut session).await?;
                }
            }
            Action::Continue => {}
            Action::Done => {
                commits.wait().await?;
                let (outcome, batch) = session.finish();
                journal.commit(batch).await?;
                return Ok(Ended::Finished(outcome));
            }
        }
    }
}

/// The requests the run waits on, with the time each was first asked.
fn pending_requests(session: &RunSession<'_>, journal: &impl Journal) -> Vec<Pending> {
    let now = crate::human::now_ms();
    session
        .machine()
        .pending_requests()
        .into_iter()
        .map(|request| Pending {
            requested_at_ms: journal.requested_at(&request.id).unwrap_or(now),
            request: request.clone(),
        })
        .collect()
}

/// The answers to `pending` the run takes now: in a durable run, those its store holds,
/// the timeouts that passed, and the answerer's, each offered to the store first, which
/// keeps one per request (an answer given through the service meanwhile wins over the
/// terminal's); in memory, the answerer's.
async fn gather_answers<J: Journal>(
    journal: &J,
    answerer: &dyn Answerer,
    pending: &[Pending],
) -> Result<Vec<aplc_vm::human::HumanAnswer>, J::Error> {
    if !journal.durable() {
        return Ok(answerer.answer(pending).await);
    }
    let now = crate::human::now_ms();
    let mut stored = journal.stored_answers().await?;
    let unanswered = |stored: &[aplc_vm::human::HumanAnswer]| -> Vec<Pending> {
        pending
            .iter()
            .filter(|p| !stored.iter().any(|a| a.id == p.request.id))
            .cloned()
            .collect()
    };
    let mut offered = false;
    for expired in unanswered(&stored)
        .iter()
        .filter(|p| p.expires_at_ms().is_some_and(|at| at <= now))
    {
        journal
            .offer(&crate::human::timed_out(&expired.request.id, now))
            .await?;
        offered = true;
    }
    if offered {
        stored = journal.stored_answers().await?;
    }
    let left = unanswered(&stored);
    if !left.is_empty() {
        let given = answerer.answer(&left).await;
        for answer in &given {
            journal.offer(answer).await?;
        }
        if !given.is_empty() {
            stored = journal.stored_answers().await?;
        }
    }
    Ok(stored)
}

/// A commit in flight.
type Commit<'j, E> = Pin<Box<dyn Future<Output = Result<(), E>> + Send + 'j>>;

/// A run's commits: at most one in flight, so that groups reach the store in order, and
/// the groups taken from the session since, waiting to go next (merged into as few
/// batches as checkpoints allow).
///
/// Taking every group from the session before a call is what makes a long call safe: the
/// session is the call's while it runs, so what it recorded before the call must already
/// be here; it goes out as soon as the commits before it land, while the call is still
/// out. So the answers before a call are committed during it, however long it takes, as
/// when every step waited for its commit.
struct Commits<'j, J: Journal> {
    journal: &'j J,
    in_flight: Option<Commit<'j, J::Error>>,
    waiting: std::collections::VecDeque<Batch>,
    /// Inputs and bytes in `waiting`, kept as groups come and go: the window is checked
    /// at every step, and must not walk the queue to do it.
    waiting_size: (usize, usize),
    window: Window,
    /// Inputs the waiting groups hold before one goes out with no call out: a quarter of
    /// the window (`spec/durability.md`, "When the journal commits").
    hold: usize,
}

impl<'j, J: Journal + Sync> Commits<'j, J> {
    fn new(journal: &'j J) -> Self {
        Commits {
            journal,
            in_flight: None,
            waiting: std::collections::VecDeque::new(),
            waiting_size: (0, 0),
            window: journal.window(),
            hold: journal.window().inputs / 4,
        }
    }

    /// Sends the oldest waiting group, if no commit is in flight: `now`, or once the
    /// groups waiting hold [`Commits::hold`] inputs.
    fn start_next(&mut self, now: bool) {
        if self.in_flight.is_none()
            && (now || self.waiting_size.0 >= self.hold)
            && let Some(batch) = self.waiting.pop_front()
        {
            let (inputs, bytes) = batch.size();
            self.waiting_size.0 -= inputs;
            self.waiting_size.1 -= bytes;
            self.in_flight = Some(Box::pin(self.journal.commit(Some(batch))));
        }
    }

    /// Polls the commit in flight without waiting: a commit that landed is done with (its
    /// error ends the run) and the waiting group goes out if it is large enough; a new
    /// commit gets its request to the store's writer, which works on it while the run
    /// goes on.
    async fn poll(&mut self) -> Result<(), J::Error> {
        while let Some(commit) = self.in_flight.as_mut() {
            let polled = std::future::poll_fn(|cx| Poll::Ready(commit.as_mut().poll(cx))).await;
            let Poll::Ready(result) = polled else {
                break;
            };
            self.in_flight = None;
            result?;
            self.start_next(false);
        }
        Ok(())
    }

    /// Takes what `session` recorded since the last group as a waiting group (into the
    /// last one waiting, when their checkpoints allow), and sends the oldest if no commit
    /// is in flight.
    async fn begin(&mut self, session: &mut RunSession<'_>) -> Result<(), J::Error> {
        self.poll().await?;
        if let Some(batch) = session.batch() {
            let (inputs, bytes) = batch.size();
            self.waiting_size.0 += inputs;
            self.waiting_size.1 += bytes;
            match self.waiting.back_mut() {
                Some(last) => {
                    if let Some(batch) = last.absorb(batch) {
                        self.waiting.push_back(batch);
                    }
                }
                None => self.waiting.push_back(batch),
            }
        }
        self.start_next(false);
        self.poll().await
    }

    /// True if the groups waiting hold more than the window.
    fn outrun(&self) -> bool {
        let (inputs, bytes) = self.waiting_size;
        inputs > self.window.inputs || bytes > self.window.bytes
    }

    /// Awaits `work` (a call) while the commits land, without waiting for them. The
    /// commit is polled first, so the store's writer gets it even if `work` is done at
    /// once; when it lands, the waiting group goes out; a commit that fails ends the run
    /// (and drops the call).
    ///
    /// A call that answers at once (a scripted provider, `--mock`) leaves small groups
    /// waiting for a later one, so that instant answers make fewer, larger transactions;
    /// once a call has to be waited for, every waiting group goes out while it runs.
    async fn race<T>(&mut self, work: impl Future<Output = T>) -> Result<T, J::Error> {
        tokio::pin!(work);
        if let Poll::Ready(out) =
            std::future::poll_fn(|cx| Poll::Ready(work.as_mut().poll(cx))).await
        {
            return Ok(out);
        }
        self.start_next(true);
        loop {
            let Some(commit) = self.in_flight.as_mut() else {
                return Ok(work.await);
            };
            tokio::select! {
                biased;
                result = commit.as_mut() => {
                    self.in_flight = None;
                    result?;
                    self.start_next(true);
                }
                out = &mut work => return Ok(out),
            }
        }
    }

    /// Waits until the commit in flight and the waiting groups have landed.
    async fn wait(&mut self) -> Result<(), J::Error> {
        loop {
            self.start_next(true);
            let Some(commit) = self.in_flight.take() else {
                return Ok(());
            };
            commit.await?;
        }
    }

    /// Commits everything `session` recorded, and waits until it is committed.
    async fn flush(&mut self, session: &mut RunSession<'_>) -> Result<(), J::Error> {
        self.wait().await?;
        self.journal.commit(session.batch()).await
    }

    /// If `session` holds more than the window, waits for the commits in flight and
    /// starts the next group, so that a run cannot outrun its store.
    async fn keep_within_window(&mut self, session: &mut RunSession<'_>) -> Result<(), J::Error> {
        if session.outruns(&self.window) || self.outrun() {
            self.wait().await?;
            self.begin(session).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use std::time::Duration;

    use super::*;
    use crate::session::DELTA_QUEUE;
    use crate::tool::ProgressSink;
    use aplc_vm::tools::{ToolInvocation, ToolSpec};
    use aplc_vm::{Completion, Event, EventKind, ProviderError, ProviderRequest};
    use serde_json::Value as Json;

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

    /// A tool that reports its progress three times (with `SECRET` in each message) when
    /// it gets a sink, then answers.
    struct Steps;

    const SECRET: &str = "progress-secret-0123456789";

    impl Tool for Steps {
        fn call<'a>(
            &'a self,
            invocation: &'a ToolInvocation,
        ) -> BoxFuture<'a, Result<Json, String>> {
            self.call_with_progress(invocation, None)
        }

        fn call_with_progress<'a>(
            &'a self,
            _invocation: &'a ToolInvocation,
            progress: Option<&'a ProgressSink>,
        ) -> BoxFuture<'a, Result<Json, String>> {
            Box::pin(async move {
                for n in 1..=3 {
                    if let Some(sink) = progress {
                        sink.report(aplc_vm::Progress {
                            progress: f64::from(n),
                            total: (n > 1).then_some(3.0),
                            message: Some(format!("step {n}\nof 3: {SECRET}")),
                        });
                    }
                }
                Ok(Json::String("done".into()))
            })
        }
    }

    /// A run asking for the `steps` tool, with it in its toolbox (redacting `SECRET`).
    async fn run_steps(listener: Option<Listener<'_>>) -> RunOutcome {
        let script = r#"[{"content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "steps", "arguments": "{}"}}]}]"#;
        let provider = Scripted::new(aplc_vm::ScriptedProvider::from_json(script).unwrap());
        let spec = ToolSpec::new(serde_json::json!({"name": "steps"})).unwrap();
        let mut toolbox = Toolbox::new();
        toolbox.register(spec, Arc::new(Steps)).unwrap();
        toolbox.redact_with(crate::Redactor::new([SECRET]));
        match listener {
            Some(listener) => {
                run_with_listener(
                    program(),
                    RunOptions::default(),
                    &provider,
                    &toolbox,
                    listener,
                )
                .await
            }
            None => run_with_tools(program(), RunOptions::default(), &provider, &toolbox).await,
        }
    }

    /// A tool's progress reaches the listener as `tool_progress` events between its
    /// `tool_call` (whose `seq` they carry) and its `tool_result`, the message on one
    /// line and redacted; without a listener the tool gets no sink, and the run is the
    /// same.
    #[tokio::test]
    async fn tool_progress_reaches_the_listener_between_the_call_and_its_result() {
        let mut events = Vec::new();
        let mut listener = |event: &Event| events.push(event.clone());
        let outcome = run_steps(Some(&mut listener)).await;
        assert!(outcome.error.is_none(), "{:?}", outcome.error);
        let call = events
            .iter()
            .position(|e| matches!(e.kind, EventKind::ToolCall { .. }))
            .expect("a tool_call");
        let progress = &events[call + 1..call + 4];
        for (n, event) in progress.iter().enumerate() {
            assert_eq!(event.seq, events[call].seq);
            let json = event.to_json();
            assert_eq!(json["type"], "tool_progress", "{json}");
            assert_eq!(json["tool"], "steps");
            assert_eq!(json["call_id"], "c1");
            assert_eq!(json["step"], "a");
            assert_eq!(json["progress"], serde_json::json!(n as f64 + 1.0));
            let total = if n == 0 {
                Json::Null
            } else {
                serde_json::json!(3.0)
            };
            assert_eq!(json["total"], total);
            let message = json["message"].as_str().unwrap();
            assert!(message.starts_with(&format!("step {}", n + 1)), "{message}");
            assert!(
                !message.contains(SECRET) && !message.contains('\n'),
                "{message}"
            );
        }
        assert!(matches!(
            events[call + 4].kind,
            EventKind::ToolResult { .. }
        ));
        assert_eq!(events[call + 4].seq, events[call].seq + 1);

        let quiet = run_steps(None).await;
        assert_eq!(quiet.result_text(), outcome.result_text());
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

//! One run session: a [`Machine`] with everything that turns its actions into a run.
//!
//! A session owns the machine, the run's clock and deadline watchdog, the observer that
//! sees its events (with the delta relay of a streaming provider), and, for a durable
//! run, the record of its inputs and events waiting to be committed. It does no I/O of
//! its own: a driver asks it for the [`next_action`](RunSession::next_action), performs
//! it (awaits a provider or a tool, or hands it to Python), and gives the answer back
//! through [`answer`](RunSession::answer). Every input reaches the machine through its
//! one door ([`Machine::apply`]) and, in a durable run, is journaled there, in the same
//! call, with the position the machine reached ([`Position`]), so what is journaled is
//! exactly what the machine took.
//!
//! The tokio driver ([`crate::driver`]), the durable driver ([`crate::durable`], and
//! through it `aplc serve`'s workers) and the Python binding all drive sessions: one
//! clock, one relay, one journal recorder.

use std::time::{Duration, Instant};

use aplc_vm::human::HumanAnswer;
use aplc_vm::journal::Input;
use aplc_vm::tools::ToolInvocation;
use aplc_vm::{
    Action, Completion, Event, EventKind, Expecting, Machine, Progress, ProviderError,
    ProviderRequest, RunOutcome, ToolCallRef,
};
use serde_json::Value as Json;

use crate::native::ProgressSink;
use crate::provider::{CallContext, DeltaSink, Provider};
use crate::recorder::{Recorder, Window};
use crate::store::Batch;

/// Receives a run's events, in order, on the driver's task (see `spec/events.md`).
///
/// A callback rather than a channel: it costs nothing per event beyond the call, it keeps
/// the order without a queue, and it is where backpressure belongs (a slow listener slows
/// the run instead of growing a buffer). An embedder that wants a channel sends from it:
/// `&mut |event: &Event| { let _ = tx.send(event.clone()); }`. It should be quick: the
/// run waits for it, and the run's timeout keeps counting.
pub type Listener<'a> = &'a mut (dyn FnMut(&Event) + Send);

/// What a session hands its events to: a borrowed [`Listener`], or one it owns (the
/// Python binding's, which outlives any borrow).
pub type Observer<'a> = Box<dyn FnMut(&Event) + Send + 'a>;

/// How many deltas wait between a provider and a listener before the provider waits.
pub(crate) const DELTA_QUEUE: usize = 32;

/// How many progress reports of a tool call wait for the listener; more are dropped.
const PROGRESS_QUEUE: usize = 64;

/// A run in progress: its machine, clock, observer and (durable runs) journal record.
pub struct RunSession<'l> {
    machine: Machine,
    clock: RunClock,
    observer: Option<Observer<'l>>,
    /// The channel of a streaming provider's deltas, made at the first provider call
    /// when someone observes.
    relay: Option<DeltaRelay>,
    /// The provider call the next deltas belong to.
    stamp: DeltaStamp,
    /// A durable run's inputs and events not yet committed.
    recorder: Option<Recorder>,
    /// The action a replayed journal ends with: asked for before a crash, in flight.
    pending: Option<Action>,
    /// The machine's time when the run began to wait for a person: the clock stands
    /// still while it waits (`spec/human.md` §3), so answers are taken at this time and
    /// the clock restarts from it.
    paused_at: Option<Duration>,
}

impl std::fmt::Debug for RunSession<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunSession")
            .field("steps", &self.machine.steps())
            .field("now", &self.clock.now())
            .field("durable", &self.recorder.is_some())
            .finish_non_exhaustive()
    }
}

/// The action a session asks its driver to perform.
#[derive(Debug)]
pub struct Next {
    /// What to do: call the provider or a tool, or take the outcome ([`Action::Done`]).
    /// Never [`Action::Continue`]: the session polls on by itself.
    pub action: Action,
    /// True if the action was asked for before the process took the run over (a durable
    /// run resumed with a call in flight): it may have been performed already.
    pub in_flight: bool,
}

impl<'l> RunSession<'l> {
    /// A session of `machine`, a new run whose clock reads zero now, handing its events
    /// to `observer` (a streaming provider's deltas included).
    pub fn new(machine: Machine, observer: Option<Observer<'l>>) -> RunSession<'l> {
        RunSession::resumed(machine, Duration::ZERO, observer, None, None, None)
    }

    /// A session going on with `machine`, whose clock reads `offset` now. `recorder`
    /// journals it (durable runs); `pending` is the action in flight at a crash, and
    /// `last_event` the last event a replay re-made (the `provider_call` that deltas of
    /// the pending call belong to).
    pub(crate) fn resumed(
        machine: Machine,
        offset: Duration,
        observer: Option<Observer<'l>>,
        recorder: Option<Recorder>,
        pending: Option<Action>,
        last_event: Option<&Event>,
    ) -> RunSession<'l> {
        let clock = RunClock::start(&machine, offset);
        let mut session = RunSession {
            machine,
            clock,
            observer,
            relay: None,
            stamp: DeltaStamp::default(),
            recorder,
            pending,
            paused_at: None,
        };
        if let Some(event) = last_event {
            session.stamp.saw(event);
        }
        // A new run's first events (`run_started`); nothing for a resumed one.
        session.deliver();
        session
    }

    /// The run's clock.
    pub fn clock(&self) -> &RunClock {
        &self.clock
    }

    /// The provider call that a streaming provider's deltas belong to now.
    pub fn stamp(&self) -> &DeltaStamp {
        &self.stamp
    }

    /// The machine (for inspection: steps, variables).
    pub fn machine(&self) -> &Machine {
        &self.machine
    }

    /// Runs the machine to its next action: polls it (with the clock's time), journals
    /// the poll, and hands every event to the observer, until it asks for a call or is
    /// done. A resumed run first gets the action it was performing at the crash.
    pub fn next_action(&mut self) -> Next {
        if let Some(action) = self.pending.take() {
            if matches!(action, Action::AwaitInput) {
                self.stand_still(self.clock.now());
            }
            return Next {
                action,
                in_flight: true,
            };
        }
        if self.machine.expecting() == Expecting::Answer {
            // Some requests are answered, others not yet (here or before a restart):
            // the run waits on.
            if self.paused_at.is_none() {
                self.stand_still(self.clock.now());
            }
            return Next {
                action: Action::AwaitInput,
                in_flight: false,
            };
        }
        if let Some(at) = self.paused_at.take() {
            self.restart_clock(at);
        }
        loop {
            let at = self.clock.now();
            let action = self.apply(Input::Poll { at });
            if matches!(action, Action::AwaitInput) {
                self.stand_still(at);
            }
            if !matches!(action, Action::Continue) {
                return Next {
                    action,
                    in_flight: false,
                };
            }
        }
    }

    /// Hands the machine `input`, journals it with the position the machine reached,
    /// and delivers the events it made. Returns the machine's action (for a poll;
    /// [`Action::Continue`] for an answer).
    pub fn apply(&mut self, input: Input) -> Action {
        let action = match self.recorder.as_mut() {
            None => self.machine.apply(input),
            Some(recorder) => recorder.input(&mut self.machine, input),
        };
        self.deliver();
        action
    }

    /// Hands in an answer: the machine goes on only when polled, so it asks for nothing.
    fn answer(&mut self, input: Input) {
        let action = self.apply(input);
        debug_assert!(matches!(action, Action::Continue), "{action:?}");
    }

    /// Hands the machine the provider's answer, taken now.
    pub fn answer_provider(&mut self, mut result: Result<Completion, ProviderError>) {
        if let (Some(recorder), Err(error)) = (&self.recorder, &mut result) {
            // A server may echo a key into a message; the journal must never hold one.
            error.message = recorder.redactor().redact(&error.message);
        }
        let at = self.clock.now();
        self.answer(Input::Provider { at, result });
        // The machine is at rest (its next input is a poll): a checkpoint may be due.
        if let Some(recorder) = self.recorder.as_mut() {
            recorder.maybe_checkpoint(&self.machine, at);
        }
    }

    /// Hands the machine a person's answer to one of the requests it waits on, taken at
    /// the time the run began to wait. Check it first ([`Machine::check_answer`]): one
    /// that does not fit ends the run with a protocol error.
    pub fn answer_person(&mut self, answer: HumanAnswer) {
        let at = *self.paused_at.get_or_insert_with(|| self.clock.now());
        self.answer(Input::Answer { at, answer });
    }

    /// The run begins to wait for a person at `at`: its clock stands still (no
    /// deadline passes) until the answers are in.
    fn stand_still(&mut self, at: Duration) {
        self.paused_at = Some(at);
        self.clock.stand_still();
    }

    /// The machine's time when the run began to wait, if it waits.
    pub fn paused_at(&self) -> Option<Duration> {
        self.paused_at
    }

    /// Restarts the clock at `at`: the time a run spent waiting for a person does not
    /// count. The deadline and its watchdog move with it, and a delta relay, which holds
    /// the old deadline, is made anew at the next call.
    fn restart_clock(&mut self, at: Duration) {
        self.clock = RunClock::start(&self.machine, at);
        self.relay = None;
    }

    /// Stores `pending` (the requests the run waits on, as hosts show them; empty: none)
    /// with the next batch of a durable run.
    pub(crate) fn set_pending(&mut self, pending: Vec<Json>) {
        if let Some(recorder) = self.recorder.as_mut() {
            recorder.set_pending(pending);
        }
    }

    /// Polls a run that waits for a person but whose cancel flag is set: the machine
    /// ends it as the flag says (the poll is journaled, like any cancel's).
    pub fn poll_to_end(&mut self) {
        let at = self.paused_at.take().unwrap_or_else(|| self.clock.now());
        let action = self.apply(Input::Poll { at });
        debug_assert!(matches!(action, Action::Done), "{action:?}");
    }

    /// Ends a run that waits for answers nobody can give ([`Machine::abandon_input`]).
    pub fn abandon_input(&mut self, message: String) {
        self.machine.abandon_input(message);
        self.deliver();
    }

    /// Hands the machine a tool's result (or failure message), taken now.
    pub fn answer_tool(&mut self, result: Result<Json, String>) {
        let at = self.clock.now();
        self.answer(Input::Tool { at, result });
    }

    /// Tells the machine its deadline passed while the driver performed its action.
    pub fn time_out(&mut self) {
        let at = self.clock.timed_out_at();
        self.answer(Input::Timeout { at });
    }

    /// Hands the machine what became of a provider call awaited until the run stopped
    /// ([`RunSession::call_provider`]): its answer, or why it was dropped ([`Stopped`]).
    pub fn provider_answered(
        &mut self,
        answer: Result<Result<Completion, ProviderError>, Stopped>,
    ) {
        match answer {
            Ok(result) => self.answer_provider(result),
            Err(stopped) => self.stopped(stopped),
        }
    }

    /// Hands the machine what became of a tool call awaited until the run stopped.
    pub fn tool_answered(&mut self, answer: Result<Result<Json, String>, Stopped>) {
        match answer {
            Ok(result) => self.answer_tool(result),
            Err(stopped) => self.stopped(stopped),
        }
    }

    /// A dropped call: at the deadline, the timeout is an input like any other. A
    /// cancelled call hands in nothing: the next poll ends the run `cancelled`, and a
    /// cancelled run is final, never resumed, so its journal need not replay past it.
    fn stopped(&mut self, stopped: Stopped) {
        if stopped == Stopped::Deadline {
            self.time_out();
        }
    }

    /// Calls `provider` with `request` until the run's deadline or cancel (then why it
    /// stopped). With an observer, the provider gets a delta sink, and every delta it
    /// sends reaches the observer as a `provider_delta` event, in order, before the
    /// answer comes back.
    pub async fn call_provider(
        &mut self,
        provider: &dyn Provider,
        request: &ProviderRequest,
    ) -> Result<Result<Completion, ProviderError>, Stopped> {
        let RunSession {
            clock,
            observer,
            relay,
            stamp,
            ..
        } = self;
        let Some(observer) = observer.as_mut() else {
            return clock
                .until_stopped(provider.complete(request, clock.call()))
                .await;
        };
        let relay = relay.get_or_insert_with(|| DeltaRelay::new(clock));
        let DeltaRelay { receiver, call } = relay;
        let mut index = 0u64;
        let emit = |text: String| {
            observer(&stamp.event(clock.now(), index, text));
            index += 1;
        };
        let answer = clock.until_stopped(provider.complete(request, call));
        relay_deltas(answer, receiver, emit).await
    }

    /// Runs the tool `invocation` asks for with `toolbox` until the run's deadline or
    /// cancel (then why it stopped). With an observer, the tool gets a progress sink,
    /// and every report it makes reaches the observer as a `tool_progress` event, in
    /// order, before the answer comes back; live only, like a provider's deltas.
    pub(crate) async fn call_tool(
        &mut self,
        toolbox: &impl ToolRunner,
        invocation: &ToolInvocation,
    ) -> Result<Result<Json, String>, Stopped> {
        let RunSession {
            clock,
            observer,
            stamp,
            ..
        } = self;
        let Some(observer) = observer.as_mut() else {
            return toolbox.run(invocation, clock, None).await;
        };
        let (sink, mut receiver) = ProgressSink::channel(PROGRESS_QUEUE);
        let call = ToolCallRef {
            step: &stamp.tool_step,
            tool: &invocation.name,
            call_id: &invocation.id,
        };
        let emit = |mut progress: Progress| {
            progress.message = progress.message.map(|m| toolbox.progress_message(&m));
            let mut event = Event::tool_progress(stamp.tool_seq, clock.now(), &call, progress);
            event.path.clone_from(&stamp.tool_path);
            observer(&event);
        };
        let answer = toolbox.run(invocation, clock, Some(&sink));
        relay_deltas(answer, &mut receiver, emit).await
    }

    /// The inputs and events recorded since the last batch, for a durable run's commit
    /// (with the checkpoint due, if any); `None` when there is nothing to commit or the
    /// run is not durable.
    pub(crate) fn batch(&mut self) -> Option<Batch> {
        let steps = self.machine.steps();
        self.recorder.as_mut()?.batch(steps, None)
    }

    /// True if a durable run holds more uncommitted inputs or bytes than `window` lets it.
    pub(crate) fn outruns(&self, window: &Window) -> bool {
        self.recorder
            .as_ref()
            .is_some_and(|recorder| recorder.outruns(window))
    }

    /// The run's outcome, once [`next_action`](Self::next_action) said
    /// [`Action::Done`] (earlier, the run counts as failed with a protocol error), with
    /// a durable run's last batch, which stores it.
    pub fn finish(self) -> (RunOutcome, Option<Batch>) {
        let outcome = self.machine.into_outcome();
        let batch = self.recorder.map(|mut recorder| recorder.finish(&outcome));
        (outcome, batch)
    }

    /// Hands the machine's new events to the recorder (journaled, redacted) and the
    /// observer, noting the provider call that deltas belong to.
    fn deliver(&mut self) {
        for event in self.machine.drain_events() {
            self.stamp.saw(&event);
            if let Some(observer) = self.observer.as_mut() {
                observer(&event);
            }
            if let Some(recorder) = self.recorder.as_mut() {
                recorder.event(event);
            }
        }
    }
}

/// Awaits `answer` (a provider call whose delta sink feeds `receiver`, or a tool call
/// whose progress sink does), handing every item to `emit` as it arrives, in order; the
/// items sent before the call returned are all emitted before its answer is.
pub async fn relay_deltas<T, D>(
    answer: impl Future<Output = T>,
    receiver: &mut tokio::sync::mpsc::Receiver<D>,
    mut emit: impl FnMut(D),
) -> T {
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

/// What runs a run's tool calls for [`RunSession::call_tool`]: the
/// [`Toolbox`](crate::tool::Toolbox). A trait, so that the session, which the toolbox
/// uses (its clock), does not use the toolbox in turn.
pub(crate) trait ToolRunner {
    /// Runs the call until the run's deadline or cancel, reporting its progress to
    /// `progress`: its result, redacted, or why it was dropped.
    async fn run(
        &self,
        invocation: &ToolInvocation,
        clock: &RunClock,
        progress: Option<&ProgressSink>,
    ) -> Result<Result<Json, String>, Stopped>;

    /// A tool's progress `message` as an event may carry it.
    fn progress_message(&self, message: &str) -> String;
}

/// Which provider call a streaming provider's deltas belong to: the `seq`, step and
/// path (a child run's, `spec/agents.md`) of the last `provider_call` event
/// (`spec/events.md`, "Streaming deltas"); and which tool call a tool's progress belongs
/// to: those of the last `tool_call`.
#[derive(Debug, Clone, Default)]
pub struct DeltaStamp {
    seq: u64,
    step: String,
    path: Option<String>,
    tool_seq: u64,
    tool_step: String,
    tool_path: Option<String>,
}

impl DeltaStamp {
    /// Notes the call that the next deltas (or progress reports) belong to, if `event`
    /// starts one.
    pub fn saw(&mut self, event: &Event) {
        match &event.kind {
            EventKind::ProviderCall { step, .. } => {
                self.seq = event.seq;
                self.step.clone_from(step);
                self.path.clone_from(&event.path);
            }
            EventKind::ToolCall { step, .. } => {
                self.tool_seq = event.seq;
                self.tool_step.clone_from(step);
                self.tool_path.clone_from(&event.path);
            }
            _ => {}
        }
    }

    /// Delta number `index` of the call, which arrived at `at`.
    pub fn event(&self, at: Duration, index: u64, text: String) -> Event {
        let mut event = Event::provider_delta(self.seq, at, &self.step, index, text);
        event.path.clone_from(&self.path);
        event
    }
}

/// Carries a run's text deltas from its provider calls to its observer. One per session
/// that has an observer: a run without one builds no channel and sends its providers no
/// sink.
struct DeltaRelay {
    receiver: tokio::sync::mpsc::Receiver<String>,
    /// The run's call context, with the sending end.
    call: CallContext,
}

impl DeltaRelay {
    fn new(clock: &RunClock) -> DeltaRelay {
        let (sink, receiver) = DeltaSink::channel(DELTA_QUEUE);
        DeltaRelay {
            receiver,
            call: clock.call().clone().with_deltas(sink),
        }
    }
}

/// A run's clock and deadline.
///
/// The machine's time is `offset` (where a resumed run left off; zero for a new one)
/// plus the time since the clock started, on tokio's clock, which the timers use too
/// (and which tests can pause and advance). Outside a tokio runtime (the Python binding
/// drives a session on its event loop's thread) tokio's clock is the system's.
pub struct RunClock {
    base: Timebase,
    /// The run's deadline on tokio's clock, for timers.
    deadline: tokio::time::Instant,
    /// The same deadline in machine time.
    machine_deadline: Duration,
    call: CallContext,
    /// The embedder's cancel flag ([`Machine::cancel_flag`]).
    cancel: aplc_vm::Interrupt,
    /// `None` while the run waits for a person: its clock stands still, and the
    /// deadline must not pass meanwhile.
    watchdog: Option<crate::watchdog::Armed>,
}

/// What turns the clock's instants into machine time; a copy reads the same time (the
/// Python binding's delta relay keeps one on another thread).
#[derive(Debug, Clone, Copy)]
pub struct Timebase {
    start: tokio::time::Instant,
    offset: Duration,
}

impl Timebase {
    /// The machine's time now.
    pub fn now(&self) -> Duration {
        self.offset + self.start.elapsed()
    }
}

/// Why an awaited call did not finish: it was dropped, and the machine must hear why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// The run's deadline came first: [`RunSession::time_out`], journaled.
    Deadline,
    /// The run was cancelled (or its embedder set the flag): nothing is handed in or
    /// journaled for the call; the next poll ends the run as the flag says.
    Interrupted,
}

impl RunClock {
    /// Starts the clock of `machine`, which reads `offset` now, and arms its watchdog.
    fn start(machine: &Machine, offset: Duration) -> RunClock {
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
            base: Timebase { start, offset },
            deadline,
            machine_deadline: machine.deadline(),
            call: CallContext::new(deadline.into_std()),
            cancel: machine.cancel_flag().clone(),
            watchdog: Some(crate::watchdog::arm(watch_at, machine.deadline_flag())),
        }
    }

    /// The machine's time now.
    pub fn now(&self) -> Duration {
        self.base.now()
    }

    /// Stops the deadline's watchdog: the run waits for a person, and its clock stands
    /// still (it restarts with a watchdog of its own).
    fn stand_still(&mut self) {
        self.watchdog = None;
    }

    /// What reads this clock's time elsewhere.
    pub fn timebase(&self) -> Timebase {
        self.base
    }

    /// The time to report a timeout at: the timer fired at the deadline, so that is the
    /// earliest "now".
    pub fn timed_out_at(&self) -> Duration {
        self.now().max(self.machine_deadline)
    }

    /// The run's deadline on the system clock.
    pub fn deadline(&self) -> Instant {
        self.deadline.into_std()
    }

    /// Time left until the deadline (zero once it has passed).
    pub fn remaining(&self) -> Duration {
        self.machine_deadline
            .min(FAR_FUTURE)
            .saturating_sub(self.now())
    }

    /// What a provider call needs to know of the run.
    pub fn call(&self) -> &CallContext {
        &self.call
    }

    /// `work`'s output, or why it was dropped: the run's deadline or its cancel came
    /// first. This is the one place a driver awaits a provider or a tool, so every host
    /// (the CLI, the service's workers, the durable driver) stops a call the same way.
    pub async fn until_stopped<T>(&self, work: impl Future<Output = T>) -> Result<T, Stopped> {
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

//! One run of a program, as a sans-IO state machine.
//!
//! The machine owns the run's live context and walks the program's instructions. It never
//! reads a clock, sleeps, spawns or does I/O: the driver passes the current time into
//! every call and performs the provider calls the machine asks for.
//!
//! The contract, in the order a driver calls things:
//!
//! 1. [`Machine::new`]: the run starts; its clock reads zero.
//! 2. [`Machine::poll`] with the current time. It runs instructions until the run needs
//!    something from outside or a step ends, and returns an [`Action`]:
//!    * [`Action::CallProvider`]: call the provider, then hand the result to
//!      [`Machine::handle_provider_response`]. If [`Machine::deadline`] passes first, call
//!      [`Machine::handle_timeout`] instead.
//!    * [`Action::CallTool`]: execute the tool, then hand the result to
//!      [`Machine::handle_tool_result`] (or call [`Machine::handle_timeout`]). Tool calls
//!      come one at a time, in the order the model listed them.
//!    * [`Action::Continue`]: a step ended, or (with [`RunOptions::events`]) a phase
//!      did; poll again (with a fresh time).
//!    * [`Action::Done`]: the run is over; take the result with [`Machine::into_outcome`].
//! 3. Repeat 2 until `Done`. With [`RunOptions::events`] on, take the events recorded
//!    with [`Machine::drain_events`] after each call (`spec/events.md`).
//!
//! Every one of those calls is one [`Input`](crate::journal::Input), and
//! [`Machine::apply`] is the door that takes them all: drivers hand inputs in through it
//! (the runtime's `RunSession` does), so what a durable run journals is exactly what the
//! machine took, and [`Machine::replay`] re-applies a journal, checking each input
//! against the kind the machine waits for ([`Machine::expecting`]) and the position the
//! journal recorded after it ([`Machine::position`]).
//!
//! Every time is a [`Duration`] since the run started, as the driver measures it: the
//! core never holds an `Instant`, which a `wasm32-unknown-unknown` embedder cannot make,
//! and a journal of the times passed in replays a run exactly.
//!
//! `poll` returns at the latest at the end of every step, so a driver that passes a fresh
//! time each call enforces the run timeout even in a loop that never calls the provider.
//!
//! Within a step, one render can run long (up to its fuel). The machine reads no clock,
//! so it cannot notice the deadline there by itself: two [`Interrupt`] flags are the
//! inputs for that. The driver sets [`Machine::deadline_flag`] when the deadline passes
//! (the tokio driver has a watchdog thread do it), an embedder cancels through
//! [`RunOptions::interrupt`]. Either stops a render within a few hundred template
//! instructions, and the run ends with a timeout (or [`RunErrorKind::Cancelled`]).
//! Pure drivers such as [`run_scripted`] set neither.

mod checkpoint;
mod child;
mod door;

pub use checkpoint::{DeferredCheckpoint, HistorySegment};
pub use door::Expecting;

use std::sync::Arc;
use std::time::Duration;

use crate::run::journal::{Checkpoint, JournalError};

use imbl::Vector;
use minijinja::Value;

use crate::bundle::{Instr, MessageEntry, StepId, TemplateId};
use crate::human::{HumanAnswer, InputRequest, Reply, RequestKind};
use crate::interrupt::{Interrupt, InterruptReason};
use crate::names::{self, Section, Unsettable, slot_of};
use crate::program::Program;
use crate::provider::exchange::{
    Completion, Message, Part, ProviderError, ProviderRequest, ToolCall,
};
use crate::provider::messages::{build_message, message_value};
use crate::provider::request::build_request;
use crate::provider::response::{parse_json_output, validate_output};
use crate::provider::tools::{Allowed, Ledger, ToolInvocation, ToolRegistry, check_call};
use crate::run::events::{Event, Phase, Recorder};
use crate::run::{RunError, RunErrorKind, RunOptions};
use crate::template::env::render;
use crate::template::store::{CONTEXT_HISTORY, Store, Vars, value_from_json};
use crate::text::{escape_control, truncate_chars};

/// At most this many of the running step's errors go into a run failure's message.
const FAILURE_ERRORS: usize = 3;

/// Each of those errors is cut to this many characters.
const FAILURE_ERROR_CHARS: usize = 300;

/// What the machine needs the driver to do next.
#[derive(Debug)]
#[must_use]
pub enum Action {
    /// Call the provider with this request and pass the result to
    /// [`Machine::handle_provider_response`]. Boxed: a request is large, and comes once
    /// per step at most.
    CallProvider(Box<ProviderRequest>),
    /// Execute this tool and pass the result to [`Machine::handle_tool_result`].
    CallTool(ToolInvocation),
    /// A step ended, or with [`RunOptions::events`] a phase did: call [`Machine::poll`]
    /// again, with a fresh time (the phase's end).
    Continue,
    /// The run asks a person ([`Machine::pending_requests`]): hand in an answer to each
    /// request with [`Machine::apply`] (`Input::Answer`), then poll again. A driver with
    /// nobody to ask pauses the run (durable runs) or ends it
    /// ([`Machine::abandon_input`]).
    AwaitInput,
    /// The run is over: take the result with [`Machine::into_outcome`].
    Done,
}

/// The result of a run.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// Every variable at the end of the run.
    pub vars: Vars,
    /// `context_history`: one snapshot per finished step.
    pub history: Vector<Value>,
    /// Why the run failed, if it did.
    pub error: Option<RunError>,
    /// The `errors` of the last finished step, whether or not they were reset: after a
    /// step with a post phase the final `errors` is `[]` (§2.3), but these remain.
    pub last_step_errors: Vec<String>,
    /// Number of steps entered.
    pub steps: u64,
}

impl RunOutcome {
    /// The outcome of a run its driver had to stop before it could end (a protocol error
    /// with `message`), with no variables: for drivers that have nothing better.
    pub fn unfinished(message: &str) -> RunOutcome {
        RunOutcome {
            vars: Vars::new(),
            history: Vector::new(),
            error: Some(RunError {
                kind: RunErrorKind::Protocol,
                message: message.to_owned(),
                step: None,
                span: None,
            }),
            last_step_errors: Vec::new(),
            steps: 0,
        }
    }

    /// `result_text` as a string ("" when it is not a string).
    pub fn result_text(&self) -> String {
        self.vars
            .get(names::RESULT_TEXT)
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    }

    /// The final context as a template root value, for evaluating Jinja expressions over
    /// it in the [`template_env`](crate::template_env) (as `aplc test` does with `expect`).
    ///
    /// It is the same kind of root every render of the run had: every variable,
    /// `context`, `context_history`, and the helpers of §6.3 and §7.4 work
    /// (`get_context('x', 0)`). Writes through `set_context` change only this root, never
    /// the outcome.
    pub fn template_root(&self) -> Value {
        Value::from_dyn_object(Store::from_parts(self.vars.clone(), self.history.clone()))
    }

    /// The final context as one JSON object: every variable plus `context_history`, keys
    /// sorted. The `context` view is left out: it would repeat every variable.
    pub fn context_json(&self) -> serde_json::Value {
        let mut map = self.variables_map();
        let history: Vec<serde_json::Value> = self.history.iter().map(to_json).collect();
        map.insert(
            CONTEXT_HISTORY.to_string(),
            serde_json::Value::Array(history),
        );
        serde_json::Value::Object(map.into_iter().collect())
    }

    /// The final variables as one JSON object, keys sorted, without `context_history`:
    /// [`context_json`](Self::context_json) less the history, which it never converts.
    /// The history holds every step's variables, so a long run's would cost O(steps ×
    /// context) to convert only to be dropped (a 10,000-step run's took 58 MB at its end).
    pub fn variables_json(&self) -> serde_json::Value {
        serde_json::Value::Object(self.variables_map().into_iter().collect())
    }

    fn variables_map(&self) -> std::collections::BTreeMap<String, serde_json::Value> {
        self.vars
            .iter()
            .map(|(k, v)| (k.to_string(), to_json(v)))
            .collect()
    }
}

/// How deeply nested a value may be to be turned into JSON: the template limit (the
/// default `Limits::max_depth`) plus room for values from outside (serde_json reads at
/// most 128 levels).
const MAX_JSON_DEPTH: usize = 512;

fn to_json(value: &Value) -> serde_json::Value {
    // Templates cannot build values deeper than `Limits::max_depth`, but an embedder's
    // `with_context` values are not checked; serialization recurses, so a value too deep
    // is left out rather than overflow the stack.
    if nested_deeper_than(value, MAX_JSON_DEPTH) {
        return serde_json::Value::String(format!(
            "<left out: nested more than {MAX_JSON_DEPTH} levels deep>"
        ));
    }
    // Values that JSON cannot represent (functions, macros) become their text.
    serde_json::to_value(value).unwrap_or_else(|_| serde_json::Value::String(value.to_string()))
}

/// True if `value` nests lists and maps more than `budget` levels deep. Stops as soon as
/// it passes the budget.
fn nested_deeper_than(value: &Value, budget: usize) -> bool {
    use minijinja::value::ValueKind;
    if !matches!(
        value.kind(),
        ValueKind::Seq | ValueKind::Map | ValueKind::Iterable
    ) {
        return false;
    }
    if budget == 0 {
        return true;
    }
    if value.kind() == ValueKind::Map {
        if let Some(pairs) = value.as_object().and_then(|o| o.try_iter_pairs()) {
            return pairs.into_iter().any(|(k, v)| {
                nested_deeper_than(&k, budget - 1) || nested_deeper_than(&v, budget - 1)
            });
        }
        return false;
    }
    match value.try_iter() {
        Ok(mut items) => items.any(|item| nested_deeper_than(&item, budget - 1)),
        Err(_) => false,
    }
}

/// Where the run is in the calling contract, with what that point needs to remember.
#[derive(Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "one per run, kept inline in the machine: boxing would only add an allocation"
)]
enum State {
    /// Running instructions.
    Running,
    /// Running, but a role section of the step failed to render: the step's provider call
    /// is skipped.
    PromptFailed,
    /// Waiting for [`Machine::handle_provider_response`].
    AwaitingProvider,
    /// Running, with the provider's answer for `ProcessResponse` to read.
    Responded(Result<Completion, ProviderError>),
    /// Waiting for [`Machine::handle_tool_result`] for the running call of the tool round.
    AwaitingTool {
        /// The call's idempotency key, if its result may be reused.
        key: Option<String>,
    },
    /// Waiting for a person's answers to the requests in [`Machine::asking`].
    AwaitingInput,
    /// The run is over.
    Done,
}

/// The tool calls of one response, being worked through in order.
#[derive(Debug)]
struct ToolRound {
    calls: Vec<ToolCall>,
    /// Index of the next call to check.
    next: usize,
    /// One `result_tool_calls` entry per finished call.
    results: Vec<Value>,
    /// Once the round has asked for approvals (`spec/human.md` §1.1): per call, what the
    /// reviewer decided (`None` for calls that needed no approval).
    verdicts: Option<Vec<Option<Verdict>>>,
}

/// A reviewer's decision on one tool call.
#[derive(Debug, Clone)]
enum Verdict {
    Approved,
    /// Denied, with the message the call's failed result carries.
    Denied(String),
}

/// The requests a run waits on, with the replies taken so far, and what they are for.
#[derive(Debug)]
struct Asking {
    requests: Vec<InputRequest>,
    replies: Vec<Option<Reply>>,
    purpose: Purpose,
    /// For approvals: the round's call that each request is about.
    calls: Vec<usize>,
}

/// What a run does with its answers once every request has one.
#[derive(Debug, Clone, Copy)]
enum Purpose {
    /// The approvals of the tool round's calls: request `i` is about call `calls[i]`.
    Approvals,
    /// A human tool's call: the running call of the tool round.
    HumanTool,
    /// `await_input`: the answer goes to `human_input`.
    AwaitInput,
}

/// One run of a [`Program`]. See the module docs for the calling contract.
#[derive(Debug)]
pub struct Machine {
    program: Arc<Program>,
    store: Arc<Store>,
    state: State,
    pc: usize,
    step: Option<StepId>,
    /// Successful provider calls per step, over the whole run.
    runs: Vec<u64>,
    global_runs: u64,
    max_runs: Option<u64>,
    max_steps: u64,
    step_started: Duration,
    deadline: Duration,
    timeout: Duration,
    /// The step's messages, as rendered by its role sections, for the provider request.
    messages: Arc<[Message]>,
    /// The tool calls of the step's response, until `CallTools` starts them.
    tool_calls: Vec<ToolCall>,
    tools: Arc<ToolRegistry>,
    tool_round: Option<ToolRound>,
    ledger: Ledger,
    /// The current step ran its post phase, so its `errors` are reset after it (§2.3).
    post_ran: bool,
    last_step_errors: Vec<String>,
    /// The step whose errors `last_step_errors` holds.
    last_errors_step: Option<StepId>,
    steps: u64,
    error: Option<RunError>,
    /// This run's own deadline flag (set by the driver) and the embedder's flag.
    interrupt: [Interrupt; 2],
    events: Recorder,
    /// The namespaces checkpoints have written, by identity (`checkpoint.rs`).
    namespaces: Arc<checkpoint::Namespaces>,
    /// What the run asks a person, while it waits ([`State::AwaitingInput`]).
    asking: Option<Asking>,
    /// The agents it may call, the child running now, and its depth (`child.rs`).
    nest: child::Nest,
}

impl Machine {
    /// Starts a run. Its clock reads zero now: every later time is measured from here.
    ///
    /// Invalid options (a `with_context` name the run refuses) and declared inputs
    /// missing from `with_context` end the run here: the first [`poll`](Self::poll)
    /// returns [`Action::Done`] and the outcome carries the error.
    pub fn new(program: Arc<Program>, options: RunOptions) -> Machine {
        let mut events =
            Recorder::new(options.events, options.journaled).with_phase_times(options.phase_times);
        let bundle = program.bundle();
        events.run_started(bundle, &options);
        let store = Store::new(program.initial_vars().clone());
        for (name, value) in &options.with_context {
            if invalid_context_name(name).is_some() {
                break;
            }
            store.set(name, value.clone());
        }
        let error = options_error(&program, &options);
        let steps = program.bundle().steps.len();
        let nest = child::Nest::root(&program, &options);
        let tools = nest.agents.tools(&options.tools);
        Machine {
            program,
            store,
            state: if error.is_some() {
                State::Done
            } else {
                State::Running
            },
            pc: 0,
            step: None,
            runs: vec![0; steps],
            global_runs: 0,
            max_runs: options.max_runs,
            max_steps: options.max_steps,
            step_started: Duration::ZERO,
            deadline: options.timeout,
            timeout: options.timeout,
            messages: Arc::new([]),
            tool_calls: Vec::new(),
            tools,
            tool_round: None,
            ledger: Ledger::default(),
            post_ran: false,
            last_step_errors: Vec::new(),
            last_errors_step: None,
            steps: 0,
            error,
            interrupt: [Interrupt::new(), options.interrupt],
            events,
            namespaces: Default::default(),
            asking: None,
            nest,
        }
    }

    /// When the run times out, since it started.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Takes the events recorded since the last call (none unless [`RunOptions::events`]
    /// is on). Call after every `poll` and `handle_*`; the last one, `run_finished`,
    /// comes with the `poll` that returns [`Action::Done`].
    pub fn drain_events(&mut self) -> std::vec::Drain<'_, Event> {
        self.events.drain()
    }

    /// The flag a driver sets when [`Machine::deadline`] passes, to stop a render that
    /// is still running: the machine reads no clock. Each run has its own.
    pub fn deadline_flag(&self) -> &Interrupt {
        &self.interrupt[0]
    }

    /// The embedder's flag ([`RunOptions::interrupt`]): a driver races every provider and
    /// tool call against [`Interrupt::interrupted`] on it, so a cancel needs no call to
    /// end first.
    pub fn cancel_flag(&self) -> &Interrupt {
        &self.interrupt[1]
    }

    /// Builds events from now on (`true`), or only counts them (`false`), in a journaled
    /// run ([`RunOptions::journaled`], children included): its sequence goes on the same
    /// either way. A resumed durable run replays with events on, to check its journal,
    /// then goes on without them when nobody listens. A run that is not journaled keeps
    /// what it started with.
    pub fn set_events(&mut self, on: bool) {
        self.events.set_on(on);
        if let Some(child) = self.child_mut() {
            child.set_events(on);
        }
    }

    /// The run's live store (for embedders that inspect a run in progress).
    pub fn vars(&self) -> Vars {
        self.store.vars()
    }

    // `poll` and the `handle_*` methods are `apply` for one kind of input each. They call
    // what `apply` calls directly: building an `Input` only to take it apart again moved
    // a completion twice per step (+4% per step on loop4, measured).

    /// Runs until the next [`Action`]: `apply(Input::Poll { at: now })`.
    pub fn poll(&mut self, now: Duration) -> Action {
        self.take_poll(now)
    }

    /// Hands the machine the result of the provider call it asked for:
    /// `apply(Input::Provider { at: now, result })`.
    pub fn handle_provider_response(
        &mut self,
        now: Duration,
        result: Result<Completion, ProviderError>,
    ) {
        self.take_provider_response(now, result);
    }

    /// Hands the machine the result of the tool call it asked for, the tool's output or
    /// an error message: `apply(Input::Tool { at: now, result })`.
    pub fn handle_tool_result(&mut self, now: Duration, result: Result<serde_json::Value, String>) {
        self.take_tool_result(now, result);
    }

    /// Tells the machine its deadline passed while it waited for the driver:
    /// `apply(Input::Timeout { at: now })`.
    pub fn handle_timeout(&mut self, now: Duration) {
        self.take_timeout(now);
    }

    /// `Input::Poll`: runs until the next [`Action`].
    fn take_poll(&mut self, now: Duration) -> Action {
        if !self.events.tracking() {
            return self.run_until_action(now);
        }
        self.events.at(now);
        if self.events.phase_pending() {
            self.events
                .phase_finished(step_name(&self.program, self.step));
        }
        let action = self.run_until_action(now);
        self.report_errors();
        if matches!(action, Action::Done) {
            let errors_left = !self.last_step_errors.is_empty();
            self.events
                .run_finished(self.error.as_ref(), errors_left, self.steps);
        }
        action
    }

    fn run_until_action(&mut self, now: Duration) -> Action {
        loop {
            match self.state {
                State::Done => return Action::Done,
                State::AwaitingProvider | State::AwaitingTool { .. } | State::AwaitingInput => {
                    // A driver that drops the call because the run was interrupted
                    // (`Interrupt::interrupted`) polls for the end: that is no misuse.
                    match crate::interrupt::reason(&self.interrupt) {
                        Some(reason) => self.abandon_call(reason),
                        None => self.fail(
                            RunErrorKind::Protocol,
                            "poll called while a provider or tool call is outstanding".into(),
                        ),
                    }
                    return Action::Done;
                }
                State::Running | State::PromptFailed | State::Responded(_) => {}
            }
            // A running child takes the polls until it ends (`child.rs`).
            if self.has_child() {
                if let Some(action) = self.poll_child(now) {
                    return action;
                }
                continue;
            }
            if now >= self.deadline {
                self.fail_timeout();
                return Action::Done;
            }
            if let Some(reason) = crate::interrupt::reason(&self.interrupt) {
                self.fail_interrupted(reason);
                return Action::Done;
            }
            if self.tool_round.is_some() {
                if let Some(action) = self.advance_tools(now) {
                    return action;
                }
                continue;
            }
            self.report_errors();
            let Some(&instr) = self.program.bundle().code.get(self.pc) else {
                // Validation guarantees every step ends in `Branch`; running off the end
                // would be a VM bug, and ending the run is the safe answer.
                self.state = State::Done;
                return Action::Done;
            };
            self.pc += 1;
            match instr {
                Instr::EnterStep(step) => {
                    if self.steps >= self.max_steps {
                        let message = self.step_budget_message();
                        self.fail(RunErrorKind::StepBudgetExceeded, message);
                        return Action::Done;
                    }
                    self.enter_step(step, now)
                }
                Instr::RenderPre(t) => {
                    self.update_times(now);
                    self.events.phase_started(Phase::Pre);
                    self.render_phase(t);
                }
                Instr::RenderPost(t) => {
                    self.update_times(now);
                    self.events.phase_started(Phase::Post);
                    self.render_phase(t);
                    self.post_ran = true;
                }
                Instr::BuildPrompts { first, count } => {
                    self.update_times(now);
                    self.events.phase_started(Phase::Prompt);
                    self.build_prompts(first, count);
                }
                Instr::CallProvider => {
                    if let Some(action) = self.call_provider() {
                        return action;
                    }
                }
                Instr::ProcessResponse => self.process_response(),
                Instr::CallTools => self.start_tools(),
                // defuss-apl clears `next_step` only when a step is entered, so a
                // jump set in its pre phase holds (`spec/dialects.md`).
                Instr::ClearNextStep if self.program.dialect() == crate::Dialect::Defuss11 => {}
                Instr::ClearNextStep => {
                    (self.store).update(|vars| vars.set_slot(slot_of!(NEXT_STEP), Value::from(())))
                }
                Instr::Snapshot => {
                    // `call_agent` runs its child when the step ends (`spec/agents.md`):
                    // the snapshot runs once the child's result is in `agent_result`.
                    if self.call_agent(now) {
                        self.pc -= 1;
                        continue;
                    }
                    // `await_input` pauses the run at the end of the step that set it:
                    // the snapshot runs once the answer is in `human_input`, so the
                    // step's `context_history` entry has it.
                    if self.ask_for_input() {
                        self.pc -= 1;
                        return Action::AwaitInput;
                    }
                    self.snapshot()
                }
                Instr::Branch => return self.branch(),
            }
            // The machine reads no clock: a phase's end is the time of the next poll, or,
            // without phase times, of the input being handled.
            if self.events.phase_pending() && matches!(self.state, State::Running) {
                if self.events.phase_times() {
                    return Action::Continue;
                }
                (self.events).phase_finished(step_name(&self.program, self.step));
            }
        }
    }

    /// `Input::Provider`: the result of the provider call the machine asked for.
    fn take_provider_response(&mut self, now: Duration, result: Result<Completion, ProviderError>) {
        if self.has_child() {
            self.give_child(now, move |child, at| {
                child.take_provider_response(at, result)
            });
            return;
        }
        self.events.at(now);
        if !matches!(self.state, State::AwaitingProvider) {
            self.fail(
                RunErrorKind::Protocol,
                "provider response without a provider call".into(),
            );
            return;
        }
        (self.events).provider_outcome(step_name(&self.program, self.step), &result);
        if now >= self.deadline {
            self.state = State::Running;
            self.fail_timeout();
            return;
        }
        self.state = State::Responded(result);
    }

    /// `Input::Tool`: the result of the tool call the machine asked for.
    fn take_tool_result(&mut self, now: Duration, result: Result<serde_json::Value, String>) {
        if self.has_child() {
            self.give_child(now, move |child, at| child.take_tool_result(at, result));
            return;
        }
        self.events.at(now);
        let key = match std::mem::replace(&mut self.state, State::Running) {
            State::AwaitingTool { key } => key,
            other => {
                self.state = other;
                self.fail(
                    RunErrorKind::Protocol,
                    "tool result without a tool call".into(),
                );
                return;
            }
        };
        self.finish_tool_call(now, result, key);
    }

    /// Records the result of the round's running call (a tool's, or a person's for a
    /// human tool), caching it under `key` if the tool is idempotent.
    fn finish_tool_call(
        &mut self,
        now: Duration,
        result: Result<serde_json::Value, String>,
        key: Option<String>,
    ) {
        // A call is only running in a round, as its call `next - 1`.
        let Some(round) = self.tool_round.as_mut() else {
            self.fail(
                RunErrorKind::Protocol,
                "tool result without a tool call".into(),
            );
            return;
        };
        let Some(call) = round.next.checked_sub(1).and_then(|i| round.calls.get(i)) else {
            self.fail(
                RunErrorKind::Protocol,
                "tool result without a tool call".into(),
            );
            return;
        };
        let step = step_name(&self.program, self.step);
        (self.events).tool_result(step, &call.name, &call.id, result.is_err(), false, true);
        let entry = match result {
            Ok(content) => {
                if let Some(key) = key {
                    self.ledger.put(key, content.clone(), now);
                }
                tool_result(&call.id, value_from_json(&content), false, false)
            }
            Err(message) => {
                let message = format!("tool execution failed: `{}`: {message}", call.name);
                self.store.push_error(message.clone());
                tool_result(&call.id, Value::from(message), true, false)
            }
        };
        round.results.push(entry);
        if now >= self.deadline {
            self.fail_timeout();
        }
        self.report_errors();
    }

    /// `Input::Timeout`: the deadline passed while the machine waited for the driver.
    fn take_timeout(&mut self, now: Duration) {
        if self.give_child(now, Machine::take_timeout) {
            return;
        }
        self.events.at(now);
        if !matches!(self.state, State::Done) && now >= self.deadline {
            if matches!(self.state, State::AwaitingProvider) {
                let step = step_name(&self.program, self.step);
                let message = "no answer before the run's deadline";
                (self.events).provider_result(step, None, None, Some(("timeout", message)));
            }
            self.fail_timeout();
            self.report_errors();
        }
    }

    /// The result of the run. Call after [`Action::Done`]; earlier, the run counts as
    /// failed with a protocol error.
    pub fn into_outcome(mut self) -> RunOutcome {
        if !matches!(self.state, State::Done) && self.error.is_none() {
            self.fail(
                RunErrorKind::Protocol,
                "the run was stopped before it finished".into(),
            );
        }
        let (vars, history) = self.store.parts();
        RunOutcome {
            vars,
            history,
            error: self.error,
            last_step_errors: self.last_step_errors,
            steps: self.steps,
        }
    }

    /// Steps entered so far, by the run and the children it runs.
    pub fn steps(&self) -> u64 {
        self.total_steps()
    }

    /// Entries in `context_history` so far.
    pub fn history_len(&self) -> u64 {
        checkpoint::history_len(self)
    }

    /// The machine's state at rest, for [`Machine::restore`]: valid when the next input
    /// is a `poll` (not while a provider or tool call is outstanding). `history_start` is
    /// the first `context_history` entry to include: earlier entries are in earlier
    /// checkpoints. Fails with [`JournalError::Unencodable`] when a variable holds a value
    /// with no durable form; the caller then skips this checkpoint.
    pub fn checkpoint(&self, history_start: u64) -> Result<Checkpoint, JournalError> {
        if self.has_child() {
            // A resume replays the child from the checkpoint before it.
            return Err(JournalError::NotAtRest("a child run is going on"));
        }
        checkpoint::checkpoint(self, history_start)
    }

    /// [`checkpoint`](Self::checkpoint) with the `context_history` segment left to
    /// write ([`DeferredCheckpoint`]): a durable run writes it on its store's thread,
    /// off its own. The same bytes as `checkpoint`, unless the segment is refused
    /// ([`HistorySegment::encode`]).
    pub fn checkpoint_deferred(
        &self,
        history_start: u64,
    ) -> Result<DeferredCheckpoint, JournalError> {
        if self.has_child() {
            return Err(JournalError::NotAtRest("a child run is going on"));
        }
        checkpoint::deferred(self, history_start)
    }

    /// Rebuilds a machine from checkpoints of a run of `program` with `options`:
    /// `history` is every checkpoint's `(history_start, history)` segment, oldest first,
    /// and `state` is the newest checkpoint's state. The result behaves exactly as the
    /// checkpointed machine did (its events continue the same sequence).
    pub fn restore(
        program: Arc<Program>,
        options: RunOptions,
        history: &[(u64, &[u8])],
        state: &[u8],
    ) -> Result<Machine, JournalError> {
        checkpoint::restore(program, options, history, state)
    }

    fn enter_step(&mut self, step: StepId, now: Duration) {
        let prev = match self.step {
            Some(prev) => Value::from(self.program.step_name(prev)),
            None => Value::from(()),
        };
        self.step = Some(step);
        self.steps += 1;
        self.step_started = now;
        self.state = State::Running;
        self.post_ran = false;
        self.tool_calls = Vec::new();
        let runs = self.runs[step.index()];
        let current = (self.program.dialect() == crate::Dialect::Defuss11)
            .then(|| Value::from(self.program.step_name(step)));
        self.store.update(|vars| {
            vars.set_slot(slot_of!(PREV_STEP), prev);
            vars.set_slot(slot_of!(NEXT_STEP), Value::from(()));
            vars.set_slot(slot_of!(RUNS), Value::from(runs));
            if let Some(current) = current {
                vars.insert(crate::bundle::dialect::CURRENT_STEP, current);
            }
        });
        self.update_times(now);
        (self.events).step_started(self.program.step_name(step), self.runs[step.index()]);
    }

    fn update_times(&self, now: Duration) {
        let ms = |d: Duration| Value::from(d.as_secs_f64() * 1000.0);
        let step = ms(now.saturating_sub(self.step_started));
        self.store.update(|vars| {
            vars.set_slot(slot_of!(TIME_ELAPSED), step);
            vars.set_slot(slot_of!(TIME_ELAPSED_GLOBAL), ms(now));
        });
    }

    /// Records an `error` event for each entry appended to `errors` since the last call.
    fn report_errors(&mut self) {
        if !self.events.on() && self.events.tracking() {
            self.events.count_errors(self.store.errors_len());
        } else if self.events.on() {
            let step = self.step.map(|s| self.program.step_name(s));
            self.events.errors(step, self.store.get(names::ERRORS));
        }
    }

    /// Renders a template; a failure is appended to `errors` and returns `None`. A
    /// render stopped by the run's interrupt flag ends the run instead.
    fn render(&mut self, template: TemplateId) -> Option<String> {
        let program = &self.program;
        let root = Value::from_dyn_object(self.store.clone());
        let rendered = {
            let _interruptible = crate::interrupt::rendering(&self.interrupt);
            render(
                program.env(),
                program.template_name(template),
                root,
                program.limits().max_output_bytes,
            )
        };
        match rendered {
            Ok(text) => Some(text),
            Err(err) => {
                // The flag, not the error, says why: an interrupted render fails with
                // whatever error the engine was in the middle of.
                if let Some(reason) = crate::interrupt::reason(&self.interrupt) {
                    self.fail_interrupted(reason);
                } else {
                    self.store.push_error(self.template_error(template, &err));
                }
                None
            }
        }
    }

    fn render_phase(&mut self, template: TemplateId) {
        // Pre and post phases run for their effects; their text output is discarded.
        let _ = self.render(template);
    }

    fn template_error(&self, template: TemplateId, err: &minijinja::Error) -> String {
        let bundle = self.program.bundle();
        let mut message = err.kind().to_string();
        if let Some(detail) = err.detail() {
            message.push_str(": ");
            message.push_str(detail);
        }
        if err.kind() == minijinja::ErrorKind::ValueTooLarge {
            message.push_str(" (spec/limits.md)");
        }
        let location = match (bundle.templates.get(template.index()), err.line()) {
            (Some(t), Some(line)) => {
                format!(
                    " ({}:{})",
                    bundle.source_name,
                    t.span.line as usize + line - 1
                )
            }
            (Some(t), None) => format!(" ({}:{})", bundle.source_name, t.span.line),
            _ => String::new(),
        };
        format!(
            "template error in {}{location}: {message}",
            self.program.describe_template(template)
        )
    }

    fn build_prompts(&mut self, first: u32, count: u32) {
        let program = self.program.clone();
        let bundle = program.bundle();
        // Validation checked `first + count <= messages.len()`.
        let entries: &[MessageEntry] = &bundle.messages[first as usize..(first + count) as usize];
        let mut messages = Vec::with_capacity(entries.len());
        let mut failed = false;
        for entry in entries {
            if matches!(self.state, State::Done) {
                // Interrupted: the run is over.
                return;
            }
            match self.render(entry.template) {
                Some(text) => messages.extend(build_message(entry.role, &text)),
                None => failed = true,
            }
        }
        if failed && !matches!(self.state, State::Done) {
            self.state = State::PromptFailed;
        }
        let prompts: Vec<Value> = messages.iter().map(message_value).collect();
        self.store
            .update(|vars| vars.set_slot(slot_of!(PROMPTS), Value::from(prompts)));
        self.messages = messages.into();
    }

    fn call_provider(&mut self) -> Option<Action> {
        if matches!(self.state, State::PromptFailed) {
            // Sending a prompt that failed to render would bill for a wrong request; the
            // error is in `errors` and the step goes on to its post phase.
            self.state = State::Running;
            return None;
        }
        if let Some(max) = self.max_runs
            && self.global_runs >= max
        {
            self.fail(RunErrorKind::BudgetExceeded, "Run budget exceeded".into());
            return Some(Action::Done);
        }
        let initial = self.program.initial_vars();
        // describe_tools (§2.2.1): the registered tools that `allowed_tools` permits. With
        // no tool registered that is none whatever `allowed_tools` holds, so `tools` is
        // its initial empty list and `allowed_tools` needs no reading.
        let (allowed, tools) = if self.tools.is_empty() {
            (Allowed::All, initial.slot(slot_of!(TOOLS)).clone())
        } else {
            let allowed = Allowed::from_value(self.store.get(names::ALLOWED_TOOLS).as_ref());
            let tools = Value::from(self.tools.describe(&allowed));
            (allowed, tools)
        };
        self.store.update(|vars| {
            for i in RESULT_SLOTS {
                vars.set_slot(i, initial.slot(i).clone());
            }
            vars.set_slot(slot_of!(TOOLS), tools);
        });
        let model = self
            .store
            .get(names::MODEL)
            .map(|m| {
                m.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| m.to_string())
            })
            .unwrap_or_default();
        let request = build_request(
            model,
            self.store.vars(),
            self.messages.clone(),
            self.tools.definitions(&allowed),
        );
        match request {
            Ok(request) => {
                self.state = State::AwaitingProvider;
                (self.events).provider_call(step_name(&self.program, self.step), &request.model);
                Some(Action::CallProvider(Box::new(request)))
            }
            Err(error) => {
                // No provider could encode this request, so none is asked: the failure is
                // the step's, like a failed call.
                self.store
                    .push_error(format!("provider error: {}", error.message));
                None
            }
        }
    }

    fn process_response(&mut self) {
        let State::Responded(response) = std::mem::replace(&mut self.state, State::Running) else {
            // No call was made (a failed prompt, an unbuildable request): nothing to read.
            return;
        };
        let completion = match response {
            Ok(completion) => completion,
            Err(err) => {
                self.store
                    .push_error(format!("provider error: {}", err.message));
                return;
            }
        };
        let text = result_text(&completion.content);
        // A response without attachments (the usual one) shares the initial empty lists.
        let empty = self.program.initial_vars().slot(slot_of!(RESULT_FILES));
        let urls = |pick: fn(&Part) -> Option<&String>| {
            let urls: Vec<Value> = completion
                .content
                .iter()
                .filter_map(pick)
                .map(|url| Value::from(url.as_str()))
                .collect();
            if urls.is_empty() {
                empty.clone()
            } else {
                Value::from(urls)
            }
        };
        let image_urls = urls(|p| match p {
            Part::ImageUrl(url) => Some(url),
            _ => None,
        });
        let audio_inputs = urls(|p| match p {
            Part::AudioInput(url) => Some(url),
            _ => None,
        });
        let files = urls(|p| match p {
            Part::File(url) => Some(url),
            _ => None,
        });
        let usage = completion
            .usage
            .as_ref()
            .map(|usage| value_from_json(&serde_json::Value::Object(usage.fields.clone())))
            .unwrap_or(Value::from(()));
        self.store.update(|vars| {
            vars.set_slot(slot_of!(RESULT_ROLE), Value::from(completion.role.as_str()));
            vars.set_slot(slot_of!(RESULT_TEXT), Value::from(text.as_str()));
            vars.set_slot(slot_of!(RESULT_IMAGE_URLS), image_urls);
            vars.set_slot(slot_of!(RESULT_AUDIO_INPUTS), audio_inputs);
            vars.set_slot(slot_of!(RESULT_FILES), files);
            vars.set_slot(slot_of!(USAGE), usage);
        });
        self.structured_output(&text);

        if let Some(step) = self.step {
            self.runs[step.index()] += 1;
            self.global_runs += 1;
            let (runs, global_runs) = (self.runs[step.index()], self.global_runs);
            self.store.update(|vars| {
                vars.set_slot(slot_of!(RUNS), Value::from(runs));
                vars.set_slot(slot_of!(GLOBAL_RUNS), Value::from(global_runs));
            });
        }
        self.tool_calls = completion.tool_calls;
    }

    /// With `output_mode` json or structured_output: parse `result_json` and validate it
    /// against `output_structure` (§2.2.6, steps 5 and 7).
    fn structured_output(&self, text: &str) {
        let mode = self.store.get(names::OUTPUT_MODE).unwrap_or_default();
        match mode.as_str() {
            Some("json") | Some("structured_output") => {}
            Some("text") | None => return,
            Some(other) => {
                self.store.push_error(format!(
                    "invalid output_mode `{other}`: expected `text`, `json` or `structured_output`"
                ));
                return;
            }
        }
        let value = match parse_json_output(text) {
            Ok(v) => v,
            Err(message) => {
                self.store.push_error(message);
                return;
            }
        };
        self.store.set(names::RESULT_JSON, value_from_json(&value));
        let schema = self.store.get(names::OUTPUT_STRUCTURE).unwrap_or_default();
        if schema.is_none() || schema.is_undefined() {
            return;
        }
        let schema = to_json(&schema);
        if let Err(errors) = validate_output(&value, &schema) {
            for e in errors {
                self.store.push_error(e);
            }
        }
    }

    /// Starts working through the response's tool calls (§2.2.2), if it has any.
    fn start_tools(&mut self) {
        let calls = std::mem::take(&mut self.tool_calls);
        if calls.is_empty() {
            return;
        }
        self.tool_round = Some(ToolRound {
            calls,
            next: 0,
            results: Vec::new(),
            verdicts: None,
        });
    }

    /// Checks the next tool calls in order. Returns the action for the first call that
    /// must execute; when every call is done, stores `result_tool_calls` and returns `None`.
    fn advance_tools(&mut self, now: Duration) -> Option<Action> {
        let allowed = Allowed::from_value(self.store.get(names::ALLOWED_TOOLS).as_ref());
        if self.ask_approvals(&allowed, now) {
            return Some(Action::AwaitInput);
        }
        loop {
            let round = self.tool_round.as_mut()?;
            let Some(call) = round.calls.get(round.next) else {
                let results = std::mem::take(&mut round.results);
                self.tool_round = None;
                self.store
                    .set(names::RESULT_TOOL_CALLS, Value::from(results));
                return None;
            };
            round.next += 1;
            let step = step_name(&self.program, self.step);
            self.events
                .tool_call(step, &call.name, &call.id, &self.tools);
            // A failure here never aborts the run: the call gets a failed result, the
            // message goes to `errors`, and the next call is checked.
            let index = round.next - 1;
            let checked = if now >= self.deadline {
                Err("the run's deadline passed before the call".to_string())
            } else {
                check_call(&self.tools, &allowed, &call.name, &call.arguments)
            };
            // A reviewer's denial fails the call like a refused check (spec/human.md).
            let checked =
                checked.and_then(
                    |args| match round.verdicts.as_ref().and_then(|v| v.get(index)) {
                        Some(Some(Verdict::Denied(reason))) => Err(reason.clone()),
                        _ => Ok(args),
                    },
                );
            let args = match checked {
                Ok(args) => args,
                Err(message) => {
                    let message = format!("tool execution failed: `{}`: {message}", call.name);
                    self.events
                        .tool_result(step, &call.name, &call.id, true, false, false);
                    self.store.push_error(message.clone());
                    round
                        .results
                        .push(tool_result(&call.id, Value::from(message), true, false));
                    continue;
                }
            };
            // `check_call` found the tool, so the registry has it.
            let Some(spec) = self.tools.get(&call.name) else {
                continue;
            };
            if let Some(human) = spec.human_tool() {
                let request = InputRequest {
                    id: format!("{}-{}", self.steps, index + 1),
                    kind: RequestKind::Tool,
                    prompt: human.prompt.clone(),
                    step: step.to_owned(),
                    tool: Some(call.name.clone()),
                    arguments: Some(args),
                    schema: human.result_schema.clone(),
                    timeout_ms: human.timeout.map(millis),
                    agent: None,
                };
                self.ask(vec![request], Purpose::HumanTool, Vec::new());
                return Some(Action::AwaitInput);
            }
            if let Some(agent) = spec.agent_tool() {
                let agent = agent.to_owned();
                let call_id = call.id.clone();
                let context = match args {
                    serde_json::Value::Object(map) => map
                        .iter()
                        .map(|(k, v)| (k.clone(), value_from_json(v)))
                        .collect(),
                    _ => Vec::new(),
                };
                if let Err(message) = self.start_child(&agent, context, Some(call_id), now) {
                    // The child's end would record the call's result: record it here.
                    self.finish_tool_call(now, Err(message), None);
                }
                // The loop polls the child until it ends.
                return None;
            }
            let key = Ledger::key(spec, &args);
            if let Some(cached) = key.as_ref().and_then(|k| self.ledger.get(spec, k, now)) {
                self.events
                    .tool_result(step, &call.name, &call.id, false, true, false);
                let entry = tool_result(&call.id, value_from_json(cached), false, true);
                round.results.push(entry);
                continue;
            }
            let context = spec
                .with_context_enabled()
                .then(|| tool_context(&self.store.vars()));
            let invocation = ToolInvocation {
                id: call.id.clone(),
                name: call.name.clone(),
                arguments: args,
                context,
            };
            self.state = State::AwaitingTool { key };
            return Some(Action::CallTool(invocation));
        }
    }

    /// At the start of a tool round, asks for the approval of every call that passes the
    /// checks and whose tool requires one (`spec/human.md` §1.1), all at once. True if
    /// the run now waits for them; once asked, a round never asks again.
    fn ask_approvals(&mut self, allowed: &Allowed, now: Duration) -> bool {
        let Some(round) = self.tool_round.as_mut() else {
            return false;
        };
        // Approvals are asked at the round's start, once: a round that asked has
        // verdicts (a round that needed none has none, and costs one scan).
        if round.next > 0 || round.verdicts.is_some() || self.tools.is_empty() {
            return false;
        }
        if now >= self.deadline {
            return false;
        }
        let step = step_name(&self.program, self.step);
        let mut requests = Vec::new();
        let mut calls = Vec::new();
        for (index, call) in round.calls.iter().enumerate() {
            let Some(approval) = self.tools.get(&call.name).and_then(|spec| spec.approval()) else {
                continue;
            };
            // A call the checks refuse fails as before: nobody approves it first.
            let Ok(arguments) = check_call(&self.tools, allowed, &call.name, &call.arguments)
            else {
                continue;
            };
            requests.push(InputRequest {
                id: format!("{}-{}", self.steps, index + 1),
                kind: RequestKind::Approval,
                prompt: format!("Approve a call of `{}`?", call.name),
                step: step.to_owned(),
                tool: Some(call.name.clone()),
                arguments: Some(arguments),
                schema: None,
                timeout_ms: approval.timeout.map(millis),
                agent: None,
            });
            calls.push(index);
        }
        if requests.is_empty() {
            return false;
        }
        round.verdicts = Some(vec![None; round.calls.len()]);
        self.ask(requests, Purpose::Approvals, calls);
        true
    }

    /// Starts waiting for answers to `requests`.
    fn ask(&mut self, mut requests: Vec<InputRequest>, purpose: Purpose, calls: Vec<usize>) {
        self.mark_requests(&mut requests);
        for request in &requests {
            self.events.input_requested(request);
        }
        self.asking = Some(Asking {
            replies: vec![None; requests.len()],
            requests,
            purpose,
            calls,
        });
        self.state = State::AwaitingInput;
    }

    /// At the end of a step, asks a person if a phase set `await_input` (`spec/human.md`
    /// §1.3). An invalid value is an error in `errors`; either way `await_input` is
    /// reset, so it asks once. True if the run now waits.
    fn ask_for_input(&mut self) -> bool {
        let Some(value) = self.store.get(names::AWAIT_INPUT) else {
            return false;
        };
        if value.is_none() || value.is_undefined() {
            return false;
        }
        self.store.set(names::AWAIT_INPUT, Value::from(()));
        let asked = match await_input(&value) {
            Ok(asked) => asked,
            Err(message) => {
                self.store
                    .push_error(format!("invalid await_input: {message}"));
                return false;
            }
        };
        let request = InputRequest {
            id: format!("{}-0", self.steps),
            kind: RequestKind::Input,
            prompt: asked.prompt,
            step: step_name(&self.program, self.step).to_owned(),
            tool: None,
            arguments: None,
            schema: asked.schema,
            timeout_ms: asked.timeout_ms,
            agent: None,
        };
        self.ask(vec![request], Purpose::AwaitInput, Vec::new());
        true
    }

    /// The requests the run waits on that have no answer yet (none unless the last
    /// action was [`Action::AwaitInput`]).
    pub fn pending_requests(&self) -> Vec<&InputRequest> {
        if let Some(child) = self.child() {
            return child.pending_requests();
        }
        match (&self.state, &self.asking) {
            (State::AwaitingInput, Some(asking)) => asking
                .requests
                .iter()
                .zip(&asking.replies)
                .filter(|(_, reply)| reply.is_none())
                .map(|(request, _)| request)
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Checks that `answer` answers one of the pending requests: a known id, not
    /// answered yet, the right kind, a value valid against its schema. A driver checks
    /// an answer here before it journals it; the message is for the person.
    pub fn check_answer(&self, answer: &HumanAnswer) -> Result<(), String> {
        if let Some(child) = self.child() {
            return child.check_answer(answer);
        }
        let Some(request) = self
            .pending_requests()
            .into_iter()
            .find(|r| r.id == answer.id)
        else {
            return Err(format!(
                "the run waits for no request `{}`",
                escape_control(&answer.id)
            ));
        };
        request.check(&answer.reply)
    }

    /// Ends a run that waits for answers nobody can give (an in-memory run with no one to
    /// ask): it fails with [`RunErrorKind::InputUnavailable`] and `message`. Not an input:
    /// a durable run pauses instead.
    pub fn abandon_input(&mut self, message: String) {
        // A child that asks pauses the whole tree, so nobody to ask ends it all.
        if self.has_child() {
            self.abandon_child(&message);
            self.fail(RunErrorKind::InputUnavailable, message);
            return;
        }
        if matches!(self.state, State::AwaitingInput) {
            self.fail(RunErrorKind::InputUnavailable, message);
        }
    }

    /// `Input::Answer`: a person's answer to one of the requests the run waits on.
    fn take_answer(&mut self, now: Duration, answer: HumanAnswer) {
        if self.has_child() {
            self.give_child(now, move |child, at| child.take_answer(at, answer));
            return;
        }
        self.events.at(now);
        if let Err(message) = self.check_answer(&answer) {
            self.fail(RunErrorKind::Protocol, format!("answer refused: {message}"));
            return;
        }
        let Some(asking) = self.asking.as_mut() else {
            return;
        };
        let Some(index) = asking.requests.iter().position(|r| r.id == answer.id) else {
            return;
        };
        self.events.input_received(&asking.requests[index], &answer);
        asking.replies[index] = Some(answer.reply);
        if asking.replies.iter().all(Option::is_some) {
            self.settle(now);
        }
    }

    /// Every request has its answer: acts on them, and the run goes on at the next poll.
    fn settle(&mut self, now: Duration) {
        let Some(asking) = self.asking.take() else {
            return;
        };
        self.state = State::Running;
        let answers = asking.requests.into_iter().zip(asking.replies);
        match asking.purpose {
            Purpose::Approvals => {
                let Some(verdicts) = self.tool_round.as_mut().and_then(|r| r.verdicts.as_mut())
                else {
                    return;
                };
                for ((request, reply), call) in answers.zip(asking.calls) {
                    let verdict = match reply {
                        Some(Reply::Approve { approved: true, .. }) => Verdict::Approved,
                        Some(Reply::Approve { reason, .. }) => Verdict::Denied(match reason {
                            Some(reason) if !reason.is_empty() => {
                                format!("denied by reviewer: {reason}")
                            }
                            _ => "denied by reviewer".to_string(),
                        }),
                        _ => Verdict::Denied(format!("denied: {}", request.timeout_message())),
                    };
                    if let Some(slot) = verdicts.get_mut(call) {
                        *slot = Some(verdict);
                    }
                }
            }
            Purpose::HumanTool => {
                let Some((request, reply)) = answers.into_iter().next() else {
                    return;
                };
                let result = match reply {
                    Some(Reply::Value(value)) => Ok(value),
                    _ => Err(request.timeout_message()),
                };
                self.finish_tool_call(now, result, None);
            }
            Purpose::AwaitInput => {
                let Some((request, reply)) = answers.into_iter().next() else {
                    return;
                };
                let value = match reply {
                    Some(Reply::Value(value)) => value_from_json(&value),
                    _ => {
                        self.store.push_error(request.timeout_message());
                        Value::from(())
                    }
                };
                self.store.set(names::HUMAN_INPUT, value);
                self.report_errors();
            }
        }
    }

    /// Records the step in `context_history`, then resets `errors` if the step had a
    /// post phase. §2.3 resets `errors` "after each post phase" and nowhere else, so the
    /// errors of a step without one stay in the context. In a compiled bundle such a
    /// step cannot jump (`ClearNextStep` runs after pre and prompt, and only post sets
    /// `next_step`), so it is the run's last: its errors are the final `errors`, and a
    /// one-step agent whose provider failed shows the failure.
    fn snapshot(&mut self) {
        self.report_errors();
        self.store.snapshot();
        self.last_errors_step = self.step;
        self.last_step_errors = self.current_errors();
        // A failed agent call (after the post phase) is the next step's to see.
        let carried = std::mem::take(&mut self.nest.carried);
        self.last_step_errors.extend(carried.iter().cloned());
        if self.post_ran {
            let empty = self.program.initial_vars().slot(slot_of!(ERRORS)).clone();
            self.store
                .update(|vars| vars.set_slot(slot_of!(ERRORS), empty));
            self.events.errors_reset();
        }
        for error in carried {
            self.store.push_error(error);
        }
    }

    /// The running step's `errors`, as text.
    fn current_errors(&self) -> Vec<String> {
        self.store
            .get(names::ERRORS)
            // Most steps end without errors: an empty list needs no iterator.
            .filter(|e| e.len() != Some(0))
            .and_then(|e| {
                e.try_iter()
                    .ok()
                    .map(|it| it.map(|v| v.to_string()).collect())
            })
            .unwrap_or_default()
    }

    fn branch(&mut self) -> Action {
        self.events
            .step_finished(step_name(&self.program, self.step));
        let next = self.store.get(names::NEXT_STEP).unwrap_or_default();
        if next.is_none() || next.is_undefined() {
            return self.finish();
        }
        let text;
        let name = match next.as_str() {
            Some(name) => name,
            None => {
                text = next.to_string();
                text.as_str()
            }
        };
        // An empty name is treated like an unset one: `get_context('target', '')` idioms
        // mean "no jump".
        if name == "return" || name.is_empty() {
            return self.finish();
        }
        match self.program.step_by_name(name) {
            Some(step) => {
                self.pc = self.program.bundle().steps[step.index()].entry as usize;
                (self.events).jump(
                    step_name(&self.program, self.step),
                    self.program.step_name(step),
                );
                Action::Continue
            }
            None => {
                self.fail(RunErrorKind::UnknownStep, format!("Unknown step: {name}"));
                Action::Done
            }
        }
    }

    /// The step budget's error. In defuss-1.1 it names the timeout it stands in for: the
    /// reference ends a loop with no circuit-breaking only by its timeout (spec §2.1),
    /// and code written for it looks for "timeout" in the error (`spec/limits.md`).
    fn step_budget_message(&self) -> String {
        let n = self.max_steps;
        match self.program.dialect() {
            crate::Dialect::Defuss11 => format!(
                "Step budget exceeded: {n} steps, aplc's stand-in for the run's timeout \
                 (a loop with no circuit-breaking ends here, not after the timeout)"
            ),
            _ => format!("Step budget exceeded: {n} steps"),
        }
    }

    /// Ends a run that left its last step with no jump. defuss-apl's final context has
    /// `next_step` cleared (its `context_history` keeps the value the step set).
    fn finish(&mut self) -> Action {
        if self.program.dialect() == crate::Dialect::Defuss11 {
            (self.store).update(|vars| vars.set_slot(slot_of!(NEXT_STEP), Value::from(())));
        }
        self.state = State::Done;
        Action::Done
    }

    fn fail_timeout(&mut self) {
        let ms = self.timeout.as_millis();
        self.fail(
            RunErrorKind::Timeout,
            format!("Run timeout: the run did not finish within its timeout of {ms} ms"),
        );
    }

    /// Ends the run whose outstanding call the driver dropped because of `reason`. A
    /// provider call gets its `provider_result`, as one the deadline cuts short does.
    fn abandon_call(&mut self, reason: InterruptReason) {
        self.events.set_on(true);
        if matches!(self.state, State::AwaitingProvider) {
            let step = step_name(&self.program, self.step);
            let error = match reason {
                InterruptReason::Deadline => ("timeout", "no answer before the run's deadline"),
                _ => ("cancelled", "the run was cancelled during the call"),
            };
            (self.events).provider_result(step, None, None, Some(error));
        }
        self.fail_interrupted(reason);
    }

    fn fail_interrupted(&mut self, reason: InterruptReason) {
        self.events.set_on(true);
        match reason {
            InterruptReason::Deadline => self.fail_timeout(),
            _ => self.fail(RunErrorKind::Cancelled, "Run cancelled".into()),
        }
    }

    /// Ends the run with an error.
    fn fail(&mut self, kind: RunErrorKind, mut message: String) {
        // The errors that led here, before the ones that closing a tool round adds.
        if matches!(
            kind,
            RunErrorKind::Timeout | RunErrorKind::BudgetExceeded | RunErrorKind::StepBudgetExceeded
        ) {
            message.push_str(&self.recent_errors());
        }
        self.close_tool_round();
        let bundle = self.program.bundle();
        let step = self.step.map(|s| bundle.steps[s.index()].name.clone());
        let span = bundle.code_spans.get(self.pc.saturating_sub(1)).copied();
        self.error = Some(RunError {
            kind,
            message,
            step,
            span,
        });
        self.state = State::Done;
    }

    /// Stores the results of a tool round the run is ending in the middle of. The calls
    /// that already ran may have had side effects, so their results (and errors) must
    /// reach the final context; the call that was running and those never started get a
    /// failed entry each, so `result_tool_calls` still has one entry per call.
    fn close_tool_round(&mut self) {
        let Some(mut round) = self.tool_round.take() else {
            return;
        };
        let mut unfinished = Vec::new();
        let asking_person = matches!(
            self.asking.take(),
            Some(Asking {
                purpose: Purpose::HumanTool,
                ..
            })
        );
        if matches!(self.state, State::AwaitingTool { .. }) || asking_person {
            // `next` was advanced past the running call when it started.
            unfinished.push((
                round.next.saturating_sub(1),
                "the run ended while the tool was running",
            ));
        }
        unfinished
            .extend((round.next..round.calls.len()).map(|i| (i, "the run ended before the call")));
        for (i, reason) in unfinished {
            let Some(call) = round.calls.get(i) else {
                continue;
            };
            let message = format!("tool execution failed: `{}`: {reason}", call.name);
            self.store.push_error(message.clone());
            round
                .results
                .push(tool_result(&call.id, Value::from(message), true, false));
        }
        self.store
            .set(names::RESULT_TOOL_CALLS, Value::from(round.results));
    }

    /// Why a run that hit a budget or the timeout was probably stuck: the errors of the
    /// running step, or of the step that finished last when the running one has none yet,
    /// as `` (last errors in step `name`: …)``. Bounded: at most [`FAILURE_ERRORS`]
    /// errors, the latest ones, each cut to [`FAILURE_ERROR_CHARS`] characters, with
    /// control characters escaped (the text comes from providers and tools).
    fn recent_errors(&self) -> String {
        let current = self.current_errors();
        let (errors, step) = if current.is_empty() {
            (&self.last_step_errors, self.last_errors_step)
        } else {
            (&current, self.step)
        };
        if errors.is_empty() {
            return String::new();
        }
        let name = step.map_or("?", |s| self.program.step_name(s));
        let shown = &errors[errors.len().saturating_sub(FAILURE_ERRORS)..];
        let count = if shown.len() < errors.len() {
            format!(", {} of {}", shown.len(), errors.len())
        } else {
            String::new()
        };
        let texts: Vec<String> = shown
            .iter()
            .map(|e| escape_control(&truncate_chars(e, FAILURE_ERROR_CHARS)).into_owned())
            .collect();
        format!(
            " (last errors in step `{}`{count}: {})",
            escape_control(name),
            texts.join("; ")
        )
    }
}

/// A duration in whole milliseconds, saturating.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// What an `await_input` value asks.
struct Asked {
    prompt: String,
    schema: Option<serde_json::Value>,
    timeout_ms: Option<u64>,
}

/// Reads `await_input`: a prompt, or `{"prompt", "schema"?, "timeout_ms"?}`.
fn await_input(value: &Value) -> Result<Asked, String> {
    if let Some(prompt) = value.as_str() {
        return Ok(Asked {
            prompt: prompt.to_owned(),
            schema: None,
            timeout_ms: None,
        });
    }
    let json = to_json(value);
    let Some(map) = json.as_object() else {
        return Err(format!(
            "expected a prompt or a dict with a `prompt`, found {}",
            crate::text::json_kind(&json)
        ));
    };
    if let Some(key) = map
        .keys()
        .find(|k| !matches!(k.as_str(), "prompt" | "schema" | "timeout_ms"))
    {
        return Err(format!(
            "unknown key `{}` (expected `prompt`, `schema`, `timeout_ms`)",
            escape_control(key)
        ));
    }
    let prompt = match map.get("prompt") {
        Some(serde_json::Value::String(prompt)) => prompt.clone(),
        _ => return Err("`prompt` must be a string".into()),
    };
    let schema = match map.get("schema") {
        None | Some(serde_json::Value::Null) => None,
        Some(schema) => {
            crate::human::compile_schema(schema).map_err(|e| format!("`schema`: {e}"))?;
            Some(schema.clone())
        }
    };
    let timeout_ms = match map.get("timeout_ms") {
        None | Some(serde_json::Value::Null) => None,
        Some(ms) => Some(
            ms.as_u64()
                .filter(|ms| *ms > 0)
                .ok_or("`timeout_ms` must be a positive integer")?,
        ),
    };
    Ok(Asked {
        prompt,
        schema,
        timeout_ms,
    })
}

/// `result_text`: the text parts joined with a newline (as the reference runtime does),
/// `""` when there are none.
fn result_text(content: &[Part]) -> String {
    let mut texts = content.iter().filter_map(|part| match part {
        Part::Text(text) => Some(text.as_str()),
        _ => None,
    });
    let Some(first) = texts.next() else {
        return String::new();
    };
    let mut text = first.to_owned();
    for more in texts {
        text.push('\n');
        text.push_str(more);
    }
    text
}

/// One `result_tool_calls` entry (§2.2.4); `reused` marks a result taken from the
/// idempotency ledger instead of executing the tool again.
fn tool_result(id: &str, content: Value, with_error: bool, reused: bool) -> Value {
    let mut fields = vec![
        ("role", Value::from("tool")),
        ("tool_call_id", Value::from(id)),
        ("content", content),
        ("with_error", Value::from(with_error)),
    ];
    if reused {
        fields.push(("reused", Value::from(true)));
    }
    Value::from_pairs(fields)
}

/// The name of `step` ("" before the first step). A function, not a method, so that it
/// borrows only the program while the event recorder is borrowed mutably.
fn step_name(program: &Program, step: Option<StepId>) -> &str {
    step.map_or("", |s| program.step_name(s))
}

/// The context a `with_context` tool receives: every variable, without the history.
fn tool_context(vars: &Vars) -> serde_json::Value {
    serde_json::Value::Object(
        vars.iter()
            .map(|(k, v)| (k.to_string(), to_json(v)))
            .collect(),
    )
}

/// The slots of the `result_*` variables, reset to their initial values before every
/// provider call (§2.4).
const RESULT_SLOTS: [usize; 8] = names::slots_of(Section::Result);

/// The error a run of `program` with `options` ends with before its first step, if any:
/// a `with_context` name that cannot be set ([`RunErrorKind::InvalidOptions`]), or a
/// declared input that `with_context` does not give ([`RunErrorKind::MissingInput`]).
/// [`Machine::new`] checks this; a host that starts many runs of the same options
/// (`aplc bench`) checks it once, up front.
pub fn options_error(program: &Program, options: &RunOptions) -> Option<RunError> {
    let invalid = options.with_context.iter().find_map(|(name, _)| {
        invalid_context_name(name).map(|problem| RunError {
            kind: RunErrorKind::InvalidOptions,
            message: format!("with_context: cannot set `{name}`: {problem}"),
            step: None,
            span: None,
        })
    });
    invalid.or_else(|| missing_inputs(program, &options.with_context))
}

/// The run error for the declared inputs that `with_context` does not give, if any:
/// one `missing input: <name>` line per missing input, in declaration order.
fn missing_inputs(program: &Program, with_context: &[(String, Value)]) -> Option<RunError> {
    let missing: Vec<String> = program
        .bundle()
        .inputs
        .iter()
        .filter(|input| !with_context.iter().any(|(name, _)| name == *input))
        .map(|input| format!("missing input: {input}"))
        .collect();
    (!missing.is_empty()).then(|| RunError {
        kind: RunErrorKind::MissingInput,
        message: missing.join("\n"),
        step: None,
        span: None,
    })
}

/// Why `name` cannot be injected with `with_context`, if it cannot.
fn invalid_context_name(name: &str) -> Option<&'static str> {
    names::check_settable(name).err().map(Unsettable::reason)
}

/// Runs `program` to the end against a scripted provider, without any async runtime.
///
/// The core never reads a clock: `clock` is asked for the time since the run started
/// before every poll and after every provider call. Tests pass a simulated clock;
/// benchmarks pass the elapsed time of an `Instant` taken at the start.
///
/// Nothing here sets [`Machine::deadline_flag`], so the timeout is enforced between
/// instructions only; `options.interrupt` still cancels (set from another thread).
pub fn run_scripted(
    program: Arc<Program>,
    options: RunOptions,
    provider: &mut crate::ScriptedProvider,
    clock: impl FnMut() -> Duration,
) -> RunOutcome {
    scripted(Machine::new(program, options), provider, clock, None)
}

/// [`run_scripted`] with [`RunOptions::events`] on, handing every event to `on_event` as
/// soon as the machine records it.
pub fn run_scripted_with_listener(
    program: Arc<Program>,
    options: RunOptions,
    provider: &mut crate::ScriptedProvider,
    clock: impl FnMut() -> Duration,
    on_event: &mut dyn FnMut(&Event),
) -> RunOutcome {
    let options = RunOptions {
        events: true,
        ..options
    };
    scripted(
        Machine::new(program, options),
        provider,
        clock,
        Some(on_event),
    )
}

/// The scripted run loop, draining events to `listener` after every call into the
/// machine.
fn scripted(
    mut machine: Machine,
    provider: &mut crate::ScriptedProvider,
    mut clock: impl FnMut() -> Duration,
    mut listener: Option<&mut dyn FnMut(&Event)>,
) -> RunOutcome {
    // Without a listener the events are dropped as they come, so a caller that turned
    // `RunOptions::events` on without one does not buffer a whole run's events.
    let mut deliver = |machine: &mut Machine| {
        if machine.events.on() {
            let events = machine.events.drain();
            match listener.as_mut() {
                Some(listener) => events.for_each(|event| listener(&event)),
                None => drop(events),
            }
        }
    };
    deliver(&mut machine);
    loop {
        let action = machine.poll(clock());
        deliver(&mut machine);
        match action {
            Action::CallProvider(_) => {
                let response = provider.next_response();
                machine.handle_provider_response(clock(), response);
            }
            Action::CallTool(_) => {
                // This runner has descriptors at most, never implementations.
                let message = "tools cannot execute in run_scripted; use the driver".to_string();
                machine.handle_tool_result(clock(), Err(message));
            }
            Action::AwaitInput => {
                machine.abandon_input("run_scripted has nobody to answer requests".into())
            }
            Action::Continue => continue,
            Action::Done => return machine.into_outcome(),
        }
        deliver(&mut machine);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::env::{Limits, template_env};

    fn outcome() -> RunOutcome {
        let mut vars = Vars::new();
        vars.insert("errors", Value::from(Vec::<Value>::new()));
        vars.insert("global_runs", Value::from(2));
        vars.insert(
            "result_json",
            crate::template::store::value_from_json(&serde_json::json!({"category": "billing"})),
        );
        let mut history = Vector::new();
        history.push_back(Value::from_object(crate::template::store::Snapshot(
            vars.clone(),
        )));
        RunOutcome {
            vars,
            history,
            error: None,
            last_step_errors: Vec::new(),
            steps: 1,
        }
    }

    #[test]
    fn expressions_evaluate_over_the_final_context() {
        let env = template_env(&Limits::default());
        let root = outcome().template_root();
        for source in [
            "result_json.category == 'billing'",
            "global_runs == 2",
            "errors | length == 0",
            "context_history | length == 1",
            "context_history[0].global_runs == 2",
            "context.global_runs == 2",
            "get_context('missing', 7) == 7",
            "get_json_path(result_json, 'category') == 'billing'",
        ] {
            let expression = env.compile_expression(source).unwrap();
            let value = expression.eval(root.clone()).unwrap();
            assert!(value.is_true(), "{source} gave {value:?}");
        }
        let expression = env.compile_expression("global_runs == 3").unwrap();
        assert!(!expression.eval(root.clone()).unwrap().is_true());
        // Semi-strict undefined: reading a missing variable's attribute is an error.
        let expression = env.compile_expression("missing.attr == 1").unwrap();
        assert!(expression.eval(root).is_err());
    }
}

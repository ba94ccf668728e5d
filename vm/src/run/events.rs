//! Run events: what a run did, in order, as plain data with a stable, versioned JSON form
//! (`spec/events.md`).
//!
//! The machine records events only when [`RunOptions::events`](crate::RunOptions::events)
//! is on; otherwise every recording call returns at its first line and no event is built.
//! The machine buffers what it records; the driver takes the buffer after every `poll`
//! and `handle_*` call ([`Machine::drain_events`](crate::Machine::drain_events)).
//!
//! Events are an I/O boundary type (they leave the process as JSON Lines), so they derive
//! serde; the run's own state in `machine.rs` does not.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::bundle::Bundle;
use crate::human::{HumanAnswer, InputRequest, Reply};
use crate::run::{RunError, RunOptions};

/// The version of the events' JSON form, carried by [`EventKind::RunStarted`]. It changes
/// when a field is removed, renamed or changes meaning; adding a field or an event type
/// does not change it (readers ignore what they do not know).
pub const EVENTS_VERSION: u32 = 1;

/// One thing that happened in a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// 0 for `run_started`, then one more per event: no gaps, no repeats.
    pub seq: u64,
    /// Milliseconds since the run started, at microsecond resolution: the time the driver
    /// passed in with the call that produced the event. Fractional, because a step of a
    /// scripted run takes microseconds; integer milliseconds would make them all 0.
    pub t_ms: f64,
    /// What happened; its JSON form has the event's name in `type`.
    #[serde(flatten)]
    pub kind: EventKind,
    /// For an event of a child run (`spec/agents.md`), the agents from the root run's
    /// child down to the one that made it, joined by `/` (`"refund/translator"`); none
    /// for the root run's own events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

impl Event {
    /// A `provider_delta`: piece `index` of the text of the call whose `provider_call`
    /// has `seq`, arrived at `at` (machine time).
    pub fn provider_delta(seq: u64, at: Duration, step: &str, index: u64, text: String) -> Event {
        Event {
            seq,
            t_ms: ms(at),
            kind: EventKind::ProviderDelta {
                step: step.to_owned(),
                index,
                text,
            },
            path: None,
        }
    }

    /// A `tool_progress`: what the tool of the call `call_id` (whose `tool_call` has `seq`)
    /// reported of its progress, arrived at `at` (machine time).
    pub fn tool_progress(
        seq: u64,
        at: Duration,
        call: &ToolCallRef<'_>,
        progress: Progress,
    ) -> Event {
        Event {
            seq,
            t_ms: ms(at),
            kind: EventKind::ToolProgress {
                step: call.step.to_owned(),
                tool: call.tool.to_owned(),
                call_id: call.call_id.to_owned(),
                progress: progress.progress,
                total: progress.total,
                message: progress.message,
            },
            path: None,
        }
    }

    /// The event as one JSON object: `seq`, `t_ms`, `type` and the event's fields.
    pub fn to_json(&self) -> Json {
        // Every field is a string, number, bool, null, list or map with string keys:
        // serialization cannot fail.
        serde_json::to_value(self).unwrap_or(Json::Null)
    }
}

/// The tool call a `tool_progress` event belongs to.
#[derive(Debug, Clone, Copy)]
pub struct ToolCallRef<'a> {
    /// The step.
    pub step: &'a str,
    /// The tool's name as the model gave it.
    pub tool: &'a str,
    /// The model's id for the call.
    pub call_id: &'a str,
}

/// What a tool reported of its progress (an MCP server's `notifications/progress`).
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// How far it is; grows with each report, even when the total is unknown.
    pub progress: f64,
    /// Where it will end, if known.
    pub total: Option<f64>,
    /// What it is doing (redacted, one line, short).
    pub message: Option<String>,
}

/// The kinds of event, with their fields. Names of steps are the `.apl` step names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum EventKind {
    /// The run started (always the first event).
    RunStarted {
        /// [`EVENTS_VERSION`].
        version: u32,
        /// The file the agent was compiled from (`Bundle::source_name`).
        agent: String,
        /// The SHA-256 of the agent's source that the bundle records, in hex.
        bundle_hash: String,
        /// The run's options, without values that could hold secrets.
        options: StartOptions,
    },
    /// A step was entered.
    StepStarted {
        /// The step.
        step: String,
        /// Its `runs` as the step starts.
        runs: u64,
    },
    /// A phase of the running step finished rendering.
    PhaseFinished {
        /// The step.
        step: String,
        /// Which phase.
        phase: Phase,
        /// How long it took.
        duration_ms: f64,
    },
    /// The machine asked for a provider call.
    ProviderCall {
        /// The step.
        step: String,
        /// The `model` variable.
        model: String,
    },
    /// A provider call ended: answered, failed or timed out.
    ProviderResult {
        /// The step.
        step: String,
        /// The tokens the provider reported, if it did.
        usage: Option<TokenUsage>,
        /// Why the model stopped, as the provider reported it.
        finish_reason: Option<String>,
        /// From `provider_call` to this event.
        latency_ms: f64,
        /// Why the call failed, if it did.
        error: Option<EventError>,
    },
    /// A piece of a streamed provider call's text, as it arrived. Live only: the
    /// machine never records one (the driver builds it), journals do not keep it, a
    /// replay has none; its `seq` is its call's `provider_call`'s (`spec/events.md`).
    ProviderDelta {
        /// The step.
        step: String,
        /// 0 for the call's first delta, then one more per delta.
        index: u64,
        /// The text.
        text: String,
    },
    /// The model asked for a tool call (checked, reused or executed).
    ToolCall {
        /// The step.
        step: String,
        /// The tool's name as the model gave it.
        tool: String,
        /// The model's id for the call.
        call_id: String,
        /// Where the tool comes from: `mcp` for an MCP server's tool; `None` for other
        /// tools, and for a name the run does not have (`ToolOrigin::source`).
        #[serde(default)]
        source: Option<String>,
        /// The MCP server's name, for an MCP tool.
        #[serde(default)]
        server: Option<String>,
    },
    /// A tool reported its progress during a call (an MCP server's
    /// `notifications/progress`). Live only, like [`EventKind::ProviderDelta`]: the
    /// machine never records one, journals do not keep it, a replay has none; its `seq`
    /// is its call's `tool_call`'s (`spec/events.md`).
    ToolProgress {
        /// The step.
        step: String,
        /// The tool.
        tool: String,
        /// The model's id for the call.
        call_id: String,
        /// How far it is.
        progress: f64,
        /// Where it will end, if the tool said.
        total: Option<f64>,
        /// What it is doing, if the tool said (redacted, one line, short).
        message: Option<String>,
    },
    /// A tool call's `result_tool_calls` entry is known.
    ToolResult {
        /// The step.
        step: String,
        /// The tool.
        tool: String,
        /// The model's id for the call.
        call_id: String,
        /// The entry's `with_error`.
        with_error: bool,
        /// From `tool_call` to this event (0 for calls that never executed).
        duration_ms: f64,
        /// The result came from the idempotency ledger.
        reused: bool,
    },
    /// The run asks a person (`spec/human.md`): it waits until every request it made
    /// together is answered.
    InputRequested {
        /// The request, `step` included.
        #[serde(flatten)]
        request: InputRequest,
    },
    /// The run took a person's answer (or a request's timeout).
    InputReceived {
        /// The step that asked.
        step: String,
        /// The request's id.
        id: String,
        /// The request's kind.
        kind: crate::human::RequestKind,
        /// Who answered: `cli`, `--as NAME`, a token's id, `python`, `timeout`.
        by: String,
        /// When, on the wall clock (ms since the Unix epoch).
        answered_at_ms: i64,
        /// For an approval: approved or denied (a timeout denies).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        approved: Option<bool>,
        /// For an approval: the reason given, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// For a `tool` or `input` request: the value.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        value: Option<Json>,
        /// Nobody answered within the request's timeout.
        #[serde(default)]
        timed_out: bool,
    },
    /// An entry was appended to `errors`.
    Error {
        /// The running step (none before the first).
        step: Option<String>,
        /// The entry, as `errors` holds it.
        message: String,
    },
    /// The run goes from one step to another (`next_step`).
    Jump {
        /// The step that finished.
        from: String,
        /// The step entered next.
        to: String,
    },
    /// A step finished (after its snapshot went into `context_history`).
    StepFinished {
        /// The step.
        step: String,
        /// From `step_started` to this event.
        duration_ms: f64,
    },
    /// A step's `call_agent`, or an agent tool's call, starts a child run
    /// (`spec/agents.md`); the child's events follow, with their `path`.
    AgentStarted {
        /// The step that calls.
        step: String,
        /// The agent it runs.
        agent: String,
        /// The tool call, for an agent tool.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        call_id: Option<String>,
    },
    /// The child run is over (its last event).
    AgentFinished {
        /// The step that called.
        step: String,
        /// The agent that ran.
        agent: String,
        /// The tool call, for an agent tool.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        call_id: Option<String>,
        /// How it ended.
        outcome: RunStatus,
        /// Why it failed, if it did.
        error: Option<EventError>,
        /// What it consumed (they count towards the calling run's totals too).
        totals: Totals,
    },
    /// The run is over (always the last event).
    RunFinished {
        /// How it ended.
        outcome: RunStatus,
        /// Why it failed, if it did.
        error: Option<EventError>,
        /// What the run consumed.
        totals: Totals,
    },
}

impl EventKind {
    /// True for the events a driver makes while a call runs (`provider_delta`,
    /// `tool_progress`): not the machine's, never journaled, and their `seq` repeats
    /// their call's.
    pub fn is_live_only(&self) -> bool {
        matches!(
            self,
            EventKind::ProviderDelta { .. } | EventKind::ToolProgress { .. }
        )
    }
}

/// A run's options as `run_started` reports them.
///
/// The `with_context` values are left out: they may be secrets or large, and a journal
/// that replays the run records them as an input of its own (`spec/events.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StartOptions {
    /// `max_runs` (`None`: unlimited).
    pub max_runs: Option<u64>,
    /// `max_steps`.
    pub max_steps: u64,
    /// The run's timeout.
    pub timeout_ms: u64,
    /// The names given with `with_context`, in order.
    pub with_context: Vec<String>,
    /// The names of the tools the run may offer.
    pub tools: Vec<String>,
}

/// The phases of a step that render templates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The `pre` phase.
    Pre,
    /// The prompt's role sections, rendered into `prompts` (not the provider call).
    Prompt,
    /// The `post` phase.
    Post,
}

/// Tokens of one provider call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenUsage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
}

impl TokenUsage {
    /// The tokens `completion` reports, if it reports any (a count it leaves out is 0).
    pub fn of(completion: &crate::Completion) -> Option<TokenUsage> {
        let usage = completion.usage.as_ref()?;
        if usage.input_tokens.is_none() && usage.output_tokens.is_none() {
            return None;
        }
        Some(TokenUsage {
            input_tokens: usage.input_tokens.unwrap_or(0),
            output_tokens: usage.output_tokens.unwrap_or(0),
        })
    }
}

/// A failure with a machine-readable kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventError {
    /// For providers, the provider error kinds (`auth`, `rate_limited`, `timeout`, …);
    /// for a run, the [`RunErrorKind`](crate::RunErrorKind) in snake case.
    pub kind: String,
    /// The message.
    pub message: String,
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// No run error, and the last step left no `errors` (`aplc run` exits 0).
    Completed,
    /// No run error, but the last step's `errors` were not empty (`aplc run` exits 3).
    CompletedWithErrors,
    /// A run error other than a cancellation ended the run.
    Failed,
    /// The run was cancelled (the run error `cancelled`).
    Cancelled,
}

/// What a run consumed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    /// Steps entered.
    pub steps: u64,
    /// Provider calls asked for (answered or not).
    pub provider_calls: u64,
    /// Prompt tokens the providers reported.
    pub input_tokens: u64,
    /// Completion tokens the providers reported.
    pub output_tokens: u64,
    /// The run's length.
    pub elapsed_ms: f64,
}

/// The machine's event buffer and the times its events measure from.
///
/// Three modes ([`RunOptions::events`], [`RunOptions::journaled`]): off, a run nobody
/// listens to and nobody journals, where every recording method returns at its first
/// line; *counting*, a journaled run nobody listens to, where every method keeps the
/// sequence and the state exactly as if on (so the machine yields at the same points,
/// its journal positions and checkpoints are the same, and a replay with events on makes
/// the events it would have made) but builds no event; and on. Callers pass borrowed
/// names so that nothing is allocated unless an event is built.
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    on: bool,
    /// Counting mode, when not `on`.
    counted: bool,
    /// [`RunOptions::phase_times`] off: a phase that ends with nothing to wait for ends
    /// at the time of the input being handled, not the next poll's.
    untimed_phases: bool,
    buffer: Vec<Event>,
    seq: u64,
    /// The time of the call the machine is handling.
    now: Duration,
    step_started: Duration,
    phase: Option<(Phase, Duration)>,
    provider_started: Duration,
    tool_started: Duration,
    /// How many entries of the running step's `errors` have had an event.
    errors_seen: usize,
    provider_calls: u64,
    input_tokens: u64,
    output_tokens: u64,
    finished: bool,
}

/// Everything a [`Recorder`] remembers but its buffer, for checkpoints
/// (`machine/checkpoint.rs`): a restored run's events continue the same sequence.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RecorderState {
    pub(crate) seq: u64,
    pub(crate) now: Duration,
    pub(crate) step_started: Duration,
    pub(crate) phase: Option<(Phase, Duration)>,
    pub(crate) provider_started: Duration,
    pub(crate) tool_started: Duration,
    pub(crate) errors_seen: usize,
    pub(crate) provider_calls: u64,
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
    pub(crate) finished: bool,
}

impl Recorder {
    pub(crate) fn new(on: bool, counted: bool) -> Recorder {
        Recorder {
            on,
            counted,
            ..Recorder::default()
        }
    }

    /// The state to checkpoint. Events still in the buffer are not part of it: the
    /// driver drains them after every call.
    pub(crate) fn state(&self) -> RecorderState {
        RecorderState {
            seq: self.seq,
            now: self.now,
            step_started: self.step_started,
            phase: self.phase,
            provider_started: self.provider_started,
            tool_started: self.tool_started,
            errors_seen: self.errors_seen,
            provider_calls: self.provider_calls,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            finished: self.finished,
        }
    }

    /// A recorder that goes on from `state`, with an empty buffer.
    pub(crate) fn restored(on: bool, counted: bool, state: RecorderState) -> Recorder {
        let RecorderState {
            seq,
            now,
            step_started,
            phase,
            provider_started,
            tool_started,
            errors_seen,
            provider_calls,
            input_tokens,
            output_tokens,
            finished,
        } = state;
        Recorder {
            on,
            counted,
            untimed_phases: false,
            buffer: Vec::new(),
            seq,
            now,
            step_started,
            phase,
            provider_started,
            tool_started,
            errors_seen,
            provider_calls,
            input_tokens,
            output_tokens,
            finished,
        }
    }

    #[inline]
    pub(crate) fn on(&self) -> bool {
        self.on
    }

    /// This recorder with [`RunOptions::phase_times`] as given.
    pub(crate) fn with_phase_times(mut self, timed: bool) -> Recorder {
        self.untimed_phases = !timed;
        self
    }

    /// [`RunOptions::phase_times`].
    pub(crate) fn phase_times(&self) -> bool {
        !self.untimed_phases
    }

    /// True if the sequence and state are kept: events on, or counting.
    #[inline]
    pub(crate) fn tracking(&self) -> bool {
        self.on || self.counted
    }

    /// Builds events (`true`) or only counts them (`false`) from here on, in a journaled
    /// run; a run that is not journaled keeps what it was made with. A counting run
    /// builds them from an interrupt on (`Machine::fail_interrupted`): what it makes then
    /// depends on when the flag was seen, which no journal records, so those events are
    /// journaled as made.
    pub(crate) fn set_on(&mut self, on: bool) {
        if self.counted {
            self.on = on;
        }
    }

    /// Records the event `kind` makes: builds it when on, counts it when counting.
    #[inline]
    fn record(&mut self, kind: impl FnOnce() -> EventKind) {
        if self.on {
            self.push(kind());
        } else {
            self.seq += 1;
        }
    }

    /// The `seq` the next event gets: how many events the run has made.
    pub(crate) fn next_seq(&self) -> u64 {
        self.seq
    }

    /// Takes every event recorded so far.
    pub(crate) fn drain(&mut self) -> std::vec::Drain<'_, Event> {
        self.buffer.drain(..)
    }

    /// Sets the time of the call being handled: every event until the next call has it.
    #[inline]
    pub(crate) fn at(&mut self, now: Duration) {
        self.now = now;
    }

    fn push(&mut self, kind: EventKind) {
        self.buffer.push(Event {
            seq: self.seq,
            t_ms: ms(self.now),
            kind,
            path: None,
        });
        self.seq += 1;
    }

    /// `agent_started`: the running step (or its tool call `call_id`) starts a child run
    /// of `agent`.
    pub(crate) fn agent_started(&mut self, step: &str, agent: &str, call_id: Option<&str>) {
        if !self.tracking() {
            return;
        }
        self.record(|| EventKind::AgentStarted {
            step: step.to_owned(),
            agent: agent.to_owned(),
            call_id: call_id.map(str::to_owned),
        });
    }

    /// Takes the events a child run of `agent`, started at `offset`, made since the last
    /// call into this run's sequence: each gets the next `seq`, the time since this run
    /// started, and its path under `agent`. The child's `run_started` is dropped (this
    /// run's `agent_started` says it), and its `run_finished` becomes `agent_finished`,
    /// whose totals count towards this run's.
    ///
    /// `child` is the child's recorder and `adopted` how many of its events were taken
    /// before. In a counting run the child counts too: its events not built are counted
    /// here (with its totals, once it finished); the ones it built (from an interrupt
    /// on) are built here too.
    pub(crate) fn adopt(
        &mut self,
        child: &mut Recorder,
        adopted: &mut u64,
        offset: Duration,
        agent: &str,
        step: &str,
        call_id: Option<&str>,
    ) {
        if !self.tracking() {
            return;
        }
        let built = child.buffer.len() as u64;
        let counted = (child.seq - *adopted).saturating_sub(built);
        if counted > 0 {
            // The child's first event, `run_started`, is dropped; its `run_finished`
            // (always its last) becomes one `agent_finished`.
            let dropped = u64::from(*adopted == 0);
            self.seq += counted - dropped.min(counted);
            if child.finished && built == 0 {
                self.provider_calls += child.provider_calls;
                self.input_tokens += child.input_tokens;
                self.output_tokens += child.output_tokens;
            }
        }
        *adopted = child.seq;
        if built > 0 {
            self.set_on(true);
        }
        for event in child.buffer.drain(..) {
            let kind = match event.kind {
                EventKind::RunStarted { .. } => continue,
                EventKind::RunFinished {
                    outcome,
                    error,
                    totals,
                } => {
                    self.provider_calls += totals.provider_calls;
                    self.input_tokens += totals.input_tokens;
                    self.output_tokens += totals.output_tokens;
                    self.push(EventKind::AgentFinished {
                        step: step.to_owned(),
                        agent: agent.to_owned(),
                        call_id: call_id.map(str::to_owned),
                        outcome,
                        error,
                        totals,
                    });
                    continue;
                }
                kind => kind,
            };
            let path = match event.path {
                Some(below) => format!("{agent}/{below}"),
                None => agent.to_owned(),
            };
            self.buffer.push(Event {
                seq: self.seq,
                t_ms: event.t_ms + ms(offset),
                kind,
                path: Some(path),
            });
            self.seq += 1;
        }
    }

    pub(crate) fn run_started(&mut self, bundle: &Bundle, options: &RunOptions) {
        if !self.tracking() {
            return;
        }
        self.record(|| EventKind::RunStarted {
            version: EVENTS_VERSION,
            agent: bundle.source_name.clone(),
            bundle_hash: bundle.source_hash_hex(),
            options: StartOptions {
                max_runs: options.max_runs,
                max_steps: options.max_steps,
                timeout_ms: u64::try_from(options.timeout.as_millis()).unwrap_or(u64::MAX),
                with_context: options
                    .with_context
                    .iter()
                    .map(|(k, _)| k.clone())
                    .collect(),
                tools: options.tools.names().map(str::to_string).collect(),
            },
        });
    }

    pub(crate) fn step_started(&mut self, step: &str, runs: u64) {
        if !self.tracking() {
            return;
        }
        self.step_started = self.now;
        self.errors_seen = 0;
        self.record(|| EventKind::StepStarted {
            step: step.to_string(),
            runs,
        });
    }

    /// A phase starts now; [`phase_finished`](Self::phase_finished) reports it at the
    /// next call's time.
    pub(crate) fn phase_started(&mut self, phase: Phase) {
        if self.tracking() {
            self.phase = Some((phase, self.now));
        }
    }

    /// Reports the phase started last, if it has not been reported yet.
    pub(crate) fn phase_finished(&mut self, step: &str) {
        let Some((phase, started)) = self.phase.take() else {
            return;
        };
        let duration_ms = ms(self.now.saturating_sub(started));
        self.record(|| EventKind::PhaseFinished {
            step: step.to_string(),
            phase,
            duration_ms,
        });
    }

    /// True while a phase waits for its end time.
    pub(crate) fn phase_pending(&self) -> bool {
        self.phase.is_some()
    }

    pub(crate) fn provider_call(&mut self, step: &str, model: &str) {
        if !self.tracking() {
            return;
        }
        self.provider_started = self.now;
        self.provider_calls += 1;
        self.record(|| EventKind::ProviderCall {
            step: step.to_string(),
            model: model.to_string(),
        });
    }

    /// A provider call ended, in the typed boundary's terms.
    pub(crate) fn provider_result(
        &mut self,
        step: &str,
        usage: Option<TokenUsage>,
        finish_reason: Option<&str>,
        error: Option<(&str, &str)>,
    ) {
        if !self.tracking() {
            return;
        }
        if let Some(usage) = usage {
            self.input_tokens += usage.input_tokens;
            self.output_tokens += usage.output_tokens;
        }
        let latency_ms = ms(self.now.saturating_sub(self.provider_started));
        self.record(|| EventKind::ProviderResult {
            step: step.to_string(),
            usage,
            finish_reason: finish_reason.map(str::to_string),
            latency_ms,
            error: error.map(|(kind, message)| EventError {
                kind: kind.to_string(),
                message: message.to_string(),
            }),
        });
    }

    /// A provider call ended: with the completion or the typed error.
    pub(crate) fn provider_outcome(
        &mut self,
        step: &str,
        result: &Result<crate::Completion, crate::ProviderError>,
    ) {
        if !self.tracking() {
            return;
        }
        match result {
            Ok(completion) => {
                let reason = completion.finish_reason.as_ref().map(|r| r.as_str());
                self.provider_result(step, TokenUsage::of(completion), reason, None);
            }
            Err(err) => {
                let error = Some((err.kind.as_str(), err.message.as_str()));
                self.provider_result(step, None, None, error);
            }
        }
    }

    /// The model asked for `tool`; `tools` says where it comes from (its origin, if the
    /// run has it).
    pub(crate) fn tool_call(
        &mut self,
        step: &str,
        tool: &str,
        call_id: &str,
        tools: &crate::tools::ToolRegistry,
    ) {
        if !self.tracking() {
            return;
        }
        self.tool_started = self.now;
        self.record(|| {
            let origin = tools.get(tool).and_then(|spec| spec.origin());
            EventKind::ToolCall {
                step: step.to_string(),
                tool: tool.to_string(),
                call_id: call_id.to_string(),
                source: origin.map(|o| o.source().to_string()),
                server: origin.and_then(|o| o.server()).map(str::to_string),
            }
        });
    }

    /// A tool call's result; `executed` is false for calls refused by the checks or
    /// answered from the ledger, which took no time.
    pub(crate) fn tool_result(
        &mut self,
        step: &str,
        tool: &str,
        call_id: &str,
        with_error: bool,
        reused: bool,
        executed: bool,
    ) {
        if !self.tracking() {
            return;
        }
        let duration_ms = if executed {
            ms(self.now.saturating_sub(self.tool_started))
        } else {
            0.0
        };
        self.record(|| EventKind::ToolResult {
            step: step.to_string(),
            tool: tool.to_string(),
            call_id: call_id.to_string(),
            with_error,
            duration_ms,
            reused,
        });
    }

    /// The run asks `request`.
    pub(crate) fn input_requested(&mut self, request: &InputRequest) {
        if !self.tracking() {
            return;
        }
        self.record(|| EventKind::InputRequested {
            request: request.clone(),
        });
    }

    /// The run took `answer` to `request`.
    pub(crate) fn input_received(&mut self, request: &InputRequest, answer: &HumanAnswer) {
        if !self.tracking() {
            return;
        }
        self.record(|| {
            let (approved, reason, value) = match &answer.reply {
                Reply::Approve { approved, reason } => (Some(*approved), reason.clone(), None),
                Reply::Value(value) => (None, None, Some(value.clone())),
                Reply::TimedOut => (
                    (request.kind == crate::human::RequestKind::Approval).then_some(false),
                    None,
                    None,
                ),
            };
            EventKind::InputReceived {
                step: request.step.clone(),
                id: request.id.clone(),
                kind: request.kind,
                by: answer.by.clone(),
                answered_at_ms: answer.answered_at_ms,
                approved,
                reason,
                value,
                timed_out: matches!(answer.reply, Reply::TimedOut),
            }
        });
    }

    /// Reports the entries of `errors` past those already reported. `errors` is the
    /// variable's current value: a template may have replaced it, so a shorter list
    /// restarts the count.
    pub(crate) fn errors(&mut self, step: Option<&str>, errors: Option<minijinja::Value>) {
        if !self.on {
            return;
        }
        // `push_error` turns anything else into a list before it appends; until then
        // there is no entry to report.
        let Some(errors) = errors.filter(|e| e.kind() == minijinja::value::ValueKind::Seq) else {
            return;
        };
        let Ok(items) = errors.try_iter() else { return };
        let Some(first) = self.see_errors(errors.len().unwrap_or(0)) else {
            return;
        };
        for entry in items.skip(first) {
            let message = entry
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| entry.to_string());
            self.push(EventKind::Error {
                step: step.map(str::to_string),
                message,
            });
        }
    }

    /// [`Recorder::errors`] in a counting run: `len` is how many entries `errors` holds,
    /// if it is a list.
    pub(crate) fn count_errors(&mut self, len: Option<usize>) {
        if let Some(len) = len
            && let Some(first) = self.see_errors(len)
        {
            self.seq += (len - first) as u64;
        }
    }

    /// Takes the first `len` entries of `errors` as reported: the index of the first one
    /// not reported before, if any (a shorter list than before restarts the count).
    fn see_errors(&mut self, len: usize) -> Option<usize> {
        self.errors_seen = self.errors_seen.min(len);
        (len > self.errors_seen).then(|| std::mem::replace(&mut self.errors_seen, len))
    }

    /// `errors` was reset after a post phase.
    pub(crate) fn errors_reset(&mut self) {
        self.errors_seen = 0;
    }

    pub(crate) fn step_finished(&mut self, step: &str) {
        if !self.tracking() {
            return;
        }
        let duration_ms = ms(self.now.saturating_sub(self.step_started));
        self.record(|| EventKind::StepFinished {
            step: step.to_string(),
            duration_ms,
        });
    }

    pub(crate) fn jump(&mut self, from: &str, to: &str) {
        if !self.tracking() {
            return;
        }
        self.record(|| EventKind::Jump {
            from: from.to_string(),
            to: to.to_string(),
        });
    }

    /// The last event; later calls do nothing.
    pub(crate) fn run_finished(&mut self, error: Option<&RunError>, errors_left: bool, steps: u64) {
        if !self.tracking() || self.finished {
            return;
        }
        self.finished = true;
        let outcome = match (error, errors_left) {
            (Some(error), _) if error.kind == crate::RunErrorKind::Cancelled => {
                RunStatus::Cancelled
            }
            (Some(_), _) => RunStatus::Failed,
            (None, true) => RunStatus::CompletedWithErrors,
            (None, false) => RunStatus::Completed,
        };
        let totals = Totals {
            steps,
            provider_calls: self.provider_calls,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            elapsed_ms: ms(self.now),
        };
        self.record(|| EventKind::RunFinished {
            outcome,
            error: error.map(|e| EventError {
                kind: e.kind.as_str().to_string(),
                message: e.message.clone(),
            }),
            totals,
        });
    }
}

/// Milliseconds at microsecond resolution, so equal durations print equally.
fn ms(d: Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_form_is_flat_with_type() {
        let event = Event {
            seq: 3,
            t_ms: 1.5,
            path: None,
            kind: EventKind::Jump {
                from: "a".into(),
                to: "b".into(),
            },
        };
        assert_eq!(
            event.to_json(),
            serde_json::json!({"seq": 3, "t_ms": 1.5, "type": "jump", "from": "a", "to": "b"})
        );
        let back: Event = serde_json::from_value(event.to_json()).unwrap();
        assert_eq!(back, event);
    }

    #[test]
    fn a_recorder_that_is_off_records_nothing() {
        let mut recorder = Recorder::new(false, false);
        recorder.step_started("a", 0);
        recorder.provider_call("a", "m");
        recorder.jump("a", "b");
        recorder.run_finished(None, false, 1);
        assert_eq!(recorder.drain().count(), 0);
    }
}

//! What a run is given and how it fails: [`RunOptions`] and [`RunError`].
//!
//! A leaf module: the machine runs with these and the event recorder reports them
//! (`run_started`, `run_finished`), so they live apart from both (no import cycle).

use std::sync::Arc;
use std::time::Duration;

use minijinja::Value;

use crate::bundle::SourceSpan;
use crate::interrupt::Interrupt;
use crate::provider::tools::ToolRegistry;

/// The default wall-clock timeout of a run (§6.1).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(120_000);

/// The default cap on steps entered in one run (`max_steps`).
///
/// A loop whose post phase jumps back on errors spins as fast as the machine allows once
/// the provider fails for good (a failed call does not count towards `max_runs`), and
/// grows `context_history` by a snapshot per step. 1,000 steps end such a loop within a
/// second or two at a few megabytes; runs that need more raise the budget explicitly.
pub const DEFAULT_MAX_STEPS: u64 = 1_000;

/// The default cap on how deeply agents call agents (`max_agent_depth`): the root run is
/// depth 0, its children 1 (`spec/agents.md`).
pub const DEFAULT_MAX_AGENT_DEPTH: u32 = 8;

/// Agents a run may call by a name its bundle does not link (a name computed at run
/// time): the served directory's, or `--agents DIR`'s.
pub type AgentTable = std::collections::BTreeMap<String, Arc<crate::Program>>;

/// Options of one run (§6.1).
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Wall-clock limit for the whole run.
    pub timeout: Duration,
    /// Cap on `global_runs`; `None` is unlimited.
    pub max_runs: Option<u64>,
    /// Cap on steps entered; entering one more fails the run with
    /// `Step budget exceeded: N steps`. Defaults to [`DEFAULT_MAX_STEPS`].
    pub max_steps: u64,
    /// Variables injected before the first step (`with_context`).
    pub with_context: Vec<(String, Value)>,
    /// The tools the run may offer the model (`with_tools`; their descriptors).
    pub tools: Arc<ToolRegistry>,
    /// Cancels the run from outside, even in the middle of a render
    /// ([`Interrupt::cancel`]). Clones share the flag, so a flag set once stops every
    /// run given a clone of it. See [`Interrupt`].
    pub interrupt: Interrupt,
    /// Record [`Event`](crate::Event)s for [`Machine::drain_events`](crate::Machine::drain_events). Off by default: a run nobody
    /// listens to builds no event.
    pub events: bool,
    /// The run is journaled (a durable run): with `events` off, its machine keeps the
    /// event sequence and everything events measure exactly as if they were on, and
    /// yields at the same points, but builds none. So its journal is the same with
    /// events on or off, and a replay of it with events on makes the run's events
    /// (`spec/durability.md`, "Events"). Costs a few counters; an in-memory run nobody
    /// listens to leaves it off.
    pub journaled: bool,
    /// With events on or counted, a phase's end waits for the next poll's time, so that
    /// `phase_finished` says how long the phase took: the machine yields
    /// ([`Action::Continue`](crate::Action::Continue)) after each phase that ends with
    /// nothing to wait for. Off, such a phase ends at the time of the input being handled
    /// (a render alone takes 0 ms) and the machine makes the polls a run with events off
    /// makes: a durable run nobody listens to (`spec/durability.md`, "Events"). On by
    /// default; the journal of a run records it, since it decides the polls.
    pub phase_times: bool,
    /// Agents the run may call besides the ones its bundle links (which come first):
    /// for names computed at run time (`spec/agents.md`).
    pub agents: Arc<AgentTable>,
    /// How deeply agents may call agents; a call past it fails like a failed child.
    pub max_agent_depth: u32,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            timeout: DEFAULT_TIMEOUT,
            max_runs: None,
            max_steps: DEFAULT_MAX_STEPS,
            with_context: Vec::new(),
            tools: Arc::new(ToolRegistry::new()),
            interrupt: Interrupt::new(),
            events: false,
            journaled: false,
            phase_times: true,
            agents: Arc::new(AgentTable::new()),
            max_agent_depth: DEFAULT_MAX_AGENT_DEPTH,
        }
    }
}

impl RunOptions {
    /// Adds every entry of a JSON object to `with_context`.
    pub fn with_context_json(
        mut self,
        object: &serde_json::Map<String, serde_json::Value>,
    ) -> Self {
        for (k, v) in object {
            self.with_context
                .push((k.clone(), crate::template::store::value_from_json(v)));
        }
        self
    }
}

/// Why a run failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RunError {
    /// What kind of failure.
    pub kind: RunErrorKind,
    /// The message, in the spec's words where it has them (`Unknown step: <name>`).
    pub message: String,
    /// The step that was running.
    pub step: Option<String>,
    /// Where in the `.apl` source, when known.
    pub span: Option<SourceSpan>,
}

/// The kinds of run failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RunErrorKind {
    /// `next_step` named no step.
    UnknownStep,
    /// A provider call would exceed `max_runs`.
    BudgetExceeded,
    /// Entering a step would exceed `max_steps`.
    StepBudgetExceeded,
    /// The run's wall-clock timeout passed.
    Timeout,
    /// The run options were invalid (e.g. a reserved `with_context` name).
    InvalidOptions,
    /// A declared input (`{# inputs: … #}`) was not given with `with_context`; the run
    /// ended before its first step, so no provider was called.
    MissingInput,
    /// The driver broke the calling contract.
    Protocol,
    /// The run was cancelled through its [`Interrupt`].
    Cancelled,
    /// The run asked a person (`spec/human.md`) and its driver had nobody to ask and no
    /// store to wait in ([`Machine::abandon_input`](crate::Machine::abandon_input)).
    InputUnavailable,
}

impl RunErrorKind {
    /// The kind in snake case, as events and the bindings spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            RunErrorKind::UnknownStep => "unknown_step",
            RunErrorKind::BudgetExceeded => "budget_exceeded",
            RunErrorKind::StepBudgetExceeded => "step_budget_exceeded",
            RunErrorKind::Timeout => "timeout",
            RunErrorKind::InvalidOptions => "invalid_options",
            RunErrorKind::MissingInput => "missing_input",
            RunErrorKind::Protocol => "protocol",
            RunErrorKind::Cancelled => "cancelled",
            RunErrorKind::InputUnavailable => "input_unavailable",
        }
    }
}

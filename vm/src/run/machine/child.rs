//! Agents that call agents (`spec/agents.md`): a child run is a [`Machine`] inside its
//! parent's, and the parent is its only door.
//!
//! While a child runs, every input the parent takes goes to it (the innermost one, at
//! any depth), and every action it returns is the parent's: the driver, the journal and
//! a replay see one run with one sequence of inputs, so a crash inside a child resumes
//! inside it, by replay, with nothing to store per child. The child's events join the
//! parent's sequence with their `path`. A child's end is not an input: the parent takes
//! its outcome at the next poll and goes on, as it does after a tool call.

use std::sync::Arc;
use std::time::Duration;

use minijinja::Value;

use super::{Machine, step_name};
use crate::human::InputRequest;
use crate::names;
use crate::program::Program;
use crate::provider::tools::ToolRegistry;
use crate::run::{AgentTable, RunOptions};
use crate::template::store::value_from_json;

/// The agents a run may call: those linked into the root's bundle first, then the ones
/// its host gave ([`RunOptions::agents`]). Every run of a tree shares the root's.
#[derive(Clone)]
pub(super) struct Agents {
    root: Arc<Program>,
    host: Arc<AgentTable>,
}

impl Agents {
    pub(super) fn new(root: &Arc<Program>, host: &Arc<AgentTable>) -> Agents {
        Agents {
            root: Arc::clone(root),
            host: Arc::clone(host),
        }
    }

    fn get(&self, name: &str) -> Option<Arc<Program>> {
        self.root
            .agent(name)
            .or_else(|| self.host.get(name))
            .cloned()
    }
}

impl Agents {
    /// The run's tools: `tools`, with the agent tools whose manifest left out their
    /// descriptor given their agent's declared inputs.
    pub(super) fn tools(&self, tools: &Arc<ToolRegistry>) -> Arc<ToolRegistry> {
        let lookup = |name: &str| {
            let program = self.root.agent(name).or_else(|| self.host.get(name))?;
            let bundle = program.bundle();
            Some((bundle.inputs.as_slice(), bundle.description.as_deref()))
        };
        match tools.with_agent_inputs(lookup) {
            Some(registry) => Arc::new(registry),
            None => Arc::clone(tools),
        }
    }
}

impl std::fmt::Debug for Agents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agents")
            .field("linked", &self.root.agents().len())
            .field("host", &self.host.len())
            .finish()
    }
}

/// Where a run sits in its tree: what it may call, and how deep it is.
#[derive(Debug)]
pub(super) struct Nest {
    pub(super) agents: Agents,
    /// The child running now, if any.
    pub(super) child: Option<Box<Child>>,
    /// 0 for the root run.
    pub(super) depth: u32,
    pub(super) max_depth: u32,
    /// The agents from the root's child down to this run, `/`-joined; none at the root.
    pub(super) path: Option<Arc<str>>,
    /// Errors of the step's agent call: they run after its post phase, so its snapshot
    /// carries them into the next step's `errors` (`Machine::snapshot`).
    pub(super) carried: Vec<String>,
}

impl Nest {
    /// A root run's place: no child yet, depth 0.
    pub(super) fn root(program: &Arc<Program>, options: &RunOptions) -> Nest {
        Nest {
            agents: Agents::new(program, &options.agents),
            child: None,
            depth: 0,
            max_depth: options.max_agent_depth,
            path: None,
            carried: Vec::new(),
        }
    }
}

/// A child run and what its parent remembers of the call.
#[derive(Debug)]
pub(super) struct Child {
    machine: Machine,
    agent: String,
    /// The parent's step that called.
    step: String,
    /// The tool call the child answers (an agent tool); none for `call_agent`.
    call_id: Option<String>,
    /// When it started, on the parent's clock: the child's clock reads zero then.
    started: Duration,
    /// How many of the child's events the parent's sequence has taken.
    adopted: u64,
}

impl Machine {
    /// The child running now, if any.
    pub(super) fn child_mut(&mut self) -> Option<&mut Machine> {
        self.nest.child.as_mut().map(|child| &mut child.machine)
    }

    /// The child running now, if any.
    pub(super) fn child(&self) -> Option<&Machine> {
        self.nest.child.as_ref().map(|child| &child.machine)
    }

    /// Steps entered by this run and its running children.
    pub(super) fn total_steps(&self) -> u64 {
        self.steps + self.child().map_or(0, Machine::total_steps)
    }

    /// Polls the running child at `now` (the parent's clock). Its action is the
    /// parent's, but for its end: then the parent takes its outcome and `None` says go
    /// on.
    pub(super) fn poll_child(&mut self, now: Duration) -> Option<super::Action> {
        let child = self.nest.child.as_mut()?;
        let action = child.machine.take_poll(now.saturating_sub(child.started));
        self.adopt_child_events();
        if matches!(action, super::Action::Done) {
            self.end_child(now);
            return None;
        }
        Some(action)
    }

    /// Hands an input to the running child, through `give` (the child's clock is passed
    /// to it). False if no child runs.
    pub(super) fn give_child(
        &mut self,
        now: Duration,
        give: impl FnOnce(&mut Machine, Duration),
    ) -> bool {
        let Some(child) = self.nest.child.as_mut() else {
            return false;
        };
        self.events.at(now);
        give(&mut child.machine, now.saturating_sub(child.started));
        self.adopt_child_events();
        true
    }

    /// Moves the child's new events into this run's sequence.
    fn adopt_child_events(&mut self) {
        let Some(child) = self.nest.child.as_mut() else {
            return;
        };
        let Child {
            machine,
            agent,
            step,
            call_id,
            started,
            adopted,
        } = &mut **child;
        (self.events).adopt(
            &mut machine.events,
            adopted,
            *started,
            agent,
            step,
            call_id.as_deref(),
        );
    }

    /// At the end of a step, runs the agent a phase set `call_agent` to (`spec/agents.md`
    /// §1.1), and resets it, so it runs once. True if a child now runs; a call that
    /// cannot start (an invalid value, an unknown agent, too deep) fails like a failed
    /// child, in `agent_result` and `errors`.
    pub(super) fn call_agent(&mut self, now: Duration) -> bool {
        let Some(value) = self.store.get(names::CALL_AGENT) else {
            return false;
        };
        if value.is_none() || value.is_undefined() {
            return false;
        }
        self.store.set(names::CALL_AGENT, Value::from(()));
        let started = delegation(&value).and_then(|(agent, context)| {
            self.start_child(&agent, context, None, now).map(|()| agent)
        });
        match started {
            Ok(_) => true,
            Err(message) => {
                let message = format!("call_agent: {message}");
                self.nest.carried.push(message.clone());
                let failed = serde_json::json!({ "status": "failed", "error": message });
                self.store
                    .set(names::AGENT_RESULT, value_from_json(&failed));
                false
            }
        }
    }

    /// Starts a child run of `agent` with `context`, for the running step or its tool
    /// call `call_id`. Refuses an agent neither linked nor given, and a call past the
    /// depth limit.
    pub(super) fn start_child(
        &mut self,
        agent: &str,
        context: Vec<(String, Value)>,
        call_id: Option<String>,
        now: Duration,
    ) -> Result<(), String> {
        let Some(program) = self.nest.agents.get(agent) else {
            return Err(format!(
                "unknown agent `{}`: it is not linked into the bundle, and the run was \
                 given no agent of that name",
                crate::text::escape_control(agent)
            ));
        };
        let depth = self.nest.depth + 1;
        if depth > self.nest.max_depth {
            return Err(format!(
                "agent `{agent}` would run at depth {depth}, past the limit of {} \
                 (max_agent_depth)",
                self.nest.max_depth
            ));
        }
        let step = step_name(&self.program, self.step).to_owned();
        self.events.at(now);
        self.events.agent_started(&step, agent, call_id.as_deref());
        let options = RunOptions {
            // The child's time and steps count towards the parent's budgets.
            timeout: self.deadline.saturating_sub(now),
            max_steps: self.max_steps.saturating_sub(self.steps),
            max_runs: None,
            with_context: context,
            tools: Arc::clone(&self.tools),
            interrupt: self.interrupt[1].clone(),
            events: self.events.on(),
            journaled: self.events.tracking(),
            phase_times: self.events.phase_times(),
            agents: Arc::clone(&self.nest.agents.host),
            max_agent_depth: self.nest.max_depth,
        };
        let mut machine = Machine::new(program, options);
        // One deadline flag and one cancel flag for the whole tree: a child cannot
        // outlive its parent.
        machine.interrupt = self.interrupt.clone();
        // The root's agents, and the parent's tools as the root's agents filled them in
        // (`Machine::new` looked the child's own agent tools up from the child).
        machine.nest.agents = self.nest.agents.clone();
        machine.tools = Arc::clone(&self.tools);
        machine.nest.depth = depth;
        machine.nest.path = Some(match &self.nest.path {
            Some(path) => format!("{path}/{agent}").into(),
            None => agent.into(),
        });
        self.nest.child = Some(Box::new(Child {
            machine,
            agent: agent.to_owned(),
            step,
            call_id,
            started: now,
            adopted: 0,
        }));
        Ok(())
    }

    /// Takes the finished child's outcome: into `agent_result` (and `errors`, if it
    /// failed) for `call_agent`, or as the tool call's result for an agent tool.
    fn end_child(&mut self, now: Duration) {
        let Some(child) = self.nest.child.take() else {
            return;
        };
        let Child {
            machine,
            agent,
            call_id,
            ..
        } = *child;
        let outcome = machine.into_outcome();
        self.steps += outcome.steps;
        let error = outcome.error.as_ref().map(|e| e.message.clone());
        if call_id.is_some() {
            let result = match error {
                Some(message) => Err(format!("agent `{agent}` failed: {message}")),
                None => Ok(tool_result(&outcome)),
            };
            self.finish_tool_call(now, result, None);
            return;
        }
        // The child's values as they are (shared, not copied), without its history.
        let mut result: std::collections::BTreeMap<String, Value> = (outcome.vars.iter())
            .map(|(k, v)| (k.to_owned(), v.clone()))
            .collect();
        let status = if error.is_some() {
            "failed"
        } else {
            "completed"
        };
        result.insert("status".into(), Value::from(status));
        if let Some(message) = &error {
            result.insert("error".into(), Value::from(message.as_str()));
            (self.nest.carried).push(format!("agent `{agent}` failed: {message}"));
        }
        self.store.set(names::AGENT_RESULT, Value::from(result));
    }

    /// Ends the running children with this run: `message` is why (a person nobody can
    /// ask, in a child). Their last events join the sequence.
    pub(super) fn abandon_child(&mut self, message: &str) {
        if let Some(child) = self.child_mut() {
            child.abandon_input(message.to_owned());
        }
        self.adopt_child_events();
    }

    /// Marks the requests a child asks with its path, so that ids stay unique in the
    /// tree and the request says which child asked.
    pub(super) fn mark_requests(&self, requests: &mut [InputRequest]) {
        let Some(path) = &self.nest.path else {
            return;
        };
        for request in requests {
            request.id = format!("{path}/{}", request.id);
            request.agent = Some(path.to_string());
        }
    }

    /// True while a child runs, whose state a checkpoint cannot hold.
    pub(super) fn has_child(&self) -> bool {
        self.nest.child.is_some()
    }

    /// The parent-side state while a child runs is always `Running`.
    pub(super) fn child_expecting(&self) -> Option<super::Expecting> {
        let child = self.child()?;
        Some(match child.expecting() {
            // The parent takes a finished child's outcome at its next poll.
            super::Expecting::Nothing => super::Expecting::Poll,
            expecting => expecting,
        })
    }
}

/// An agent tool call's result: the child's `result_json` if it has one, else its
/// `result_text`.
fn tool_result(outcome: &crate::RunOutcome) -> serde_json::Value {
    let value = |name| {
        outcome
            .vars
            .get(name)
            .filter(|v| !v.is_none() && !v.is_undefined())
    };
    match value(names::RESULT_JSON).or_else(|| value(names::RESULT_TEXT)) {
        Some(value) => super::to_json(value),
        None => serde_json::Value::Null,
    }
}

/// Reads a `call_agent` value: `{'agent': name, 'context': {…}}`, the context optional.
fn delegation(value: &Value) -> Result<(String, Vec<(String, Value)>), String> {
    let field = |name: &str| value.get_attr(name).ok().filter(|v| !v.is_undefined());
    if value.kind() != minijinja::value::ValueKind::Map {
        return Err(format!(
            "expected a mapping with `agent` and `context`, found {}",
            value.kind()
        ));
    }
    let agent = match field("agent") {
        Some(agent) => match agent.as_str() {
            Some(name) => name.to_owned(),
            None => return Err("`agent` must be a string".into()),
        },
        None => return Err("`agent` is missing".into()),
    };
    let context = match field("context") {
        None => Vec::new(),
        Some(context) if context.is_none() => Vec::new(),
        Some(context) => {
            if context.kind() != minijinja::value::ValueKind::Map {
                return Err("`context` must be a mapping".into());
            }
            let Ok(keys) = context.try_iter() else {
                return Err("`context` must be a mapping".into());
            };
            keys.map(|key| {
                let value = context.get_item(&key).unwrap_or_default();
                match key.as_str() {
                    Some(name) => Ok((name.to_owned(), value)),
                    None => Err(format!("`context` key {key} is not a string")),
                }
            })
            .collect::<Result<_, _>>()?
        }
    };
    Ok((agent, context))
}

//! The machine's one input door: [`Machine::apply`] takes every [`Input`] a run
//! consumes, live or replayed, and [`Machine::replay`] does the same for an input read
//! back from a journal, checking it against what the journal recorded.
//!
//! The alphabet is the journal's ([`Input`]): what a driver hands in is exactly what a
//! durable run writes down, so a replay is `for input in journal { machine.replay(…) }`
//! and nothing re-dispatches inputs by hand.

use super::{Action, Machine, State};
use crate::run::journal::{Input, JournalError, Position};

/// The kind of input the machine waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expecting {
    /// A poll: the machine is between calls.
    Poll,
    /// The answer to its provider call (or a timeout).
    Provider,
    /// The result of its tool call (or a timeout).
    Tool,
    /// A person's answers to its requests ([`Machine::pending_requests`]).
    Answer,
    /// Nothing more: the run is over (a poll still answers [`Action::Done`], and the
    /// first such poll reports the end).
    Nothing,
}

impl Expecting {
    /// What a message says the machine waited for.
    fn describe(self) -> &'static str {
        match self {
            Expecting::Poll => "a poll",
            Expecting::Provider => "a provider answer",
            Expecting::Tool => "a tool result",
            Expecting::Answer => "a person's answer",
            Expecting::Nothing => "nothing (the run was over)",
        }
    }
}

impl Input {
    /// What a message calls this input.
    fn describe(&self) -> &'static str {
        match self {
            Input::Poll { .. } => "a poll",
            Input::Provider { .. } => "a provider answer",
            Input::Tool { .. } => "a tool result",
            Input::Timeout { .. } => "a timeout",
            Input::Answer { .. } => "a person's answer",
        }
    }
}

impl Machine {
    /// Hands the machine its next input: a poll runs it to its next [`Action`]; an
    /// answer (a provider's, a tool's, a timeout) is taken in and returns
    /// [`Action::Continue`], since the machine goes on only when polled with a fresh time.
    pub fn apply(&mut self, input: Input) -> Action {
        match input {
            Input::Poll { at } => return self.take_poll(at),
            Input::Provider { at, result } => self.take_provider_response(at, result),
            Input::Tool { at, result } => self.take_tool_result(at, result),
            Input::Timeout { at } => self.take_timeout(at),
            Input::Answer { at, answer } => self.take_answer(at, answer),
        }
        Action::Continue
    }

    /// The kind of input the machine waits for.
    pub fn expecting(&self) -> Expecting {
        if let Some(expecting) = self.child_expecting() {
            return expecting;
        }
        match self.state {
            State::AwaitingProvider => Expecting::Provider,
            State::AwaitingTool { .. } => Expecting::Tool,
            State::AwaitingInput => Expecting::Answer,
            State::Done => Expecting::Nothing,
            State::Running | State::PromptFailed | State::Responded(_) => Expecting::Poll,
        }
    }

    /// Where the run is, as a journal records it after each input: the number of events
    /// made so far and the steps entered. Two runs of one program that took the same
    /// inputs are at the same position.
    pub fn position(&self) -> Position {
        Position {
            events: self.events.next_seq(),
            steps: self.total_steps(),
        }
    }

    /// [`Machine::apply`] for input number `index` of a journal, which recorded the run
    /// at `recorded` after it (`None` for journals older than positions). Refuses, with
    /// [`JournalError::Diverged`], an input the machine does not wait for (a tool result
    /// while it waits for a provider) and a position that differs from the recorded one:
    /// the journal was written by a run that went another way, and replaying on would
    /// make a different run silently.
    pub fn replay(
        &mut self,
        index: u64,
        input: Input,
        recorded: Option<Position>,
    ) -> Result<Action, JournalError> {
        let expecting = self.expecting();
        // A finished run still takes the poll that reports its end (`run_finished`).
        let fits = matches!(
            (&input, expecting),
            (Input::Poll { .. }, Expecting::Poll | Expecting::Nothing)
                | (Input::Provider { .. }, Expecting::Provider)
                | (Input::Tool { .. }, Expecting::Tool)
                | (Input::Answer { .. }, Expecting::Answer)
                | (Input::Timeout { .. }, Expecting::Provider | Expecting::Tool)
        );
        if !fits {
            return Err(JournalError::Diverged(format!(
                "input {index} is {} but the machine waits for {}{}",
                input.describe(),
                expecting.describe(),
                self.at_step(),
            )));
        }
        let action = self.apply(input);
        if let Some(recorded) = recorded {
            let now = self.position();
            if now != recorded {
                return Err(JournalError::Diverged(format!(
                    "after input {index}{}, the run made {} events and entered {} steps; \
                     the journal recorded {} events and {} steps",
                    self.at_step(),
                    now.events,
                    now.steps,
                    recorded.events,
                    recorded.steps,
                )));
            }
        }
        Ok(action)
    }

    /// `" (step `name`)"`, or nothing before the first step.
    fn at_step(&self) -> String {
        match self.step {
            Some(step) => format!(" (step `{}`)", self.program.step_name(step)),
            None => String::new(),
        }
    }
}

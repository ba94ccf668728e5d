//! The durable form of a run: the inputs a [`Machine`](crate::Machine) consumed, and
//! checkpoints of its state.
//!
//! A machine is deterministic given its inputs: the times passed to `poll` and
//! `handle_*`, the provider completions and the tool results. Journaling those inputs,
//! in order, is enough to rebuild a run exactly by replaying them into a fresh machine
//! (`spec/durability.md`). A [`Checkpoint`] spares the replay from step 0: it is the
//! machine's state at a point where its next input is a `poll`, plus the segment of
//! `context_history` since the previous checkpoint, so storage grows with what each step
//! changed and never with the whole history.
//!
//! These are boundary types: they derive serde and encode with postcard. The run state
//! they are made from (`machine.rs`, `store.rs`) does not.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{Completion, ProviderError};

/// One input the machine consumed, with the time it was given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Input {
    /// `Machine::poll(at)`.
    Poll {
        /// Time since the run started.
        at: Duration,
    },
    /// `Machine::handle_provider_response(at, result)`.
    Provider {
        /// Time since the run started.
        at: Duration,
        /// What the provider answered (`Completion::raw` is not kept).
        result: Result<Completion, ProviderError>,
    },
    /// `Machine::handle_tool_result(at, result)`.
    Tool {
        /// Time since the run started.
        at: Duration,
        /// The tool's output or error message.
        result: Result<serde_json::Value, String>,
    },
    /// `Machine::handle_timeout(at)`.
    Timeout {
        /// Time since the run started.
        at: Duration,
    },
}

impl Input {
    /// The time the input was given.
    pub fn at(&self) -> Duration {
        match self {
            Input::Poll { at }
            | Input::Provider { at, .. }
            | Input::Tool { at, .. }
            | Input::Timeout { at } => *at,
        }
    }

    /// Encodes the input (postcard).
    pub fn encode(&self) -> Vec<u8> {
        todo!("journal: Input::encode")
    }

    /// Decodes an input written by [`Input::encode`].
    pub fn decode(bytes: &[u8]) -> Result<Input, JournalError> {
        let _ = bytes;
        todo!("journal: Input::decode")
    }
}

/// A machine's state at rest (its next input is a `poll`), encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// Index of the first `context_history` entry in `history`.
    pub history_start: u64,
    /// `context_history` entries `history_start..`, encoded as deltas.
    pub history: Vec<u8>,
    /// Everything else: variables, position, counters, ledger, tool round, events'
    /// sequence numbers.
    pub state: Vec<u8>,
}

/// A journal or checkpoint that cannot be read or made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    /// Bytes that do not decode.
    #[error("corrupt journal entry: {0}")]
    Corrupt(String),
    /// A checkpoint asked for while a provider or tool call is outstanding.
    #[error("the machine is not at rest: {0}")]
    NotAtRest(&'static str),
    /// A value that has no durable form (a macro, a callable): the caller skips this
    /// checkpoint, and resume replays from an earlier one.
    #[error("variable `{name}` holds a {kind}, which cannot be checkpointed")]
    Unencodable {
        /// The variable.
        name: String,
        /// What it holds.
        kind: String,
    },
    /// A checkpoint of another program, or segments out of order.
    #[error("checkpoint does not match: {0}")]
    Mismatch(String),
}

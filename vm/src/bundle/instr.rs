//! The instruction set of the APL machine and the opaque ids it uses.
//!
//! Each step compiles to a short straight-line sequence ending in [`Instr::Branch`]; the
//! machine's program counter walks it. `spec/instructions.md` documents every instruction.

use serde::{Deserialize, Serialize};

/// Opaque id of a step: its index in the step table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StepId(pub u32);

/// Opaque id of a template: its index in the template table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TemplateId(pub u32);

impl StepId {
    /// The index as `usize`, for table lookups.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl TemplateId {
    /// The index as `usize`, for table lookups.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// One machine instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Instr {
    /// Begins a step: sets `prev_step` to the step that just finished, clears `next_step`,
    /// loads `runs` for this step and restarts `time_elapsed`.
    EnterStep(StepId),
    /// Renders the `pre` phase template; its output is discarded, its errors go to `errors`.
    RenderPre(TemplateId),
    /// Renders the prompt's role sections `messages[first .. first + count]` into `prompts`.
    BuildPrompts {
        /// Index of the first entry in the message table.
        first: u32,
        /// Number of entries.
        count: u32,
    },
    /// Resets the `result_*` variables, sets `tools`, checks the run budget and suspends
    /// with a provider call. Skipped when the prompt failed to render.
    CallProvider,
    /// Applies the provider's response to the `result_*` variables (§2.2.6), or appends
    /// the provider's error to `errors`.
    ProcessResponse,
    /// Checks and executes the response's tool calls in order (suspends while tools run)
    /// and stores `result_tool_calls`.
    CallTools,
    /// Clears `next_step`, so only a value set by the `post` phase takes effect.
    ClearNextStep,
    /// Renders the `post` phase template; its output is discarded.
    RenderPost(TemplateId),
    /// Appends a snapshot of the context to `context_history`, then resets `errors`.
    Snapshot,
    /// Ends the step: jumps to `next_step`, or finishes the run when it is unset or
    /// `return`; an unknown name fails the run with `Unknown step: <name>`.
    Branch,
}

//! One run: what it is given and how it fails (`options.rs`), the sans-IO
//! [`Machine`](crate::Machine) (`machine.rs`, checkpoints in `machine/checkpoint.rs`),
//! its typed events (`events.rs`) and its journaled inputs (`journal.rs`).
//!
//! The top folder: it uses `template/` and `provider/`, neither of which uses it.

pub(crate) mod events;
pub mod journal;
pub(crate) mod machine;
mod options;

pub use options::{
    AgentTable, DEFAULT_MAX_AGENT_DEPTH, DEFAULT_MAX_STEPS, DEFAULT_TIMEOUT, RunError,
    RunErrorKind, RunOptions,
};

//! The APL virtual machine.
//!
//! * [`bundle`]: the versioned binary format the compiler writes and the VM loads.
//! * [`Program`]: a decoded bundle with every template compiled once; immutable,
//!   `Send + Sync`, shared by any number of runs.
//! * [`Machine`]: one run, as a sans-IO state machine. It takes the current time and the
//!   results of provider and tool calls in, and hands out [`Action`]s. It never reads a
//!   clock, spawns, or touches the network or the file system.
//! * The provider boundary, typed: the [`ProviderRequest`] the machine builds
//!   ([`build_request`]), the [`Completion`] or [`ProviderError`] a provider answers, and
//!   the pure [`wire`] formats that encode and decode them.
//! * [`ScriptedProvider`]: canned completions, for tests, `--mock` and benches.
//!
//! The code is in three layered folders, each using only those before it: `template/`
//! (the environment, the context store, helpers and filters), `provider/` (the request,
//! the exchange types, wire formats, tools) and `run/` (options, machine, events,
//! journal); the bundle format and a few leaf modules sit beside them.
//!
//! This crate performs no I/O at all: no files, sockets, threads or clocks, with any
//! features. The `aplc-runtime` crate drives a [`Machine`] with tokio and owns the
//! providers, tools and HTTP.
#![deny(missing_docs)]

pub mod bundle;
mod interrupt;
pub mod names;
mod program;
mod provider;
mod run;
mod template;
pub mod text;

pub use provider::{human, tools, wire};
pub use run::journal;

pub use bundle::dialect::{Dialect, any_dialect_helper};
/// The names of the dialect helpers.
pub mod dialect_names {
    pub use crate::bundle::dialect::{
        ADD, CURRENT_STEP, DEC, GET, INC, NEXT, PREV, REM, RESULT, SET, SET_JSON_PATH,
    };
}
pub use interrupt::{Interrupt, InterruptReason};
pub use names::{RESERVED_VARIABLES, user_defaults};
pub use program::{LoadError, MAX_STEPS, MAX_TEMPLATE_BYTES, MAX_TEMPLATES, Program, check_size};
pub use provider::exchange::{
    Completion, Content, FinishReason, Message, OutputFormat, Part, ProviderError,
    ProviderErrorKind, ProviderRequest, Role, Sampling, ToolCall, ToolDefinition, Usage,
};
pub use provider::request::build_request;
pub use provider::scripted::{ScriptError, ScriptedProvider};
pub use run::events::{
    EVENTS_VERSION, Event, EventError, EventKind, Phase, Progress, RunStatus, StartOptions,
    TokenUsage, ToolCallRef, Totals,
};
pub use run::machine::{
    Action, DeferredCheckpoint, Expecting, HistorySegment, Machine, RunOutcome, options_error,
    run_scripted, run_scripted_with_listener,
};
pub use run::{
    AgentTable, DEFAULT_MAX_AGENT_DEPTH, DEFAULT_MAX_STEPS, DEFAULT_TIMEOUT, RunError,
    RunErrorKind, RunOptions,
};
pub use template::check::{
    MAX_EXPRESSION_DEPTH, TemplateFault, check_depth, check_statements, check_template,
};
pub use template::env::{Limits, template_env, template_env_for};
pub use template::jinja2::{JINJA2_FILTERS, JINJA2_GLOBALS, JINJA2_TESTS, percent_format};
pub use template::store::{Snapshot, Store, Vars, value_from_json};

/// Re-exported so embedders and the compiler use the exact same template engine.
pub use minijinja;

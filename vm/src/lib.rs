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
//! This crate performs no I/O at all: no files, sockets, threads or clocks, with any
//! features. The `aplc-runtime` crate drives a [`Machine`] with tokio and owns the
//! providers, tools and HTTP.
#![deny(missing_docs)]

pub mod bundle;
mod caps;
mod dialect;
mod env;
mod events;
mod exchange;
mod helpers;
mod interrupt;
mod jinja2;
pub mod journal;
mod machine;
mod messages;
mod program;
mod provider;
mod python;
mod request;
mod response;
mod run;
mod store;
mod template_check;
pub mod text;

pub mod tools;
pub mod wire;

pub use dialect::{Dialect, any_dialect_helper};
/// The names of the dialect helpers.
pub mod dialect_names {
    pub use crate::dialect::{
        ADD, CURRENT_STEP, DEC, GET, INC, NEXT, PREV, REM, RESULT, SET, SET_JSON_PATH,
    };
}
pub use env::{Limits, template_env, template_env_for};
pub use events::{
    EVENTS_VERSION, Event, EventError, EventKind, Phase, RunStatus, StartOptions, TokenUsage,
    Totals,
};
pub use exchange::{
    Completion, Content, FinishReason, Message, OutputFormat, Part, ProviderError,
    ProviderErrorKind, ProviderRequest, Role, Sampling, ToolCall, ToolDefinition, Usage,
};
pub use interrupt::{Interrupt, InterruptReason};
pub use jinja2::{JINJA2_FILTERS, JINJA2_GLOBALS, JINJA2_TESTS, percent_format};
pub use machine::{
    Action, Machine, RunOutcome, options_error, run_scripted, run_scripted_with_listener,
};
pub use run::{DEFAULT_MAX_STEPS, DEFAULT_TIMEOUT, RunError, RunErrorKind, RunOptions};
pub mod names;
pub use names::{RESERVED_VARIABLES, user_defaults};
pub use program::{LoadError, MAX_STEPS, MAX_TEMPLATE_BYTES, MAX_TEMPLATES, Program, check_size};
pub use provider::{ScriptError, ScriptedProvider};
pub use request::build_request;
pub use store::{Snapshot, Store, Vars, value_from_json};
pub use template_check::{
    MAX_EXPRESSION_DEPTH, TemplateFault, check_depth, check_statements, check_template,
};

/// Re-exported so embedders and the compiler use the exact same template engine.
pub use minijinja;

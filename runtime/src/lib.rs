//! The aplc runtime: everything around the sans-IO [`aplc_vm`] core that touches the
//! world.
//!
//! * [`session`]: one run session, a machine with its clock, observer and journal
//!   recorder; every host drives runs through it.
//! * [`driver`]: the tokio driver that performs the I/O a session asks for, the
//!   [`driver::Provider`] and [`driver::Tool`] traits and the [`driver::Toolbox`].
//! * [`openai`]: the OpenAI-compatible HTTP provider; [`anthropic`]: the Anthropic
//!   Messages API provider; both send through one shared transport (retries, deadline,
//!   redaction). [`routing`]: providers chosen by model name, from a providers file.
//! * [`durable`]: durable runs, journaled in a [`store`] (SQLite or PostgreSQL), that
//!   resume after a crash without repeating a paid call.
//! * [`manifest`]: command and HTTP tools from a tool manifest.
//! * [`mcp`]: MCP servers of a manifest (`mcpServers`) and, with the `mcp` feature, their
//!   tools over stdio.
//! * [`equip`]: the one builder of a run's provider, tools and secrets from a host's
//!   flags, files and environment (the CLI, the server and Python all call it).
//! * [`files`]: the one bounded reader of whole input files.
//! * [`http`]: the one HTTP client constructor, shared by providers and HTTP tools.
//! * [`Redactor`]: scrubs secrets from every message that leaves a provider or a tool;
//!   [`Secrets`]: the one list of secrets (variables tools never see, values redacted).
//! * [`telemetry`]: OpenTelemetry spans and metrics of runs, from their events, exported
//!   over OTLP/HTTP.
//! * [`store`]: durable run stores, SQLite (embedded default) and PostgreSQL, behind two
//!   interfaces: [`store::RunJournal`] (what a durable run needs) and [`store::RunQueue`]
//!   (what only `aplc serve` needs), both in [`store::RunStore`].
//!
//! # Cargo features
//!
//! All on by default; an embedder that needs none of them sets `default-features = false`
//! and keeps the driver, the HTTP providers, routing, tools, the durable driver and the
//! store's trait, without bundled SQLite, tokio-postgres or the OpenTelemetry SDK.
//!
//! * `sqlite`: `sqlite:PATH` run stores (rusqlite, with SQLite compiled in).
//! * `postgres`: `postgres://` run stores (tokio-postgres).
//! * `otel`: the `telemetry` module, OpenTelemetry export over OTLP/HTTP.
//!
//! A store URL parses in every build; [`store::open`] of one whose backend is compiled
//! out is an error naming the feature (`this aplc was built without the `postgres`
//! feature`), so code that calls it compiles the same either way.
#![deny(missing_docs)]

pub mod anthropic;
pub mod driver;
pub mod durable;
pub mod equip;
pub mod files;
mod future;
pub mod http;
pub mod human;
pub mod link;
pub mod manifest;
pub mod mcp;
mod native;
pub mod openai;
mod process;
pub mod provider;
mod recorder;
mod redact;
pub mod routing;
pub mod secrets;
pub mod session;
pub mod store;
#[cfg(feature = "otel")]
pub mod telemetry;
pub mod tool;
mod transport;
pub mod watchdog;

/// The result a non-idempotent tool call in flight at a crash resolves to (a durable
/// resume's, and a Temporal worker's lost activity's).
pub use recorder::INTERRUPTED_TOOL;
pub use redact::{DeltaRedactor, Redactor, StreamRedactor};
pub use secrets::Secrets;

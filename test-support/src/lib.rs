//! What the workspace's tests share, as a dev-dependency (in place of path attributes that
//! included one crate's test files in another's):
//!
//! * [`pg`]: a throwaway PostgreSQL cluster (`initdb`/`pg_ctl`) per test binary.
//! * [`otlp`]: an OTLP/HTTP receiver that decodes what the exporter sent.
//! * [`http`]: the fake servers' side of HTTP/1.1.
//! * [`process`]: the `aplc` binary as a child process ([`aplc!`], [`scratch_in!`]).
//! * [`mcp`]: MCP servers (`spec/mcp.md`): what `.ci/run` installs, the Python fixtures
//!   over streamable HTTP, scripted tool calls and their results.
//!
//! Std only, beyond the OTLP message types and serde_json: blocking sockets and threads,
//! so a helper keeps answering while a test's runtime blocks.
#![deny(missing_docs)]

pub mod http;
pub mod mcp;
pub mod otlp;
pub mod pg;
pub mod process;

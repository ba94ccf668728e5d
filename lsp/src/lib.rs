//! The APL language server: `aplc lsp`.
//!
//! A synchronous server on `lsp-server`'s stdio connection. Every answer comes from the
//! compiler itself ([`aplc_compiler::compile_with_outline`]): diagnostics are the ones
//! `aplc check` prints, and hover, navigation, completion and symbols read the outline
//! the compiler built from the same syntax tree. Nothing here parses APL or Jinja.
//!
//! The modules, outside in:
//!
//! | module | what |
//! |---|---|
//! | `transport` | stdio frames, hardened: bad frames are skipped, huge ones never buffered |
//! | `server` | the message loop: documents, debounced diagnostics, request dispatch, panics caught per request |
//! | `document` | one open file: its text, edits, and its analysis |
//! | `position` | byte offsets ↔ LSP positions (UTF-16 code units) |
//! | `features` | one function per request kind |
//! | `docs` | one-line docs of the built-in variables, helpers and filters |
//!
//! Protocol types (`lsp-types`, `lsp-server`) stay in this crate.
#![deny(missing_docs)]

mod docs;
mod document;
mod features;
mod position;
mod server;
mod transport;

pub use server::{Config, serve};

/// Runs the server on stdin and stdout until the client says `exit` (or closes stdin).
pub fn run_stdio(config: Config) -> Result<(), String> {
    let (connection, writer) = transport::stdio();
    let served = serve(&connection, config);
    // Drop the connection first: the writer thread ends when its channel closes, after
    // writing every answer.
    drop(connection);
    match writer.join() {
        Ok(Ok(())) => served,
        Ok(Err(e)) => Err(format!("writing to stdout: {e}")),
        Err(_) => Err("the writer thread panicked".to_string()),
    }
}

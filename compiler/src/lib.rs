//! The APL compiler: `.apl` source in, a [`Bundle`] or diagnostics out.
//!
//! The pipeline is one stage per file, each with one entry function:
//!
//! | stage | file | entry |
//! |---|---|---|
//! | classify lines, resolve code fences | `lexer.rs` | `lex` |
//! | build the syntax tree | `parser.rs` | `parse` |
//! | check §1 rules and templates, build the IR | `lower.rs` | `lower` |
//! | lay out instructions, build the bundle | `codegen.rs` | `encode` |
//!
//! The compiler does no I/O: callers read files and write bundles. Every stage keeps
//! going after an error, so one run reports every problem in the file.
#![deny(missing_docs)]

mod analyze;
mod ast;
mod codegen;
pub mod diagnostic;
mod ir;
mod lexer;
mod lower;
mod parser;
mod relaxed;

pub use analyze::RESERVED_VARIABLES;
pub use aplc_vm::bundle::Bundle;
pub use diagnostic::{Code, Diagnostic, Label, LineIndex, Severity, Span, render};

/// The largest source the compiler accepts. Bundle spans are 32-bit, and the encoded
/// bundle must stay under the VM's payload limit even after relaxed-syntax rewriting.
pub const MAX_SOURCE_LEN: usize = 8 * 1024 * 1024;

/// How to compile.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Enable relaxed syntax in `pre` and `post` phases (§6.1.1).
    pub relaxed: bool,
}

/// The result of compiling one file.
#[derive(Debug)]
pub struct Compilation {
    /// The bundle, when there were no errors.
    pub bundle: Option<Bundle>,
    /// Every diagnostic, errors and warnings, in source order.
    pub diagnostics: Vec<Diagnostic>,
}

impl Compilation {
    /// True when any diagnostic is an error.
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }
}

/// Compiles `source`; `file_name` is recorded in the bundle for messages.
pub fn compile(source: &str, file_name: &str, options: &Options) -> Compilation {
    if source.len() > MAX_SOURCE_LEN {
        return Compilation {
            bundle: None,
            diagnostics: vec![Diagnostic::error(
                Code::SourceTooLarge,
                format!(
                    "the source is {} bytes; aplc compiles files of at most {MAX_SOURCE_LEN} bytes",
                    source.len()
                ),
                Span::new(0, 0),
            )],
        };
    }
    let (lines, mut diagnostics) = lexer::lex(source);
    let (file, parse_diags) = parser::parse(source, lines);
    diagnostics.extend(parse_diags);
    let ir = lower::lower(source, &file, options.relaxed, &mut diagnostics);
    diagnostics.sort_by_key(|d| (d.span().start, d.severity == Severity::Warning));
    let bundle = if diagnostics.iter().any(Diagnostic::is_error) {
        None
    } else {
        Some(codegen::encode(&ir, source, file_name))
    };
    Compilation {
        bundle,
        diagnostics,
    }
}

/// Compiles `source` and encodes the bundle to bytes.
pub fn build(
    source: &str,
    file_name: &str,
    options: &Options,
) -> (Option<Vec<u8>>, Vec<Diagnostic>) {
    let c = compile(source, file_name, options);
    (c.bundle.as_ref().map(codegen::to_bytes), c.diagnostics)
}

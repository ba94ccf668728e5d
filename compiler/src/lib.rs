//! The APL compiler: `.apl` source in, a [`Bundle`] or diagnostics out.
//!
//! The pipeline is one stage per file, each with one entry function:
//!
//! | stage | file | entry |
//! |---|---|---|
//! | classify lines, resolve code fences | `lexer.rs` | `lex` |
//! | build the syntax tree | `parser.rs` | `parse` |
//! | check §1 rules and templates, build the IR | `lower.rs` | `lower` |
//! | … then check the step graph | `graph.rs` | `check` |
//! | … and that every variable read is defined | `variables.rs` | `check` |
//! | … and that `human_input` is read after an `await_input` | `human.rs` | `check` |
//! | lay out instructions, build the bundle | `codegen.rs` | `encode` |
//!
//! `lower` runs the three file-level checks at its end, on the IR it built. `graph.rs`
//! also holds the public [`StepGraph`], built from a bundle for `aplc graph` and
//! `aplc inspect`. [`compile_with_outline`] also returns the [`Outline`] (`outline.rs`) an
//! editor needs, from the same syntax tree and IR.
//!
//! The compiler does no I/O: callers read files and write bundles. Every stage keeps
//! going after an error, so one run reports every problem in the file.
#![deny(missing_docs)]

mod agents;
mod analyze;
mod ast;
mod blocks;
mod codegen;
pub mod diagnostic;
pub mod graph;
mod heading;
mod human;
mod ir;
mod lexer;
mod link;
mod lower;
mod names;
pub mod outline;
mod parser;
mod phrases;
mod relaxed;
mod variables;

pub use agents::{AgentCall, AgentName, bundle_agent_calls};
pub use analyze::RESERVED_VARIABLES;
pub use aplc_vm::bundle::Bundle;
pub use diagnostic::{Code, Diagnostic, Label, LineIndex, Severity, Span, Suggestion, render};
pub use graph::StepGraph;
pub use link::{Child, ChildReport, Linked, Resolve, link, link_sources};
pub use outline::Outline;

/// The largest source the compiler accepts. Bundle spans are 32-bit, and the encoded
/// bundle must stay under the VM's payload limit even after relaxed-syntax rewriting.
pub const MAX_SOURCE_LEN: usize = 8 * 1024 * 1024;

/// How to compile.
///
/// `Options::default()` is what `aplc check` and `aplc build` use; [`Options::for_run`]
/// is what `aplc run` uses on source.
#[derive(Debug, Clone)]
pub struct Options {
    /// Enable relaxed syntax in `pre` and `post` phases (§6.1.1).
    pub relaxed: bool,
    /// Report a literal `next_step` target that names no step (APL0014) as an error
    /// (the default) rather than a warning. The spec makes it a run-time failure
    /// (§2.1), so `aplc run` compiles with `false` and the run fails when it reaches
    /// the jump.
    pub unknown_step_is_error: bool,
    /// Report every warning as an error (`--deny-warnings`): the file does not build.
    pub deny_warnings: bool,
    /// Variables the caller will inject with `with_context`, in addition to those the
    /// file declares with `{# inputs: … #}`; they are defined for APL0018.
    pub inputs: Vec<String>,
    /// The helpers beyond the spec's that templates may call (`spec/dialects.md`); the
    /// bundle records it, and a run loads the bundle in the same dialect.
    pub dialect: aplc_vm::Dialect,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            relaxed: false,
            unknown_step_is_error: true,
            deny_warnings: false,
            inputs: Vec::new(),
            dialect: aplc_vm::Dialect::Spec,
        }
    }
}

impl Options {
    /// The options for compiling source that is about to run: an unknown `next_step`
    /// target is a warning, and the run fails if it reaches the jump.
    pub fn for_run(relaxed: bool) -> Options {
        Options {
            relaxed,
            unknown_step_is_error: false,
            ..Options::default()
        }
    }
}

/// The result of compiling one file.
#[derive(Debug)]
pub struct Compilation {
    /// The bundle, when there were no errors.
    pub bundle: Option<Bundle>,
    /// Every diagnostic, errors and warnings, in source order.
    pub diagnostics: Vec<Diagnostic>,
    /// The agents the program names in `call_agent` writes, in template order (also
    /// when there are errors): what [`link`] resolves.
    pub agent_calls: Vec<AgentCall>,
}

impl Compilation {
    /// True when any diagnostic is an error.
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }
}

/// Compiles `source`; `file_name` is recorded in the bundle for messages.
pub fn compile(source: &str, file_name: &str, options: &Options) -> Compilation {
    compile_parts(source, file_name, options, false).0
}

/// Compiles `source` as [`compile`] does and also returns its [`Outline`]: the steps,
/// templates, names and step graph an editor shows, from the same syntax tree and IR.
/// A file too large to compile has an empty outline.
pub fn compile_with_outline(
    source: &str,
    file_name: &str,
    options: &Options,
) -> (Compilation, Outline) {
    let (compilation, outline) = compile_parts(source, file_name, options, true);
    (compilation, outline.unwrap_or_default())
}

/// [`compile`], with the outline when `outline` is true.
fn compile_parts(
    source: &str,
    file_name: &str,
    options: &Options,
    outline: bool,
) -> (Compilation, Option<Outline>) {
    if source.len() > MAX_SOURCE_LEN {
        let compilation = Compilation {
            bundle: None,
            diagnostics: vec![Diagnostic::error(
                Code::SourceTooLarge,
                format!(
                    "the source is {} bytes; aplc compiles files of at most {MAX_SOURCE_LEN} bytes",
                    source.len()
                ),
                Span::new(0, 0),
            )],
            agent_calls: Vec::new(),
        };
        return (compilation, None);
    }
    let (mut lines, mut diagnostics) = lexer::lex(source);
    if options.dialect == aplc_vm::Dialect::Defuss11 {
        lexer::titles_as_text(&mut lines);
    }
    let (file, parse_diags) = parser::parse(source, lines);
    diagnostics.extend(parse_diags);
    let ir = lower::lower(source, &file, options, &mut diagnostics);
    let outline = outline.then(|| outline::build(&file, &ir));
    drop_follow_on_errors(&mut diagnostics);
    // Every span must fall on character boundaries (spans from minijinja are snapped
    // where they are made; this keeps any other slip from reaching a renderer).
    for label in diagnostics.iter_mut().flat_map(|d| d.labels.iter_mut()) {
        label.span = label.span.snap(source);
    }
    keep_applicable_suggestions(&mut diagnostics, source);
    phrases::add(&mut diagnostics, source, options.dialect);
    let templates = ir.templates.iter().map(|t| t.source.as_str());
    if let Err(err) = aplc_vm::check_size(ir.steps.len(), templates) {
        // The VM would refuse to load the bundle (each template costs memory to load).
        diagnostics.push(
            Diagnostic::error(
                Code::SourceTooLarge,
                format!("the program is too large to load: {err}"),
                Span::new(0, 0),
            )
            .with_note("every phase and every role section of a prompt is a template"),
        );
    }
    if options.deny_warnings {
        deny_warnings(&mut diagnostics);
    }
    diagnostics.sort_by_key(|d| (d.span().start, d.severity == Severity::Warning));
    let bundle = if diagnostics.iter().any(Diagnostic::is_error) {
        None
    } else {
        let mut bundle = codegen::encode(&ir, source, file_name);
        bundle.dialect = options.dialect;
        Some(bundle)
    };
    let compilation = Compilation {
        bundle,
        diagnostics,
        agent_calls: ir.agent_calls,
    };
    (compilation, outline)
}

/// Drops a suggested edit that could not apply cleanly: out of the source, inside a
/// character, across lines, or one that changes nothing. The help text stays.
fn keep_applicable_suggestions(diagnostics: &mut [Diagnostic], source: &str) {
    for d in diagnostics {
        let applicable = d.suggestion.as_ref().is_some_and(|s| {
            source
                .get(s.span.range())
                .is_some_and(|old| !old.is_empty() && !old.contains('\n') && old != s.replacement)
        });
        if !applicable {
            d.suggestion = None;
        }
    }
}

/// A role heading before any phase (APL0020) already says that a phase heading is
/// missing above it: "no steps" (APL0008) and "text before the first step heading"
/// (APL0007) from that line on would repeat it.
fn drop_follow_on_errors(diagnostics: &mut Vec<Diagnostic>) {
    let Some(at) = diagnostics
        .iter()
        .find(|d| d.code == Code::RoleHeadingBeforePhase)
        .map(|d| d.span().start)
    else {
        return;
    };
    diagnostics.retain(|d| match d.code {
        Code::NoSteps => false,
        Code::TextBeforeFirstStep => d.span().start < at,
        _ => true,
    });
}

/// Turns every warning into an error, saying why.
fn deny_warnings(diagnostics: &mut [Diagnostic]) {
    for d in diagnostics
        .iter_mut()
        .filter(|d| d.severity == Severity::Warning)
    {
        d.severity = Severity::Error;
        d.notes
            .push("warnings are errors here because they are denied (`--deny-warnings`)".into());
    }
}

/// Compiles `source` and encodes the bundle to bytes.
pub fn build(
    source: &str,
    file_name: &str,
    options: &Options,
) -> (Option<Vec<u8>>, Vec<Diagnostic>) {
    let mut c = compile(source, file_name, options);
    let bytes = match c.bundle.as_ref().map(codegen::to_bytes) {
        Some(Ok(bytes)) => Some(bytes),
        Some(Err(err)) => {
            c.diagnostics.push(Diagnostic::error(
                Code::SourceTooLarge,
                format!("the program does not fit in a bundle: {err}"),
                Span::new(0, 0),
            ));
            None
        }
        None => None,
    };
    (bytes, c.diagnostics)
}

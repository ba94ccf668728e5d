//! `aplc check` and `aplc build`, the compile options of every command, and the JSON
//! printer for diagnostics.
//!
//! Diagnostics go to stderr as ariadne reports by default. With `--format json` they go
//! to **stdout** as JSON Lines, one object per diagnostic, so tools can read them
//! without separating them from other messages; stderr then only carries failures that
//! are not about the source (an unreadable file, an unwritable bundle).

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use aplc_compiler::{Diagnostic, LineIndex, Linked, Options};
use aplc_server::LinkOptions;
use clap::{Args, ValueEnum};
use serde_json::{Value as Json, json};

use crate::input::{display_name, print_linked, read_json, read_text, write_atomically};
use crate::{CompileArgs, Failure};

/// How `check` and `build` report diagnostics.
#[derive(Args, Debug, Clone)]
pub(crate) struct ReportArgs {
    /// How to print diagnostics: `human` (ariadne reports on stderr, coloured on a
    /// terminal unless NO_COLOR is set) or `json` (JSON Lines on stdout: one object per
    /// diagnostic with code, severity, message, file, line, column, labels, notes, help,
    /// suggestion).
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = DiagnosticFormat::Human)]
    pub format: DiagnosticFormat,
    /// Report every warning as an error: the file does not check or build (exit 2).
    #[arg(long)]
    pub deny_warnings: bool,
    /// A tool manifest (spec/tools.md) whose `{"agent": NAME}` entries are linked too,
    /// as `call_agent` literals are (spec/agents.md §2); its other entries are ignored.
    #[arg(long, value_name = "FILE")]
    pub tools: Option<std::path::PathBuf>,
}

/// The formats of `--format` for diagnostics.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DiagnosticFormat {
    /// ariadne reports on stderr.
    Human,
    /// JSON Lines on stdout.
    Json,
}

pub(crate) fn check(
    file: &Path,
    args: &CompileArgs,
    report: &ReportArgs,
) -> Result<ExitCode, Failure> {
    let source = read_text(file)?;
    let options = check_options(args, report.deny_warnings);
    let linked = compile_linked(file, &source, &options, args, manifest_agents(report)?);
    report_linked(&linked, file, &source, report.format);
    if let (Some(bundle), DiagnosticFormat::Human) = (&linked.bundle, report.format) {
        eprintln!("{}", summary(bundle, &linked.diagnostics));
    }
    Ok(if linked.has_errors() {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}

/// Compiles `source` (the file `file`) with `options` and links the agents it names,
/// and `extra_names`, from beside it and the `--agents` directories (spec/agents.md §2):
/// what every command that compiles source does.
pub(crate) fn compile_linked(
    file: &Path,
    source: &str,
    options: &Options,
    args: &CompileArgs,
    extra_names: Vec<String>,
) -> Linked {
    let link = LinkOptions {
        agent_dirs: args.agents.clone(),
        extra_names,
    };
    aplc_server::compile_and_link(source, file, &display_name(file), options, &link)
}

/// The agents named by `--tools`' manifest, if one is given.
fn manifest_agents(report: &ReportArgs) -> Result<Vec<String>, Failure> {
    match &report.tools {
        None => Ok(Vec::new()),
        Some(path) => Ok(aplc_runtime::link::manifest_agent_names(&read_json(path)?)),
    }
}

/// The line `check` prints on success, so that a valid file does not look like nothing
/// happened: `ok: 4 steps, 9 templates` (`, 1 warning` when there are warnings).
///
/// Human format only: with `--format json` stdout is JSON Lines for tools, and stderr
/// stays reserved for failures that are not about the source.
fn summary(bundle: &aplc_compiler::Bundle, diagnostics: &[Diagnostic]) -> String {
    let plural = |n: usize, one: &str| {
        if n == 1 {
            format!("1 {one}")
        } else {
            format!("{n} {one}s")
        }
    };
    let mut line = format!(
        "ok: {}, {}",
        plural(bundle.steps.len(), "step"),
        plural(bundle.templates.len(), "template")
    );
    // Errors mean no bundle, so every diagnostic left is a warning.
    if !diagnostics.is_empty() {
        line.push_str(&format!(", {}", plural(diagnostics.len(), "warning")));
    }
    if !bundle.agents.is_empty() {
        line.push_str(&format!(
            ", {} linked",
            plural(bundle.agents.len(), "agent")
        ));
    }
    line
}

pub(crate) fn build(
    file: &Path,
    output: &Path,
    args: &CompileArgs,
    report: &ReportArgs,
) -> Result<ExitCode, Failure> {
    if same_file(file, output) {
        return Err(Failure::usage(format!(
            "refusing to write the bundle over its source {}: choose another -o path",
            file.display()
        )));
    }
    let source = read_text(file)?;
    let options = check_options(args, report.deny_warnings);
    let linked = compile_linked(file, &source, &options, args, manifest_agents(report)?);
    report_linked(&linked, file, &source, report.format);
    let Some(bundle) = linked.bundle else {
        return Ok(ExitCode::from(2));
    };
    let bytes = aplc_vm::bundle::encode(&bundle).map_err(|err| Failure {
        code: 2,
        message: format!(
            "{}: the program does not fit in a bundle: {err}",
            file.display()
        ),
    })?;
    write_atomically(output, &bytes)
        .map_err(|e| Failure::run(format!("cannot write {}: {e}", output.display())))?;
    Ok(ExitCode::SUCCESS)
}

/// True when `a` and `b` name the same existing file: through a symlink, a hard link, or
/// different spellings of one path.
fn same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(a), Ok(b)) = (std::fs::metadata(a), std::fs::metadata(b)) {
            return a.dev() == b.dev() && a.ino() == b.ino();
        }
    }
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// The options for compiling source that is about to **run** (`aplc run`): an unknown
/// `next_step` target is a warning, so the run fails at the jump with exit 1, as the
/// spec says (§2.1).
pub(crate) fn compile_options(args: &CompileArgs) -> Options {
    Options {
        dialect: args.dialect,
        ..Options::for_run(args.relaxed)
    }
}

/// The options of `aplc check`, `aplc build` and `aplc graph`: an unknown `next_step`
/// target is an error.
pub(crate) fn check_options(args: &CompileArgs, deny_warnings: bool) -> Options {
    Options {
        relaxed: args.relaxed,
        deny_warnings,
        dialect: args.dialect,
        ..Options::default()
    }
}

fn report_linked(linked: &Linked, file: &Path, source: &str, format: DiagnosticFormat) {
    match format {
        DiagnosticFormat::Human => print_linked(linked, file, source),
        DiagnosticFormat::Json => {
            let mut lines = json_lines(&linked.diagnostics, &display_name(file), source);
            for child in &linked.children {
                lines.extend(json_lines(
                    &child.diagnostics,
                    &child.file_name,
                    &child.source,
                ));
            }
            let mut stdout = std::io::stdout().lock();
            for line in lines {
                // A closed stdout (`aplc check --format json … | head`) is not a failure
                // of the check.
                if writeln!(stdout, "{line}").is_err() {
                    return;
                }
            }
            let _ = stdout.flush();
        }
    }
}

/// One JSON object per diagnostic, each on one line.
///
/// Lines and columns are 1-based; columns count characters (Unicode scalar values);
/// `end_line`/`end_column` are where the span ends (exclusive); `start`/`end` are byte
/// offsets. The top-level position is the primary label's.
pub(crate) fn json_lines(diagnostics: &[Diagnostic], file: &str, source: &str) -> Vec<String> {
    let lines = LineIndex::new(source);
    let position = |offset: usize| lines.line_col(source, offset);
    diagnostics
        .iter()
        .map(|d| {
            let primary = d.span();
            let (line, column) = position(primary.start);
            let (end_line, end_column) = position(primary.end);
            let labels: Vec<Json> = d
                .labels
                .iter()
                .map(|l| {
                    let (line, column) = position(l.span.start);
                    let (end_line, end_column) = position(l.span.end);
                    json!({
                        "primary": l.primary,
                        "message": l.message,
                        "line": line,
                        "column": column,
                        "end_line": end_line,
                        "end_column": end_column,
                        "start": l.span.start,
                        "end": l.span.end,
                    })
                })
                .collect();
            json!({
                "code": d.code.as_str(),
                "severity": d.severity.to_string(),
                "message": d.message,
                "file": file,
                "line": line,
                "column": column,
                "end_line": end_line,
                "end_column": end_column,
                "labels": labels,
                "notes": d.notes,
                "help": d.help,
                "suggestion": d.suggestion.as_ref().map(|s| {
                    let (line, column) = position(s.span.start);
                    let (end_line, end_column) = position(s.span.end);
                    json!({
                        "replacement": s.replacement,
                        "line": line,
                        "column": column,
                        "end_line": end_line,
                        "end_column": end_column,
                        "start": s.span.start,
                        "end": s.span.end,
                    })
                }),
            })
            .to_string()
        })
        .collect()
}

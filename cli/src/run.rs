//! `aplc run`: load or compile an agent and run it with a provider.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use aplc_vm::driver::{self, Scripted};
use aplc_vm::{Program, RunErrorKind, RunOptions, RunOutcome, ScriptedProvider};
use clap::Args;

use crate::compile::compile_options;
use crate::input::{display_name, into_text, print_diagnostics, read_bytes, read_text};
use crate::{CompileArgs, Failure};

#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    /// The agent: .apl source or a bundle (recognised by its magic bytes).
    file: PathBuf,
    /// Print the final context as one JSON object instead of `result_text`.
    #[arg(long)]
    json: bool,
    /// Use the scripted provider with these responses (a JSON array, one entry per call).
    #[arg(long, value_name = "RESPONSES.json")]
    mock: Option<PathBuf>,
    /// A JSON object whose entries are injected as variables (`with_context`).
    #[arg(long, value_name = "CONTEXT.json")]
    context: Option<PathBuf>,
    /// Tool manifest: a JSON object from tool name to `{"command": [...]}` or `{"url": ...}`
    /// with its OpenAI function `descriptor` (see spec/tools.md).
    #[arg(long, value_name = "TOOLS.json")]
    tools: Option<PathBuf>,
    /// Cap on successful provider calls (`global_runs`) for the whole run.
    #[arg(long, value_name = "N")]
    max_runs: Option<u64>,
    /// Wall-clock timeout for the whole run, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 120_000)]
    timeout: u64,
    #[command(flatten)]
    compile: CompileArgs,
    /// API key for the HTTP provider (not yet available: use --mock).
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// Base URL for the HTTP provider (not yet available: use --mock).
    #[arg(long, value_name = "URL")]
    base_url: Option<String>,
}

pub(crate) fn run(args: RunArgs) -> Result<ExitCode, Failure> {
    let program = Arc::new(load_program(&args.file, &args.compile)?);

    let Some(mock) = &args.mock else {
        return Err(Failure::usage(
            "no provider: the HTTP provider is not available in this version of aplc; \
             pass --mock RESPONSES.json to run with the scripted provider",
        ));
    };
    let script = read_text(mock)?;
    let script = ScriptedProvider::from_json(&script)
        .map_err(|e| Failure::usage(format!("{}: {e}", mock.display())))?;
    if args.api_key.is_some() || args.base_url.is_some() {
        eprintln!("warning: --api-key and --base-url are not used with --mock");
    }
    let toolbox = match &args.tools {
        Some(path) => {
            let text = read_text(path)?;
            let base = path.parent().unwrap_or(Path::new("."));
            aplc_vm::manifest::toolbox_from_manifest(&text, base)
                .map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?
        }
        None => driver::Toolbox::new(),
    };

    let mut options = RunOptions {
        timeout: Duration::from_millis(args.timeout),
        max_runs: args.max_runs,
        ..RunOptions::default()
    };
    if let Some(path) = &args.context {
        let text = read_text(path)?;
        let value: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Failure::usage(format!("{}: invalid JSON: {e}", path.display())))?;
        let serde_json::Value::Object(object) = value else {
            return Err(Failure::usage(format!(
                "{}: expected a JSON object of variables",
                path.display()
            )));
        };
        options = options.with_context_json(&object);
    }

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::run(format!("cannot start the async runtime: {e}")))?;
    let provider = Scripted::new(script);
    let outcome = runtime.block_on(driver::run_with_tools(
        program.clone(),
        options,
        &provider,
        &toolbox,
    ));
    report(&program, &outcome, args.json)
}

/// Prints a run's output and picks the exit code.
fn report(program: &Program, outcome: &RunOutcome, json: bool) -> Result<ExitCode, Failure> {
    let mut stdout = std::io::stdout().lock();
    let printed = if json {
        let text = serde_json::to_string_pretty(&outcome.context_json()).unwrap_or_default();
        writeln!(stdout, "{text}")
    } else if outcome.error.is_none() {
        writeln!(stdout, "{}", outcome.result_text())
    } else {
        Ok(())
    };
    // A closed stdout (e.g. `aplc run … | head`) is not a run failure.
    let _ = printed.and_then(|_| stdout.flush());

    if let Some(error) = &outcome.error {
        let mut message = error.message.clone();
        if let Some(step) = &error.step {
            message.push_str(&format!("\n  in step `{step}`"));
            if let Some(span) = error.span {
                message.push_str(&format!(
                    " ({}:{}:{})",
                    program.bundle().source_name,
                    span.line,
                    span.col
                ));
            }
        }
        let code = if error.kind == RunErrorKind::InvalidOptions {
            2
        } else {
            1
        };
        return Err(Failure { code, message });
    }
    if !outcome.last_step_errors.is_empty() {
        eprintln!("the last step ended with errors:");
        for e in &outcome.last_step_errors {
            eprintln!("  - {e}");
        }
        return Ok(ExitCode::from(3));
    }
    Ok(ExitCode::SUCCESS)
}

/// Loads a bundle, or compiles source in memory.
fn load_program(file: &Path, args: &CompileArgs) -> Result<Program, Failure> {
    let bytes = read_bytes(file)?;
    if aplc_vm::bundle::is_bundle(&bytes) {
        if args.relaxed {
            eprintln!(
                "warning: --relaxed has no effect on a bundle: it was fixed when the bundle was built"
            );
        }
        return Program::load(&bytes)
            .map_err(|e| Failure::run(format!("{}: unreadable bundle: {e}", file.display())));
    }
    let source = into_text(file, bytes)?;
    let compilation = aplc_compiler::compile(&source, &display_name(file), &compile_options(args));
    print_diagnostics(&compilation.diagnostics, file, &source);
    let bundle = compilation.bundle.ok_or_else(|| Failure {
        code: 2,
        message: format!("{} has errors; not running it", file.display()),
    })?;
    Program::from_bundle(bundle, aplc_vm::Limits::default())
        .map_err(|e| Failure::run(format!("{}: {e}", file.display())))
}

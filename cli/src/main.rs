//! `aplc`: check, build and run APL agents.
//!
//! Exit codes: 0 the command succeeded (a run completed); 3 a run completed but its last
//! step ended with errors; 1 a run failed (unknown step, budget, timeout, unreadable
//! bundle) or a file could not be written; 2 usage or compile errors.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use aplc_compiler::{Diagnostic, Options, render};
use aplc_vm::driver::{self, Scripted};
use aplc_vm::{Program, RunErrorKind, RunOptions, RunOutcome, ScriptedProvider};
use clap::{Args, Parser, Subcommand};

/// The largest input file aplc reads.
const MAX_INPUT_LEN: u64 = 64 * 1024 * 1024;

#[derive(Parser, Debug)]
#[command(
    name = "aplc",
    version,
    about = "Compiler and runtime for APL, the Agentic Prompting Language (v1.2)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Check an .apl file and print its diagnostics (exit 0 when valid, 2 otherwise).
    Check {
        /// The .apl file.
        file: PathBuf,
        #[command(flatten)]
        compile: CompileArgs,
    },
    /// Compile an .apl file to a bundle.
    Build {
        /// The .apl file.
        file: PathBuf,
        /// Where to write the bundle.
        #[arg(short, long, value_name = "OUT")]
        output: PathBuf,
        #[command(flatten)]
        compile: CompileArgs,
    },
    /// Run an agent: an .apl file (compiled in memory) or a bundle.
    Run(RunArgs),
}

#[derive(Args, Debug, Clone)]
struct CompileArgs {
    /// Enable relaxed syntax in pre and post phases (spec §6.1.1).
    #[arg(long)]
    relaxed: bool,
}

#[derive(Args, Debug)]
struct RunArgs {
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
    /// Tool manifest. Accepted now; native tools arrive in a later release, and until then
    /// every tool call the model makes is recorded as failed.
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Check { file, compile } => check(&file, &compile),
        Command::Build {
            file,
            output,
            compile,
        } => build(&file, &output, &compile),
        Command::Run(args) => run(args),
    };
    match result {
        Ok(code) => code,
        Err(failure) => {
            eprintln!("error: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

/// A command that could not do its job: what to print and the exit code.
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn usage(message: impl Into<String>) -> Failure {
        Failure {
            code: 2,
            message: message.into(),
        }
    }

    fn run(message: impl Into<String>) -> Failure {
        Failure {
            code: 1,
            message: message.into(),
        }
    }
}

fn check(file: &Path, args: &CompileArgs) -> Result<ExitCode, Failure> {
    let source = read_source(file)?;
    let compilation = aplc_compiler::compile(&source, &display_name(file), &compile_options(args));
    print_diagnostics(&compilation.diagnostics, file, &source);
    Ok(if compilation.has_errors() {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}

fn build(file: &Path, output: &Path, args: &CompileArgs) -> Result<ExitCode, Failure> {
    let source = read_source(file)?;
    let (bytes, diagnostics) =
        aplc_compiler::build(&source, &display_name(file), &compile_options(args));
    print_diagnostics(&diagnostics, file, &source);
    let Some(bytes) = bytes else {
        return Ok(ExitCode::from(2));
    };
    std::fs::write(output, bytes)
        .map_err(|e| Failure::run(format!("cannot write {}: {e}", output.display())))?;
    Ok(ExitCode::SUCCESS)
}

fn run(args: RunArgs) -> Result<ExitCode, Failure> {
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
    if args.tools.is_some() {
        eprintln!(
            "warning: --tools: native tools are not available in this version of aplc; \
             every tool call will be recorded as failed"
        );
    }

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
        .enable_time()
        .build()
        .map_err(|e| Failure::run(format!("cannot start the async runtime: {e}")))?;
    let provider = Scripted::new(script);
    let outcome = runtime.block_on(driver::run(program.clone(), options, &provider));
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

fn compile_options(args: &CompileArgs) -> Options {
    Options {
        relaxed: args.relaxed,
    }
}

fn print_diagnostics(diagnostics: &[Diagnostic], file: &Path, source: &str) {
    if diagnostics.is_empty() {
        return;
    }
    let color = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    eprint!(
        "{}",
        render(diagnostics, &display_name(file), source, color)
    );
}

fn display_name(file: &Path) -> String {
    file.display().to_string()
}

fn read_bytes(file: &Path) -> Result<Vec<u8>, Failure> {
    let too_large = |len: u64| {
        Failure::usage(format!(
            "{}: the file is {len} bytes; aplc reads files of at most {MAX_INPUT_LEN} bytes",
            file.display()
        ))
    };
    let meta = std::fs::metadata(file)
        .map_err(|e| Failure::usage(format!("cannot read {}: {e}", file.display())))?;
    if meta.len() > MAX_INPUT_LEN {
        return Err(too_large(meta.len()));
    }
    let bytes = std::fs::read(file)
        .map_err(|e| Failure::usage(format!("cannot read {}: {e}", file.display())))?;
    if bytes.len() as u64 > MAX_INPUT_LEN {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

fn into_text(file: &Path, bytes: Vec<u8>) -> Result<String, Failure> {
    String::from_utf8(bytes).map_err(|e| {
        Failure::usage(format!(
            "{}: not valid UTF-8 (invalid byte at offset {})",
            file.display(),
            e.utf8_error().valid_up_to()
        ))
    })
}

fn read_text(file: &Path) -> Result<String, Failure> {
    into_text(file, read_bytes(file)?)
}

fn read_source(file: &Path) -> Result<String, Failure> {
    read_text(file)
}

//! `aplc`: check, build, run, test, graph and inspect APL agents, and start new ones.
//!
//! Exit codes: 0 the command succeeded (a run completed); 3 a run completed but its last
//! step ended with errors; 1 a run failed (unknown step, budget, timeout, unreadable
//! bundle) or a file could not be written; 2 usage or compile errors.
//!
//! One module per command: `compile.rs` (check, build), `run.rs` (with `record.rs` for
//! `--record`), `agent_test/` (test), `init.rs`, `graph.rs`, `inspect.rs`, `bench.rs`,
//! `trace.rs` (with `timeline.rs`, shared with `run --verbose`), `telemetry.rs` (`--otel`),
//! `serve.rs` and `mcp.rs` (over `aplc-server`); `input.rs` reads files and prints diagnostics for all of them. `aplc test` exits 0
//! when every case passed, 1 when one failed, 2 for an invalid test file.

mod agent_test;
mod agent_tree;
mod answer;
mod bench;
mod compile;
mod durable;
mod events;
mod graph;
mod init;
mod input;
mod inspect;
#[cfg(feature = "mcp")]
mod mcp;
mod progress;
mod record;
mod run;
mod run_command;
mod serve;
mod signals;
mod telemetry;
mod timeline;
mod trace;
mod worker;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use aplc_vm::text::escape_control;
use clap::{Args, CommandFactory, Parser, Subcommand};

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
    /// Check an .apl file and print its diagnostics, then a summary line when it is valid
    /// (exit 0 when valid, 2 otherwise).
    Check {
        /// The .apl file.
        file: PathBuf,
        #[command(flatten)]
        compile: CompileArgs,
        #[command(flatten)]
        report: compile::ReportArgs,
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
        #[command(flatten)]
        report: compile::ReportArgs,
    },
    /// Run an agent: an .apl file (compiled in memory) or a bundle.
    Run(run_command::RunArgs),
    /// Continue an unfinished durable run (`aplc run --store`) after a crash or a kill:
    /// takes the same provider and tool flags as `run`, prints like `run`.
    Resume(durable::ResumeArgs),
    /// List and inspect the runs in a store.
    #[command(subcommand)]
    Runs(durable::RunsCommand),
    /// Print the step graph of an .apl file or a bundle (DOT or Mermaid) on stdout.
    Graph(graph::GraphArgs),
    /// Print a readable timeline of a run from its events file (`run --events FILE`,
    /// `runs events`): steps, phases, provider and tool calls with durations, then
    /// totals. `-` reads stdin. Exit 2 for a line that is not an event.
    Trace(trace::TraceArgs),
    /// Print a readable listing of a bundle: header, steps, instructions, templates, graph.
    Inspect(inspect::InspectArgs),
    /// Measure the executor: run an agent N times in-process with scripted responses.
    Bench(bench::BenchArgs),
    /// Serve the agents of a directory over HTTP: queued durable runs in a store, live
    /// events, cancel, metrics (spec/serve.md). Stops on SIGTERM or Ctrl-C.
    Serve(serve::ServeArgs),
    /// Serve every agent of a directory as a tool of an MCP server (Model Context
    /// Protocol): over stdio, or streamable HTTP at `/mcp` with `--listen` (spec/mcp.md).
    /// Stops at the end of input (stdio), on SIGTERM or Ctrl-C.
    #[cfg(feature = "mcp")]
    Mcp(mcp::McpArgs),
    /// Run the agents of a directory as Temporal workflows (`apl.Run`): poll a task
    /// queue with `--temporal HOST:PORT` (spec/temporal.md). Stops on SIGTERM or Ctrl-C.
    Worker(worker::WorkerArgs),
    /// Run agent tests: every `*.test.toml` below the current directory, or the given files
    /// and directories (see spec/testing.md).
    Test(agent_test::TestArgs),
    /// Create a new agent project: a starter agent, its tests, a providers.json example
    /// and a README. Never overwrites a file.
    Init(init::InitArgs),
    /// Serve editors over the Language Server Protocol on stdin and stdout: the
    /// diagnostics of `aplc check` as you type, hover, go to definition, references,
    /// rename, completion, symbols (spec/lsp.md).
    Lsp {
        /// Accepted for clients that pass it; stdio is the only transport.
        #[arg(long)]
        stdio: bool,
    },
    /// Print a shell completion script on stdout, e.g. `aplc completions bash >
    /// ~/.local/share/bash-completion/completions/aplc`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// Options shared by every command that compiles.
#[derive(Args, Debug, Clone)]
pub(crate) struct CompileArgs {
    /// Enable relaxed syntax in pre and post phases (spec §6.1.1).
    #[arg(long)]
    pub relaxed: bool,
    /// Template helpers beyond the spec's: `defuss-1.1` adds defuss-apl 1.1.0's `set`,
    /// `get`, `add`, `inc`, `dec`, `rem`, `next`, `prev`, `result`, `set_json_path` and
    /// `current_step` (spec/dialects.md). A bundle records the dialect it was built in
    /// and runs in it.
    #[arg(long, value_name = "DIALECT", default_value = "spec", value_parser = parse_dialect)]
    pub dialect: aplc_vm::Dialect,
    /// Where else to find the agents the file calls by name (`call_agent`, a `--tools`
    /// manifest's `{"agent": …}`): after the file's own directory, each DIR in the order
    /// given; repeatable (spec/agents.md §2).
    #[arg(long = "agents", value_name = "DIR")]
    pub agents: Vec<PathBuf>,
}

/// A `--dialect` value.
fn parse_dialect(name: &str) -> Result<aplc_vm::Dialect, String> {
    aplc_vm::Dialect::from_name(name).ok_or_else(|| {
        let known: Vec<&str> = aplc_vm::Dialect::ALL.iter().map(|d| d.as_str()).collect();
        format!("unknown dialect `{name}`; known: {}", known.join(", "))
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Check {
            file,
            compile,
            report,
        } => compile::check(&file, &compile, &report),
        Command::Build {
            file,
            output,
            compile,
            report,
        } => compile::build(&file, &output, &compile, &report),
        Command::Run(args) => run_command::run(args),
        Command::Resume(args) => durable::resume(args),
        Command::Runs(command) => durable::runs(command),
        Command::Graph(args) => graph::graph(&args),
        Command::Inspect(args) => inspect::inspect(&args),
        Command::Trace(args) => trace::trace(&args),
        Command::Bench(args) => bench::bench(args),
        Command::Serve(args) => serve::serve(args),
        #[cfg(feature = "mcp")]
        Command::Mcp(args) => mcp::mcp(args),
        Command::Worker(args) => worker::worker(args),
        Command::Test(args) => agent_test::test(&args),
        Command::Init(args) => init::init(&args),
        Command::Lsp { stdio: _ } => lsp(),
        Command::Completions { shell } => {
            // Generated into memory first: clap_complete panics when its writer fails,
            // and a closed stdout (`aplc completions bash | head`) is not an error.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "aplc", &mut script);
            let mut stdout = std::io::stdout().lock();
            let _ = stdout.write_all(&script).and_then(|_| stdout.flush());
            Ok(ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        Err(failure) => {
            // Messages quote file names, step names and provider errors: escape them.
            eprintln!("error: {}", escape_control(&failure.message));
            ExitCode::from(failure.code)
        }
    }
}

/// `aplc lsp`. `APLC_LSP_TEST_PANIC=1` makes the server answer the `aplc/panic` request by
/// panicking, so a test can check that it answers the next request all the same.
fn lsp() -> Result<ExitCode, Failure> {
    let config = aplc_lsp::Config {
        panic_request: std::env::var_os("APLC_LSP_TEST_PANIC").is_some_and(|v| v == "1"),
    };
    aplc_lsp::run_stdio(config).map_err(|e| Failure::usage(format!("aplc lsp: {e}")))?;
    Ok(ExitCode::SUCCESS)
}

/// A command that could not do its job: what to print and the exit code.
pub(crate) struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    /// Exit 2: bad usage or input.
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure {
            code: 2,
            message: message.into(),
        }
    }

    /// Exit 1: the work itself failed.
    pub fn run(message: impl Into<String>) -> Failure {
        Failure {
            code: 1,
            message: message.into(),
        }
    }
}

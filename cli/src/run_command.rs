//! `aplc run`: its flags, and the command, which runs the agent in memory (`run.rs`) or,
//! with `--store`, journaled in a run store (`durable.rs`).
//!
//! Apart from both so that `aplc resume` (`durable.rs`) can share `run.rs`'s loading,
//! equipment and output without the two modules importing each other.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use aplc_vm::RunOptions;
use clap::Args;

use crate::durable::{self, StoreArgs};
use crate::run::{self, OutputArgs, WithArgs};
use crate::{CompileArgs, Failure};

#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    /// The agent: .apl source or a bundle (recognised by its magic bytes).
    file: PathBuf,
    /// A JSON object whose entries are injected as variables (`with_context`).
    #[arg(long, value_name = "CONTEXT.json")]
    context: Option<PathBuf>,
    /// Cap on successful provider calls (`global_runs`) for the whole run.
    #[arg(long, value_name = "N")]
    max_runs: Option<u64>,
    /// Cap on steps entered in the whole run: one more fails it with `Step budget
    /// exceeded` (a loop that retries on errors never reaches --max-runs).
    #[arg(long, value_name = "N", default_value_t = aplc_vm::DEFAULT_MAX_STEPS,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_steps: u64,
    /// Wall-clock timeout for the whole run, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 120_000)]
    timeout: u64,
    /// How deeply agents may call agents (the run is depth 0): a call past it fails like
    /// a failed child.
    #[arg(long, value_name = "N", default_value_t = aplc_vm::DEFAULT_MAX_AGENT_DEPTH)]
    max_agent_depth: u32,
    #[command(flatten)]
    compile: CompileArgs,
    #[command(flatten)]
    pub(crate) with: WithArgs,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    #[command(flatten)]
    pub(crate) ask: crate::answer::AskArgs,
}

pub(crate) fn run(args: RunArgs) -> Result<ExitCode, Failure> {
    let equipment = args
        .with
        .equip(args.output.record.is_some(), args.store.raw())?;
    let options = RunOptions {
        timeout: Duration::from_millis(args.timeout),
        max_runs: args.max_runs,
        max_steps: args.max_steps,
        max_agent_depth: args.max_agent_depth,
        ..RunOptions::default()
    };
    let options = run::context_options(options, args.context.as_deref())?;
    let program = Arc::new(run::load_program_with_tools(
        &args.file,
        &args.compile,
        &options,
        args.with.tools.as_deref(),
    )?);
    let has_agent_tools = equipment.toolbox.registry().has_agent_tools();
    let options = RunOptions {
        agents: run::agents_by_name(&program, &args.compile, has_agent_tools),
        ..options
    };
    // Only now is it certain that the run will call the HTTP provider: an unreadable or
    // invalid agent fails above without a warning about a key it never needed.
    run::warn_no_key(equipment.no_key);
    // Dropped last, on every way out: the drop flushes what is still batched.
    let exporting = args.output.telemetry.start()?;
    if args.store.url()?.is_some() {
        return durable::run(
            &args.store,
            &args.output,
            program,
            options,
            equipment,
            exporting.as_ref(),
            args.ask.answerer(),
        );
    }
    run::in_memory(
        &args.output,
        program,
        options,
        equipment,
        exporting.as_ref(),
        args.ask.answerer().as_ref(),
    )
}

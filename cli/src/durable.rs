//! Durable runs from the command line: `aplc run --store`, `aplc resume` and
//! `aplc runs list|show|events` (spec/durability.md).

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use aplc_runtime::durable::{self, DurableError, DurableOptions, Ended};
use aplc_runtime::store::{self, QueueStatus, RunStore, RunSummary, StoreError, StoreUrl};
use aplc_runtime::telemetry::RunTrace;
use aplc_runtime::{Redactor, Secrets};
use aplc_vm::text::escape_control;
use aplc_vm::{Program, RunOptions};
use clap::{Args, Subcommand};

use crate::Failure;
use crate::events::Sinks;
use crate::run::{Equipment, OutputArgs, WithArgs, report, runtime};

/// Where a run is journaled.
#[derive(Args, Debug)]
pub(crate) struct StoreArgs {
    /// Journal the run in this store, so `aplc resume` can finish it after a crash:
    /// `sqlite:PATH` or `postgres://USER@HOST/DB` (spec/durability.md).
    #[arg(long, value_name = "URL", env = "APLC_STORE", hide_env_values = true)]
    store: Option<String>,
    /// The run's id in the store (default: a new time-ordered id, printed on stderr).
    #[arg(long, value_name = "ID", requires = "store")]
    run_id: Option<String>,
    #[command(flatten)]
    journal: JournalArgs,
}

/// How a durable run journals: `aplc run --store`, `aplc resume`, `aplc bench --store`.
#[derive(Args, Debug)]
pub(crate) struct JournalArgs {
    /// Steps between checkpoints of the run's state: a resume replays at most this many
    /// steps.
    #[arg(long, value_name = "N", default_value_t = durable::DEFAULT_CHECKPOINT_EVERY,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) checkpoint_every: u64,
    /// Inputs a durable run may hold uncommitted while its store catches up: what a crash
    /// can make it ask its provider again (0: wait for every commit).
    #[arg(long, value_name = "N", default_value_t = durable::DEFAULT_MAX_UNCOMMITTED_INPUTS)]
    pub(crate) max_uncommitted: usize,
}

impl JournalArgs {
    /// The options of a durable run journaled this way, scrubbing secrets with `redactor`.
    pub(crate) fn options(&self, redactor: Redactor) -> DurableOptions {
        let mut options = DurableOptions::default();
        options.checkpoint_every = self.checkpoint_every;
        options.max_uncommitted_inputs = self.max_uncommitted;
        options.redactor = redactor;
        options
    }
}

impl StoreArgs {
    /// The store to journal in, if any.
    pub(crate) fn url(&self) -> Result<Option<StoreUrl>, Failure> {
        self.store.as_deref().map(parse_url).transpose()
    }

    /// The store URL as given, for its password (a secret).
    pub(crate) fn raw(&self) -> Option<&str> {
        self.store.as_deref()
    }
}

/// A store from the command line.
#[derive(Args, Debug)]
pub(crate) struct StoreFlag {
    /// The store: `sqlite:PATH` or `postgres://USER@HOST/DB`; defaults to $APLC_STORE.
    #[arg(long, value_name = "URL", env = "APLC_STORE", hide_env_values = true)]
    store: String,
}

/// `aplc resume`.
#[derive(Args, Debug)]
pub(crate) struct ResumeArgs {
    /// The run to continue.
    run_id: String,
    #[command(flatten)]
    store: StoreFlag,
    /// Refuse to resume unless the run started with this agent (.apl source or bundle).
    /// Without it, the run resumes on the bundle the store holds.
    #[arg(long, value_name = "AGENT")]
    agent: Option<PathBuf>,
    #[command(flatten)]
    compile: crate::CompileArgs,
    #[command(flatten)]
    with: WithArgs,
    #[command(flatten)]
    output: OutputArgs,
    /// How the run journals from here on.
    #[command(flatten)]
    journal: JournalArgs,
    #[command(flatten)]
    answers: crate::answer::AnswerArgs,
    #[command(flatten)]
    ask: crate::answer::AskArgs,
}

/// `aplc runs`.
#[derive(Subcommand, Debug)]
pub(crate) enum RunsCommand {
    /// List the runs in a store: id, agent, status, steps and start time, newest first.
    List {
        #[command(flatten)]
        store: StoreFlag,
    },
    /// Print a run's status and totals; with --json, its final (or current) context.
    Show {
        /// The run.
        run_id: String,
        #[command(flatten)]
        store: StoreFlag,
        /// Print the run's context as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Print a run's journaled events as JSON Lines.
    Events {
        /// The run.
        run_id: String,
        #[command(flatten)]
        store: StoreFlag,
    },
}

fn parse_url(url: &str) -> Result<StoreUrl, Failure> {
    StoreUrl::parse(url).map_err(|e| Failure::usage(e.to_string()))
}

/// A store failure, as the command line reports it: a missing run is the caller's
/// mistake (2); everything else is a failure to do the job (1).
fn store_failure(error: StoreError) -> Failure {
    match error {
        StoreError::Url(_) | StoreError::NotFound(_) => Failure::usage(error.to_string()),
        _ => Failure::run(error.to_string()),
    }
}

fn durable_failure(error: DurableError) -> Failure {
    match error {
        DurableError::Store(error) => store_failure(error),
        DurableError::Mismatch { .. } => Failure::usage(error.to_string()),
        DurableError::Journal { .. } => Failure::run(error.to_string()),
    }
}

async fn open(url: &StoreUrl) -> Result<Arc<dyn RunStore>, Failure> {
    store::open(url).await.map_err(store_failure)
}

/// Opens the store for `aplc runs`, which only reads: nothing is written to it.
async fn open_read_only(url: &StoreUrl) -> Result<Arc<dyn RunStore>, Failure> {
    store::open_read_only(url).await.map_err(store_failure)
}

/// `aplc run --store`: a journaled run.
pub(crate) fn run(
    store_args: &StoreArgs,
    output: &OutputArgs,
    program: Arc<Program>,
    options: RunOptions,
    mut equipment: Equipment,
    exporting: Option<&crate::telemetry::Exporting>,
    answerer: Arc<dyn aplc_runtime::human::Answerer>,
) -> Result<ExitCode, Failure> {
    let Some(url) = store_args.url()? else {
        return Err(Failure::usage("a journaled run needs --store"));
    };
    let id = match &store_args.run_id {
        Some(id) => check_id(id)?,
        None => durable::new_run_id(),
    };
    let config = (store_args.journal.options(equipment.secrets.redactor())).with_answerer(answerer);
    let runtime = runtime()?;
    crate::run::start_mcp(&runtime, &mut equipment.toolbox)?;
    let store = runtime.block_on(open(&url))?;
    if store_args.run_id.is_some() {
        // The run's row is created by its first commit, while its first provider call
        // is out: an id given that is taken is refused before that call is paid for.
        taken(&runtime, store.as_ref(), &id)?;
    }
    eprintln!("run id: {id}");
    let hint = format!("aplc resume {id} --store …");
    let trace = exporting.and_then(|e| {
        let agent = &program.bundle().source_name;
        e.run(equipment.secrets.redactor(), Some(id.clone()), agent)
    });
    let mut sinks = sinks(output, &equipment)?.with_trace(trace.clone());
    let calls = &RunTrace::provider_of(trace.as_ref(), &equipment.provider);
    let finished = {
        // Nobody listening: the run builds no event, and stores none (they are read back
        // by replay: `aplc runs events`).
        let listening = sinks.listening();
        let mut listener = |event: &aplc_vm::Event| sinks.on_event(event);
        let listener = listening.then_some(&mut listener as aplc_runtime::session::Listener<'_>);
        let run = durable::start(
            store.as_ref(),
            durable::NewDurableRun {
                id: id.clone(),
                program,
                options,
            },
            calls,
            &equipment.toolbox,
            listener,
            &config,
        );
        runtime.block_on(crate::signals::unless_interrupted(run))
    };
    // Only a run that did not finish is offered for resume, and only if its first commit
    // got in (not: a read-only store, an id taken, an interrupt before it). A finished
    // run needs no read of the store to know that.
    let finished_ok = matches!(finished, Ok(Ok(Ok(_))));
    let stored = !finished_ok
        && runtime
            .block_on(store.summary(&id))
            .is_ok_and(|summary| summary.state != store::RunState::Finished);
    finish(
        sinks,
        finished,
        output,
        &equipment,
        stored.then_some(hint.as_str()),
    )
}

/// Refuses the id of a run the store holds already.
fn taken(runtime: &tokio::runtime::Runtime, store: &dyn RunStore, id: &str) -> Result<(), Failure> {
    match runtime.block_on(store.summary(id)) {
        Err(StoreError::NotFound(_)) => Ok(()),
        Ok(_) => Err(store_failure(StoreError::Exists(id.to_owned()))),
        Err(error) => Err(store_failure(error)),
    }
}

/// `aplc resume`.
pub(crate) fn resume(args: ResumeArgs) -> Result<ExitCode, Failure> {
    let url = parse_url(&args.store.store)?;
    let id = check_id(&args.run_id)?;
    let mut equipment = args
        .with
        .equip(args.output.record.is_some(), Some(&args.store.store))?;
    let expected = match &args.agent {
        Some(file) => Some(crate::run::load_program(
            file,
            &args.compile,
            &RunOptions::default(),
        )?),
        None => None,
    };
    crate::run::warn_no_key(equipment.no_key);
    // Dropped last, on every way out: the drop flushes what is still batched.
    let exporting = args.output.telemetry.start()?;
    let config =
        (args.journal.options(equipment.secrets.redactor())).with_answerer(args.ask.answerer());
    let runtime = runtime()?;
    crate::run::start_mcp(&runtime, &mut equipment.toolbox)?;
    let store = runtime.block_on(open(&url))?;
    let reopened = runtime
        .block_on(durable::reopen(
            store.as_ref(),
            &id,
            expected.as_ref(),
            &equipment.toolbox,
            &config,
        ))
        .map_err(durable_failure)?;
    // The answers given are stored (all checked, or none stored) once the run's lease is
    // held and its agent and tools are checked: a resume refused for those stores none,
    // so the same command, corrected, is not refused as answered already. The run takes
    // them when it reaches its pause again.
    runtime.block_on(args.answers.store(store.as_ref(), &id, &args.ask))?;
    // A scripted provider goes on where the run left off.
    if let Some(scripted) = &equipment.scripted {
        scripted.skip(reopened.replayed_provider_calls());
    }
    let hint = format!("aplc resume {id} --store …");
    let trace = exporting.as_ref().and_then(|e| {
        let agent = &reopened.program().bundle().source_name;
        e.run(equipment.secrets.redactor(), Some(id.clone()), agent)
    });
    let mut sinks = sinks(&args.output, &equipment)?.with_trace(trace.clone());
    let calls = &RunTrace::provider_of(trace.as_ref(), &equipment.provider);
    let finished = {
        let listening = sinks.listening();
        let mut listener = |event: &aplc_vm::Event| sinks.on_event(event);
        let listener = listening.then_some(&mut listener as aplc_runtime::session::Listener<'_>);
        let run = reopened.run(calls, &equipment.toolbox, listener);
        runtime.block_on(crate::signals::unless_interrupted(run))
    };
    finish(sinks, finished, &args.output, &equipment, Some(&hint))
}

/// Run ids are printed and typed: printable, without spaces, at most 128 bytes.
fn check_id(id: &str) -> Result<String, Failure> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'));
    if ok {
        Ok(id.to_owned())
    } else {
        Err(Failure::usage(format!(
            "invalid run id `{}`: use 1 to 128 letters, digits, `-`, `_`, `.` or `:`",
            escape_control(id)
        )))
    }
}

/// The run's event sinks: `--events`, the progress line and `--verbose`.
fn sinks(output: &OutputArgs, equipment: &Equipment) -> Result<Sinks, Failure> {
    let progress = !output.quiet && !equipment.stream && std::io::stderr().is_terminal();
    Ok(Sinks::open(
        output.events.as_deref(),
        progress,
        output.verbose,
        equipment.secrets.redactor(),
    )?
    .streaming(equipment.stream))
}

/// Closes the sinks and prints like `aplc run`. A run stopped by a signal or a store
/// failure says how to continue it (`hint`), if it was stored.
fn finish(
    sinks: Sinks,
    finished: std::io::Result<Result<Result<Ended, DurableError>, crate::signals::Interrupted>>,
    output: &OutputArgs,
    equipment: &Equipment,
    hint: Option<&str>,
) -> Result<ExitCode, Failure> {
    let written = sinks.finish();
    let with_hint = |mut failure: Failure, journaled: &str| {
        if let Some(hint) = hint {
            failure.message.push_str(&format!(
                "\n  the run is journaled{journaled}: `{hint}` continues it"
            ));
        }
        failure
    };
    let finished = finished
        .map_err(|e| Failure::run(e.to_string()))?
        .map_err(|signal| with_hint(signal.failure(), ""))?
        .map_err(|e| with_hint(durable_failure(e), " up to its last commit"))?;
    written?;
    let finished = match finished {
        Ended::Finished(finished) => finished,
        Ended::Waiting(waiting) => return Ok(waiting_exit(&waiting)),
    };
    let result = report(
        &finished.program,
        &finished.outcome,
        output.json,
        equipment.stream,
    );
    match &output.record {
        Some(path) => equipment.provider.write_after(path, result),
        None => result,
    }
}

/// Says which requests a paused run waits on (`spec/human.md` §4.1): exit code 4.
fn waiting_exit(waiting: &durable::Waiting) -> ExitCode {
    let mut err = std::io::stderr().lock();
    for pending in &waiting.pending {
        let _ = writeln!(err, "{}", pending.waiting_line());
    }
    ExitCode::from(4)
}

/// `aplc runs …`.
pub(crate) fn runs(command: RunsCommand) -> Result<ExitCode, Failure> {
    let runtime = runtime()?;
    match command {
        RunsCommand::List { store } => {
            let store = runtime.block_on(open_read_only(&parse_url(&store.store)?))?;
            let runs = runtime.block_on(store.list()).map_err(store_failure)?;
            let mut out = std::io::stdout().lock();
            let _ = writeln!(
                out,
                "{:<24}  {:<24}  {:<10}  {:>7}  STARTED",
                "ID", "AGENT", "STATUS", "STEPS"
            );
            for run in &runs {
                let _ = writeln!(
                    out,
                    "{:<24}  {:<24}  {:<10}  {:>7}  {}",
                    run.id,
                    escape_control(&run.agent),
                    status(run),
                    run.steps,
                    timestamp(run.started_at_ms)
                );
            }
            let _ = out.flush();
            Ok(ExitCode::SUCCESS)
        }
        RunsCommand::Show {
            run_id,
            store,
            json,
        } => {
            let store = runtime.block_on(open_read_only(&parse_url(&store.store)?))?;
            let summary = runtime
                .block_on(store.summary(&run_id))
                .map_err(store_failure)?;
            let mut out = std::io::stdout().lock();
            if json {
                // Rebuilt from the checkpoints and the journal: the stored outcome keeps
                // the final variables but not `context_history`.
                let mut context = runtime
                    .block_on(durable::inspect(store.as_ref(), &run_id))
                    .map_err(durable_failure)?
                    .context_json();
                // A waiting run's requests (spec/human.md §4.1), beside its variables.
                if !summary.pending.is_empty()
                    && let serde_json::Value::Object(map) = &mut context
                {
                    map.insert("pending".into(), summary.pending.clone().into());
                }
                let _ = serde_json::to_writer_pretty(&mut out, &context);
                let _ = writeln!(out);
            } else {
                let (tree, events) = runtime.block_on(agent_tree(store.as_ref(), &run_id))?;
                let _ = write_summary(&mut out, &summary, events);
                let _ = tree.write(&mut out);
            }
            let _ = out.flush();
            Ok(ExitCode::SUCCESS)
        }
        RunsCommand::Events { run_id, store } => {
            let store = runtime.block_on(open_read_only(&parse_url(&store.store)?))?;
            // Missing runs are an error, not an empty listing.
            runtime
                .block_on(store.summary(&run_id))
                .map_err(store_failure)?;
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            let mut events = durable::EventReader::new(&run_id, 0, Secrets::from_env().redactor());
            const PAGE: u64 = 1_000;
            loop {
                let page = runtime
                    .block_on(events.page(store.as_ref(), PAGE))
                    .map_err(durable_failure)?;
                for event in &page {
                    if writeln!(out, "{event}").is_err() {
                        // A closed stdout (`| head`) ends the listing quietly.
                        return Ok(ExitCode::SUCCESS);
                    }
                }
                if (page.len() as u64) < PAGE {
                    break;
                }
            }
            let _ = out.flush();
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The agents run `id` called, from its events, a page at a time, and how many events
/// it made (stored or not: `durable::EventReader`).
async fn agent_tree(
    store: &dyn aplc_runtime::store::RunJournal,
    id: &str,
) -> Result<(crate::agent_tree::AgentTree, u64), Failure> {
    const PAGE: u64 = 1_000;
    let mut tree = crate::agent_tree::AgentTree::default();
    let mut events = durable::EventReader::new(id, 0, Secrets::from_env().redactor());
    loop {
        let page = events.page(store, PAGE).await.map_err(durable_failure)?;
        for event in &page {
            if let Ok(event) = serde_json::from_str::<serde_json::Value>(event) {
                tree.see(&event);
            }
        }
        if (page.len() as u64) < PAGE {
            return Ok((tree, events.next_seq()));
        }
    }
}

/// The run's status, in the service's words ([`QueueStatus`]).
fn status(run: &RunSummary) -> &'static str {
    QueueStatus::of_summary(run).as_str()
}

fn write_summary(out: &mut impl Write, run: &RunSummary, events: u64) -> std::io::Result<()> {
    writeln!(out, "run:      {}", run.id)?;
    writeln!(out, "agent:    {}", escape_control(&run.agent))?;
    writeln!(out, "bundle:   {}", run.bundle_hash)?;
    writeln!(out, "status:   {}", status(run))?;
    writeln!(out, "steps:    {}", run.steps)?;
    writeln!(out, "started:  {}", timestamp(run.started_at_ms))?;
    writeln!(out, "updated:  {}", timestamp(run.updated_at_ms))?;
    writeln!(out, "inputs:   {}", run.inputs)?;
    writeln!(out, "events:   {events}")?;
    for pending in run
        .pending
        .iter()
        .filter_map(aplc_runtime::human::Pending::from_json)
    {
        writeln!(out, "{}", pending.waiting_line())?;
        // What `aplc resume` answers: where it asks, what would run, since when.
        let request = &pending.request;
        let mut detail = format!("  step `{}`", escape_control(&request.step));
        if let Some(tool) = &request.tool {
            let arguments = request.arguments.as_ref().map(|a| a.to_string());
            detail.push_str(&format!(
                ", tool `{}` {}",
                escape_control(tool),
                escape_control(arguments.as_deref().unwrap_or("{}"))
            ));
        }
        if let Some(schema) = &request.schema {
            detail.push_str(&format!(", schema {}", escape_control(&schema.to_string())));
        }
        let requested = aplc_runtime::human::rfc3339(pending.requested_at_ms);
        writeln!(out, "{detail}, requested {requested}")?;
    }
    if let Some(outcome) = &run.outcome {
        if let Some(error) = outcome.get("error").filter(|e| !e.is_null()) {
            let message = error.get("message").and_then(|m| m.as_str()).unwrap_or("");
            writeln!(out, "error:    {}", escape_control(message))?;
        }
        if let Some(errors) = outcome.get("last_step_errors").and_then(|e| e.as_array())
            && !errors.is_empty()
        {
            writeln!(out, "last step errors:")?;
            for e in errors {
                writeln!(out, "  - {}", escape_control(e.as_str().unwrap_or("")))?;
            }
        }
    }
    Ok(())
}

/// Milliseconds since the epoch as RFC 3339 UTC, to the second.
fn timestamp(ms: i64) -> String {
    let time = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_seconds(time).to_string()
}

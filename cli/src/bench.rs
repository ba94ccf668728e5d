//! `aplc bench`: measure the executor on an agent with the scripted provider.
//!
//! The program is loaded once and run N times in-process; every run starts again from the
//! first scripted response. Process start-up, file reading and compiling are outside the
//! measured region. With `--concurrency`, runs go through the tokio driver against a
//! scripted provider that sleeps `--latency-ms` per call, to show how close the executor
//! comes to the bound set by model latency alone.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use aplc_runtime::driver::{self, BoxFuture, CallContext, Provider, Scripted};
use aplc_runtime::store::{StoreUrl, TimedJournal};
use aplc_runtime::telemetry::RunDetails;
use aplc_vm::text::escape_control;
use aplc_vm::{
    Completion, Program, ProviderError, ProviderRequest, RunOptions, ScriptedProvider,
    run_scripted, run_scripted_with_listener,
};
use clap::Args;

use crate::input::{display_name, read_json};
use crate::run::load_program;
use crate::{CompileArgs, Failure};

#[derive(Args, Debug)]
pub(crate) struct BenchArgs {
    /// The agent: .apl source or a bundle.
    file: PathBuf,
    /// Scripted responses (a JSON array, one entry per provider call of one run).
    #[arg(long, value_name = "RESPONSES.json")]
    mock: PathBuf,
    /// A JSON object of variables injected before the first step.
    #[arg(long, value_name = "CONTEXT.json")]
    context: Option<PathBuf>,
    /// Cap on steps entered per run (`max_steps`); the bench agents loop 500 to 20,000
    /// times, so raise it for the long ones.
    #[arg(long, value_name = "N", default_value_t = aplc_vm::DEFAULT_MAX_STEPS,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_steps: u64,
    /// Measured runs.
    #[arg(short = 'n', long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    runs: u64,
    /// Unmeasured runs first, to warm caches.
    #[arg(long, default_value_t = 10)]
    warmup: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Record every run's events and write them to this file as JSON Lines, to measure
    /// what a listener costs (sequential mode only).
    #[arg(long, value_name = "FILE", conflicts_with = "concurrency")]
    events: Option<PathBuf>,
    /// Runs in flight at once on the tokio driver (enables the latency mode).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    concurrency: Option<u64>,
    /// Simulated model latency per provider call, in milliseconds (with --concurrency).
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// Also run every measured run durably, journaled in this store (`sqlite:PATH` or
    /// `postgres://…`; use a fresh one), and report the cost of durability against the
    /// same runs in memory: per step, per commit, and bytes stored per step.
    #[arg(long, value_name = "URL", conflicts_with = "events")]
    store: Option<String>,
    /// How durable runs journal (with --store).
    #[command(flatten)]
    journal: crate::durable::JournalArgs,
    /// Export every run's spans and metrics over OTLP/HTTP to an in-process sink on
    /// 127.0.0.1 (it reads each request and answers 200), to measure what `--otel` costs.
    #[arg(long, conflicts_with_all = ["events", "store"])]
    otel: bool,
    #[command(flatten)]
    compile: CompileArgs,
}

pub(crate) fn bench(args: BenchArgs) -> Result<ExitCode, Failure> {
    let options = RunOptions {
        max_steps: args.max_steps,
        ..RunOptions::default()
    };
    let options = crate::run::context_options(options, args.context.as_deref())?;
    let program = Arc::new(load_program(&args.file, &args.compile, &options)?);
    crate::run::check_options(&program, &options)?;
    let script = ScriptedProvider::from_json(&read_json(&args.mock)?)
        .map_err(|e| Failure::usage(format!("{}: {e}", args.mock.display())))?;
    if let Some(url) = &args.store {
        let url = StoreUrl::parse(url).map_err(|e| Failure::usage(e.to_string()))?;
        return durability(&args, &url, program, script, options);
    }
    match args.concurrency {
        None => sequential(&args, program, script, options),
        Some(c) => concurrent(&args, c, program, script, options),
    }
}

fn sequential(
    args: &BenchArgs,
    program: Arc<Program>,
    script: ScriptedProvider,
    options: RunOptions,
) -> Result<ExitCode, Failure> {
    let mut events = match &args.events {
        Some(path) => Some(std::io::BufWriter::new(
            std::fs::File::create(path)
                .map_err(|e| Failure::usage(format!("cannot create {}: {e}", path.display())))?,
        )),
        None => None,
    };
    let sink = args.otel.then(otlp_sink::Sink::start).transpose()?;
    let telemetry = sink.as_ref().map(otlp_sink::Sink::telemetry).transpose()?;
    let mut times = Vec::with_capacity(args.runs as usize);
    let mut steps = 0;
    let mut failures = 0u64;
    let total = Instant::now();
    for i in 0..args.warmup + args.runs {
        let mut script = script.clone();
        script.rewind();
        let options = options.clone();
        let start = Instant::now();
        let outcome = match (&mut events, &telemetry) {
            (None, None) => run_scripted(program.clone(), options, &mut script, || start.elapsed()),
            (None, Some(telemetry)) => {
                let trace = telemetry.run(RunDetails::default());
                run_scripted_with_listener(
                    program.clone(),
                    options,
                    &mut script,
                    || start.elapsed(),
                    &mut |event| trace.on_event(event),
                )
            }
            (Some(out), _) => run_scripted_with_listener(
                program.clone(),
                options,
                &mut script,
                || start.elapsed(),
                &mut |event| {
                    let _ = serde_json::to_writer(&mut *out, event).map(|()| out.write_all(b"\n"));
                },
            ),
        };
        let elapsed = start.elapsed();
        if i == args.warmup {
            // Measure the wall time of the measured runs only.
            times.clear();
        }
        if i >= args.warmup {
            times.push(elapsed);
            steps = outcome.steps;
            failures += u64::from(outcome.error.is_some());
        }
    }
    let wall = total.elapsed();
    let exported = otlp_sink::finish(telemetry, sink.as_ref())?;
    if let (Some(mut out), Some(path)) = (events, &args.events) {
        out.flush()
            .map_err(|e| Failure::run(format!("cannot write {}: {e}", path.display())))?;
    }
    times.sort();
    let per_step = |d: Duration| d.as_secs_f64() * 1e6 / steps.max(1) as f64;
    let median = times[times.len() / 2];
    let min = times[0];
    let measured: Duration = times.iter().sum();
    let runs_per_sec = times.len() as f64 / measured.as_secs_f64().max(f64::MIN_POSITIVE);
    let report = serde_json::json!({
        "mode": "sequential",
        "file": display_name(&args.file),
        "runs": times.len(),
        "warmup": args.warmup,
        "steps_per_run": steps,
        "failed_runs": failures,
        "median_run_us": micros(median),
        "min_run_us": micros(min),
        "median_step_us": per_step(median),
        "min_step_us": per_step(min),
        "runs_per_sec": runs_per_sec,
        "wall_ms": wall.as_secs_f64() * 1e3,
        "otel": exported,
    });
    if args.json {
        println!("{report}");
    } else {
        println!(
            "{} ({} measured runs after {} warm-up)",
            escape_control(&display_name(&args.file)),
            times.len(),
            args.warmup
        );
        println!("  steps per run   {steps}");
        println!(
            "  per run         median {:>10.1} µs   min {:>10.1} µs",
            micros(median),
            micros(min)
        );
        println!(
            "  per step        median {:>10.2} µs   min {:>10.2} µs",
            per_step(median),
            per_step(min)
        );
        println!("  throughput      {runs_per_sec:.0} runs/s");
        print_exported(&exported);
        if failures > 0 {
            println!("  note: {failures} measured runs ended with a run error");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Counts provider calls, to compute the latency bound.
struct Counting<'a> {
    inner: &'a Scripted,
    calls: &'a AtomicU64,
}

impl Provider for Counting<'_> {
    fn complete<'a>(
        &'a self,
        request: &'a ProviderRequest,
        call: &'a CallContext,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.complete(request, call)
    }
}

fn concurrent(
    args: &BenchArgs,
    concurrency: u64,
    program: Arc<Program>,
    script: ScriptedProvider,
    options: RunOptions,
) -> Result<ExitCode, Failure> {
    let runtime = multi_thread_runtime(concurrency)?;
    let sink = args.otel.then(otlp_sink::Sink::start).transpose()?;
    let telemetry = sink
        .as_ref()
        .map(otlp_sink::Sink::telemetry)
        .transpose()?
        .map(Arc::new);
    let latency = Duration::from_millis(args.latency_ms);
    let calls = Arc::new(AtomicU64::new(0));
    let steps = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let memory_before = memory::reset_peak();
    let total_runs = args.runs;
    let start = Instant::now();
    runtime.block_on(async {
        let next = Arc::new(AtomicU64::new(0));
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..concurrency.min(total_runs) {
            let (program, script, options) = (program.clone(), script.clone(), options.clone());
            let (next, calls, steps, failures) =
                (next.clone(), calls.clone(), steps.clone(), failures.clone());
            let telemetry = telemetry.clone();
            workers.spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < total_runs {
                    let mut script = script.clone();
                    script.rewind();
                    let provider = Scripted::new(script).with_latency(latency);
                    let counting = Counting {
                        inner: &provider,
                        calls: &calls,
                    };
                    let outcome = match &telemetry {
                        None => driver::run(program.clone(), options.clone(), &counting).await,
                        Some(telemetry) => {
                            let trace = telemetry.run(RunDetails::default());
                            let traced = trace.provider(&counting);
                            let mut listener = |event: &aplc_vm::Event| trace.on_event(event);
                            let (program, options) = (program.clone(), options.clone());
                            let tools = driver::Toolbox::new();
                            driver::run_with_listener(
                                program,
                                options,
                                &traced,
                                &tools,
                                &mut listener,
                            )
                            .await
                        }
                    };
                    steps.fetch_add(outcome.steps, Ordering::Relaxed);
                    failures.fetch_add(u64::from(outcome.error.is_some()), Ordering::Relaxed);
                }
            });
        }
        while workers.join_next().await.is_some() {}
    });
    let wall = start.elapsed();
    let telemetry = telemetry.and_then(Arc::into_inner);
    let exported = otlp_sink::finish(telemetry, sink.as_ref())?;
    let peak = memory::peak()
        .zip(memory_before)
        .map(|(peak, before)| peak.saturating_sub(before));

    let calls = calls.load(Ordering::Relaxed);
    let calls_per_run = calls as f64 / total_runs as f64;
    let throughput = total_runs as f64 / wall.as_secs_f64();
    // With zero executor overhead, C runs in flight each need calls × latency.
    let bound = (latency.as_secs_f64() * calls_per_run > 0.0)
        .then(|| concurrency.min(total_runs) as f64 / (latency.as_secs_f64() * calls_per_run));
    let report = serde_json::json!({
        "mode": "concurrent",
        "file": display_name(&args.file),
        "runs": total_runs,
        "concurrency": concurrency,
        "latency_ms": args.latency_ms,
        "steps_per_run": steps.load(Ordering::Relaxed) as f64 / total_runs as f64,
        "provider_calls_per_run": calls_per_run,
        "failed_runs": failures.load(Ordering::Relaxed),
        "wall_ms": wall.as_secs_f64() * 1e3,
        "runs_per_sec": throughput,
        "latency_bound_runs_per_sec": bound,
        "fraction_of_bound": bound.map(|b| throughput / b),
        "peak_memory_bytes": peak,
        "peak_memory_per_run_bytes": peak.map(|p| p / concurrency.min(total_runs)),
        "otel": exported,
    });
    if args.json {
        println!("{report}");
    } else {
        println!(
            "{} ({total_runs} runs, {concurrency} at once, {} ms per provider call)",
            escape_control(&display_name(&args.file)),
            args.latency_ms
        );
        println!("  wall time       {:.1} ms", wall.as_secs_f64() * 1e3);
        println!("  throughput      {throughput:.1} runs/s");
        match bound {
            Some(b) => println!(
                "  latency bound   {b:.1} runs/s  ({:.1}% of it)",
                100.0 * throughput / b
            ),
            None => println!("  latency bound   none (zero latency)"),
        }
        match peak {
            Some(p) => println!(
                "  peak memory     {:.1} KiB above start, {:.1} KiB per run in flight",
                p as f64 / 1024.0,
                p as f64 / 1024.0 / concurrency.min(total_runs) as f64
            ),
            None => println!("  peak memory     unavailable on this platform"),
        }
        print_exported(&exported);
    }
    Ok(ExitCode::SUCCESS)
}

/// A store's commits and run creations, counted and timed (through a
/// [`TimedJournal`](aplc_runtime::store::TimedJournal)).
#[derive(Debug, Default)]
struct Timings {
    commits: AtomicU64,
    nanos: AtomicU64,
    /// Time spent creating runs (their rows and leases).
    create_nanos: AtomicU64,
}

impl Timings {
    fn reset(&self) {
        for counter in [&self.commits, &self.nanos, &self.create_nanos] {
            counter.store(0, Ordering::Relaxed);
        }
    }
}

fn nanos(took: Duration) -> u64 {
    u64::try_from(took.as_nanos()).unwrap_or(u64::MAX)
}

impl aplc_runtime::store::JournalTimings for Timings {
    fn created(&self, took: Duration) {
        self.create_nanos.fetch_add(nanos(took), Ordering::Relaxed);
    }
    fn appended(&self, took: Duration) {
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.nanos.fetch_add(nanos(took), Ordering::Relaxed);
    }
}

/// One measured phase of the durability bench: every run in memory, or every run
/// journaled.
#[derive(Default)]
struct Phase {
    wall: Duration,
    steps: u64,
    failures: u64,
}

/// `aplc bench --store`: the same runs in memory, then journaled, on the tokio driver
/// (sequentially, or `--concurrency` at once with `--latency-ms` per call).
fn durability(
    args: &BenchArgs,
    url: &StoreUrl,
    program: Arc<Program>,
    script: ScriptedProvider,
    options: RunOptions,
) -> Result<ExitCode, Failure> {
    let runtime = multi_thread_runtime(args.concurrency.unwrap_or(1).min(args.runs))?;
    let store = runtime
        .block_on(aplc_runtime::store::open(url))
        .map_err(|e| Failure::run(e.to_string()))?;
    let timings = Arc::new(Timings::default());
    let concurrency = args.concurrency.unwrap_or(1).min(args.runs);
    let latency = Duration::from_millis(args.latency_ms);
    let config = args.journal.options(Default::default());
    let prefix = aplc_runtime::durable::new_run_id();
    let ids: Arc<Vec<String>> = Arc::new(
        (0..args.warmup + args.runs)
            .map(|i| format!("bench-{prefix}-{i}"))
            .collect(),
    );

    let phase = |durable: bool, first: u64, count: u64| -> Result<Phase, Failure> {
        let start = Instant::now();
        let results = runtime.block_on(async {
            let next = Arc::new(AtomicU64::new(first));
            let end = first + count;
            let mut workers = tokio::task::JoinSet::new();
            for _ in 0..concurrency.max(1) {
                let (program, script, options) = (program.clone(), script.clone(), options.clone());
                let (next, store, timings, ids, config) = (
                    next.clone(),
                    store.clone(),
                    timings.clone(),
                    ids.clone(),
                    config.clone(),
                );
                workers.spawn(async move {
                    let mut phase = Phase::default();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= end {
                            return Ok::<_, String>(phase);
                        }
                        let mut script = script.clone();
                        script.rewind();
                        let provider = Scripted::new(script).with_latency(latency);
                        let outcome = if durable {
                            aplc_runtime::durable::start(
                                &TimedJournal::new(store.as_ref(), timings.as_ref()),
                                aplc_runtime::durable::NewDurableRun {
                                    id: ids[i as usize].clone(),
                                    program: program.clone(),
                                    options: options.clone(),
                                },
                                &provider,
                                &driver::Toolbox::new(),
                                None,
                                &config,
                            )
                            .await
                            .map_err(|e| e.to_string())?
                            .finished()
                            .ok_or("a benchmarked run paused for input")?
                            .outcome
                        } else {
                            driver::run(program.clone(), options.clone(), &provider).await
                        };
                        phase.steps += outcome.steps;
                        phase.failures += u64::from(outcome.error.is_some());
                    }
                });
            }
            let mut total = Phase::default();
            while let Some(joined) = workers.join_next().await {
                let phase = joined.map_err(|e| e.to_string())??;
                total.steps += phase.steps;
                total.failures += phase.failures;
            }
            Ok::<_, String>(total)
        });
        let mut phase = results.map_err(Failure::run)?;
        phase.wall = start.elapsed();
        Ok(phase)
    };
    // Warm-up: both paths, unmeasured.
    phase(false, 0, args.warmup)?;
    phase(true, 0, args.warmup)?;
    let memory = phase(false, args.warmup, args.runs)?;
    timings.reset();
    let durable = phase(true, args.warmup, args.runs)?;
    let commits = timings.commits.load(Ordering::Relaxed);
    let commit_us = timings.nanos.load(Ordering::Relaxed) as f64 / 1e3 / commits.max(1) as f64;
    let create_us = timings.create_nanos.load(Ordering::Relaxed) as f64 / 1e3 / args.runs as f64;
    let bytes: u64 = runtime.block_on(async {
        let mut bytes = 0;
        for id in &ids[args.warmup as usize..] {
            bytes += store.run_bytes(id).await.unwrap_or(0);
        }
        bytes
    });
    // What a resume of the last run costs: load, restore the newest checkpoint, replay
    // the journal after it (`inspect` does all of that, without taking the run over).
    let last = &ids[ids.len() - 1];
    let resume_start = Instant::now();
    runtime
        .block_on(aplc_runtime::durable::inspect(store.as_ref(), last))
        .map_err(|e| Failure::run(e.to_string()))?;
    let resume_ms = resume_start.elapsed().as_secs_f64() * 1e3;

    let runs = args.runs as f64;
    let steps = durable.steps.max(1) as f64;
    let step_us =
        |p: &Phase| p.wall.as_secs_f64() * 1e6 * concurrency as f64 / p.steps.max(1) as f64;
    let report = serde_json::json!({
        "mode": "durability",
        "file": display_name(&args.file),
        "runs": args.runs,
        "concurrency": concurrency,
        "latency_ms": args.latency_ms,
        "checkpoint_every": args.journal.checkpoint_every,
        "max_uncommitted": args.journal.max_uncommitted,
        "steps_per_run": durable.steps as f64 / runs,
        "failed_runs": durable.failures + memory.failures,
        "memory_runs_per_sec": runs / memory.wall.as_secs_f64(),
        "durable_runs_per_sec": runs / durable.wall.as_secs_f64(),
        "throughput_kept": memory.wall.as_secs_f64() / durable.wall.as_secs_f64(),
        "memory_step_us": step_us(&memory),
        "durable_step_us": step_us(&durable),
        "durability_step_us": step_us(&durable) - step_us(&memory),
        "commits_per_run": commits as f64 / runs,
        "commit_us": commit_us,
        "create_us": create_us,
        "bytes_per_step": bytes as f64 / steps,
        "resume_ms": resume_ms,
    });
    if args.json {
        println!("{report}");
    } else {
        println!(
            "{} ({} runs, {concurrency} at once, {} ms per provider call, checkpoint every {} steps)",
            escape_control(&display_name(&args.file)),
            args.runs,
            args.latency_ms,
            args.journal.checkpoint_every
        );
        println!("  steps per run     {:.0}", durable.steps as f64 / runs);
        println!(
            "  in memory         {:>10.1} runs/s   {:>8.2} µs/step",
            runs / memory.wall.as_secs_f64(),
            step_us(&memory)
        );
        println!(
            "  durable           {:>10.1} runs/s   {:>8.2} µs/step  ({:.1}% of in-memory throughput)",
            runs / durable.wall.as_secs_f64(),
            step_us(&durable),
            100.0 * memory.wall.as_secs_f64() / durable.wall.as_secs_f64()
        );
        println!(
            "  durability cost   {:>8.2} µs/step   {:.1} commits/run at {:.1} µs each",
            step_us(&durable) - step_us(&memory),
            commits as f64 / runs,
            commit_us
        );
        println!("  run creation      {create_us:.1} µs each (its row and its lease)");
        println!("  stored            {:.0} bytes/step", bytes as f64 / steps);
        println!("  resume            {resume_ms:.1} ms (load, restore, replay: the last run)");
        if durable.failures + memory.failures > 0 {
            println!(
                "  note: {} measured runs ended with a run error",
                durable.failures + memory.failures
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The runtime of the concurrent benches: a worker per run in flight, up to every core,
/// as a service would run. Runs one at a time get one worker, as `aplc run` does (its
/// runtime has one thread): with more, a durable run's task would hop between idle
/// workers whenever the store's writer thread wakes it with a commit.
fn multi_thread_runtime(in_flight: u64) -> Result<tokio::runtime::Runtime, Failure> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = usize::try_from(in_flight)
        .unwrap_or(usize::MAX)
        .clamp(1, cores);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .map_err(|e| Failure::run(format!("cannot start the async runtime: {e}")))
}

/// The `--otel` line: what the sink received and how long the final flush took.
fn print_exported(exported: &serde_json::Value) {
    if exported.is_null() {
        return;
    }
    println!(
        "  otel            {} export requests, {:.1} KiB, final flush {:.1} ms",
        exported["requests"],
        exported["bytes"].as_f64().unwrap_or(0.0) / 1024.0,
        exported["flush_ms"].as_f64().unwrap_or(0.0)
    );
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Resident memory from `/proc` (Linux). Elsewhere the numbers are unavailable.
mod memory {
    /// Resets the peak-RSS counter and returns the current RSS in bytes.
    pub fn reset_peak() -> Option<u64> {
        // "5" resets VmHWM to the current RSS (Linux 4.0+). Failure only loses accuracy.
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        field("VmRSS:")
    }

    /// The peak RSS in bytes since the last reset.
    pub fn peak() -> Option<u64> {
        field("VmHWM:")
    }

    fn field(name: &str) -> Option<u64> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kib * 1024)
    }
}

/// `--otel`: an OTLP/HTTP sink on 127.0.0.1 that reads every export request and answers
/// 200, so the bench measures encoding and sending without a collector.
mod otlp_sink {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use aplc_runtime::telemetry::{Telemetry, TelemetryConfig, TelemetryFlags};

    use crate::Failure;

    pub(super) struct Sink {
        port: u16,
        requests: Arc<AtomicU64>,
        bytes: Arc<AtomicU64>,
    }

    impl Sink {
        pub(super) fn start() -> Result<Sink, Failure> {
            let listener = TcpListener::bind("127.0.0.1:0")
                .map_err(|e| Failure::run(format!("cannot start the OTLP sink: {e}")))?;
            let port = listener
                .local_addr()
                .map_err(|e| Failure::run(format!("cannot start the OTLP sink: {e}")))?
                .port();
            let requests = Arc::new(AtomicU64::new(0));
            let bytes = Arc::new(AtomicU64::new(0));
            let (r, b) = (requests.clone(), bytes.clone());
            std::thread::spawn(move || {
                for stream in listener.incoming().flatten() {
                    let (r, b) = (r.clone(), b.clone());
                    std::thread::spawn(move || serve(stream, &r, &b));
                }
            });
            Ok(Sink {
                port,
                requests,
                bytes,
            })
        }

        /// A pipeline exporting to the sink.
        pub(super) fn telemetry(&self) -> Result<Telemetry, Failure> {
            let endpoint = format!("http://127.0.0.1:{}", self.port);
            let env =
                |name: &str| (name == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| endpoint.clone());
            let config = TelemetryConfig::resolve(&env, TelemetryFlags::default())
                .map_err(|e| Failure::run(e.to_string()))?
                .config
                .ok_or_else(|| Failure::run("the OTLP sink's configuration is off"))?;
            Telemetry::start(&config, &|_| None).map_err(|e| Failure::run(e.to_string()))
        }
    }

    /// Flushes `telemetry` and reports what `sink` received (`null` without `--otel`).
    pub(super) fn finish(
        telemetry: Option<Telemetry>,
        sink: Option<&Sink>,
    ) -> Result<serde_json::Value, Failure> {
        let (Some(telemetry), Some(sink)) = (telemetry, sink) else {
            return Ok(serde_json::Value::Null);
        };
        let start = Instant::now();
        telemetry
            .shutdown(Duration::from_secs(60))
            .map_err(|e| Failure::run(e.to_string()))?;
        Ok(serde_json::json!({
            "requests": sink.requests.load(Ordering::Relaxed),
            "bytes": sink.bytes.load(Ordering::Relaxed),
            "flush_ms": start.elapsed().as_secs_f64() * 1e3,
        }))
    }

    /// Reads requests with `Content-Length` bodies (what the exporter sends) and answers
    /// each with an empty 200.
    fn serve(stream: TcpStream, requests: &AtomicU64, bytes: &AtomicU64) {
        let Ok(mut writer) = stream.try_clone() else {
            return;
        };
        let mut reader = BufReader::new(stream);
        loop {
            let mut length = 0u64;
            let mut line = String::new();
            loop {
                line.clear();
                match reader.read_line(&mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                let header = line.trim_end();
                if header.is_empty() {
                    break;
                }
                if let Some((name, value)) = header.split_once(':')
                    && name.eq_ignore_ascii_case("content-length")
                {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
            let copied = std::io::copy(&mut (&mut reader).take(length), &mut std::io::sink());
            if copied.ok() != Some(length) {
                return;
            }
            requests.fetch_add(1, Ordering::Relaxed);
            bytes.fetch_add(length, Ordering::Relaxed);
            if writer
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                .is_err()
            {
                return;
            }
        }
    }
}

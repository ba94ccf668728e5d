//! `aplc worker --temporal`: the agents of a directory as Temporal workflows, from the
//! command line (spec/temporal.md).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use aplc_runtime::store::StoreUrl;
use aplc_server::temporal::{WorkerConfig, run_worker};
use aplc_server::{LogFormat, ServeError};
use clap::Args;

use crate::Failure;

#[derive(Args, Debug)]
pub(crate) struct WorkerArgs {
    /// The Temporal frontend to poll, `HOST:PORT` (a dev server: `127.0.0.1:7233`).
    #[arg(long, value_name = "HOST:PORT")]
    temporal: String,
    /// The Temporal namespace.
    #[arg(long, value_name = "NS", default_value = "default")]
    namespace: String,
    /// The task queue to poll: start `apl.Run` workflows on it.
    #[arg(long, value_name = "QUEUE")]
    task_queue: String,
    /// The directory of agents: every `.apl` (compiled at load) and `.aplb` in it, by
    /// file name without the extension (as `aplc serve --agents`).
    #[arg(long, value_name = "DIR")]
    agents: PathBuf,
    /// Route models to providers with this JSON file (spec/providers.md); without it,
    /// the OpenAI API with $OPENAI_API_KEY.
    #[arg(long, value_name = "PROVIDERS.json")]
    providers: Option<PathBuf>,
    /// The tools runs may call (spec/tools.md).
    #[arg(long, value_name = "TOOLS.json")]
    tools: Option<PathBuf>,
    /// Workflow tasks, and activities, this worker runs at once (each).
    #[arg(long, value_name = "N", default_value_t = aplc_server::DEFAULT_MAX_CONCURRENT_RUNS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..10_000))]
    max_concurrent_runs: usize,
    /// On SIGTERM, how long in-flight activities may go on before they are cancelled
    /// (Temporal retries them elsewhere), in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = aplc_server::DEFAULT_DRAIN_TIMEOUT.as_millis() as u64)]
    drain_timeout_ms: u64,
    /// Where long runs keep the checkpoints they continue-as-new from: `sqlite:PATH`
    /// (one worker, or workers of one machine) or `postgres://USER@HOST/DB` (any
    /// workers of the task queue; all must use the same).
    #[arg(long, value_name = "URL", default_value = aplc_server::temporal::DEFAULT_STORE)]
    store: String,
    /// Connect with TLS (implied by the other `--tls-*` flags and by an API key), as
    /// Temporal Cloud asks.
    #[arg(long)]
    tls: bool,
    /// The CA certificate (PEM) that signs the server's; without it, the system's roots.
    #[arg(long, value_name = "CA.pem")]
    tls_ca: Option<PathBuf>,
    /// This worker's certificate (PEM), for mutual TLS; with `--tls-key`.
    #[arg(long, value_name = "CERT.pem")]
    tls_cert: Option<PathBuf>,
    /// This worker's private key (PEM), for mutual TLS; with `--tls-cert`.
    #[arg(long, value_name = "KEY.pem")]
    tls_key: Option<PathBuf>,
    /// The name the server's certificate must carry, if not the address's host.
    #[arg(long, value_name = "NAME")]
    tls_domain: Option<String>,
    /// The environment variable holding a Temporal API key (Temporal Cloud), e.g.
    /// `TEMPORAL_API_KEY`: the key itself is never a flag, and never printed.
    #[arg(long, value_name = "VAR")]
    api_key_env: Option<String>,
    /// OpenTelemetry export of every provider and tool call's span (`--otel`,
    /// `--otel-content`, or the OTLP endpoint variables); a call's span nests under the
    /// trace context (`_tracer-data`) its workflow was started with.
    #[command(flatten)]
    telemetry: crate::telemetry::TelemetryArgs,
}

pub(crate) fn worker(args: WorkerArgs) -> Result<ExitCode, Failure> {
    aplc_server::init_logging(LogFormat::Text);
    let mut config = WorkerConfig::new(args.temporal, args.task_queue, args.agents);
    config.namespace = args.namespace;
    config.providers = args.providers;
    config.tools = args.tools;
    config.max_concurrent_runs = args.max_concurrent_runs;
    config.drain_timeout = Duration::from_millis(args.drain_timeout_ms);
    config.tls.enabled = args.tls;
    config.tls.ca = args.tls_ca;
    config.tls.cert = args.tls_cert;
    config.tls.key = args.tls_key;
    config.tls.domain = args.tls_domain;
    config.api_key_env = args.api_key_env;
    config.store = Some(StoreUrl::parse(&args.store).map_err(|e| Failure::usage(e.to_string()))?);
    config.telemetry = args.telemetry.pipeline()?.map(std::sync::Arc::new);
    let telemetry = config.telemetry.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::run(format!("cannot start the async runtime: {e}")))?;
    let ran = runtime.block_on(run_worker(config, || {
        // One line on stdout for scripts and tests: the worker polls.
        println!("worker polling");
    }));
    // The calls are over (or cancelled, to run elsewhere): their last spans go out now.
    if let Some(telemetry) = &telemetry {
        crate::telemetry::shut_down(telemetry);
    }
    runtime.shutdown_timeout(crate::serve::SHUTDOWN_GRACE);
    match ran {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(ServeError::Config(message)) => Err(Failure::usage(message)),
        Err(ServeError::Mcp(e)) if e.is_manifest_error() => Err(Failure::usage(e.to_string())),
        Err(e) => Err(Failure::run(e.to_string())),
    }
}

//! `aplc serve`: the HTTP service of `aplc-server`, from the command line (spec/serve.md).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use aplc_runtime::store::StoreUrl;
use aplc_server::{LogFormat, ServeConfig, ServeError, Tokens, parse_tokens};
use clap::{Args, ValueEnum};

use crate::Failure;

#[derive(Args, Debug)]
pub(crate) struct ServeArgs {
    /// The directory of agents: every `.apl` (compiled at load) and `.aplb` in it, served
    /// by file name without the extension, reloaded when a file changes.
    #[arg(long, value_name = "DIR")]
    agents: PathBuf,
    /// The run store: `sqlite:PATH` (one process) or `postgres://USER@HOST/DB` (any
    /// number of processes sharing the work).
    #[arg(long, value_name = "URL", default_value = "sqlite:aplc-runs.db")]
    store: String,
    /// The address to listen on (port 0: any free port, printed at start).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Bearer tokens, one per line (blank lines and `#` comments ignored). Adds to
    /// $APLC_SERVE_TOKENS (comma-separated).
    #[arg(long, value_name = "FILE")]
    tokens: Option<PathBuf>,
    /// Runs this process executes at once; the rest wait in the queue.
    #[arg(long, value_name = "N", default_value_t = aplc_server::DEFAULT_MAX_CONCURRENT_RUNS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..10_000))]
    max_concurrent_runs: usize,
    /// Route models to providers with this JSON file (spec/providers.md); without it,
    /// the OpenAI API with $OPENAI_API_KEY.
    #[arg(long, value_name = "PROVIDERS.json")]
    providers: Option<PathBuf>,
    /// The tools runs may call (spec/tools.md); a request cannot add any.
    #[arg(long, value_name = "TOOLS.json")]
    tools: Option<PathBuf>,
    /// The log's format on stderr (`RUST_LOG` filters it; default `info`).
    #[arg(long, value_enum, default_value_t = LogFormatArg::Text)]
    log_format: LogFormatArg,
    /// The largest request body accepted, in bytes (larger: 413).
    #[arg(long, value_name = "BYTES", default_value_t = aplc_server::DEFAULT_MAX_BODY_BYTES)]
    max_body_bytes: usize,
    /// How long `?wait=true` waits for a run before answering 202, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = aplc_server::DEFAULT_WAIT_LIMIT.as_millis() as u64)]
    wait_timeout_ms: u64,
    /// How often an idle worker looks in the store for runs it was not told about
    /// (queued by another process, or left by a dead one), in milliseconds; a
    /// `?wait=true` request looks for the end of a run another process executes twice as
    /// often. Runs queued and ended in this process are seen at once.
    #[arg(long, value_name = "MS", default_value_t = aplc_server::DEFAULT_STORE_POLL.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(2..))]
    store_poll_ms: u64,
    /// On SIGTERM, how long running runs may go on before they are stopped (they resume
    /// from their journal at the next start), in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = aplc_server::DEFAULT_DRAIN_TIMEOUT.as_millis() as u64)]
    drain_timeout_ms: u64,
    /// How long a client may take to send a request head (from the accept, or from the
    /// head's first byte on a kept-alive connection) before the connection is closed, in
    /// milliseconds.
    #[arg(long, value_name = "MS", default_value_t = aplc_server::DEFAULT_HEADER_TIMEOUT.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    header_timeout_ms: u64,
    /// How long a client may take to send a request body (larger: 408), in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = aplc_server::DEFAULT_BODY_TIMEOUT.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    body_timeout_ms: u64,
    /// How long a kept-alive connection may wait for its next request, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = aplc_server::DEFAULT_IDLE_TIMEOUT.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    idle_timeout_ms: u64,
    /// The most connections open at once (default: three quarters of the open-file
    /// limit, which is raised to its hard limit at start; 16 to 10,000). Over it, the
    /// oldest connection not serving a request is closed for the new one.
    #[arg(long, value_name = "N",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    max_connections: Option<usize>,
    /// OpenTelemetry export of every run's spans (`--otel`, `--otel-content`, or the
    /// OTLP endpoint variables); a run joins the trace of its request's `traceparent`.
    #[command(flatten)]
    telemetry: crate::telemetry::TelemetryArgs,
    /// Serve the playground at /playground from this directory: the built page
    /// (`playground/dist`, `node playground/build.mjs`), read at each request (spec/js.md).
    #[arg(long, value_name = "DIR")]
    playground: Option<PathBuf>,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum LogFormatArg {
    Text,
    Json,
}

pub(crate) fn serve(args: ServeArgs) -> Result<ExitCode, Failure> {
    aplc_server::init_logging(match args.log_format {
        LogFormatArg::Text => LogFormat::Text,
        LogFormatArg::Json => LogFormat::Json,
    });
    let store = StoreUrl::parse(&args.store).map_err(|e| Failure::usage(e.to_string()))?;
    let tokens = tokens(args.tokens.as_deref())?;
    let mut config = ServeConfig::new(args.agents, store, args.listen, tokens);
    config.max_concurrent_runs = args.max_concurrent_runs;
    config.providers = args.providers;
    config.tools = args.tools;
    config.max_body_bytes = args.max_body_bytes;
    config.wait_limit = Duration::from_millis(args.wait_timeout_ms);
    config.store_poll = Duration::from_millis(args.store_poll_ms);
    config.drain_timeout = Duration::from_millis(args.drain_timeout_ms);
    config.header_timeout = Duration::from_millis(args.header_timeout_ms);
    config.body_timeout = Duration::from_millis(args.body_timeout_ms);
    config.idle_timeout = Duration::from_millis(args.idle_timeout_ms);
    config.max_connections = args.max_connections;
    config.playground = args.playground.clone();
    config.telemetry = args.telemetry.pipeline()?.map(std::sync::Arc::new);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::run(format!("cannot start the async runtime: {e}")))?;
    let telemetry = config.telemetry.clone();
    let served = runtime.block_on(aplc_server::serve(config, |address| {
        // One line on stdout for scripts and tests: the address actually bound.
        println!("listening on http://{address}");
    }));
    // The runs are over (or stopped, to resume later): their last spans go out now.
    if let Some(telemetry) = &telemetry {
        crate::telemetry::shut_down(telemetry);
    }
    // Not a plain drop, which waits for every blocking task: a reload still reading or
    // compiling an agent file must not hold the exit after SIGTERM.
    runtime.shutdown_timeout(SHUTDOWN_GRACE);
    match served {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(ServeError::Config(message)) => Err(Failure::usage(message)),
        // As `aplc run`: a manifest's mistake is exit 2, a server that failed exit 1.
        Err(ServeError::Mcp(e)) if e.is_manifest_error() => Err(Failure::usage(e.to_string())),
        Err(e) => Err(Failure::run(e.to_string())),
    }
}

/// How long the exit waits for blocking tasks (file reads, a compile) after the server
/// stopped.
pub(crate) const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// The tokens of `--tokens FILE` and `APLC_SERVE_TOKENS` (`aplc mcp --listen` reads
/// them here too).
pub(crate) fn tokens(file: Option<&std::path::Path>) -> Result<Tokens, Failure> {
    let mut tokens = Tokens::default();
    if let Some(path) = file {
        let text = crate::input::read_text(path)?;
        tokens.extend(
            parse_tokens(&text, '\n')
                .map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?,
        );
    }
    if let Ok(text) = std::env::var("APLC_SERVE_TOKENS") {
        tokens.extend(
            parse_tokens(&text, ',')
                .map_err(|e| Failure::usage(format!("APLC_SERVE_TOKENS: {e}")))?,
        );
    }
    Ok(tokens)
}

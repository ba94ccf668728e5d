//! `aplc serve`: hosts agent bundles over HTTP, with durable runs queued in a run store
//! (spec/serve.md).
//!
//! A request stores a run as *queued* ([`RunQueue::enqueue`](store::RunQueue::enqueue)); workers in the process
//! claim queued runs ([`RunQueue::claim`](store::RunQueue::claim), at most `max_concurrent_runs` at once) and
//! drive them with the durable driver, so a restart, or another process on the same
//! PostgreSQL store, resumes an unfinished run from its journal. The HTTP side never runs
//! anything itself: it reads and writes the store, and listens to the runs this process
//! executes for live events.
//!
//! With the `mcp` feature (on by default), [`serve_mcp`] serves the same agents as the
//! tools of a Model Context Protocol server (`aplc mcp`, spec/mcp.md), on the same
//! agent loading, equipment and durable runs.
//!
//! Not here: provider keys and tools come from the server's own files and environment
//! ([`equip`]), never from a request.

#![deny(missing_docs)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use aplc_runtime::store::{self, RunStore, StoreUrl};

mod agents;
mod api;
mod auth;
mod connections;
mod equip;
mod error;
mod events;
mod extract;
mod input;
mod link;
mod live;
mod logging;
#[cfg(feature = "mcp")]
mod mcp;
mod metrics;
mod playground;
mod state;
pub mod temporal;
mod work;
mod worker;

pub use auth::{TokenError, Tokens, parse_tokens};
pub use link::{LinkOptions, compile_and_link, render_linked};
pub use logging::{LogFormat, init_logging};
#[cfg(feature = "mcp")]
pub use mcp::{McpConfig, serve_mcp};

/// How a server is set up: `aplc serve`'s flags.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServeConfig {
    /// The directory of agents (`.apl` and `.aplb` files).
    pub agents: PathBuf,
    /// The run store.
    pub store: StoreUrl,
    /// Where to listen.
    pub listen: SocketAddr,
    /// The bearer tokens clients must present.
    pub tokens: Tokens,
    /// Runs this process executes at once; the rest wait in the queue.
    pub max_concurrent_runs: usize,
    /// The providers file (spec/providers.md); without it, the OpenAI API with
    /// `OPENAI_API_KEY`.
    pub providers: Option<PathBuf>,
    /// The tool manifest (spec/tools.md).
    pub tools: Option<PathBuf>,
    /// The largest request body accepted; a larger one gets 413.
    pub max_body_bytes: usize,
    /// How long `?wait=true` waits for a run to end before answering 202.
    pub wait_limit: Duration,
    /// How often this process looks in the store for what it was not told about: an idle
    /// worker for runs queued by another process or left by a dead one, and a
    /// `?wait=true` request (twice as often) for the end of a run another process
    /// executes. Runs queued and ended here are seen at once, without it.
    pub store_poll: Duration,
    /// How long a shutdown waits for running runs before it stops them.
    pub drain_timeout: Duration,
    /// How often the agents directory is checked for changes.
    pub reload_interval: Duration,
    /// How long a client may take to send a request head, from the connection's accept
    /// or from the head's first byte; past it, the connection is closed.
    pub header_timeout: Duration,
    /// How long a client may take to send a request body; past it, 408.
    pub body_timeout: Duration,
    /// How long a keep-alive connection may wait for its next request.
    pub idle_timeout: Duration,
    /// The most connections open at once; `None`: from the open-file limit
    /// (three quarters of it, 16 to 10,000). Over the cap, the oldest connection that is
    /// not serving a request is closed for the new one.
    pub max_connections: Option<usize>,
    /// The OpenTelemetry pipeline, when export is on (spec/telemetry.md): each run's
    /// spans join the trace of the `traceparent` its request carried. The caller shuts
    /// it down (flushes) after [`serve`] returns.
    pub telemetry: Option<Arc<aplc_runtime::telemetry::Telemetry>>,
    /// The built playground (`playground/dist`) to serve at `/playground`
    /// (`--playground DIR`, spec/js.md); `None`: no playground.
    pub playground: Option<PathBuf>,
}

impl ServeConfig {
    /// A configuration with the defaults of `aplc serve`.
    pub fn new(agents: PathBuf, store: StoreUrl, listen: SocketAddr, tokens: Tokens) -> Self {
        ServeConfig {
            agents,
            store,
            listen,
            tokens,
            max_concurrent_runs: DEFAULT_MAX_CONCURRENT_RUNS,
            providers: None,
            tools: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            wait_limit: DEFAULT_WAIT_LIMIT,
            store_poll: DEFAULT_STORE_POLL,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            reload_interval: DEFAULT_RELOAD_INTERVAL,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: None,
            telemetry: None,
            playground: None,
        }
    }
}

/// The default of `--max-concurrent-runs`.
pub const DEFAULT_MAX_CONCURRENT_RUNS: usize = 16;
/// The default of `--max-body-bytes`: 1 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1 << 20;
/// The default of `--wait-timeout-ms`.
pub const DEFAULT_WAIT_LIMIT: Duration = Duration::from_secs(60);
/// The default of `--store-poll-ms`.
pub const DEFAULT_STORE_POLL: Duration = Duration::from_millis(500);
/// The default of `--drain-timeout-ms`.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the agents directory is polled.
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_millis(500);
/// The default of `--header-timeout-ms`: a client program sends its request head in one
/// write; 10 s leaves room for a slow link and frees a stalled connection soon.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// The default of `--body-timeout-ms`: a body of the default 1 MiB limit at 35 KB/s.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// The default of `--idle-timeout-ms`: below the idle timeouts of common client pools
/// (Go 90 s, reqwest 90 s), so a pooled connection is rarely reused as it closes.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// A server that could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A flag, file or variable is wrong: the operator's mistake.
    #[error("{0}")]
    Config(String),
    /// The store cannot be opened.
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// The listening socket or the runtime failed.
    #[error("{0}")]
    Io(String),
    /// An MCP server of the tool manifest did not start, or its tools are refused
    /// (names the server).
    #[error(transparent)]
    Mcp(aplc_runtime::mcp::McpError),
}

/// Every secret the server knows before it reads its providers file: the environment's
/// (`APLC_SERVE_TOKENS`, provider keys, OTLP headers, ...), each accepted token (from a
/// tokens file too) and the store's password. (`aplc mcp`'s too.)
fn secrets(tokens: &Tokens, store: Option<&StoreUrl>) -> aplc_runtime::Secrets {
    let mut secrets = aplc_runtime::Secrets::from_env();
    secrets.values(tokens.values());
    if let Some(StoreUrl::Postgres(url)) = store {
        secrets.store_url(url);
    }
    secrets
}

/// Runs the server until SIGTERM or Ctrl-C, then shuts down: stops claiming runs, lets
/// running runs go on for up to `drain_timeout`, stops the rest (they resume from their
/// journal at the next start) and returns.
///
/// `ready` is called with the bound address once the server accepts connections.
pub async fn serve(config: ServeConfig, ready: impl FnOnce(SocketAddr)) -> Result<(), ServeError> {
    if config.tokens.is_empty() {
        return Err(ServeError::Config(
            "no bearer tokens: pass --tokens FILE or set APLC_SERVE_TOKENS (every route but \
             /healthz needs one)"
                .into(),
        ));
    }
    let fd_limit = connections::raise_fd_limit();
    let limits = connections::ConnectionLimits {
        max_connections: config
            .max_connections
            .unwrap_or_else(|| connections::default_max_connections(fd_limit)),
        header_timeout: config.header_timeout,
        idle_timeout: config.idle_timeout,
        drain_timeout: config.drain_timeout,
    };
    let mut equipment = equip::Equipment::load(
        config.providers.as_deref(),
        config.tools.as_deref(),
        secrets(&config.tokens, Some(&config.store)),
    )?;
    // Before anything listens: a server that does not start is a startup error. A signal
    // meanwhile drops the start (the servers started so far are killed) and ends here.
    let mcp = tokio::select! {
        started = equipment.start_mcp() => started?,
        () = shutdown_signal() => {
            tracing::info!("stopped while the MCP servers started");
            return Ok(());
        }
    };
    let agents = agents::Agents::load(config.agents.clone())?;
    let store: Arc<dyn RunStore> = store::open(&config.store).await?;
    tracing::info!(store = %config.store, "store open");
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| ServeError::Io(format!("cannot listen on {}: {e}", config.listen)))?;
    let address = listener
        .local_addr()
        .map_err(|e| ServeError::Io(format!("cannot read the bound address: {e}")))?;

    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let state = state::AppState::new(store, agents, equipment, mcp, &config, stop.clone());
    let reload = tokio::spawn(agents::watch(
        state.agents.clone(),
        config.reload_interval,
        stop.clone(),
    ));
    let workers = tokio::spawn(worker::dispatch(
        state.clone(),
        config.max_concurrent_runs.max(1),
        config.drain_timeout,
        stop.clone(),
    ));
    let app = api::router(
        state.clone(),
        config.max_body_bytes,
        config.playground.clone(),
    );
    tracing::info!(%address, max_connections = limits.max_connections, "listening");
    ready(address);
    let server = connections::serve(listener, app, limits, stop.clone());
    let signals = tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down: no new runs are claimed");
        let _ = stop_tx.send(true);
    });
    server.await;
    signals.abort();
    // The workers end after the drain; the watcher at its next tick.
    let _ = workers.await;
    reload.abort();
    // No MCP server outlives the server: their process groups are killed.
    state.mcp.stop().await;
    tracing::info!("stopped");
    Ok(())
}

/// SIGTERM or Ctrl-C (SIGINT).
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut signal) => {
                    signal.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            () = ctrl_c => {}
            () = term => {}
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await;
}

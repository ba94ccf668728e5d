//! `aplc mcp`: every agent of a directory served as a tool of a Model Context Protocol
//! server (spec/mcp.md, §3), over stdio or streamable HTTP.
//!
//! The agents, their equipment (providers, tools, secrets) and, with a store, the
//! durable runs are `aplc serve`'s own ([`Agents`], [`Equipment`], `durable::start`): a
//! call is one run through the same run session and driver. rmcp, the official SDK,
//! speaks the protocol; its types stay in this module (`tools.rs` maps an agent to a
//! tool, `call.rs` a call to a run and its outcome to a tool result).
//!
//! Not here: `aplc serve`'s queue and workers. A call runs in the task that serves it
//! and answers when the run ends; with a store the run is journaled as it goes, so one
//! stopped by a crash is resumed with `aplc resume`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use aplc_runtime::store::{self, RunStore, StoreUrl};
use axum::Router;
use rmcp::ServiceExt as _;
use rmcp::service::ServerInitializeError;
use rmcp::transport::StreamableHttpService;
use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;

use crate::agents::Agents;
use crate::auth::Tokens;
use crate::equip::Equipment;
use crate::{ServeError, connections};

mod call;
mod tools;

use call::AgentTools;

/// How `aplc mcp` is set up: its flags.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct McpConfig {
    /// The directory of agents (`.apl` and `.aplb` files), as `aplc serve` reads it.
    pub agents: PathBuf,
    /// The providers file (spec/providers.md).
    pub providers: Option<PathBuf>,
    /// The tool manifest (spec/tools.md).
    pub tools: Option<PathBuf>,
    /// With a store, each call is a durable run in it.
    pub store: Option<StoreUrl>,
    /// Streamable HTTP at `/mcp` on this address; stdio without it.
    pub listen: Option<SocketAddr>,
    /// The bearer tokens an HTTP client must present (`--listen` needs one).
    pub tokens: Tokens,
    /// The largest HTTP request body accepted; a larger one gets 413.
    pub max_body_bytes: usize,
}

impl McpConfig {
    /// A stdio server of the agents of `agents`, without a store.
    pub fn new(agents: PathBuf) -> Self {
        McpConfig {
            agents,
            providers: None,
            tools: None,
            store: None,
            listen: None,
            tokens: Tokens::default(),
            max_body_bytes: crate::DEFAULT_MAX_BODY_BYTES,
        }
    }
}

/// Serves the agents until the client goes (stdio: end of input) or SIGTERM or Ctrl-C.
///
/// `ready` is called once the server takes requests: with the bound address over HTTP,
/// with `None` over stdio.
pub async fn serve_mcp(
    config: McpConfig,
    ready: impl FnOnce(Option<SocketAddr>),
) -> Result<(), ServeError> {
    if config.listen.is_some() && config.tokens.is_empty() {
        return Err(ServeError::Config(
            "no bearer tokens: `--listen` needs --tokens FILE or APLC_SERVE_TOKENS".into(),
        ));
    }
    // First: a signal while the agents load stops the server once it is up.
    let signals = stop_signals()?;
    let equipment = Equipment::load(
        config.providers.as_deref(),
        config.tools.as_deref(),
        crate::secrets(&config.tokens, config.store.as_ref()),
    )?;
    let agents = Agents::load(config.agents.clone())?;
    let store: Option<Arc<dyn RunStore>> = match &config.store {
        Some(url) => Some(store::open(url).await?),
        None => None,
    };
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let reload = tokio::spawn(crate::agents::watch(
        agents.clone(),
        crate::DEFAULT_RELOAD_INTERVAL,
        stop,
    ));
    let handler = AgentTools::new(agents, Arc::new(equipment), store);
    let served = match config.listen {
        None => serve_stdio(handler, signals, ready).await,
        Some(address) => serve_http(handler, address, &config, signals, ready).await,
    };
    let _ = stop_tx.send(true);
    reload.abort();
    served
}

/// Over stdin and stdout until the client closes stdin, or a signal.
async fn serve_stdio(
    handler: AgentTools,
    signals: impl Future<Output = ()>,
    ready: impl FnOnce(Option<SocketAddr>),
) -> Result<(), ServeError> {
    // One listener from start to end: a signal between the handshake and the session is
    // not lost.
    tokio::pin!(signals);
    // The non-blocking pipes where stdin and stdout are pipes (as MCP clients start
    // servers): a blocking read of stdin could not be cancelled at a signal.
    let running = tokio::select! {
        started = handler.serve(rmcp::transport::stdio_pipes()) => match started {
            Ok(running) => running,
            // The client went before it initialized: nothing to serve, nothing wrong.
            Err(
                ServerInitializeError::ConnectionClosed(_)
                | ServerInitializeError::ExpectedInitializeRequest(None),
            ) => return Ok(()),
            Err(e) => return Err(ServeError::Io(format!("the MCP session did not start: {e}"))),
        },
        () = &mut signals => return Ok(()),
    };
    tracing::info!("serving agents over stdio");
    ready(None);
    let stop = running.cancellation_token();
    tokio::select! {
        quit = running.waiting() => {
            if let Err(e) = quit {
                return Err(ServeError::Io(format!("the MCP session failed: {e}")));
            }
        }
        () = &mut signals => {
            tracing::info!("shutting down");
            stop.cancel();
        }
    }
    Ok(())
}

/// Streamable HTTP at `/mcp`, stateless (no session is kept between requests, so a
/// client cannot make the server hold memory), behind the bearer-token check and the
/// body limit of `aplc serve`, on its connection loop (header, body and idle timeouts,
/// connection cap).
async fn serve_http(
    handler: AgentTools,
    address: SocketAddr,
    config: &McpConfig,
    signals: impl Future<Output = ()> + Send + 'static,
    ready: impl FnOnce(Option<SocketAddr>),
) -> Result<(), ServeError> {
    // Host validation guards unauthenticated local servers against DNS rebinding; every
    // request here needs a bearer token, which a rebinding page cannot have, and a
    // server reached under its own DNS name must not refuse it.
    let http = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_max_request_body_bytes(config.max_body_bytes)
        .disable_allowed_hosts();
    let service = StreamableHttpService::new(
        move || Ok(handler.clone()),
        Arc::new(NeverSessionManager::default()),
        http,
    );
    let tokens = Arc::new(config.tokens.clone());
    let app = Router::new()
        .route_service("/mcp", service)
        .route_layer(axum::middleware::from_fn_with_state(
            tokens,
            crate::auth::require_token,
        ))
        .layer(axum::extract::DefaultBodyLimit::max(config.max_body_bytes));
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| ServeError::Io(format!("cannot listen on {address}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| ServeError::Io(format!("cannot read the bound address: {e}")))?;
    let fd_limit = connections::raise_fd_limit();
    let limits = connections::ConnectionLimits {
        max_connections: connections::default_max_connections(fd_limit),
        header_timeout: crate::DEFAULT_HEADER_TIMEOUT,
        idle_timeout: crate::DEFAULT_IDLE_TIMEOUT,
        drain_timeout: DRAIN_TIMEOUT,
    };
    tracing::info!(address = %bound, "serving agents over streamable HTTP at /mcp");
    ready(Some(bound));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let signals = tokio::spawn(async move {
        signals.await;
        tracing::info!("shutting down");
        let _ = stop_tx.send(true);
    });
    connections::serve(listener, app, limits, stop_rx).await;
    signals.abort();
    Ok(())
}

/// SIGTERM or SIGINT, listened for from the call on: the handlers are installed here, not
/// at the first poll, so a signal that comes while the server starts is not lost (once
/// tokio handles a signal, the default action no longer ends the process).
fn stop_signals() -> Result<impl Future<Output = ()> + Send + 'static, ServeError> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let listen = |kind: SignalKind| {
            signal(kind).map_err(|e| ServeError::Io(format!("cannot listen for signals: {e}")))
        };
        let mut term = listen(SignalKind::terminate())?;
        let mut interrupt = listen(SignalKind::interrupt())?;
        Ok(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = interrupt.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    Ok(crate::shutdown_signal())
}

/// How long calls in progress may go on after SIGTERM over HTTP.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

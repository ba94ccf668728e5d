//! [`AppState`]: everything the handlers, the SSE streams and the workers share.

use std::sync::Arc;
use std::time::Duration;

use aplc_runtime::mcp::McpHost;
use aplc_runtime::store::RunStore;
use tokio::sync::watch;

use crate::ServeConfig;
use crate::agents::Agents;
use crate::auth::Tokens;
use crate::equip::Equipment;
use crate::live::LiveRuns;
use crate::metrics::Metrics;
use crate::work::Work;

/// Everything the handlers and workers share.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) store: Arc<dyn RunStore>,
    pub(crate) agents: Arc<Agents>,
    pub(crate) equipment: Arc<Equipment>,
    /// The tool manifest's MCP servers, supervised (their health for `/metrics`).
    pub(crate) mcp: Arc<McpHost>,
    pub(crate) live: Arc<LiveRuns>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) tokens: Arc<Tokens>,
    /// Wakes the dispatcher when a run is queued.
    pub(crate) work: Arc<Work>,
    /// Set once the server shuts down: streams and waits end.
    pub(crate) stop: watch::Receiver<bool>,
    /// OpenTelemetry export, when on.
    pub(crate) telemetry: Option<Arc<aplc_runtime::telemetry::Telemetry>>,
    /// How long `?wait=true` waits for a run to end.
    pub(crate) wait_limit: Duration,
    /// How often to look in the store for what this process was not told about
    /// ([`ServeConfig::store_poll`](crate::ServeConfig::store_poll)).
    pub(crate) store_poll: Duration,
    /// How long a request body may take to arrive.
    pub(crate) body_timeout: Duration,
}

impl AppState {
    pub(crate) fn new(
        store: Arc<dyn RunStore>,
        agents: Arc<Agents>,
        equipment: Equipment,
        mcp: McpHost,
        config: &ServeConfig,
        stop: watch::Receiver<bool>,
    ) -> AppState {
        AppState {
            store,
            agents,
            equipment: Arc::new(equipment),
            mcp: Arc::new(mcp),
            live: Arc::new(LiveRuns::default()),
            metrics: Arc::new(Metrics::default()),
            tokens: Arc::new(config.tokens.clone()),
            work: Arc::new(Work::default()),
            stop,
            telemetry: config.telemetry.clone(),
            wait_limit: config.wait_limit,
            store_poll: config.store_poll,
            body_timeout: config.body_timeout,
        }
    }
}

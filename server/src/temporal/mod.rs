//! `aplc worker --temporal`: the agents of a directory as Temporal workflows
//! (spec/temporal.md).
//!
//! One workflow type, `apl.Run` ([`workflow`]), drives one [`aplc_vm::Machine`] with the
//! workflow's own time: the machine is sans-IO and deterministic, so Temporal's history
//! (the activities' results, in order) is the run's journal, and a replay on any worker
//! rebuilds the run exactly. Every effect is an activity ([`activities`]): a provider
//! request is `apl.provider_call`, a tool call `apl.tool_call` (MCP tools included: they
//! are tools of the toolbox, so the same activity runs them). Children run inside the
//! parent's machine (spec/agents.md), so they need no child workflows.
//!
//! The worker's agents, provider and tools are this process's, loaded once at start and
//! shared with the workflow code through [`host`]: workflow code is built by the SDK
//! without arguments, and it only reads the host (a bundle by its hash), never writes it.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use temporalio_client::{
    Client, ClientOptions, ClientTlsOptions, Connection, ConnectionOptions, TlsOptions, Url,
};
use temporalio_sdk::runtime::worker_tuner::{FixedSizeSlotSupplier, TunerHolder, WorkerTuner};
use temporalio_sdk::{Runtime, Worker, WorkerOptions};

use aplc_runtime::store::StoreUrl;

use crate::ServeError;
use crate::agents::Agents;
use crate::equip::Equipment;

mod activities;
mod checkpoints;
mod continuation;
mod payload;
mod trace_header;
mod workflow;

use activities::AplActivities;
use checkpoints::Checkpoints;
use workflow::AplRun;

/// How `aplc worker --temporal` is set up: its flags.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WorkerConfig {
    /// The Temporal frontend, `HOST:PORT` (or a URL).
    pub address: String,
    /// The namespace (default `default`).
    pub namespace: String,
    /// The task queue to poll.
    pub task_queue: String,
    /// The directory of agents (`.apl` and `.aplb` files), as `aplc serve --agents`.
    pub agents: PathBuf,
    /// The providers file (spec/providers.md).
    pub providers: Option<PathBuf>,
    /// The tools manifest (spec/tools.md).
    pub tools: Option<PathBuf>,
    /// Workflow tasks and activities this worker runs at once (each).
    pub max_concurrent_runs: usize,
    /// How long in-flight activities may finish after SIGTERM.
    pub drain_timeout: Duration,
    /// The store of long runs' checkpoints (continue-as-new), shared by the workers of
    /// the task queue; `None`: `sqlite:aplc-temporal.db` in the working directory.
    pub store: Option<StoreUrl>,
    /// TLS to the frontend (Temporal Cloud, a self-hosted server with TLS).
    pub tls: TlsConfig,
    /// The environment variable holding an API key (Temporal Cloud): sent as a bearer
    /// token, over TLS. The key itself is never printed, logged or in an error.
    pub api_key_env: Option<String>,
    /// The OpenTelemetry pipeline, when export is on (spec/telemetry.md): each provider
    /// and tool call's span, under the trace context its workflow was started with. The
    /// caller shuts it down after [`run_worker`] returned.
    pub telemetry: Option<Arc<aplc_runtime::telemetry::Telemetry>>,
}

/// `--tls` and its files: PEM paths, read at start.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct TlsConfig {
    /// Use TLS (implied by any of the others, and by an API key).
    pub enabled: bool,
    /// The CA that signs the server's certificate; without it, the system's roots.
    pub ca: Option<PathBuf>,
    /// The client's certificate, for mutual TLS (with `key`).
    pub cert: Option<PathBuf>,
    /// The client's private key, for mutual TLS (with `cert`).
    pub key: Option<PathBuf>,
    /// The name to verify the server's certificate against, if not the address's host.
    pub domain: Option<String>,
}

impl TlsConfig {
    fn wanted(&self) -> bool {
        self.enabled
            || self.ca.is_some()
            || self.cert.is_some()
            || self.key.is_some()
            || self.domain.is_some()
    }
}

impl WorkerConfig {
    /// A worker of `agents` on `task_queue` at `address`, namespace `default`.
    pub fn new(address: String, task_queue: String, agents: PathBuf) -> WorkerConfig {
        WorkerConfig {
            address,
            namespace: "default".into(),
            task_queue,
            agents,
            providers: None,
            tools: None,
            max_concurrent_runs: crate::DEFAULT_MAX_CONCURRENT_RUNS,
            drain_timeout: crate::DEFAULT_DRAIN_TIMEOUT,
            store: None,
            tls: TlsConfig::default(),
            api_key_env: None,
            telemetry: None,
        }
    }
}

/// What the worker's workflows and activities use: its agents and equipment.
pub(crate) struct Host {
    pub(crate) agents: Arc<Agents>,
    pub(crate) equipment: Equipment,
    pub(crate) checkpoints: Checkpoints,
    pub(crate) telemetry: Option<Arc<aplc_runtime::telemetry::Telemetry>>,
}

/// How long the worker waits for Temporal's frontend to take its connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The store of checkpoints when `--store` is not given: one worker's.
pub const DEFAULT_STORE: &str = "sqlite:aplc-temporal.db";

static HOST: OnceLock<Arc<Host>> = OnceLock::new();

/// The worker's host; `None` before [`run_worker`] set it (never, in workflow code).
pub(crate) fn host() -> Option<Arc<Host>> {
    HOST.get().cloned()
}

/// Runs the worker until SIGTERM or Ctrl-C, then shuts down: stops polling, lets
/// in-flight activities finish for up to `drain_timeout` (Temporal gives the rest, and
/// the workflows, to other workers) and returns. `ready` is called once it polls.
pub async fn run_worker(config: WorkerConfig, ready: impl FnOnce()) -> Result<(), ServeError> {
    let connection = connection_options(&config)?;
    let mut secrets = aplc_runtime::Secrets::from_env();
    if let Some(key) = &connection.api_key {
        // Whatever echoes it (a provider's error, a tool's output) is scrubbed of it.
        secrets.value(key);
    }
    let mut equipment = Equipment::load(
        config.providers.as_deref(),
        config.tools.as_deref(),
        secrets,
    )?;
    let _mcp = equipment.start_mcp().await?;
    let agents = Agents::load(config.agents.clone())?;
    let store = match config.store.clone() {
        Some(url) => url,
        None => StoreUrl::parse(DEFAULT_STORE)?,
    };
    let checkpoints = Checkpoints::open(&store).await?;
    let host = Arc::new(Host {
        agents,
        equipment,
        checkpoints,
        telemetry: config.telemetry.clone(),
    });
    if HOST.set(host.clone()).is_err() {
        return Err(ServeError::Config("one Temporal worker per process".into()));
    }
    let client = connect(&config, connection).await?;
    let runtime = Runtime::from_current_tokio(Default::default())
        .map_err(|e| ServeError::Io(format!("temporal runtime: {e}")))?;
    let options = WorkerOptions::new(config.task_queue.clone())
        .register_activities(AplActivities::new(host))
        .register_workflow::<AplRun>()
        .map_err(|e| ServeError::Config(format!("temporal workflow: {e}")))?
        .workflow_interceptor(trace_header::constructor())
        .tuner(tuner(config.max_concurrent_runs))
        .graceful_shutdown_period(config.drain_timeout)
        .build();
    let mut worker = Worker::new(&runtime, client, options)
        .map_err(|e| ServeError::Io(format!("temporal worker: {e}")))?;
    let shutdown = worker.shutdown_handle();
    tracing::info!(
        address = %config.address,
        namespace = %config.namespace,
        task_queue = %config.task_queue,
        "temporal worker polling"
    );
    ready();
    let signals = tokio::spawn(async move {
        crate::shutdown_signal().await;
        tracing::info!("shutting down: no new tasks are polled");
        shutdown();
    });
    let ran = worker.run().await;
    signals.abort();
    ran.map_err(|e| ServeError::Io(format!("temporal worker: {e}")))?;
    tracing::info!("stopped");
    Ok(())
}

/// At most `n` workflow tasks and `n` activities at once.
fn tuner(n: usize) -> WorkerTuner {
    let n = n.max(1);
    TunerHolder::builder()
        .workflow_task_slot_supplier(FixedSizeSlotSupplier::new(n))
        .activity_task_slot_supplier(FixedSizeSlotSupplier::new(n))
        .local_activity_task_slot_supplier(FixedSizeSlotSupplier::new(n))
        .nexus_task_slot_supplier(FixedSizeSlotSupplier::new(1))
        .build()
        .into()
}

/// How to reach `config`'s frontend: its URL (`https` with TLS), TLS with the files of
/// `--tls-*` read, the API key of `--api-key-env`. A usage error names the flag or the
/// variable, never the key.
fn connection_options(config: &WorkerConfig) -> Result<ConnectionOptions, ServeError> {
    let api_key = match &config.api_key_env {
        None => None,
        Some(name) => match std::env::var(name) {
            Ok(key) if !key.trim().is_empty() => Some(key.trim().to_owned()),
            _ => {
                return Err(ServeError::Config(format!(
                    "--api-key-env {name}: the environment variable `{name}` is not set (or empty)"
                )));
            }
        },
    };
    let mut tls = tls_options(&config.tls)?;
    if api_key.is_some() && tls.is_none() {
        // A key goes over TLS only (the SDK would name an `https` target, but not set
        // its TLS up): the system's roots, the address's host.
        tls = Some(TlsOptions::builder().build());
    }
    let secure = tls.is_some();
    let target = if config.address.contains("://") {
        config.address.clone()
    } else if secure {
        format!("https://{}", config.address)
    } else {
        format!("http://{}", config.address)
    };
    let url: Url = target
        .parse()
        .map_err(|e| ServeError::Config(format!("--temporal {}: {e}", config.address)))?;
    Ok(ConnectionOptions::new(url)
        .identity(identity())
        .maybe_tls_options(tls)
        .maybe_api_key(api_key)
        // A frontend that takes the connection and never answers (a TLS handshake to
        // something else) is a worker that cannot start, not one that waits forever.
        .connect_timeout(CONNECT_TIMEOUT)
        .build())
}

/// The TLS options of `--tls`, `--tls-ca`, `--tls-cert`, `--tls-key`, `--tls-domain`.
fn tls_options(tls: &TlsConfig) -> Result<Option<TlsOptions>, ServeError> {
    if !tls.wanted() {
        return Ok(None);
    }
    // Bounded, as every file aplc takes in whole (runtime/src/files.rs).
    let read = |flag: &str, path: &PathBuf| {
        use aplc_runtime::files::{MAX_INPUT_LEN, ReadError, read_at_most};
        read_at_most(path, MAX_INPUT_LEN, "files").map_err(|e| {
            let why = match e {
                ReadError::Io { source, .. } => source.to_string(),
                other => other.to_string(),
            };
            ServeError::Config(format!("{flag} {}: {why}", path.display()))
        })
    };
    let client = match (&tls.cert, &tls.key) {
        (None, None) => None,
        (Some(cert), Some(key)) => Some(
            ClientTlsOptions::builder()
                .client_cert(read("--tls-cert", cert)?)
                .client_private_key(read("--tls-key", key)?)
                .build(),
        ),
        _ => {
            return Err(ServeError::Config(
                "--tls-cert and --tls-key go together (mutual TLS needs both)".into(),
            ));
        }
    };
    let ca = tls.ca.as_ref().map(|ca| read("--tls-ca", ca)).transpose()?;
    Ok(Some(
        TlsOptions::builder()
            .maybe_server_root_ca_cert(ca)
            .maybe_domain(tls.domain.clone())
            .maybe_client_tls_options(client)
            .build(),
    ))
}

/// The client of `config`'s frontend and namespace.
async fn connect(config: &WorkerConfig, options: ConnectionOptions) -> Result<Client, ServeError> {
    let connection = Connection::connect(options)
        .await
        .map_err(|e| ServeError::Io(format!("cannot reach Temporal at {}: {e}", config.address)))?;
    Client::new(
        connection,
        ClientOptions::new(config.namespace.clone()).build(),
    )
    .map_err(|e| ServeError::Io(format!("temporal client: {e}")))
}

/// This worker's identity in Temporal's history: `aplc@HOST:PID`.
fn identity() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "localhost".into());
    format!("aplc@{host}:{}", std::process::id())
}

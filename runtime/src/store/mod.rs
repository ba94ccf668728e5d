//! Durable run stores: the journal of a run in SQLite (embedded default) or PostgreSQL.
//!
//! A store keeps, per run: the bundle (once per content hash), the run's options (never a
//! secret), the journal (the machine's inputs and the run's events, in order), the
//! checkpoints, and the final outcome. See `spec/durability.md`.
//!
//! The store knows nothing of machines: inputs, checkpoints and events are opaque bytes
//! and JSON text to it. `durable.rs` gives them meaning.

use crate::driver::BoxFuture;

/// Where a store lives: `sqlite:PATH` or `postgres://…` (`postgresql://…`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// A SQLite file (created if missing).
    Sqlite(std::path::PathBuf),
    /// A PostgreSQL connection string. Its `Debug`/`Display` never show the password.
    Postgres(String),
}

impl StoreUrl {
    /// Parses `sqlite:PATH`, `sqlite://PATH`, `postgres://…` or `postgresql://…`.
    pub fn parse(url: &str) -> Result<StoreUrl, StoreError> {
        let _ = url;
        todo!("store: StoreUrl::parse")
    }
}

/// Opens (creating and migrating if needed) the store at `url`.
pub async fn open(url: &StoreUrl) -> Result<std::sync::Arc<dyn RunStore>, StoreError> {
    let _ = url;
    todo!("store: open")
}

/// A run's status in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    /// Started and not finished (running now, or crashed: see the lease).
    Running,
    /// Finished; the outcome is stored.
    Finished,
}

/// What a new run stores once.
#[derive(Debug, Clone)]
pub struct NewRun {
    /// The run id (unique in the store).
    pub id: String,
    /// The agent's source name, for listings.
    pub agent: String,
    /// The bundle's content hash (hex), the key it is stored under.
    pub bundle_hash: String,
    /// The encoded bundle; stored only if no bundle with this hash is there yet.
    pub bundle: Vec<u8>,
    /// The run options as JSON: `with_context`, limits, tool fingerprint. Never a secret.
    pub options: serde_json::Value,
    /// Wall-clock start, milliseconds since the Unix epoch.
    pub started_at_ms: i64,
}

/// A run's summary row.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    /// The run id.
    pub id: String,
    /// The agent's source name.
    pub agent: String,
    /// The bundle's content hash.
    pub bundle_hash: String,
    /// Running or finished.
    pub state: RunState,
    /// Steps entered so far.
    pub steps: u64,
    /// Wall-clock start, ms since the epoch.
    pub started_at_ms: i64,
    /// Wall-clock time of the last append, ms since the epoch.
    pub updated_at_ms: i64,
    /// Inputs journaled so far.
    pub inputs: u64,
    /// Events journaled so far.
    pub events: u64,
    /// The final outcome (JSON written by the driver), when finished.
    pub outcome: Option<serde_json::Value>,
}

/// A checkpoint as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCheckpoint {
    /// Number of journal inputs the checkpointed machine had consumed.
    pub inputs: u64,
    /// Index of the first `context_history` entry in `history`.
    pub history_start: u64,
    /// The history segment.
    pub history: Vec<u8>,
    /// The state; `None` once a later checkpoint superseded it (only the newest keeps it).
    pub state: Option<Vec<u8>>,
}

/// Everything a resume needs.
#[derive(Debug, Clone)]
pub struct LoadedRun {
    /// The summary row.
    pub summary: RunSummary,
    /// The encoded bundle.
    pub bundle: Vec<u8>,
    /// The options JSON given at creation.
    pub options: serde_json::Value,
    /// Every checkpoint, oldest first (only the last has its `state`).
    pub checkpoints: Vec<StoredCheckpoint>,
    /// The journal inputs after the newest checkpoint (all of them without one), in order.
    pub inputs: Vec<Vec<u8>>,
    /// Events journaled so far (for the next event's sequence check).
    pub events: u64,
}

/// One commit: appended atomically, or not at all.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    /// Inputs numbered from `first_input` (must equal the stored count: a gap or overlap
    /// is refused).
    pub first_input: u64,
    /// Encoded inputs.
    pub inputs: Vec<Vec<u8>>,
    /// Events, as JSON text, numbered after those stored.
    pub events: Vec<String>,
    /// A checkpoint to add; the previous newest checkpoint's state is dropped.
    pub checkpoint: Option<StoredCheckpoint>,
    /// Steps entered so far.
    pub steps: u64,
    /// Set when the run finished: its outcome.
    pub outcome: Option<serde_json::Value>,
}

/// The exclusive right to advance one run. Dropping it releases the run; a process that
/// dies releases it too (the OS or the server notices), so a crash never leaves a run
/// locked.
pub trait Lease: Send + Sync + std::fmt::Debug {
    /// The run id.
    fn run_id(&self) -> &str;
}

/// A run store: SQLite or PostgreSQL behind one interface.
pub trait RunStore: Send + Sync + std::fmt::Debug {
    /// Creates a run and takes its lease. An existing id is an error.
    fn create<'a>(&'a self, run: NewRun) -> BoxFuture<'a, Result<Box<dyn Lease>, StoreError>>;
    /// Takes the lease of an existing, unfinished run, or fails with
    /// [`StoreError::Locked`] if another process holds it.
    fn acquire<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Box<dyn Lease>, StoreError>>;
    /// Appends one batch under the lease, in one transaction.
    fn append<'a>(
        &'a self,
        lease: &'a dyn Lease,
        batch: Batch,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    /// Loads a run for resuming.
    fn load<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<LoadedRun, StoreError>>;
    /// Every run, newest first.
    fn list<'a>(&'a self) -> BoxFuture<'a, Result<Vec<RunSummary>, StoreError>>;
    /// One run's summary.
    fn summary<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<RunSummary, StoreError>>;
    /// A run's events (JSON text), in order, from event number `from`, at most `limit`.
    fn events<'a>(
        &'a self,
        id: &'a str,
        from: u64,
        limit: u64,
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>>;
    /// Storage the run uses, in bytes (inputs, events, checkpoints), for benches.
    fn run_bytes<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<u64, StoreError>>;
}

/// A store that cannot do what was asked. Messages never carry a password.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A malformed store URL.
    #[error("invalid store URL: {0}")]
    Url(String),
    /// The store cannot be opened or reached.
    #[error("cannot open the store: {0}")]
    Open(String),
    /// Not an aplc store (a foreign SQLite file, a database with other tables, not SQLite).
    #[error("not an aplc run store: {0}")]
    Foreign(String),
    /// Written by a newer aplc.
    #[error(
        "the store's schema is version {found}, newer than this aplc's {supported}: upgrade aplc"
    )]
    NewerSchema {
        /// The store's version.
        found: i64,
        /// The newest this build knows.
        supported: i64,
    },
    /// Unreadable content.
    #[error("the store is corrupt: {0}")]
    Corrupt(String),
    /// No such run.
    #[error("no run `{0}` in the store")]
    NotFound(String),
    /// A run with this id already exists.
    #[error("a run `{0}` already exists in the store")]
    Exists(String),
    /// Another process holds the run.
    #[error("run `{0}` is being advanced by another process")]
    Locked(String),
    /// The run is finished: nothing to resume.
    #[error("run `{0}` is already finished")]
    Finished(String),
    /// A batch out of sequence (a bug, or a lost lease).
    #[error("journal out of sequence for run `{id}`: expected input {expected}, got {got}")]
    Sequence {
        /// The run.
        id: String,
        /// The stored count.
        expected: u64,
        /// The batch's first input.
        got: u64,
    },
    /// Any other database error.
    #[error("store error: {0}")]
    Database(String),
}

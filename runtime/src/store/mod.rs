//! Durable run stores: the journal of a run in SQLite (embedded default) or PostgreSQL.
//!
//! A store keeps, per run: the bundle (once per content hash), the run's options (never a
//! secret), the journal (the machine's inputs and the run's events, in order), the
//! checkpoints, and the final outcome. See `spec/durability.md`.
//!
//! The store knows nothing of machines: inputs and checkpoints are opaque bytes to it,
//! and events JSON text, which its writer makes from the run's events
//! ([`Batch::render`]). `durable.rs` gives them meaning.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use aplc_vm::{Event, EventKind, HistorySegment};

use crate::future::BoxFuture;
use crate::redact::Redactor;

// Each backend is a cargo feature (both on by default). A URL whose backend is compiled
// out still parses, and opening it is an error that names the feature (`compiled_out`).
#[cfg(any(not(feature = "sqlite"), not(feature = "postgres")))]
mod compiled_out;
#[cfg(not(feature = "postgres"))]
use compiled_out::postgres;
#[cfg(not(feature = "sqlite"))]
use compiled_out::sqlite;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod rows;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use rows::*;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use sql::*;
#[cfg(feature = "sqlite")]
mod sqlite;
mod timed;

pub use timed::{JournalTimings, TimedJournal};

/// Where a store lives: `sqlite:PATH` or `postgres://…` (`postgresql://…`).
///
/// `Debug` and `Display` are written by hand: they show a PostgreSQL URL with its
/// password replaced by `***`.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// A SQLite file (created if missing).
    Sqlite(std::path::PathBuf),
    /// A PostgreSQL connection string. Its `Debug`/`Display` never show the password.
    Postgres(String),
}

impl StoreUrl {
    /// Parses `sqlite:PATH`, `sqlite://PATH`, `postgres://…` or `postgresql://…`.
    pub fn parse(url: &str) -> Result<StoreUrl, StoreError> {
        if let Some(rest) = url.strip_prefix("sqlite:") {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if path.is_empty() {
                return Err(StoreError::Url(
                    "`sqlite:` needs a file path, as in `sqlite:runs.db`".into(),
                ));
            }
            return Ok(StoreUrl::Sqlite(path.into()));
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(StoreUrl::Postgres(url.to_string()));
        }
        // The text is not echoed: a mistyped PostgreSQL URL may still carry a password.
        let scheme = url.split_once(':').map_or("", |(scheme, _)| scheme);
        let shown = if !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        {
            format!("scheme `{scheme}:`")
        } else {
            "no scheme".to_string()
        };
        Err(StoreError::Url(format!(
            "{shown}; expected `sqlite:PATH` or `postgres://USER@HOST/DB`"
        )))
    }
}

impl std::fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreUrl::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            StoreUrl::Postgres(url) => f.write_str(&redact_url(url)),
        }
    }
}

impl std::fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreUrl::Sqlite(path) => f.debug_tuple("Sqlite").field(path).finish(),
            StoreUrl::Postgres(url) => f.debug_tuple("Postgres").field(&redact_url(url)).finish(),
        }
    }
}

/// Opens (creating and migrating if needed) the store at `url`.
pub async fn open(url: &StoreUrl) -> Result<std::sync::Arc<dyn RunStore>, StoreError> {
    match url {
        StoreUrl::Sqlite(path) => sqlite::open(path).await,
        StoreUrl::Postgres(url) => postgres::open(url).await,
    }
}

/// Opens the store at `url` for inspection (`aplc runs`): a SQLite file is read without
/// writing anything to it or beside it, and refuses every write; a missing file reads as
/// an empty store. A PostgreSQL store opens as [`open`] does (its migration writes only
/// into a database with no aplc tables).
pub async fn open_read_only(url: &StoreUrl) -> Result<std::sync::Arc<dyn RunStore>, StoreError> {
    match url {
        StoreUrl::Sqlite(path) => sqlite::open_read_only(path).await,
        StoreUrl::Postgres(_) => open(url).await,
    }
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
    /// The requests the run waits on (`spec/human.md`), as `human::Pending::to_json`
    /// writes them; empty when it waits on none.
    pub pending: Vec<serde_json::Value>,
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
    /// What the run made and the store's writer writes ([`Batch::render`]), so that it
    /// costs the run's own thread nothing (issue #24): events numbered after `events`,
    /// and the history segment of `checkpoint`.
    pub made: Made,
    /// A checkpoint to add; the previous newest checkpoint's state is dropped.
    pub checkpoint: Option<StoredCheckpoint>,
    /// Steps entered so far.
    pub steps: u64,
    /// Set when the run finished: its outcome.
    pub outcome: Option<serde_json::Value>,
    /// `Some` replaces the requests the run waits on (`spec/human.md`; empty: it waits
    /// on none); `None` leaves them.
    pub pending: Option<Vec<serde_json::Value>>,
}

impl Batch {
    /// Adds `later`, the batch that follows this one, so that both commit in one
    /// transaction, as if appended one after the other. Two checkpoints do not go in one
    /// batch (each carries its own segment of `context_history`), nor anything after an
    /// outcome: then `later` is handed back, to be appended after this one.
    pub fn absorb(&mut self, later: Batch) -> Option<Batch> {
        if (self.checkpoint.is_some() && later.checkpoint.is_some()) || self.outcome.is_some() {
            return Some(later);
        }
        self.inputs.extend(later.inputs);
        if !later.events.is_empty() {
            // Text after made events: make those text first, to keep the order.
            self.render();
        }
        self.events.extend(later.events);
        self.made.events.extend(later.made.events);
        if self.made.redactor.is_empty() {
            self.made.redactor = later.made.redactor;
        }
        if later.checkpoint.is_some() {
            self.checkpoint = later.checkpoint;
            self.made.history = later.made.history;
        }
        self.steps = later.steps;
        self.outcome = later.outcome;
        if later.pending.is_some() {
            self.pending = later.pending;
        }
        None
    }

    /// What the batch holds: inputs, and bytes of inputs, events and pending requests
    /// (as the JSON text the store keeps; only a pausing batch has any).
    pub(crate) fn size(&self) -> (usize, usize) {
        let pending = self.pending.as_deref().map_or(0, |pending| {
            pending
                .iter()
                .map(|r| r.to_string().len() + 1)
                .sum::<usize>()
        });
        let bytes = self.inputs.iter().map(Vec::len).sum::<usize>()
            + self.events.iter().map(String::len).sum::<usize>()
            + self.made.weight()
            + pending;
        (self.inputs.len(), bytes)
    }

    /// Writes the made events as JSON text, redacted, after `events`: what a store does
    /// with a batch before it looks at its events (the writers of both stores do it on
    /// their own thread or task).
    pub fn render(&mut self) {
        if let Some(deferred) = self.made.history.take() {
            match (deferred.segment.encode(), self.checkpoint.as_mut()) {
                (Ok(history), Some(checkpoint)) => {
                    checkpoint.history = history;
                    deferred.outcome.settle(SegmentOutcome::WRITTEN);
                }
                // Refused (a namespace only the history holds, a value with no durable
                // form): the batch goes without its checkpoint, and the run, told so,
                // writes the next one whole from where this one started.
                _ => {
                    self.checkpoint = None;
                    deferred.outcome.settle(SegmentOutcome::REFUSED);
                }
            }
        }
        let made = std::mem::take(&mut self.made.events);
        let redactor = &self.made.redactor;
        (self.events).extend(made.iter().map(|event| event_text(event, redactor)));
    }
}

/// An event's JSON text, scrubbed by `redactor`: as a store holds it.
pub fn event_text(event: &Event, redactor: &Redactor) -> String {
    // Most runs know no secret: then the event goes straight to its text, without the
    // tree of values that redaction walks (serde_json keeps the fields' order either
    // way, so the text is the same).
    if redactor.is_empty() {
        serde_json::to_string(event).unwrap_or_else(|_| "null".to_owned())
    } else {
        redactor.redact_json(event.to_json()).to_string()
    }
}

/// What a run made that its store writes ([`Batch::render`]): its events as it made
/// them, with what scrubs them of secrets, and its checkpoint's history segment.
#[derive(Debug, Clone, Default)]
pub struct Made {
    /// The events, in order.
    pub events: Vec<Event>,
    /// What redacts them.
    pub redactor: Redactor,
    /// The history segment of the batch's checkpoint, to write.
    pub history: Option<Box<DeferredSegment>>,
}

/// A checkpoint's `context_history` segment to write, and where the run learns how
/// that went.
#[derive(Debug, Clone)]
pub struct DeferredSegment {
    /// The entries.
    pub segment: HistorySegment,
    /// Written or refused, once the store's writer got to it.
    pub outcome: Arc<SegmentOutcome>,
}

/// What became of a [`DeferredSegment`]: not written yet, written, or refused.
#[derive(Debug, Default)]
pub struct SegmentOutcome(AtomicU8);

impl SegmentOutcome {
    /// Not written yet.
    pub const PENDING: u8 = 0;
    /// Written into its checkpoint.
    pub const WRITTEN: u8 = 1;
    /// Refused: its checkpoint was left out of the batch.
    pub const REFUSED: u8 = 2;

    /// [`PENDING`](Self::PENDING), [`WRITTEN`](Self::WRITTEN) or
    /// [`REFUSED`](Self::REFUSED).
    pub fn get(&self) -> u8 {
        self.0.load(Ordering::Acquire)
    }

    fn settle(&self, outcome: u8) {
        self.0.store(outcome, Ordering::Release);
    }
}

impl Made {
    /// About the bytes of their text, without writing it: what a run's window of
    /// uncommitted work counts them as. Every event's fixed fields (names, numbers)
    /// are counted as [`EVENT_WEIGHT`] bytes; the ones that carry text of any length
    /// (an error's message, a person's request and answer) add it.
    pub fn weight(&self) -> usize {
        self.events.iter().map(event_weight).sum()
    }
}

/// What an event's fixed fields weigh in a run's window (a journaled event's text is
/// 100–300 bytes without its free text).
pub const EVENT_WEIGHT: usize = 256;

/// What `event` counts for in a run's window ([`Made::weight`]).
pub(crate) fn event_weight(event: &Event) -> usize {
    let free = match &event.kind {
        EventKind::Error { message, .. } => message.len(),
        EventKind::InputRequested { request } => {
            serde_json::to_string(request).map_or(0, |text| text.len())
        }
        EventKind::InputReceived { reason, value, .. } => {
            reason.as_ref().map_or(0, String::len)
                + value.as_ref().map_or(0, |value| value.to_string().len())
        }
        EventKind::ProviderResult {
            error: Some(error), ..
        }
        | EventKind::RunFinished {
            error: Some(error), ..
        }
        | EventKind::AgentFinished {
            error: Some(error), ..
        } => error.message.len(),
        _ => 0,
    };
    EVENT_WEIGHT + free
}

/// The exclusive right to advance one run. Dropping it releases the run; a process that
/// dies releases it too (the OS or the server notices), so a crash never leaves a run
/// locked.
pub trait Lease: Send + Sync + std::fmt::Debug {
    /// The run id.
    fn run_id(&self) -> &str;
}

/// A run's journal: what a durable run needs (`durable.rs`), and what `aplc runs`
/// inspects. SQLite and PostgreSQL implement it; so may a wrapper (the bench's timing
/// store) or an embedder's own store, with no queue.
pub trait RunJournal: Send + Sync + std::fmt::Debug {
    /// Creates a run and takes its lease. An existing id is an error.
    fn create<'a>(&'a self, run: NewRun) -> BoxFuture<'a, Result<Box<dyn Lease>, StoreError>>;
    /// Takes the lease of an existing, unfinished run, or fails with
    /// [`StoreError::Locked`] if another process holds it.
    fn acquire<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Box<dyn Lease>, StoreError>>;
    /// Appends one batch under the lease, in one transaction. Its made events are
    /// written as text ([`Batch::render`]) by the store, preferably off the caller's
    /// thread: that is the point of handing them over unwritten.
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
    /// A run's journal inputs (encoded entries), in order, from input number `from`, at
    /// most `limit`: what a replay of the whole run reads (`durable::EventReader`).
    fn inputs<'a>(
        &'a self,
        id: &'a str,
        from: u64,
        limit: u64,
    ) -> BoxFuture<'a, Result<Vec<Vec<u8>>, StoreError>>;
    /// Storage the run uses, in bytes (inputs, events, checkpoints), for benches.
    fn run_bytes<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<u64, StoreError>>;
    /// Stores `answer` to the pending request `request_id` of the run, unless it has one
    /// already: the first answer wins (`spec/human.md`).
    fn answer<'a>(
        &'a self,
        run_id: &'a str,
        request_id: &'a str,
        answer: serde_json::Value,
    ) -> BoxFuture<'a, Result<Answered, StoreError>>;
    /// The stored answers to the run's pending requests, in the order they were stored.
    fn answers<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<(String, serde_json::Value)>, StoreError>>;
}

/// The most JSON text one stored answer may hold (`aplc_vm::human::MAX_ANSWER_BYTES`).
pub const MAX_ANSWER_BYTES: usize = aplc_vm::human::MAX_ANSWER_BYTES;

/// What [`RunJournal::answer`] did with an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answered {
    /// Stored; the pending requests still without an answer, in order.
    Accepted {
        /// Their ids.
        unanswered: Vec<String>,
    },
    /// No run has this id.
    UnknownRun,
    /// The run waits on no request of this id.
    UnknownRequest,
    /// The request has an answer already.
    AlreadyAnswered,
    /// The run is finished.
    Finished,
}

/// The queue of a service (`aplc serve`, spec/serve.md): only the server needs it. Runs
/// enter it unstarted and are claimed by workers, which then advance them through the
/// [`RunJournal`] of the same store.
pub trait RunQueue: Send + Sync + std::fmt::Debug {
    /// Stores a run as queued, without a lease, and returns its id; or, when the same
    /// agent was given the same idempotency key less than [`IDEMPOTENCY_WINDOW_MS`] ago,
    /// stores nothing and returns the id of the run that key started.
    fn enqueue<'a>(&'a self, run: QueuedRun) -> BoxFuture<'a, Result<Enqueued, StoreError>>;

    /// Claims the oldest unfinished queued run no live worker holds, and takes its lease:
    /// a run never claimed, or one whose worker died. `None` when there is none.
    ///
    /// Runs never claimed come first, found through an index without looking at anyone's
    /// leases; the runs of dead workers are looked for when there is none, and at most
    /// every [`TAKEOVER_SCAN`] besides, so a backlog of new runs never hides them for long
    /// (spec/serve.md).
    fn claim<'a>(&'a self) -> BoxFuture<'a, Result<Option<Claim>, StoreError>>;

    /// Asks for a queued run to be cancelled, wherever it executes: the flag is stored,
    /// and the worker holding the run sees it ([`RunQueue::queue_entry`]).
    fn request_cancel<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), StoreError>>;

    /// A queued run: its summary, status and queue fields.
    fn queue_entry<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<QueueEntry, StoreError>>;

    /// The number of queued runs in each status, for metrics.
    fn queue_counts<'a>(&'a self) -> BoxFuture<'a, Result<QueueCounts, StoreError>>;
}

/// A run store with both faces, journal and queue: what [`open`] returns (SQLite and
/// PostgreSQL have both), for callers that need both from one object (the server's
/// worker claims from the queue, then advances the run through the journal). Implemented
/// for every type that has both.
pub trait RunStore: RunJournal + RunQueue {}

impl<T: RunJournal + RunQueue + ?Sized> RunStore for T {}

/// How long an idempotency key keeps answering with the run it started: 24 hours.
pub const IDEMPOTENCY_WINDOW_MS: i64 = 24 * 60 * 60 * 1000;

/// A run for the queue: what [`RunJournal::create`] stores, and the service's fields.
#[derive(Debug, Clone)]
pub struct QueuedRun {
    /// The run, as `create` would store it (`started_at_ms` is the enqueue time).
    pub run: NewRun,
    /// The name the service knows the agent by (its file name without extension).
    pub agent: String,
    /// The client's idempotency key, if any.
    pub idempotency_key: Option<String>,
    /// The W3C `traceparent` of the request that started the run, kept for tracing.
    pub traceparent: Option<String>,
}

/// What [`RunQueue::enqueue`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enqueued {
    /// A new run, queued under this id.
    New(String),
    /// The idempotency key had started this run already: nothing was stored.
    Existing(String),
}

impl Enqueued {
    /// The run id either way.
    pub fn id(&self) -> &str {
        match self {
            Enqueued::New(id) | Enqueued::Existing(id) => id,
        }
    }
}

/// A run's status: the one vocabulary of the service's API, its logs and metrics,
/// `aplc runs list/show` and the stored outcome's `status` (spec/serve.md, "Statuses").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueueStatus {
    /// Waiting for a worker.
    Queued,
    /// Claimed by a worker (or, after a crash, waiting to be claimed again).
    Running,
    /// Waiting for a person's answers (`spec/human.md`): no worker holds it.
    Waiting,
    /// Finished without a run error.
    Completed,
    /// Finished with a run error other than a cancellation.
    Failed,
    /// Finished because it was cancelled.
    Cancelled,
}

impl QueueStatus {
    /// Every status, in the order the service lists them.
    pub const ALL: [QueueStatus; 6] = [
        QueueStatus::Queued,
        QueueStatus::Running,
        QueueStatus::Waiting,
        QueueStatus::Completed,
        QueueStatus::Failed,
        QueueStatus::Cancelled,
    ];

    /// The status's name in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueStatus::Queued => "queued",
            QueueStatus::Running => "running",
            QueueStatus::Waiting => "waiting",
            QueueStatus::Completed => "completed",
            QueueStatus::Failed => "failed",
            QueueStatus::Cancelled => "cancelled",
        }
    }

    /// True for completed, failed and cancelled.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            QueueStatus::Completed | QueueStatus::Failed | QueueStatus::Cancelled
        )
    }

    /// The final status of a run that ended with `outcome`.
    pub fn of_run(outcome: &aplc_vm::RunOutcome) -> QueueStatus {
        match &outcome.error {
            None => QueueStatus::Completed,
            Some(error) if error.kind == aplc_vm::RunErrorKind::Cancelled => QueueStatus::Cancelled,
            Some(_) => QueueStatus::Failed,
        }
    }

    /// The status of a stored run: [`QueueStatus::of_outcome`] once finished; before,
    /// `waiting` while it waits on requests for a person, else `running` (running now,
    /// or crashed and waiting to be resumed or claimed).
    pub fn of_summary(summary: &RunSummary) -> QueueStatus {
        match (&summary.state, &summary.outcome) {
            (RunState::Finished, Some(outcome)) => QueueStatus::of_outcome(outcome),
            _ if !summary.pending.is_empty() => QueueStatus::Waiting,
            _ => QueueStatus::Running,
        }
    }

    /// The final status a stored outcome means (the driver's `outcome_json`): a run
    /// error of kind `Cancelled` is a cancellation, any other a failure. It reads the
    /// error, not the outcome's `status`, so outcomes stored by older versions (which
    /// said `succeeded` for `completed`, and `failed` for a cancellation) read the same.
    pub fn of_outcome(outcome: &serde_json::Value) -> QueueStatus {
        match outcome.get("error") {
            None | Some(serde_json::Value::Null) => QueueStatus::Completed,
            Some(error) if error.get("kind").and_then(|k| k.as_str()) == Some("Cancelled") => {
                QueueStatus::Cancelled
            }
            Some(_) => QueueStatus::Failed,
        }
    }
}

/// How often a busy worker's claims also look for the runs of dead workers
/// ([`RunQueue::claim`]).
pub const TAKEOVER_SCAN: std::time::Duration = std::time::Duration::from_secs(1);

/// A run [`RunQueue::claim`] handed out: its lease, and what the queue says of it, read in
/// the claim's own transaction.
#[derive(Debug)]
pub struct Claim {
    /// The run's lease.
    pub lease: Box<dyn Lease>,
    /// The name the service knows the agent by.
    pub agent: String,
    /// A cancellation was asked for.
    pub cancel_requested: bool,
    /// The `traceparent` of the request that started it.
    pub traceparent: Option<String>,
    /// The run as stored, read with the claim when it is a new run (nothing journaled),
    /// so starting it needs no [`RunJournal::load`]; `None` for a run taken over, which
    /// the caller loads.
    pub loaded: Option<LoadedRun>,
}

/// How often a store deletes the idempotency keys older than [`IDEMPOTENCY_WINDOW_MS`]
/// (the first enqueue after an hour does it, in its own transaction).
pub const IDEMPOTENCY_PURGE: std::time::Duration = std::time::Duration::from_secs(60 * 60);

/// A queued run as the service shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueEntry {
    /// The run's summary row (totals, outcome).
    pub summary: RunSummary,
    /// The name the service knows the agent by.
    pub agent: String,
    /// Queued, running, or how it ended.
    pub status: QueueStatus,
    /// A cancellation was asked for.
    pub cancel_requested: bool,
    /// The `traceparent` of the request that started it.
    pub traceparent: Option<String>,
}

/// Runs per status in the queue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueCounts {
    /// Counts by status; a status with no run may be missing.
    pub by_status: Vec<(QueueStatus, u64)>,
}

impl QueueCounts {
    /// The count of one status.
    pub fn get(&self, status: QueueStatus) -> u64 {
        self.by_status
            .iter()
            .find(|(s, _)| *s == status)
            .map_or(0, |(_, n)| *n)
    }
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
    /// Another process holds a lock the store waited for in vain (SQLite's
    /// `database is locked`, once its busy timeout and the store's retries ran out).
    #[error("the store is busy: {0}")]
    Busy(String),
    /// Any other database error.
    #[error("store error: {0}")]
    Database(String),
    /// Something to store is over its limit (an answer past [`MAX_ANSWER_BYTES`]).
    #[error("too large: {0}")]
    TooLarge(String),
}

/// The secrets a PostgreSQL URL may carry: the password of its user info and a
/// `password=` query parameter, percent-decoded too (the server sees the decoded form,
/// and so may an error message).
pub(crate) fn url_secrets(url: &str) -> Vec<String> {
    let mut secrets = Vec::new();
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    if let Some((userinfo, _)) = authority.rsplit_once('@')
        && let Some((_, password)) = userinfo.split_once(':')
    {
        secrets.push(password.to_string());
    }
    if let Some((_, query)) = rest.split_once('?') {
        for pair in query.split('&') {
            if let Some(("password", value)) = pair.split_once('=') {
                secrets.push(value.to_string());
            }
        }
    }
    let decoded: Vec<String> = secrets.iter().map(|s| percent_decode(s)).collect();
    secrets.extend(decoded);
    secrets.retain(|s| !s.is_empty());
    // Longest first, so a secret that contains another is replaced whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets.dedup();
    secrets
}

/// `text` with every secret of `url` replaced by `***`.
fn redact_with(url: &str, text: &str) -> String {
    let mut text = text.to_string();
    for secret in url_secrets(url) {
        text = text.replace(&secret, "***");
    }
    text
}

/// The URL with its password (user info or `password=` parameter) shown as `***`.
fn redact_url(url: &str) -> String {
    redact_with(url, url)
}

pub(crate) fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(first_input: u64, inputs: usize, checkpoint: bool) -> Batch {
        Batch {
            made: Default::default(),
            first_input,
            inputs: (0..inputs)
                .map(|i| vec![first_input as u8 + i as u8])
                .collect(),
            events: vec![format!("{first_input}")],
            checkpoint: checkpoint.then(|| StoredCheckpoint {
                inputs: first_input,
                history_start: 0,
                history: Vec::new(),
                state: None,
            }),
            steps: first_input,
            outcome: None,
            pending: None,
        }
    }

    /// The later batch's pending requests replace the earlier's; `None` keeps them. Their
    /// JSON counts in the batch's bytes (the driver's bound on what waits for a commit).
    #[test]
    fn a_batchs_pending_requests_are_the_latest_and_count_in_its_size() {
        let request = serde_json::json!({"id": "1-1", "kind": "input", "prompt": "?"});
        let mut first = batch(0, 1, false);
        let plain = first.size().1;
        first.pending = Some(vec![request.clone()]);
        assert!(first.size().1 > plain + request.to_string().len() - 1);
        assert!(first.absorb(batch(1, 1, false)).is_none());
        assert_eq!(first.pending, Some(vec![request]));
        let mut cleared = batch(2, 0, false);
        cleared.pending = Some(Vec::new());
        assert!(first.absorb(cleared).is_none());
        assert_eq!(first.pending, Some(Vec::new()));
    }

    /// Groups merge as if appended one after the other, but never two checkpoints (each
    /// carries its own history segment) and nothing after an outcome.
    #[test]
    fn a_batch_absorbs_the_next_unless_both_checkpoint() {
        let mut first = batch(0, 2, true);
        assert!(first.absorb(batch(2, 3, false)).is_none());
        assert_eq!(first.first_input, 0);
        assert_eq!(
            first.inputs,
            vec![vec![0], vec![1], vec![2], vec![3], vec![4]]
        );
        assert_eq!(first.events, ["0", "2"]);
        assert_eq!(first.steps, 2);
        assert_eq!(first.checkpoint.as_ref().map(|c| c.inputs), Some(0));
        let refused = first.absorb(batch(5, 1, true)).expect("two checkpoints");
        assert_eq!(refused.first_input, 5);
        assert_eq!(first.inputs.len(), 5);

        let mut plain = batch(0, 1, false);
        assert!(plain.absorb(batch(1, 1, true)).is_none());
        assert_eq!(plain.checkpoint.as_ref().map(|c| c.inputs), Some(1));
        plain.outcome = Some(serde_json::json!({}));
        assert!(plain.absorb(batch(2, 1, false)).is_some());
    }

    /// One vocabulary (issue #22): outcomes stored before it said `succeeded`, and
    /// `failed` for a cancellation; they read as `completed` and `cancelled`.
    #[test]
    fn stored_outcomes_of_any_version_read_in_one_vocabulary() {
        let summary = |state, outcome| RunSummary {
            id: "r".into(),
            agent: "a.apl".into(),
            bundle_hash: String::new(),
            state,
            steps: 1,
            started_at_ms: 0,
            updated_at_ms: 0,
            inputs: 0,
            events: 0,
            outcome,
            pending: Vec::new(),
        };
        let cancelled = serde_json::json!({"status": "failed", "error": {"kind": "Cancelled"}});
        for (outcome, status) in [
            (
                serde_json::json!({"status": "succeeded", "error": null}),
                "completed",
            ),
            (
                serde_json::json!({"status": "completed", "error": null}),
                "completed",
            ),
            (cancelled, "cancelled"),
            (
                serde_json::json!({"status": "failed", "error": {"kind": "Timeout"}}),
                "failed",
            ),
        ] {
            let stored = summary(RunState::Finished, Some(outcome));
            assert_eq!(QueueStatus::of_summary(&stored).as_str(), status);
        }
        let unfinished = summary(RunState::Running, None);
        assert_eq!(QueueStatus::of_summary(&unfinished).as_str(), "running");
    }

    #[test]
    fn parses_both_schemes() {
        assert_eq!(
            StoreUrl::parse("sqlite:runs.db").unwrap(),
            StoreUrl::Sqlite("runs.db".into())
        );
        assert_eq!(
            StoreUrl::parse("sqlite:///tmp/runs.db").unwrap(),
            StoreUrl::Sqlite("/tmp/runs.db".into())
        );
        assert!(matches!(
            StoreUrl::parse("postgresql://u@h/db").unwrap(),
            StoreUrl::Postgres(_)
        ));
        assert!(matches!(
            StoreUrl::parse("sqlite:"),
            Err(StoreError::Url(_))
        ));
    }

    #[test]
    fn a_password_is_never_shown() {
        let url = StoreUrl::parse("postgres://me:s3cr%65t@host:5432/db?password=other").unwrap();
        for text in [format!("{url}"), format!("{url:?}")] {
            assert!(!text.contains("s3cr"), "{text}");
            assert!(!text.contains("other"), "{text}");
            assert!(text.contains("me:***@host"), "{text}");
        }
        let err = StoreUrl::parse("mysql://me:hunter2@host/db")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("hunter2"), "{err}");
        assert!(err.contains("mysql"), "{err}");
        assert_eq!(
            redact_with("postgres://u:pw@h/d", "failed for pw and secret"),
            "failed for *** and secret"
        );
        assert!(!redact_with("postgres://u:s3cr%65t@h/d", "s3cret").contains("s3cr"));
    }
}

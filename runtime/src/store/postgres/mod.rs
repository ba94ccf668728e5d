//! The PostgreSQL run store: for several processes or machines sharing runs.
//!
//! Plain TCP, no TLS: use it on loopback or a trusted network (spec/durability.md).
//!
//! **Writes** go through one connection owned by a writer task, with group commit as in
//! the SQLite store: every job queued when the task is free runs in its own savepoint of
//! one transaction, so many runs appending at once share one commit (one fsync on the
//! server). **Reads** use a second connection, each one statement (one snapshot, no
//! transaction), so concurrent reads share it, pipelined. The service's **queue**
//! (enqueue, cancel, takeover; spec/serve.md) writes on a fourth, in short transactions
//! of its own.
//!
//! **Leases** are session-level advisory locks on a third connection, shared by the
//! store's leases so a hundred runs do not need a hundred connections. The server
//! releases them when that connection closes, which the kernel does when the process
//! dies. A session may take the same advisory lock twice, so the store also keeps the
//! set of run ids it holds, and refuses a second lease of one of them itself. One task
//! owns the lock connection and runs every lock and unlock in the order asked, so an
//! unlock queued by a dropped lease (`Drop` cannot await) never overtakes a later lock.
//! The claim of a new run is one statement on that connection too, which finds the run,
//! takes its lock and marks it claimed in one round trip.
//!
//! Every error message is passed through the URL's redaction: a password never leaves.
//!
//! Here: the store, opening it, its prepared statements, summary rows and errors.
//! `schema.rs` migrates, `lease.rs` holds the advisory locks and the lock task,
//! `writer.rs` is the writer task (group commit), `journal.rs` implements
//! [`RunJournal`](super::RunJournal) and `queue.rs` [`RunQueue`](super::RunQueue).

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::{Mutex, mpsc};
use tokio_postgres::{Client, GenericClient, NoTls, Statement};

use super::{
    Every, IDEMPOTENCY_PURGE, RunState, RunStore, RunSummary, StoreError, TAKEOVER_SCAN, count,
    json_column, redact_url, redact_with,
};
use lease::{Locks, lock_loop};
use queue::PendingEnqueue;
use schema::migrate;
use writer::{Job, write_loop};

/// The columns [`summary_row`] reads, in order; a macro, so that `CLAIM_NEW` can `concat!`
/// them (defined before the modules: a `macro_rules!` is in scope from its definition on).
macro_rules! summary_columns {
    () => {
        "runs.id, runs.agent, runs.bundle_hash, runs.state, runs.steps, runs.started_at_ms, \
         runs.updated_at_ms, runs.input_count, runs.event_count, runs.outcome, runs.pending"
    };
}

/// [`summary_columns!`], for the queries that `format!` it in.
const SUMMARY_COLUMNS: &str = summary_columns!();

/// How many columns [`SUMMARY_COLUMNS`] has: a query's own columns come after them.
const SUMMARY_LEN: usize = 11;

mod journal;
mod lease;
mod queue;
mod schema;
mod writer;

/// The PostgreSQL store.
pub(super) struct PgStore {
    url: Arc<str>,
    writer: mpsc::UnboundedSender<Job>,
    /// Reads: single statements, so they need no transaction and share the connection
    /// (tokio-postgres pipelines the queries of concurrent callers).
    reader: Client,
    /// The reader's prepared statements.
    reader_statements: Statements,
    /// The queue's writes (enqueue, claim, cancel): short transactions of their own, so
    /// a claim's row locks never wait behind a group commit.
    queue: Mutex<Client>,
    /// Enqueues waiting for the queue connection: whoever gets it next commits them all
    /// in one transaction (one fsync for a burst of submits).
    enqueues: std::sync::Mutex<Vec<PendingEnqueue>>,
    locks: Arc<Locks>,
    /// When claims last looked for the runs of dead workers.
    takeover: Every,
    /// When the expired idempotency keys were last deleted.
    purge: Every,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("url", &redact_url(&self.url))
            .finish_non_exhaustive()
    }
}

/// A connection's prepared statements, by text. A query given as text costs a Parse
/// and its round trip on every call (tokio-postgres prepares it unnamed); a statement
/// prepared once saves that round trip on the claim and load of every run.
#[derive(Default)]
struct Statements(std::sync::Mutex<std::collections::HashMap<String, Statement>>);

impl Statements {
    async fn get(
        &self,
        client: &impl GenericClient,
        sql: &str,
    ) -> Result<Statement, tokio_postgres::Error> {
        if let Some(statement) = self.lock().get(sql) {
            return Ok(statement.clone());
        }
        let statement = client.prepare(sql).await?;
        self.lock().insert(sql.to_string(), statement.clone());
        Ok(statement)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Statement>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl PgStore {
    /// Connects, checks that the database is an aplc store (or has none of its tables),
    /// migrates it, and starts the writer and unlock tasks.
    pub(super) async fn open(url: &str) -> Result<PgStore, StoreError> {
        let url: Arc<str> = Arc::from(url);
        let mut writer = connect(&url).await?;
        migrate(&url, &mut writer).await?;
        let reader = connect(&url).await?;
        let lock_client = connect(&url).await?;
        // The lock connection's only writes are claims' `claimed` flags, which need no
        // fsync: the advisory lock makes the claim (see `CLAIM_NEW`).
        lock_client
            .batch_execute("SET synchronous_commit = off")
            .await
            .map_err(|e| db_error(&url, &e))?;
        let queue = connect(&url).await?;
        let (jobs, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_loop(Arc::clone(&url), writer, rx));
        let (ops, pending) = mpsc::unbounded_channel();
        tokio::spawn(lock_loop(Arc::clone(&url), lock_client, pending));
        let locks = Arc::new(Locks {
            held: std::sync::Mutex::new(HashSet::new()),
            ops,
        });
        Ok(PgStore {
            url,
            writer: jobs,
            reader,
            reader_statements: Statements::default(),
            queue: Mutex::new(queue),
            enqueues: std::sync::Mutex::new(Vec::new()),
            locks,
            takeover: Every::new(TAKEOVER_SCAN),
            purge: Every::new(IDEMPOTENCY_PURGE),
        })
    }

    fn error(&self, error: tokio_postgres::Error) -> StoreError {
        db_error(&self.url, &error)
    }

    /// The row `sql` (a statement on the reader, prepared once) returns for run `id`;
    /// [`StoreError::NotFound`] when there is none.
    async fn read_one(&self, sql: &str, id: &str) -> Result<tokio_postgres::Row, StoreError> {
        let statement = self
            .reader_statements
            .get(&self.reader, sql)
            .await
            .map_err(|e| self.error(e))?;
        self.reader
            .query_opt(&statement, &[&id])
            .await
            .map_err(|e| self.error(e))?
            .ok_or_else(|| StoreError::NotFound(id.to_string()))
    }
}

fn summary_row(row: &tokio_postgres::Row) -> Result<RunSummary, StoreError> {
    summary_row_at(row, 0)
}

/// The summary in the columns of [`SUMMARY_COLUMNS`], starting at column `at`.
fn summary_row_at(row: &tokio_postgres::Row, at: usize) -> Result<RunSummary, StoreError> {
    let state: String = row.get(at + 3);
    let outcome: Option<String> = row.get(at + 9);
    let pending: Option<String> = row.get(at + 10);
    Ok(RunSummary {
        id: row.get(at),
        agent: row.get(at + 1),
        bundle_hash: row.get(at + 2),
        state: RunState::from_column(&state)?,
        steps: count(row.get(at + 4), "step count")?,
        started_at_ms: row.get(at + 5),
        updated_at_ms: row.get(at + 6),
        inputs: count(row.get(at + 7), "input count")?,
        events: count(row.get(at + 8), "event count")?,
        outcome: outcome
            .as_deref()
            .map(|o| json_column(o, "the outcome"))
            .transpose()?,
        pending: crate::store::pending_column(pending.as_deref())?,
    })
}

async fn read_summary(
    url: &str,
    client: &impl GenericClient,
    id: &str,
) -> Result<RunSummary, StoreError> {
    let row = client
        .query_opt(
            &format!("SELECT {SUMMARY_COLUMNS} FROM runs WHERE id = $1"),
            &[&id],
        )
        .await
        .map_err(|e| db_error(url, &e))?
        .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
    summary_row(&row)
}

/// Opens a connection; the connection's task runs until the client is dropped.
async fn connect(url: &str) -> Result<Client, StoreError> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .map_err(|e| StoreError::Open(redact_with(url, &error_text(&e))))?;
    tokio::spawn(async move {
        // Its error reaches the client as a closed connection on the next query.
        let _ = connection.await;
    });
    Ok(client)
}

/// The same failure again, for each enqueue of a group whose commit failed.
fn copy_error(error: &StoreError) -> StoreError {
    match error {
        StoreError::Database(message) => StoreError::Database(message.clone()),
        StoreError::Open(message) => StoreError::Open(message.clone()),
        other => StoreError::Database(other.to_string()),
    }
}

fn db_error(url: &str, error: &tokio_postgres::Error) -> StoreError {
    StoreError::Database(redact_with(url, &error_text(error)))
}

/// The server's own message when there is one (the wrapper's `Display` is just "db
/// error"), else the client's.
fn error_text(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => error.to_string(),
    }
}

/// Opens (creating and migrating if needed) the PostgreSQL store at `url`
/// ([`super::open`]).
pub(super) async fn open(url: &str) -> Result<Arc<dyn RunStore>, StoreError> {
    Ok(Arc::new(PgStore::open(url).await?))
}

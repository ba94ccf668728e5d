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

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::{Mutex, mpsc, oneshot};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, GenericClient, NoTls, Statement, Transaction};

use super::{
    Batch, Claim, Enqueued, Every, IDEMPOTENCY_PURGE, IDEMPOTENCY_WINDOW_MS, Lease, LoadedRun,
    MAGIC, NewRun, QueueCounts, QueueEntry, QueueStatus, QueuedRun, RunState, RunStore, RunSummary,
    SCHEMA_VERSION, Scan, StoreError, StoredCheckpoint, TAKEOVER_SCAN, claim_order, count, db_int,
    json_column, now_ms, redact_url, redact_with,
};
use crate::driver::BoxFuture;

/// Migrations, by the version they lead to.
const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        "CREATE TABLE aplc_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
     CREATE TABLE bundles (hash TEXT PRIMARY KEY, bytes BYTEA NOT NULL);
     CREATE TABLE runs (
         id TEXT PRIMARY KEY,
         agent TEXT NOT NULL,
         bundle_hash TEXT NOT NULL,
         state TEXT NOT NULL,
         steps BIGINT NOT NULL,
         started_at_ms BIGINT NOT NULL,
         updated_at_ms BIGINT NOT NULL,
         options TEXT NOT NULL,
         outcome TEXT,
         input_count BIGINT NOT NULL,
         event_count BIGINT NOT NULL
     );
     CREATE INDEX runs_by_start ON runs (started_at_ms DESC, id DESC);
     CREATE TABLE inputs (
         run_id TEXT NOT NULL, seq BIGINT NOT NULL, bytes BYTEA NOT NULL,
         PRIMARY KEY (run_id, seq)
     );
     CREATE TABLE events (
         run_id TEXT NOT NULL, seq BIGINT NOT NULL, json TEXT NOT NULL,
         PRIMARY KEY (run_id, seq)
     );
     CREATE TABLE checkpoints (
         run_id TEXT NOT NULL, seq BIGINT NOT NULL, inputs BIGINT NOT NULL,
         history_start BIGINT NOT NULL, history BYTEA NOT NULL, state BYTEA,
         PRIMARY KEY (run_id, seq)
     );",
    ),
    (
        2,
        // The service's queue (spec/serve.md), as in SQLite's version 2.
        "CREATE TABLE run_queue (
         run_id TEXT PRIMARY KEY,
         agent TEXT NOT NULL,
         enqueued_at_ms BIGINT NOT NULL,
         claimed BOOLEAN NOT NULL DEFAULT FALSE,
         final_status TEXT,
         cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
         traceparent TEXT
     );
     CREATE INDEX run_queue_open ON run_queue (enqueued_at_ms, run_id)
         WHERE final_status IS NULL;
     CREATE TABLE idempotency_keys (
         agent TEXT NOT NULL,
         key TEXT NOT NULL,
         run_id TEXT NOT NULL,
         created_at_ms BIGINT NOT NULL,
         PRIMARY KEY (agent, key)
     );",
    ),
];

/// The tables of every version: a database holding any of them without `aplc_meta` is
/// not ours.
const TABLES: &[&str] = &[
    "aplc_meta",
    "bundles",
    "runs",
    "inputs",
    "events",
    "checkpoints",
    "run_queue",
    "idempotency_keys",
];

/// The advisory lock (transaction-level) that serializes migrations between processes.
const MIGRATION_LOCK: i64 = 0x6170_6c63_0000_0001;

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

/// An enqueue waiting for a group commit, and where its result goes.
type PendingEnqueue = (QueuedRun, oneshot::Sender<Result<Enqueued, StoreError>>);

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("url", &redact_url(&self.url))
            .finish_non_exhaustive()
    }
}

/// The run ids whose advisory locks this store holds, and the way to the lock task.
struct Locks {
    held: std::sync::Mutex<HashSet<String>>,
    ops: mpsc::UnboundedSender<LockOp>,
}

/// What the lock task does, in order.
enum LockOp {
    /// `pg_try_advisory_lock`: whether it was taken.
    Lock(String, oneshot::Sender<Result<bool, StoreError>>),
    /// [`CLAIM_NEW`]: the oldest new run, marked claimed, and whether its lock was taken.
    ClaimNew(oneshot::Sender<Result<Option<NewClaim>, StoreError>>),
    /// `pg_advisory_unlock`.
    Unlock(String),
}

/// A lease: one advisory lock on the store's lock connection.
struct PgLease {
    run_id: String,
    locks: Arc<Locks>,
    /// Whether dropping it must unlock: not when the server said the lock was not taken.
    unlock_on_drop: bool,
}

impl Drop for PgLease {
    fn drop(&mut self) {
        if let Ok(mut held) = self.locks.held.lock() {
            held.remove(&self.run_id);
        }
        if self.unlock_on_drop {
            // If the lock task is gone, so is its connection, and the lock with it. A new
            // lease of this run taken before the unlock runs is still right: the session
            // then holds the lock twice, and the unlock takes one away.
            let _ = self.locks.ops.send(LockOp::Unlock(self.run_id.clone()));
        }
    }
}

impl std::fmt::Debug for PgLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLease")
            .field("run_id", &self.run_id)
            .finish_non_exhaustive()
    }
}

impl Lease for PgLease {
    fn run_id(&self) -> &str {
        &self.run_id
    }
}

/// A write for the writer task, with where to send its result.
struct Job {
    work: Work,
    reply: oneshot::Sender<Result<(), StoreError>>,
}

enum Work {
    Create(NewRun),
    Append(String, Batch),
}

/// The columns [`summary_row`] reads, in order; a macro, so that `CLAIM_NEW` can `concat!`
/// them.
macro_rules! summary_columns {
    () => {
        "runs.id, runs.agent, runs.bundle_hash, runs.state, runs.steps, runs.started_at_ms, \
         runs.updated_at_ms, runs.input_count, runs.event_count, runs.outcome"
    };
}

/// [`summary_columns!`], for the queries that `format!` it in.
const SUMMARY_COLUMNS: &str = summary_columns!();

/// Claims the oldest run never claimed, in one statement on the lock connection (whose
/// session then holds the run's advisory lock). The candidate is found through the index
/// of open runs, passing over the few running ones at its head, without looking at
/// anyone's locks; `SKIP LOCKED` passes over a row another claim is taking this instant.
/// Its lock is tried on that one row (the `LIMIT` is applied before the lock function:
/// the materialized CTE) and the row is marked claimed either way: a lock that another
/// session holds means the run is someone's already (a `claimed` flag lost with an
/// asynchronous commit), and the next claim passes over it.
const CLAIM_NEW: &str = concat!(
    "WITH candidate AS (
         SELECT run_id FROM run_queue
         WHERE final_status IS NULL AND NOT claimed
         ORDER BY enqueued_at_ms, run_id
         LIMIT 1
         FOR UPDATE SKIP LOCKED),
     attempt AS MATERIALIZED (
         SELECT run_id,
                pg_try_advisory_lock(hashtextextended('aplc-run:' || run_id, 0)) AS locked
         FROM candidate)
     UPDATE run_queue q SET claimed = TRUE
     FROM attempt
     LEFT JOIN runs ON runs.id = attempt.run_id
     LEFT JOIN bundles b ON b.hash = runs.bundle_hash
     WHERE q.run_id = attempt.run_id
     RETURNING q.run_id, attempt.locked, q.agent, q.cancel_requested, q.traceparent, ",
    summary_columns!(),
    ", b.bytes, runs.options"
);

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

/// A row [`CLAIM_NEW`] returned.
struct NewClaim {
    id: String,
    locked: bool,
    agent: String,
    cancel_requested: bool,
    traceparent: Option<String>,
    /// The run as stored, when nothing is journaled (the statement read its row: a run
    /// with a journal is loaded afterwards).
    loaded: Option<LoadedRun>,
}

impl NewClaim {
    fn of_row(url: &str, row: &tokio_postgres::Row) -> Result<NewClaim, StoreError> {
        let error = |e: tokio_postgres::Error| db_error(url, &e);
        Ok(NewClaim {
            id: row.try_get(0).map_err(error)?,
            locked: row.try_get(1).map_err(error)?,
            agent: row.try_get(2).map_err(error)?,
            cancel_requested: row.try_get(3).map_err(error)?,
            traceparent: row.try_get(4).map_err(error)?,
            // A run whose row does not read is claimed all the same (the statement took
            // its lock): the worker's own load fails, and it ends the run failed.
            loaded: unstarted_run(row).ok().flatten(),
        })
    }
}

/// The run [`CLAIM_NEW`] read (its columns from the sixth on), if it has nothing
/// journaled: its load is its row, its bundle and its options.
fn unstarted_run(row: &tokio_postgres::Row) -> Result<Option<LoadedRun>, StoreError> {
    // No run row (a damaged store): `RunStore::load` reports it.
    if row.get::<_, Option<String>>(5).is_none() {
        return Ok(None);
    }
    let summary = summary_row_at(row, 5)?;
    if summary.inputs > 0 || summary.events > 0 {
        return Ok(None);
    }
    let (Some(bundle), Some(options)) = (
        row.get::<_, Option<Vec<u8>>>(15),
        row.get::<_, Option<String>>(16),
    ) else {
        return Ok(None);
    };
    Ok(Some(LoadedRun {
        events: 0,
        options: json_column(&options, "the run options")?,
        summary,
        bundle,
        checkpoints: Vec::new(),
        inputs: Vec::new(),
    }))
}

/// Claimed runs no live session holds the advisory lock of (a worker's locks vanish with
/// its connection), oldest first.
const CLAIM_ABANDONED: &str = "WITH held AS (
         SELECT (l.classid::BIGINT << 32) | l.objid::BIGINT AS key
         FROM pg_locks l
         WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))
     SELECT q.run_id FROM run_queue q
     WHERE q.final_status IS NULL AND q.claimed
       AND hashtextextended('aplc-run:' || q.run_id, 0) NOT IN (SELECT key FROM held)
     ORDER BY q.enqueued_at_ms, q.run_id
     LIMIT 16
     FOR UPDATE OF q SKIP LOCKED";

/// The advisory lock key of a run: `hashtextextended` is stable across server versions
/// (hash partitioning relies on it), so every process computes the same key.
const LOCK_KEY: &str = "hashtextextended('aplc-run:' || $1, 0)";

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

    fn pending_enqueues(&self) -> std::sync::MutexGuard<'_, Vec<PendingEnqueue>> {
        self.enqueues.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Commits `batch` in one transaction and sends each enqueue its result. A failed
    /// commit fails them all: none was stored.
    ///
    /// Enqueues without an idempotency key (the bulk of a burst) are stored together: one
    /// statement for their bundles and one for their runs and queue rows, whatever their
    /// number, where a statement each cost a round trip per run (1,000 submits took a
    /// second). An id that exists is refused alone. Enqueues with a key run one at a
    /// time, each under a savepoint of its own, since the key decides what they do.
    async fn enqueue_batch(&self, client: &mut Client, batch: Vec<PendingEnqueue>) {
        let mut results: Vec<Option<Result<Enqueued, StoreError>>> =
            batch.iter().map(|_| None).collect();
        let committed = async {
            let mut tx = client.transaction().await.map_err(|e| self.error(e))?;
            let mut plain = Vec::new();
            let mut ids = HashSet::new();
            for (index, (run, _)) in batch.iter().enumerate() {
                if run.idempotency_key.is_some() {
                    let savepoint = tx.savepoint("enqueue").await.map_err(|e| self.error(e))?;
                    let result = enqueue_run(&self.url, &savepoint, run).await;
                    if result.is_ok() {
                        savepoint.commit().await.map_err(|e| self.error(e))?;
                    } else {
                        savepoint.rollback().await.map_err(|e| self.error(e))?;
                    }
                    results[index] = Some(result);
                } else if !ids.insert(run.run.id.as_str()) {
                    results[index] = Some(Err(StoreError::Exists(run.run.id.clone())));
                } else {
                    plain.push(index);
                }
            }
            let runs: Vec<&QueuedRun> = plain.iter().map(|i| &batch[*i].0).collect();
            let stored = enqueue_runs(&self.url, &tx, &runs).await?;
            for index in plain {
                let id = &batch[index].0.run.id;
                results[index] = Some(if stored.contains(id) {
                    Ok(Enqueued::New(id.clone()))
                } else {
                    Err(StoreError::Exists(id.clone()))
                });
            }
            tx.commit().await.map_err(|e| self.error(e))
        }
        .await;
        match committed {
            Ok(()) => {
                for ((_, done), result) in batch.into_iter().zip(results) {
                    let result = result.unwrap_or_else(|| {
                        Err(StoreError::Database("the enqueue was not stored".into()))
                    });
                    let _ = done.send(result);
                }
            }
            Err(e) => {
                for (_, done) in batch {
                    let _ = done.send(Err(copy_error(&e)));
                }
            }
        }
    }

    /// Takes the advisory lock of run `id`, or fails with [`StoreError::Locked`].
    async fn lock(&self, id: &str) -> Result<PgLease, StoreError> {
        {
            let mut held = self.locks.held.lock().map_err(|_| {
                StoreError::Database("the store's table of leases was poisoned".into())
            })?;
            if !held.insert(id.to_string()) {
                return Err(StoreError::Locked(id.to_string()));
            }
        }
        // From here on, dropping `lease` undoes the insert, and unlocks unless told the
        // lock was not taken: a call cancelled while the server takes the lock leaves an
        // unlock queued behind it.
        let mut lease = PgLease {
            run_id: id.to_string(),
            locks: Arc::clone(&self.locks),
            unlock_on_drop: true,
        };
        let (reply, answer) = oneshot::channel();
        let stopped = || StoreError::Database("the store's lock task has stopped".into());
        self.locks
            .ops
            .send(LockOp::Lock(id.to_string(), reply))
            .map_err(|_| stopped())?;
        match answer.await.map_err(|_| stopped())? {
            Ok(true) => Ok(lease),
            Ok(false) => {
                lease.unlock_on_drop = false;
                Err(StoreError::Locked(id.to_string()))
            }
            Err(e) => {
                // The lock connection failed: it holds no lock any more.
                lease.unlock_on_drop = false;
                Err(e)
            }
        }
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

    /// Claims the oldest new run ([`CLAIM_NEW`]): one round trip on the lock connection.
    async fn claim_new(&self) -> Result<Option<Claim>, StoreError> {
        let stopped = || StoreError::Database("the store's lock task has stopped".into());
        // Each pass marks a run claimed, so this ends; the bound only caps one call.
        for _ in 0..64 {
            let (reply, answer) = oneshot::channel();
            self.locks
                .ops
                .send(LockOp::ClaimNew(reply))
                .map_err(|_| stopped())?;
            let Some(claim) = answer.await.map_err(|_| stopped())?? else {
                return Ok(None);
            };
            if !claim.locked {
                continue;
            }
            let fresh = self
                .locks
                .held
                .lock()
                .map_err(|_| {
                    StoreError::Database("the store's table of leases was poisoned".into())
                })?
                .insert(claim.id.clone());
            if !fresh {
                // This store holds the run already (a lease of its own, so the lock is now
                // taken twice): unlock once, which leaves that lease's lock.
                let _ = self.locks.ops.send(LockOp::Unlock(claim.id));
                continue;
            }
            // No await since the answer: from here the lease owns the lock and `held`.
            let lease = PgLease {
                run_id: claim.id.clone(),
                locks: Arc::clone(&self.locks),
                unlock_on_drop: true,
            };
            return Ok(Some(Claim {
                lease: Box::new(lease),
                agent: claim.agent,
                cancel_requested: claim.cancel_requested,
                traceparent: claim.traceparent,
                loaded: claim.loaded,
            }));
        }
        Ok(None)
    }

    /// Claims the first run [`CLAIM_ABANDONED`] finds whose advisory lock it can take.
    async fn claim_abandoned(&self) -> Result<Option<Claim>, StoreError> {
        let mut client = self.queue.lock().await;
        let tx = client.transaction().await.map_err(|e| self.error(e))?;
        // The `claimed` flag is only what the API shows (queued or running) and which scan
        // finds the run: the advisory lock makes the claim, and a crash drops both. So the
        // claim's commit does not wait for its fsync.
        tx.batch_execute("SET LOCAL synchronous_commit = off")
            .await
            .map_err(|e| self.error(e))?;
        let rows = tx
            .query(CLAIM_ABANDONED, &[])
            .await
            .map_err(|e| self.error(e))?;
        for row in rows {
            let id: String = row.get(0);
            let lease = match self.lock(&id).await {
                Ok(lease) => lease,
                Err(StoreError::Locked(_)) => continue,
                Err(e) => return Err(e),
            };
            // Locked first, then checked: a run that finished meanwhile is skipped.
            let open = tx
                .query_opt(
                    "UPDATE run_queue SET claimed = TRUE
                     WHERE run_id = $1 AND final_status IS NULL
                     RETURNING agent, cancel_requested, traceparent",
                    &[&id],
                )
                .await
                .map_err(|e| self.error(e))?;
            let Some(open) = open else { continue };
            tx.commit().await.map_err(|e| self.error(e))?;
            return Ok(Some(Claim {
                lease: Box::new(lease),
                agent: open.get(0),
                cancel_requested: open.get(1),
                traceparent: open.get(2),
                loaded: None,
            }));
        }
        tx.commit().await.map_err(|e| self.error(e))?;
        Ok(None)
    }

    /// Queues a job for the writer task and waits for its answer.
    async fn write(&self, work: Work) -> Result<(), StoreError> {
        let stopped = || StoreError::Database("the store's writer task has stopped".into());
        let (reply, answer) = oneshot::channel();
        self.writer
            .send(Job { work, reply })
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

impl RunStore for PgStore {
    fn create<'a>(&'a self, run: NewRun) -> BoxFuture<'a, Result<Box<dyn Lease>, StoreError>> {
        Box::pin(async move {
            let lease = self.lock(&run.id).await?;
            self.write(Work::Create(run)).await?;
            Ok(Box::new(lease) as Box<dyn Lease>)
        })
    }

    fn acquire<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Box<dyn Lease>, StoreError>> {
        Box::pin(async move {
            // Locked first, then checked: a run that finishes in between is seen finished.
            let lease = self.lock(id).await?;
            if self.summary(id).await?.state == RunState::Finished {
                return Err(StoreError::Finished(id.to_string()));
            }
            Ok(Box::new(lease) as Box<dyn Lease>)
        })
    }

    fn append<'a>(
        &'a self,
        lease: &'a dyn Lease,
        batch: Batch,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let id = lease.run_id().to_string();
        Box::pin(async move { self.write(Work::Append(id, batch)).await })
    }

    fn load<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<LoadedRun, StoreError>> {
        Box::pin(async move {
            // One statement, so one snapshot and one round trip (a claim's load waits for
            // no other read's transaction).
            let row = self
                .read_one(
                    &format!(
                        "SELECT {SUMMARY_COLUMNS}, b.bytes, runs.options,
                                c.inputs, c.starts, c.histories, c.states,
                                (SELECT array_agg(i.bytes ORDER BY i.seq) FROM inputs i
                                 WHERE i.run_id = runs.id
                                   AND i.seq >= COALESCE((SELECT k.inputs FROM checkpoints k
                                                          WHERE k.run_id = runs.id
                                                          ORDER BY k.seq DESC LIMIT 1), 0))
                         FROM runs
                         LEFT JOIN bundles b ON b.hash = runs.bundle_hash
                         CROSS JOIN LATERAL (
                             SELECT array_agg(k.inputs ORDER BY k.seq) AS inputs,
                                    array_agg(k.history_start ORDER BY k.seq) AS starts,
                                    array_agg(k.history ORDER BY k.seq) AS histories,
                                    array_agg(k.state ORDER BY k.seq) AS states
                             FROM checkpoints k WHERE k.run_id = runs.id) c
                         WHERE runs.id = $1"
                    ),
                    id,
                )
                .await?;
            let summary = summary_row(&row)?;
            let bundle: Vec<u8> = row.get::<_, Option<Vec<u8>>>(10).ok_or_else(|| {
                StoreError::Corrupt(format!("the bundle of run `{id}` is missing"))
            })?;
            let options: String = row.get(11);
            let counts: Vec<i64> = row.get::<_, Option<_>>(12).unwrap_or_default();
            let starts: Vec<i64> = row.get::<_, Option<_>>(13).unwrap_or_default();
            let histories: Vec<Vec<u8>> = row.get::<_, Option<_>>(14).unwrap_or_default();
            let states: Vec<Option<Vec<u8>>> = row.get::<_, Option<_>>(15).unwrap_or_default();
            let checkpoints = counts
                .into_iter()
                .zip(starts)
                .zip(histories.into_iter().zip(states))
                .map(|((inputs, start), (history, state))| {
                    Ok(StoredCheckpoint {
                        inputs: count(inputs, "checkpoint input count")?,
                        history_start: count(start, "checkpoint history start")?,
                        history,
                        state,
                    })
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
            let inputs: Vec<Vec<u8>> = row.get::<_, Option<_>>(16).unwrap_or_default();
            Ok(LoadedRun {
                events: summary.events,
                options: json_column(&options, "the run options")?,
                summary,
                bundle,
                checkpoints,
                inputs,
            })
        })
    }

    fn list<'a>(&'a self) -> BoxFuture<'a, Result<Vec<RunSummary>, StoreError>> {
        Box::pin(async move {
            let client = &self.reader;
            client
                .query(
                    &format!(
                        "SELECT {SUMMARY_COLUMNS} FROM runs ORDER BY started_at_ms DESC, id DESC"
                    ),
                    &[],
                )
                .await
                .map_err(|e| self.error(e))?
                .iter()
                .map(summary_row)
                .collect()
        })
    }

    fn summary<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<RunSummary, StoreError>> {
        Box::pin(async move {
            let client = &self.reader;
            read_summary(&self.url, client, id).await
        })
    }

    fn events<'a>(
        &'a self,
        id: &'a str,
        from: u64,
        limit: u64,
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        Box::pin(async move {
            let client = &self.reader;
            read_summary(&self.url, client, id).await?;
            Ok(client
                .query(
                    "SELECT json FROM events WHERE run_id = $1 AND seq >= $2 ORDER BY seq LIMIT $3",
                    &[&id, &db_int(from), &db_int(limit)],
                )
                .await
                .map_err(|e| self.error(e))?
                .into_iter()
                .map(|row| row.get(0))
                .collect())
        })
    }

    fn run_bytes<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let client = &self.reader;
            read_summary(&self.url, client, id).await?;
            let row = client
                .query_one(
                    "SELECT (
                       (SELECT COALESCE(SUM(octet_length(bytes)), 0) FROM inputs WHERE run_id = $1)
                     + (SELECT COALESCE(SUM(octet_length(json)), 0) FROM events WHERE run_id = $1)
                     + (SELECT COALESCE(SUM(octet_length(history) + COALESCE(octet_length(state), 0)), 0)
                          FROM checkpoints WHERE run_id = $1)
                     )::BIGINT",
                    &[&id],
                )
                .await
                .map_err(|e| self.error(e))?;
            count(row.get(0), "byte count")
        })
    }

    fn enqueue<'a>(&'a self, run: QueuedRun) -> BoxFuture<'a, Result<Enqueued, StoreError>> {
        Box::pin(async move {
            let (done, result) = oneshot::channel();
            self.pending_enqueues().push((run, done));
            {
                // Whoever holds the connection next commits every enqueue waiting then,
                // this one included unless an earlier holder took it already.
                let mut client = self.queue.lock().await;
                let batch = std::mem::take(&mut *self.pending_enqueues());
                if !batch.is_empty() {
                    self.enqueue_batch(&mut client, batch).await;
                }
                if self.purge.due() {
                    // On its own, after the batch: a failure leaves the keys for the next
                    // purge, an hour on, and fails no submit. An expired key is replaced
                    // when reused anyway; the purge only bounds the table.
                    let _ = client
                        .execute(
                            "DELETE FROM idempotency_keys WHERE created_at_ms < $1",
                            &[&(now_ms() - IDEMPOTENCY_WINDOW_MS)],
                        )
                        .await;
                }
            }
            result
                .await
                .map_err(|_| StoreError::Open("the enqueue was dropped".into()))?
        })
    }

    fn claim<'a>(&'a self) -> BoxFuture<'a, Result<Option<Claim>, StoreError>> {
        Box::pin(async move {
            for scan in claim_order(&self.takeover) {
                let claim = match scan {
                    Scan::New => self.claim_new().await?,
                    Scan::Abandoned => {
                        self.takeover.done();
                        self.claim_abandoned().await?
                    }
                };
                if claim.is_some() {
                    return Ok(claim);
                }
            }
            Ok(None)
        })
    }

    fn request_cancel<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let client = self.queue.lock().await;
            let changed = client
                .execute(
                    "UPDATE run_queue SET cancel_requested = TRUE WHERE run_id = $1",
                    &[&id],
                )
                .await
                .map_err(|e| self.error(e))?;
            if changed == 0 {
                return Err(StoreError::NotFound(id.to_string()));
            }
            Ok(())
        })
    }

    fn queue_entry<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<QueueEntry, StoreError>> {
        Box::pin(async move {
            // One statement: one snapshot of the run and its queue row.
            let row = self
                .read_one(
                    &format!(
                        "SELECT {SUMMARY_COLUMNS}, q.agent, q.claimed, q.cancel_requested,
                                q.traceparent
                         FROM runs JOIN run_queue q ON q.run_id = runs.id WHERE runs.id = $1"
                    ),
                    id,
                )
                .await?;
            let summary = summary_row(&row)?;
            let claimed: bool = row.get(11);
            let status = match &summary.outcome {
                Some(outcome) if summary.state == RunState::Finished => {
                    QueueStatus::of_outcome(outcome)
                }
                _ => QueueStatus::of_claimed(claimed),
            };
            Ok(QueueEntry {
                agent: row.get(10),
                status,
                cancel_requested: row.get(12),
                traceparent: row.get(13),
                summary,
            })
        })
    }

    fn queue_counts<'a>(&'a self) -> BoxFuture<'a, Result<QueueCounts, StoreError>> {
        Box::pin(async move {
            let client = &self.reader;
            let rows = client
                .query(
                    "SELECT final_status, claimed, COUNT(*) FROM run_queue GROUP BY 1, 2",
                    &[],
                )
                .await
                .map_err(|e| self.error(e))?;
            let mut counts = QueueCounts::default();
            for row in rows {
                let status: Option<String> = row.get(0);
                let status = match status {
                    Some(status) => QueueStatus::from_column(&status)?,
                    None => QueueStatus::of_claimed(row.get(1)),
                };
                let n = count(row.get(2), "run count")?;
                match counts.by_status.iter_mut().find(|(s, _)| *s == status) {
                    Some((_, total)) => *total += n,
                    None => counts.by_status.push((status, n)),
                }
            }
            Ok(counts)
        })
    }
}

/// The writer task: takes every queued job, commits them together, answers each.
async fn write_loop(url: Arc<str>, mut client: Client, mut jobs: mpsc::UnboundedReceiver<Job>) {
    let st = Statements::default();
    while let Some(first) = jobs.recv().await {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match jobs.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        commit_group(&url, &mut client, &st, group).await;
    }
}

/// The most jobs committed in one transaction (bounds the latency of the first).
const MAX_GROUP: usize = 512;

async fn commit_group(url: &str, client: &mut Client, st: &Statements, group: Vec<Job>) {
    // Most groups commit in a handful of statements for every job at once; a group the
    // fast path cannot take (a run twice in it, a write the checks did not foresee) runs
    // job by job, each in a savepoint, as below.
    if group.len() > 1
        && let Some(results) = commit_together(client, st, &group).await
    {
        for (job, result) in group.into_iter().zip(results) {
            let _ = job.reply.send(result);
        }
        return;
    }
    let mut answers = Vec::with_capacity(group.len());
    let committed = match client.transaction().await {
        Ok(mut tx) => {
            for job in group {
                let result = run_job(url, &mut tx, st, &job.work).await;
                answers.push((job.reply, result));
            }
            tx.commit().await.map_err(|e| db_error(url, &e))
        }
        Err(e) => {
            answers.extend(group.into_iter().map(|job| (job.reply, Ok(()))));
            Err(db_error(url, &e))
        }
    };
    for (reply, result) in answers {
        let result = match (&committed, result) {
            (Err(e), Ok(())) => Err(StoreError::Database(format!("the commit failed: {e}"))),
            (_, result) => result,
        };
        // A caller that stopped waiting has nothing to be told.
        let _ = reply.send(result);
    }
}

/// Commits a group with a fixed number of statements, whatever its size: one `SELECT …
/// FOR UPDATE` reads every run the group touches, each job is checked against it (a job
/// refused here writes nothing and gets its error), and the writes of all the others go
/// in as arrays (`UNNEST`). On any database error the transaction rolls back and the
/// caller runs the group job by job instead. Job by job costs four round trips a job; at
/// 100 runs at once that held durable runs to 46 % of in-memory throughput.
async fn commit_together(
    client: &mut Client,
    st: &Statements,
    group: &[Job],
) -> Option<Vec<Result<(), StoreError>>> {
    let mut ids: Vec<&str> = group
        .iter()
        .map(|job| match &job.work {
            Work::Create(run) => run.id.as_str(),
            Work::Append(id, _) => id.as_str(),
        })
        .collect();
    let unique: HashSet<&str> = ids.iter().copied().collect();
    if unique.len() != ids.len() {
        // The same run twice: its second batch depends on its first. Job by job.
        return None;
    }
    ids.sort_unstable();
    write_together(client, st, group, &ids).await.ok()
}

async fn write_together(
    client: &mut Client,
    st: &Statements,
    group: &[Job],
    ids: &[&str],
) -> Result<Vec<Result<(), StoreError>>, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    let rows = tx
        .query(
            "SELECT id, state, input_count, event_count FROM runs WHERE id = ANY($1)
             ORDER BY id FOR UPDATE",
            &[&ids],
        )
        .await?;
    let mut known = std::collections::HashMap::with_capacity(rows.len());
    for row in &rows {
        let (id, state, inputs, events): (String, String, i64, i64) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        known.insert(id, (state, inputs, events));
    }

    let now = now_ms();
    let mut results = Vec::with_capacity(group.len());
    let mut new_runs: Vec<&NewRun> = Vec::new();
    // Rows to insert, column by column.
    let (mut in_run, mut in_seq, mut in_bytes) = (Vec::new(), Vec::new(), Vec::new());
    let (mut ev_run, mut ev_seq, mut ev_json) = (Vec::new(), Vec::new(), Vec::new());
    let (mut ck_run, mut ck_inputs, mut ck_start, mut ck_history, mut ck_state) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut fin_id, mut fin_status): (Vec<&str>, Vec<&str>) = (Vec::new(), Vec::new());
    let (mut up_id, mut up_steps, mut up_inputs, mut up_events, mut up_state, mut up_outcome) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    for job in group {
        let result = match &job.work {
            Work::Create(run) => {
                if known.contains_key(&run.id) {
                    Err(StoreError::Exists(run.id.clone()))
                } else {
                    new_runs.push(run);
                    Ok(())
                }
            }
            Work::Append(id, batch) => match known.get(id) {
                None => Err(StoreError::NotFound(id.clone())),
                Some((state, input_count, event_count)) => {
                    let checked = RunState::from_column(state).and_then(|state| {
                        if state == RunState::Finished {
                            return Err(StoreError::Finished(id.clone()));
                        }
                        let stored = count(*input_count, "input count")?;
                        if batch.first_input != stored {
                            return Err(StoreError::Sequence {
                                id: id.clone(),
                                expected: stored,
                                got: batch.first_input,
                            });
                        }
                        Ok(())
                    });
                    if checked.is_ok() {
                        for (seq, bytes) in (*input_count..).zip(&batch.inputs) {
                            in_run.push(id.as_str());
                            in_seq.push(seq);
                            in_bytes.push(bytes.as_slice());
                        }
                        for (seq, json) in (*event_count..).zip(&batch.events) {
                            ev_run.push(id.as_str());
                            ev_seq.push(seq);
                            ev_json.push(json.as_str());
                        }
                        if let Some(checkpoint) = &batch.checkpoint {
                            ck_run.push(id.as_str());
                            ck_inputs.push(db_int(checkpoint.inputs));
                            ck_start.push(db_int(checkpoint.history_start));
                            ck_history.push(checkpoint.history.as_slice());
                            ck_state.push(checkpoint.state.as_deref());
                        }
                        let (state, outcome) = match &batch.outcome {
                            Some(outcome) => {
                                fin_id.push(id.as_str());
                                fin_status.push(QueueStatus::of_outcome(outcome).as_str());
                                (RunState::Finished, Some(outcome.to_string()))
                            }
                            None => (RunState::Running, None),
                        };
                        up_id.push(id.as_str());
                        up_steps.push(db_int(batch.steps));
                        up_inputs.push(input_count + db_int(batch.inputs.len() as u64));
                        up_events.push(event_count + db_int(batch.events.len() as u64));
                        up_state.push(state.as_str());
                        up_outcome.push(outcome);
                    }
                    checked
                }
            },
        };
        results.push(result);
    }

    if !new_runs.is_empty() {
        let mut hashes: Vec<&str> = Vec::new();
        let mut bundles: Vec<&[u8]> = Vec::new();
        let mut seen = HashSet::new();
        for run in &new_runs {
            if seen.insert(run.bundle_hash.as_str()) {
                hashes.push(&run.bundle_hash);
                bundles.push(&run.bundle);
            }
        }
        tx.execute(
            &st.get(
                &tx,
                "INSERT INTO bundles (hash, bytes) SELECT * FROM UNNEST($1::TEXT[], $2::BYTEA[])
             ON CONFLICT (hash) DO NOTHING",
            )
            .await?,
            &[&hashes, &bundles],
        )
        .await?;
        let ids: Vec<&str> = new_runs.iter().map(|r| r.id.as_str()).collect();
        let agents: Vec<&str> = new_runs.iter().map(|r| r.agent.as_str()).collect();
        let hashes: Vec<&str> = new_runs.iter().map(|r| r.bundle_hash.as_str()).collect();
        let started: Vec<i64> = new_runs.iter().map(|r| r.started_at_ms).collect();
        let options: Vec<String> = new_runs.iter().map(|r| r.options.to_string()).collect();
        tx.execute(
            &st.get(
                &tx,
                "INSERT INTO runs (id, agent, bundle_hash, state, steps, started_at_ms,
                               updated_at_ms, options, outcome, input_count, event_count)
             SELECT t.id, t.agent, t.hash, $6, 0, t.started, t.started, t.options, NULL, 0, 0
             FROM UNNEST($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::BIGINT[], $5::TEXT[])
                  AS t(id, agent, hash, started, options)",
            )
            .await?,
            &[
                &ids,
                &agents,
                &hashes,
                &started,
                &options,
                &RunState::Running.as_str(),
            ],
        )
        .await?;
    }
    if !in_run.is_empty() {
        tx.execute(
            &st.get(
                &tx,
                "INSERT INTO inputs (run_id, seq, bytes)
             SELECT * FROM UNNEST($1::TEXT[], $2::BIGINT[], $3::BYTEA[])",
            )
            .await?,
            &[&in_run, &in_seq, &in_bytes],
        )
        .await?;
    }
    if !ev_run.is_empty() {
        tx.execute(
            &st.get(
                &tx,
                "INSERT INTO events (run_id, seq, json)
             SELECT * FROM UNNEST($1::TEXT[], $2::BIGINT[], $3::TEXT[])",
            )
            .await?,
            &[&ev_run, &ev_seq, &ev_json],
        )
        .await?;
    }
    if !ck_run.is_empty() {
        // The previous newest states go first, or the new ones would go with them.
        tx.execute(
            &st.get(
                &tx,
                "UPDATE checkpoints SET state = NULL WHERE run_id = ANY($1) AND state IS NOT NULL",
            )
            .await?,
            &[&ck_run],
        )
        .await?;
        tx.execute(
            &st.get(&tx, "INSERT INTO checkpoints (run_id, seq, inputs, history_start, history, state)
             SELECT t.run_id,
                    (SELECT COALESCE(MAX(c.seq) + 1, 0) FROM checkpoints c WHERE c.run_id = t.run_id),
                    t.inputs, t.history_start, t.history, t.state
             FROM UNNEST($1::TEXT[], $2::BIGINT[], $3::BIGINT[], $4::BYTEA[], $5::BYTEA[])
                  AS t(run_id, inputs, history_start, history, state)").await?,
            &[&ck_run, &ck_inputs, &ck_start, &ck_history, &ck_state],
        )
        .await?;
    }
    if !up_id.is_empty() {
        tx.execute(
            &st.get(
                &tx,
                "UPDATE runs r SET steps = t.steps, updated_at_ms = $7, input_count = t.inputs,
                               event_count = t.events, state = t.state,
                               outcome = COALESCE(t.outcome, r.outcome)
             FROM UNNEST($1::TEXT[], $2::BIGINT[], $3::BIGINT[], $4::BIGINT[], $5::TEXT[],
                         $6::TEXT[]) AS t(id, steps, inputs, events, state, outcome)
             WHERE r.id = t.id",
            )
            .await?,
            &[
                &up_id,
                &up_steps,
                &up_inputs,
                &up_events,
                &up_state,
                &up_outcome,
                &now,
            ],
        )
        .await?;
    }
    if !fin_id.is_empty() {
        // A queued run leaves the claimable set (no row for a run `create` made).
        tx.execute(
            &st.get(
                &tx,
                "UPDATE run_queue q SET final_status = t.status
             FROM UNNEST($1::TEXT[], $2::TEXT[]) AS t(id, status) WHERE q.run_id = t.id",
            )
            .await?,
            &[&fin_id, &fin_status],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(results)
}

/// Runs one job in a savepoint of the group's transaction: undone alone if it fails
/// (dropping an uncommitted savepoint rolls it back).
async fn run_job(
    url: &str,
    tx: &mut Transaction<'_>,
    st: &Statements,
    work: &Work,
) -> Result<(), StoreError> {
    let error = |e: tokio_postgres::Error| db_error(url, &e);
    let savepoint = tx.savepoint("job").await.map_err(error)?;
    match work {
        Work::Create(run) => insert_run(url, &savepoint, st, run).await?,
        Work::Append(id, batch) => append_batch(url, &savepoint, st, id, batch).await?,
    }
    savepoint.commit().await.map_err(error)
}

async fn insert_run(
    url: &str,
    tx: &Transaction<'_>,
    st: &Statements,
    run: &NewRun,
) -> Result<(), StoreError> {
    let error = |e: tokio_postgres::Error| db_error(url, &e);
    let exists = tx
        .query_opt("SELECT 1 FROM runs WHERE id = $1", &[&run.id])
        .await
        .map_err(error)?;
    if exists.is_some() {
        return Err(StoreError::Exists(run.id.clone()));
    }
    let options = run.options.to_string();
    let running = RunState::Running.as_str();
    let insert_bundle = async {
        tx.execute(
            &st.get(
                tx,
                "INSERT INTO bundles (hash, bytes) VALUES ($1, $2) ON CONFLICT (hash) DO NOTHING",
            )
            .await?,
            &[&run.bundle_hash, &run.bundle],
        )
        .await
    };
    let insert_run = async {
        tx.execute(
            &st.get(
                tx,
                "INSERT INTO runs (id, agent, bundle_hash, state, steps, started_at_ms,
                               updated_at_ms, options, outcome, input_count, event_count)
             VALUES ($1, $2, $3, $4, 0, $5, $5, $6, NULL, 0, 0)",
            )
            .await?,
            &[
                &run.id,
                &run.agent,
                &run.bundle_hash,
                &running,
                &run.started_at_ms,
                &options,
            ],
        )
        .await
    };
    let (bundle, inserted) = tokio::join!(insert_bundle, insert_run);
    bundle.map_err(error)?;
    match inserted {
        Ok(_) => Ok(()),
        // A concurrent create of the same id by another process.
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {
            Err(StoreError::Exists(run.id.clone()))
        }
        Err(e) => Err(error(e)),
    }
}

async fn append_batch(
    url: &str,
    tx: &Transaction<'_>,
    st: &Statements,
    id: &str,
    batch: &Batch,
) -> Result<(), StoreError> {
    let error = |e: tokio_postgres::Error| db_error(url, &e);
    let row = tx
        .query_opt(
            "SELECT state, input_count, event_count FROM runs WHERE id = $1 FOR UPDATE",
            &[&id],
        )
        .await
        .map_err(error)?
        .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
    let (state, input_count, event_count): (String, i64, i64) =
        (row.get(0), row.get(1), row.get(2));
    if RunState::from_column(&state)? == RunState::Finished {
        return Err(StoreError::Finished(id.to_string()));
    }
    let stored = count(input_count, "input count")?;
    if batch.first_input != stored {
        return Err(StoreError::Sequence {
            id: id.to_string(),
            expected: stored,
            got: batch.first_input,
        });
    }
    append_rows(tx, st, id, batch, input_count, event_count)
        .await
        .map_err(error)
}

/// The lock task: owns the lock connection and runs locks and unlocks in order. It ends
/// when the store and all its leases are gone, and the connection closes with it.
async fn lock_loop(url: Arc<str>, client: Client, mut ops: mpsc::UnboundedReceiver<LockOp>) {
    let statements = Statements::default();
    let lock = format!("SELECT pg_try_advisory_lock({LOCK_KEY})");
    let unlock = format!("SELECT pg_advisory_unlock({LOCK_KEY})");
    while let Some(op) = ops.recv().await {
        match op {
            LockOp::ClaimNew(reply) => {
                let claimed = async {
                    let statement = statements.get(&client, CLAIM_NEW).await?;
                    client.query_opt(&statement, &[]).await
                }
                .await
                .map_err(|e| db_error(&url, &e))
                .and_then(|row| row.map(|row| NewClaim::of_row(&url, &row)).transpose());
                if let Err(Ok(Some(claim))) = reply.send(claimed)
                    && claim.locked
                {
                    // The claim was given up (its caller dropped): nobody will own the
                    // lock. The run stays marked claimed: the takeover scan finds it.
                    let _ = client.execute(&unlock, &[&claim.id]).await;
                }
            }
            LockOp::Lock(id, reply) => {
                let taken = async {
                    let statement = statements.get(&client, &lock).await?;
                    client
                        .query_one(&statement, &[&id])
                        .await?
                        .try_get::<_, bool>(0)
                }
                .await
                .map_err(|e| db_error(&url, &e));
                let _ = reply.send(taken);
            }
            LockOp::Unlock(id) => {
                // A failure means the connection is gone, and the lock with it.
                if let Ok(statement) = statements.get(&client, &unlock).await {
                    let _ = client.execute(&statement, &[&id]).await;
                }
            }
        }
    }
}

/// Inserts a batch's rows and updates the run's row, pipelined (the statements are sent
/// together and answered together).
async fn append_rows(
    tx: &tokio_postgres::Transaction<'_>,
    st: &Statements,
    id: &str,
    batch: &Batch,
    input_count: i64,
    event_count: i64,
) -> Result<(), tokio_postgres::Error> {
    let (state, outcome) = match &batch.outcome {
        Some(outcome) => (RunState::Finished, Some(outcome.to_string())),
        None => (RunState::Running, None),
    };
    let new_inputs = input_count + db_int(batch.inputs.len() as u64);
    let new_events = event_count + db_int(batch.events.len() as u64);
    let steps = db_int(batch.steps);
    let now = now_ms();
    let inputs = async {
        if batch.inputs.is_empty() {
            return Ok(0);
        }
        tx.execute(
            &st.get(tx, "INSERT INTO inputs (run_id, seq, bytes)
             SELECT $1, $2 + t.ord - 1, t.bytes FROM UNNEST($3::BYTEA[]) WITH ORDINALITY AS t(bytes, ord)").await?,
            &[&id, &input_count, &batch.inputs],
        )
        .await
    };
    let events = async {
        if batch.events.is_empty() {
            return Ok(0);
        }
        tx.execute(
            &st.get(tx, "INSERT INTO events (run_id, seq, json)
             SELECT $1, $2 + t.ord - 1, t.json FROM UNNEST($3::TEXT[]) WITH ORDINALITY AS t(json, ord)").await?,
            &[&id, &event_count, &batch.events],
        )
        .await
    };
    let checkpoint = async {
        let Some(checkpoint) = &batch.checkpoint else {
            return Ok(0);
        };
        tx.execute(
            &st.get(
                tx,
                "UPDATE checkpoints SET state = NULL WHERE run_id = $1 AND state IS NOT NULL",
            )
            .await?,
            &[&id],
        )
        .await?;
        let params: [&(dyn ToSql + Sync); 5] = [
            &id,
            &db_int(checkpoint.inputs),
            &db_int(checkpoint.history_start),
            &checkpoint.history,
            &checkpoint.state,
        ];
        tx.execute(
            &st.get(
                tx,
                "INSERT INTO checkpoints (run_id, seq, inputs, history_start, history, state)
             VALUES ($1, (SELECT COALESCE(MAX(seq) + 1, 0) FROM checkpoints WHERE run_id = $1),
                     $2, $3, $4, $5)",
            )
            .await?,
            &params,
        )
        .await
    };
    let state = state.as_str();
    let run = async {
        tx.execute(
        &st.get(tx, "UPDATE runs SET steps = $2, updated_at_ms = $3, input_count = $4, event_count = $5,
                         state = $6, outcome = COALESCE($7, outcome)
         WHERE id = $1").await?,
        &[&id, &steps, &now, &new_inputs, &new_events, &state, &outcome],
    )
        .await
    };
    let finished = async {
        let Some(outcome) = &batch.outcome else {
            return Ok(0);
        };
        let status = QueueStatus::of_outcome(outcome).as_str();
        tx.execute(
            &st.get(
                tx,
                "UPDATE run_queue SET final_status = $2 WHERE run_id = $1",
            )
            .await?,
            &[&id, &status],
        )
        .await
    };
    let (inputs, events, checkpoint, run, finished) =
        tokio::join!(inputs, events, checkpoint, run, finished);
    inputs?;
    events?;
    checkpoint?;
    run?;
    finished?;
    Ok(())
}

/// Stores `runs` (distinct ids, no idempotency key) with their bundles and queue rows;
/// returns the ids stored: an id that exists already is not.
async fn enqueue_runs(
    url: &str,
    tx: &Transaction<'_>,
    runs: &[&QueuedRun],
) -> Result<HashSet<String>, StoreError> {
    if runs.is_empty() {
        return Ok(HashSet::new());
    }
    let error = |e: tokio_postgres::Error| db_error(url, &e);
    let mut hashes = Vec::new();
    let mut bundles = Vec::new();
    for queued in runs {
        if !hashes.contains(&queued.run.bundle_hash) {
            hashes.push(queued.run.bundle_hash.clone());
            bundles.push(queued.run.bundle.as_slice());
        }
    }
    tx.execute(
        "INSERT INTO bundles (hash, bytes) SELECT * FROM unnest($1::TEXT[], $2::BYTEA[])
         ON CONFLICT (hash) DO NOTHING",
        &[&hashes, &bundles],
    )
    .await
    .map_err(error)?;
    let column = |f: fn(&QueuedRun) -> String| runs.iter().map(|r| f(r)).collect::<Vec<_>>();
    let ids = column(|r| r.run.id.clone());
    let agents = column(|r| r.run.agent.clone());
    let hashes = column(|r| r.run.bundle_hash.clone());
    let options = column(|r| r.run.options.to_string());
    let queue_agents = column(|r| r.agent.clone());
    let started: Vec<i64> = runs.iter().map(|r| r.run.started_at_ms).collect();
    let traceparents: Vec<Option<&str>> = runs.iter().map(|r| r.traceparent.as_deref()).collect();
    let state = RunState::Running.as_str();
    let rows = tx
        .query(
            "WITH batch AS (
                 SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::BIGINT[],
                                      $5::TEXT[], $6::TEXT[], $7::TEXT[])
                     AS b(id, agent, hash, started, options, queue_agent, traceparent)),
             stored AS (
                 INSERT INTO runs (id, agent, bundle_hash, state, steps, started_at_ms,
                                   updated_at_ms, options, outcome, input_count, event_count)
                 SELECT id, agent, hash, $8, 0, started, started, options, NULL, 0, 0 FROM batch
                 ON CONFLICT (id) DO NOTHING
                 RETURNING id)
             INSERT INTO run_queue (run_id, agent, enqueued_at_ms, traceparent)
             SELECT b.id, b.queue_agent, b.started, b.traceparent
             FROM batch b JOIN stored s ON s.id = b.id
             RETURNING run_id",
            &[
                &ids,
                &agents,
                &hashes,
                &started,
                &options,
                &queue_agents,
                &traceparents,
                &state,
            ],
        )
        .await
        .map_err(error)?;
    Ok(rows.into_iter().map(|row| row.get(0)).collect())
}

/// Stores a queued run, or finds the run its idempotency key started (spec/serve.md).
///
/// Two requests with one new key at once: the second `INSERT … ON CONFLICT DO NOTHING`
/// waits for the first's row, then finds it, so one run is stored.
async fn enqueue_run(
    url: &str,
    tx: &Transaction<'_>,
    queued: &QueuedRun,
) -> Result<Enqueued, StoreError> {
    let error = |e: tokio_postgres::Error| db_error(url, &e);
    let run = &queued.run;
    let now = now_ms();
    if let Some(key) = &queued.idempotency_key {
        let inserted = tx
            .query_opt(
                "INSERT INTO idempotency_keys (agent, key, run_id, created_at_ms)
                 VALUES ($1, $2, $3, $4) ON CONFLICT (agent, key) DO NOTHING RETURNING run_id",
                &[&queued.agent, key, &run.id, &now],
            )
            .await
            .map_err(error)?;
        if inserted.is_none() {
            let row = tx
                .query_one(
                    "SELECT run_id, created_at_ms FROM idempotency_keys
                     WHERE agent = $1 AND key = $2 FOR UPDATE",
                    &[&queued.agent, key],
                )
                .await
                .map_err(error)?;
            let created: i64 = row.get(1);
            if created > now - IDEMPOTENCY_WINDOW_MS {
                return Ok(Enqueued::Existing(row.get(0)));
            }
            tx.execute(
                "UPDATE idempotency_keys SET run_id = $3, created_at_ms = $4
                 WHERE agent = $1 AND key = $2",
                &[&queued.agent, key, &run.id, &now],
            )
            .await
            .map_err(error)?;
        }
    }
    tx.execute(
        "INSERT INTO bundles (hash, bytes) VALUES ($1, $2) ON CONFLICT (hash) DO NOTHING",
        &[&run.bundle_hash, &run.bundle],
    )
    .await
    .map_err(error)?;
    let state = RunState::Running.as_str();
    let options = run.options.to_string();
    let inserted = tx
        .execute(
            "INSERT INTO runs (id, agent, bundle_hash, state, steps, started_at_ms,
                               updated_at_ms, options, outcome, input_count, event_count)
             VALUES ($1, $2, $3, $4, 0, $5, $5, $6, NULL, 0, 0) ON CONFLICT (id) DO NOTHING",
            &[
                &run.id,
                &run.agent,
                &run.bundle_hash,
                &state,
                &run.started_at_ms,
                &options,
            ],
        )
        .await
        .map_err(error)?;
    if inserted == 0 {
        return Err(StoreError::Exists(run.id.clone()));
    }
    tx.execute(
        "INSERT INTO run_queue (run_id, agent, enqueued_at_ms, traceparent)
         VALUES ($1, $2, $3, $4)",
        &[
            &run.id,
            &queued.agent,
            &run.started_at_ms,
            &queued.traceparent,
        ],
    )
    .await
    .map_err(error)?;
    Ok(Enqueued::New(run.id.clone()))
}

fn summary_row(row: &tokio_postgres::Row) -> Result<RunSummary, StoreError> {
    summary_row_at(row, 0)
}

/// The summary in the columns of [`SUMMARY_COLUMNS`], starting at column `at`.
fn summary_row_at(row: &tokio_postgres::Row, at: usize) -> Result<RunSummary, StoreError> {
    let state: String = row.get(at + 3);
    let outcome: Option<String> = row.get(at + 9);
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

/// Checks that the database is an aplc store or holds none of its tables, and migrates it,
/// in one transaction serialized against other processes by an advisory lock.
async fn migrate(url: &str, client: &mut Client) -> Result<(), StoreError> {
    let error = |e: tokio_postgres::Error| db_error(url, &e);
    let tx = client.transaction().await.map_err(error)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(error)?;
    let present: Vec<String> = tx
        .query(
            "SELECT table_name::TEXT FROM information_schema.tables
             WHERE table_schema = current_schema() AND table_name = ANY($1) ORDER BY 1",
            &[&TABLES],
        )
        .await
        .map_err(error)?
        .into_iter()
        .map(|row| row.get(0))
        .collect();
    let version = if present.iter().any(|t| t == "aplc_meta") {
        stored_version(url, &tx).await?
    } else if present.is_empty() {
        0
    } else {
        return Err(StoreError::Foreign(format!(
            "the database has tables named like an aplc store's ({}) but no `aplc_meta`",
            present.join(", ")
        )));
    };
    if version > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    if version == SCHEMA_VERSION {
        return tx.commit().await.map_err(error);
    }
    for (_, sql) in MIGRATIONS.iter().filter(|(to, _)| *to > version) {
        tx.batch_execute(sql).await.map_err(error)?;
    }
    tx.execute(
        "INSERT INTO aplc_meta (key, value) VALUES ('magic', $1), ('schema_version', $2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        &[&MAGIC, &SCHEMA_VERSION.to_string()],
    )
    .await
    .map_err(error)?;
    tx.commit().await.map_err(error)
}

/// The schema version recorded in `aplc_meta`, after checking its magic.
async fn stored_version(
    url: &str,
    tx: &tokio_postgres::Transaction<'_>,
) -> Result<i64, StoreError> {
    let rows = tx
        .query(
            "SELECT key, value FROM aplc_meta WHERE key IN ('magic', 'schema_version')",
            &[],
        )
        .await
        .map_err(|e| {
            // An `aplc_meta` of another shape is someone else's table.
            if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_COLUMN) {
                StoreError::Foreign("the database's `aplc_meta` table is not aplc's".into())
            } else {
                db_error(url, &e)
            }
        })?;
    // `try_get`: a table of another shape must be an error, not a panic.
    let value = |key: &str| {
        rows.iter()
            .find(|row| row.try_get::<_, String>(0).is_ok_and(|k| k == key))
            .and_then(|row| row.try_get::<_, String>(1).ok())
    };
    if value("magic").as_deref() != Some(MAGIC) {
        return Err(StoreError::Foreign(
            "the database's `aplc_meta` table does not mark an aplc store".into(),
        ));
    }
    let version = value("schema_version").unwrap_or_default();
    version
        .parse()
        .map_err(|_| StoreError::Corrupt(format!("schema version `{version}` is not a number")))
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

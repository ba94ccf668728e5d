//! The SQLite run store: one file in WAL mode, a writer thread that group-commits, and
//! leases held by live processes.
//!
//! **Writes.** One thread owns the writing connection. `create` and `append` queue a job
//! to it and wait for its answer; the thread takes every job queued at that moment, runs
//! each in its own savepoint (a refused append does not undo its neighbours) and commits
//! them in one transaction, so a hundred runs appending at once share one commit. Each
//! caller is answered after the commit.
//!
//! **Reads** use a second connection on a blocking thread (WAL lets them run beside the
//! writer).
//!
//! **Durability.** `synchronous = NORMAL`, chosen over FULL. In WAL mode both lose
//! nothing committed when the *process* dies (kill -9, an OOM kill, a deploy): a commit
//! has written the WAL into the OS's cache before the caller hears of it, and the OS
//! writes it out. They differ on an *OS* crash or power cut: FULL fsyncs the WAL at every
//! commit, so nothing committed is lost; NORMAL fsyncs only at checkpoints, so the last
//! commits may be lost (the file stays consistent) and a resume starts a little earlier:
//! a provider call may be sent again, and a tool call whose start was lost may run again.
//! FULL costs an fsync per commit: an append waited 2.6–6.3 ms for its commit on the
//! development machine against 0.06–0.12 ms with NORMAL (`examples/store_cost.rs`),
//! which at a provider's 50 ms would cost a durable run about a tenth of its throughput. A deployment that must survive power loss without
//! repeating anything uses PostgreSQL, which fsyncs its commits by default.
//!
//! **Leases** are rows of the `leases` table, naming their holder: an open store. Each
//! store holds an OS file lock (`flock`) on a file of its own in `<db file>.locks/` for as
//! long as it is open, and the kernel releases it when the process dies, however it dies.
//! A lease whose holder's file can be locked by someone else is a dead process's, and is
//! taken over. So a lease costs a row written in the same transaction as the run's
//! creation, not a file per run: creating a file per run in one directory cost 3–9 ms per
//! run at 100 runs at once (directory lock contention), and left a file behind per run.

use std::collections::HashSet;
use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};

use rusqlite::{
    Connection, ErrorCode, OpenFlags, OptionalExtension, Transaction, TransactionBehavior, params,
};
use tokio::sync::oneshot;

use super::{
    Batch, Claim, Enqueued, Every, IDEMPOTENCY_PURGE, IDEMPOTENCY_WINDOW_MS, Lease, LoadedRun,
    MAGIC, NewRun, QueueCounts, QueueEntry, QueueStatus, QueuedRun, RunState, RunStore, RunSummary,
    SCHEMA_VERSION, Scan, StoreError, StoredCheckpoint, TAKEOVER_SCAN, claim_order, count, db_int,
    json_column, now_ms,
};
use crate::driver::BoxFuture;

/// `PRAGMA application_id` of an aplc store: "aplc" in ASCII.
const APPLICATION_ID: i64 = 0x6170_6c63;

/// How long a statement waits for another process's write lock before failing.
const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How many times an open is tried while another process holds a lock SQLite does not
/// wait for ([`retry_busy`]), and a group's `BEGIN IMMEDIATE` once the busy timeout has
/// run out ([`begin`]).
const OPEN_ATTEMPTS: u32 = 16;
const BEGIN_ATTEMPTS: u32 = 3;
/// The first pause between those tries, doubled each time up to [`MAX_PAUSE`].
const FIRST_PAUSE: std::time::Duration = std::time::Duration::from_millis(5);
const MAX_PAUSE: std::time::Duration = std::time::Duration::from_millis(500);

/// The most jobs committed in one transaction (bounds the latency of the first).
const MAX_GROUP: usize = 512;

/// Migrations, by the version they lead to. Version 1 is the first schema.
const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        "CREATE TABLE aplc_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
     CREATE TABLE bundles (hash TEXT PRIMARY KEY, bytes BLOB NOT NULL);
     CREATE TABLE runs (
         id TEXT PRIMARY KEY,
         agent TEXT NOT NULL,
         bundle_hash TEXT NOT NULL,
         state TEXT NOT NULL,
         steps INTEGER NOT NULL,
         started_at_ms INTEGER NOT NULL,
         updated_at_ms INTEGER NOT NULL,
         options TEXT NOT NULL,
         outcome TEXT,
         input_count INTEGER NOT NULL,
         event_count INTEGER NOT NULL
     );
     CREATE INDEX runs_by_start ON runs (started_at_ms DESC, id DESC);
     CREATE TABLE inputs (
         run_id TEXT NOT NULL, seq INTEGER NOT NULL, bytes BLOB NOT NULL,
         PRIMARY KEY (run_id, seq)
     );
     CREATE TABLE events (
         run_id TEXT NOT NULL, seq INTEGER NOT NULL, json TEXT NOT NULL,
         PRIMARY KEY (run_id, seq)
     );
     CREATE TABLE checkpoints (
         run_id TEXT NOT NULL, seq INTEGER NOT NULL, inputs INTEGER NOT NULL,
         history_start INTEGER NOT NULL, history BLOB NOT NULL, state BLOB,
         PRIMARY KEY (run_id, seq)
     );
     CREATE TABLE leases (run_id TEXT PRIMARY KEY, holder TEXT NOT NULL);",
    ),
    (
        2,
        // The service's queue (spec/serve.md). `final_status` is set by the append that
        // finishes the run (NULL while it is open), so claims scan open runs only and
        // counts read no outcome.
        "CREATE TABLE run_queue (
         run_id TEXT PRIMARY KEY,
         agent TEXT NOT NULL,
         enqueued_at_ms INTEGER NOT NULL,
         claimed INTEGER NOT NULL DEFAULT 0,
         final_status TEXT,
         cancel_requested INTEGER NOT NULL DEFAULT 0,
         traceparent TEXT
     );
     CREATE INDEX run_queue_open ON run_queue (final_status, enqueued_at_ms, run_id);
     CREATE TABLE idempotency_keys (
         agent TEXT NOT NULL,
         key TEXT NOT NULL,
         run_id TEXT NOT NULL,
         created_at_ms INTEGER NOT NULL,
         PRIMARY KEY (agent, key)
     );",
    ),
];

/// The SQLite store. The writer thread ends when the store is dropped (its channel
/// closes), after the jobs already queued.
#[derive(Debug)]
pub(super) struct SqliteStore {
    /// This store's name in `leases.holder`: its file in `<db>.locks/`.
    holder: Arc<str>,
    /// That file, locked while the store is open (and by the kernel no longer once the
    /// process is gone); none for a read-only store, which holds no lease.
    _holder_file: Option<File>,
    /// The runs whose leases this store holds.
    held: Arc<Mutex<HashSet<String>>>,
    /// `<db file>.locks/`: every open store's holder file.
    locks: PathBuf,
    /// The writer thread's queue; `None` once the store is dropped (the leases still
    /// alive share it, so the thread can end without them).
    writer: Writer,
    writer_thread: Option<std::thread::JoinHandle<()>>,
    reader: Arc<Mutex<Connection>>,
    /// When claims last looked for the runs of dead workers.
    takeover: Arc<Every>,
    /// When the expired idempotency keys were last deleted.
    purge: Every,
    /// Opened by [`SqliteStore::open_read_only`]: it has no writer.
    read_only: bool,
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        // Closing the channel ends the writer thread after the jobs already queued (the
        // wait is at most one group's commit). With the reader, dropped next, the last
        // connection closes and SQLite checkpoints the WAL into the file, so whoever opens
        // it next finds one file.
        *self.writer.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if let Some(thread) = self.writer_thread.take() {
            let _ = thread.join();
        }
    }
}

/// A lease: a row of `leases` naming this store. Dropping it frees the run in this
/// process at once and deletes the row (queued to the writer, after the run's last append).
#[derive(Debug)]
struct SqliteLease {
    run_id: String,
    holder: Arc<str>,
    held: Arc<Mutex<HashSet<String>>>,
    writer: Writer,
}

/// The writer thread's queue, shared by the store and its leases.
type Writer = Arc<Mutex<Option<mpsc::Sender<Job>>>>;

impl Drop for SqliteLease {
    fn drop(&mut self) {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.run_id);
        // A closed writer (the store is gone) has nothing to delete: the row names a
        // holder that no longer locks its file, and the next taker takes it over.
        if let Some(writer) = &*self.writer.lock().unwrap_or_else(|e| e.into_inner()) {
            let _ = writer.send(Job::Release(
                std::mem::take(&mut self.run_id),
                self.holder.clone(),
            ));
        }
    }
}

impl Lease for SqliteLease {
    fn run_id(&self) -> &str {
        &self.run_id
    }
}

/// A write for the writer thread, with where to send its result.
enum Job {
    /// A new run, and its lease for `holder`.
    Create(NewRun, Lessee, oneshot::Sender<Result<(), StoreError>>),
    /// The lease of an existing run for `holder`.
    Acquire(String, Lessee, oneshot::Sender<Result<(), StoreError>>),
    Append(String, Batch, oneshot::Sender<Result<(), StoreError>>),
    /// Deletes `holder`'s lease row of a run; nobody waits for it.
    Release(String, Arc<str>),
    /// A write of the service's queue, answering with its own type.
    Queue(Box<dyn QueueWrite>),
}

/// A queue write for the writer thread: run in its own savepoint of the group's
/// transaction, answered once the group's commit is known.
trait QueueWrite: Send {
    /// Runs the write (`now`: the group's time, ms since the epoch).
    fn run(&mut self, tx: &mut Transaction<'_>, now: i64);
    /// Answers the caller; `commit` is the group's commit (an error undoes the write).
    fn answer(self: Box<Self>, commit: Result<(), &StoreError>);
}

/// A [`QueueWrite`] from a closure returning `T`.
struct Write<T> {
    write: Option<WriteFn<T>>,
    result: Option<Result<T, StoreError>>,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

type WriteFn<T> = Box<dyn FnOnce(&Connection, i64) -> Result<T, StoreError> + Send>;

impl<T: Send> QueueWrite for Write<T> {
    fn run(&mut self, tx: &mut Transaction<'_>, now: i64) {
        if let Some(write) = self.write.take() {
            self.result = Some(in_savepoint_with(tx, |c| write(c, now)));
        }
    }

    fn answer(self: Box<Self>, commit: Result<(), &StoreError>) {
        let result = match (commit, self.result) {
            (_, Some(Err(e))) => Err(e),
            (Err(e), _) => Err(StoreError::Database(format!("the commit failed: {e}"))),
            (Ok(()), Some(Ok(value))) => Ok(value),
            (Ok(()), None) => Err(StoreError::Database("the write did not run".into())),
        };
        // A caller that stopped waiting has nothing to be told.
        let _ = self.reply.send(result);
    }
}

/// Who asks for a lease: the holder's name and where holders' files live.
struct Lessee {
    holder: Arc<str>,
    locks: PathBuf,
}

impl SqliteStore {
    /// Opens the file (creating and migrating it if needed) and starts the writer thread.
    pub(super) async fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        let path = path.to_path_buf();
        blocking(move || {
            check_file(&path)?;
            // Another process opening the same file at the same moment can hold a lock
            // SQLite does not wait for (the switch to WAL mode, the schema's creation): the
            // whole open is tried again then.
            let writer = retry_busy(|| {
                let conn = connect(&path)?;
                migrate(&conn)?;
                Ok(conn)
            })?;
            let reader = retry_busy(|| connect(&path))?;
            let (tx, rx) = mpsc::channel();
            let writer_thread = std::thread::Builder::new()
                .name("aplc-store-writer".into())
                .spawn(move || write_loop(writer, rx))
                .map_err(|e| StoreError::Open(format!("cannot start the writer thread: {e}")))?;
            let mut locks = path.clone().into_os_string();
            locks.push(".locks");
            let locks = PathBuf::from(locks);
            let (holder, holder_file) = hold(&locks)?;
            Ok(SqliteStore {
                holder,
                _holder_file: Some(holder_file),
                held: Arc::new(Mutex::new(HashSet::new())),
                takeover: Arc::new(Every::new(TAKEOVER_SCAN)),
                purge: Every::new(IDEMPOTENCY_PURGE),
                locks,
                writer: Arc::new(Mutex::new(Some(tx))),
                writer_thread: Some(writer_thread),
                reader: Arc::new(Mutex::new(reader)),
                read_only: false,
            })
        })
        .await
    }

    /// Opens the file for reading only: nothing is written to it or beside it (no WAL
    /// switch, no migration, no lock file), and every write is refused. A missing file
    /// reads as an empty store.
    pub(super) async fn open_read_only(path: &Path) -> Result<SqliteStore, StoreError> {
        let path = path.to_path_buf();
        blocking(move || {
            check_file(&path)?;
            let reader = retry_busy(|| connect_read_only(&path))?;
            Ok(SqliteStore {
                holder: Arc::from("read-only"),
                _holder_file: None,
                held: Arc::new(Mutex::new(HashSet::new())),
                takeover: Arc::new(Every::new(TAKEOVER_SCAN)),
                purge: Every::new(IDEMPOTENCY_PURGE),
                locks: PathBuf::new(),
                writer: Arc::new(Mutex::new(None)),
                writer_thread: None,
                reader: Arc::new(Mutex::new(reader)),
                read_only: true,
            })
        })
        .await
    }

    /// Why a write cannot be queued, or was never answered.
    fn stopped(&self) -> StoreError {
        if self.read_only {
            StoreError::Database("the store is open read-only".into())
        } else {
            StoreError::Database("the store's writer thread has stopped".into())
        }
    }

    /// Queues a job and waits for the writer's answer.
    async fn write(
        &self,
        job: impl FnOnce(oneshot::Sender<Result<(), StoreError>>) -> Job,
    ) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        let sent = self
            .writer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|writer| writer.send(job(tx)).is_ok());
        if !sent {
            return Err(self.stopped());
        }
        rx.await.map_err(|_| self.stopped())?
    }

    /// Runs `f` on the reading connection, on a blocking thread.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let reader = Arc::clone(&self.reader);
        blocking(move || {
            let mut conn = reader
                .lock()
                .map_err(|_| StoreError::Database("the store's reader was poisoned".into()))?;
            f(&mut conn)
        })
        .await
    }

    /// Takes the lease of run `id` with `job` (a create or an acquire): refused at once
    /// if this store holds it, else by the writer if a live holder does.
    async fn lease(
        &self,
        id: &str,
        job: impl FnOnce(Lessee, oneshot::Sender<Result<(), StoreError>>) -> Job,
    ) -> Result<SqliteLease, StoreError> {
        if !self
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_string())
        {
            return Err(StoreError::Locked(id.to_string()));
        }
        // From here, dropping the lease undoes the insert above (and deletes a row the
        // job may have written).
        let lease = SqliteLease {
            run_id: id.to_string(),
            holder: self.holder.clone(),
            held: self.held.clone(),
            writer: self.writer.clone(),
        };
        let lessee = Lessee {
            holder: self.holder.clone(),
            locks: self.locks.clone(),
        };
        self.write(|reply| job(lessee, reply)).await?;
        Ok(lease)
    }
}

impl RunStore for SqliteStore {
    fn create<'a>(&'a self, run: NewRun) -> BoxFuture<'a, Result<Box<dyn Lease>, StoreError>> {
        Box::pin(async move {
            let id = run.id.clone();
            let lease = self
                .lease(&id, |lessee, reply| Job::Create(run, lessee, reply))
                .await?;
            Ok(Box::new(lease) as Box<dyn Lease>)
        })
    }

    fn acquire<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Box<dyn Lease>, StoreError>> {
        Box::pin(async move {
            // Locked first, then checked: a run that finishes in between is seen finished.
            let lease = self
                .lease(id, |lessee, reply| {
                    Job::Acquire(id.to_string(), lessee, reply)
                })
                .await?;
            let summary = self.summary(id).await?;
            if summary.state == RunState::Finished {
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
        Box::pin(async move { self.write(|reply| Job::Append(id, batch, reply)).await })
    }

    fn load<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<LoadedRun, StoreError>> {
        let id = id.to_string();
        Box::pin(self.read(move |conn| {
            // One read transaction: a consistent snapshot of the run.
            let tx = conn.transaction().map_err(db_error)?;
            let loaded = load_run(&tx, &id);
            tx.finish().map_err(db_error)?;
            loaded
        }))
    }

    fn list<'a>(&'a self) -> BoxFuture<'a, Result<Vec<RunSummary>, StoreError>> {
        Box::pin(self.read(|conn| {
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT {SUMMARY_COLUMNS} FROM runs ORDER BY started_at_ms DESC, id DESC"
                ))
                .map_err(db_error)?;
            let rows = stmt.query_map([], summary_row).map_err(db_error)?;
            rows.map(|row| row.map_err(db_error)?).collect()
        }))
    }

    fn summary<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<RunSummary, StoreError>> {
        let id = id.to_string();
        Box::pin(self.read(move |conn| read_summary(conn, &id)))
    }

    fn events<'a>(
        &'a self,
        id: &'a str,
        from: u64,
        limit: u64,
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        let id = id.to_string();
        Box::pin(self.read(move |conn| {
            read_summary(conn, &id)?;
            let mut stmt = conn
                .prepare_cached(
                    "SELECT json FROM events WHERE run_id = ?1 AND seq >= ?2 ORDER BY seq LIMIT ?3",
                )
                .map_err(db_error)?;
            let rows = stmt
                .query_map(params![id, db_int(from), db_int(limit)], |row| row.get(0))
                .map_err(db_error)?;
            rows.map(|row| row.map_err(db_error)).collect()
        }))
    }

    fn run_bytes<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        let id = id.to_string();
        Box::pin(self.read(move |conn| {
            read_summary(conn, &id)?;
            let bytes: i64 = conn
                .query_row(
                    "SELECT
                       (SELECT COALESCE(SUM(length(bytes)), 0) FROM inputs WHERE run_id = ?1)
                     + (SELECT COALESCE(SUM(length(CAST(json AS BLOB))), 0) FROM events WHERE run_id = ?1)
                     + (SELECT COALESCE(SUM(length(history) + COALESCE(length(state), 0)), 0)
                          FROM checkpoints WHERE run_id = ?1)",
                    params![id],
                    |row| row.get(0),
                )
                .map_err(db_error)?;
            count(bytes, "byte count")
        }))
    }

    fn enqueue<'a>(&'a self, run: QueuedRun) -> BoxFuture<'a, Result<Enqueued, StoreError>> {
        Box::pin(async move {
            let enqueued = self
                .queue_write(move |c, now| enqueue_run(c, &run, now))
                .await;
            if self.purge.due() {
                // A write of its own: a failure leaves the keys for the next purge, an
                // hour on, and fails no submit. An expired key is replaced when reused
                // anyway; the purge only bounds the table.
                let _ = self
                    .queue_write(|c, now| {
                        c.prepare_cached("DELETE FROM idempotency_keys WHERE created_at_ms < ?1")
                            .and_then(|mut s| s.execute(params![now - IDEMPOTENCY_WINDOW_MS]))
                            .map_err(db_error)
                    })
                    .await;
            }
            enqueued
        })
    }

    fn claim<'a>(&'a self) -> BoxFuture<'a, Result<Option<Claim>, StoreError>> {
        Box::pin(async move {
            let lessee = Lessee {
                holder: self.holder.clone(),
                locks: self.locks.clone(),
            };
            let claimant = Claimant {
                held: self.held.clone(),
                writer: self.writer.clone(),
            };
            let order = claim_order(&self.takeover);
            let takeover = self.takeover.clone();
            let claimed = self
                .queue_write(move |c, _| {
                    for scan in order {
                        if scan == Scan::Abandoned {
                            takeover.done();
                        }
                        if let Some(run) = claim_run(c, &lessee, &claimant, scan)? {
                            return Ok(Some(run));
                        }
                    }
                    Ok(None)
                })
                .await?;
            Ok(claimed.map(|run| Claim {
                lease: Box::new(run.lease),
                agent: run.agent,
                cancel_requested: run.cancel_requested,
                traceparent: run.traceparent,
                loaded: run.loaded,
            }))
        })
    }

    fn request_cancel<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        let id = id.to_string();
        Box::pin(self.queue_write(move |c, _| {
            let changed = c
                .prepare_cached("UPDATE run_queue SET cancel_requested = 1 WHERE run_id = ?1")
                .and_then(|mut s| s.execute(params![id]))
                .map_err(db_error)?;
            if changed == 0 {
                return Err(StoreError::NotFound(id));
            }
            Ok(())
        }))
    }

    fn queue_entry<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<QueueEntry, StoreError>> {
        let id = id.to_string();
        Box::pin(self.read(move |conn| {
            let tx = conn.transaction().map_err(db_error)?;
            let entry = read_queue_entry(&tx, &id);
            tx.finish().map_err(db_error)?;
            entry
        }))
    }

    fn queue_counts<'a>(&'a self) -> BoxFuture<'a, Result<QueueCounts, StoreError>> {
        Box::pin(self.read(|conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT final_status, claimed, COUNT(*) FROM run_queue GROUP BY 1, 2",
                )
                .map_err(db_error)?;
            let rows = stmt
                .query_map([], |row| {
                    Ok((
                        row.get::<_, Option<String>>(0)?,
                        row.get::<_, i64>(1)?,
                        row.get::<_, i64>(2)?,
                    ))
                })
                .map_err(db_error)?;
            let mut counts = QueueCounts::default();
            for row in rows {
                let (status, claimed, n) = row.map_err(db_error)?;
                let status = match status {
                    Some(status) => QueueStatus::from_column(&status)?,
                    None => QueueStatus::of_claimed(claimed != 0),
                };
                let n = count(n, "run count")?;
                match counts.by_status.iter_mut().find(|(s, _)| *s == status) {
                    Some((_, total)) => *total += n,
                    None => counts.by_status.push((status, n)),
                }
            }
            Ok(counts)
        }))
    }
}

impl SqliteStore {
    /// Queues a queue write to the writer thread and waits for its answer.
    async fn queue_write<T: Send + 'static>(
        &self,
        write: impl FnOnce(&Connection, i64) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        let job = Job::Queue(Box::new(Write {
            write: Some(Box::new(write)),
            result: None,
            reply,
        }));
        let sent = self
            .writer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|writer| writer.send(job).is_ok());
        if !sent {
            return Err(self.stopped());
        }
        answer.await.map_err(|_| self.stopped())?
    }
}

/// Stores a queued run, or finds the run its idempotency key started.
fn enqueue_run(tx: &Connection, queued: &QueuedRun, now: i64) -> Result<Enqueued, StoreError> {
    if let Some(key) = &queued.idempotency_key {
        let existing: Option<(String, i64)> = tx
            .prepare_cached(
                "SELECT run_id, created_at_ms FROM idempotency_keys WHERE agent = ?1 AND key = ?2",
            )
            .and_then(|mut s| {
                s.query_row(params![queued.agent, key], |row| {
                    Ok((row.get(0)?, row.get(1)?))
                })
                .optional()
            })
            .map_err(db_error)?;
        if let Some((run_id, created)) = existing
            && created > now - IDEMPOTENCY_WINDOW_MS
        {
            return Ok(Enqueued::Existing(run_id));
        }
        tx.prepare_cached(
            "INSERT OR REPLACE INTO idempotency_keys (agent, key, run_id, created_at_ms)
             VALUES (?1, ?2, ?3, ?4)",
        )
        .and_then(|mut s| s.execute(params![queued.agent, key, queued.run.id, now]))
        .map_err(db_error)?;
    }
    insert_run(tx, &queued.run)?;
    tx.prepare_cached(
        "INSERT INTO run_queue (run_id, agent, enqueued_at_ms, traceparent)
         VALUES (?1, ?2, ?3, ?4)",
    )
    .and_then(|mut s| {
        s.execute(params![
            queued.run.id,
            queued.agent,
            queued.run.started_at_ms,
            queued.traceparent
        ])
    })
    .map_err(db_error)?;
    Ok(Enqueued::New(queued.run.id.clone()))
}

/// A run [`claim_run`] took, with its queue row.
struct ClaimedRow {
    /// Its lease, made in the claim's transaction: if the commit then fails, dropping it
    /// frees the run in this store again (and deletes a row that was never written).
    lease: SqliteLease,
    agent: String,
    cancel_requested: bool,
    traceparent: Option<String>,
    /// A new run as stored, read in the claim's transaction; `None` for a run taken over
    /// and for a row that does not read (the worker loads it, and fails it).
    loaded: Option<LoadedRun>,
}

/// What a claim needs to make a lease: this store's runs and its writer.
struct Claimant {
    held: Arc<Mutex<HashSet<String>>>,
    writer: Writer,
}

/// Takes the lease of the oldest open run `scan` looks for: new (never claimed), or
/// claimed with its holder gone. New runs have no lease to look at, so that scan touches
/// no holder file.
///
/// No double claim: the writer thread runs claims one at a time in its transaction
/// (`BEGIN IMMEDIATE` also excludes other processes' writers), and a run another live
/// store holds has a lease row naming it, which `take_lease` refuses. Runs this store
/// holds are skipped by name, without a file lock test. A row naming this store as holder of a run it does not hold is left by
/// a release that failed (a full disk): it is taken over like a dead process's.
fn claim_run(
    tx: &Connection,
    lessee: &Lessee,
    claimant: &Claimant,
    scan: Scan,
) -> Result<Option<ClaimedRow>, StoreError> {
    let abandoned = scan == Scan::Abandoned;
    let mut stmt = tx
        .prepare_cached(
            "SELECT q.run_id, l.holder, q.agent, q.cancel_requested, q.traceparent
             FROM run_queue q LEFT JOIN leases l ON l.run_id = q.run_id
             WHERE q.final_status IS NULL AND q.claimed = ?1
             ORDER BY q.enqueued_at_ms, q.run_id",
        )
        .map_err(db_error)?;
    let mut rows = stmt.query(params![abandoned]).map_err(db_error)?;
    while let Some(row) = rows.next().map_err(db_error)? {
        let id: String = row.get(0).map_err(db_error)?;
        let holder: Option<String> = row.get(1).map_err(db_error)?;
        match holder {
            Some(holder) if *holder != *lessee.holder && holder_alive(&lessee.locks, &holder) => {
                continue;
            }
            _ => {}
        }
        // Runs this store holds are skipped here.
        if !claimant
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone())
        {
            continue;
        }
        // From here, dropping the lease (an error below, or a failed commit) frees the run.
        let lease = SqliteLease {
            run_id: id.clone(),
            holder: lessee.holder.clone(),
            held: claimant.held.clone(),
            writer: claimant.writer.clone(),
        };
        let agent = row.get(2).map_err(db_error)?;
        let cancel_requested = row.get::<_, i64>(3).map_err(db_error)? != 0;
        let traceparent = row.get(4).map_err(db_error)?;
        take_lease(tx, &id, lessee)?;
        tx.prepare_cached("UPDATE run_queue SET claimed = 1 WHERE run_id = ?1")
            .and_then(|mut s| s.execute(params![id]))
            .map_err(db_error)?;
        // A new run's journal is empty: reading it here, under the write lock, costs
        // less than a load on the reader afterwards. A run taken over may have a long
        // journal, which the writer must not spend its time reading. A run that does not
        // read is claimed all the same: the worker's own load fails, and it ends the run
        // failed rather than leave it first in the queue for every claim to trip on.
        let loaded = if abandoned {
            None
        } else {
            load_run(tx, &id).ok()
        };
        return Ok(Some(ClaimedRow {
            lease,
            agent,
            cancel_requested,
            traceparent,
            loaded,
        }));
    }
    Ok(None)
}

fn read_queue_entry(conn: &Connection, id: &str) -> Result<QueueEntry, StoreError> {
    let summary = read_summary(conn, id)?;
    let (agent, claimed, cancel, traceparent): (String, i64, i64, Option<String>) = conn
        .prepare_cached(
            "SELECT agent, claimed, cancel_requested, traceparent FROM run_queue
             WHERE run_id = ?1",
        )
        .and_then(|mut s| {
            s.query_row(params![id], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })
            .optional()
        })
        .map_err(db_error)?
        .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
    let status = match &summary.outcome {
        Some(outcome) if summary.state == RunState::Finished => QueueStatus::of_outcome(outcome),
        _ => QueueStatus::of_claimed(claimed != 0),
    };
    Ok(QueueEntry {
        summary,
        agent,
        status,
        cancel_requested: cancel != 0,
        traceparent,
    })
}

/// The columns [`summary_row`] reads, in order.
const SUMMARY_COLUMNS: &str = "id, agent, bundle_hash, state, steps, started_at_ms, updated_at_ms, \
     input_count, event_count, outcome";

fn summary_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Result<RunSummary, StoreError>> {
    let state: String = row.get(3)?;
    let steps: i64 = row.get(4)?;
    let inputs: i64 = row.get(7)?;
    let events: i64 = row.get(8)?;
    let outcome: Option<String> = row.get(9)?;
    let summary = (|| {
        Ok(RunSummary {
            id: row.get(0).map_err(db_error)?,
            agent: row.get(1).map_err(db_error)?,
            bundle_hash: row.get(2).map_err(db_error)?,
            state: RunState::from_column(&state)?,
            steps: count(steps, "step count")?,
            started_at_ms: row.get(5).map_err(db_error)?,
            updated_at_ms: row.get(6).map_err(db_error)?,
            inputs: count(inputs, "input count")?,
            events: count(events, "event count")?,
            outcome: outcome
                .as_deref()
                .map(|o| json_column(o, "the outcome"))
                .transpose()?,
        })
    })();
    Ok(summary)
}

fn read_summary(conn: &Connection, id: &str) -> Result<RunSummary, StoreError> {
    let mut stmt = conn
        .prepare_cached(&format!("SELECT {SUMMARY_COLUMNS} FROM runs WHERE id = ?1"))
        .map_err(db_error)?;
    stmt.query_row(params![id], summary_row)
        .optional()
        .map_err(db_error)?
        .ok_or_else(|| StoreError::NotFound(id.to_string()))?
}

fn load_run(conn: &Connection, id: &str) -> Result<LoadedRun, StoreError> {
    let summary = read_summary(conn, id)?;
    let (bundle, options): (Vec<u8>, String) = conn
        .query_row(
            "SELECT b.bytes, r.options FROM runs r JOIN bundles b ON b.hash = r.bundle_hash
             WHERE r.id = ?1",
            params![id],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()
        .map_err(db_error)?
        .ok_or_else(|| StoreError::Corrupt(format!("the bundle of run `{id}` is missing")))?;
    let mut stmt = conn
        .prepare_cached(
            "SELECT inputs, history_start, history, state FROM checkpoints
             WHERE run_id = ?1 ORDER BY seq",
        )
        .map_err(db_error)?;
    let checkpoints = stmt
        .query_map(params![id], |row| {
            let inputs: i64 = row.get(0)?;
            let history_start: i64 = row.get(1)?;
            Ok((inputs, history_start, row.get(2)?, row.get(3)?))
        })
        .map_err(db_error)?
        .map(|row| {
            let (inputs, history_start, history, state) = row.map_err(db_error)?;
            Ok(StoredCheckpoint {
                inputs: count(inputs, "checkpoint input count")?,
                history_start: count(history_start, "checkpoint history start")?,
                history,
                state,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    let after = checkpoints.last().map_or(0, |c| c.inputs);
    let mut stmt = conn
        .prepare_cached("SELECT bytes FROM inputs WHERE run_id = ?1 AND seq >= ?2 ORDER BY seq")
        .map_err(db_error)?;
    let inputs = stmt
        .query_map(params![id, db_int(after)], |row| row.get(0))
        .map_err(db_error)?
        .map(|row| row.map_err(db_error))
        .collect::<Result<Vec<Vec<u8>>, StoreError>>()?;
    Ok(LoadedRun {
        events: summary.events,
        options: json_column(&options, "the run options")?,
        summary,
        bundle,
        checkpoints,
        inputs,
    })
}

/// The writer thread: takes every queued job, commits them together, answers each.
fn write_loop(mut conn: Connection, jobs: mpsc::Receiver<Job>) {
    while let Ok(first) = jobs.recv() {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match jobs.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        commit_group(&mut conn, group);
    }
}

fn commit_group(conn: &mut Connection, group: Vec<Job>) {
    let now = now_ms();
    let mut answers = Vec::with_capacity(group.len());
    let mut queue_writes: Vec<Box<dyn QueueWrite>> = Vec::new();
    let committed = match begin(conn) {
        Ok(mut tx) => {
            for job in group {
                answers.push(match job {
                    Job::Create(run, lessee, reply) => (
                        reply,
                        in_savepoint(&mut tx, |c| {
                            // The lease first: an id another process holds is `Locked`,
                            // one that merely exists is `Exists`.
                            take_lease(c, &run.id, &lessee)?;
                            insert_run(c, &run)
                        }),
                    ),
                    Job::Acquire(id, lessee, reply) => (
                        reply,
                        in_savepoint(&mut tx, |c| take_lease(c, &id, &lessee)),
                    ),
                    Job::Append(id, batch, reply) => (
                        reply,
                        in_savepoint(&mut tx, |c| append_batch(c, &id, &batch, now)),
                    ),
                    Job::Release(id, holder) => {
                        // Nobody waits: a failure leaves a row whose holder is this
                        // store, taken over once the store is closed.
                        let _ = in_savepoint(&mut tx, |c| release_lease(c, &id, &holder));
                        continue;
                    }
                    Job::Queue(mut write) => {
                        write.run(&mut tx, now);
                        queue_writes.push(write);
                        continue;
                    }
                });
            }
            tx.commit().map_err(db_error)
        }
        Err(e) => {
            answers.extend(group.into_iter().filter_map(|job| match job {
                Job::Create(_, _, reply) | Job::Acquire(_, _, reply) | Job::Append(_, _, reply) => {
                    Some((reply, Ok(())))
                }
                Job::Release(..) => None,
                Job::Queue(write) => {
                    queue_writes.push(write);
                    None
                }
            }));
            Err(e)
        }
    };
    for write in queue_writes {
        write.answer(committed.as_ref().map(|_| ()));
    }
    for (reply, result) in answers {
        let result = match (&committed, result) {
            (Err(e), Ok(())) => Err(StoreError::Database(format!("the commit failed: {e}"))),
            (_, result) => result,
        };
        // A caller that stopped waiting has nothing to be told.
        let _ = reply.send(result);
    }
}

/// Runs one job in a savepoint of the group's transaction: undone alone if it fails.
fn in_savepoint(
    tx: &mut Transaction<'_>,
    job: impl FnOnce(&Connection) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    in_savepoint_with(tx, job)
}

/// [`in_savepoint`] for a job with a result.
fn in_savepoint_with<T>(
    tx: &mut Transaction<'_>,
    job: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let savepoint = tx.savepoint().map_err(db_error)?;
    let value = job(&savepoint)?;
    // (Dropping an uncommitted savepoint rolls it back.)
    savepoint.commit().map_err(db_error)?;
    Ok(value)
}

/// Gives `lessee` the lease of run `id`, unless a live holder has it.
fn take_lease(tx: &Connection, id: &str, lessee: &Lessee) -> Result<(), StoreError> {
    let holder: Option<String> = tx
        .prepare_cached("SELECT holder FROM leases WHERE run_id = ?1")
        .and_then(|mut s| s.query_row(params![id], |row| row.get(0)).optional())
        .map_err(db_error)?;
    match holder {
        None => {}
        // This store's own row, left by a release that failed: the caller checked that
        // this store does not hold the run (its own holder file is locked, by itself).
        Some(holder) if *holder == *lessee.holder => {}
        Some(holder) if holder_alive(&lessee.locks, &holder) => {
            return Err(StoreError::Locked(id.to_string()));
        }
        // A dead process's lease.
        Some(_) => {}
    }
    tx.prepare_cached("INSERT OR REPLACE INTO leases (run_id, holder) VALUES (?1, ?2)")
        .and_then(|mut s| s.execute(params![id, &*lessee.holder]))
        .map_err(db_error)?;
    Ok(())
}

fn release_lease(tx: &Connection, id: &str, holder: &str) -> Result<(), StoreError> {
    tx.prepare_cached("DELETE FROM leases WHERE run_id = ?1 AND holder = ?2")
        .and_then(|mut s| s.execute(params![id, holder]))
        .map_err(db_error)?;
    Ok(())
}

/// True if the store named `holder` is open: its file in `locks` is locked. A name that
/// is not one this code makes (a damaged row) is no live holder's.
fn holder_alive(locks: &Path, holder: &str) -> bool {
    if !is_holder_name(holder) {
        return false;
    }
    let Ok(file) = File::open(locks.join(holder)) else {
        return false;
    };
    match file.try_lock() {
        // Nobody holds it: its store is closed or its process dead. (Our lock goes with
        // `file`.)
        Ok(()) => false,
        Err(TryLockError::WouldBlock) => true,
        // Unsure: assume alive rather than take a lease that may be held.
        Err(TryLockError::Error(_)) => true,
    }
}

/// `<pid>-<16 hex digits>.holder`.
fn is_holder_name(name: &str) -> bool {
    name.strip_suffix(".holder").is_some_and(|stem| {
        !stem.is_empty()
            && stem.len() <= 40
            && stem.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
    })
}

/// Creates and locks this store's holder file in `locks`, and deletes the files of
/// holders that are gone.
fn hold(locks: &Path) -> Result<(Arc<str>, File), StoreError> {
    std::fs::create_dir_all(locks).map_err(|e| {
        StoreError::Open(format!(
            "cannot create the lock directory {}: {e}",
            locks.display()
        ))
    })?;
    if let Ok(entries) = std::fs::read_dir(locks) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            if let Some(name) = name.to_str()
                && is_holder_name(name)
                && !holder_alive(locks, name)
            {
                // Their leases' rows are taken over when asked for; the files go now.
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    let name = format!("{}-{:016x}.holder", std::process::id(), fastrand::u64(..));
    let path = locks.join(&name);
    // Locked under a name no sweep above looks at, then renamed: a file that appeared
    // unlocked under a holder's name would be deleted (or briefly locked) by another
    // process's sweep, and this store's own lock then refused or its leases lost.
    let pending = locks.join(format!("{name}.new"));
    let file = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&pending)
        .map_err(|e| StoreError::Open(format!("cannot create {}: {e}", pending.display())))?;
    let locked = match file.try_lock() {
        Ok(()) => std::fs::rename(&pending, &path)
            .map_err(|e| StoreError::Open(format!("cannot rename {}: {e}", pending.display()))),
        Err(TryLockError::WouldBlock) => Err(StoreError::Open(format!(
            "{} is locked by another process",
            pending.display()
        ))),
        Err(TryLockError::Error(e)) => Err(StoreError::Open(format!(
            "cannot lock {}: {e}",
            pending.display()
        ))),
    };
    match locked {
        Ok(()) => Ok((Arc::from(name), file)),
        Err(e) => {
            let _ = std::fs::remove_file(&pending);
            Err(e)
        }
    }
}

fn insert_run(tx: &Connection, run: &NewRun) -> Result<(), StoreError> {
    let exists: Option<i64> = tx
        .query_row("SELECT 1 FROM runs WHERE id = ?1", params![run.id], |row| {
            row.get(0)
        })
        .optional()
        .map_err(db_error)?;
    if exists.is_some() {
        return Err(StoreError::Exists(run.id.clone()));
    }
    tx.prepare_cached("INSERT OR IGNORE INTO bundles (hash, bytes) VALUES (?1, ?2)")
        .and_then(|mut s| s.execute(params![run.bundle_hash, run.bundle]))
        .map_err(db_error)?;
    tx.prepare_cached(
        "INSERT INTO runs (id, agent, bundle_hash, state, steps, started_at_ms, updated_at_ms,
                           options, outcome, input_count, event_count)
         VALUES (?1, ?2, ?3, ?4, 0, ?5, ?5, ?6, NULL, 0, 0)",
    )
    .and_then(|mut s| {
        s.execute(params![
            run.id,
            run.agent,
            run.bundle_hash,
            RunState::Running.as_str(),
            run.started_at_ms,
            run.options.to_string(),
        ])
    })
    .map_err(db_error)?;
    Ok(())
}

fn append_batch(tx: &Connection, id: &str, batch: &Batch, now: i64) -> Result<(), StoreError> {
    let (state, input_count, event_count): (String, i64, i64) = tx
        .prepare_cached("SELECT state, input_count, event_count FROM runs WHERE id = ?1")
        .and_then(|mut s| {
            s.query_row(params![id], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?))
            })
            .optional()
        })
        .map_err(db_error)?
        .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
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
    {
        let mut insert = tx
            .prepare_cached("INSERT INTO inputs (run_id, seq, bytes) VALUES (?1, ?2, ?3)")
            .map_err(db_error)?;
        for (i, bytes) in (input_count..).zip(&batch.inputs) {
            insert.execute(params![id, i, bytes]).map_err(db_error)?;
        }
        let mut insert = tx
            .prepare_cached("INSERT INTO events (run_id, seq, json) VALUES (?1, ?2, ?3)")
            .map_err(db_error)?;
        for (i, json) in (event_count..).zip(&batch.events) {
            insert.execute(params![id, i, json]).map_err(db_error)?;
        }
    }
    if let Some(checkpoint) = &batch.checkpoint {
        tx.prepare_cached(
            "UPDATE checkpoints SET state = NULL WHERE run_id = ?1 AND state IS NOT NULL",
        )
        .and_then(|mut s| s.execute(params![id]))
        .map_err(db_error)?;
        tx.prepare_cached(
            "INSERT INTO checkpoints (run_id, seq, inputs, history_start, history, state)
             VALUES (?1, (SELECT COALESCE(MAX(seq) + 1, 0) FROM checkpoints WHERE run_id = ?1),
                     ?2, ?3, ?4, ?5)",
        )
        .and_then(|mut s| {
            s.execute(params![
                id,
                db_int(checkpoint.inputs),
                db_int(checkpoint.history_start),
                checkpoint.history,
                checkpoint.state,
            ])
        })
        .map_err(db_error)?;
    }
    let (state, outcome) = match &batch.outcome {
        Some(outcome) => {
            // A queued run leaves the claimable set (no row for a run `create` made).
            let status = QueueStatus::of_outcome(outcome).as_str();
            tx.prepare_cached("UPDATE run_queue SET final_status = ?2 WHERE run_id = ?1")
                .and_then(|mut s| s.execute(params![id, status]))
                .map_err(db_error)?;
            (RunState::Finished, Some(outcome.to_string()))
        }
        None => (RunState::Running, None),
    };
    tx.prepare_cached(
        "UPDATE runs SET steps = ?2, updated_at_ms = ?3, input_count = ?4, event_count = ?5,
                         state = ?6, outcome = COALESCE(?7, outcome)
         WHERE id = ?1",
    )
    .and_then(|mut s| {
        s.execute(params![
            id,
            db_int(batch.steps),
            now,
            input_count + db_int(batch.inputs.len() as u64),
            event_count + db_int(batch.events.len() as u64),
            state.as_str(),
            outcome,
        ])
    })
    .map_err(db_error)?;
    Ok(())
}

/// Refuses a path that names something other than a regular file (a device such as
/// `/dev/null`, a directory, a FIFO) before SQLite opens it: SQLite would create its
/// journal and this store its lock directory beside it. A missing file is a new store.
fn check_file(path: &Path) -> Result<(), StoreError> {
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => Err(StoreError::Open(format!(
            "{} is not a regular file",
            path.display()
        ))),
        _ => Ok(()),
    }
}

/// Opens a connection with the store's settings.
///
/// The file is identified before anything is written to it: switching a foreign
/// database to WAL mode would rewrite its header and leave it in WAL mode.
fn connect(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open(path).map_err(|e| open_failure(path, &e))?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(db_error)?;
    // The first read of the file: a file that is not SQLite fails here, another
    // application's database a line below.
    identify(&conn)?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .map_err(db_error)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Open(format!(
            "{}: cannot switch to WAL mode (got `{mode}`)",
            path.display()
        )));
    }
    // See the module's doc: a killed process loses nothing, an OS crash may lose the last
    // commits.
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(db_error)?;
    Ok(conn)
}

/// Opens a read-only connection that writes nothing, not even SQLite's shared-memory
/// files: `immutable` when the file has no WAL file beside it (no writer has it open, or
/// one is about to start: a read may then fail, never write), plain `mode=ro` when it has
/// one (a writer may be at work: its WAL holds the newest commits).
fn connect_read_only(path: &Path) -> Result<Connection, StoreError> {
    if !path.exists() {
        return empty_store();
    }
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let absolute = std::path::absolute(path)
        .map_err(|e| StoreError::Open(format!("{}: {e}", path.display())))?;
    let query = if Path::new(&wal).exists() {
        "mode=ro"
    } else {
        "mode=ro&immutable=1"
    };
    let uri = format!("file:{}?{query}", uri_path(&absolute));
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_URI
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(&uri, flags).map_err(|e| open_failure(path, &e))?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(db_error)?;
    let (app_id, version) = identify(&conn)?;
    if app_id != APPLICATION_ID {
        // `identify` refused every foreign file: this one is empty.
        return empty_store();
    }
    check_meta(&conn, version)?;
    Ok(conn)
}

/// A store with nothing in it yet, in memory: what a missing or empty file reads as.
fn empty_store() -> Result<Connection, StoreError> {
    let conn = Connection::open_in_memory().map_err(db_error)?;
    migrate(&conn)?;
    Ok(conn)
}

/// `path` for a SQLite URI: every byte but letters, digits and `/-_.~` percent-encoded
/// (`?`, `#` and `%` would otherwise end or escape the path).
fn uri_path(path: &Path) -> String {
    let mut out = String::new();
    for &byte in path.as_os_str().as_encoded_bytes() {
        if byte.is_ascii_alphanumeric() || b"/-_.~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Tries `open` again while it fails because another process holds the file's lock, at
/// most [`OPEN_ATTEMPTS`] times, pausing a little longer (and a random part) each time.
fn retry_busy<T>(mut open: impl FnMut() -> Result<T, StoreError>) -> Result<T, StoreError> {
    let mut pause = FIRST_PAUSE;
    for _ in 1..OPEN_ATTEMPTS {
        match open() {
            Err(StoreError::Busy(_)) => {
                std::thread::sleep(pause + pause.mul_f64(fastrand::f64()));
                pause = (pause * 2).min(MAX_PAUSE);
            }
            result => return result,
        }
    }
    open()
}

/// Begins the group's transaction, waiting for another process's writer: SQLite's busy
/// timeout first, then a few tries more.
fn begin(conn: &Connection) -> Result<Transaction<'_>, StoreError> {
    let mut pause = FIRST_PAUSE;
    for _ in 1..BEGIN_ATTEMPTS {
        match Transaction::new_unchecked(conn, TransactionBehavior::Immediate) {
            Err(e) if is_busy(&e) => {
                std::thread::sleep(pause + pause.mul_f64(fastrand::f64()));
                pause = (pause * 2).min(MAX_PAUSE);
            }
            result => return result.map_err(db_error),
        }
    }
    Transaction::new_unchecked(conn, TransactionBehavior::Immediate).map_err(db_error)
}

/// Checks that the file is an aplc store (or empty), and brings its schema up to date.
fn migrate(conn: &Connection) -> Result<(), StoreError> {
    let (app_id, version) = identify(conn)?;
    if app_id == APPLICATION_ID && version == SCHEMA_VERSION {
        return check_meta(conn, version);
    }
    // Immediate: two processes creating the same new file do not both migrate it.
    conn.execute_batch("BEGIN IMMEDIATE").map_err(db_error)?;
    let result = (|| {
        let (app_id, version) = identify(conn)?;
        if app_id == APPLICATION_ID {
            check_meta(conn, version)?;
        }
        for (to, sql) in MIGRATIONS.iter().filter(|(to, _)| *to > version) {
            conn.execute_batch(sql).map_err(db_error)?;
            conn.pragma_update(None, "user_version", to)
                .map_err(db_error)?;
        }
        conn.execute(
            "INSERT INTO aplc_meta (key, value) VALUES ('magic', ?1), ('schema_version', ?2)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            params![MAGIC, SCHEMA_VERSION.to_string()],
        )
        .map_err(db_error)?;
        conn.pragma_update(None, "application_id", APPLICATION_ID)
            .map_err(db_error)?;
        Ok(())
    })();
    match result {
        Ok(()) => conn.execute_batch("COMMIT").map_err(db_error),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// The file's application id and schema version, read without writing anything. Another
/// application's database (an id of its own, or tables without aplc's id) and a newer
/// schema are refused here.
fn identify(conn: &Connection) -> Result<(i64, i64), StoreError> {
    // One statement, so one snapshot: read apart, the id could predate another
    // process's creation of the schema and the tables follow it.
    let (app_id, version, tables): (i64, i64, Option<String>) = conn
        .query_row(
            "SELECT (SELECT application_id FROM pragma_application_id()),
                    (SELECT user_version FROM pragma_user_version()),
                    (SELECT group_concat(name, ', ') FROM
                       (SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name))",
            [],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .map_err(db_error)?;
    if app_id == APPLICATION_ID {
        if version > SCHEMA_VERSION {
            return Err(StoreError::NewerSchema {
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        return Ok((app_id, version));
    }
    if app_id != 0 || tables.is_some() {
        return Err(StoreError::Foreign(format!(
            "a SQLite database of another application (application_id {app_id}, tables: {})",
            tables.as_deref().unwrap_or("none")
        )));
    }
    Ok((app_id, version))
}

/// The `aplc_meta` table agrees with the pragmas: its magic marks an aplc store, and its
/// schema version is `PRAGMA user_version` (the PostgreSQL store reads the same row).
fn check_meta(conn: &Connection, version: i64) -> Result<(), StoreError> {
    let meta = |key: &str| -> Result<Option<String>, StoreError> {
        conn.query_row(
            "SELECT value FROM aplc_meta WHERE key = ?1",
            params![key],
            |row| row.get(0),
        )
        .optional()
        .map_err(db_error)
    };
    if meta("magic")?.as_deref() != Some(MAGIC) {
        return Err(StoreError::Corrupt(
            "the file is marked as an aplc store but its `aplc_meta` table is not".into(),
        ));
    }
    let recorded = meta("schema_version")?.unwrap_or_default();
    if recorded.parse::<i64>().ok() != Some(version) {
        return Err(StoreError::Corrupt(format!(
            "the schema version in `aplc_meta` (`{}`) is not the file's user_version ({version})",
            recorded.escape_debug()
        )));
    }
    Ok(())
}

/// Runs a blocking closure off the tokio workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Database(format!("a store task failed: {e}")))?
}

/// What SQLite's error means for the caller, if it means more than "a database error".
fn open_error(error: &rusqlite::Error) -> Option<StoreError> {
    match error.sqlite_error_code()? {
        ErrorCode::NotADatabase => Some(StoreError::Foreign(
            "the file is not a SQLite database".into(),
        )),
        ErrorCode::DatabaseCorrupt => Some(StoreError::Corrupt(error.to_string())),
        ErrorCode::CannotOpen => Some(StoreError::Open(error.to_string())),
        _ => None,
    }
}

fn db_error(error: rusqlite::Error) -> StoreError {
    if is_busy(&error) {
        return StoreError::Busy(error.to_string());
    }
    open_error(&error).unwrap_or_else(|| StoreError::Database(error.to_string()))
}

/// A lock another connection holds: worth trying again.
fn is_busy(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// A failure to open the file, naming it.
fn open_failure(path: &Path, error: &rusqlite::Error) -> StoreError {
    if is_busy(error) {
        return StoreError::Busy(error.to_string());
    }
    open_error(error).unwrap_or_else(|| StoreError::Open(format!("{}: {error}", path.display())))
}

/// Opens (creating and migrating if needed) the SQLite store at `path` ([`super::open`]).
pub(super) async fn open(path: &Path) -> Result<Arc<dyn RunStore>, StoreError> {
    Ok(Arc::new(SqliteStore::open(path).await?))
}

/// Opens the SQLite store at `path` read-only ([`super::open_read_only`]).
pub(super) async fn open_read_only(path: &Path) -> Result<Arc<dyn RunStore>, StoreError> {
    Ok(Arc::new(SqliteStore::open_read_only(path).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_this_code_makes_are_holders() {
        assert!(is_holder_name("1234-00ff00ff00ff00ff.holder"));
        assert!(!is_holder_name("../../etc/passwd"));
        assert!(!is_holder_name("a/b.holder"));
        assert!(!is_holder_name(".holder"));
        assert!(!is_holder_name("1234-00ff.lock"));
    }
}

//! The SQLite run store: one file in WAL mode, a writer thread that group-commits, and a
//! lock file per run for the lease.
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
//! **Leases** are OS file locks (`flock`) on `<db file>.locks/<run>.lock`: the kernel
//! releases them when the holding process dies, however it dies. Lock files are left in
//! place: removing one could race a process that just opened it.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};

use rusqlite::{
    Connection, ErrorCode, OptionalExtension, Transaction, TransactionBehavior, params,
};
use tokio::sync::oneshot;

use super::{
    Batch, Lease, LoadedRun, MAGIC, NewRun, RunState, RunStore, RunSummary, SCHEMA_VERSION,
    StoreError, StoredCheckpoint, count, db_int, json_column, now_ms,
};
use crate::driver::BoxFuture;

/// `PRAGMA application_id` of an aplc store: "aplc" in ASCII.
const APPLICATION_ID: i64 = 0x6170_6c63;

/// How long a statement waits for another process's write lock before failing.
const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The most jobs committed in one transaction (bounds the latency of the first).
const MAX_GROUP: usize = 512;

/// Migrations, by the version they lead to. Version 1 is the first schema.
const MIGRATIONS: &[(i64, &str)] = &[(
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
     );",
)];

/// The SQLite store. The writer thread ends when the store is dropped (its channel
/// closes), after the jobs already queued.
#[derive(Debug)]
pub(super) struct SqliteStore {
    locks: PathBuf,
    /// `None` only while dropping.
    writer: Option<mpsc::Sender<Job>>,
    writer_thread: Option<std::thread::JoinHandle<()>>,
    reader: Arc<Mutex<Connection>>,
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        // Closing the channel ends the writer thread after the jobs already queued (the
        // wait is at most one group's commit). With the reader, dropped next, the last
        // connection closes and SQLite checkpoints the WAL into the file, so whoever opens
        // it next finds one file.
        self.writer = None;
        if let Some(thread) = self.writer_thread.take() {
            let _ = thread.join();
        }
    }
}

/// A lease: the open, locked lock file. Dropping it closes the file, which unlocks it.
#[derive(Debug)]
struct SqliteLease {
    run_id: String,
    _file: File,
}

impl Lease for SqliteLease {
    fn run_id(&self) -> &str {
        &self.run_id
    }
}

/// A write for the writer thread, with where to send its result.
enum Job {
    Create(NewRun, oneshot::Sender<Result<(), StoreError>>),
    Append(String, Batch, oneshot::Sender<Result<(), StoreError>>),
}

impl SqliteStore {
    /// Opens the file (creating and migrating it if needed) and starts the writer thread.
    pub(super) async fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        let path = path.to_path_buf();
        blocking(move || {
            let writer = connect(&path)?;
            migrate(&writer)?;
            let reader = connect(&path)?;
            let (tx, rx) = mpsc::channel();
            let writer_thread = std::thread::Builder::new()
                .name("aplc-store-writer".into())
                .spawn(move || write_loop(writer, rx))
                .map_err(|e| StoreError::Open(format!("cannot start the writer thread: {e}")))?;
            let mut locks = path.clone().into_os_string();
            locks.push(".locks");
            Ok(SqliteStore {
                locks: locks.into(),
                writer: Some(tx),
                writer_thread: Some(writer_thread),
                reader: Arc::new(Mutex::new(reader)),
            })
        })
        .await
    }

    /// Queues a job and waits for the writer's answer.
    async fn write(
        &self,
        job: impl FnOnce(oneshot::Sender<Result<(), StoreError>>) -> Job,
    ) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        let sent = self
            .writer
            .as_ref()
            .is_some_and(|writer| writer.send(job(tx)).is_ok());
        if !sent {
            return Err(StoreError::Database(
                "the store's writer thread has stopped".into(),
            ));
        }
        rx.await
            .map_err(|_| StoreError::Database("the store's writer thread has stopped".into()))?
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

    /// Takes the lock file of run `id`, or fails with [`StoreError::Locked`].
    async fn lock(&self, id: &str) -> Result<SqliteLease, StoreError> {
        let dir = self.locks.clone();
        let run_id = id.to_string();
        blocking(move || {
            std::fs::create_dir_all(&dir).map_err(|e| {
                StoreError::Open(format!(
                    "cannot create the lock directory {}: {e}",
                    dir.display()
                ))
            })?;
            let file_path = dir.join(lock_file_name(&run_id));
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&file_path)
                .map_err(|e| {
                    StoreError::Open(format!(
                        "cannot open the lock file {}: {e}",
                        file_path.display()
                    ))
                })?;
            match file.try_lock() {
                Ok(()) => Ok(SqliteLease {
                    run_id,
                    _file: file,
                }),
                Err(TryLockError::WouldBlock) => Err(StoreError::Locked(run_id)),
                Err(TryLockError::Error(e)) => Err(StoreError::Database(format!(
                    "cannot lock {}: {e}",
                    file_path.display()
                ))),
            }
        })
        .await
    }
}

impl RunStore for SqliteStore {
    fn create<'a>(&'a self, run: NewRun) -> BoxFuture<'a, Result<Box<dyn Lease>, StoreError>> {
        Box::pin(async move {
            let lease = self.lock(&run.id).await?;
            self.write(|reply| Job::Create(run, reply)).await?;
            Ok(Box::new(lease) as Box<dyn Lease>)
        })
    }

    fn acquire<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Box<dyn Lease>, StoreError>> {
        Box::pin(async move {
            // Locked first, then checked: a run that finishes in between is seen finished.
            let lease = self.lock(id).await?;
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
    let committed = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(mut tx) => {
            for job in group {
                answers.push(match job {
                    Job::Create(run, reply) => {
                        (reply, in_savepoint(&mut tx, |c| insert_run(c, &run)))
                    }
                    Job::Append(id, batch, reply) => (
                        reply,
                        in_savepoint(&mut tx, |c| append_batch(c, &id, &batch, now)),
                    ),
                });
            }
            tx.commit().map_err(db_error)
        }
        Err(e) => {
            answers.extend(group.into_iter().map(|job| match job {
                Job::Create(_, reply) | Job::Append(_, _, reply) => (reply, Ok(())),
            }));
            Err(db_error(e))
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

/// Runs one job in a savepoint of the group's transaction: undone alone if it fails.
fn in_savepoint(
    tx: &mut Transaction<'_>,
    job: impl FnOnce(&Connection) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let savepoint = tx.savepoint().map_err(db_error)?;
    job(&savepoint)?;
    // (Dropping an uncommitted savepoint rolls it back.)
    savepoint.commit().map_err(db_error)
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
        Some(outcome) => (RunState::Finished, Some(outcome.to_string())),
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

/// Opens a connection with the store's settings.
fn connect(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open(path).map_err(|e| match open_error(&e) {
        Some(err) => err,
        None => StoreError::Open(format!("{}: {e}", path.display())),
    })?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(db_error)?;
    // The first read of the file: a file that is not SQLite fails here.
    let _: i64 = conn
        .query_row("PRAGMA application_id", [], |row| row.get(0))
        .map_err(db_error)?;
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

/// Checks that the file is an aplc store (or empty), and brings its schema up to date.
fn migrate(conn: &Connection) -> Result<(), StoreError> {
    let (app_id, version) = identify(conn)?;
    if app_id == APPLICATION_ID && version == SCHEMA_VERSION {
        return check_meta(conn);
    }
    // Immediate: two processes creating the same new file do not both migrate it.
    conn.execute_batch("BEGIN IMMEDIATE").map_err(db_error)?;
    let result = (|| {
        let (app_id, version) = identify(conn)?;
        if app_id != APPLICATION_ID {
            let tables: Vec<String> = conn
                .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
                .and_then(|mut s| s.query_map([], |row| row.get(0))?.collect())
                .map_err(db_error)?;
            if app_id != 0 || !tables.is_empty() {
                return Err(StoreError::Foreign(format!(
                    "a SQLite database of another application (application_id {app_id}, tables: {})",
                    if tables.is_empty() {
                        "none".to_string()
                    } else {
                        tables.join(", ")
                    }
                )));
            }
        } else {
            check_meta(conn)?;
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

/// The file's application id and schema version; a newer schema is refused here.
fn identify(conn: &Connection) -> Result<(i64, i64), StoreError> {
    let app_id: i64 = conn
        .query_row("PRAGMA application_id", [], |row| row.get(0))
        .map_err(db_error)?;
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(db_error)?;
    if app_id == APPLICATION_ID && version > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    Ok((app_id, version))
}

/// The `aplc_meta` table agrees with the pragmas.
fn check_meta(conn: &Connection) -> Result<(), StoreError> {
    let magic: Option<String> = conn
        .query_row(
            "SELECT value FROM aplc_meta WHERE key = 'magic'",
            [],
            |row| row.get(0),
        )
        .optional()
        .map_err(db_error)?;
    if magic.as_deref() != Some(MAGIC) {
        return Err(StoreError::Corrupt(
            "the file is marked as an aplc store but its `aplc_meta` table is not".into(),
        ));
    }
    Ok(())
}

/// The lock file's name for a run id: the id itself when it is plain, else an escaped
/// form; very long ids are cut and completed with a hash (a collision only makes two
/// runs share a lock).
fn lock_file_name(id: &str) -> String {
    let mut name = String::with_capacity(id.len() + 5);
    for byte in id.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_' {
            name.push(byte as char);
        } else {
            name.push_str(&format!("%{byte:02X}"));
        }
    }
    if name.len() > 160 {
        // FNV-1a: stable across builds and processes, unlike std's hasher.
        let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        name.truncate(120);
        name.push_str(&format!("~{hash:016x}"));
    }
    name.push_str(".lock");
    name
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
    open_error(&error).unwrap_or_else(|| StoreError::Database(error.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_file_names_are_safe_and_distinct() {
        assert_eq!(lock_file_name("run-1_a"), "run-1_a.lock");
        assert_eq!(lock_file_name("a/b"), "a%2Fb.lock");
        assert_ne!(lock_file_name("a/b"), lock_file_name("a%2Fb"));
        let long = "x".repeat(300);
        let name = lock_file_name(&long);
        assert!(name.len() < 160, "{name}");
        assert_ne!(name, lock_file_name(&"x".repeat(301)));
    }
}

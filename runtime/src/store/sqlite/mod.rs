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
//!
//! Here: the store, opening it, its reader and writer queue, retries and errors.
//! `schema.rs` identifies, connects and migrates a file, `lease.rs` holds the leases and
//! holder files, `writer.rs` is the writer thread (group commit), `journal.rs` implements
//! [`RunJournal`](super::RunJournal) and `queue.rs` [`RunQueue`](super::RunQueue).

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};

use rusqlite::{Connection, ErrorCode, Transaction, TransactionBehavior};
use tokio::sync::oneshot;

use super::{Batch, Every, IDEMPOTENCY_PURGE, NewRun, RunStore, StoreError, TAKEOVER_SCAN};
use lease::hold;
use schema::{check_file, connect, connect_read_only, migrate};
use writer::{QueueWrite, write_loop};

mod journal;
mod lease;
mod queue;
mod schema;
mod writer;

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
    /// What reads select as a journal row's entry count: the column `n`, or `1` in a
    /// store older than schema version 3 opened read-only (one entry per row, no `n`).
    entry_count: &'static str,
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

/// The writer thread's queue, shared by the store and its leases.
type Writer = Arc<Mutex<Option<mpsc::Sender<Job>>>>;

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
                entry_count: "n",
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
            let (reader, version) = retry_busy(|| connect_read_only(&path))?;
            schema::read_as_current(&reader, version)?;
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
                entry_count: if version >= 3 { "n" } else { "1" },
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

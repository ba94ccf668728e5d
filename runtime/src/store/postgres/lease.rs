//! Leases: session-level advisory locks on the store's lock connection, and the task
//! that owns that connection (locks, unlocks and the claim of a new run, in order). The
//! claim's statement is here because it takes a lock: [`CLAIM_NEW`], whose rows
//! `queue.rs` turns into claims.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio_postgres::Client;

use super::{PgStore, SUMMARY_LEN, Statements, db_error, summary_row_at};
use crate::store::{Lease, LoadedRun, StoreError, json_column};

/// The run ids whose advisory locks this store holds, and the way to the lock task.
pub(super) struct Locks {
    pub(super) held: std::sync::Mutex<HashSet<String>>,
    pub(super) ops: mpsc::UnboundedSender<LockOp>,
}

/// What the lock task does, in order.
pub(super) enum LockOp {
    /// `pg_try_advisory_lock`: whether it was taken.
    Lock(String, oneshot::Sender<Result<bool, StoreError>>),
    /// [`CLAIM_NEW`]: the oldest new run, marked claimed, and whether its lock was taken.
    ClaimNew(oneshot::Sender<Result<Option<NewClaim>, StoreError>>),
    /// `pg_advisory_unlock`.
    Unlock(String),
    /// Answered once every op queued before it has run: the unlocks of leases this store
    /// dropped are done (see [`PgStore::settle_locks`]).
    Barrier(oneshot::Sender<()>),
}

/// A lease: one advisory lock on the store's lock connection.
pub(super) struct PgLease {
    pub(super) run_id: String,
    pub(super) locks: Arc<Locks>,
    /// Whether dropping it must unlock: not when the server said the lock was not taken.
    pub(super) unlock_on_drop: bool,
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

/// The advisory lock key of a run: `hashtextextended` is stable across server versions
/// (hash partitioning relies on it), so every process computes the same key.
const LOCK_KEY: &str = "hashtextextended('aplc-run:' || $1, 0)";

impl PgStore {
    /// Waits until the unlocks of the leases this store dropped have run, so that a scan
    /// of `pg_locks` does not see this store's own released locks as held. A lock task
    /// that has stopped took its connection and its locks with it: nothing to wait for.
    pub(super) async fn settle_locks(&self) {
        let (reply, answer) = oneshot::channel();
        if self.locks.ops.send(LockOp::Barrier(reply)).is_ok() {
            let _ = answer.await;
        }
    }

    /// Takes the advisory lock of run `id`, or fails with [`StoreError::Locked`].
    pub(super) async fn lock(&self, id: &str) -> Result<PgLease, StoreError> {
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
}

/// Claims the oldest run never claimed, in one statement on the lock connection (whose
/// session then holds the run's advisory lock). The candidate is found through the index
/// of open runs that do not wait for a person (`run_queue_ready`: a waiting run is a
/// claimed one, and there may be many), passing over the few running ones at its head,
/// without looking at anyone's locks; `SKIP LOCKED` passes over a row another claim is
/// taking this instant.
/// Its lock is tried on that one row (the `LIMIT` is applied before the lock function:
/// the materialized CTE) and the row is marked claimed either way: a lock that another
/// session holds means the run is someone's already (a `claimed` flag lost with an
/// asynchronous commit), and the next claim passes over it.
pub(super) const CLAIM_NEW: &str = concat!(
    "WITH candidate AS (
         SELECT run_id FROM run_queue
         WHERE final_status IS NULL AND NOT claimed AND NOT waiting
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

/// A row [`CLAIM_NEW`] returned.
pub(super) struct NewClaim {
    pub(super) id: String,
    pub(super) locked: bool,
    pub(super) agent: String,
    pub(super) cancel_requested: bool,
    pub(super) traceparent: Option<String>,
    /// The run as stored, when nothing is journaled (the statement read its row: a run
    /// with a journal is loaded afterwards).
    pub(super) loaded: Option<LoadedRun>,
}

impl NewClaim {
    pub(super) fn of_row(url: &str, row: &tokio_postgres::Row) -> Result<NewClaim, StoreError> {
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
        row.get::<_, Option<Vec<u8>>>(5 + SUMMARY_LEN),
        row.get::<_, Option<String>>(6 + SUMMARY_LEN),
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

/// The lock task: owns the lock connection and runs locks and unlocks in order. It ends
/// when the store and all its leases are gone, and the connection closes with it.
pub(super) async fn lock_loop(
    url: Arc<str>,
    client: Client,
    mut ops: mpsc::UnboundedReceiver<LockOp>,
) {
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
            LockOp::Barrier(reply) => {
                let _ = reply.send(());
            }
        }
    }
}

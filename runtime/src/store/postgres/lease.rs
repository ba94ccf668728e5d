//! Leases: session-level advisory locks on the store's lock connection, and the task
//! that owns that connection (locks, unlocks and the claim of a new run, in order).

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio_postgres::Client;

use super::queue::{CLAIM_NEW, NewClaim};
use super::{PgStore, Statements, db_error};
use crate::store::{Lease, StoreError};

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
        }
    }
}

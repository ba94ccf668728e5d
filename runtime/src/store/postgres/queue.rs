//! The service's queue (spec/serve.md): enqueues committed in groups, the claim of a new
//! run (one statement on the lock connection, `lease.rs`'s `CLAIM_NEW`), the takeover of
//! a dead worker's runs, cancel requests and counts.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio_postgres::{Client, Transaction};

use super::lease::{LockOp, PgLease};
use super::{PgStore, SUMMARY_COLUMNS, SUMMARY_LEN, copy_error, db_error, summary_row};
use crate::future::BoxFuture;
use crate::store::{
    Claim, Enqueued, IDEMPOTENCY_WINDOW_MS, QueueCounts, QueueEntry, QueueStatus, QueuedRun,
    RunQueue, RunState, Scan, StoreError, claim_order, count, now_ms,
};

/// An enqueue waiting for a group commit, and where its result goes.
pub(super) type PendingEnqueue = (QueuedRun, oneshot::Sender<Result<Enqueued, StoreError>>);

/// Claimed runs no live session holds the advisory lock of (a worker's locks vanish with
/// its connection), oldest first. A run that waits for a person holds no lock either: it
/// is passed over until its answers clear `waiting`, or until its first open request's
/// timeout (`$1`: now) passes and it is woken for a worker to apply it (spec/human.md).
/// Each arm of the `OR` is served by an index that leaves the other runs out
/// (`run_queue_ready`, `run_queue_wake`), so runs waiting for days are not walked.
const CLAIM_ABANDONED: &str = "WITH held AS (
         SELECT (l.classid::BIGINT << 32) | l.objid::BIGINT AS key
         FROM pg_locks l
         WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))
     SELECT q.run_id FROM run_queue q
     WHERE q.final_status IS NULL AND q.claimed
       AND (NOT q.waiting OR (q.waiting AND q.wake_at_ms <= $1))
       AND hashtextextended('aplc-run:' || q.run_id, 0) NOT IN (SELECT key FROM held)
     ORDER BY q.enqueued_at_ms, q.run_id
     LIMIT 16
     FOR UPDATE OF q SKIP LOCKED";

impl PgStore {
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
        // A run whose lease this store just dropped is abandoned only once its unlock has
        // run: the scan reads every session's advisory locks, this store's too.
        self.settle_locks().await;
        let mut client = self.queue.lock().await;
        let tx = client.transaction().await.map_err(|e| self.error(e))?;
        // The `claimed` flag is only what the API shows (queued or running) and which scan
        // finds the run: the advisory lock makes the claim, and a crash drops both. So the
        // claim's commit does not wait for its fsync.
        tx.batch_execute("SET LOCAL synchronous_commit = off")
            .await
            .map_err(|e| self.error(e))?;
        let rows = tx
            .query(CLAIM_ABANDONED, &[&now_ms()])
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
}

impl RunQueue for PgStore {
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
                    // A waiting run is woken: a worker takes it and ends it cancelled.
                    "UPDATE run_queue SET cancel_requested = TRUE, waiting = FALSE
                     WHERE run_id = $1",
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
            let claimed: bool = row.get(SUMMARY_LEN + 1);
            let status = match &summary.outcome {
                Some(outcome) if summary.state == RunState::Finished => {
                    QueueStatus::of_outcome(outcome)
                }
                _ if !summary.pending.is_empty() => QueueStatus::Waiting,
                _ => QueueStatus::of_claimed(claimed),
            };
            Ok(QueueEntry {
                agent: row.get(SUMMARY_LEN),
                status,
                cancel_requested: row.get(SUMMARY_LEN + 2),
                traceparent: row.get(SUMMARY_LEN + 3),
                summary,
            })
        })
    }

    fn queue_counts<'a>(&'a self) -> BoxFuture<'a, Result<QueueCounts, StoreError>> {
        Box::pin(async move {
            let client = &self.reader;
            let rows = client
                .query(
                    "SELECT final_status, claimed, waiting, COUNT(*) FROM run_queue GROUP BY 1, 2, 3",
                    &[],
                )
                .await
                .map_err(|e| self.error(e))?;
            let mut counts = QueueCounts::default();
            for row in rows {
                let status: Option<String> = row.get(0);
                let status = match status {
                    Some(status) => QueueStatus::from_column(&status)?,
                    None if row.get::<_, bool>(2) => QueueStatus::Waiting,
                    None => QueueStatus::of_claimed(row.get(1)),
                };
                let n = count(row.get(3), "run count")?;
                match counts.by_status.iter_mut().find(|(s, _)| *s == status) {
                    Some((_, total)) => *total += n,
                    None => counts.by_status.push((status, n)),
                }
            }
            Ok(counts)
        })
    }
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
    if let Some(key) = &queued.idempotency_key
        && let Some(existing) = record_key(url, tx, queued, key, now).await?
    {
        return Ok(Enqueued::Existing(existing));
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

/// Records that idempotency key `key` starts `queued`, unless it started a run less
/// than [`IDEMPOTENCY_WINDOW_MS`] ago: then the id of that run.
async fn record_key(
    url: &str,
    tx: &Transaction<'_>,
    queued: &QueuedRun,
    key: &str,
    now: i64,
) -> Result<Option<String>, StoreError> {
    let error = |e: tokio_postgres::Error| db_error(url, &e);
    let run = &queued.run;
    let inserted = tx
        .query_opt(
            "INSERT INTO idempotency_keys (agent, key, run_id, created_at_ms)
                 VALUES ($1, $2, $3, $4) ON CONFLICT (agent, key) DO NOTHING RETURNING run_id",
            &[&queued.agent, &key, &run.id, &now],
        )
        .await
        .map_err(error)?;
    if inserted.is_none() {
        let row = tx
            .query_one(
                "SELECT run_id, created_at_ms FROM idempotency_keys
                     WHERE agent = $1 AND key = $2 FOR UPDATE",
                &[&queued.agent, &key],
            )
            .await
            .map_err(error)?;
        let created: i64 = row.get(1);
        if created > now - IDEMPOTENCY_WINDOW_MS {
            return Ok(Some(row.get(0)));
        }
        tx.execute(
            "UPDATE idempotency_keys SET run_id = $3, created_at_ms = $4
                 WHERE agent = $1 AND key = $2",
            &[&queued.agent, &key, &run.id, &now],
        )
        .await
        .map_err(error)?;
    }
    Ok(None)
}

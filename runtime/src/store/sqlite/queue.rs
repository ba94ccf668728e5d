//! The service's queue (spec/serve.md): enqueues and claims are writes of the writer
//! thread ([`QueueWrite`](super::writer::QueueWrite)), entries and counts reads.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, params};

use super::journal::{load_run, read_summary};
use super::lease::{SqliteLease, holder_alive, take_lease};
use super::writer::insert_run;
use super::{Lessee, SqliteStore, Writer, db_error};
use crate::future::BoxFuture;
use crate::store::{
    Claim, Enqueued, IDEMPOTENCY_WINDOW_MS, LoadedRun, QueueCounts, QueueEntry, QueueStatus,
    QueuedRun, RunQueue, RunState, Scan, StoreError, claim_order, count,
};

impl RunQueue for SqliteStore {
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
                .queue_write(move |c, now| {
                    for scan in order {
                        if scan == Scan::Abandoned {
                            takeover.done();
                        }
                        if let Some(run) = claim_run(c, &lessee, &claimant, scan, now)? {
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
                // A waiting run is woken: a worker takes it and ends it cancelled.
                .prepare_cached(
                    "UPDATE run_queue SET cancel_requested = 1, waiting = 0 WHERE run_id = ?1",
                )
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
                    "SELECT final_status, claimed, waiting, COUNT(*) FROM run_queue
                     GROUP BY 1, 2, 3",
                )
                .map_err(db_error)?;
            let rows = stmt
                .query_map([], |row| {
                    Ok((
                        row.get::<_, Option<String>>(0)?,
                        row.get::<_, i64>(1)?,
                        row.get::<_, i64>(2)?,
                        row.get::<_, i64>(3)?,
                    ))
                })
                .map_err(db_error)?;
            let mut counts = QueueCounts::default();
            for row in rows {
                let (status, claimed, waiting, n) = row.map_err(db_error)?;
                let status = match status {
                    Some(status) => QueueStatus::from_column(&status)?,
                    None if waiting != 0 => QueueStatus::Waiting,
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

/// The new runs, oldest first: in the order of the index `run_queue_ready`, so the first
/// row is the one taken (a run that waits for a person is always a claimed one).
const CLAIM_NEW: &str = "SELECT q.run_id, l.holder, q.agent, q.cancel_requested, q.traceparent
     FROM run_queue q LEFT JOIN leases l ON l.run_id = q.run_id
     WHERE q.final_status IS NULL AND q.waiting = 0 AND q.claimed = 0
     ORDER BY q.enqueued_at_ms, q.run_id";

/// The claimed runs, oldest first, for the holder test: those that do not wait for a
/// person (running, or left by a dead worker), and those that wait but whose first
/// request's timeout has passed (`?1`: now), woken for their worker to apply it
/// (spec/human.md). The others wait for their answers, however many: each part reads
/// an index of its own (`run_queue_ready`, `run_queue_wake`) and the sort is of the
/// few rows found.
const CLAIM_TAKEN: &str = "SELECT q.run_id, l.holder, q.agent, q.cancel_requested, q.traceparent
     FROM run_queue q LEFT JOIN leases l ON l.run_id = q.run_id
     WHERE q.rowid IN (
         SELECT rowid FROM run_queue
         WHERE final_status IS NULL AND waiting = 0 AND claimed = 1
         UNION ALL
         SELECT rowid FROM run_queue
         WHERE final_status IS NULL AND waiting = 1 AND wake_at_ms <= ?1)
     ORDER BY q.enqueued_at_ms, q.run_id";

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
    now: i64,
) -> Result<Option<ClaimedRow>, StoreError> {
    let abandoned = scan == Scan::Abandoned;
    let mut stmt = tx
        .prepare_cached(if abandoned { CLAIM_TAKEN } else { CLAIM_NEW })
        .map_err(db_error)?;
    let mut rows = if abandoned {
        stmt.query(params![now])
    } else {
        stmt.query([])
    }
    .map_err(db_error)?;
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
            load_run(tx, &id, "n").ok()
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
        _ if !summary.pending.is_empty() => QueueStatus::Waiting,
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

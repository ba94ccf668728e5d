//! The writer thread: every job queued when it is free runs in its own savepoint of one
//! transaction, and they commit together (group commit).

use std::sync::mpsc;

use rusqlite::{Connection, OptionalExtension, Transaction, params};
use tokio::sync::oneshot;

use super::lease::{release_lease, take_lease};
use super::{Job, SqliteStore, begin, db_error};
use crate::store::{
    Batch, NewRun, QueueStatus, RunState, StoreError, check_append, db_int, now_ms, pack_events,
    pack_inputs,
};

/// The most jobs committed in one transaction (bounds the latency of the first).
const MAX_GROUP: usize = 512;

/// A queue write for the writer thread: run in its own savepoint of the group's
/// transaction, answered once the group's commit is known.
pub(super) trait QueueWrite: Send {
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

impl SqliteStore {
    /// Queues a queue write to the writer thread and waits for its answer.
    pub(super) async fn queue_write<T: Send + 'static>(
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

/// The writer thread: takes every queued job, commits them together, answers each.
pub(super) fn write_loop(mut conn: Connection, jobs: mpsc::Receiver<Job>) {
    while let Ok(first) = jobs.recv() {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match jobs.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        // The runs' events become JSON text here, off their own threads (issue #24).
        for job in &mut group {
            if let Job::Append(_, batch, _) = job {
                batch.render();
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

pub(super) fn insert_run(tx: &Connection, run: &NewRun) -> Result<(), StoreError> {
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

/// Appends a batch: the run's row is updated first, on the condition that the batch
/// follows what is stored (`RETURNING` the first event's number), so an accepted append
/// reads nothing back; only a refused one reads the row, to say why.
fn append_batch(tx: &Connection, id: &str, batch: &Batch, now: i64) -> Result<(), StoreError> {
    let (state, outcome) = match &batch.outcome {
        Some(outcome) => (RunState::Finished, Some(outcome.to_string())),
        None => (RunState::Running, None),
    };
    let first_event: Option<i64> = tx
        .prepare_cached(
            "UPDATE runs SET steps = ?2, updated_at_ms = ?3, input_count = input_count + ?4,
                             event_count = event_count + ?5, state = ?6,
                             outcome = COALESCE(?7, outcome)
             WHERE id = ?1 AND input_count = ?8 AND state = 'running'
             RETURNING event_count - ?5",
        )
        .and_then(|mut s| {
            s.query_row(
                params![
                    id,
                    db_int(batch.steps),
                    now,
                    db_int(batch.inputs.len() as u64),
                    db_int(batch.events.len() as u64),
                    state.as_str(),
                    outcome,
                    db_int(batch.first_input),
                ],
                |row| row.get(0),
            )
            .optional()
        })
        .map_err(db_error)?;
    let Some(first_event) = first_event else {
        return Err(refusal(tx, id, batch));
    };
    if let Some(pending) = &batch.pending {
        store_pending(tx, id, pending)?;
    }
    if let Some(outcome) = &batch.outcome {
        // A queued run leaves the claimable set (no row for a run `create` made).
        let status = QueueStatus::of_outcome(outcome).as_str();
        tx.prepare_cached("UPDATE run_queue SET final_status = ?2 WHERE run_id = ?1")
            .and_then(|mut s| s.execute(params![id, status]))
            .map_err(db_error)?;
    }
    append_rows(tx, id, batch, first_event)
}

/// Stores the requests the run waits on (none: it goes on), and in the queue whether it
/// waits and when its first open request times out (`spec/human.md`). The answers are
/// read in this transaction: one stored before (a run paused again after some of its
/// requests were answered, or all of them while its worker was letting it go) counts.
fn store_pending(
    tx: &Connection,
    id: &str,
    pending: &[serde_json::Value],
) -> Result<(), StoreError> {
    let text = (!pending.is_empty()).then(|| serde_json::Value::from(pending.to_vec()).to_string());
    tx.prepare_cached("UPDATE runs SET pending = ?2 WHERE id = ?1")
        .and_then(|mut s| s.execute(params![id, text]))
        .map_err(db_error)?;
    let answered = if pending.is_empty() {
        Vec::new()
    } else {
        super::journal::answered_ids(tx, id)?
    };
    super::journal::store_wait_state(tx, id, pending, &answered)
}

/// Why the run's row refused a batch: no such run, finished, or out of sequence.
fn refusal(tx: &Connection, id: &str, batch: &Batch) -> StoreError {
    let row: Result<Option<(String, i64)>, StoreError> = tx
        .prepare_cached("SELECT state, input_count FROM runs WHERE id = ?1")
        .and_then(|mut s| {
            s.query_row(params![id], |row| Ok((row.get(0)?, row.get(1)?)))
                .optional()
        })
        .map_err(db_error);
    match row {
        Err(e) => e,
        Ok(None) => StoreError::NotFound(id.to_string()),
        Ok(Some((state, input_count))) => match check_append(id, batch, &state, input_count) {
            Err(e) => e,
            // The checks pass now: the row changed in between (another process writing
            // the run without its lease).
            Ok(()) => StoreError::Database(format!("the row of run `{id}` changed meanwhile")),
        },
    }
}

/// Inserts a batch's inputs and events (several to a row, `store/rows.rs`) and its
/// checkpoint (the run's row is updated already).
fn append_rows(
    tx: &Connection,
    id: &str,
    batch: &Batch,
    first_event: i64,
) -> Result<(), StoreError> {
    {
        let mut insert = tx
            .prepare_cached("INSERT INTO inputs (run_id, seq, n, bytes) VALUES (?1, ?2, ?3, ?4)")
            .map_err(db_error)?;
        for row in pack_inputs(db_int(batch.first_input), &batch.inputs) {
            insert
                .execute(params![id, row.seq, row.n, row.data])
                .map_err(db_error)?;
        }
        let mut insert = tx
            .prepare_cached("INSERT INTO events (run_id, seq, n, json) VALUES (?1, ?2, ?3, ?4)")
            .map_err(db_error)?;
        for row in pack_events(first_event, &batch.events) {
            insert
                .execute(params![id, row.seq, row.n, row.data])
                .map_err(db_error)?;
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
    Ok(())
}

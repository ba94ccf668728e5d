//! The journal ([`RunJournal`]): creates, acquires and appends go to the writer thread,
//! reads to the reading connection.

use rusqlite::{Connection, OptionalExtension, params};

use super::{Job, SqliteStore, db_error};
use crate::future::BoxFuture;
use crate::store::{
    Answered, Batch, Entries, FRAME, Lease, LoadedRun, NewRun, RunJournal, RunState, RunSummary,
    StoreError, StoredCheckpoint, count, db_int, json_column, pending_column, unpack_events,
    unpack_inputs,
};

impl RunJournal for SqliteStore {
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
        let n = self.entry_count;
        Box::pin(self.read(move |conn| {
            // One read transaction: a consistent snapshot of the run.
            let tx = conn.transaction().map_err(db_error)?;
            let loaded = load_run(&tx, &id, n);
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
        let n = self.entry_count;
        Box::pin(self.read(move |conn| {
            let rows = Rows::events(n);
            read_entries(conn, &id, &rows, from, limit, unpack_events)
        }))
    }

    fn inputs<'a>(
        &'a self,
        id: &'a str,
        from: u64,
        limit: u64,
    ) -> BoxFuture<'a, Result<Vec<Vec<u8>>, StoreError>> {
        let id = id.to_string();
        let n = self.entry_count;
        Box::pin(self.read(move |conn| {
            let rows = Rows::inputs(n);
            read_entries(conn, &id, &rows, from, limit, unpack_inputs)
        }))
    }

    fn run_bytes<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        let id = id.to_string();
        let n = self.entry_count;
        Box::pin(self.read(move |conn| {
            read_summary(conn, &id)?;
            // The entries' bytes, without the rows' framing (a length before each input,
            // a newline between events, in rows of several).
            let bytes: i64 = conn
                .query_row(
                    &format!(
                        "SELECT
                       (SELECT COALESCE(SUM(length(bytes)
                                  - CASE WHEN {n} > 1 THEN {FRAME} * {n} ELSE 0 END), 0)
                          FROM inputs WHERE run_id = ?1)
                     + (SELECT COALESCE(SUM(length(CAST(json AS BLOB)) - ({n} - 1)), 0)
                          FROM events WHERE run_id = ?1)
                     + (SELECT COALESCE(SUM(length(history) + COALESCE(length(state), 0)), 0)
                          FROM checkpoints WHERE run_id = ?1)"
                    ),
                    params![id],
                    |row| row.get(0),
                )
                .map_err(db_error)?;
            count(bytes, "byte count")
        }))
    }

    fn answer<'a>(
        &'a self,
        run_id: &'a str,
        request_id: &'a str,
        answer: serde_json::Value,
    ) -> BoxFuture<'a, Result<Answered, StoreError>> {
        let (run_id, request_id) = (run_id.to_owned(), request_id.to_owned());
        Box::pin(async move {
            let text = crate::store::answer_text(&answer)?;
            self.queue_write(move |tx, now| store_answer(tx, &run_id, &request_id, &text, now))
                .await
        })
    }

    fn answers<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<(String, serde_json::Value)>, StoreError>> {
        let run_id = run_id.to_owned();
        Box::pin(self.read(move |conn| {
            let tx = conn.transaction().map_err(db_error)?;
            let answers = pending_answers(&tx, &run_id);
            tx.finish().map_err(db_error)?;
            answers
        }))
    }
}

/// The run's state and pending requests, or `None` for no such run.
fn pending_requests(
    tx: &Connection,
    run_id: &str,
) -> Result<Option<(RunState, Vec<serde_json::Value>)>, StoreError> {
    let row: Option<(String, Option<String>)> = tx
        .prepare_cached("SELECT state, pending FROM runs WHERE id = ?1")
        .and_then(|mut s| {
            s.query_row(params![run_id], |row| Ok((row.get(0)?, row.get(1)?)))
                .optional()
        })
        .map_err(db_error)?;
    let Some((state, pending)) = row else {
        return Ok(None);
    };
    let pending = pending_column(pending.as_deref())?;
    Ok(Some((RunState::from_column(&state)?, pending)))
}

/// The run's stored answers (request id, answer text), in the order they were stored.
fn answered(tx: &Connection, run_id: &str) -> Result<Vec<(String, String)>, StoreError> {
    let mut stmt = tx
        .prepare_cached("SELECT request_id, answer FROM answers WHERE run_id = ?1 ORDER BY rowid")
        .map_err(db_error)?;
    let rows = stmt
        .query_map(params![run_id], |row| Ok((row.get(0)?, row.get(1)?)))
        .map_err(db_error)?;
    rows.map(|row| row.map_err(db_error)).collect()
}

/// The ids of the requests of the run that have a stored answer (without reading the
/// answers, up to a MiB each).
pub(super) fn answered_ids(tx: &Connection, run_id: &str) -> Result<Vec<String>, StoreError> {
    let mut stmt = tx
        .prepare_cached("SELECT request_id FROM answers WHERE run_id = ?1")
        .map_err(db_error)?;
    let rows = stmt
        .query_map(params![run_id], |row| row.get(0))
        .map_err(db_error)?;
    rows.map(|row| row.map_err(db_error)).collect()
}

/// Sets the queue's `waiting` and `wake_at_ms` of run `run_id` (no row: not a queued
/// run, nothing to do) for its `pending` requests and the answers stored.
pub(super) fn store_wait_state(
    tx: &Connection,
    run_id: &str,
    pending: &[serde_json::Value],
    answered: &[String],
) -> Result<(), StoreError> {
    let (waiting, wake_at) = crate::store::wait_state(pending, answered);
    tx.prepare_cached("UPDATE run_queue SET waiting = ?2, wake_at_ms = ?3 WHERE run_id = ?1")
        .and_then(|mut s| s.execute(params![run_id, waiting, wake_at]))
        .map_err(db_error)?;
    Ok(())
}

/// [`RunJournal::answer`] in the writer's transaction: one answer per request, the first.
fn store_answer(
    tx: &Connection,
    run_id: &str,
    request_id: &str,
    text: &str,
    now: i64,
) -> Result<Answered, StoreError> {
    let Some((state, pending)) = pending_requests(tx, run_id)? else {
        return Ok(Answered::UnknownRun);
    };
    if state == RunState::Finished {
        return Ok(Answered::Finished);
    }
    let mut given = answered_ids(tx, run_id)?;
    if given.iter().any(|id| id == request_id) {
        return Ok(Answered::AlreadyAnswered);
    }
    let ids = crate::store::pending_ids(&pending);
    if !ids.iter().any(|id| id == request_id) {
        return Ok(Answered::UnknownRequest);
    }
    tx.prepare_cached(
        "INSERT INTO answers (run_id, request_id, answer, stored_at_ms) VALUES (?1, ?2, ?3, ?4)",
    )
    .and_then(|mut s| s.execute(params![run_id, request_id, text, now]))
    .map_err(db_error)?;
    given.push(request_id.to_owned());
    // With every request answered a service's worker may take the run again; else the
    // next wake-up is the first timeout of those still open.
    store_wait_state(tx, run_id, &pending, &given)?;
    Ok(Answered::Accepted {
        unanswered: ids.into_iter().filter(|id| !given.contains(id)).collect(),
    })
}

/// The stored answers to the run's pending requests, in the order they were stored.
fn pending_answers(
    tx: &Connection,
    run_id: &str,
) -> Result<Vec<(String, serde_json::Value)>, StoreError> {
    let Some((_, pending)) = pending_requests(tx, run_id)? else {
        return Err(StoreError::NotFound(run_id.to_owned()));
    };
    let pending = crate::store::pending_ids(&pending);
    answered(tx, run_id)?
        .into_iter()
        .filter(|(id, _)| pending.contains(id))
        .map(|(id, text)| Ok((id, json_column(&text, "an answer")?)))
        .collect()
}

/// The columns [`summary_row`] reads, in order.
const SUMMARY_COLUMNS: &str = "id, agent, bundle_hash, state, steps, started_at_ms, updated_at_ms, \
     input_count, event_count, outcome, pending";

fn summary_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Result<RunSummary, StoreError>> {
    let state: String = row.get(3)?;
    let steps: i64 = row.get(4)?;
    let inputs: i64 = row.get(7)?;
    let events: i64 = row.get(8)?;
    let outcome: Option<String> = row.get(9)?;
    let pending: Option<String> = row.get(10)?;
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
            pending: pending_column(pending.as_deref())?,
        })
    })();
    Ok(summary)
}

pub(super) fn read_summary(conn: &Connection, id: &str) -> Result<RunSummary, StoreError> {
    let mut stmt = conn
        .prepare_cached(&format!("SELECT {SUMMARY_COLUMNS} FROM runs WHERE id = ?1"))
        .map_err(db_error)?;
    stmt.query_row(params![id], summary_row)
        .optional()
        .map_err(db_error)?
        .ok_or_else(|| StoreError::NotFound(id.to_string()))?
}

/// Reads journal rows `(seq, n, data)` in order into `entries`, until it is full.
/// A journal table: its name, the column holding its entries, what an entry is called in
/// errors, and the expression for a row's entry count (`n`, or 1 before version 3).
struct Rows {
    table: &'static str,
    column: &'static str,
    what: &'static str,
    n: &'static str,
}

impl Rows {
    fn events(n: &'static str) -> Rows {
        Rows {
            table: "events",
            column: "json",
            what: "event",
            n,
        }
    }

    fn inputs(n: &'static str) -> Rows {
        Rows {
            table: "inputs",
            column: "bytes",
            what: "input",
            n,
        }
    }
}

/// Run `id`'s entries in `rows` from number `from` on, at most `limit`: read from the row
/// holding entry `from`; `limit` rows hold at least `limit` entries (a row holds one or
/// more).
fn read_entries<T, D: rusqlite::types::FromSql>(
    conn: &Connection,
    id: &str,
    rows: &Rows,
    from: u64,
    limit: u64,
    unpack: impl Fn(i64, i64, D) -> Result<Vec<T>, StoreError>,
) -> Result<Vec<T>, StoreError> {
    read_summary(conn, id)?;
    let Rows {
        table,
        column,
        what,
        n,
    } = rows;
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT seq, {n}, {column} FROM {table} WHERE run_id = ?1
             AND seq >= (SELECT COALESCE(MAX(seq), 0) FROM {table}
                         WHERE run_id = ?1 AND seq <= ?2)
             ORDER BY seq LIMIT ?3"
        ))
        .map_err(db_error)?;
    let found = stmt
        .query(params![id, db_int(from), db_int(limit)])
        .map_err(db_error)?;
    read_rows(found, Entries::new(what, from, limit), unpack)?.finish(None)
}

fn read_rows<T, D: rusqlite::types::FromSql>(
    mut rows: rusqlite::Rows<'_>,
    mut entries: Entries<T>,
    unpack: impl Fn(i64, i64, D) -> Result<Vec<T>, StoreError>,
) -> Result<Entries<T>, StoreError> {
    while !entries.full() {
        let Some(row) = rows.next().map_err(db_error)? else {
            break;
        };
        let (seq, n): (i64, i64) = (row.get(0).map_err(db_error)?, row.get(1).map_err(db_error)?);
        let data: D = row.get(2).map_err(db_error)?;
        entries.add(seq, || unpack(seq, n, data))?;
    }
    Ok(entries)
}

/// Loads a run; `n` is the journal rows' entry count column (`"1"` in a store older
/// than version 3, read as it is).
pub(super) fn load_run(conn: &Connection, id: &str, n: &str) -> Result<LoadedRun, StoreError> {
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
    // The inputs from the newest checkpoint's count on, which may fall inside a row.
    let after = checkpoints.last().map_or(0, |c| c.inputs);
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT seq, {n}, bytes FROM inputs WHERE run_id = ?1
             AND seq >= (SELECT COALESCE(MAX(seq), 0) FROM inputs
                         WHERE run_id = ?1 AND seq <= ?2)
             ORDER BY seq"
        ))
        .map_err(db_error)?;
    let rows = stmt.query(params![id, db_int(after)]).map_err(db_error)?;
    let inputs = read_rows(rows, Entries::new("input", after, u64::MAX), unpack_inputs)?
        .finish(Some(summary.inputs))?;
    Ok(LoadedRun {
        events: summary.events,
        options: json_column(&options, "the run options")?,
        summary,
        bundle,
        checkpoints,
        inputs,
    })
}

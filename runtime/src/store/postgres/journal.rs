//! The journal ([`RunJournal`]): creates and appends go to the writer task, leases to
//! the lock task, reads are single statements on the reader connection.

use super::writer::Work;
use super::{PgStore, SUMMARY_COLUMNS, SUMMARY_LEN, read_summary, summary_row};
use crate::future::BoxFuture;
use crate::store::{
    Answered, Batch, Entries, Lease, LoadedRun, NewRun, RunJournal, RunState, RunSummary,
    StoreError, StoredCheckpoint, count, db_int, json_column, unpack_events, unpack_inputs,
};

impl RunJournal for PgStore {
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
                                i.seqs, i.counts, i.data
                         FROM runs
                         LEFT JOIN bundles b ON b.hash = runs.bundle_hash
                         CROSS JOIN LATERAL (
                             SELECT array_agg(k.inputs ORDER BY k.seq) AS inputs,
                                    array_agg(k.history_start ORDER BY k.seq) AS starts,
                                    array_agg(k.history ORDER BY k.seq) AS histories,
                                    array_agg(k.state ORDER BY k.seq) AS states
                             FROM checkpoints k WHERE k.run_id = runs.id) c
                         CROSS JOIN LATERAL (
                             SELECT COALESCE((SELECT k.inputs FROM checkpoints k
                                              WHERE k.run_id = runs.id
                                              ORDER BY k.seq DESC LIMIT 1), 0) AS after) a
                         -- The input rows from the one holding input `after` on (a
                         -- checkpoint may fall inside a row).
                         CROSS JOIN LATERAL (
                             SELECT array_agg(i.seq ORDER BY i.seq) AS seqs,
                                    array_agg(i.n ORDER BY i.seq) AS counts,
                                    array_agg(i.bytes ORDER BY i.seq) AS data
                             FROM inputs i
                             WHERE i.run_id = runs.id
                               AND i.seq >= COALESCE((SELECT MAX(j.seq) FROM inputs j
                                                      WHERE j.run_id = runs.id
                                                        AND j.seq <= a.after), 0)) i
                        WHERE runs.id = $1"
                    ),
                    id,
                )
                .await?;
            let summary = summary_row(&row)?;
            let bundle: Vec<u8> = row.get::<_, Option<Vec<u8>>>(SUMMARY_LEN).ok_or_else(|| {
                StoreError::Corrupt(format!("the bundle of run `{id}` is missing"))
            })?;
            let options: String = row.get(SUMMARY_LEN + 1);
            let counts: Vec<i64> = row.get::<_, Option<_>>(SUMMARY_LEN + 2).unwrap_or_default();
            let starts: Vec<i64> = row.get::<_, Option<_>>(SUMMARY_LEN + 3).unwrap_or_default();
            let histories: Vec<Vec<u8>> =
                row.get::<_, Option<_>>(SUMMARY_LEN + 4).unwrap_or_default();
            let states: Vec<Option<Vec<u8>>> =
                row.get::<_, Option<_>>(SUMMARY_LEN + 5).unwrap_or_default();
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
            let after = checkpoints.last().map_or(0, |c| c.inputs);
            let seqs: Vec<i64> = row.get::<_, Option<_>>(SUMMARY_LEN + 6).unwrap_or_default();
            let counts: Vec<i64> = row.get::<_, Option<_>>(SUMMARY_LEN + 7).unwrap_or_default();
            let data: Vec<Vec<u8>> = row.get::<_, Option<_>>(SUMMARY_LEN + 8).unwrap_or_default();
            let mut inputs = Entries::new("input", after, u64::MAX);
            for ((seq, n), data) in seqs.into_iter().zip(counts).zip(data) {
                inputs.add(seq, || unpack_inputs(seq, n, data))?;
            }
            let inputs = inputs.finish(Some(summary.inputs))?;
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
        Box::pin(self.read_entries(
            id,
            "event",
            "SELECT seq, n, json FROM events WHERE run_id = $1
             AND seq >= COALESCE((SELECT MAX(seq) FROM events
                                  WHERE run_id = $1 AND seq <= $2), 0)
             ORDER BY seq LIMIT $3",
            from,
            limit,
            |seq, n, row| unpack_events(seq, n, row.get(2)),
        ))
    }

    fn inputs<'a>(
        &'a self,
        id: &'a str,
        from: u64,
        limit: u64,
    ) -> BoxFuture<'a, Result<Vec<Vec<u8>>, StoreError>> {
        Box::pin(self.read_entries(
            id,
            "input",
            "SELECT seq, n, bytes FROM inputs WHERE run_id = $1
             AND seq >= COALESCE((SELECT MAX(seq) FROM inputs
                                  WHERE run_id = $1 AND seq <= $2), 0)
             ORDER BY seq LIMIT $3",
            from,
            limit,
            |seq, n, row| unpack_inputs(seq, n, row.get(2)),
        ))
    }

    fn run_bytes<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let client = &self.reader;
            read_summary(&self.url, client, id).await?;
            // The entries' bytes, without the rows' framing (a 4-byte length, `FRAME`,
            // before each input and a newline between events, in rows of several).
            let row = client
                .query_one(
                    "SELECT (
                       (SELECT COALESCE(SUM(octet_length(bytes)
                                  - CASE WHEN n > 1 THEN 4 * n ELSE 0 END), 0)
                          FROM inputs WHERE run_id = $1)
                     + (SELECT COALESCE(SUM(octet_length(json) - (n - 1)), 0)
                          FROM events WHERE run_id = $1)
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

    fn answer<'a>(
        &'a self,
        run_id: &'a str,
        request_id: &'a str,
        answer: serde_json::Value,
    ) -> BoxFuture<'a, Result<Answered, StoreError>> {
        Box::pin(async move {
            let text = crate::store::answer_text(&answer)?;
            let mut client = self.queue.lock().await;
            let tx = client.transaction().await.map_err(|e| self.error(e))?;
            let answered = store_answer(&tx, run_id, request_id, &text)
                .await
                .map_err(|e| self.error(e))??;
            tx.commit().await.map_err(|e| self.error(e))?;
            Ok(answered)
        })
    }

    fn answers<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<(String, serde_json::Value)>, StoreError>> {
        Box::pin(async move {
            // One statement: the pending requests and the answers in one snapshot.
            let rows = self
                .reader
                .query(
                    "SELECT r.pending, a.request_id, a.answer FROM runs r
                     LEFT JOIN answers a ON a.run_id = r.id
                     WHERE r.id = $1 ORDER BY a.n",
                    &[&run_id],
                )
                .await
                .map_err(|e| self.error(e))?;
            let Some(first) = rows.first() else {
                return Err(StoreError::NotFound(run_id.to_owned()));
            };
            let pending = crate::store::pending_ids(&crate::store::pending_column(
                first.get::<_, Option<String>>(0).as_deref(),
            )?);
            let mut answers = Vec::new();
            for row in &rows {
                let (Some(id), Some(text)) = (
                    row.get::<_, Option<String>>(1),
                    row.get::<_, Option<String>>(2),
                ) else {
                    continue;
                };
                if pending.contains(&id) {
                    answers.push((id, json_column(&text, "an answer")?));
                }
            }
            Ok(answers)
        })
    }
}

/// [`RunJournal::answer`] in `tx`: one answer per request, the first. The run's row is
/// locked first, so that concurrent answers to one run see each other's.
async fn store_answer(
    tx: &tokio_postgres::Transaction<'_>,
    run_id: &str,
    request_id: &str,
    text: &str,
) -> Result<Result<Answered, StoreError>, tokio_postgres::Error> {
    let Some(row) = tx
        .query_opt(
            "SELECT state, pending FROM runs WHERE id = $1 FOR UPDATE",
            &[&run_id],
        )
        .await?
    else {
        return Ok(Ok(Answered::UnknownRun));
    };
    let state: String = row.get(0);
    let pending = match crate::store::pending_column(row.get::<_, Option<String>>(1).as_deref()) {
        Ok(pending) => pending,
        Err(e) => return Ok(Err(e)),
    };
    if state == RunState::Finished.as_str() {
        return Ok(Ok(Answered::Finished));
    }
    let mut given: Vec<String> = tx
        .query(
            "SELECT request_id FROM answers WHERE run_id = $1",
            &[&run_id],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    if given.iter().any(|id| id == request_id) {
        return Ok(Ok(Answered::AlreadyAnswered));
    }
    let ids = crate::store::pending_ids(&pending);
    if !ids.iter().any(|id| id == request_id) {
        return Ok(Ok(Answered::UnknownRequest));
    }
    let inserted = tx
        .execute(
            "INSERT INTO answers (run_id, request_id, answer, stored_at_ms)
             VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
            &[&run_id, &request_id, &text, &crate::store::now_ms()],
        )
        .await?;
    if inserted == 0 {
        return Ok(Ok(Answered::AlreadyAnswered));
    }
    given.push(request_id.to_owned());
    // With every request answered a worker may take the run again; else the next
    // wake-up is the first timeout of those still open.
    let (waiting, wake_at) = crate::store::wait_state(&pending, &given);
    tx.execute(
        "UPDATE run_queue SET waiting = $2, wake_at_ms = $3 WHERE run_id = $1",
        &[&run_id, &waiting, &wake_at],
    )
    .await?;
    Ok(Ok(Answered::Accepted {
        unanswered: ids.into_iter().filter(|id| !given.contains(id)).collect(),
    }))
}

impl PgStore {
    /// Run `id`'s journal entries (`what`: events or inputs) that `query` selects from
    /// number `from` on, at most `limit`: from the row holding entry `from`; `limit` rows
    /// hold at least `limit` entries (a row holds one or more).
    async fn read_entries<T>(
        &self,
        id: &str,
        what: &'static str,
        query: &'static str,
        from: u64,
        limit: u64,
        unpack: impl Fn(i64, i64, &tokio_postgres::Row) -> Result<Vec<T>, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        let client = &self.reader;
        read_summary(&self.url, client, id).await?;
        let statement = (self.reader_statements)
            .get(client, query)
            .await
            .map_err(|e| self.error(e))?;
        let rows = client
            .query(&statement, &[&id, &db_int(from), &db_int(limit)])
            .await
            .map_err(|e| self.error(e))?;
        let mut entries = Entries::new(what, from, limit);
        for row in rows {
            let (seq, n): (i64, i64) = (row.get(0), row.get(1));
            entries.add(seq, || unpack(seq, n, &row))?;
        }
        entries.finish(None)
    }
}

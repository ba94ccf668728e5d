//! The writer task: group commit of creates and appends on the writing connection, a
//! group at once in a fixed number of statements when it can, job by job otherwise.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Transaction};

use super::{PgStore, Statements, db_error};
use crate::store::{
    Batch, NewRun, Packed, QueueStatus, RunState, StoreError, StoredCheckpoint, check_append,
    db_int, now_ms, pack_events, pack_inputs,
};

/// A write for the writer task, with where to send its result.
pub(super) struct Job {
    work: Work,
    reply: oneshot::Sender<Result<(), StoreError>>,
}

pub(super) enum Work {
    Create(NewRun),
    Append(String, Batch),
}

impl PgStore {
    /// Queues a job for the writer task and waits for its answer.
    pub(super) async fn write(&self, work: Work) -> Result<(), StoreError> {
        let stopped = || StoreError::Database("the store's writer task has stopped".into());
        let (reply, answer) = oneshot::channel();
        self.writer
            .send(Job { work, reply })
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// The writer task: takes every queued job, commits them together, answers each.
pub(super) async fn write_loop(
    url: Arc<str>,
    mut client: Client,
    mut jobs: mpsc::UnboundedReceiver<Job>,
) {
    let st = Statements::default();
    while let Some(first) = jobs.recv().await {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match jobs.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        // The runs' events become JSON text here, off their own tasks (issue #24).
        for job in &mut group {
            if let Work::Append(_, batch) = &mut job.work {
                batch.render();
            }
        }
        commit_group(&url, &mut client, &st, group).await;
    }
}

/// The most jobs committed in one transaction (bounds the latency of the first).
const MAX_GROUP: usize = 512;

async fn commit_group(url: &str, client: &mut Client, st: &Statements, group: Vec<Job>) {
    // Most groups commit in a handful of statements for every job at once; a group the
    // fast path cannot take (a run twice in it, a write the checks did not foresee) runs
    // job by job, each in a savepoint, as below.
    if group.len() > 1
        && let Some(results) = commit_together(client, st, &group).await
    {
        for (job, result) in group.into_iter().zip(results) {
            let _ = job.reply.send(result);
        }
        return;
    }
    let mut answers = Vec::with_capacity(group.len());
    let committed = match client.transaction().await {
        Ok(mut tx) => {
            for job in group {
                let result = run_job(url, &mut tx, st, &job.work).await;
                answers.push((job.reply, result));
            }
            tx.commit().await.map_err(|e| db_error(url, &e))
        }
        Err(e) => {
            answers.extend(group.into_iter().map(|job| (job.reply, Ok(()))));
            Err(db_error(url, &e))
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

/// Commits a group with a fixed number of statements, whatever its size: one `SELECT …
/// FOR UPDATE` reads every run the group touches, each job is checked against it (a job
/// refused here writes nothing and gets its error), and the writes of all the others go
/// in as arrays (`UNNEST`), pipelined. On any database error the transaction rolls back and the
/// caller runs the group job by job instead. Job by job costs four round trips a job; at
/// 100 runs at once that held durable runs to 46 % of in-memory throughput.
async fn commit_together(
    client: &mut Client,
    st: &Statements,
    group: &[Job],
) -> Option<Vec<Result<(), StoreError>>> {
    let mut ids: Vec<&str> = group
        .iter()
        .map(|job| match &job.work {
            Work::Create(run) => run.id.as_str(),
            Work::Append(id, _) => id.as_str(),
        })
        .collect();
    let unique: HashSet<&str> = ids.iter().copied().collect();
    if unique.len() != ids.len() {
        // The same run twice: its second batch depends on its first. Job by job.
        return None;
    }
    ids.sort_unstable();
    write_together(client, st, group, &ids).await.ok()
}

async fn write_together(
    client: &mut Client,
    st: &Statements,
    group: &[Job],
    ids: &[&str],
) -> Result<Vec<Result<(), StoreError>>, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    let known = lock_runs(&tx, ids).await?;
    let now = now_ms();
    let mut rows = GroupRows::default();
    let results = group
        .iter()
        .map(|job| rows.add(&job.work, &known))
        .collect();
    // Pipelined: the statements go out together and are answered together (the
    // connection keeps their order), one round trip instead of one a statement.
    let (runs, journal, updated) = tokio::join!(
        rows.insert_runs(&tx, st),
        rows.insert_journal(&tx, st),
        rows.update_runs(&tx, st, now)
    );
    runs?;
    journal?;
    updated?;
    tx.commit().await?;
    Ok(results)
}

/// A stored run's state, input count and event count.
type Stored = (String, i64, i64);

/// What is stored of every run of a group, the rows locked (`FOR UPDATE`, in id order)
/// until the group's transaction ends.
async fn lock_runs(
    tx: &Transaction<'_>,
    ids: &[&str],
) -> Result<HashMap<String, Stored>, tokio_postgres::Error> {
    let rows = tx
        .query(
            "SELECT id, state, input_count, event_count FROM runs WHERE id = ANY($1)
             ORDER BY id FOR UPDATE",
            &[&ids],
        )
        .await?;
    let mut known = HashMap::with_capacity(rows.len());
    for row in &rows {
        let (id, state, inputs, events): (String, String, i64, i64) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        known.insert(id, (state, inputs, events));
    }
    Ok(known)
}

/// The rows a group writes, column by column (each column is one array parameter of an
/// `UNNEST`), gathered while its jobs are checked.
#[derive(Default)]
struct GroupRows<'a> {
    new_runs: Vec<&'a NewRun>,
    in_run: Vec<&'a str>,
    in_seq: Vec<i64>,
    in_n: Vec<i64>,
    in_bytes: Vec<Vec<u8>>,
    ev_run: Vec<&'a str>,
    ev_seq: Vec<i64>,
    ev_n: Vec<i64>,
    ev_json: Vec<String>,
    ck_run: Vec<&'a str>,
    ck_inputs: Vec<i64>,
    ck_start: Vec<i64>,
    ck_history: Vec<&'a [u8]>,
    ck_state: Vec<Option<&'a [u8]>>,
    fin_id: Vec<&'a str>,
    fin_status: Vec<&'static str>,
    up_id: Vec<&'a str>,
    up_steps: Vec<i64>,
    up_inputs: Vec<i64>,
    up_events: Vec<i64>,
    up_state: Vec<&'static str>,
    up_outcome: Vec<Option<String>>,
    /// Runs whose pending requests change (`Batch::pending`): the list as JSON text (NULL
    /// for none), and the requests.
    pd_id: Vec<&'a str>,
    pd_text: Vec<Option<String>>,
    pd_requests: Vec<&'a [serde_json::Value]>,
}

impl<'a> GroupRows<'a> {
    /// Checks one job against what is stored: a job refused writes nothing and gets its
    /// error; the rows of the others are added.
    fn add(&mut self, work: &'a Work, known: &HashMap<String, Stored>) -> Result<(), StoreError> {
        match work {
            Work::Create(run) => {
                if known.contains_key(&run.id) {
                    Err(StoreError::Exists(run.id.clone()))
                } else {
                    self.new_runs.push(run);
                    Ok(())
                }
            }
            Work::Append(id, batch) => match known.get(id) {
                None => Err(StoreError::NotFound(id.clone())),
                Some((state, input_count, event_count)) => {
                    let checked = check_append(id, batch, state, *input_count);
                    if checked.is_ok() {
                        self.add_append(id, batch, *input_count, *event_count);
                    }
                    checked
                }
            },
        }
    }

    /// The rows of an append that passed its checks.
    fn add_append(&mut self, id: &'a str, batch: &'a Batch, input_count: i64, event_count: i64) {
        for row in pack_inputs(input_count, &batch.inputs) {
            self.in_run.push(id);
            self.in_seq.push(row.seq);
            self.in_n.push(row.n);
            self.in_bytes.push(row.data);
        }
        for row in pack_events(event_count, &batch.events) {
            self.ev_run.push(id);
            self.ev_seq.push(row.seq);
            self.ev_n.push(row.n);
            self.ev_json.push(row.data);
        }
        if let Some(checkpoint) = &batch.checkpoint {
            self.ck_run.push(id);
            self.ck_inputs.push(db_int(checkpoint.inputs));
            self.ck_start.push(db_int(checkpoint.history_start));
            self.ck_history.push(checkpoint.history.as_slice());
            self.ck_state.push(checkpoint.state.as_deref());
        }
        let (state, outcome) = match &batch.outcome {
            Some(outcome) => {
                self.fin_id.push(id);
                self.fin_status
                    .push(QueueStatus::of_outcome(outcome).as_str());
                (RunState::Finished, Some(outcome.to_string()))
            }
            None => (RunState::Running, None),
        };
        self.up_id.push(id);
        self.up_steps.push(db_int(batch.steps));
        self.up_inputs
            .push(input_count + db_int(batch.inputs.len() as u64));
        self.up_events
            .push(event_count + db_int(batch.events.len() as u64));
        self.up_state.push(state.as_str());
        self.up_outcome.push(outcome);
        if let Some(pending) = &batch.pending {
            self.add_pending(id, pending);
        }
    }

    /// The requests run `id` waits on (`Batch::pending`).
    fn add_pending(&mut self, id: &'a str, pending: &'a [serde_json::Value]) {
        self.pd_id.push(id);
        self.pd_text.push(
            (!pending.is_empty()).then(|| serde_json::Value::from(pending.to_vec()).to_string()),
        );
        self.pd_requests.push(pending);
    }

    /// The pending requests of the runs that changed them (spec/human.md), and in the
    /// queue whether each waits (is not claimable) and when its first open request times
    /// out. The answers are read after the runs' rows are updated (locked): an answer
    /// committed before is seen (each statement reads anew), and one not yet committed
    /// waits for this transaction on the run's row (`store_answer`), so a run is never
    /// left waiting on requests all answered.
    async fn update_pending(
        &self,
        tx: &Transaction<'_>,
        st: &Statements,
    ) -> Result<(), tokio_postgres::Error> {
        if self.pd_id.is_empty() {
            return Ok(());
        }
        tx.execute(
            &st.get(
                tx,
                "UPDATE runs r SET pending = t.pending
             FROM UNNEST($1::TEXT[], $2::TEXT[]) AS t(id, pending) WHERE r.id = t.id",
            )
            .await?,
            &[&self.pd_id, &self.pd_text],
        )
        .await?;
        let answered = tx
            .query(
                &st.get(
                    tx,
                    "SELECT run_id, request_id FROM answers WHERE run_id = ANY($1::TEXT[])",
                )
                .await?,
                &[&self.pd_id],
            )
            .await?;
        let (mut waiting, mut wake) = (Vec::new(), Vec::new());
        for (id, pending) in self.pd_id.iter().zip(&self.pd_requests) {
            let given: Vec<String> = answered
                .iter()
                .filter(|row| row.get::<_, &str>(0) == *id)
                .map(|row| row.get(1))
                .collect();
            let (waits, wake_at) = crate::store::wait_state(pending, &given);
            waiting.push(waits);
            wake.push(wake_at);
        }
        tx.execute(
            &st.get(
                tx,
                "UPDATE run_queue q SET waiting = t.waiting, wake_at_ms = t.wake
             FROM UNNEST($1::TEXT[], $2::BOOLEAN[], $3::BIGINT[]) AS t(id, waiting, wake)
             WHERE q.run_id = t.id",
            )
            .await?,
            &[&self.pd_id, &waiting, &wake],
        )
        .await?;
        Ok(())
    }

    /// The new runs and their bundles.
    async fn insert_runs(
        &self,
        tx: &Transaction<'_>,
        st: &Statements,
    ) -> Result<(), tokio_postgres::Error> {
        if !self.new_runs.is_empty() {
            let mut hashes: Vec<&str> = Vec::new();
            let mut bundles: Vec<&[u8]> = Vec::new();
            let mut seen = HashSet::new();
            for run in &self.new_runs {
                if seen.insert(run.bundle_hash.as_str()) {
                    hashes.push(&run.bundle_hash);
                    bundles.push(&run.bundle);
                }
            }
            tx.execute(
            &st.get(
                tx,
                "INSERT INTO bundles (hash, bytes) SELECT * FROM UNNEST($1::TEXT[], $2::BYTEA[])
             ON CONFLICT (hash) DO NOTHING",
            )
            .await?,
            &[&hashes, &bundles],
        )
        .await?;
            let ids: Vec<&str> = self.new_runs.iter().map(|r| r.id.as_str()).collect();
            let agents: Vec<&str> = self.new_runs.iter().map(|r| r.agent.as_str()).collect();
            let hashes: Vec<&str> = self
                .new_runs
                .iter()
                .map(|r| r.bundle_hash.as_str())
                .collect();
            let started: Vec<i64> = self.new_runs.iter().map(|r| r.started_at_ms).collect();
            let options: Vec<String> = self
                .new_runs
                .iter()
                .map(|r| r.options.to_string())
                .collect();
            tx.execute(
                &st.get(
                    tx,
                    "INSERT INTO runs (id, agent, bundle_hash, state, steps, started_at_ms,
                               updated_at_ms, options, outcome, input_count, event_count)
             SELECT t.id, t.agent, t.hash, $6, 0, t.started, t.started, t.options, NULL, 0, 0
             FROM UNNEST($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::BIGINT[], $5::TEXT[])
                  AS t(id, agent, hash, started, options)",
                )
                .await?,
                &[
                    &ids,
                    &agents,
                    &hashes,
                    &started,
                    &options,
                    &RunState::Running.as_str(),
                ],
            )
            .await?;
        }
        Ok(())
    }

    /// The appended inputs, events and checkpoints.
    async fn insert_journal(
        &self,
        tx: &Transaction<'_>,
        st: &Statements,
    ) -> Result<(), tokio_postgres::Error> {
        let inputs = async {
            if !self.in_run.is_empty() {
                tx.execute(
                    &st.get(
                        tx,
                        "INSERT INTO inputs (run_id, seq, n, bytes)
                 SELECT * FROM UNNEST($1::TEXT[], $2::BIGINT[], $3::BIGINT[], $4::BYTEA[])",
                    )
                    .await?,
                    &[&self.in_run, &self.in_seq, &self.in_n, &self.in_bytes],
                )
                .await?;
            }
            Ok::<(), tokio_postgres::Error>(())
        };
        let events = async {
            if !self.ev_run.is_empty() {
                tx.execute(
                    &st.get(
                        tx,
                        "INSERT INTO events (run_id, seq, n, json)
                 SELECT * FROM UNNEST($1::TEXT[], $2::BIGINT[], $3::BIGINT[], $4::TEXT[])",
                    )
                    .await?,
                    &[&self.ev_run, &self.ev_seq, &self.ev_n, &self.ev_json],
                )
                .await?;
            }
            Ok::<(), tokio_postgres::Error>(())
        };
        let checkpoints = async {
            if !self.ck_run.is_empty() {
                // The previous newest states go first, or the new ones would go with them.
                tx.execute(
                &st.get(
                    tx,
                    "UPDATE checkpoints SET state = NULL WHERE run_id = ANY($1) AND state IS NOT NULL",
                )
                .await?,
                &[&self.ck_run],
            )
            .await?;
                tx.execute(
                &st.get(tx, "INSERT INTO checkpoints (run_id, seq, inputs, history_start, history, state)
                 SELECT t.run_id,
                        (SELECT COALESCE(MAX(c.seq) + 1, 0) FROM checkpoints c WHERE c.run_id = t.run_id),
                        t.inputs, t.history_start, t.history, t.state
                 FROM UNNEST($1::TEXT[], $2::BIGINT[], $3::BIGINT[], $4::BYTEA[], $5::BYTEA[])
                      AS t(run_id, inputs, history_start, history, state)").await?,
                &[&self.ck_run, &self.ck_inputs, &self.ck_start, &self.ck_history, &self.ck_state],
            )
            .await?;
            }
            Ok::<(), tokio_postgres::Error>(())
        };
        let (inputs, events, checkpoints) = tokio::join!(inputs, events, checkpoints);
        inputs?;
        events?;
        checkpoints
    }

    /// The appended runs' rows, and the queue rows of those that finished.
    async fn update_runs(
        &self,
        tx: &Transaction<'_>,
        st: &Statements,
        now: i64,
    ) -> Result<(), tokio_postgres::Error> {
        if !self.up_id.is_empty() {
            tx.execute(
                &st.get(
                    tx,
                    "UPDATE runs r SET steps = t.steps, updated_at_ms = $7, input_count = t.inputs,
                               event_count = t.events, state = t.state,
                               outcome = COALESCE(t.outcome, r.outcome)
             FROM UNNEST($1::TEXT[], $2::BIGINT[], $3::BIGINT[], $4::BIGINT[], $5::TEXT[],
                         $6::TEXT[]) AS t(id, steps, inputs, events, state, outcome)
             WHERE r.id = t.id",
                )
                .await?,
                &[
                    &self.up_id,
                    &self.up_steps,
                    &self.up_inputs,
                    &self.up_events,
                    &self.up_state,
                    &self.up_outcome,
                    &now,
                ],
            )
            .await?;
        }
        self.update_pending(tx, st).await?;
        if !self.fin_id.is_empty() {
            // A queued run leaves the claimable set (no row for a run `create` made).
            tx.execute(
                &st.get(
                    tx,
                    "UPDATE run_queue q SET final_status = t.status
             FROM UNNEST($1::TEXT[], $2::TEXT[]) AS t(id, status) WHERE q.run_id = t.id",
                )
                .await?,
                &[&self.fin_id, &self.fin_status],
            )
            .await?;
        }
        Ok(())
    }
}

/// Runs one job in a savepoint of the group's transaction: undone alone if it fails
/// (dropping an uncommitted savepoint rolls it back).
async fn run_job(
    url: &str,
    tx: &mut Transaction<'_>,
    st: &Statements,
    work: &Work,
) -> Result<(), StoreError> {
    let error = |e: tokio_postgres::Error| db_error(url, &e);
    let savepoint = tx.savepoint("job").await.map_err(error)?;
    match work {
        Work::Create(run) => insert_run(url, &savepoint, st, run).await?,
        Work::Append(id, batch) => append_batch(url, &savepoint, st, id, batch).await?,
    }
    savepoint.commit().await.map_err(error)
}

async fn insert_run(
    url: &str,
    tx: &Transaction<'_>,
    st: &Statements,
    run: &NewRun,
) -> Result<(), StoreError> {
    let error = |e: tokio_postgres::Error| db_error(url, &e);
    let exists = tx
        .query_opt("SELECT 1 FROM runs WHERE id = $1", &[&run.id])
        .await
        .map_err(error)?;
    if exists.is_some() {
        return Err(StoreError::Exists(run.id.clone()));
    }
    let options = run.options.to_string();
    let running = RunState::Running.as_str();
    let insert_bundle = async {
        tx.execute(
            &st.get(
                tx,
                "INSERT INTO bundles (hash, bytes) VALUES ($1, $2) ON CONFLICT (hash) DO NOTHING",
            )
            .await?,
            &[&run.bundle_hash, &run.bundle],
        )
        .await
    };
    let insert_run = async {
        tx.execute(
            &st.get(
                tx,
                "INSERT INTO runs (id, agent, bundle_hash, state, steps, started_at_ms,
                               updated_at_ms, options, outcome, input_count, event_count)
             VALUES ($1, $2, $3, $4, 0, $5, $5, $6, NULL, 0, 0)",
            )
            .await?,
            &[
                &run.id,
                &run.agent,
                &run.bundle_hash,
                &running,
                &run.started_at_ms,
                &options,
            ],
        )
        .await
    };
    let (bundle, inserted) = tokio::join!(insert_bundle, insert_run);
    bundle.map_err(error)?;
    match inserted {
        Ok(_) => Ok(()),
        // A concurrent create of the same id by another process.
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {
            Err(StoreError::Exists(run.id.clone()))
        }
        Err(e) => Err(error(e)),
    }
}

async fn append_batch(
    url: &str,
    tx: &Transaction<'_>,
    st: &Statements,
    id: &str,
    batch: &Batch,
) -> Result<(), StoreError> {
    let error = |e: tokio_postgres::Error| db_error(url, &e);
    let row = tx
        .query_opt(
            "SELECT state, input_count, event_count FROM runs WHERE id = $1 FOR UPDATE",
            &[&id],
        )
        .await
        .map_err(error)?
        .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
    let (state, input_count, event_count): (String, i64, i64) =
        (row.get(0), row.get(1), row.get(2));
    check_append(id, batch, &state, input_count)?;
    append_rows(tx, st, id, batch, input_count, event_count)
        .await
        .map_err(error)
}

/// Inserts a batch's rows and updates the run's row, pipelined (the statements are sent
/// together and answered together).
async fn append_rows(
    tx: &tokio_postgres::Transaction<'_>,
    st: &Statements,
    id: &str,
    batch: &Batch,
    input_count: i64,
    event_count: i64,
) -> Result<(), tokio_postgres::Error> {
    let (state, outcome) = match &batch.outcome {
        Some(outcome) => (RunState::Finished, Some(outcome.to_string())),
        None => (RunState::Running, None),
    };
    let new_inputs = input_count + db_int(batch.inputs.len() as u64);
    let new_events = event_count + db_int(batch.events.len() as u64);
    let steps = db_int(batch.steps);
    let now = now_ms();
    let inputs = pack_inputs(input_count, &batch.inputs);
    let inputs = insert_packed(
        tx,
        st,
        "INSERT INTO inputs (run_id, seq, n, bytes)
         SELECT $1, t.seq, t.n, t.data FROM UNNEST($2::BIGINT[], $3::BIGINT[], $4::BYTEA[])
              AS t(seq, n, data)",
        id,
        &inputs,
    );
    let events = pack_events(event_count, &batch.events);
    let events = insert_packed(
        tx,
        st,
        "INSERT INTO events (run_id, seq, n, json)
         SELECT $1, t.seq, t.n, t.data FROM UNNEST($2::BIGINT[], $3::BIGINT[], $4::TEXT[])
              AS t(seq, n, data)",
        id,
        &events,
    );
    let checkpoint = append_checkpoint(tx, st, id, batch.checkpoint.as_ref());
    let state = state.as_str();
    let run = async {
        tx.execute(
        &st.get(tx, "UPDATE runs SET steps = $2, updated_at_ms = $3, input_count = $4, event_count = $5,
                         state = $6, outcome = COALESCE($7, outcome)
         WHERE id = $1").await?,
        &[&id, &steps, &now, &new_inputs, &new_events, &state, &outcome],
    )
        .await
    };
    let finished = finish_queued(tx, st, id, batch.outcome.as_ref());
    let pending = store_pending(tx, st, id, batch.pending.as_deref());
    let (inputs, events, checkpoint, run, finished, pending) =
        tokio::join!(inputs, events, checkpoint, run, finished, pending);
    inputs?;
    events?;
    checkpoint?;
    run?;
    finished?;
    pending?;
    Ok(())
}

/// Stores the requests run `id` waits on, if the batch changes them: the same writes as
/// a group's (`GroupRows::update_runs`), for one run.
async fn store_pending(
    tx: &Transaction<'_>,
    st: &Statements,
    id: &str,
    pending: Option<&[serde_json::Value]>,
) -> Result<(), tokio_postgres::Error> {
    let Some(pending) = pending else {
        return Ok(());
    };
    let mut rows = GroupRows::default();
    rows.add_pending(id, pending);
    rows.update_pending(tx, st).await
}

/// Inserts one run's journal rows with `sql` (parameters: the run, and the rows' `seq`,
/// `n` and data as arrays).
async fn insert_packed<T: ToSql + Sync>(
    tx: &Transaction<'_>,
    st: &Statements,
    sql: &str,
    id: &str,
    rows: &[Packed<T>],
) -> Result<u64, tokio_postgres::Error> {
    if rows.is_empty() {
        return Ok(0);
    }
    let seqs: Vec<i64> = rows.iter().map(|r| r.seq).collect();
    let counts: Vec<i64> = rows.iter().map(|r| r.n).collect();
    let data: Vec<&T> = rows.iter().map(|r| &r.data).collect();
    tx.execute(&st.get(tx, sql).await?, &[&id, &seqs, &counts, &data])
        .await
}

/// Adds a batch's checkpoint, if it has one: the previous newest checkpoint's state is
/// dropped first, or the new one would go with it.
async fn append_checkpoint(
    tx: &Transaction<'_>,
    st: &Statements,
    id: &str,
    checkpoint: Option<&StoredCheckpoint>,
) -> Result<u64, tokio_postgres::Error> {
    let Some(checkpoint) = checkpoint else {
        return Ok(0);
    };
    tx.execute(
        &st.get(
            tx,
            "UPDATE checkpoints SET state = NULL WHERE run_id = $1 AND state IS NOT NULL",
        )
        .await?,
        &[&id],
    )
    .await?;
    let params: [&(dyn ToSql + Sync); 5] = [
        &id,
        &db_int(checkpoint.inputs),
        &db_int(checkpoint.history_start),
        &checkpoint.history,
        &checkpoint.state,
    ];
    tx.execute(
        &st.get(
            tx,
            "INSERT INTO checkpoints (run_id, seq, inputs, history_start, history, state)
             VALUES ($1, (SELECT COALESCE(MAX(seq) + 1, 0) FROM checkpoints WHERE run_id = $1),
                     $2, $3, $4, $5)",
        )
        .await?,
        &params,
    )
    .await
}

/// Marks a finished queued run's queue row (a run `create` made has none).
async fn finish_queued(
    tx: &Transaction<'_>,
    st: &Statements,
    id: &str,
    outcome: Option<&serde_json::Value>,
) -> Result<u64, tokio_postgres::Error> {
    let Some(outcome) = outcome else {
        return Ok(0);
    };
    let status = QueueStatus::of_outcome(outcome).as_str();
    tx.execute(
        &st.get(
            tx,
            "UPDATE run_queue SET final_status = $2 WHERE run_id = $1",
        )
        .await?,
        &[&id, &status],
    )
    .await
}

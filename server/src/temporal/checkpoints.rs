//! Long runs: the checkpoints a run carries across continue-as-new, in the worker's run
//! store (spec/temporal.md §6).
//!
//! A checkpoint holds the machine's state and the `context_history` entries since the
//! run's previous one: megabytes in all for a long run, past Temporal's 2 MiB payload
//! limit, so they go to the store `aplc serve` uses (SQLite or PostgreSQL) and the new
//! run's input carries only their reference: the store key and how many there are.
//!
//! Both sides run inside the workflow task, not as activities: an activity's input and
//! result enter history, which is what the store is for. That is deterministic all the
//! same: a checkpoint is written once per (key, steps) and never changed (a replay that
//! writes it again finds it there and writes nothing), and a new run reads only
//! checkpoints written before it started. A worker that cannot reach the store fails its
//! workflow task; Temporal retries it (on this worker or another).

use std::future::Future;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use aplc_runtime::store::{
    self, Batch, NewRun, RunJournal, StoreError, StoreUrl, StoredCheckpoint,
};
use aplc_vm::journal::Checkpoint;

use crate::ServeError;
use crate::agents::Agent;

/// The worker's store of checkpoints, and the runtime its futures run on.
pub(crate) struct Checkpoints {
    store: Arc<dyn RunJournal>,
    url: String,
    runtime: tokio::runtime::Handle,
}

/// A run's checkpoints as stored: every segment, oldest first, and the newest state.
pub(crate) struct Stored {
    pub(crate) segments: Vec<(u64, Vec<u8>)>,
    pub(crate) state: Vec<u8>,
}

impl Checkpoints {
    /// Opens (and creates, for SQLite) the store at `url`.
    pub(crate) async fn open(url: &StoreUrl) -> Result<Checkpoints, ServeError> {
        let store: Arc<dyn RunJournal> = store::open(url).await?;
        Ok(Checkpoints {
            store,
            url: url.to_string(),
            runtime: tokio::runtime::Handle::current(),
        })
    }

    /// Stores `checkpoint`, taken after `steps` steps, as the next of run `key` (of
    /// `agent`); a checkpoint of as many steps already stored (a replay writing it again)
    /// is left as it is.
    pub(crate) fn write(
        &self,
        key: &str,
        agent: &Agent,
        steps: u64,
        checkpoint: Checkpoint,
    ) -> Result<(), String> {
        let store = self.store.clone();
        let record = new_run(key, agent)?;
        let key = key.to_owned();
        self.block_on(async move {
            let lease = match store.summary(&key).await {
                Ok(summary) if summary.steps >= steps => return Ok(()),
                Ok(_) => store.acquire(&key).await?,
                Err(StoreError::NotFound(_)) => store.create(record).await?,
                Err(e) => return Err(e),
            };
            let batch = Batch {
                checkpoint: Some(StoredCheckpoint {
                    inputs: 0,
                    history_start: checkpoint.history_start,
                    history: checkpoint.history,
                    state: Some(checkpoint.state),
                }),
                steps,
                ..Batch::default()
            };
            store.append(&*lease, batch).await
        })
    }

    /// The first `count` checkpoints of run `key`, the state of the last of them.
    pub(crate) fn read(&self, key: &str, count: u64) -> Result<Stored, String> {
        let store = self.store.clone();
        let owned = key.to_owned();
        let loaded = self.block_on(async move { store.load(&owned).await })?;
        let count = usize::try_from(count).unwrap_or(usize::MAX);
        if count == 0 || loaded.checkpoints.len() < count {
            return Err(format!(
                "run `{key}` has {} checkpoints in the store, not {count}",
                loaded.checkpoints.len()
            ));
        }
        let mut checkpoints = loaded.checkpoints;
        checkpoints.truncate(count);
        let state = checkpoints
            .last_mut()
            .and_then(|c| c.state.take())
            .ok_or_else(|| format!("checkpoint {count} of run `{key}` has no state any more"))?;
        let segments = checkpoints
            .into_iter()
            .map(|c| (c.history_start, c.history))
            .collect();
        Ok(Stored { segments, state })
    }

    /// Runs `work` to its end on the worker's runtime, from a thread of its own: the
    /// workflow's thread blocks meanwhile (workflow code may not await outside futures;
    /// Temporal's SDK fails a task that does).
    fn block_on<T: Send>(
        &self,
        work: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> Result<T, String> {
        let runtime = &self.runtime;
        let done = std::thread::scope(|scope| scope.spawn(|| runtime.block_on(work)).join());
        match done {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(format!("the checkpoint store {}: {e}", self.url)),
            Err(_) => Err(format!(
                "the checkpoint store {}: its thread panicked",
                self.url
            )),
        }
    }
}

/// The store's record of a Temporal run's checkpoints: the agent's bundle, no options.
fn new_run(key: &str, agent: &Agent) -> Result<NewRun, String> {
    let bundle = aplc_vm::bundle::encode(agent.program.bundle())
        .map_err(|e| format!("cannot encode the bundle of `{}`: {e}", agent.name))?;
    let started_at_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    Ok(NewRun {
        id: key.to_owned(),
        agent: agent.name.clone(),
        bundle_hash: agent.hash.clone(),
        bundle,
        options: serde_json::json!({"temporal": true}),
        started_at_ms,
    })
}

//! Durable runs: a run whose inputs are journaled in a [`RunJournal`], so that it survives a
//! crash and resumes without repeating a paid call (`spec/durability.md`).
//!
//! The machine is deterministic given its inputs: the times passed in, the provider
//! completions and the tool results. This driver records every input, in order, with the
//! run's events, and commits them in groups while the run goes on, waiting only where an
//! effect depends on it ([`driver::drive`]): before a non-idempotent tool call starts (so
//! a tool in flight at a crash is known to be in flight, and is not run twice), as soon as
//! its result is back, and with the outcome. A crash loses at most the provider answers
//! of the groups not committed yet, which a resume asks for again. Every
//! `checkpoint_every` steps it adds a checkpoint, so a resume restores the newest one and
//! replays only the inputs after it.
//!
//! Resuming replays the journal into the machine, discarding the events it re-emits
//! (they are journaled already), then goes on live. What was in flight at the crash:
//! a provider call is sent again (at least once); a tool call runs again only if the tool
//! is idempotent, and otherwise resolves as a failed call.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value as Json, json};

use crate::driver::{self, Journal, Provider, Toolbox};
use crate::human::{Answerer, Nobody, Pending};
use crate::recorder::{DurableState, Recorder, Window};
pub use crate::recorder::{INTERRUPTED_TOOL, outcome_json};
use crate::redact::Redactor;
use crate::session::{Listener, Observer, RunSession};
use crate::store::{Batch, Lease, LoadedRun, NewRun, RunJournal, StoreError, StoredCheckpoint};
use aplc_vm::journal::Input;
use aplc_vm::{Action, Event, Interrupt, Machine, Program, RunOptions, RunOutcome};

mod events;
mod stored;
pub use events::EventReader;
use stored::{options_from_json, options_json, registry_from_fingerprint, tools_fingerprint};

/// How a durable run journals.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DurableOptions {
    /// Steps between checkpoints (at least 1).
    pub checkpoint_every: u64,
    /// Applied to provider error messages and to every journaled event and outcome: a
    /// server may echo a key into a message, and the store must never hold one.
    pub redactor: Redactor,
    /// How many inputs a run may hold uncommitted while a commit is in flight before it
    /// waits for that commit (`spec/durability.md`, "When the journal commits"): what a
    /// fast run may get ahead of its store, and so what a crash can make it ask again.
    pub max_uncommitted_inputs: usize,
    /// The same bound in bytes: the encoded inputs and redacted events held.
    pub max_uncommitted_bytes: usize,
    /// Who answers the run's requests for a person in this process (`spec/human.md`):
    /// [`Nobody`] by default, and then the run pauses until answers come through the
    /// store.
    pub answerer: Arc<dyn Answerer>,
}

impl Default for DurableOptions {
    fn default() -> Self {
        DurableOptions {
            checkpoint_every: DEFAULT_CHECKPOINT_EVERY,
            redactor: Redactor::default(),
            max_uncommitted_inputs: DEFAULT_MAX_UNCOMMITTED_INPUTS,
            max_uncommitted_bytes: DEFAULT_MAX_UNCOMMITTED_BYTES,
            answerer: Arc::new(Nobody),
        }
    }
}

impl DurableOptions {
    /// These options, with `answerer` asking a person in this process.
    pub fn with_answerer(mut self, answerer: Arc<dyn Answerer>) -> Self {
        self.answerer = answerer;
        self
    }

    fn window(&self) -> Window {
        Window {
            inputs: self.max_uncommitted_inputs,
            bytes: self.max_uncommitted_bytes,
        }
    }
}

/// The default number of steps between checkpoints.
pub const DEFAULT_CHECKPOINT_EVERY: u64 = 100;

/// The default [`DurableOptions::max_uncommitted_inputs`]: about 85 steps of a loop of
/// provider calls (six inputs a step).
pub const DEFAULT_MAX_UNCOMMITTED_INPUTS: usize = 512;

/// The default [`DurableOptions::max_uncommitted_bytes`]: 4 MiB.
pub const DEFAULT_MAX_UNCOMMITTED_BYTES: usize = 4 << 20;

/// A durable run that could not start, go on, or resume.
#[derive(Debug, thiserror::Error)]
pub enum DurableError {
    /// The store refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The journal or a checkpoint does not decode, or replaying it diverged.
    #[error("run `{id}`: {message}")]
    Journal {
        /// The run.
        id: String,
        /// What went wrong.
        message: String,
    },
    /// A resume with another bundle or other tools than the run started with.
    #[error("run `{id}`: {message}")]
    Mismatch {
        /// The run.
        id: String,
        /// What differs.
        message: String,
    },
}

/// How a durable run stopped: over, or waiting for a person.
#[derive(Debug)]
#[must_use]
pub enum Ended {
    /// The run is over; its outcome is stored.
    Finished(Finished),
    /// The run waits for answers (`spec/human.md`): its journal is committed with the
    /// requests, and it goes on with `resume` once they are answered.
    Waiting(Waiting),
}

impl Ended {
    /// The finished run, if it finished.
    pub fn finished(self) -> Option<Finished> {
        match self {
            Ended::Finished(finished) => Some(finished),
            Ended::Waiting(_) => None,
        }
    }
}

/// A durable run that waits for a person.
#[derive(Debug)]
pub struct Waiting {
    /// The run's program.
    pub program: Arc<Program>,
    /// The requests it waits on.
    pub pending: Vec<Pending>,
    /// As [`Finished::replayed_provider_calls`].
    pub replayed_provider_calls: u64,
}

/// A finished durable run.
#[derive(Debug)]
pub struct Finished {
    /// The run's program (for a resume: the bundle the store holds).
    pub program: Arc<Program>,
    /// The outcome, as an uninterrupted run would have it.
    pub outcome: RunOutcome,
    /// Provider completions and errors journaled before this process took the run over
    /// (0 for a new run): a scripted provider skips that many entries to go on where the
    /// run left off.
    pub replayed_provider_calls: u64,
}

/// A new run id: time-ordered (milliseconds since the epoch, in hex) and random enough
/// that two processes starting in the same millisecond do not collide.
///
/// The random part comes from the operating system (through the keys of a std
/// `RandomState`, drawn from it once per thread), not from `fastrand`, whose global
/// generator is seeded with a hash of the monotonic clock and the thread's id alone:
/// sixteen processes started at once drew the same seed, so the same id, and one of them
/// failed with "already exists" (`cli/tests/stores.rs`,
/// `concurrent_starts_on_a_new_file_never_fail`).
pub fn new_run_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let mut random = std::collections::hash_map::RandomState::new().build_hasher();
    random.write_u128(ms);
    random.write_u32(std::process::id());
    format!("{ms:012x}-{:08x}", random.finish() as u32)
}

/// The content hash a bundle is stored under: xxh3-128 of its encoded bytes, in hex.
pub fn bundle_hash(encoded: &[u8]) -> String {
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(encoded))
}

/// A new durable run: its id (unique in the store), program and options.
#[derive(Debug, Clone)]
pub struct NewDurableRun {
    /// The run id ([`new_run_id`] makes one).
    pub id: String,
    /// What to run.
    pub program: Arc<Program>,
    /// How (`tools` and `events` are set by the driver).
    pub options: RunOptions,
}

/// Starts a durable run in `store`, and drives it to the end.
///
/// The run is journaled (`options.journaled`). Its events are built only for a
/// `listener`, and then stored as made; a run nobody listens to stores none, and its
/// events are read back by replaying its journal ([`EventReader`], `spec/durability.md`,
/// "Events"). Without a listener, `options.phase_times` is turned off. Returns an error
/// only when the store fails: the run then stays resumable from its last commit.
pub async fn start(
    store: &dyn RunJournal,
    mut run: NewDurableRun,
    provider: &dyn Provider,
    toolbox: &Toolbox,
    listener: Option<Listener<'_>>,
    config: &DurableOptions,
) -> Result<Ended, DurableError> {
    // Nobody to tell how long each phase took: the run makes the polls of a run with
    // events off, and its journal says so (`RunOptions::phase_times`).
    run.options.phase_times &= listener.is_some();
    let record = new_run_record(&run, toolbox, config)?;
    let NewDurableRun {
        program,
        mut options,
        ..
    } = run;
    options.tools = toolbox.registry();
    options.journaled = true;
    options.events = listener.is_some();
    let machine = Machine::new(program.clone(), options);
    let reopened = Reopened {
        program,
        machine,
        recorder: Recorder::new(config.checkpoint_every, config.redactor.clone(), 0, 0),
        committer: Committer::creating(store, record, config),
        at: Duration::ZERO,
        pending: None,
        last_event: None,
        replayed_provider_calls: 0,
        stored_events: false,
    };
    reopened.run(provider, toolbox, listener).await
}

/// What the store keeps of a new run: its bundle, options and tools' fingerprint, for
/// [`RunJournal::create`] or for a service's queue
/// ([`RunQueue::enqueue`](crate::store::RunQueue::enqueue)), which stores the run
/// unstarted for a worker to [`reopen_claimed`].
pub fn new_run_record(
    run: &NewDurableRun,
    toolbox: &Toolbox,
    config: &DurableOptions,
) -> Result<NewRun, DurableError> {
    // The agents its host gives it by name are linked into the stored bundle: the run's
    // agents are fixed when it starts, and a resume (anywhere) runs the same ones.
    let encoded = match run.options.agents.is_empty() {
        true => aplc_vm::bundle::encode(run.program.bundle()),
        false => {
            let agents = (run.options.agents.iter()).map(|(name, p)| (name.as_str(), p.bundle()));
            aplc_vm::bundle::encode(&run.program.bundle().linking(agents))
        }
    };
    let bundle = encoded.map_err(|e| DurableError::Journal {
        id: run.id.clone(),
        message: format!("cannot encode the bundle: {e}"),
    })?;
    let started_at_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    Ok(NewRun {
        id: run.id.clone(),
        agent: run.program.bundle().source_name.clone(),
        bundle_hash: bundle_hash(&bundle),
        bundle,
        options: options_json(&run.options, toolbox, config),
        started_at_ms,
    })
}

/// Resumes the unfinished run `id` from `store` and drives it to the end:
/// [`reopen`], then [`Reopened::run`].
pub async fn resume(
    store: &dyn RunJournal,
    id: &str,
    expected: Option<&Program>,
    provider: &dyn Provider,
    toolbox: &Toolbox,
    listener: Option<Listener<'_>>,
    config: &DurableOptions,
) -> Result<Ended, DurableError> {
    reopen(store, id, expected, toolbox, config)
        .await?
        .run(provider, toolbox, listener)
        .await
}

/// A run taken over from the store and replayed up to its last journaled input, ready
/// to go on live.
pub struct Reopened<'s> {
    program: Arc<Program>,
    machine: Machine,
    recorder: Recorder,
    committer: Committer<'s>,
    at: Duration,
    pending: Option<Action>,
    /// The last event the replay re-made: an in-flight call's `provider_call`.
    last_event: Option<Event>,
    replayed_provider_calls: u64,
    /// The run stored its events so far (it had a listener): it goes on storing them,
    /// listened to or not, so that they stay one unbroken sequence in the store.
    stored_events: bool,
}

impl std::fmt::Debug for Reopened<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reopened")
            .field("steps", &self.machine.steps())
            .field("at", &self.at)
            .field("replayed_provider_calls", &self.replayed_provider_calls)
            .finish_non_exhaustive()
    }
}

impl Reopened<'_> {
    /// The run's program: the bundle it started with.
    pub fn program(&self) -> &Arc<Program> {
        &self.program
    }

    /// Provider completions and errors journaled before the crash: a scripted provider
    /// skips that many entries to go on where the run left off.
    pub fn replayed_provider_calls(&self) -> u64 {
        self.replayed_provider_calls
    }

    /// Drives the run to the end with `provider` and `toolbox` (the tools it started
    /// with).
    pub async fn run(
        self,
        provider: &dyn Provider,
        toolbox: &Toolbox,
        listener: Option<Listener<'_>>,
    ) -> Result<Ended, DurableError> {
        let mut machine = self.machine;
        // The replay checked the journal with events on; nobody to hand them to, and
        // none stored before: the run goes on counting them. A run that never started
        // (queued, or dead before its first commit) still holds its `run_started`: made
        // on read too, then, not stored alone.
        let events = listener.is_some() || self.stored_events;
        machine.set_events(events);
        if !events {
            drop(machine.drain_events());
        }
        let observer = listener.map(|listener| Box::new(listener) as Observer<'_>);
        let session = RunSession::resumed(
            machine,
            self.at,
            observer,
            Some(self.recorder),
            self.pending,
            self.last_event.as_ref(),
        );
        let answerer = self.committer.answerer.clone();
        let ended = driver::drive(
            session,
            provider,
            toolbox,
            &self.committer,
            answerer.as_ref(),
        )
        .await?;
        Ok(match ended {
            driver::Ended::Finished(outcome) => Ended::Finished(Finished {
                program: self.program,
                outcome,
                replayed_provider_calls: self.replayed_provider_calls,
            }),
            driver::Ended::Waiting(pending) => Ended::Waiting(Waiting {
                program: self.program,
                pending,
                replayed_provider_calls: self.replayed_provider_calls,
            }),
        })
    }
}

/// Takes over the unfinished run `id` from `store`: takes its lease, restores its newest
/// checkpoint and replays the journal after it.
///
/// The bundle comes from the store; `expected`, if given, must be the same bundle (a
/// resume on another bundle is refused). The toolbox must have the tools the run started
/// with. Another process advancing the run gets [`StoreError::Locked`]; a finished run
/// gets [`StoreError::Finished`].
pub async fn reopen<'s>(
    store: &'s dyn RunJournal,
    id: &str,
    expected: Option<&Program>,
    toolbox: &Toolbox,
    config: &DurableOptions,
) -> Result<Reopened<'s>, DurableError> {
    let lease = store.acquire(id).await?;
    let loaded = store.load(id).await?;
    let restored = restore(id, &loaded, expected, toolbox, config, Interrupt::new())?;
    Ok(restored.leased(store, lease, config, &loaded.summary.pending))
}

/// [`reopen`] for a run a service's worker claimed
/// ([`RunQueue::claim`](crate::store::RunQueue::claim)) with its lease: a queued run
/// never started (its journal is empty: it starts from the beginning) or one whose worker
/// died. `loaded` is the run as the claim read it, if it did
/// ([`Claim::loaded`](crate::store::Claim::loaded)); otherwise it is loaded here.
/// `interrupt` becomes the run's cancel flag: set it only once this returns, since a
/// flag set during the replay would stop the replay itself.
///
/// A run that can never resume here (a corrupt row or journal, another bundle, other
/// tools) is ended failed under the lease before the error is returned.
pub async fn reopen_claimed<'s>(
    store: &'s dyn RunJournal,
    lease: Box<dyn Lease>,
    loaded: Option<LoadedRun>,
    toolbox: &Toolbox,
    config: &DurableOptions,
    interrupt: Interrupt,
) -> Result<Reopened<'s>, DurableError> {
    let id = lease.run_id().to_owned();
    let restored = match loaded {
        Some(loaded) => Ok(loaded),
        None => store.load(&id).await.map_err(DurableError::from),
    }
    .and_then(|loaded| {
        let restored = restore(&id, &loaded, None, toolbox, config, interrupt)?;
        Ok((restored, loaded.summary.pending))
    });
    match restored {
        Ok((restored, pending)) => Ok(restored.leased(store, lease, config, &pending)),
        Err(e) => {
            // A run that cannot resume here ends failed, once, while this worker still
            // holds its lease: left unfinished (or released first), it would be claimed
            // and dropped again and again.
            if matches!(
                e,
                DurableError::Journal { .. }
                    | DurableError::Mismatch { .. }
                    | DurableError::Store(StoreError::Corrupt(_))
            ) {
                abandon(store, lease.as_ref(), &id, &e.to_string()).await?;
            }
            Err(e)
        }
    }
}

/// A run's state rebuilt from its stored journal, before anything commits for it.
struct Restored {
    program: Arc<Program>,
    machine: Machine,
    recorder: Recorder,
    at: Duration,
    pending: Option<Action>,
    last_event: Option<Event>,
    replayed_provider_calls: u64,
    stored_events: bool,
}

impl Restored {
    /// The run, going on under `lease`.
    fn leased<'s>(
        self,
        store: &'s dyn RunJournal,
        lease: Box<dyn Lease>,
        config: &DurableOptions,
        pending: &[Json],
    ) -> Reopened<'s> {
        Reopened {
            program: self.program,
            machine: self.machine,
            recorder: self.recorder,
            committer: Committer::leased(store, lease, config, pending),
            at: self.at,
            pending: self.pending,
            last_event: self.last_event,
            replayed_provider_calls: self.replayed_provider_calls,
            stored_events: self.stored_events,
        }
    }
}

/// Rebuilds run `id` from `loaded`: checks its bundle (against `expected`, if given) and
/// its tools, restores its newest checkpoint and replays the journal after it.
fn restore(
    id: &str,
    loaded: &LoadedRun,
    expected: Option<&Program>,
    toolbox: &Toolbox,
    config: &DurableOptions,
    interrupt: Interrupt,
) -> Result<Restored, DurableError> {
    let corrupt = |message: String| DurableError::Journal {
        id: id.to_owned(),
        message,
    };
    let mismatch = |message: String| DurableError::Mismatch {
        id: id.to_owned(),
        message,
    };
    if let Some(expected) = expected {
        let encoded = aplc_vm::bundle::encode(expected.bundle())
            .map_err(|e| corrupt(format!("cannot encode the bundle: {e}")))?;
        let hash = bundle_hash(&encoded);
        if hash != loaded.summary.bundle_hash {
            return Err(mismatch(format!(
                "it started with bundle {} and can only resume on it; this agent is bundle {hash}",
                loaded.summary.bundle_hash
            )));
        }
    }
    let program = stored_program(id, loaded)?;
    let mut options = options_from_json(id, &loaded.options)?;
    let stored_tools = loaded.options.get("tools").cloned().unwrap_or(Json::Null);
    if stored_tools != tools_fingerprint(toolbox) {
        return Err(mismatch(
            "the tools differ from the ones it started with: pass the same tool flags".into(),
        ));
    }
    options.tools = toolbox.registry();
    options.interrupt = interrupt;
    let replayed = replay(id, program.clone(), options, loaded)?;
    let mut recorder = Recorder::new(
        config.checkpoint_every,
        config.redactor.clone(),
        replayed.inputs,
        replayed.provider_inputs,
    );
    recorder.steps_at_checkpoint = replayed.machine.steps();
    recorder.history_start = replayed.history_start;
    Ok(Restored {
        program,
        machine: replayed.machine,
        recorder,
        at: replayed.at,
        pending: replayed.pending,
        last_event: replayed.last_event,
        replayed_provider_calls: replayed.provider_inputs,
        stored_events: loaded.events > 0,
    })
}

/// Ends the unfinished run `id`, whose lease is held, as failed with `message`, without
/// running it: for a claimed run that cannot resume here (its journal does not replay on
/// this build, or the tools it started with are gone), so that it is not claimed again
/// and again. The outcome's error kind is `Resume`.
async fn abandon(
    store: &dyn RunJournal,
    lease: &dyn Lease,
    id: &str,
    message: &str,
) -> Result<(), DurableError> {
    let summary = store.summary(id).await?;
    let outcome = json!({
        "status": "failed",
        "error": { "kind": "Resume", "message": message, "step": null },
        "steps": summary.steps,
        "last_step_errors": [],
        "context": null,
    });
    let batch = Batch {
        first_input: summary.inputs,
        steps: summary.steps,
        outcome: Some(outcome),
        ..Batch::default()
    };
    store.append(lease, batch).await?;
    Ok(())
}

/// A run's current state, rebuilt from the store without taking it over: for
/// `aplc runs show` on an unfinished run. The tools are rebuilt from their stored
/// descriptors; nothing runs.
pub async fn inspect(store: &dyn RunJournal, id: &str) -> Result<RunOutcome, DurableError> {
    let loaded = store.load(id).await?;
    let (program, options) = stored_run(id, &loaded)?;
    Ok(replay(id, program, options, &loaded)?
        .machine
        .into_outcome())
}

/// The run's program and options as the store holds them, its tools rebuilt from their
/// stored descriptors: to look at the run, or replay it for its events, without running
/// anything.
fn stored_run(id: &str, loaded: &LoadedRun) -> Result<(Arc<Program>, RunOptions), DurableError> {
    let program = stored_program(id, loaded)?;
    let mut options = options_from_json(id, &loaded.options)?;
    let tools = loaded.options.get("tools").cloned().unwrap_or(Json::Null);
    let registry = registry_from_fingerprint(&tools).map_err(|e| DurableError::Journal {
        id: id.to_owned(),
        message: format!("tools: {e}"),
    })?;
    options.tools = Arc::new(registry);
    Ok((program, options))
}

/// The run's program, from the bundle the store holds. The bundle is checked against the
/// content hash it is stored under first: its own checksum covers accidents, not a
/// bundle rewritten in the store with its checksum recomputed, whose prompts a resume
/// would otherwise send.
fn stored_program(id: &str, loaded: &LoadedRun) -> Result<Arc<Program>, DurableError> {
    let corrupt = |message: String| DurableError::Journal {
        id: id.to_owned(),
        message,
    };
    let hash = bundle_hash(&loaded.bundle);
    if hash != loaded.summary.bundle_hash {
        return Err(corrupt(format!(
            "the stored bundle does not match its content hash: it is stored as {} but hashes \
             to {hash}; it was changed in the store, and the run cannot resume on it",
            loaded.summary.bundle_hash
        )));
    }
    let program = Program::load(&loaded.bundle)
        .map_err(|e| corrupt(format!("the stored bundle does not load: {e}")))?;
    Ok(Arc::new(program))
}

/// A machine brought up to a run's last journaled input.
struct Replayed {
    machine: Machine,
    /// The machine's clock at the last input.
    at: Duration,
    /// What the last `poll` asked for, if the journal ends with it.
    pending: Option<Action>,
    /// The last event the replay re-made.
    last_event: Option<Event>,
    /// Inputs journaled in all.
    inputs: u64,
    /// Provider answers journaled in all.
    provider_inputs: u64,
    /// The first `context_history` entry no stored checkpoint holds.
    history_start: u64,
}

/// Restores the newest checkpoint (or starts over) and replays the journal after it.
fn replay(
    id: &str,
    program: Arc<Program>,
    mut options: RunOptions,
    loaded: &LoadedRun,
) -> Result<Replayed, DurableError> {
    let corrupt = |message: String| DurableError::Journal {
        id: id.to_owned(),
        message,
    };
    options.events = true;
    options.journaled = true;
    let (mut machine, mut at, mut provider_inputs, base) = match loaded.checkpoints.last() {
        Some(StoredCheckpoint {
            inputs,
            state: Some(state),
            ..
        }) => {
            let state: DurableState =
                postcard::from_bytes(state).map_err(|e| corrupt(format!("checkpoint: {e}")))?;
            let segments: Vec<(u64, &[u8])> = loaded
                .checkpoints
                .iter()
                .map(|c| (c.history_start, c.history.as_slice()))
                .collect();
            let machine = Machine::restore(program, options, &segments, &state.machine)
                .map_err(|e| corrupt(format!("checkpoint: {e}")))?;
            (machine, state.at, state.provider_inputs, *inputs)
        }
        Some(_) => return Err(corrupt("the newest checkpoint has no state".into())),
        None => (Machine::new(program, options), Duration::ZERO, 0, 0),
    };
    let history_start = if loaded.checkpoints.is_empty() {
        0
    } else {
        machine.history_len()
    };

    // The events the replay re-emits are journaled already, or were never stored (a run
    // nobody listened to: `EventReader` makes them by replay too); a journal that stored
    // more than the replay makes went another way than the run did. Each input's
    // recorded position, checked by `Machine::replay`, says the rest.
    let mut last_event: Option<Event> = None;
    let mut pending = None;
    let mut forget = |machine: &mut Machine| {
        if let Some(event) = machine.drain_events().next_back() {
            last_event = Some(event);
        }
    };
    // A run that died before its first commit has journaled nothing, not even the
    // `run_started` its machine makes: those events are left for the live run to journal.
    if loaded.events == 0 && loaded.inputs.is_empty() && loaded.checkpoints.is_empty() {
        return Ok(Replayed {
            machine,
            at,
            pending,
            last_event: None,
            inputs: 0,
            provider_inputs,
            history_start: 0,
        });
    }
    forget(&mut machine);
    // Each input goes through the machine's door and is checked against the position
    // the journal recorded after it: a journal that this machine would replay another
    // way is refused where it diverges.
    for (index, bytes) in (base..).zip(&loaded.inputs) {
        let (input, recorded) = Input::decode_entry(bytes).map_err(|e| corrupt(e.to_string()))?;
        at = input.at();
        let poll = matches!(input, Input::Poll { .. });
        if matches!(input, Input::Provider { .. }) {
            provider_inputs += 1;
        }
        let action =
            (machine.replay(index, input, recorded)).map_err(|e| corrupt(e.to_string()))?;
        // What the last poll asked for, if the journal ends with it: in flight.
        pending = (poll && !matches!(action, Action::Continue)).then_some(action);
        forget(&mut machine);
    }
    let made = machine.position().events;
    if made < loaded.events {
        return Err(corrupt(format!(
            "replaying the journal gave {made} events where {} were journaled: the journal \
             does not match this aplc's machine",
            loaded.events
        )));
    }
    Ok(Replayed {
        machine,
        at,
        pending,
        last_event,
        inputs: base + loaded.inputs.len() as u64,
        provider_inputs,
        history_start,
    })
}

/// Where a durable run's batches go: its store, under its lease.
///
/// A reopened run holds its lease already. A new run's is taken by its first commit,
/// which creates the run's row: so the creation goes out with the first group, while the
/// first provider call is out, instead of before the run starts (on PostgreSQL a creation
/// waits for an fsync, 16–18 ms with 100 runs at once). Nothing outside the run depends
/// on the row before that commit: a non-idempotent tool and the outcome wait for it
/// (`spec/durability.md`, "When the journal commits"). A run whose id turns out taken
/// fails there, its first provider call wasted; ids are new (`new_run_id`), and the CLI
/// checks one given with `--run-id` before it starts.
struct Committer<'s> {
    store: &'s dyn RunJournal,
    id: String,
    lease: tokio::sync::OnceCell<Box<dyn Lease>>,
    /// The new run's row, until its first commit creates it.
    create: std::sync::Mutex<Option<NewRun>>,
    window: Window,
    answerer: Arc<dyn Answerer>,
    /// When the run first paused on each request it waited on when it was reopened.
    requested_at: std::collections::HashMap<String, i64>,
}

impl<'s> Committer<'s> {
    /// A committer for a run whose lease is held, which waited on `pending` (as stored).
    fn leased(
        store: &'s dyn RunJournal,
        lease: Box<dyn Lease>,
        config: &DurableOptions,
        pending: &[Json],
    ) -> Self {
        let requested_at = pending
            .iter()
            .filter_map(Pending::from_json)
            .map(|p| (p.request.id, p.requested_at_ms))
            .collect();
        Committer {
            store,
            id: lease.run_id().to_owned(),
            lease: tokio::sync::OnceCell::new_with(Some(lease)),
            create: std::sync::Mutex::new(None),
            window: config.window(),
            answerer: config.answerer.clone(),
            requested_at,
        }
    }

    /// A committer whose first commit creates the run `record`.
    fn creating(store: &'s dyn RunJournal, record: NewRun, config: &DurableOptions) -> Self {
        Committer {
            store,
            id: record.id.clone(),
            lease: tokio::sync::OnceCell::new(),
            create: std::sync::Mutex::new(Some(record)),
            window: config.window(),
            answerer: config.answerer.clone(),
            requested_at: Default::default(),
        }
    }

    /// The run's lease: the one held, or the one creating the run takes.
    async fn lease(&self) -> Result<&dyn Lease, StoreError> {
        let lease = self
            .lease
            .get_or_try_init(|| async {
                let record = self.create.lock().unwrap_or_else(|e| e.into_inner()).take();
                match record {
                    Some(record) => self.store.create(record).await,
                    // Only after a creation failed, which ended the run.
                    None => Err(StoreError::Database("the run's creation failed".into())),
                }
            })
            .await?;
        Ok(lease.as_ref())
    }
}

impl Journal for Committer<'_> {
    type Error = StoreError;

    async fn commit(&self, batch: Option<Batch>) -> Result<(), StoreError> {
        match batch {
            Some(batch) => self.store.append(self.lease().await?, batch).await,
            None => Ok(()),
        }
    }

    fn window(&self) -> Window {
        self.window
    }

    fn durable(&self) -> bool {
        true
    }

    fn requested_at(&self, id: &str) -> Option<i64> {
        self.requested_at.get(id).copied()
    }

    async fn offer(&self, answer: &aplc_vm::human::HumanAnswer) -> Result<(), StoreError> {
        // Another answer stored first wins: the run takes whatever the store holds.
        let json = crate::human::answer_json(answer);
        self.store
            .answer(&self.id, &answer.id, json)
            .await
            .map(drop)
    }

    async fn stored_answers(&self) -> Result<Vec<aplc_vm::human::HumanAnswer>, StoreError> {
        let stored = self.store.answers(&self.id).await?;
        // The service checked each answer before storing it; one that does not read is
        // left out (and the run waits on its request).
        Ok(stored
            .iter()
            .filter_map(|(id, json)| crate::human::answer_from_json(id, json).ok())
            .collect())
    }
}

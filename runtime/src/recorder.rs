//! A durable run's journal as its session writes it: every input, encoded with the
//! position the machine reached, and every event, redacted, batched for the store; the
//! checkpoints taken every `checkpoint_every` steps; and the stored forms they use
//! (`spec/durability.md`). No I/O: the driver commits the batches
//! ([`crate::durable`] holds the store and the lease).

use std::sync::Arc;
use std::time::Duration;

use aplc_vm::journal::Input;
use aplc_vm::{Action, Event, Machine, RunOutcome};
use serde::{Deserialize, Serialize};
use serde_json::{Value as Json, json};

use crate::redact::Redactor;
use crate::store::{
    Batch, DeferredSegment, Made, QueueStatus, SegmentOutcome, StoredCheckpoint, event_weight,
};

/// The message a non-idempotent tool call in flight at a crash resolves with.
pub const INTERRUPTED_TOOL: &str = "interrupted; not retried because the tool is not idempotent";

/// The outcome as stored: what `aplc runs show` prints. The final variables are kept,
/// but not `context_history`: it holds every step's variables, so storing it would cost
/// each run O(steps × context) at its end, the very growth the journal avoids. The whole
/// final context is rebuilt from the checkpoints and the journal ([`inspect`]).
pub fn outcome_json(outcome: &RunOutcome) -> Json {
    let error = outcome.error.as_ref().map(|error| {
        json!({
            "kind": format!("{:?}", error.kind),
            "message": error.message,
            "step": error.step,
        })
    });
    json!({
        "status": QueueStatus::of_run(outcome).as_str(),
        "error": error,
        "steps": outcome.steps,
        "last_step_errors": outcome.last_step_errors,
        "context": outcome.variables_json(),
    })
}

/// How far a durable run may go on ahead of its store: the inputs, and the bytes of
/// inputs and events, it may hold uncommitted while a commit is in flight before it waits
/// for that commit (`spec/durability.md`, "When the journal commits").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    /// Uncommitted inputs.
    pub(crate) inputs: usize,
    /// Uncommitted bytes (encoded inputs and redacted events).
    pub(crate) bytes: usize,
}

impl Window {
    /// No bound: for a run that journals nothing.
    pub(crate) const UNBOUNDED: Window = Window {
        inputs: usize::MAX,
        bytes: usize::MAX,
    };
}

/// What the driver keeps beside the machine's own checkpoint: the machine's clock at the
/// checkpoint (a resume counts on from it) and how many provider answers came before it.
#[derive(Serialize, Deserialize)]
pub(crate) struct DurableState {
    pub(crate) at: Duration,
    pub(crate) provider_inputs: u64,
    pub(crate) machine: Vec<u8>,
}

/// A durable run's record of what its session consumed and made since the last commit:
/// every input, encoded as a journal entry with the position the machine reached, and
/// every event, redacted. No I/O: the driver commits what [`Recorder::batch`] hands out.
pub(crate) struct Recorder {
    /// Inputs handed out in batches so far: the number of the first one in `inputs`.
    committed: u64,
    inputs: Vec<Vec<u8>>,
    /// Written as text, redacted, by the store's writer, not here (`Batch::render`).
    events: Vec<Event>,
    /// The bytes of `inputs` and the weight of `events` (`store::event_weight`).
    bytes: usize,
    /// Provider answers journaled so far.
    provider_inputs: u64,
    checkpoint_every: u64,
    pub(crate) steps_at_checkpoint: u64,
    /// The first `context_history` entry the next checkpoint carries.
    pub(crate) history_start: u64,
    /// A checkpoint for the next batch, and its history segment if the store's writer is
    /// to write it.
    checkpoint: Option<(StoredCheckpoint, Option<Box<DeferredSegment>>)>,
    /// The last checkpoint whose segment the store's writer has not written yet, and
    /// `steps_at_checkpoint` and `history_start` before it: the next checkpoint waits
    /// for it, and starts from there again if it was refused.
    segment: Option<(Arc<SegmentOutcome>, u64, u64)>,
    /// Checkpoints leave their history segment to the store's writer; false once one
    /// was refused (this run's are then written whole, on its own thread).
    defer: bool,
    /// The requests the run waits on, for the next batch to store (`Batch::pending`).
    pending: Option<Vec<Json>>,
    redactor: Redactor,
}

impl Recorder {
    /// A record that goes on from `committed` inputs, `provider_inputs` of them provider
    /// answers, and checkpoints every `checkpoint_every` steps (at least 1).
    pub(crate) fn new(
        checkpoint_every: u64,
        redactor: Redactor,
        committed: u64,
        provider_inputs: u64,
    ) -> Recorder {
        Recorder {
            committed,
            inputs: Vec::new(),
            events: Vec::new(),
            bytes: 0,
            provider_inputs,
            checkpoint_every: checkpoint_every.max(1),
            steps_at_checkpoint: 0,
            history_start: 0,
            checkpoint: None,
            segment: None,
            defer: true,
            pending: None,
            redactor,
        }
    }

    /// Stores `pending` (the requests the run waits on; empty: none) with the next batch.
    pub(crate) fn set_pending(&mut self, pending: Vec<Json>) {
        self.pending = Some(pending);
    }

    /// What scrubs the journal of secrets.
    pub(crate) fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    /// Hands `input` to `machine` and journals it with the position the machine reached.
    pub(crate) fn input(&mut self, machine: &mut Machine, input: Input) -> Action {
        if matches!(input, Input::Provider { .. }) {
            self.provider_inputs += 1;
        }
        let entry = input.entry_head();
        let action = machine.apply(input);
        let entry = entry.finish(machine.position());
        self.bytes += entry.len();
        self.inputs.push(entry);
        action
    }

    /// Journals `event` (redacted when the store writes it).
    pub(crate) fn event(&mut self, event: Event) {
        self.bytes += event_weight(&event);
        self.events.push(event);
    }

    /// True if what waits for a commit is past `window`: more inputs or bytes than it
    /// lets a run hold.
    pub(crate) fn outruns(&self, window: &Window) -> bool {
        self.inputs.len() > window.inputs || self.bytes > window.bytes
    }

    /// Adds a checkpoint to the next batch if `checkpoint_every` steps passed since the
    /// last one. A machine holding a value with no durable form is not checkpointed now;
    /// a resume replays from the previous checkpoint instead. Nor is one taken while the
    /// last one waits for its batch (a run going on ahead of its commits): each checkpoint
    /// carries the `context_history` entries since the one before, so none may be dropped.
    ///
    /// The checkpoint's state is written here, its history segment (most of its cost)
    /// by the store's writer (`Batch::render`); a segment it refuses leaves the batch
    /// without its checkpoint, and the next is written whole from the same start.
    pub(crate) fn maybe_checkpoint(&mut self, machine: &Machine, at: Duration) {
        if let Some((outcome, steps, start)) = &self.segment {
            match outcome.get() {
                SegmentOutcome::PENDING => return,
                SegmentOutcome::REFUSED => {
                    self.steps_at_checkpoint = *steps;
                    self.history_start = *start;
                    self.defer = false;
                }
                _ => {}
            }
            self.segment = None;
        }
        if self.checkpoint.is_none()
            && machine.steps() >= self.steps_at_checkpoint + self.checkpoint_every
        {
            self.checkpoint = self.checkpoint(machine, at);
        }
    }

    fn checkpoint(
        &mut self,
        machine: &Machine,
        at: Duration,
    ) -> Option<(StoredCheckpoint, Option<Box<DeferredSegment>>)> {
        // `Unencodable`: a value with no durable form; the next checkpoint may do.
        let (history_start, history, state, deferred) = if self.defer {
            let checkpoint = machine.checkpoint_deferred(self.history_start).ok()?;
            let deferred = Box::new(DeferredSegment {
                segment: checkpoint.history,
                outcome: Arc::default(),
            });
            (
                checkpoint.history_start,
                Vec::new(),
                checkpoint.state,
                Some(deferred),
            )
        } else {
            let checkpoint = machine.checkpoint(self.history_start).ok()?;
            (
                checkpoint.history_start,
                checkpoint.history,
                checkpoint.state,
                None,
            )
        };
        let state = DurableState {
            at,
            provider_inputs: self.provider_inputs,
            machine: state,
        };
        let state = postcard::to_allocvec(&state).ok()?;
        if let Some(deferred) = &deferred {
            let before = (self.steps_at_checkpoint, self.history_start);
            self.segment = Some((deferred.outcome.clone(), before.0, before.1));
        }
        self.steps_at_checkpoint = machine.steps();
        self.history_start = machine.history_len();
        let checkpoint = StoredCheckpoint {
            inputs: self.committed + self.inputs.len() as u64,
            history_start,
            history,
            state: Some(state),
        };
        Some((checkpoint, deferred))
    }

    /// Everything journaled since the last batch, for one transaction: the inputs, the
    /// events, the checkpoint due, and the outcome at the end (`None` when there is
    /// nothing to commit). `steps` is the run's step count now.
    pub(crate) fn batch(&mut self, steps: u64, outcome: Option<Json>) -> Option<Batch> {
        let (checkpoint, segment) = self.checkpoint.take().unzip();
        if self.inputs.is_empty()
            && self.events.is_empty()
            && checkpoint.is_none()
            && outcome.is_none()
            && self.pending.is_none()
        {
            return None;
        }
        let inputs = std::mem::take(&mut self.inputs);
        self.bytes = 0;
        let first_input = self.committed;
        self.committed += inputs.len() as u64;
        Some(Batch {
            first_input,
            inputs,
            events: Vec::new(),
            made: Made {
                events: std::mem::take(&mut self.events),
                redactor: self.redactor.clone(),
                history: segment.flatten(),
            },
            checkpoint,
            steps,
            outcome,
            pending: self.pending.take(),
        })
    }

    /// The last batch: what is left, with the outcome, redacted.
    pub(crate) fn finish(&mut self, outcome: &RunOutcome) -> Batch {
        let stored = self.redactor.redact_json(outcome_json(outcome));
        let batch = self.batch(outcome.steps, Some(stored));
        batch.unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use aplc_vm::{Event, EventKind};

    use super::Recorder;
    use crate::redact::Redactor;

    fn events() -> Vec<Event> {
        let at = |seq, kind| Event {
            seq,
            t_ms: 0.125 * seq as f64,
            kind,
            path: None,
        };
        vec![
            Event::provider_delta(
                1,
                Duration::from_micros(1500),
                "ask",
                0,
                "ça \"va\"\n".into(),
            ),
            at(
                2,
                EventKind::Error {
                    step: None,
                    message: "a \u{1F600} and a tab\t".into(),
                },
            ),
            at(
                3,
                EventKind::ToolResult {
                    step: "ask".into(),
                    tool: "lookup".into(),
                    call_id: "c1".into(),
                    with_error: false,
                    duration_ms: 1e-7,
                    reused: true,
                },
            ),
        ]
    }

    /// The fast path of a run that knows no secret writes the very text the redacting
    /// path writes: the same fields, in the same order, with the same numbers.
    #[test]
    fn an_event_is_journaled_as_the_same_text_with_or_without_a_redactor() {
        let mut plain = Recorder::new(100, Redactor::default(), 0, 0);
        let mut redacting = Recorder::new(100, Redactor::new(["not-in-any-event-0123"]), 0, 0);
        for event in events() {
            plain.event(event.clone());
            redacting.event(event);
        }
        let texts = |recorder: &mut Recorder| {
            let mut batch = recorder.batch(0, None).expect("a batch");
            batch.render();
            batch.events
        };
        let plain = texts(&mut plain);
        let expected: Vec<String> = events().iter().map(|e| e.to_json().to_string()).collect();
        assert_eq!(plain, expected);
        assert_eq!(plain, texts(&mut redacting));
    }

    /// A secret in an event never reaches the store: the writer's text is redacted.
    #[test]
    fn a_made_event_is_redacted_when_written() {
        let mut recorder = Recorder::new(100, Redactor::new(["sk-secret-0123456789"]), 0, 0);
        let mut event = events().remove(1);
        event.kind = EventKind::Error {
            step: None,
            message: "the key sk-secret-0123456789 was refused".into(),
        };
        recorder.event(event);
        let mut batch = recorder.batch(0, None).expect("a batch");
        batch.render();
        assert_eq!(batch.events.len(), 1);
        assert!(
            !batch.events[0].contains("sk-secret"),
            "{}",
            batch.events[0]
        );
    }
}

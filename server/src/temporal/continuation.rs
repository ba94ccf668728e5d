//! When a workflow run continues as new (spec/temporal.md §6), decided from its progress
//! alone: the steps it made, its history's length, Temporal's suggestion. Pure, so the
//! decision is the same on every replay and is tested without a server; the workflow
//! ([`super::workflow`]) checkpoints and continues when [`Schedule::due`] says so.
//!
//! Also here: whose checkpoints a run may go on from ([`own_key`]).

/// A workflow run continues as new once its history has this many events, if Temporal
/// did not suggest it sooner (it does at 4,096 by default), well before its warning at
/// 10,240.
pub(crate) const CONTINUE_AT_EVENTS: u32 = 8_000;

/// After a checkpoint was refused (a variable holds a value with no durable form), the
/// events the history grows by before the run tries again: Temporal's default for
/// suggesting a continue-as-new, so a run that cannot be checkpointed for a while tries a
/// few times before Temporal's limit (51,200 events), not at every step.
pub(crate) const RETRY_AFTER_EVENTS: u32 = 4_096;

/// How far a workflow run is, as its continue-as-new is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Progress {
    /// The machine's steps so far (the whole run's, not this workflow run's).
    pub(crate) steps: u64,
    /// This workflow run's history length.
    pub(crate) events: u32,
    /// Whether Temporal suggests a continue-as-new.
    pub(crate) suggested: bool,
}

/// When a workflow run tries to continue as new.
#[derive(Debug, Clone)]
pub(crate) struct Schedule {
    /// `options.checkpoint_every`: the most steps one workflow run makes.
    every: Option<u64>,
    /// Where this workflow run began, or where its last checkpoint was refused: the
    /// next try counts from there.
    from: Progress,
    /// Whether a checkpoint of this workflow run was refused.
    refused: bool,
}

impl Schedule {
    /// The schedule of a workflow run that began after `steps` steps of the run.
    pub(crate) fn new(steps: u64, every: Option<u64>) -> Schedule {
        Schedule {
            every,
            from: Progress {
                steps,
                events: 0,
                suggested: false,
            },
            refused: false,
        }
    }

    /// Whether to try now: the run made a step since this workflow run began (or since
    /// the last refusal), and Temporal suggests it, or the history reached
    /// [`CONTINUE_AT_EVENTS`], or it made `checkpoint_every` steps. After a refusal, it
    /// tries again once it made `checkpoint_every` more steps, or its history grew by
    /// [`RETRY_AFTER_EVENTS`] (Temporal's suggestion stays on once given: it does not
    /// count).
    pub(crate) fn due(&self, now: Progress) -> bool {
        let steps = now.steps.saturating_sub(self.from.steps);
        let every = self.every.is_some_and(|every| steps >= every);
        let events = if self.refused {
            now.events.saturating_sub(self.from.events) >= RETRY_AFTER_EVENTS
        } else {
            now.suggested || now.events >= CONTINUE_AT_EVENTS
        };
        steps > 0 && (every || events)
    }

    /// The checkpoint taken at `now` was refused: the next try waits for another
    /// threshold's worth of steps or events. True the first time in this workflow run
    /// (the caller warns then, once).
    pub(crate) fn refused(&mut self, now: Progress) -> bool {
        let first = !self.refused;
        self.refused = true;
        self.from = now;
        first
    }
}

/// Checks that `key`, the run key of an input's `resume`, is one the workflow
/// `workflow_id` wrote: `temporal/WORKFLOW_ID/FIRST_RUN_ID` (the workflow id is kept
/// across continue-as-new). A caller who writes a `resume` of another workflow's key
/// would read that workflow's checkpoints from the worker's store; the message says why
/// the run does not start.
pub(crate) fn own_key(key: &str, workflow_id: &str) -> Result<(), String> {
    let run_id = key
        .strip_prefix("temporal/")
        .and_then(|rest| rest.strip_prefix(workflow_id))
        .and_then(|rest| rest.strip_prefix('/'));
    match run_id {
        Some(run_id) if !run_id.is_empty() && !run_id.contains('/') => Ok(()),
        _ => Err(format!(
            "the input's `resume` names checkpoints of another workflow (`{key}`): a run goes \
             on only from its own (`temporal/{workflow_id}/…`); leave `resume` out, the run \
             writes it when it continues as new"
        )),
    }
}

/// The run key of a new run: `temporal/WORKFLOW_ID/RUN_ID`.
pub(crate) fn key_of(workflow_id: &str, run_id: &str) -> String {
    format!("temporal/{workflow_id}/{run_id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(steps: u64, events: u32) -> Progress {
        Progress {
            steps,
            events,
            suggested: false,
        }
    }

    #[test]
    fn a_run_continues_after_a_step_at_a_threshold() {
        let schedule = Schedule::new(10, Some(5));
        assert!(!schedule.due(at(10, 9_000)), "no step made yet");
        assert!(!schedule.due(at(14, 100)));
        assert!(schedule.due(at(15, 100)), "checkpoint_every");
        assert!(
            schedule.due(at(11, CONTINUE_AT_EVENTS)),
            "the history's length"
        );
        let suggested = Progress {
            suggested: true,
            ..at(11, 100)
        };
        assert!(schedule.due(suggested), "Temporal's suggestion");
        let unbounded = Schedule::new(0, None);
        assert!(!unbounded.due(at(1_000, 100)));
        assert!(unbounded.due(at(1, CONTINUE_AT_EVENTS)));
    }

    #[test]
    fn after_a_refusal_the_next_try_waits_another_thresholds_worth() {
        let mut schedule = Schedule::new(0, Some(5));
        assert!(schedule.due(at(5, 60)));
        assert!(schedule.refused(at(5, 60)), "the first refusal is told");
        for steps in 5..10 {
            assert!(!schedule.due(at(steps, 60 + 6 * steps as u32)), "{steps}");
        }
        assert!(schedule.due(at(10, 120)), "another checkpoint_every");
        assert!(!schedule.refused(at(10, 120)), "told once");
        assert!(!schedule.due(at(11, 126)));

        // Events: Temporal's suggestion, on since the refusal, counts no more.
        let mut schedule = Schedule::new(0, None);
        let suggested = |steps, events| Progress {
            suggested: true,
            ..at(steps, events)
        };
        assert!(schedule.due(suggested(700, 4_100)));
        schedule.refused(suggested(700, 4_100));
        assert!(!schedule.due(suggested(701, 4_106)));
        assert!(!schedule.due(suggested(1_000, 4_100 + RETRY_AFTER_EVENTS - 1)));
        assert!(schedule.due(suggested(1_000, 4_100 + RETRY_AFTER_EVENTS)));
    }

    #[test]
    fn a_run_goes_on_only_from_its_own_checkpoints() {
        let run = "0195e0d4-7c2a-7d3e-9f1b-2a4c6e8f0b1d";
        assert!(own_key(&key_of("orders-7", run), "orders-7").is_ok());
        assert!(own_key(&key_of("a/b", run), "a/b").is_ok());
        for (key, id) in [
            (key_of("orders-8", run), "orders-7"),
            (key_of("orders-77", run), "orders-7"),
            (key_of("orders-7/x", run), "orders-7"),
            ("temporal/orders-7/".to_owned(), "orders-7"),
            ("temporal/orders-7".to_owned(), "orders-7"),
            (format!("orders-7/{run}"), "orders-7"),
            (format!("other/orders-7/{run}"), "orders-7"),
        ] {
            let error = own_key(&key, id).expect_err(&key);
            assert!(error.contains("another workflow"), "{error}");
        }
    }
}

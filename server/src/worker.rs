//! The workers: claim queued runs from the store and drive them with the durable driver.
//!
//! One dispatcher task starts a claim whenever fewer than `max_concurrent_runs` runs (or
//! claims) are in progress here ([`Slot`]: a run whose machine has finished frees its
//! slot while its last commit lands); once a claim finds nothing, and no run was queued in
//! this process since that claim began ([`Work`](crate::work::Work)), it waits to be woken by a submit here
//! or, for runs submitted elsewhere and runs left by a dead worker, for the store poll ([`ServeConfig::store_poll`](crate::ServeConfig::store_poll)).
//! Each claimed run is a task of its own: it replays the
//! run's journal (nothing for a new run), goes on live, and hands its events to the
//! process's [`LiveRuns`](crate::live::LiveRuns) for the SSE streams.
//!
//! **Cancel.** A cancel request is stored ([`RunQueue::request_cancel`]), so it reaches the
//! run wherever it executes: this process sets the run's interrupt at once when it runs
//! here, and every executing run polls its flag every [`CANCEL_POLL`]. The machine stops
//! at its next instruction; a provider or tool call in progress finishes first.
//!
//! **Shutdown.** The dispatcher stops claiming, waits up to the drain timeout for the
//! runs in progress, then drops the rest: everything they journaled is committed or not,
//! as after a crash, and the next start (or another process) resumes them. Dropping a
//! run drops its lease, which frees the run for another worker.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aplc_runtime::durable;
use aplc_runtime::store::{Claim, Lease, LoadedRun, QueueStatus, RunQueue, TimedJournal};
use aplc_runtime::telemetry::{Parent, RunDetails, RunTrace};
use aplc_runtime::{DeltaRedactor, Redactor};
use aplc_vm::{Event, EventKind, Interrupt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::live::{LiveEvent, LiveEvents};
use crate::state::AppState;

/// How often an executing run reads its cancel flag from the store.
const CANCEL_POLL: Duration = Duration::from_millis(500);

/// What the claims found: `0` while the last one found a run (or none has ended), else
/// 1 + the [`Work::seen`] count at the start of the latest claim that found nothing.
type Idle = Arc<AtomicU64>;
/// Claims and runs queued runs until `stop`, then drains.
pub(crate) async fn dispatch(
    state: AppState,
    max_concurrent: usize,
    drain_timeout: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(max_concurrent));
    let finishers = Arc::new(Semaphore::new(max_concurrent));
    let idle: Idle = Arc::new(AtomicU64::new(0));
    let mut running = JoinSet::new();
    loop {
        while running.try_join_next().is_some() {}
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let found_nothing = idle.swap(0, Ordering::SeqCst);
        if found_nothing != 0 && found_nothing - 1 == state.work.seen() {
            // A claim found nothing (or failed), and no run was queued here since it
            // began: wait for a new run, or poll.
            tokio::select! {
                () = state.work.woken() => {}
                () = tokio::time::sleep(state.store_poll) => {}
                _ = stop.wait_for(|stop| *stop) => break,
            }
        }
        // Each free slot claims on its own task: claims in flight together share one
        // commit (SQLite's group commit), where claiming one at a time would make the
        // claim's round trip the bound on how fast slots refill.
        let slot = Slot {
            running: Some(permit),
            finishing: None,
            finishers: finishers.clone(),
        };
        running.spawn(claim_and_execute(state.clone(), slot, idle.clone()));
    }
    if !running.is_empty() {
        tracing::info!(
            runs = running.len(),
            timeout_ms = drain_timeout.as_millis() as u64,
            "draining"
        );
        let drained = tokio::time::timeout(drain_timeout, async {
            while running.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                runs = running.len(),
                "drain timeout: stopping the remaining runs; they resume from their journal"
            );
            running.abort_all();
            while running.join_next().await.is_some() {}
        }
    }
}

/// One of the `max_concurrent_runs` places a run executes in.
///
/// A run holds its slot until its machine finishes; its last commit (the outcome, an
/// fsync on PostgreSQL) runs on a place among as many again for finishing runs, so the
/// slot claims the next run while the commit is under way. When those are all taken,
/// the run keeps its slot to the end.
struct Slot {
    /// The slot, until the run finishes.
    running: Option<OwnedSemaphorePermit>,
    /// The place among the finishing runs, once it has one.
    finishing: Option<OwnedSemaphorePermit>,
    finishers: Arc<Semaphore>,
}

impl Slot {
    /// The machine has finished: trade the slot for a place among the finishing runs.
    fn finishing(&mut self) {
        if self.finishing.is_none()
            && let Ok(permit) = self.finishers.clone().try_acquire_owned()
        {
            self.finishing = Some(permit);
            self.running = None;
        }
    }
}

/// Claims a run for the free slot `slot` and drives it; sets `idle` when there was none.
async fn claim_and_execute(state: AppState, slot: Slot, idle: Idle) {
    // Read before the claim: a run queued after this was maybe not seen by it.
    let seen = state.work.seen();
    match state.store.claim().await {
        Ok(Some(claim)) => execute(state, claim, slot).await,
        Ok(None) => {
            idle.fetch_max(seen + 1, Ordering::SeqCst);
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot claim a run from the store");
            idle.fetch_max(seen + 1, Ordering::SeqCst);
        }
    }
}

/// Drives one claimed run to its end (or until the task is dropped).
async fn execute(state: AppState, claim: Claim, slot: Slot) {
    let Claim {
        lease,
        agent,
        cancel_requested,
        traceparent,
        loaded,
    } = claim;
    let id = lease.run_id().to_string();
    let interrupt = Interrupt::new();
    let events = state.live.insert(id.clone(), interrupt.clone());
    // Removes the run from `live` however the task ends (an abort at shutdown included).
    let _registered = Registered {
        state: state.clone(),
        id: id.clone(),
    };
    state.metrics.runs_in_flight.fetch_add(1, Ordering::Relaxed);
    state.metrics.runs_started.fetch_add(1, Ordering::Relaxed);
    // The run's log lines carry the W3C trace context of the request that started it;
    // its OpenTelemetry spans join that trace (`run_trace`).
    let span = tracing::info_span!(
        "run",
        run_id = %id,
        agent = %agent,
        traceparent = traceparent.as_deref().unwrap_or(""),
    );
    let claimed = Claimed {
        cancel_requested,
        id,
        agent,
        traceparent,
    };
    drive(&state, lease, loaded, &claimed, interrupt, events, slot)
        .instrument(span)
        .await;
}

/// What the queue says of a claimed run.
struct Claimed {
    id: String,
    agent: String,
    /// The W3C trace context of the request that submitted it.
    traceparent: Option<String>,
    cancel_requested: bool,
}

/// Resumes (or starts) the claimed run and drives it to its end.
async fn drive(
    state: &AppState,
    lease: Box<dyn Lease>,
    loaded: Option<LoadedRun>,
    claimed: &Claimed,
    interrupt: Interrupt,
    events: LiveEvents,
    mut slot: Slot,
) {
    let Claimed {
        id,
        agent,
        traceparent,
        cancel_requested,
    } = claimed;
    let (id, agent, traceparent) = (id.as_str(), agent.as_str(), traceparent.as_deref());
    let store = &TimedJournal::new(&*state.store, &*state.metrics);
    let equipment = &*state.equipment;
    tracing::info!(run_id = %id, agent = %agent, "run started");
    let reopened = durable::reopen_claimed(
        store,
        lease,
        loaded,
        &equipment.toolbox,
        &equipment.durable,
        interrupt.clone(),
    )
    .await;
    let reopened = match reopened {
        Ok(reopened) => reopened,
        Err(e) => {
            // `reopen_claimed` has ended the run failed if it can never resume here.
            tracing::error!(run_id = %id, error = %e, "cannot resume the run");
            return;
        }
    };
    // Only now: a flag set during the replay would stop the replay.
    if *cancel_requested {
        interrupt.cancel();
    }
    let watcher = tokio::spawn(watch_cancel(state.store.clone(), id.to_string(), interrupt));
    let redactor = equipment.durable.redactor.clone();
    let trace = state
        .telemetry
        .as_ref()
        .map(|telemetry| run_trace(telemetry, id, agent, traceparent, redactor.clone()));
    let provider = &RunTrace::provider_of(trace.as_ref(), &*equipment.provider);
    let mut relay = Relay {
        metrics: state.metrics.clone(),
        events,
        trace: trace.clone(),
        deltas: DeltaRedactor::new(redactor.clone()),
        redactor,
    };
    let mut listener = |event: &Event| {
        if matches!(event.kind, EventKind::RunFinished { .. }) {
            slot.finishing();
        }
        relay.on_event(event)
    };
    let finished = reopened
        .run(provider, &equipment.toolbox, Some(&mut listener))
        .await;
    relay.flush_deltas();
    if let Some(trace) = &trace {
        // A run stopped at shutdown (it resumes later) has open spans: end them.
        trace.abandon("stopped");
    }
    watcher.abort();
    match finished {
        Ok(durable::Ended::Waiting(waiting)) => {
            // The requests are committed; the run holds no slot while it waits.
            let ids: Vec<&str> = waiting
                .pending
                .iter()
                .map(|p| p.request.id.as_str())
                .collect();
            tracing::info!(run_id = %id, agent = %agent, pending = ?ids, "run waiting for input");
            // The lease is released now (`run` consumed it). An answer that landed while
            // this worker still held the run woke a claim that found it taken; claim
            // again, rather than leave that answer until the next store poll. With no such
            // answer, the claim finds nothing to do.
            state.work.queued();
        }
        Ok(durable::Ended::Finished(finished)) => {
            // From the outcome itself: its stored JSON form converts the whole final
            // context, history included (6 % of the server's CPU under issue #24's load).
            let status = QueueStatus::of_run(&finished.outcome);
            tracing::info!(run_id = %id, agent = %agent, status = status.as_str(), steps = finished.outcome.steps, "run finished");
        }
        Err(e) => {
            // The store failed: the run stays resumable from its last commit.
            tracing::error!(run_id = %id, agent = %agent, error = %e, "run stopped");
        }
    }
}

/// The spans of run `id`, joining the trace of the `traceparent` its request carried
/// (one that does not parse is logged and ignored: the run gets a trace of its own).
fn run_trace(
    telemetry: &aplc_runtime::telemetry::Telemetry,
    id: &str,
    agent: &str,
    traceparent: Option<&str>,
    redactor: Redactor,
) -> RunTrace {
    let parent = traceparent.and_then(|traceparent| match Parent::parse(traceparent, None) {
        Ok((parent, _)) => Some(parent),
        Err(e) => {
            tracing::warn!(run_id = %id, error = %e, "traceparent ignored");
            None
        }
    });
    telemetry.run(RunDetails {
        parent,
        run_id: Some(id.to_string()),
        agent: Some(agent.to_string()),
        redactor,
    })
}

/// Where a run's events go as the machine makes them: the run's spans, the metrics and
/// the live event streams (redacted).
///
/// A `provider_delta` is not journaled, so it goes out without an SSE `id`; a call's
/// deltas are redacted as one text ([`DeltaRedactor`]), so a secret cut across two
/// deltas is caught too.
struct Relay {
    metrics: Arc<crate::metrics::Metrics>,
    events: LiveEvents,
    trace: Option<RunTrace>,
    redactor: Redactor,
    deltas: DeltaRedactor,
}

impl Relay {
    fn on_event(&mut self, event: &Event) {
        if let Some(trace) = &self.trace {
            trace.on_event(event);
        }
        let Relay {
            metrics,
            events,
            redactor,
            deltas,
            ..
        } = self;
        metrics.on_event(event);
        deltas.on_event(event, |event| {
            let journaled = !event.kind.is_live_only();
            events.send(|| LiveEvent {
                seq: journaled.then_some(event.seq),
                json: Arc::from(redactor.redact_json(event.to_json()).to_string()),
            });
        });
    }

    /// Sends what the current call's redactor still holds (a run that stopped mid-call).
    fn flush_deltas(&mut self) {
        let Relay {
            events,
            redactor,
            deltas,
            ..
        } = self;
        deltas.finish(|event| {
            events.send(|| LiveEvent {
                seq: None,
                json: Arc::from(redactor.redact_json(event.to_json()).to_string()),
            });
        });
    }
}

/// Sets `interrupt` once the run's stored cancel flag is set.
async fn watch_cancel(store: Arc<dyn RunQueue>, id: String, interrupt: Interrupt) {
    loop {
        tokio::time::sleep(CANCEL_POLL).await;
        match store.queue_entry(&id).await {
            Ok(entry) if entry.cancel_requested => {
                interrupt.cancel();
                return;
            }
            Ok(entry) if entry.status.is_final() => return,
            _ => {}
        }
    }
}

/// A run's entry in [`LiveRuns`](crate::live::LiveRuns), removed on drop.
struct Registered {
    state: AppState,
    id: String,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.state.live.remove(&self.id);
        self.state
            .metrics
            .runs_in_flight
            .fetch_sub(1, Ordering::Relaxed);
    }
}

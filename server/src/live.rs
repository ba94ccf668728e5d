//! The runs this process executes ([`LiveRuns`]), and each one's live events
//! ([`LiveEvents`]): what the SSE streams follow and what a cancel interrupts at once.
//! The workers fill it; the handlers and the streams read it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aplc_vm::Interrupt;
use tokio::sync::broadcast;

/// Live events kept for a slow SSE reader before it falls back to the store.
const LIVE_BUFFER: usize = 1024;

/// A live event: its sequence number (`None` for a transient event such as a token
/// delta, which is not journaled) and its JSON text, redacted.
#[derive(Debug, Clone)]
pub(crate) struct LiveEvent {
    pub(crate) seq: Option<u64>,
    pub(crate) json: Arc<str>,
}

/// A run this process executes.
struct LiveRun {
    events: LiveEvents,
    interrupt: Interrupt,
}

/// A run's live event channel, made when the first SSE reader subscribes: most runs have
/// none, and a channel allocates its whole buffer up front (the profile of 1,000 runs
/// under load showed `broadcast::channel` among the server's top symbols).
#[derive(Clone, Default)]
pub(crate) struct LiveEvents(Arc<Mutex<Option<broadcast::Sender<LiveEvent>>>>);

impl LiveEvents {
    fn subscribe(&self) -> broadcast::Receiver<LiveEvent> {
        let mut sender = self.0.lock().unwrap_or_else(|e| e.into_inner());
        sender
            .get_or_insert_with(|| broadcast::channel(LIVE_BUFFER).0)
            .subscribe()
    }

    /// Sends `event` to the readers, if there are any.
    pub(crate) fn send(&self, event: impl FnOnce() -> LiveEvent) {
        let sender = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sender) = sender.as_ref().filter(|s| s.receiver_count() > 0) {
            // A reader that went away meanwhile is fine: the events are journaled.
            let _ = sender.send(event());
        }
    }
}

/// The runs this process executes, by id.
#[derive(Default)]
pub(crate) struct LiveRuns {
    runs: Mutex<HashMap<String, LiveRun>>,
    /// Told whenever a run of this process ends (`?wait=true` and SSE wake on it).
    pub(crate) finished: tokio::sync::Notify,
}

impl LiveRuns {
    /// Registers run `id`, which this process now executes: a cancel here sets
    /// `interrupt`, and its events go to the channel returned.
    pub(crate) fn insert(&self, id: String, interrupt: Interrupt) -> LiveEvents {
        let events = LiveEvents::default();
        let run = LiveRun {
            events: events.clone(),
            interrupt,
        };
        self.lock().insert(id, run);
        events
    }

    /// Forgets run `id`, which no longer executes here.
    pub(crate) fn remove(&self, id: &str) {
        self.lock().remove(id);
    }

    /// A receiver of the run's live events, if it executes here.
    pub(crate) fn subscribe(&self, id: &str) -> Option<broadcast::Receiver<LiveEvent>> {
        self.lock().get(id).map(|run| run.events.subscribe())
    }

    /// Cancels the run if it executes here; true if it does.
    pub(crate) fn cancel(&self, id: &str) -> bool {
        self.lock()
            .get(id)
            .map(|run| run.interrupt.cancel())
            .is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, LiveRun>> {
        self.runs.lock().unwrap_or_else(|e| e.into_inner())
    }
}

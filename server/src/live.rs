//! The runs this process executes ([`LiveRuns`]), and each one's live events
//! ([`LiveEvents`]): what the SSE streams follow and what a cancel interrupts at once.
//! The workers fill it; the handlers and the streams read it.
//!
//! A request waiting for a run to end (`?wait=true`, an SSE stream) watches that run
//! alone ([`LiveRuns::watch_end`]): the end of a run wakes its own waiters, not every
//! waiter of the process, each of which would read its run from the store again (with
//! 50 clients waiting, every run's end cost 50 reads on the store's one reader).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use aplc_vm::Interrupt;
use tokio::sync::futures::Notified;
use tokio::sync::{Notify, broadcast};

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
    /// The runs someone waits for the end of, by id, told when the run ends here. An
    /// entry lives as long as one of its [`EndWatch`]es.
    ends: Mutex<HashMap<String, Arc<Notify>>>,
}

/// A watch on the end of one run in this process: see [`LiveRuns::watch_end`].
pub(crate) struct EndWatch {
    live: Arc<LiveRuns>,
    id: String,
    notify: Arc<Notify>,
}

impl EndWatch {
    /// Completes once the run ends here after this call. Create it before reading the
    /// run's status, so that an end between the read and the wait is not missed
    /// (`Notify::notify_waiters` tells every `Notified` made before it, polled or not).
    pub(crate) fn ended(&self) -> Notified<'_> {
        self.notify.notified()
    }
}

impl Drop for EndWatch {
    fn drop(&mut self) {
        let mut ends = lock(&self.live.ends);
        // The map's reference and this one: no other watch shares the entry (a clone is
        // only made under this lock).
        if Arc::strong_count(&self.notify) == 2 {
            ends.remove(&self.id);
        }
    }
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

    /// Forgets run `id`, which no longer executes here (it ended, or stopped to resume
    /// later), and wakes whoever waits for its end: they read its status again.
    pub(crate) fn remove(&self, id: &str) {
        self.lock().remove(id);
        if let Some(notify) = lock(&self.ends).get(id) {
            notify.notify_waiters();
        }
    }

    /// A watch on the end of run `id` here; a run executing elsewhere never ends here,
    /// so its waiters poll the store as well.
    pub(crate) fn watch_end(self: &Arc<Self>, id: &str) -> EndWatch {
        let notify = lock(&self.ends).entry(id.to_string()).or_default().clone();
        EndWatch {
            live: self.clone(),
            id: id.to_string(),
            notify,
        }
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

    fn lock(&self) -> MutexGuard<'_, HashMap<String, LiveRun>> {
        lock(&self.runs)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

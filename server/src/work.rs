//! The runs queued in this process ([`Work`]): what a submit tells the dispatcher
//! (`worker.rs`) and what the application state holds (`state.rs`), in a leaf module of
//! its own so that neither imports the other for it.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Notify;

/// The runs queued in this process, for the dispatcher: a submit wakes it, and a claim
/// that found nothing can tell whether a run was queued since it looked.
///
/// Without the count, a claim that began before a submit and found nothing could put
/// the dispatcher to sleep after that submit's wake-up was spent on another claim: the
/// run then waited for the next submit or the store poll ([`ServeConfig::store_poll`](crate::ServeConfig::store_poll)).
#[derive(Debug, Default)]
pub(crate) struct Work {
    wake: Notify,
    /// Runs queued here so far.
    queued: AtomicU64,
}

impl Work {
    /// Completes at the next [`queued`](Self::queued) (or at once, if one came since the
    /// last wake-up was taken).
    pub(crate) fn woken(&self) -> tokio::sync::futures::Notified<'_> {
        self.wake.notified()
    }

    /// A run was queued (its enqueue has committed).
    pub(crate) fn queued(&self) {
        self.queued.fetch_add(1, Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// Runs queued here so far.
    pub(crate) fn seen(&self) -> u64 {
        self.queued.load(Ordering::SeqCst)
    }
}

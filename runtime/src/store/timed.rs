//! A journal that times what it does ([`TimedJournal`]): how many commits a run costs and
//! how long they take, for the service's metrics and `aplc bench`, without each of them
//! wrapping every method of [`RunJournal`].

use std::time::{Duration, Instant};

use super::{Batch, Lease, LoadedRun, NewRun, RunJournal, RunSummary, StoreError};
use crate::future::BoxFuture;

/// What a [`TimedJournal`] reports to.
pub trait JournalTimings: Send + Sync {
    /// A run was created (its row and lease) in `took`.
    fn created(&self, took: Duration) {
        let _ = took;
    }
    /// An append (one commit) took `took`.
    fn appended(&self, took: Duration);
}

impl<T: JournalTimings + ?Sized> JournalTimings for &T {
    fn created(&self, took: Duration) {
        (**self).created(took);
    }
    fn appended(&self, took: Duration) {
        (**self).appended(took);
    }
}

/// `journal`, with every create and append timed into `timings` (failed ones too: they
/// cost as much). Everything else goes straight through.
pub struct TimedJournal<'a, T> {
    journal: &'a dyn RunJournal,
    timings: T,
}

impl<'a, T: JournalTimings> TimedJournal<'a, T> {
    /// Times `journal`'s creates and appends into `timings`.
    pub fn new(journal: &'a dyn RunJournal, timings: T) -> Self {
        TimedJournal { journal, timings }
    }
}

impl<T> std::fmt::Debug for TimedJournal<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimedJournal")
            .field("journal", &self.journal)
            .finish_non_exhaustive()
    }
}

impl<T: JournalTimings> RunJournal for TimedJournal<'_, T> {
    fn create<'a>(&'a self, run: NewRun) -> BoxFuture<'a, Result<Box<dyn Lease>, StoreError>> {
        Box::pin(async move {
            let started = Instant::now();
            let created = self.journal.create(run).await;
            self.timings.created(started.elapsed());
            created
        })
    }
    fn acquire<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Box<dyn Lease>, StoreError>> {
        self.journal.acquire(id)
    }
    fn append<'a>(
        &'a self,
        lease: &'a dyn Lease,
        batch: Batch,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let started = Instant::now();
            let appended = self.journal.append(lease, batch).await;
            self.timings.appended(started.elapsed());
            appended
        })
    }
    fn load<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<LoadedRun, StoreError>> {
        self.journal.load(id)
    }
    fn list<'a>(&'a self) -> BoxFuture<'a, Result<Vec<RunSummary>, StoreError>> {
        self.journal.list()
    }
    fn summary<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<RunSummary, StoreError>> {
        self.journal.summary(id)
    }
    fn events<'a>(
        &'a self,
        id: &'a str,
        from: u64,
        limit: u64,
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        self.journal.events(id, from, limit)
    }
    fn inputs<'a>(
        &'a self,
        id: &'a str,
        from: u64,
        limit: u64,
    ) -> BoxFuture<'a, Result<Vec<Vec<u8>>, StoreError>> {
        self.journal.inputs(id, from, limit)
    }
    fn run_bytes<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.journal.run_bytes(id)
    }
    fn answer<'a>(
        &'a self,
        run_id: &'a str,
        request_id: &'a str,
        answer: serde_json::Value,
    ) -> BoxFuture<'a, Result<crate::store::Answered, StoreError>> {
        self.journal.answer(run_id, request_id, answer)
    }
    fn answers<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<(String, serde_json::Value)>, StoreError>> {
        self.journal.answers(run_id)
    }
}

//! What the two SQL backends share: the schema version and magic, column conversions,
//! and the claim's scan order. Compiled with either backend (`sqlite`, `postgres`
//! features); with neither, the store is its trait and types only.

use super::{Batch, QueueStatus, RunState, StoreError};

/// The newest schema version this build reads and writes (both backends).
pub(super) const SCHEMA_VERSION: i64 = 4;

/// The value of the `magic` row in `aplc_meta`: what marks a database as an aplc store.
pub(super) const MAGIC: &str = "aplc-run-store";

/// Milliseconds since the Unix epoch, for `updated_at_ms`.
pub(super) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A count from the database (never negative when the store is ours).
pub(super) fn count(value: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("negative {what}: {value}")))
}

/// A count for the database.
pub(super) fn db_int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl RunState {
    /// The spelling in the `state` column.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Finished => "finished",
        }
    }

    pub(super) fn from_column(text: &str) -> Result<RunState, StoreError> {
        match text {
            "running" => Ok(RunState::Running),
            "finished" => Ok(RunState::Finished),
            other => Err(StoreError::Corrupt(format!("unknown run state `{other}`"))),
        }
    }
}

/// Parses a JSON column.
pub(super) fn json_column(text: &str, what: &str) -> Result<serde_json::Value, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("{what} is not JSON: {e}")))
}

impl QueueStatus {
    /// Reads [`QueueStatus::as_str`] back.
    pub(super) fn from_column(text: &str) -> Result<QueueStatus, StoreError> {
        QueueStatus::ALL
            .into_iter()
            .find(|s| s.as_str() == text)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown queue status `{text}`")))
    }

    /// The status of an unfinished queued run: claimed or not.
    pub(super) fn of_claimed(claimed: bool) -> QueueStatus {
        if claimed {
            QueueStatus::Running
        } else {
            QueueStatus::Queued
        }
    }
}

/// Something a store does at most once per period: the takeover scan of claims, the
/// purge of expired idempotency keys. Due at first.
#[derive(Debug)]
pub(super) struct Every {
    period: std::time::Duration,
    last: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Every {
    pub(super) fn new(period: std::time::Duration) -> Every {
        Every {
            period,
            last: std::sync::Mutex::new(None),
        }
    }

    /// Whether it is due; if so, it counts as done from now.
    pub(super) fn due(&self) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        if last.is_some_and(|at| now.duration_since(at) < self.period) {
            return false;
        }
        *last = Some(now);
        true
    }

    /// Records that it was done now, due or not.
    pub(super) fn done(&self) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::time::Instant::now());
    }
}

/// What one scan of a claim looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scan {
    /// Runs never claimed, oldest first.
    New,
    /// Claimed runs whose holder is gone (a dead worker's), oldest first.
    Abandoned,
}

/// The scans of one claim, in order ([`RunQueue::claim`](super::RunQueue::claim)): abandoned runs first when
/// `takeover` is due, after the new ones otherwise. A store runs them in turn until one
/// finds a run, and calls `takeover.done()` before an abandoned scan.
pub(super) fn claim_order(takeover: &Every) -> [Scan; 2] {
    if takeover.due() {
        [Scan::Abandoned, Scan::New]
    } else {
        [Scan::New, Scan::Abandoned]
    }
}

/// An append's checks against its run's stored row: not finished, and its first input
/// the next one.
pub(super) fn check_append(
    id: &str,
    batch: &Batch,
    state: &str,
    input_count: i64,
) -> Result<(), StoreError> {
    if RunState::from_column(state)? == RunState::Finished {
        return Err(StoreError::Finished(id.to_string()));
    }
    let stored = count(input_count, "input count")?;
    if batch.first_input != stored {
        return Err(StoreError::Sequence {
            id: id.to_string(),
            expected: stored,
            got: batch.first_input,
        });
    }
    Ok(())
}

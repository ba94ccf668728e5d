//! What the two SQL backends share: the schema version and magic, column conversions,
//! the claim's scan order, and people in the loop's columns (pending requests, answers'
//! text, the queue's wait state). Compiled with either backend (`sqlite`, `postgres`
//! features); with neither, the store is its trait and types only.

use super::{Batch, MAX_ANSWER_BYTES, QueueStatus, RunState, StoreError};

/// The newest schema version this build reads and writes (both backends).
pub(super) const SCHEMA_VERSION: i64 = 4;

/// The value of the `magic` row in `aplc_meta`: what marks a database as an aplc store.
pub(super) const MAGIC: &str = "aplc-run-store";

/// Milliseconds since the Unix epoch, for `updated_at_ms`: the runtime's one wall clock
/// reading of that kind.
pub(super) use crate::human::now_ms;

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

/// An answer's stored text, refused past [`MAX_ANSWER_BYTES`].
pub(super) fn answer_text(answer: &serde_json::Value) -> Result<String, StoreError> {
    let text = answer.to_string();
    if text.len() > MAX_ANSWER_BYTES {
        return Err(StoreError::TooLarge(format!(
            "an answer of {} bytes of JSON; at most {MAX_ANSWER_BYTES} are stored",
            text.len()
        )));
    }
    Ok(text)
}

/// The `pending` column: a JSON list of requests, or NULL for none.
pub(super) fn pending_column(text: Option<&str>) -> Result<Vec<serde_json::Value>, StoreError> {
    match text {
        None => Ok(Vec::new()),
        Some(text) => match json_column(text, "the pending requests")? {
            serde_json::Value::Array(items) => Ok(items),
            _ => Err(StoreError::Corrupt(
                "the pending requests are not a list".into(),
            )),
        },
    }
}

/// The ids of stored requests.
pub(super) fn pending_ids(pending: &[serde_json::Value]) -> Vec<String> {
    pending
        .iter()
        .filter_map(|request| request.get("id")?.as_str().map(str::to_owned))
        .collect()
}

/// A queued run's `waiting` and `wake_at_ms` columns for its `pending` requests, given the
/// ids of the answers stored (of any request of the run): it waits while one of them has
/// no answer, and is woken at the first timeout (`expires_at_ms`) among those. An answered
/// request's timeout wakes no one: the run would be claimed, find nothing to do, pause
/// again with the same wake-up and be claimed again, over and over.
pub(super) fn wait_state(
    pending: &[serde_json::Value],
    answered: &[String],
) -> (bool, Option<i64>) {
    let open: Vec<&serde_json::Value> = pending
        .iter()
        .filter(|request| {
            let id = request.get("id").and_then(serde_json::Value::as_str);
            !id.is_some_and(|id| answered.iter().any(|a| a == id))
        })
        .collect();
    let wake = open
        .iter()
        .filter_map(|request| request.get("expires_at_ms")?.as_i64())
        .min();
    (!open.is_empty(), wake)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run waits while one of its requests has no answer, and is woken at the first
    /// timeout of those: an answered request's timeout wakes no one.
    #[test]
    fn a_run_waits_on_its_open_requests_and_wakes_at_their_first_timeout() {
        let request = |id: &str, expires: Option<i64>| match expires {
            Some(at) => serde_json::json!({"id": id, "expires_at_ms": at}),
            None => serde_json::json!({"id": id}),
        };
        let pending = [
            request("a", Some(5)),
            request("b", Some(9)),
            request("c", None),
        ];
        let answered = |ids: &[&str]| ids.iter().map(|id| id.to_string()).collect::<Vec<_>>();
        assert_eq!(wait_state(&pending, &[]), (true, Some(5)));
        assert_eq!(wait_state(&pending, &answered(&["a"])), (true, Some(9)));
        assert_eq!(wait_state(&pending, &answered(&["a", "b"])), (true, None));
        assert_eq!(
            wait_state(&pending, &answered(&["a", "b", "c", "old"])),
            (false, None)
        );
        assert_eq!(wait_state(&[], &[]), (false, None));
    }
}

//! The watchdog: one process-wide thread that sets runs' interrupt flags at their
//! deadlines.
//!
//! A render blocks the thread it runs on, so on a current-thread tokio runtime (the
//! CLI's) no tokio timer can fire while it runs; a plain thread can. The watchdog holds
//! only weak references: a run that ends drops its [`Armed`] guard and is forgotten.
//! Public for drivers outside this crate that run a machine themselves (the Python
//! package drives it on the caller's event loop).

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::Instant;

use aplc_vm::Interrupt;

/// Keeps a run's deadline armed; dropping it disarms.
#[derive(Debug)]
pub struct Armed {
    /// Held for its lifetime: the watchdog's weak reference dies with it.
    _entry: Option<Arc<Interrupt>>,
}

/// Sets `flag`'s deadline reason at `deadline` (on the real clock), unless the returned
/// guard was dropped before. Without a watchdog thread (the system refused to start
/// one) nothing is armed: the machine still times out between instructions.
pub fn arm(deadline: Instant, flag: &Interrupt) -> Armed {
    let Some(watchdog) = watchdog() else {
        return Armed { _entry: None };
    };
    let entry = Arc::new(flag.clone());
    let mut heap = watchdog.heap.lock().unwrap_or_else(|e| e.into_inner());
    // Disarmed entries stay until their deadline; drop them when they pile up (many
    // short runs with long timeouts).
    if heap.len() >= 1024 {
        heap.retain(|e| e.flag.strong_count() > 0);
    }
    heap.push(Entry {
        deadline,
        flag: Arc::downgrade(&entry),
    });
    drop(heap);
    watchdog.wake.notify_one();
    Armed {
        _entry: Some(entry),
    }
}

struct Watchdog {
    heap: Mutex<BinaryHeap<Entry>>,
    wake: Condvar,
}

/// One armed deadline. The heap is a max-heap: the earliest deadline compares greatest.
struct Entry {
    deadline: Instant,
    flag: Weak<Interrupt>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.deadline == other.deadline
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        other.deadline.cmp(&self.deadline)
    }
}

/// The watchdog, started on first use.
fn watchdog() -> Option<&'static Watchdog> {
    static WATCHDOG: OnceLock<Option<&'static Watchdog>> = OnceLock::new();
    *WATCHDOG.get_or_init(|| {
        let watchdog: &'static Watchdog = Box::leak(Box::new(Watchdog {
            heap: Mutex::new(BinaryHeap::new()),
            wake: Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("aplc-watchdog".into())
            .spawn(move || watch(watchdog))
            .ok()
            .map(|_| watchdog)
    })
}

fn watch(watchdog: &Watchdog) {
    let mut heap = watchdog.heap.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let now = Instant::now();
        while heap.peek().is_some_and(|e| e.deadline <= now) {
            if let Some(flag) = heap.pop().and_then(|e| e.flag.upgrade()) {
                flag.deadline();
            }
        }
        heap = match heap.peek().map(|e| e.deadline) {
            Some(next) => {
                let wait = next.saturating_duration_since(now);
                watchdog
                    .wake
                    .wait_timeout(heap, wait)
                    .map(|(guard, _)| guard)
                    .unwrap_or_else(|e| e.into_inner().0)
            }
            None => watchdog.wake.wait(heap).unwrap_or_else(|e| e.into_inner()),
        };
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use aplc_vm::InterruptReason;

    #[test]
    fn watchdog_sets_flags_at_their_deadlines_unless_disarmed() {
        let soon = Interrupt::new();
        let later = Interrupt::new();
        let disarmed = Interrupt::new();
        let start = Instant::now();
        let _later = arm(start + Duration::from_secs(60), &later);
        let _soon = arm(start + Duration::from_millis(50), &soon);
        drop(arm(start + Duration::from_millis(10), &disarmed));
        while soon.reason().is_none() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(soon.reason(), Some(InterruptReason::Deadline));
        assert!(start.elapsed() >= Duration::from_millis(50));
        assert_eq!(later.reason(), None);
        assert_eq!(disarmed.reason(), None);
    }
}

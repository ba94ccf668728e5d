//! Stopping a run from outside: a flag that is an input of the run, set by the driver at
//! the run's deadline or by an embedder to cancel it.
//!
//! The machine checks the flag before every instruction, and the template engine checks
//! it every few hundred instructions of a render (minijinja's interrupt callback, see
//! `vendor/minijinja/APLC-PATCH.md`), so one slow render cannot outlast the run's
//! timeout. Nothing here reads a clock: whoever holds the flag decides when to set it
//! (the tokio driver arms a watchdog thread, `watchdog.rs`).
//!
//! A driver that awaits a provider or a tool races the call against
//! [`Interrupt::interrupted`], so a cancel stops the call at once rather than when it
//! ends. That future is plain `std` (a waker list), so the machine still pulls in no
//! async runtime.

use std::cell::RefCell;
use std::future::Future;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};

/// Not interrupted.
const NONE: u8 = 0;
/// The run's deadline passed.
const DEADLINE: u8 = 1;
/// The embedder cancelled the run.
const CANCELLED: u8 = 2;

/// A run's interrupt flag, shared between the run and whoever may stop it.
///
/// Clones share the flag. A flag, once set, stays set; use a fresh one per run.
#[derive(Debug, Clone, Default)]
pub struct Interrupt(Arc<Shared>);

#[derive(Debug, Default)]
struct Shared {
    reason: AtomicU8,
    /// The tasks awaiting [`Interrupt::interrupted`], woken when the flag is set. One
    /// entry per task (see `register`), so the list stays as small as the number of
    /// tasks that ever waited on this run.
    wakers: Mutex<Vec<Waker>>,
}

/// Why a run was interrupted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InterruptReason {
    /// The run's deadline passed: the run fails with a timeout.
    Deadline,
    /// The run was cancelled: the run fails as cancelled.
    Cancelled,
}

impl Interrupt {
    /// A flag that is not set.
    pub fn new() -> Interrupt {
        Interrupt::default()
    }

    /// Marks the run's deadline as passed (unless the run was already interrupted).
    pub fn deadline(&self) {
        self.set(DEADLINE);
    }

    /// Cancels the run (unless it was already interrupted).
    pub fn cancel(&self) {
        self.set(CANCELLED);
    }

    /// Why the run was interrupted, if it was.
    pub fn reason(&self) -> Option<InterruptReason> {
        match self.0.reason.load(Ordering::Relaxed) {
            NONE => None,
            DEADLINE => Some(InterruptReason::Deadline),
            _ => Some(InterruptReason::Cancelled),
        }
    }

    /// Resolves once the flag is set, with the reason: a driver races each provider or
    /// tool call against it and drops the call when it resolves.
    pub fn interrupted(&self) -> impl Future<Output = InterruptReason> + Send + '_ {
        std::future::poll_fn(move |cx| {
            if let Some(reason) = self.reason() {
                return Poll::Ready(reason);
            }
            self.register(cx.waker());
            // The flag may have been set after the first look and before the waker was
            // registered: the setter then found no waker to wake.
            self.reason().map_or(Poll::Pending, Poll::Ready)
        })
    }

    fn set(&self, reason: u8) {
        let set =
            self.0
                .reason
                .compare_exchange(NONE, reason, Ordering::Relaxed, Ordering::Relaxed);
        if set.is_ok() {
            let wakers = std::mem::take(&mut *self.wakers());
            wakers.into_iter().for_each(Waker::wake);
        }
    }

    /// Adds `waker` unless its task is listed already: a task polls the future again on
    /// every wake-up of whatever it races, and must not add an entry each time.
    fn register(&self, waker: &Waker) {
        let mut wakers = self.wakers();
        if !wakers.iter().any(|w| w.will_wake(waker)) {
            wakers.push(waker.clone());
        }
    }

    fn wakers(&self) -> std::sync::MutexGuard<'_, Vec<Waker>> {
        // A panic while holding the lock cannot leave the list half-changed.
        self.0.wakers.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The flags of one run: its own deadline flag and the embedder's flag.
type Flags = [Interrupt; 2];

thread_local! {
    /// The flags of the run whose template is rendering on this thread.
    static RENDERING: RefCell<Option<Flags>> = const { RefCell::new(None) };
}

/// Makes `flags` the ones [`render_interrupted`] reads on this thread until the guard
/// drops. The template environment is shared by every run of a program, so the flags
/// cannot live in it; a render runs on one thread from start to end.
pub(crate) fn rendering(flags: &Flags) -> RenderGuard {
    let previous = RENDERING.with(|r| r.replace(Some(flags.clone())));
    RenderGuard(previous)
}

/// Why a run with these flags is interrupted, if it is: the first flag set wins.
pub(crate) fn reason(flags: &Flags) -> Option<InterruptReason> {
    flags.iter().find_map(Interrupt::reason)
}

/// Restores the flags that were current before [`rendering`].
pub(crate) struct RenderGuard(Option<Flags>);

impl Drop for RenderGuard {
    fn drop(&mut self) {
        let previous = self.0.take();
        RENDERING.with(|r| *r.borrow_mut() = previous);
    }
}

/// The template engine's interrupt callback: true once the flag of the run rendering on
/// this thread is set. Renders outside a run (the compiler's checks) are never
/// interrupted.
pub(crate) fn render_interrupted() -> bool {
    RENDERING.with(|r| r.borrow().as_ref().is_some_and(|f| reason(f).is_some()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interrupt_first_reason_wins_and_guards_nest() {
        let flag = Interrupt::new();
        assert_eq!(flag.reason(), None);
        assert!(!render_interrupted());
        {
            let _outer = rendering(&[Interrupt::new(), flag.clone()]);
            assert!(!render_interrupted());
            flag.deadline();
            assert!(render_interrupted());
            {
                let _inner = rendering(&[Interrupt::new(), Interrupt::new()]);
                assert!(!render_interrupted());
            }
            assert!(render_interrupted());
        }
        assert!(!render_interrupted());
        flag.cancel();
        assert_eq!(flag.reason(), Some(InterruptReason::Deadline));
        let cancelled = Interrupt::new();
        cancelled.cancel();
        cancelled.deadline();
        assert_eq!(cancelled.reason(), Some(InterruptReason::Cancelled));
    }

    /// Counts its wake-ups.
    struct Counter(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn interrupted_wakes_its_task_once_when_the_flag_is_set() {
        let flag = Interrupt::new();
        let counter = Arc::new(Counter(Default::default()));
        let waker = Waker::from(counter.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        let mut waiting = std::pin::pin!(flag.interrupted());
        // Polled again and again, as a select! does: one registration only.
        for _ in 0..3 {
            assert!(waiting.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(flag.wakers().len(), 1);
        // A clone, as the embedder holds it.
        flag.clone().cancel();
        assert_eq!(counter.0.load(Ordering::SeqCst), 1);
        assert_eq!(
            waiting.as_mut().poll(&mut cx),
            Poll::Ready(InterruptReason::Cancelled)
        );
        assert!(flag.wakers().is_empty());
    }
}

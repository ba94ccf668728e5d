//! Stopping a run from outside: a flag that is an input of the run, set by the driver at
//! the run's deadline or by an embedder to cancel it.
//!
//! The machine checks the flag before every instruction, and the template engine checks
//! it every few hundred instructions of a render (minijinja's interrupt callback, see
//! `vendor/minijinja/APLC-PATCH.md`), so one slow render cannot outlast the run's
//! timeout. Nothing here reads a clock: whoever holds the flag decides when to set it
//! (the tokio driver arms a watchdog thread, `watchdog.rs`).

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

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
pub struct Interrupt(Arc<AtomicU8>);

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
        let _ = self
            .0
            .compare_exchange(NONE, DEADLINE, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Cancels the run (unless it was already interrupted).
    pub fn cancel(&self) {
        let _ = self
            .0
            .compare_exchange(NONE, CANCELLED, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Why the run was interrupted, if it was.
    pub fn reason(&self) -> Option<InterruptReason> {
        match self.0.load(Ordering::Relaxed) {
            NONE => None,
            DEADLINE => Some(InterruptReason::Deadline),
            _ => Some(InterruptReason::Cancelled),
        }
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
}

//! SIGINT (Ctrl-C) and SIGTERM during `aplc run`: the run is stopped, which kills the
//! tools it is running (each command tool's process group dies with its call), and aplc
//! exits with 128 + the signal's number (130, 143), as a shell reports a killed program.

use std::future::Future;

use crate::Failure;

/// The signal that stopped a run.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Interrupted {
    Int,
    Term,
}

impl Interrupted {
    /// The exit code and message for a run the signal stopped.
    pub(crate) fn failure(self) -> Failure {
        let (name, number) = match self {
            Interrupted::Int => ("SIGINT", 2),
            Interrupted::Term => ("SIGTERM", 15),
        };
        Failure {
            code: 128 + number,
            message: format!("interrupted by {name}; the run and its running tools were stopped"),
        }
    }
}

/// Runs `work` to the end, unless SIGINT or SIGTERM arrives first: then `work` is
/// dropped (with every tool call in it) and the signal is returned. The handlers are
/// installed before `work` is first polled, so no tool starts without them.
#[cfg(unix)]
pub(crate) async fn unless_interrupted<T>(
    work: impl Future<Output = T>,
) -> std::io::Result<Result<T, Interrupted>> {
    use tokio::signal::unix::{SignalKind, signal};

    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(tokio::select! {
        value = work => Ok(value),
        _ = interrupt.recv() => Err(Interrupted::Int),
        _ = terminate.recv() => Err(Interrupted::Term),
    })
}

/// Runs `work` to the end, unless Ctrl-C arrives first.
#[cfg(not(unix))]
pub(crate) async fn unless_interrupted<T>(
    work: impl Future<Output = T>,
) -> std::io::Result<Result<T, Interrupted>> {
    Ok(tokio::select! {
        value = work => Ok(value),
        _ = tokio::signal::ctrl_c() => Err(Interrupted::Int),
    })
}

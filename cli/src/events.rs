//! Where `aplc run` sends a run's events: `--events FILE` (JSON Lines), the progress
//! line, `--verbose` (one line per step, call and error on stderr) and `--otel` (spans).
//!
//! Every event is redacted with the run's secrets before it is written, like the errors
//! `aplc run` prints: a provider or tool may echo a key into a message.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use aplc_runtime::Redactor;
use aplc_runtime::telemetry::RunTrace;
use aplc_vm::Event;
use aplc_vm::text::escape_control;

use crate::Failure;
use crate::progress::Progress;
use crate::timeline::Timeline;

/// The consumers of one run's events.
pub(crate) struct Sinks {
    file: Option<EventFile>,
    progress: Option<Progress>,
    verbose: Option<Timeline>,
    /// `--otel`: the run's spans.
    trace: Option<RunTrace>,
    redactor: Redactor,
}

/// `--events FILE`: one JSON object per line, written through a buffer.
struct EventFile {
    path: PathBuf,
    out: BufWriter<File>,
    /// The first write error; nothing is written after it.
    failed: Option<std::io::Error>,
}

impl Sinks {
    /// Opens `events` (before the run, so a bad path fails before any provider call),
    /// starts the progress line if `progress` and prints lines on stderr if `verbose`.
    /// The two would fight over stderr: `verbose` wins.
    pub(crate) fn open(
        events: Option<&Path>,
        progress: bool,
        verbose: bool,
        redactor: Redactor,
    ) -> Result<Sinks, Failure> {
        let file = match events {
            Some(path) => Some(EventFile {
                path: path.to_owned(),
                out: BufWriter::new(open_events(path).map_err(|e| {
                    Failure::usage(format!("cannot open {} for events: {e}", path.display()))
                })?),
                failed: None,
            }),
            None => None,
        };
        Ok(Sinks {
            file,
            progress: (progress && !verbose).then(Progress::start),
            verbose: verbose.then(|| Timeline::new(false)),
            trace: None,
            redactor,
        })
    }

    /// Adds the run's spans as a consumer (`--otel`).
    pub(crate) fn with_trace(mut self, trace: Option<RunTrace>) -> Sinks {
        self.trace = trace;
        self
    }

    /// True if anyone listens: otherwise the run records no events at all.
    pub(crate) fn listening(&self) -> bool {
        self.file.is_some()
            || self.progress.is_some()
            || self.verbose.is_some()
            || self.trace.is_some()
    }

    /// Hands one event to every consumer.
    pub(crate) fn on_event(&mut self, event: &Event) {
        if let Some(trace) = &self.trace {
            trace.on_event(event);
        }
        if let Some(progress) = &mut self.progress {
            progress.on_event(event);
        }
        if let Some(timeline) = &mut self.verbose
            && let Some(line) = timeline.line(event)
        {
            // Redacted as the run saw the text, then escaped; a closed stderr is not the
            // run's problem.
            let line = escape_control(&self.redactor.redact(&line)).into_owned();
            let _ = writeln!(std::io::stderr().lock(), "{line}");
        }
        if let Some(file) = &mut self.file
            && file.failed.is_none()
        {
            let json = self.redactor.redact_json(event.to_json());
            let written = serde_json::to_writer(&mut file.out, &json)
                .map_err(std::io::Error::from)
                .and_then(|()| file.out.write_all(b"\n"));
            if let Err(e) = written {
                file.failed = Some(e);
            }
        }
    }

    /// Clears the progress line and flushes the events file, whether the run succeeded,
    /// failed or was interrupted. A write error is reported once, here.
    pub(crate) fn finish(self) -> Result<(), Failure> {
        // A run that ended without `run_finished` was interrupted: its open spans end
        // here, marked so (after `run_finished` nothing is open and this does nothing).
        if let Some(trace) = &self.trace {
            trace.abandon("interrupted");
        }
        if let Some(progress) = self.progress {
            progress.finish();
        }
        let Some(mut file) = self.file else {
            return Ok(());
        };
        let flushed = file.out.flush();
        match file.failed.map_or(flushed, Err) {
            Ok(()) => Ok(()),
            Err(e) => Err(Failure::run(format!(
                "cannot write events to {}: {e}",
                file.path.display()
            ))),
        }
    }
}

/// Opens the events file: created or truncated if it is a regular file (or missing),
/// opened for writing as it is otherwise, so `/dev/stderr` or a pipe works and a
/// character device is never truncated.
fn open_events(path: &Path) -> std::io::Result<File> {
    let regular = std::fs::metadata(path).map_or(true, |m| m.is_file());
    let mut options = OpenOptions::new();
    if regular {
        options.write(true).create(true).truncate(true);
    } else {
        options.append(true);
    }
    options.open(path)
}

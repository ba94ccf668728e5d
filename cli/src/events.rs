//! Where `aplc run` sends a run's events: `--events FILE` (JSON Lines), the progress
//! line, `--verbose` (one line per step, call and error on stderr), `--stream` (the
//! `provider_delta` text on stdout) and `--otel` (spans).
//!
//! Every event is redacted with the run's secrets before it is written to the file or
//! stderr, like the errors `aplc run` prints: a provider or tool may echo a key into a
//! message. In the file, a call's `provider_delta` texts are redacted as one text (a
//! [`DeltaRedactor`]), so a secret split across deltas is caught too. The streamed text
//! on stdout is the agent's output, printed as `result_text` is.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};

use aplc_runtime::telemetry::RunTrace;
use aplc_runtime::{DeltaRedactor, Redactor};
use aplc_vm::text::escape_control;
use aplc_vm::{Event, EventKind};

use crate::Failure;
use crate::progress::Progress;
use crate::timeline::Timeline;

/// The consumers of one run's events.
pub(crate) struct Sinks {
    file: Option<EventFile>,
    progress: Option<Progress>,
    verbose: Option<Timeline>,
    /// `--stream`.
    stream: Option<StreamOut>,
    /// `--otel`: the run's spans.
    trace: Option<RunTrace>,
    redactor: Redactor,
}

/// `--stream`: each call's text on stdout as it arrives, a newline after each call that
/// printed any.
struct StreamOut {
    /// Escape control characters: stdout is a terminal.
    escape: bool,
    /// The current call printed text.
    open: bool,
}

impl StreamOut {
    fn on_event(&mut self, event: &Event) {
        let mut stdout = std::io::stdout().lock();
        // A closed stdout (`aplc run … | head`) is not the run's problem.
        let _ = match &event.kind {
            EventKind::ProviderDelta { text, .. } => {
                self.open = true;
                let written = if self.escape {
                    stdout.write_all(escape_control(text).as_bytes())
                } else {
                    stdout.write_all(text.as_bytes())
                };
                written.and_then(|()| stdout.flush())
            }
            EventKind::ProviderResult { .. } if std::mem::take(&mut self.open) => {
                stdout.write_all(b"\n").and_then(|()| stdout.flush())
            }
            _ => Ok(()),
        };
    }
}

/// `--events FILE`: one JSON object per line, written through a buffer.
struct EventFile {
    path: PathBuf,
    lines: Lines,
    /// A call's deltas are redacted as one text.
    deltas: DeltaRedactor,
}

/// The file's buffered lines, each event redacted.
struct Lines {
    out: BufWriter<File>,
    /// The first write error; nothing is written after it.
    failed: Option<std::io::Error>,
    redactor: Redactor,
}

impl EventFile {
    fn write(&mut self, event: &Event) {
        let lines = &mut self.lines;
        self.deltas.on_event(event, |event| lines.write(event));
    }

    /// Writes what the current call's redactor still holds.
    fn flush_deltas(&mut self) {
        let lines = &mut self.lines;
        self.deltas.finish(|event| lines.write(event));
    }
}

impl Lines {
    fn write(&mut self, event: &Event) {
        if self.failed.is_some() {
            return;
        }
        let json = self.redactor.redact_json(event.to_json());
        let written = serde_json::to_writer(&mut self.out, &json)
            .map_err(std::io::Error::from)
            .and_then(|()| self.out.write_all(b"\n"));
        if let Err(e) = written {
            self.failed = Some(e);
        }
    }
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
                lines: Lines {
                    out: BufWriter::new(open_events(path).map_err(|e| {
                        Failure::usage(format!("cannot open {} for events: {e}", path.display()))
                    })?),
                    failed: None,
                    redactor: redactor.clone(),
                },
                deltas: DeltaRedactor::new(redactor.clone()),
            }),
            None => None,
        };
        Ok(Sinks {
            file,
            progress: (progress && !verbose).then(Progress::start),
            verbose: verbose.then(|| Timeline::new(false)),
            stream: None,
            trace: None,
            redactor,
        })
    }

    /// With `stream` (`--stream`), writes each call's text to stdout as it arrives.
    pub(crate) fn streaming(mut self, stream: bool) -> Sinks {
        self.stream = stream.then(|| StreamOut {
            escape: std::io::stdout().is_terminal(),
            open: false,
        });
        self
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
            || self.stream.is_some()
            || self.trace.is_some()
    }

    /// Hands one event to every consumer.
    pub(crate) fn on_event(&mut self, event: &Event) {
        if let Some(stream) = &mut self.stream {
            stream.on_event(event);
        }
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
        if let Some(file) = &mut self.file {
            file.write(event);
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
        // An interrupted stream's held text is written too.
        file.flush_deltas();
        let flushed = file.lines.out.flush();
        match file.lines.failed.map_or(flushed, Err) {
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

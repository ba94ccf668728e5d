//! `aplc run`'s live progress: one updating line on stderr (the current step, provider
//! calls, tokens, elapsed time), cleared when the run ends.
//!
//! Shown only when stderr is a terminal and `--quiet` is not given; it is built from the
//! run's events, so a run without it records none.

use std::time::Duration;

use aplc_vm::text::escape_control;
use aplc_vm::{Event, EventKind};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The progress line of one run.
pub(crate) struct Progress {
    bar: ProgressBar,
    step: String,
    provider_calls: u64,
    input_tokens: u64,
    output_tokens: u64,
}

impl Progress {
    /// A line on stderr, redrawn every 100 ms so the elapsed time moves while the run
    /// waits for a model.
    pub(crate) fn start() -> Progress {
        Progress {
            bar: Self::bar(),
            step: String::new(),
            provider_calls: 0,
            input_tokens: 0,
            output_tokens: 0,
        }
    }

    /// Updates the line from one event.
    pub(crate) fn on_event(&mut self, event: &Event) {
        match &event.kind {
            // The run asks a person, who may be asked on this terminal: the line is
            // cleared, so that the question starts on a line of its own and no redraw
            // covers it; a new line starts with the next event, its clock going on.
            EventKind::InputRequested { .. } => {
                self.bar.finish_and_clear();
                return;
            }
            _ if self.bar.is_finished() => {
                let elapsed = self.bar.elapsed();
                self.bar = Self::bar().with_elapsed(elapsed);
            }
            _ => {}
        }
        match &event.kind {
            EventKind::StepStarted { step, .. } => self.step = escape_control(step).into_owned(),
            EventKind::ProviderCall { .. } => self.provider_calls += 1,
            EventKind::ProviderResult {
                usage: Some(usage), ..
            } => {
                self.input_tokens += usage.input_tokens;
                self.output_tokens += usage.output_tokens;
            }
            _ => return,
        }
        self.bar.set_message(format!(
            "step {} · {} provider call{} · {} tokens in, {} out",
            self.step,
            self.provider_calls,
            if self.provider_calls == 1 { "" } else { "s" },
            self.input_tokens,
            self.output_tokens,
        ));
    }

    fn bar() -> ProgressBar {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        // The template is a constant, so this cannot fail; the default style would do.
        if let Ok(style) = ProgressStyle::with_template("{spinner} {elapsed:>4} {msg}") {
            bar.set_style(style);
        }
        bar.enable_steady_tick(Duration::from_millis(100));
        bar
    }

    /// Removes the line.
    pub(crate) fn finish(self) {
        self.bar.finish_and_clear();
    }
}

//! `aplc run`'s live progress: one updating line on stderr (the current step, provider
//! calls, tokens, elapsed time), cleared when the run ends. While a child run
//! (`spec/agents.md`) runs, the step is its: `mid/leaf > l`.
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
    /// The running step, escaped; a child's with its path.
    step: String,
    /// The steps of the runs that called the running child, the root's first: each
    /// shows again when its child ends.
    callers: Vec<String>,
    provider_calls: u64,
    input_tokens: u64,
    output_tokens: u64,
}

impl Progress {
    /// A line on stderr, redrawn every 100 ms so the elapsed time moves while the run
    /// waits for a model.
    pub(crate) fn start() -> Progress {
        Self::on(Self::bar())
    }

    fn on(bar: ProgressBar) -> Progress {
        Progress {
            bar,
            step: String::new(),
            callers: Vec::new(),
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
            EventKind::StepStarted { step, .. } => self.step = step_of(event.path.as_deref(), step),
            EventKind::AgentStarted { .. } => self.callers.push(self.step.clone()),
            EventKind::AgentFinished { .. } => {
                // A resumed run may end a child it did not see start: its step stays.
                if let Some(step) = self.callers.pop() {
                    self.step = step;
                }
            }
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

    /// The text of the line.
    #[cfg(test)]
    fn message(&self) -> String {
        self.bar.message()
    }

    /// Removes the line.
    pub(crate) fn finish(self) {
        self.bar.finish_and_clear();
    }
}

/// `step` as the line shows it: escaped, after its run's path if it is a child's.
fn step_of(path: Option<&str>, step: &str) -> String {
    match path {
        Some(path) => format!("{} > {}", escape_control(path), escape_control(step)),
        None => escape_control(step).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(path: Option<&str>, kind: EventKind) -> Event {
        Event {
            seq: 0,
            t_ms: 0.0,
            kind,
            path: path.map(str::to_owned),
        }
    }

    fn step(name: &str) -> EventKind {
        EventKind::StepStarted {
            step: name.into(),
            runs: 0,
        }
    }

    fn agent_started(agent: &str) -> EventKind {
        EventKind::AgentStarted {
            step: "a".into(),
            agent: agent.into(),
            call_id: None,
        }
    }

    fn agent_finished(agent: &str) -> EventKind {
        EventKind::AgentFinished {
            step: "a".into(),
            agent: agent.into(),
            call_id: None,
            outcome: aplc_vm::RunStatus::Completed,
            error: None,
            totals: aplc_vm::Totals {
                steps: 1,
                provider_calls: 0,
                input_tokens: 0,
                output_tokens: 0,
                elapsed_ms: 1.0,
            },
        }
    }

    #[test]
    fn the_line_shows_the_running_childs_step_after_its_path() {
        let mut progress = Progress::on(ProgressBar::hidden());
        let mut shows = |path: Option<&str>, kind, step: &str| {
            progress.on_event(&event(path, kind));
            let message = progress.message();
            assert!(message.starts_with(&format!("step {step} · ")), "{message}");
        };
        shows(None, step("a"), "a");
        shows(None, agent_started("mid"), "a");
        shows(Some("mid"), step("m"), "mid > m");
        shows(Some("mid"), agent_started("leaf"), "mid > m");
        shows(Some("mid/leaf"), step("l\x1b[2J"), "mid/leaf > l\\u{1b}[2J");
        shows(Some("mid"), agent_finished("leaf"), "mid > m");
        shows(None, agent_finished("mid"), "a");
        progress.finish();
    }
}

//! A run's events as readable lines: `aplc run --verbose` prints them on stderr as the
//! run goes, `aplc trace FILE` prints them from an events file, then the totals.
//!
//! One line per step boundary, provider call, tool call, error and jump, indented by
//! nesting, each with its time since the run started. A child run (`spec/agents.md`)
//! has a line where it starts and one where it ends, and its own lines are indented
//! under them and begin with its path (`mid/leaf > step l (runs 0)`). Lines are built
//! from the events' raw strings; the caller redacts (if it has secrets) and then escapes
//! control characters over the whole line, so a secret is matched as the run saw it.

use std::fmt::Write as _;

use aplc_vm::{Event, EventKind, RunStatus};

/// Turns events into lines, remembering what a later event needs (the model of the
/// provider call a result answers) and counting the totals.
#[derive(Debug, Default)]
pub(crate) struct Timeline {
    /// Also print a line per finished phase (`aplc trace`; `--verbose` leaves them out).
    phases: bool,
    /// The model of the provider call in flight.
    model: Option<String>,
    pub(crate) totals: Counted,
}

/// What the events showed, counted as they went by.
#[derive(Debug, Default)]
pub(crate) struct Counted {
    pub(crate) steps: u64,
    pub(crate) provider_calls: u64,
    pub(crate) provider_failed: u64,
    pub(crate) tool_calls: u64,
    pub(crate) tool_failed: u64,
    pub(crate) tool_cached: u64,
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
    pub(crate) errors: u64,
    /// The last event's time.
    pub(crate) last_t_ms: f64,
    /// `run_finished`'s outcome and elapsed time, once seen.
    pub(crate) finished: Option<(RunStatus, f64)>,
}

impl Timeline {
    pub(crate) fn new(phases: bool) -> Timeline {
        Timeline {
            phases,
            ..Timeline::default()
        }
    }

    /// The line for `event`, if it gets one (unescaped: see the module comment).
    pub(crate) fn line(&mut self, event: &Event) -> Option<String> {
        let t = &mut self.totals;
        t.last_t_ms = event.t_ms;
        let (depth, text) = match &event.kind {
            EventKind::RunStarted {
                version,
                agent,
                bundle_hash,
                ..
            } => {
                let hash: String = bundle_hash.chars().take(12).collect();
                (0, format!("run {agent} (bundle {hash}, events v{version})"))
            }
            EventKind::StepStarted { step, runs } => {
                t.steps += 1;
                (0, format!("step {step} (runs {runs})"))
            }
            EventKind::PhaseFinished {
                phase, duration_ms, ..
            } => {
                if !self.phases {
                    return None;
                }
                let phase = match phase {
                    aplc_vm::Phase::Pre => "pre",
                    aplc_vm::Phase::Prompt => "prompt",
                    aplc_vm::Phase::Post => "post",
                };
                (1, format!("{phase} {}", ms(*duration_ms)))
            }
            EventKind::ProviderCall { model, .. } => {
                t.provider_calls += 1;
                self.model = Some(model.clone());
                return None;
            }
            EventKind::ProviderResult {
                usage,
                finish_reason,
                latency_ms,
                error,
                ..
            } => {
                let model = self.model.take().unwrap_or_else(|| "?".into());
                let mut text = format!("provider {model}: {}", ms(*latency_ms));
                if let Some(usage) = usage {
                    t.input_tokens = t.input_tokens.saturating_add(usage.input_tokens);
                    t.output_tokens = t.output_tokens.saturating_add(usage.output_tokens);
                    let _ = write!(
                        text,
                        ", {} in / {} out tokens",
                        usage.input_tokens, usage.output_tokens
                    );
                }
                if let Some(reason) = finish_reason {
                    let _ = write!(text, ", finish {reason}");
                }
                if let Some(error) = error {
                    t.provider_failed += 1;
                    let _ = write!(text, ", failed ({}): {}", error.kind, error.message);
                }
                (1, text)
            }
            EventKind::ToolCall { .. } => return None,
            EventKind::ToolResult {
                tool,
                call_id,
                with_error,
                duration_ms,
                reused,
                ..
            } => {
                t.tool_calls += 1;
                t.tool_failed += u64::from(*with_error);
                t.tool_cached += u64::from(*reused);
                let how = match (*reused, *with_error) {
                    (false, false) => "ok",
                    (false, true) => "failed",
                    (true, false) => "cached",
                    (true, true) => "cached, failed",
                };
                (
                    1,
                    format!("tool {tool} [{call_id}]: {how}, {}", ms(*duration_ms)),
                )
            }
            EventKind::Error { step, message } => {
                t.errors += 1;
                (usize::from(step.is_some()), format!("error: {message}"))
            }
            EventKind::Jump { from, to } => (0, format!("jump {from} -> {to}")),
            EventKind::StepFinished { step, duration_ms } => {
                (0, format!("step {step} done in {}", ms(*duration_ms)))
            }
            EventKind::RunFinished {
                outcome,
                error,
                totals,
            } => {
                t.finished = Some((*outcome, totals.elapsed_ms));
                (0, ended("run", *outcome, error.as_ref(), totals))
            }
            EventKind::AgentStarted { agent, call_id, .. } => {
                let mut text = format!("agent {agent} started");
                if let Some(id) = call_id {
                    let _ = write!(text, " [{id}]");
                }
                (1, text)
            }
            EventKind::AgentFinished {
                agent,
                outcome,
                error,
                totals,
                ..
            } => (
                1,
                ended(&format!("agent {agent}"), *outcome, error.as_ref(), totals),
            ),
            // A newer event type this aplc does not know yet.
            _ => return None,
        };
        // A child's lines go under its `agent_started`, two levels a generation.
        let (nesting, by) = match &event.path {
            // Capped: an events file may hold any path.
            Some(path) => (
                path.split('/').count().min(MAX_NESTING) * 2,
                format!("{path} > "),
            ),
            None => (0, String::new()),
        };
        Some(format!(
            "{:>10.3} ms  {:indent$}{by}{text}",
            event.t_ms,
            "",
            indent = (depth + nesting) * 2
        ))
    }
}

/// How `what` (`run`, `agent NAME`) ended: `run failed in 5.000 ms (timeout): Timeout`.
fn ended(
    what: &str,
    outcome: RunStatus,
    error: Option<&aplc_vm::EventError>,
    totals: &aplc_vm::Totals,
) -> String {
    let mut text = format!("{what} {} in {}", status(outcome), ms(totals.elapsed_ms));
    if let Some(error) = error {
        let _ = write!(text, " ({}): {}", error.kind, error.message);
    }
    text
}

/// The deepest child run whose lines are indented further than its caller's.
const MAX_NESTING: usize = 16;

/// An outcome as `run_finished` spells it.
pub(crate) fn status(outcome: RunStatus) -> &'static str {
    match outcome {
        RunStatus::Completed => "completed",
        RunStatus::CompletedWithErrors => "completed_with_errors",
        RunStatus::Failed => "failed",
        RunStatus::Cancelled => "cancelled",
    }
}

/// A duration in milliseconds, with fewer decimals as it grows (scripted steps take
/// microseconds, model calls seconds).
pub(crate) fn ms(value: f64) -> String {
    if value.abs() < 10.0 {
        format!("{value:.3} ms")
    } else if value.abs() < 1000.0 {
        format!("{value:.1} ms")
    } else {
        format!("{:.2} s", value / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aplc_vm::{EventError, TokenUsage, Totals};

    fn event(t_ms: f64, kind: EventKind) -> Event {
        Event {
            seq: 0,
            t_ms,
            kind,
            path: None,
        }
    }

    #[test]
    fn a_provider_result_names_the_model_of_its_call() {
        let mut timeline = Timeline::new(false);
        let call = EventKind::ProviderCall {
            step: "a".into(),
            model: "gpt-4o".into(),
        };
        assert_eq!(timeline.line(&event(1.0, call)), None);
        let result = EventKind::ProviderResult {
            step: "a".into(),
            usage: Some(TokenUsage {
                input_tokens: 12,
                output_tokens: 7,
            }),
            finish_reason: Some("stop".into()),
            latency_ms: 1234.5,
            error: None,
        };
        assert_eq!(
            timeline.line(&event(1235.5, result)).as_deref(),
            Some("  1235.500 ms    provider gpt-4o: 1.23 s, 12 in / 7 out tokens, finish stop")
        );
        assert_eq!(timeline.totals.provider_calls, 1);
        assert_eq!(timeline.totals.input_tokens, 12);
    }

    #[test]
    fn tool_results_say_ok_failed_or_cached() {
        let mut timeline = Timeline::new(false);
        let mut tool = |with_error, reused| {
            let kind = EventKind::ToolResult {
                step: "a".into(),
                tool: "add".into(),
                call_id: "c1".into(),
                with_error,
                duration_ms: 0.5,
                reused,
            };
            timeline.line(&event(2.0, kind)).unwrap_or_default()
        };
        assert!(tool(false, false).ends_with("tool add [c1]: ok, 0.500 ms"));
        assert!(tool(true, false).ends_with(": failed, 0.500 ms"));
        assert!(tool(false, true).ends_with(": cached, 0.500 ms"));
        assert_eq!(timeline.totals.tool_calls, 3);
        assert_eq!(timeline.totals.tool_failed, 1);
        assert_eq!(timeline.totals.tool_cached, 1);
    }

    #[test]
    fn phases_only_when_asked_and_the_run_end_is_remembered() {
        let phase = EventKind::PhaseFinished {
            step: "a".into(),
            phase: aplc_vm::Phase::Pre,
            duration_ms: 0.25,
        };
        assert_eq!(Timeline::new(false).line(&event(0.3, phase.clone())), None);
        let mut timeline = Timeline::new(true);
        assert!(timeline.line(&event(0.3, phase)).is_some());
        let end = EventKind::RunFinished {
            outcome: RunStatus::Failed,
            error: Some(EventError {
                kind: "timeout".into(),
                message: "Timeout".into(),
            }),
            totals: Totals {
                steps: 1,
                provider_calls: 0,
                input_tokens: 0,
                output_tokens: 0,
                elapsed_ms: 5.0,
            },
        };
        let line = timeline.line(&event(5.0, end)).unwrap_or_default();
        assert!(
            line.ends_with("run failed in 5.000 ms (timeout): Timeout"),
            "{line}"
        );
        assert_eq!(timeline.totals.finished, Some((RunStatus::Failed, 5.0)));
    }

    #[test]
    fn a_childs_lines_go_under_its_start_with_its_path() {
        let mut timeline = Timeline::new(false);
        let mut line = |path: Option<&str>, kind| {
            let mut event = event(1.0, kind);
            event.path = path.map(str::to_owned);
            timeline.line(&event).unwrap_or_default()
        };
        let started = line(
            Some("mid"),
            EventKind::AgentStarted {
                step: "m".into(),
                agent: "leaf".into(),
                call_id: Some("c1".into()),
            },
        );
        assert_eq!(
            started,
            "     1.000 ms        mid > agent leaf started [c1]"
        );
        let step = EventKind::StepStarted {
            step: "l".into(),
            runs: 0,
        };
        assert_eq!(
            line(Some("mid/leaf"), step),
            "     1.000 ms          mid/leaf > step l (runs 0)"
        );
        let finished = EventKind::AgentFinished {
            step: "m".into(),
            agent: "leaf".into(),
            call_id: None,
            outcome: RunStatus::Failed,
            error: Some(EventError {
                kind: "missing_input".into(),
                message: "missing input: word".into(),
            }),
            totals: Totals {
                steps: 0,
                provider_calls: 0,
                input_tokens: 0,
                output_tokens: 0,
                elapsed_ms: 0.5,
            },
        };
        assert_eq!(
            line(Some("mid"), finished),
            "     1.000 ms        mid > agent leaf failed in 0.500 ms (missing_input): \
             missing input: word"
        );
        assert_eq!(timeline.totals.steps, 1);
        assert_eq!(timeline.totals.finished, None);
    }

    #[test]
    fn durations_shrink_their_decimals_as_they_grow() {
        assert_eq!(ms(0.0125), "0.013 ms");
        assert_eq!(ms(12.25), "12.2 ms");
        assert_eq!(ms(61_000.0), "61.00 s");
    }
}

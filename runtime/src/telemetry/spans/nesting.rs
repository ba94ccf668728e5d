//! Child runs in the trace (`spec/agents.md`, `spec/telemetry.md` "Spans"): a child's
//! `invoke_workflow` span nests under its caller's step span (`call_agent`) or the
//! `execute_tool` span of the call that runs it (an agent tool), and its own spans nest
//! under it, at any depth.
//!
//! A child's events come in the root's one sequence between `agent_started` and
//! `agent_finished`, each with its `path`; one child runs at a time, so the open runs
//! form a stack keyed by path: [`RunSpans::frame`] is the run the events come from now,
//! [`RunSpans::outer`] its callers.

use std::borrow::Cow;
use std::time::SystemTime;

use opentelemetry::trace::{Span as _, Status, TraceContextExt};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::Span;

use super::RunSpans;
use aplc_vm::{Event, EventKind};

/// The open spans of one run of the tree: the root's, or a child's.
pub(super) struct Frame {
    /// The child's path (`"refund/translator"`); `None` for the root run.
    pub(super) path: Option<String>,
    /// The context the run span starts in: the root's parent (an incoming
    /// `traceparent`, or none), or the caller's span a child nests under.
    pub(super) parent: Context,
    pub(super) run: Option<Span>,
    pub(super) step: Option<Span>,
    pub(super) chat: Option<Span>,
    pub(super) tool: Option<Span>,
    /// The model's id for the call of the open `execute_tool` span.
    pub(super) tool_call: Option<String>,
    /// When the run span started.
    pub(super) run_start: Option<SystemTime>,
}

impl Frame {
    /// The root run's, its span to start in `parent`.
    pub(super) fn root(parent: Context) -> Frame {
        Frame {
            path: None,
            parent,
            run: None,
            step: None,
            chat: None,
            tool: None,
            tool_call: None,
            run_start: None,
        }
    }

    /// Ends every open span at `at`, the inner ones as failed with `reason` if there is
    /// one; the run span too when `mark_run`.
    pub(super) fn close(&mut self, at: SystemTime, reason: Option<&str>, mark_run: bool) {
        let failed = |span: &mut Span| {
            if let Some(reason) = reason {
                span.set_attribute(KeyValue::new("error.type", reason.to_owned()));
                span.set_status(Status::error(Cow::Owned(format!(
                    "the run ended: {reason}"
                ))));
            }
        };
        for mut span in [self.tool.take(), self.chat.take(), self.step.take()]
            .into_iter()
            .flatten()
        {
            failed(&mut span);
            span.end_with_timestamp(at);
        }
        if let Some(mut run) = self.run.take() {
            if mark_run {
                failed(&mut run);
            }
            run.end_with_timestamp(at);
        }
    }
}

impl RunSpans {
    /// Makes the run `event` belongs to the current one: the caller's for
    /// `agent_finished` is the child it ends. Runs the event is not inside of are left
    /// (their `agent_finished` never came: ended as failed, `unfinished`); runs it is
    /// inside of but that have no span are entered, their spans opened late: a resumed
    /// durable run goes on inside a child without its `agent_started`.
    pub(super) fn enter(&mut self, event: &Event, at: SystemTime) {
        let path: Option<Cow<'_, str>> = match &event.kind {
            EventKind::AgentFinished { agent, .. } => {
                Some(Cow::Owned(join(event.path.as_deref(), agent)))
            }
            _ => event.path.as_deref().map(Cow::Borrowed),
        };
        let path = path.as_deref();
        while !within(self.frame.path.as_deref(), path) {
            self.leave(at, Some("unfinished"), true);
        }
        let Some(path) = path else {
            return;
        };
        let rest = match self.frame.path.as_deref() {
            None => path,
            Some(here) if here == path => return,
            // `within` said `path` starts with `here/`.
            Some(here) => path.get(here.len() + 1..).unwrap_or_default(),
        };
        for agent in rest.split('/') {
            self.ensure_run(at);
            let start = self.resumed_start(at);
            self.start_child(agent, true, start, true);
        }
    }

    /// `agent_started`: the child's run span, under the call's `execute_tool` span (an
    /// agent tool's call `call_id`) or else the calling step's.
    pub(super) fn agent_started(
        &mut self,
        step: &str,
        agent: &str,
        call_id: Option<&str>,
        at: SystemTime,
    ) {
        self.ensure_step(step, at);
        let in_tool = call_id.is_some() && self.frame.tool_call.as_deref() == call_id;
        self.start_child(agent, in_tool, at, false);
    }

    /// `agent_finished`: the child's run span gets its outcome and ends (failed as a
    /// failed run's does), and its caller is the current run again.
    pub(super) fn agent_finished(
        &mut self,
        outcome: aplc_vm::RunStatus,
        error: Option<&aplc_vm::EventError>,
        totals: &aplc_vm::Totals,
        at: SystemTime,
    ) {
        self.mark_outcome(outcome, error, totals, at);
        let reason = error.map(|e| e.kind.clone());
        self.leave(at, reason.as_deref(), false);
    }

    /// Starts a child run of `agent` at `at` under the current run's open
    /// `execute_tool` span if `in_tool`, or else its step (or run) span, and makes it the
    /// current run; `resumed`: without its `agent_started`.
    fn start_child(&mut self, agent: &str, in_tool: bool, at: SystemTime, resumed: bool) {
        let tool = self.frame.tool.as_ref().filter(|_| in_tool);
        let under = tool
            .or(self.frame.step.as_ref())
            .or(self.frame.run.as_ref());
        let parent = match under {
            Some(span) => Context::new().with_remote_span_context(span.span_context().clone()),
            None => self.frame.parent.clone(),
        };
        let path = join(self.frame.path.as_deref(), agent);
        let mut attributes = vec![
            KeyValue::new("gen_ai.operation.name", "invoke_workflow"),
            KeyValue::new("gen_ai.agent.name", agent.to_owned()),
            KeyValue::new("gen_ai.workflow.name", agent.to_owned()),
            KeyValue::new("aplc.agent.path", path.clone()),
        ];
        if resumed {
            attributes.push(KeyValue::new("aplc.run.resumed", true));
        }
        let mut child = Frame::root(parent);
        child.path = Some(path);
        let caller = std::mem::replace(&mut self.frame, child);
        self.outer.push(caller);
        self.start_run(agent.to_owned(), attributes, at);
    }

    /// Ends the current child run's spans (see [`Frame::close`]) and makes its caller
    /// the current run. The root run is never left.
    pub(super) fn leave(&mut self, at: SystemTime, reason: Option<&str>, mark_run: bool) {
        let Some(caller) = self.outer.pop() else {
            return;
        };
        let mut child = std::mem::replace(&mut self.frame, caller);
        child.close(at, reason, mark_run);
    }
}

/// `agent`'s path under the run at `path`.
fn join(path: Option<&str>, agent: &str) -> String {
    match path {
        Some(path) => format!("{path}/{agent}"),
        None => agent.to_owned(),
    }
}

/// True if the run at `path` is the one at `outer` or one of its children, at any depth.
fn within(outer: Option<&str>, path: Option<&str>) -> bool {
    match (outer, path) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(outer), Some(path)) => path
            .strip_prefix(outer)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/')),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_within_itself_and_its_callers_only() {
        assert!(within(None, None));
        assert!(within(None, Some("a")));
        assert!(within(Some("a"), Some("a")));
        assert!(within(Some("a"), Some("a/b")));
        assert!(!within(Some("a"), Some("ab")));
        assert!(!within(Some("a/b"), Some("a")));
        assert!(!within(Some("a"), None));
        assert_eq!(join(None, "a"), "a");
        assert_eq!(join(Some("a"), "b"), "a/b");
    }
}

//! One run's spans and metrics, built from its events (spec/telemetry.md, "Spans").
//!
//! The events (`spec/events.md`) are the source of truth: every driver hands them to a
//! listener, so [`RunTrace::on_event`] works for `run_with_listener`, the durable driver
//! and any embedder alike. What the events do not carry (the request's sampling
//! parameters, the response's model and id, message content) a [`Traced`] provider
//! notes as it sees the call, in a slot the listener reads at the call's
//! `provider_result`. One run makes one provider call at a time, so one slot suffices.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    Span as _, SpanContext, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    Tracer as _,
};
use opentelemetry::{Array, Context, KeyValue, StringValue, Value};
use opentelemetry_sdk::trace::{SdkTracer, Span};
use serde_json::{Value as Json, json};

use super::{Instruments, TelemetryError};
use crate::Redactor;
use crate::future::BoxFuture;
use crate::provider::{CallContext, Provider};
use aplc_vm::{Completion, Content, Event, EventKind, Part, ProviderError, ProviderRequest};
use nesting::Frame;

mod nesting;

/// A W3C trace context a run joins: its spans go into that trace, under that span.
#[derive(Debug, Clone, PartialEq)]
pub struct Parent(SpanContext);

impl Parent {
    /// Parses a `traceparent` header (`00-{trace id}-{span id}-{flags}`) and, if given, a
    /// `tracestate`. A malformed `traceparent` is an error (the caller ignores it and
    /// warns); a malformed `tracestate` is dropped, with the message as the second value,
    /// as the W3C recommendation asks.
    pub fn parse(
        traceparent: &str,
        tracestate: Option<&str>,
    ) -> Result<(Parent, Option<String>), TelemetryError> {
        let bad = TelemetryError::Traceparent;
        let text = traceparent.trim();
        let fields: Vec<&str> = text.split('-').collect();
        let [version, trace_id, span_id, flags, rest @ ..] = fields.as_slice() else {
            return Err(bad("expected `version-traceid-parentid-flags`"));
        };
        let hex = |s: &str, len: usize| {
            s.len() == len
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        if !hex(version, 2) || *version == "ff" {
            return Err(bad(
                "the version is not two lower-case hex digits (other than ff)",
            ));
        }
        // Version 00 has exactly four fields; a later version may add some after them.
        if *version == "00" && !rest.is_empty() {
            return Err(bad("version 00 has four fields"));
        }
        if !hex(trace_id, 32) || trace_id.bytes().all(|b| b == b'0') {
            return Err(bad(
                "the trace id is not 32 lower-case hex digits, not all zero",
            ));
        }
        if !hex(span_id, 16) || span_id.bytes().all(|b| b == b'0') {
            return Err(bad(
                "the parent id is not 16 lower-case hex digits, not all zero",
            ));
        }
        if !hex(flags, 2) {
            return Err(bad("the flags are not two lower-case hex digits"));
        }
        let (Ok(trace), Ok(span), Ok(flags)) = (
            TraceId::from_hex(trace_id),
            opentelemetry::trace::SpanId::from_hex(span_id),
            u8::from_str_radix(flags, 16),
        ) else {
            return Err(bad("not hex"));
        };
        let (state, warning) = match tracestate.map(str::trim).filter(|s| !s.is_empty()) {
            None => (TraceState::default(), None),
            Some(text) => match text.parse::<TraceState>() {
                Ok(state) => (state, None),
                Err(e) => (
                    TraceState::default(),
                    Some(format!("malformed tracestate ignored: {e}")),
                ),
            },
        };
        let sampled = TraceFlags::new(flags & 1);
        let context = SpanContext::new(trace, span, sampled, true, state);
        Ok((Parent(context), warning))
    }

    /// The trace the run joins.
    pub fn trace_id(&self) -> TraceId {
        self.0.trace_id()
    }
}

/// What a run's spans say about it besides its events.
#[derive(Debug, Clone, Default)]
pub struct RunDetails {
    /// The trace context to join (an incoming `traceparent`); `None`: a new trace.
    pub parent: Option<Parent>,
    /// The durable run's id, if it has one.
    pub run_id: Option<String>,
    /// The agent (the bundle's source name), for a run whose `run_started` is not seen
    /// (a resumed durable run).
    pub agent: Option<String>,
    /// The run's secrets: every string a span carries from the run is redacted with them.
    pub redactor: Redactor,
}

/// The spans of one run in progress. Cloning shares them: the listener and the
/// [`Traced`] provider each hold one.
#[derive(Clone)]
pub struct RunTrace {
    state: Arc<Mutex<RunSpans>>,
}

impl std::fmt::Debug for RunTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunTrace").finish_non_exhaustive()
    }
}

impl RunTrace {
    pub(super) fn new(
        tracer: SdkTracer,
        instruments: Arc<Instruments>,
        capture_content: bool,
        details: RunDetails,
    ) -> RunTrace {
        let parent = match &details.parent {
            Some(Parent(context)) => Context::new().with_remote_span_context(context.clone()),
            None => Context::new(),
        };
        RunTrace {
            state: Arc::new(Mutex::new(RunSpans {
                tracer,
                instruments,
                capture_content,
                details,
                anchor: None,
                frame: Frame::root(parent),
                outer: Vec::new(),
                call: None,
                trace_id: None,
            })),
        }
    }

    /// Turns one event into span starts, ends and attributes. Event kinds it does not
    /// know (a newer aplc's) are skipped.
    pub fn on_event(&self, event: &Event) {
        self.lock().on_event(event);
    }

    /// Ends whatever is still open as failed with `reason` (`cancelled`, say): for a run
    /// that stopped without `run_finished`, such as one interrupted by Ctrl-C.
    pub fn abandon(&self, reason: &str) {
        let mut spans = self.lock();
        let now = SystemTime::now();
        spans.close_all(now, Some(reason), true);
    }

    /// `provider`, noting for the spans what the events do not carry.
    pub fn provider<'p>(&self, provider: &'p dyn Provider) -> Traced<'p> {
        Traced {
            inner: provider,
            trace: Some(self.clone()),
        }
    }

    /// `provider` wrapped for `trace` when there is one; as it is otherwise (a run
    /// without telemetry pays one indirection per call, nothing else).
    pub fn provider_of<'p>(trace: Option<&RunTrace>, provider: &'p dyn Provider) -> Traced<'p> {
        Traced {
            inner: provider,
            trace: trace.cloned(),
        }
    }

    /// One provider call made apart from the run's events (an activity of a run on
    /// Temporal, whose workflow holds the machine): its `chat` span, from now until the
    /// answer, directly under the details' parent, with the metrics of the call.
    pub async fn provider_call(
        &self,
        provider: &dyn Provider,
        request: &ProviderRequest,
        call: &CallContext,
    ) -> Result<Completion, ProviderError> {
        let started = SystemTime::now();
        self.lock().open_chat(&request.model, started);
        let result = self.provider(provider).complete(request, call).await;
        let at = SystemTime::now();
        let latency_ms = at.duration_since(started).unwrap_or_default().as_secs_f64() * 1000.0;
        let (usage, finish_reason, error) = match &result {
            Ok(completion) => {
                let reason = completion.finish_reason.as_ref().map(|r| r.as_str());
                (aplc_vm::TokenUsage::of(completion), reason, None)
            }
            Err(e) => {
                let error = aplc_vm::EventError {
                    kind: e.kind.as_str().to_owned(),
                    message: e.message.clone(),
                };
                (None, None, Some(error))
            }
        };
        self.lock()
            .provider_result(usage, finish_reason, latency_ms, error.as_ref(), at);
        result
    }

    /// One tool call made apart from the run's events (as [`RunTrace::provider_call`]):
    /// its `execute_tool` span starts now, with `mcp.*` attributes for a tool of MCP
    /// server `mcp_server`; [`RunTrace::tool_ended`] ends it.
    pub fn tool_started(&self, tool: &str, call_id: &str, mcp_server: Option<&str>) {
        self.lock()
            .open_tool(tool, call_id, mcp_server, SystemTime::now());
    }

    /// Ends the span [`RunTrace::tool_started`] began, failed if `with_error`.
    pub fn tool_ended(&self, with_error: bool) {
        self.lock()
            .tool_result(with_error, false, SystemTime::now());
    }

    /// The run's trace id, once its span has started (and after it ended): what a
    /// server can hand back to its caller.
    pub fn trace_id(&self) -> Option<TraceId> {
        self.lock().trace_id
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RunSpans> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A provider that notes each call's request and completion for the run's `chat` span.
pub struct Traced<'p> {
    inner: &'p dyn Provider,
    /// `None`: the provider as it is ([`RunTrace::provider_of`] without a trace).
    trace: Option<RunTrace>,
}

impl Provider for Traced<'_> {
    fn complete<'a>(
        &'a self,
        request: &'a ProviderRequest,
        call: &'a CallContext,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        let Some(trace) = &self.trace else {
            return self.inner.complete(request, call);
        };
        Box::pin(async move {
            let noted = {
                let spans = trace.lock();
                CallNotes::of_request(
                    request,
                    self.inner.provider_name(&request.model),
                    spans.capture_content.then_some(&spans.details.redactor),
                )
            };
            let result = self.inner.complete(request, call).await;
            let mut spans = trace.lock();
            let capture = spans
                .capture_content
                .then(|| spans.details.redactor.clone());
            spans.call = Some(noted.with_result(&result, capture.as_ref()));
            result
        })
    }

    fn provider_name(&self, model: &str) -> Option<&'static str> {
        self.inner.provider_name(model)
    }
}

/// The open spans of a run and what the next events need.
struct RunSpans {
    tracer: SdkTracer,
    instruments: Arc<Instruments>,
    capture_content: bool,
    details: RunDetails,
    /// The wall-clock time of the run's `t_ms` 0.
    anchor: Option<SystemTime>,
    /// The spans of the run the events come from now: the root's, or a child's.
    frame: Frame,
    /// The runs that called it, the root first (`spec/agents.md`): empty for the root.
    outer: Vec<Frame>,
    /// What the [`Traced`] provider noted about the current call (one call at a time in
    /// the whole tree of runs).
    call: Option<CallNotes>,
    /// The run span's trace id, kept after the span ends.
    trace_id: Option<TraceId>,
}

impl RunSpans {
    fn on_event(&mut self, event: &Event) {
        let at = self.time_of(event.t_ms);
        self.enter(event, at);
        match &event.kind {
            EventKind::RunStarted {
                agent, bundle_hash, ..
            } => self.run_started(agent, bundle_hash, at),
            EventKind::StepStarted { step, runs } => self.step_started(step, *runs, at),
            EventKind::PhaseFinished {
                step,
                phase,
                duration_ms,
            } => {
                self.ensure_step(step, at);
                let name = match phase {
                    aplc_vm::Phase::Pre => "aplc.phase.pre",
                    aplc_vm::Phase::Prompt => "aplc.phase.prompt",
                    aplc_vm::Phase::Post => "aplc.phase.post",
                };
                if let Some(step) = self.frame.step.as_mut() {
                    let duration = vec![KeyValue::new("aplc.duration_ms", *duration_ms)];
                    step.add_event_with_timestamp(name, at, duration);
                }
            }
            EventKind::ProviderCall { step, model } => {
                self.ensure_step(step, at);
                self.call = None;
                self.open_chat(model, at);
            }
            EventKind::ProviderResult {
                step,
                usage,
                finish_reason,
                latency_ms,
                error,
            } => {
                self.ensure_step(step, at);
                // A resumed run's call that was in flight is sent again without a
                // `provider_call` event: its span starts when the provider sent it.
                if self.frame.chat.is_none()
                    && let Some(model) = self.call.as_ref().and_then(|c| c.request_model.clone())
                {
                    let start = self.resumed_start(at);
                    self.open_chat(&model, start);
                }
                let reason = finish_reason.as_deref();
                self.provider_result(*usage, reason, *latency_ms, error.as_ref(), at);
            }
            EventKind::ToolCall {
                step,
                tool,
                call_id,
                source,
                server,
            } => {
                self.ensure_step(step, at);
                let mcp_server = server
                    .as_deref()
                    .filter(|_| source.as_deref() == Some("mcp"));
                self.open_tool(tool, call_id, mcp_server, at);
            }
            EventKind::ToolResult {
                step,
                tool,
                call_id,
                with_error,
                duration_ms,
                reused,
            } => {
                self.ensure_step(step, at);
                if self.frame.tool.is_none() {
                    let start = earlier(at, *duration_ms);
                    let start = self.frame.run_start.map_or(start, |run| start.max(run));
                    self.open_tool(tool, call_id, None, start);
                }
                self.tool_result(*with_error, *reused, at);
            }
            EventKind::Error { step, message } => {
                if let Some(step) = step {
                    self.ensure_step(step, at);
                }
                self.error(message, at);
            }
            EventKind::InputRequested { request } => {
                self.ensure_step(&request.step, at);
                let mut attributes = vec![
                    KeyValue::new("aplc.input.id", request.id.clone()),
                    KeyValue::new("aplc.input.kind", request.kind.as_str()),
                ];
                attributes.extend(
                    (request.tool.clone()).map(|tool| KeyValue::new("gen_ai.tool.name", tool)),
                );
                if self.capture_content {
                    let prompt = self.details.redactor.redact(&request.prompt);
                    attributes.push(KeyValue::new("aplc.input.prompt", prompt));
                }
                self.step_event("aplc.input.requested", attributes, at);
            }
            EventKind::InputReceived {
                step,
                id,
                kind,
                by,
                approved,
                value,
                timed_out,
                ..
            } => {
                self.ensure_step(step, at);
                let mut attributes = vec![
                    KeyValue::new("aplc.input.id", id.clone()),
                    KeyValue::new("aplc.input.kind", kind.as_str()),
                    KeyValue::new("aplc.input.by", by.clone()),
                    KeyValue::new("aplc.input.timed_out", *timed_out),
                ];
                attributes.extend(approved.map(|a| KeyValue::new("aplc.input.approved", a)));
                if let (true, Some(value)) = (self.capture_content, value) {
                    let value = self.details.redactor.redact(&value.to_string());
                    attributes.push(KeyValue::new("aplc.input.value", value));
                }
                self.step_event("aplc.input.received", attributes, at);
            }
            EventKind::StepFinished { .. } => self.end_step(at),
            EventKind::AgentStarted {
                step,
                agent,
                call_id,
            } => self.agent_started(step, agent, call_id.as_deref(), at),
            EventKind::AgentFinished {
                outcome,
                error,
                totals,
                ..
            } => self.agent_finished(*outcome, error.as_ref(), totals, at),
            EventKind::RunFinished {
                outcome,
                error,
                totals,
            } => self.run_finished(*outcome, error.as_ref(), totals, at),
            // `jump` follows `step_finished`: the next `step_started` shows where the run
            // went. Kinds added after this code (`provider_delta`, …) are skipped.
            _ => {}
        }
    }

    fn run_started(&mut self, agent: &str, bundle_hash: &str, at: SystemTime) {
        let mut attributes = vec![
            KeyValue::new("gen_ai.operation.name", "invoke_workflow"),
            KeyValue::new("gen_ai.agent.name", agent.to_owned()),
            KeyValue::new("gen_ai.workflow.name", agent.to_owned()),
            KeyValue::new("aplc.bundle.hash", bundle_hash.to_owned()),
        ];
        let run_id = self.details.run_id.clone();
        attributes.extend(run_id.map(|id| KeyValue::new("aplc.run.id", id)));
        self.start_run(agent.to_owned(), attributes, at);
    }

    fn step_started(&mut self, step: &str, runs: u64, at: SystemTime) {
        self.ensure_run(at);
        self.end_step(at);
        let attributes = vec![
            KeyValue::new("aplc.step.name", step.to_owned()),
            KeyValue::new("aplc.step.runs", count(runs)),
        ];
        let name = format!("step {step}");
        let span = self.child(
            self.frame.run.as_ref(),
            name,
            SpanKind::Internal,
            attributes,
            at,
        );
        self.frame.step = Some(span);
    }

    fn tool_result(&mut self, with_error: bool, reused: bool, at: SystemTime) {
        if let Some(mut span) = self.frame.tool.take() {
            span.set_attribute(KeyValue::new("aplc.tool.reused", reused));
            if with_error {
                span.set_attribute(KeyValue::new("error.type", "tool_error"));
                span.set_status(Status::error("the tool call failed"));
            }
            span.end_with_timestamp(at);
        }
    }

    /// A span event on the step (or the run, before the first step).
    fn step_event(&mut self, name: &'static str, attributes: Vec<KeyValue>, at: SystemTime) {
        if let Some(span) = self.frame.step.as_mut().or(self.frame.run.as_mut()) {
            span.add_event_with_timestamp(name, at, attributes);
        }
    }

    /// An entry appended to `errors`: a span event on the step (or the run); its text
    /// only with content capture on, as it can quote a tool's output.
    fn error(&mut self, message: &str, at: SystemTime) {
        let content = self
            .capture_content
            .then(|| self.details.redactor.redact(message));
        if let Some(span) = self.frame.step.as_mut().or(self.frame.run.as_mut()) {
            let attributes = content
                .map(|m| vec![KeyValue::new("aplc.error.message", m)])
                .unwrap_or_default();
            span.add_event_with_timestamp("aplc.error", at, attributes);
        }
    }

    fn run_finished(
        &mut self,
        outcome: aplc_vm::RunStatus,
        error: Option<&aplc_vm::EventError>,
        totals: &aplc_vm::Totals,
        at: SystemTime,
    ) {
        self.mark_outcome(outcome, error, totals, at);
        let reason = error.map(|e| e.kind.clone());
        self.close_all(at, reason.as_deref(), false);
    }

    /// Sets how the current run ended on its span: the outcome and totals, and on
    /// failure the error (a run's `run_finished`, a child's `agent_finished`).
    fn mark_outcome(
        &mut self,
        outcome: aplc_vm::RunStatus,
        error: Option<&aplc_vm::EventError>,
        totals: &aplc_vm::Totals,
        at: SystemTime,
    ) {
        self.ensure_run(at);
        let outcome = serde_json::to_value(outcome)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        if let Some(run) = self.frame.run.as_mut() {
            let counts = [
                ("aplc.run.steps", totals.steps),
                ("aplc.run.provider_calls", totals.provider_calls),
                ("gen_ai.usage.input_tokens", totals.input_tokens),
                ("gen_ai.usage.output_tokens", totals.output_tokens),
            ];
            run.set_attribute(KeyValue::new("aplc.run.outcome", outcome));
            for (key, n) in counts {
                run.set_attribute(KeyValue::new(key, count(n)));
            }
            if let Some(error) = error {
                run.set_attribute(KeyValue::new("error.type", error.kind.clone()));
                run.set_status(Status::error(self.details.redactor.redact(&error.message)));
            }
        }
    }

    /// The wall-clock time of `t_ms`, anchored at the first event seen.
    fn time_of(&mut self, t_ms: f64) -> SystemTime {
        let since_start = Duration::from_secs_f64((t_ms / 1000.0).max(0.0));
        let anchor = *self.anchor.get_or_insert_with(|| {
            let now = SystemTime::now();
            now.checked_sub(since_start).unwrap_or(now)
        });
        anchor + since_start
    }

    fn start_run(&mut self, agent: String, attributes: Vec<KeyValue>, at: SystemTime) {
        let span = self
            .tracer
            .span_builder(format!("invoke_workflow {agent}"))
            .with_kind(SpanKind::Internal)
            .with_start_time(at)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &self.frame.parent);
        self.trace_id = Some(span.span_context().trace_id());
        self.frame.run_start = Some(at);
        self.frame.run = Some(span);
    }

    /// A resumed durable run has no `run_started`: its span starts at its first event.
    fn ensure_run(&mut self, at: SystemTime) {
        if self.frame.run.is_none() {
            let at = self.resumed_start(at);
            let agent = self
                .details
                .agent
                .clone()
                .unwrap_or_else(|| "agent".to_owned());
            let mut attributes = vec![
                KeyValue::new("gen_ai.operation.name", "invoke_workflow"),
                KeyValue::new("gen_ai.agent.name", agent.clone()),
                KeyValue::new("gen_ai.workflow.name", agent.clone()),
                KeyValue::new("aplc.run.resumed", true),
            ];
            attributes.extend(
                self.details
                    .run_id
                    .clone()
                    .map(|id| KeyValue::new("aplc.run.id", id)),
            );
            self.start_run(agent, attributes, at);
        }
    }

    /// A resumed run goes on inside the step it was in, without its `step_started`: the
    /// step's span starts at the first event that names it.
    fn ensure_step(&mut self, step: &str, at: SystemTime) {
        self.ensure_run(at);
        if self.frame.step.is_none() {
            let at = self.resumed_start(at);
            let attributes = vec![
                KeyValue::new("aplc.step.name", step.to_owned()),
                KeyValue::new("aplc.step.resumed", true),
            ];
            let span = self.child(
                self.frame.run.as_ref(),
                format!("step {step}"),
                SpanKind::Internal,
                attributes,
                at,
            );
            self.frame.step = Some(span);
        }
    }

    /// Where a span opened late on a resumed run starts: at `at`, or when the current
    /// call was sent if that is earlier; never before the run span.
    fn resumed_start(&self, at: SystemTime) -> SystemTime {
        let sent = self.call.as_ref().and_then(|c| c.sent_at);
        let start = sent.map_or(at, |sent| sent.min(at));
        self.frame.run_start.map_or(start, |run| start.max(run))
    }

    fn open_chat(&mut self, model: &str, at: SystemTime) {
        let attributes = vec![
            KeyValue::new("gen_ai.operation.name", "chat"),
            KeyValue::new("gen_ai.request.model", model.to_owned()),
        ];
        let parent = self.frame.step.as_ref().or(self.frame.run.as_ref());
        let span = self.child(
            parent,
            format!("chat {model}"),
            SpanKind::Client,
            attributes,
            at,
        );
        self.frame.chat = Some(span);
    }

    /// Opens the `execute_tool` span of a call; `mcp_server` names the MCP server of an
    /// MCP tool, whose span also gets the MCP conventions' attributes.
    fn open_tool(&mut self, tool: &str, call_id: &str, mcp_server: Option<&str>, at: SystemTime) {
        let mut attributes = vec![
            KeyValue::new("gen_ai.operation.name", "execute_tool"),
            KeyValue::new("gen_ai.tool.name", tool.to_owned()),
            KeyValue::new("gen_ai.tool.call.id", call_id.to_owned()),
            KeyValue::new("gen_ai.tool.type", "function"),
        ];
        if let Some(server) = mcp_server {
            attributes.push(KeyValue::new("mcp.method.name", "tools/call"));
            attributes.push(KeyValue::new("mcp.server.name", server.to_owned()));
        }
        let parent = self.frame.step.as_ref().or(self.frame.run.as_ref());
        let span = self.child(
            parent,
            format!("execute_tool {tool}"),
            SpanKind::Internal,
            attributes,
            at,
        );
        self.frame.tool = Some(span);
        self.frame.tool_call = Some(call_id.to_owned());
    }

    fn child(
        &self,
        parent: Option<&Span>,
        name: String,
        kind: SpanKind,
        attributes: Vec<KeyValue>,
        at: SystemTime,
    ) -> Span {
        let context = match parent {
            Some(span) => Context::new().with_remote_span_context(span.span_context().clone()),
            None => self.frame.parent.clone(),
        };
        self.tracer
            .span_builder(name)
            .with_kind(kind)
            .with_start_time(at)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &context)
    }

    fn provider_result(
        &mut self,
        usage: Option<aplc_vm::TokenUsage>,
        finish_reason: Option<&str>,
        latency_ms: f64,
        error: Option<&aplc_vm::EventError>,
        at: SystemTime,
    ) {
        let Some(mut span) = self.frame.chat.take() else {
            return;
        };
        let notes = self.call.take().unwrap_or_default();
        let mut metric_attributes = vec![KeyValue::new("gen_ai.operation.name", "chat")];
        if let Some(name) = notes.provider {
            span.set_attribute(KeyValue::new("gen_ai.provider.name", name));
            metric_attributes.push(KeyValue::new("gen_ai.provider.name", name));
        }
        if let Some(model) = &notes.request_model {
            metric_attributes.push(KeyValue::new("gen_ai.request.model", model.clone()));
        }
        for attribute in notes.attributes {
            span.set_attribute(attribute);
        }
        if let Some(model) = notes.response_model {
            span.set_attribute(KeyValue::new("gen_ai.response.model", model.clone()));
            metric_attributes.push(KeyValue::new("gen_ai.response.model", model));
        }
        if let Some(reason) = finish_reason {
            let reasons = Array::String(vec![StringValue::from(reason.to_owned())]);
            span.set_attribute(KeyValue::new(
                "gen_ai.response.finish_reasons",
                Value::Array(reasons),
            ));
        }
        if let Some(usage) = usage {
            span.set_attribute(KeyValue::new(
                "gen_ai.usage.input_tokens",
                count(usage.input_tokens),
            ));
            span.set_attribute(KeyValue::new(
                "gen_ai.usage.output_tokens",
                count(usage.output_tokens),
            ));
            self.instruments.record_tokens(usage, &metric_attributes);
        }
        if let Some(error) = error {
            span.set_attribute(KeyValue::new("error.type", error.kind.clone()));
            span.set_status(Status::error(self.details.redactor.redact(&error.message)));
            metric_attributes.push(KeyValue::new("error.type", error.kind.clone()));
        }
        self.instruments
            .record_duration(latency_ms, &metric_attributes);
        span.end_with_timestamp(at);
    }

    fn end_step(&mut self, at: SystemTime) {
        if let Some(mut span) = self.frame.step.take() {
            span.end_with_timestamp(at);
        }
    }

    /// Ends every open span at `at`, children's runs first, the inner ones (and every
    /// child's run) as failed with `reason` if there is one; the root's run span too
    /// when `mark_run` (`run_finished` marks it itself).
    fn close_all(&mut self, at: SystemTime, reason: Option<&str>, mark_run: bool) {
        while !self.outer.is_empty() {
            self.leave(at, reason, true);
        }
        self.frame.close(at, reason, mark_run);
        self.call = None;
    }
}

/// What a [`Traced`] provider saw of one call.
#[derive(Default)]
struct CallNotes {
    /// When the call was sent: a resent call's span starts there.
    sent_at: Option<SystemTime>,
    provider: Option<&'static str>,
    request_model: Option<String>,
    response_model: Option<String>,
    /// Request parameters, response id, content.
    attributes: Vec<KeyValue>,
}

impl CallNotes {
    fn of_request(
        request: &ProviderRequest,
        provider: Option<&'static str>,
        capture: Option<&Redactor>,
    ) -> CallNotes {
        let mut attributes = Vec::new();
        let sampling = &request.sampling;
        let numeric = [
            ("gen_ai.request.temperature", &sampling.temperature),
            ("gen_ai.request.top_p", &sampling.top_p),
            (
                "gen_ai.request.presence_penalty",
                &sampling.presence_penalty,
            ),
            (
                "gen_ai.request.frequency_penalty",
                &sampling.frequency_penalty,
            ),
            (
                "aplc.request.repetition_penalty",
                &sampling.repetition_penalty,
            ),
        ];
        for (key, value) in numeric {
            if let Some(v) = value.as_ref().and_then(Json::as_f64) {
                attributes.push(KeyValue::new(key, v));
            }
        }
        let integral = [
            ("gen_ai.request.max_tokens", &sampling.max_tokens),
            ("gen_ai.request.seed", &sampling.seed),
            ("gen_ai.request.top_k", &sampling.top_k),
        ];
        for (key, value) in integral {
            if let Some(v) = value.as_ref().and_then(Json::as_i64) {
                attributes.push(KeyValue::new(key, v));
            }
        }
        match &sampling.stop_sequences {
            Some(Json::String(stop)) => {
                let stops = Array::String(vec![StringValue::from(stop.clone())]);
                attributes.push(KeyValue::new(
                    "gen_ai.request.stop_sequences",
                    Value::Array(stops),
                ));
            }
            Some(Json::Array(stops)) => {
                let stops = stops
                    .iter()
                    .filter_map(Json::as_str)
                    .map(|s| StringValue::from(s.to_owned()))
                    .collect();
                attributes.push(KeyValue::new(
                    "gen_ai.request.stop_sequences",
                    Value::Array(Array::String(stops)),
                ));
            }
            _ => {}
        }
        let output_type = match request.output {
            aplc_vm::OutputFormat::Text => "text",
            _ => "json",
        };
        attributes.push(KeyValue::new("gen_ai.output.type", output_type));
        if let Some(redactor) = capture {
            let messages: Vec<Json> = request
                .messages
                .iter()
                .map(|m| {
                    let parts = match &m.content {
                        Content::Text(text) => vec![text_part(text)],
                        Content::Parts(parts) => parts.iter().map(part_json).collect(),
                    };
                    json!({"role": role_name(m.role), "parts": parts})
                })
                .collect();
            let messages = redactor.redact_json(Json::Array(messages)).to_string();
            attributes.push(KeyValue::new("gen_ai.input.messages", messages));
        }
        CallNotes {
            sent_at: Some(SystemTime::now()),
            provider,
            request_model: Some(request.model.clone()),
            response_model: None,
            attributes,
        }
    }

    fn with_result(
        mut self,
        result: &Result<Completion, ProviderError>,
        capture: Option<&Redactor>,
    ) -> CallNotes {
        let Ok(completion) = result else {
            return self;
        };
        self.response_model = completion.model.clone();
        let id = completion
            .raw
            .as_deref()
            .and_then(|raw| raw.get("id"))
            .and_then(Json::as_str);
        if let Some(id) = id {
            self.attributes
                .push(KeyValue::new("gen_ai.response.id", id.to_owned()));
        }
        if let Some(redactor) = capture {
            let mut parts: Vec<Json> = completion.content.iter().map(part_json).collect();
            parts.extend(completion.tool_calls.iter().map(|call| {
                json!({"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.arguments})
            }));
            let finish = completion
                .finish_reason
                .as_ref()
                .map(|r| r.as_str().to_owned());
            let message =
                json!([{"role": completion.role, "parts": parts, "finish_reason": finish}]);
            let text = redactor.redact_json(message).to_string();
            self.attributes
                .push(KeyValue::new("gen_ai.output.messages", text));
        }
        self
    }
}

/// A role as the conventions name it: `tool` for a tool result.
fn role_name(role: aplc_vm::Role) -> &'static str {
    match role {
        aplc_vm::Role::ToolResult => "tool",
        other => other.as_str(),
    }
}

fn text_part(text: &str) -> Json {
    json!({"type": "text", "content": text})
}

/// A content part in the conventions' message form; attachments by reference only.
fn part_json(part: &Part) -> Json {
    match part {
        Part::Text(text) => text_part(text),
        Part::ImageUrl(url) => json!({"type": "uri", "modality": "image", "uri": url}),
        Part::AudioInput(url) => json!({"type": "uri", "modality": "audio", "uri": url}),
        Part::File(url) => json!({"type": "uri", "uri": url}),
        _ => json!({"type": "unknown"}),
    }
}

/// `ms` milliseconds before `at`.
fn earlier(at: SystemTime, ms: f64) -> SystemTime {
    let back = Duration::from_secs_f64((ms / 1000.0).max(0.0));
    at.checked_sub(back).unwrap_or(at)
}

/// A count as an OTel integer (they are signed).
fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

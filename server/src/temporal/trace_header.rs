//! Trace context across a run on Temporal (spec/temporal.md, "Tracing"): the workflow's
//! `_tracer-data` header (a W3C `traceparent`, as Temporal's SDKs write it) goes onto
//! every activity the workflow schedules and onto its continuation, and an activity's
//! spans (`chat`, `execute_tool`) nest under it.
//!
//! Temporal's own `OpenTelemetryPlugin` does this too, but on another `opentelemetry`
//! than aplc's; copying the header needs none. The interceptor only copies a header the
//! workflow started with: it is deterministic, so replays schedule the same commands.

use std::cell::RefCell;
use std::collections::HashMap;

use aplc_runtime::telemetry::Parent;
use serde_json::Value as Json;
use temporalio_common::protos::temporal::api::common::v1::Payload;
use temporalio_workflow::workflow_interceptors::{
    CancellableWorkflowOutboundFuture, ContinueAsNewInput, ContinueAsNewResult,
    ExecuteWorkflowInput, ExecuteWorkflowResult, ScheduleActivityInput, ScheduleActivityResult,
    SyncWorkflowInterceptorContext, WorkflowInterceptor, WorkflowInterceptorConstructor,
    WorkflowInterceptorContext, WorkflowInterceptorFuture, WorkflowNext,
};

/// The header Temporal's SDKs keep trace context in (a JSON map of W3C fields).
pub(crate) const TRACE_HEADER: &str = "_tracer-data";

/// The interceptor of each workflow instance.
pub(crate) fn constructor() -> WorkflowInterceptorConstructor {
    WorkflowInterceptorConstructor::new(|_| CarryTrace::default())
}

/// Holds the workflow's trace header and puts it on what the workflow schedules.
#[derive(Default)]
struct CarryTrace {
    header: RefCell<Option<Payload>>,
}

impl CarryTrace {
    /// Adds the workflow's header to `headers`, unless they carry one of their own.
    fn carry(&self, headers: &mut HashMap<String, Payload>) {
        if let Some(header) = self.header.borrow().as_ref() {
            headers
                .entry(TRACE_HEADER.to_owned())
                .or_insert_with(|| header.clone());
        }
    }
}

impl WorkflowInterceptor for CarryTrace {
    fn execute<'a>(
        &'a self,
        _ctx: WorkflowInterceptorContext,
        input: ExecuteWorkflowInput,
        next: WorkflowNext<
            'a,
            ExecuteWorkflowInput,
            WorkflowInterceptorFuture<'a, ExecuteWorkflowResult>,
        >,
    ) -> WorkflowInterceptorFuture<'a, ExecuteWorkflowResult> {
        *self.header.borrow_mut() = input.headers().get(TRACE_HEADER).cloned();
        next.run(input)
    }

    fn schedule_activity(
        &self,
        _ctx: WorkflowInterceptorContext,
        mut input: ScheduleActivityInput,
        next: WorkflowNext<
            'static,
            ScheduleActivityInput,
            CancellableWorkflowOutboundFuture<ScheduleActivityResult>,
        >,
    ) -> CancellableWorkflowOutboundFuture<ScheduleActivityResult> {
        self.carry(input.headers_mut());
        next.run(input)
    }

    fn continue_as_new(
        &self,
        _ctx: SyncWorkflowInterceptorContext,
        mut input: ContinueAsNewInput,
        next: WorkflowNext<'static, ContinueAsNewInput, ContinueAsNewResult>,
    ) -> ContinueAsNewResult {
        // The continuation is the same run: its activities stay in the same trace.
        self.carry(input.headers_mut());
        next.run(input)
    }
}

/// The trace context an activity's `headers` carry, if any. A header that is not a JSON
/// map with a well-formed `traceparent` is ignored with a warning (the spans then start a
/// trace of their own): outside input never fails a call.
pub(crate) fn parent(headers: &HashMap<String, Payload>) -> Option<Parent> {
    let payload = headers.get(TRACE_HEADER)?;
    let fields: HashMap<String, Json> = match serde_json::from_slice(&payload.data) {
        Ok(fields) => fields,
        Err(e) => {
            tracing::warn!(error = %e, "{TRACE_HEADER} header ignored: not a JSON map");
            return None;
        }
    };
    let field = |name: &str| fields.get(name).and_then(Json::as_str);
    let traceparent = field("traceparent")?;
    match Parent::parse(traceparent, field("tracestate")) {
        Ok((parent, warning)) => {
            if let Some(warning) = warning {
                tracing::warn!("{TRACE_HEADER}: {warning}");
            }
            Some(parent)
        }
        Err(e) => {
            tracing::warn!(error = %e, "{TRACE_HEADER} header ignored");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(data: &str) -> HashMap<String, Payload> {
        let payload = Payload {
            metadata: HashMap::from([("encoding".to_owned(), b"json/plain".to_vec())]),
            data: data.as_bytes().to_vec(),
            ..Default::default()
        };
        HashMap::from([(TRACE_HEADER.to_owned(), payload)])
    }

    #[test]
    fn a_header_gives_its_traceparent_and_a_bad_one_nothing() {
        let id = "4bf92f3577b34da6a3ce929d0e0e4736";
        let good = headers(&format!(
            r#"{{"traceparent": "00-{id}-00f067aa0ba902b7-01"}}"#
        ));
        let parent = parent(&good).expect("a parent");
        assert_eq!(parent.trace_id().to_string(), id);
        assert!(super::parent(&headers("not json")).is_none());
        assert!(super::parent(&headers(r#"{"traceparent": "00-zz"}"#)).is_none());
        assert!(super::parent(&headers("{}")).is_none());
        assert!(super::parent(&HashMap::new()).is_none());
    }
}

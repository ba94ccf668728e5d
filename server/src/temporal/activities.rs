//! The activities of `apl.Run`: every effect of a run, performed by whichever worker
//! polls it, with that worker's agents, provider and tools.
//!
//! - `apl.resolve` (a local activity: it runs on the worker of the workflow task, so the
//!   bundle it pins is one that worker has): the agent's bundle hash, or why it cannot run.
//! - `apl.provider_call`: one model request, with aplc's own retries and routing inside;
//!   it heartbeats while it waits, so a worker lost mid-call is noticed in seconds.
//! - `apl.tool_call`: one tool call (MCP tools too: they are tools of the toolbox).
//!
//! Each returns `null` when the run's deadline passed first (the workflow hands the
//! machine a timeout), and otherwise what the machine takes, redacted.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aplc_runtime::driver::CallContext;
use aplc_runtime::telemetry::{RunDetails, RunTrace};
use temporalio_macros::activities;
use temporalio_sdk::activities::{ActivityContext, ActivityError};

use super::payload::{ProviderAnswer, ProviderCall, Resolved, RunInput, ToolAnswer, ToolCallInput};
use super::{Host, trace_header};

/// How often a long activity tells Temporal it is alive; the workflow's heartbeat
/// timeout is a few of these.
pub(crate) const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

/// The longest deadline an activity sets (a run without a timeout has `u64::MAX` ms).
const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The activities, on the worker's host.
pub struct AplActivities {
    host: Arc<Host>,
}

impl AplActivities {
    pub(crate) fn new(host: Arc<Host>) -> AplActivities {
        AplActivities { host }
    }
}

#[activities]
impl AplActivities {
    /// The bundle a new run of `input.agent` is pinned to.
    #[activity(name = "apl.resolve")]
    pub async fn resolve(
        self: Arc<Self>,
        _ctx: ActivityContext,
        input: RunInput,
    ) -> Result<Resolved, ActivityError> {
        Ok(resolve(&self.host, &input))
    }

    /// One model request.
    #[activity(name = "apl.provider_call")]
    pub async fn provider_call(
        self: Arc<Self>,
        ctx: ActivityContext,
        call: ProviderCall,
    ) -> Result<Option<ProviderAnswer>, ActivityError> {
        let request = call.request();
        let (remaining, deadline) = deadline(call.remaining_ms);
        let context = CallContext::new(deadline);
        let provider = &*self.host.equipment.provider;
        let work = async {
            match self.trace(&ctx) {
                Some(trace) => trace.provider_call(provider, &request, &context).await,
                None => provider.complete(&request, &context).await,
            }
        };
        let Some(answer) = heartbeating(&ctx, remaining, work).await? else {
            return Ok(None);
        };
        let redactor = &self.host.equipment.durable.redactor;
        // A server may echo a key into a message; history must never hold one.
        Ok(Some(answer.map_err(|mut error| {
            error.message = redactor.redact(&error.message);
            error
        })))
    }

    /// One tool call.
    #[activity(name = "apl.tool_call")]
    pub async fn tool_call(
        self: Arc<Self>,
        ctx: ActivityContext,
        call: ToolCallInput,
    ) -> Result<Option<ToolAnswer>, ActivityError> {
        let invocation = call.invocation();
        let (remaining, _) = deadline(call.remaining_ms);
        let trace = self.trace(&ctx);
        if let Some(trace) = &trace {
            // A tool of an MCP server: its span names the server (spec/telemetry.md).
            let registry = self.host.equipment.toolbox.registry();
            let origin = registry
                .get(&invocation.name)
                .and_then(|spec| spec.origin());
            let server = origin.and_then(|origin| origin.server());
            trace.tool_started(&invocation.name, &invocation.id, server);
        }
        // The toolbox redacts what its tools answer.
        let work = self.host.equipment.toolbox.call(&invocation);
        let answer = heartbeating(&ctx, remaining, work).await;
        if let Some(trace) = &trace {
            // A call cut short (the deadline, a cancel) ends its span failed too.
            trace.tool_ended(!matches!(answer, Ok(Some(Ok(_)))));
        }
        answer
    }
}

impl AplActivities {
    /// The spans of one call when telemetry is on: in the trace of the `_tracer-data`
    /// header the workflow passed on (or a trace of their own without one).
    fn trace(&self, ctx: &ActivityContext) -> Option<RunTrace> {
        let telemetry = self.host.telemetry.as_ref()?;
        Some(telemetry.run(RunDetails {
            parent: trace_header::parent(ctx.headers()),
            run_id: ctx.info().workflow_id.clone(),
            agent: None,
            redactor: self.host.equipment.durable.redactor.clone(),
        }))
    }
}

/// The time left and the deadline of a call with `remaining_ms` left.
fn deadline(remaining_ms: u64) -> (Duration, Instant) {
    let remaining = Duration::from_millis(remaining_ms).min(FAR);
    (remaining, Instant::now() + remaining)
}

/// Awaits `work` for at most `remaining` (then `None`), heartbeating meanwhile; a
/// cancelled activity (its workflow ended, the worker shuts down) stops waiting.
async fn heartbeating<T>(
    ctx: &ActivityContext,
    remaining: Duration,
    work: impl Future<Output = T>,
) -> Result<Option<T>, ActivityError> {
    let work = tokio::time::timeout(remaining, work);
    tokio::pin!(work);
    loop {
        tokio::select! {
            biased;
            out = &mut work => return Ok(out.ok()),
            () = ctx.cancelled() => return Err(ActivityError::cancelled()),
            () = tokio::time::sleep(HEARTBEAT_EVERY) => {
                // A heartbeat that cannot be sent is the server's business: the call goes on.
                let _ = ctx.record_heartbeat(()).await;
            }
        }
    }
}

/// The bundle hash of `input.agent` on this worker, or why a run of it cannot start
/// (the checks `POST /v1/agents/{name}/runs` makes).
fn resolve(host: &Host, input: &RunInput) -> Resolved {
    let error = |message: String| Resolved {
        bundle_hash: None,
        error: Some(message),
    };
    let Some(agent) = host.agents.get(&input.agent) else {
        return error(format!("no agent `{}` on this worker", input.agent));
    };
    if let Some(problem) = crate::agents::unsettable(&input.context) {
        return error(problem);
    }
    let missing = agent.missing_inputs(&input.context);
    if !missing.is_empty() {
        return error(format!(
            "agent `{}` needs these inputs in `context`: {}",
            input.agent,
            missing.join(", ")
        ));
    }
    Resolved {
        bundle_hash: Some(agent.hash.clone()),
        error: None,
    }
}

//! The HTTP API (spec/serve.md): routes, handlers, and the OpenAPI document derived from
//! the handlers' annotations. Below them: the shared state ([`crate::state`]), the one
//! error type ([`crate::error`]) and the extractors that map a malformed query or body
//! to it ([`crate::extract`]).
//!
//! Cross-cutting concerns are layers, not handler code: the bearer-token check
//! ([`crate::auth`]), the body size limit (413) and the request log line.

use std::time::{Duration, Instant};

use aplc_runtime::durable::{self, NewDurableRun};
use aplc_runtime::store::{Enqueued, NewRun, QueueEntry, QueuedRun};
use aplc_vm::RunOptions;
use axum::extract::{DefaultBodyLimit, MatchedPath, Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as JsonValue, json};
use utoipa::{OpenApi, ToSchema};

use crate::agents::Agent;
use crate::error::{ApiError, ErrorBody, ErrorDetail};
use crate::extract::{ApiQuery, JsonBody};
use crate::state::AppState;

/// The longest idempotency key accepted.
const MAX_IDEMPOTENCY_KEY: usize = 256;

/// The application: every route, with auth on all but `/healthz` (and the playground's
/// static files, with `--playground`).
pub(crate) fn router(
    state: AppState,
    max_body_bytes: usize,
    playground: Option<std::path::PathBuf>,
) -> Router {
    let protected = Router::new()
        .route("/v1/agents", get(list_agents))
        .route("/v1/agents/{name}/runs", post(submit))
        .route("/v1/runs/{id}", get(get_run))
        .route("/v1/runs/{id}/events", get(run_events))
        .route("/v1/runs/{id}/cancel", post(cancel))
        .route("/v1/runs/{id}/input", post(crate::input::answer_input))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .route_layer(middleware::from_fn_with_state(
            state.tokens.clone(),
            crate::auth::require_token,
        ));
    let mut app = Router::new()
        .route("/healthz", get(healthz))
        .merge(protected);
    if let Some(dir) = playground {
        app = app.merge(crate::playground::routes(dir));
    }
    app.fallback(not_found)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(middleware::from_fn(log_request))
        .with_state(state)
}

/// One log line per request: method, route, status and time. Never headers or bodies
/// (they hold tokens and callers' data).
async fn log_request(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "(unmatched)".to_string(), |p| p.as_str().to_string());
    let path = request.uri().path().to_string();
    let started = Instant::now();
    let response = next.run(request).await;
    tracing::info!(
        %method,
        route = %route,
        path = %path,
        status = response.status().as_u16(),
        ms = started.elapsed().as_millis() as u64,
        "request"
    );
    response
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such route")
}

/// Health check (no token needed).
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "The server is up", body = Object)))]
async fn healthz() -> Json<JsonValue> {
    Json(json!({"status": "ok"}))
}

/// A hosted agent.
#[derive(Debug, Serialize, ToSchema)]
struct AgentView {
    /// The agent's name: its file name without `.apl`/`.aplb`.
    name: String,
    /// The content hash of its bundle (new runs use this version).
    bundle_hash: String,
    /// The declared inputs (`{# inputs: … #}`), which a run's `context` must give.
    inputs: Vec<String>,
    /// The steps, in source order.
    steps: Vec<String>,
    /// What the agent does: its first `{# … #}` comment before the first heading that
    /// declares no inputs. Absent when it has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<String>,
}

/// The hosted agents.
#[derive(Debug, Serialize, ToSchema)]
struct AgentList {
    agents: Vec<AgentView>,
}

/// Lists the agents.
#[utoipa::path(get, path = "/v1/agents", security(("bearer" = [])),
    responses((status = 200, body = AgentList), (status = 401, body = ErrorBody)))]
async fn list_agents(State(state): State<AppState>) -> Json<AgentList> {
    let agents = state
        .agents
        .list()
        .iter()
        .map(|agent| AgentView {
            name: agent.name.clone(),
            bundle_hash: agent.hash.clone(),
            inputs: agent.inputs.clone(),
            steps: agent.steps.clone(),
            description: agent.description.clone(),
        })
        .collect();
    Json(AgentList { agents })
}

/// A run request.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct RunRequest {
    /// The run's variables (`with_context`): every declared input, and any others.
    #[serde(default)]
    #[schema(value_type = Object)]
    context: Option<Map<String, JsonValue>>,
    /// Cap on successful provider calls for the whole run.
    #[serde(default)]
    max_runs: Option<u64>,
    /// Cap on steps entered (default 1,000).
    #[serde(default)]
    max_steps: Option<u64>,
    /// The run's timeout in milliseconds of active time (default 120,000).
    #[serde(default)]
    timeout_ms: Option<u64>,
    /// The same key for the same agent within 24 hours returns the run it started.
    #[serde(default)]
    idempotency_key: Option<String>,
}

/// `?wait=true`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
struct WaitQuery {
    /// Answer when the run ends (200), or at the server's wait limit (202).
    #[serde(default)]
    wait: bool,
}

/// A run was accepted.
#[derive(Debug, Serialize, ToSchema)]
struct Accepted {
    run_id: String,
    /// `queued`, or the status of the run an idempotency key found.
    status: String,
}

/// Starts a run of an agent.
#[utoipa::path(post, path = "/v1/agents/{name}/runs", security(("bearer" = [])),
    params(("name" = String, Path, description = "The agent"), WaitQuery),
    request_body = RunRequest,
    responses(
        (status = 202, description = "Queued (or still running at the wait limit)", body = Accepted),
        (status = 200, description = "With `?wait=true`: the finished run", body = RunView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 408, description = "The body did not arrive within the body timeout", body = ErrorBody),
        (status = 413, body = ErrorBody),
        (status = 422, description = "Declared inputs are missing, or `context` sets a name a run cannot set", body = ErrorBody),
    ))]
async fn submit(
    State(state): State<AppState>,
    Path(name): Path<String>,
    ApiQuery(query): ApiQuery<WaitQuery>,
    headers: HeaderMap,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let agent = state
        .agents
        .get(&name)
        .ok_or_else(|| ApiError::not_found(format!("no agent `{name}`")))?;
    let mut request: RunRequest = body.parse()?;
    let context = request.context.take().unwrap_or_default();
    check_context_names(&context)?;
    check_inputs(&name, &agent, &context)?;
    check_request(&request)?;
    let queued = QueuedRun {
        run: run_record(&state, &agent, &request, &context)?,
        agent: name,
        idempotency_key: request.idempotency_key,
        traceparent: traceparent(&headers),
    };
    let id = enqueue(&state, queued).await?;
    if query.wait
        && let Some(entry) = wait_for_end(&state, &id).await?
    {
        return Ok((StatusCode::OK, Json(RunView::of(entry))).into_response());
    }
    accepted(&state, id).await
}

/// 422 when `context` lacks an input the agent declares.
fn check_inputs(
    name: &str,
    agent: &Agent,
    context: &Map<String, JsonValue>,
) -> Result<(), ApiError> {
    let missing = agent.missing_inputs(context);
    if missing.is_empty() {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "missing_inputs",
        format!(
            "agent `{name}` needs these inputs in `context`: {}",
            missing.join(", ")
        ),
    ))
}

/// 400 for an idempotency key of the wrong length, or a zero step cap or timeout.
fn check_request(request: &RunRequest) -> Result<(), ApiError> {
    if let Some(key) = &request.idempotency_key
        && (key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY)
    {
        return Err(ApiError::bad_request(format!(
            "idempotency_key must be 1 to {MAX_IDEMPOTENCY_KEY} bytes"
        )));
    }
    if request.max_steps == Some(0) || request.timeout_ms == Some(0) {
        return Err(ApiError::bad_request(
            "max_steps and timeout_ms must be at least 1",
        ));
    }
    Ok(())
}

/// The stored form of a new run of `agent` with the request's options and `context`.
fn run_record(
    state: &AppState,
    agent: &Agent,
    request: &RunRequest,
    context: &Map<String, JsonValue>,
) -> Result<NewRun, ApiError> {
    let options = RunOptions {
        timeout: Duration::from_millis(request.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS)),
        max_runs: request.max_runs,
        max_steps: request.max_steps.unwrap_or(aplc_vm::DEFAULT_MAX_STEPS),
        agents: served_agents(state, agent),
        ..RunOptions::default()
    }
    .with_context_json(context);
    let run = NewDurableRun {
        id: durable::new_run_id(),
        program: agent.program.clone(),
        options,
    };
    let equipment = &state.equipment;
    durable::new_run_record(&run, &equipment.toolbox, &equipment.durable)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))
}

/// The agents a run of `agent` may call by a name its bundle does not link: the served
/// directory's, as they are now (its stored bundle links them, `spec/agents.md` §2); none
/// for an agent that calls none (it stores only its own bundle).
fn served_agents(state: &AppState, agent: &Agent) -> std::sync::Arc<aplc_vm::AgentTable> {
    served_agents_of(&state.agents, &state.equipment, agent)
}

/// [`served_agents`], from the directory and the equipment (`aplc mcp` has no state).
pub(crate) fn served_agents_of(
    agents: &crate::agents::Agents,
    equipment: &crate::equip::Equipment,
    agent: &Agent,
) -> std::sync::Arc<aplc_vm::AgentTable> {
    if agent.program.may_call_agents() || equipment.toolbox.registry().has_agent_tools() {
        agents.table()
    } else {
        std::sync::Arc::default()
    }
}

/// The W3C trace context the request carries, if it is plausible (at most 256 bytes).
fn traceparent(headers: &HeaderMap) -> Option<String> {
    headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.len() <= 256)
        .map(str::to_string)
}

/// Queues the run (or finds the one its idempotency key started) and wakes a worker for
/// a new one; the run's id.
async fn enqueue(state: &AppState, queued: QueuedRun) -> Result<String, ApiError> {
    let agent = queued.agent.clone();
    let enqueued = state.store.enqueue(queued).await.map_err(ApiError::store)?;
    let id = enqueued.id().to_string();
    match &enqueued {
        Enqueued::New(_) => {
            tracing::info!(run_id = %id, agent = %agent, "run queued");
            state.work.queued();
        }
        Enqueued::Existing(_) => {
            tracing::info!(run_id = %id, agent = %agent, "idempotency key: existing run");
        }
    }
    Ok(id)
}

/// 422 for a `context` entry a run cannot set (`context_history`, a reserved variable, a
/// helper's name): the run would end failed before its first step, so it is not queued.
/// The rule is the VM's own ([`aplc_vm::names::check_settable`]).
fn check_context_names(context: &Map<String, JsonValue>) -> Result<(), ApiError> {
    match crate::agents::unsettable(context) {
        Some(problem) => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_context",
            problem,
        )),
        None => Ok(()),
    }
}

/// `202 {"run_id", "status"}`: the run's status as the store has it now.
async fn accepted(state: &AppState, id: String) -> Result<Response, ApiError> {
    let entry = state
        .store
        .queue_entry(&id)
        .await
        .map_err(ApiError::store)?;
    let accepted = Accepted {
        run_id: id,
        status: entry.status.as_str().to_string(),
    };
    Ok((StatusCode::ACCEPTED, Json(accepted)).into_response())
}

/// The default run timeout: `aplc run`'s.
pub(crate) const DEFAULT_TIMEOUT_MS: u64 = 120_000;

/// The run once it has ended, or `None` at the wait limit (or shutdown).
async fn wait_for_end(state: &AppState, id: &str) -> Result<Option<QueueEntry>, ApiError> {
    let deadline = tokio::time::Instant::now() + state.wait_limit;
    let mut stop = state.stop.clone();
    let watch = state.live.watch_end(id);
    loop {
        // Created before the read, so an end between the two is not missed.
        let finished = watch.ended();
        let entry = state.store.queue_entry(id).await.map_err(ApiError::store)?;
        if entry.status.is_final() {
            return Ok(Some(entry));
        }
        tokio::select! {
            () = finished => {}
            // For a run another process executes: twice as often as an idle worker
            // looks for new runs (250 ms by default).
            () = tokio::time::sleep(state.store_poll / 2) => {}
            () = tokio::time::sleep_until(deadline) => return Ok(None),
            _ = stop.wait_for(|stop| *stop) => return Ok(None),
        }
    }
}

/// A run.
#[derive(Debug, Serialize, ToSchema)]
struct RunView {
    run_id: String,
    agent: String,
    /// `queued`, `running`, `completed`, `failed` or `cancelled`.
    status: String,
    bundle_hash: String,
    cancel_requested: bool,
    created_at_ms: i64,
    updated_at_ms: i64,
    totals: Totals,
    /// The run error (`{kind, message, step}`), once failed or cancelled.
    #[schema(value_type = Object)]
    error: JsonValue,
    /// The `errors` of the last step, once ended.
    last_step_errors: Vec<String>,
    /// The final context (without `context_history`), once ended.
    #[schema(value_type = Object)]
    context: JsonValue,
    /// The requests a waiting run waits on (spec/human.md §2).
    #[schema(value_type = Vec<Object>)]
    pending: Vec<JsonValue>,
}

/// A run's totals.
#[derive(Debug, Serialize, ToSchema)]
struct Totals {
    steps: u64,
    events: u64,
}

impl RunView {
    fn of(entry: QueueEntry) -> RunView {
        let outcome = entry.summary.outcome.unwrap_or(JsonValue::Null);
        let field = |name: &str| outcome.get(name).cloned().unwrap_or(JsonValue::Null);
        RunView {
            run_id: entry.summary.id,
            agent: entry.agent,
            status: entry.status.as_str().to_string(),
            bundle_hash: entry.summary.bundle_hash,
            cancel_requested: entry.cancel_requested,
            created_at_ms: entry.summary.started_at_ms,
            updated_at_ms: entry.summary.updated_at_ms,
            totals: Totals {
                steps: entry.summary.steps,
                events: entry.summary.events,
            },
            error: field("error"),
            last_step_errors: serde_json::from_value(field("last_step_errors")).unwrap_or_default(),
            context: field("context"),
            pending: entry.summary.pending.into_iter().map(shown).collect(),
        }
    }
}

/// A stored request as the API shows it: without the store's own fields.
pub(crate) fn shown(mut request: JsonValue) -> JsonValue {
    if let JsonValue::Object(map) = &mut request {
        map.remove("requested_at_ms");
        map.remove("expires_at_ms");
    }
    request
}

/// Returns a run.
#[utoipa::path(get, path = "/v1/runs/{id}", security(("bearer" = [])),
    params(("id" = String, Path, description = "The run id")),
    responses((status = 200, body = RunView), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn get_run(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<RunView>, ApiError> {
    let entry = state
        .store
        .queue_entry(&id)
        .await
        .map_err(ApiError::store)?;
    Ok(Json(RunView::of(entry)))
}

/// The run's events as Server-Sent Events: each `data` is one event object
/// (spec/events.md), its SSE `id` the event's `seq`.
#[utoipa::path(get, path = "/v1/runs/{id}/events", security(("bearer" = [])),
    params(("id" = String, Path, description = "The run id"),
           ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this event")),
    responses((status = 200, description = "text/event-stream until the run ends", content_type = "text/event-stream", body = String),
              (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn run_events(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let after = match headers.get("last-event-id") {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| ApiError::bad_request("Last-Event-ID must be an event's seq"))?,
        ),
    };
    state
        .store
        .queue_entry(&id)
        .await
        .map_err(ApiError::store)?;
    let stream = crate::events::stream(state, id, after);
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// Cancels a run wherever it executes; it ends as cancelled at its next boundary.
#[utoipa::path(post, path = "/v1/runs/{id}/cancel", security(("bearer" = [])),
    params(("id" = String, Path, description = "The run id")),
    responses((status = 202, body = Accepted), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn cancel(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let entry = state
        .store
        .queue_entry(&id)
        .await
        .map_err(ApiError::store)?;
    if !entry.status.is_final() {
        state
            .store
            .request_cancel(&id)
            .await
            .map_err(ApiError::store)?;
        if state.live.cancel(&id) {
            tracing::info!(run_id = %id, "cancel: run interrupted here");
        } else {
            tracing::info!(run_id = %id, "cancel requested");
        }
    }
    accepted(&state, id).await
}

/// Prometheus metrics.
#[utoipa::path(get, path = "/metrics", security(("bearer" = [])),
    responses((status = 200, description = "Prometheus text format", content_type = "text/plain", body = String)))]
async fn metrics(State(state): State<AppState>) -> Response {
    let counts = match state.store.queue_counts().await {
        Ok(counts) => Some(counts),
        Err(e) => {
            tracing::error!(error = %e, "metrics: the store did not answer");
            None
        }
    };
    let mut text = state.metrics.render(counts.as_ref());
    crate::metrics::render_mcp(&mut text, &state.mcp.health());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", security(("bearer" = [])),
    responses((status = 200, description = "The OpenAPI document", body = Object)))]
async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}

/// The OpenAPI document: every route above, from its annotation.
#[derive(OpenApi)]
#[openapi(
    info(title = "aplc serve", description = "Hosts APL agents: queued durable runs, live events."),
    paths(healthz, list_agents, submit, get_run, run_events, cancel, crate::input::answer_input, metrics, openapi),
    components(schemas(ErrorBody, ErrorDetail, AgentList, AgentView, RunRequest, Accepted, RunView, Totals, crate::input::InputAccepted)),
    modifiers(&BearerAuth),
)]
pub(crate) struct ApiDoc;

/// Declares the `bearer` security scheme the paths refer to.
struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The run request of a body, as `submit` reads it.
    fn run_request(body: &[u8]) -> Result<RunRequest, ApiError> {
        crate::extract::json_object(body)
    }

    fn refused(body: &str) -> String {
        match run_request(body.as_bytes()) {
            Ok(_) => panic!("{body} was read as a run request"),
            Err(e) => e.message().to_string(),
        }
    }
    #[test]
    fn only_a_json_object_is_a_run_request() {
        assert!(run_request(br#" {"context": {"a": 1}} "#).is_ok());
        for body in ["", "  ", "[]", "1", "null", r#"[{"context": {}}]"#] {
            assert!(refused(body).contains("must be a JSON object"), "{body}");
        }
        // Invalid JSON gets the parser's words, wherever it starts.
        for body in ["[", "{", "{\"context\": }"] {
            assert!(refused(body).starts_with("invalid body: "), "{body}");
        }
        // A key given twice is refused, not silently replaced by its second value.
        let twice = refused(r#"{"context": {"a": 1}, "context": {"a": 2}}"#);
        assert!(twice.contains("duplicate field `context`"), "{twice}");
    }
}

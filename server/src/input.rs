//! `POST /v1/runs/{id}/input`: a person's answer to a request a waiting run made
//! (spec/human.md §4.2). The answer is checked against the request (kind, schema) and
//! stored in the run's store, which keeps the first answer per request; once every
//! request has one, the run is claimable again and this process's dispatcher is woken.

use aplc_runtime::human::{Pending, answer_json, now_ms, reply_from_json};
use aplc_runtime::store::{Answered, RunState};
use aplc_vm::human::HumanAnswer;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Map, Value as JsonValue};
use sha2::{Digest, Sha256};
use utoipa::ToSchema;

use crate::error::{ApiError, ErrorBody};
use crate::extract::JsonBody;
use crate::state::AppState;

/// The keys an answer's body may have.
const KEYS: [&str; 4] = ["id", "value", "approve", "reason"];

/// What an accepted answer leaves.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct InputAccepted {
    accepted: bool,
    /// The ids of the run's requests still without an answer.
    pending: Vec<String>,
}

/// Answers a request of a waiting run: `{"id", "value"}` or `{"id", "approve", "reason"?}`.
#[utoipa::path(post, path = "/v1/runs/{id}/input", security(("bearer" = [])),
    params(("id" = String, Path, description = "The run id")),
    request_body(content = Object, description = "`{\"id\", \"value\"}` or `{\"id\", \"approve\", \"reason\"?}`"),
    responses(
        (status = 200, description = "Stored; the requests still unanswered", body = InputAccepted),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, description = "No such run, or no such request in it", body = ErrorBody),
        (status = 409, description = "The request has an answer already, or the run is finished", body = ErrorBody),
        (status = 413, description = "The body, or the answer's JSON, is too large", body = ErrorBody),
        (status = 422, description = "The answer does not fit the request (its kind or schema)", body = ErrorBody),
    ))]
pub(crate) async fn answer_input(
    State(state): State<AppState>,
    Path(run_id): Path<String>,
    headers: HeaderMap,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let body: Map<String, JsonValue> = body.parse()?;
    let (request_id, reply) = read_answer(&body)?;
    let summary = state
        .store
        .summary(&run_id)
        .await
        .map_err(ApiError::store)?;
    if summary.state == RunState::Finished {
        return Err(finished(&run_id));
    }
    let request = summary
        .pending
        .iter()
        .filter_map(Pending::from_json)
        .find(|p| p.request.id == request_id);
    // A request no longer pending is asked of the store all the same: it says whether it
    // was answered (409) or never asked (404), and stores nothing either way.
    if let Some(request) = &request {
        (request.request.check(&reply)).map_err(|message| {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_answer", message)
        })?;
    }
    let answer = HumanAnswer {
        id: request_id.clone(),
        reply,
        by: answerer(&headers),
        answered_at_ms: now_ms(),
    };
    let answered = state
        .store
        .answer(&run_id, &request_id, answer_json(&answer))
        .await
        .map_err(ApiError::store)?;
    match answered {
        Answered::Accepted { unanswered } => {
            tracing::info!(run_id = %run_id, request = %request_id, by = %answer.by, "input received");
            if unanswered.is_empty() {
                // The run is claimable again: a worker here takes it at once.
                state.work.queued();
            }
            let accepted = InputAccepted {
                accepted: true,
                pending: unanswered,
            };
            Ok((StatusCode::OK, Json(accepted)).into_response())
        }
        Answered::UnknownRun => Err(ApiError::not_found(format!("no run `{run_id}`"))),
        Answered::UnknownRequest => Err(ApiError::not_found(format!(
            "run `{run_id}` waits for no request `{request_id}`"
        ))),
        Answered::AlreadyAnswered => Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_answered",
            format!("request `{request_id}` of run `{run_id}` is already answered"),
        )),
        Answered::Finished => Err(finished(&run_id)),
    }
}

fn finished(run_id: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "finished",
        format!("run `{run_id}` is finished: it takes no more answers"),
    )
}

/// The request id and the reply of an answer's body; 400 for anything else.
fn read_answer(body: &Map<String, JsonValue>) -> Result<(String, aplc_vm::human::Reply), ApiError> {
    if let Some(key) = body.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(ApiError::bad_request(format!(
            "unknown key `{}`: an answer has `id` and `value`, or `id`, `approve` and `reason`",
            aplc_vm::text::escape_control(key)
        )));
    }
    let id = match body.get("id") {
        Some(JsonValue::String(id)) if !id.is_empty() => id.clone(),
        _ => {
            return Err(ApiError::bad_request(
                "an answer needs `id`: the request's id",
            ));
        }
    };
    let mut reply = body.clone();
    reply.remove("id");
    let reply = reply_from_json(&JsonValue::Object(reply)).map_err(ApiError::bad_request)?;
    Ok((id, reply))
}

/// Who answered: the first 8 hex digits of the SHA-256 of the bearer token (the token
/// itself is a secret), so an audit can tell callers apart.
fn answerer(headers: &HeaderMap) -> String {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split_once(' '))
        .map(|(_, token)| token.trim())
        .unwrap_or_default();
    if token.is_empty() {
        return "anonymous".into();
    }
    let digest = Sha256::digest(token.as_bytes());
    digest.iter().take(4).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answers_read_or_say_why() {
        let body = |v: JsonValue| v.as_object().cloned().unwrap();
        let (id, reply) = read_answer(&body(
            json!({"id": "1-1", "approve": false, "reason": "no"}),
        ))
        .map_err(|e| e.message().to_string())
        .unwrap();
        assert_eq!(id, "1-1");
        assert!(matches!(
            reply,
            aplc_vm::human::Reply::Approve {
                approved: false,
                ..
            }
        ));
        let (_, reply) = read_answer(&body(json!({"id": "1-0", "value": null})))
            .ok()
            .unwrap();
        assert_eq!(reply, aplc_vm::human::Reply::Value(JsonValue::Null));
        for bad in [
            json!({"value": 1}),
            json!({"id": "1-0"}),
            json!({"id": "1-0", "value": 1, "aprove": true}),
            json!({"id": 3, "value": 1}),
            json!({"id": "1-0", "value": 1, "approve": true}),
        ] {
            assert!(read_answer(&body(bad)).is_err());
        }
    }

    #[test]
    fn the_answerer_is_a_digest_of_the_token_never_the_token() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            "Bearer s3cret-token".parse().unwrap(),
        );
        let by = answerer(&headers);
        assert_eq!(by.len(), 8);
        assert!(!by.contains("s3cret"));
        assert_eq!(answerer(&HeaderMap::new()), "anonymous");
    }
}

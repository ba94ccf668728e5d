//! The request extractors that turn a malformed request into the API's own errors, in
//! one place: the query string ([`ApiQuery`], 400) and the body ([`JsonBody`]: 408 past
//! the body timeout, 413 over the body limit, 400 when it is not the JSON object the
//! route takes).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::state::AppState;

/// A query string read as `T`; one that does not fit is 400.
pub(crate) struct ApiQuery<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(query)) => Ok(ApiQuery(query)),
            Err(e) => Err(ApiError::bad_request(e.body_text())),
        }
    }
}

/// A request body, read before the handler runs: within the server's body timeout (408:
/// a client that trickles a body must not hold a connection and a buffer for long) and up
/// to its body limit (413). The handler reads it as JSON with [`JsonBody::parse`] once
/// the checks that come first have passed (an unknown agent is 404 whatever its body).
pub(crate) struct JsonBody(Bytes);

impl FromRequest<AppState> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, ApiError> {
        let timeout = state.body_timeout;
        let read = tokio::time::timeout(timeout, Bytes::from_request(request, &())).await;
        let Ok(body) = read else {
            return Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                format!(
                    "the request body did not arrive within {} ms",
                    timeout.as_millis()
                ),
            ));
        };
        body.map(JsonBody).map_err(|e: BytesRejection| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    "the request body is over the server's limit",
                )
            } else {
                ApiError::bad_request(e.body_text())
            }
        })
    }
}

impl JsonBody {
    /// The body as `T`, a JSON object ([`json_object`]).
    pub(crate) fn parse<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        json_object(&self.0)
    }
}

/// `body` read as `T` if it is a JSON object, else 400. Only a body that starts as an
/// object is read: serde reads a struct from a JSON array too (its fields in order), so
/// `[]` would otherwise be a value with every field left out. The body is parsed once,
/// straight into `T` (no intermediate `Value` tree), which also refuses a top-level key
/// given twice (serde's `duplicate field`) instead of keeping the last.
pub(crate) fn json_object<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    // The one JSON body the API takes is a run request: the example is one.
    const SHAPE: &str = "the body must be a JSON object such as {\"context\": {}}";
    let invalid = |e: serde_json::Error| ApiError::bad_request(format!("invalid body: {e}"));
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => serde_json::from_slice(body).map_err(invalid),
        // Not an object: invalid JSON still gets the parser's words, valid JSON the shape.
        Some(_) => {
            serde_json::from_slice::<serde::de::IgnoredAny>(body).map_err(invalid)?;
            Err(ApiError::bad_request(SHAPE))
        }
        None => Err(ApiError::bad_request(SHAPE)),
    }
}

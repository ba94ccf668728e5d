//! [`ApiError`], the one error answer of the API, and its HTTP form: a status and
//! `{"error": {"code", "message"}}`.

use aplc_runtime::store::StoreError;
use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

/// The error body of every failed request.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ErrorBody {
    error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ErrorDetail {
    /// A stable, machine-readable code: `unauthorized`, `not_found`, `invalid_body`,
    /// `body_too_large`, `body_timeout`, `missing_inputs`, `invalid_context`, `store`.
    code: String,
    /// What happened, for people.
    message: String,
}

/// An error answer: a status and `{"error": {"code", "message"}}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    pub(crate) fn new(
        status: StatusCode,
        code: &'static str,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    pub(crate) fn unauthorized(message: &str) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_body", message)
    }

    pub(crate) fn store(error: StoreError) -> ApiError {
        match error {
            StoreError::NotFound(id) => ApiError::not_found(format!("no run `{id}`")),
            // What the request asked to store is over its limit (an answer with a
            // reason past `MAX_ANSWER_BYTES`, under a raised --max-body-bytes): the
            // client's to fix, not a failed store.
            StoreError::TooLarge(message) => {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", message)
            }
            error => {
                tracing::error!(error = %error, "store error");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store",
                    format!("the run store failed: {error}"),
                )
            }
        }
    }

    /// What happened, for people (tests read it).
    #[cfg(test)]
    pub(crate) fn message(&self) -> &str {
        &self.message
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_string(),
                message: self.message,
            },
        };
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if self.status == StatusCode::REQUEST_TIMEOUT {
            // The rest of the body may still come: the connection cannot be reused.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_limit_is_the_clients_413_and_a_failed_store_a_503() {
        let too_large = ApiError::store(StoreError::TooLarge("an answer of 2 MB".into()));
        assert_eq!(too_large.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(too_large.code, "body_too_large");
        let failed = ApiError::store(StoreError::Corrupt("bad row".into()));
        assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
    }
}

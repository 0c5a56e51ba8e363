//! The one place where domain errors become HTTP responses. Every error body is
//! `{"code": <status>, "message": "..."}` (`e2b-compat.md` §2.1: the SDKs read `code` from it).

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use warren_control::ControlError;

use crate::types::ErrorBody;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub retry_after: Option<Duration>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }
}

impl From<ControlError> for ApiError {
    fn from(e: ControlError) -> ApiError {
        let status = match &e {
            ControlError::NotFound(_) => StatusCode::NOT_FOUND,
            ControlError::InvalidArgument(_) => StatusCode::BAD_REQUEST,
            ControlError::Unauthenticated => StatusCode::UNAUTHORIZED,
            ControlError::PermissionDenied(_) => StatusCode::FORBIDDEN,
            ControlError::QuotaExceeded(_) => StatusCode::INSUFFICIENT_STORAGE,
            ControlError::ResourceExhausted { .. } => StatusCode::TOO_MANY_REQUESTS,
            ControlError::FailedPrecondition(_) => StatusCode::CONFLICT,
            ControlError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ControlError::Internal { .. } | ControlError::Store(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        let retry_after = match &e {
            ControlError::ResourceExhausted { retry_after, .. } => Some(*retry_after),
            _ => None,
        };
        let message = if status == StatusCode::INTERNAL_SERVER_ERROR {
            // Internal detail goes to the log, not to the client.
            tracing::error!(error = %warren_runtime::chain(&e), "internal error");
            "internal error".to_string()
        } else {
            e.to_string()
        };
        ApiError {
            status,
            message,
            retry_after,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            code: self.status.as_u16(),
            message: self.message,
        };
        let mut resp = (self.status, Json(body)).into_response();
        if let Some(after) = self.retry_after {
            // Whole seconds, at least 1: both SDKs only honour an integer Retry-After.
            let secs = after.as_secs_f64().ceil().max(1.0) as u64;
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                resp.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        resp
    }
}

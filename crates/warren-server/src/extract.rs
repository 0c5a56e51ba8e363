//! Extractors whose rejections are [`ApiError`]s, so malformed input gets the JSON error shape
//! and the right status (400; 413 for oversized bodies; 401 for keys).

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::AppState;

/// JSON body.
pub(crate) struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(ApiJson(v)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

fn json_rejection(r: JsonRejection) -> ApiError {
    let status = match &r {
        JsonRejection::MissingJsonContentType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        // Wrong types, missing fields and bad syntax are all the caller's malformed input.
        JsonRejection::JsonDataError(_) | JsonRejection::JsonSyntaxError(_) => {
            StatusCode::BAD_REQUEST
        }
        other => other.status(),
    };
    let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
        "request body is too large".to_string()
    } else {
        r.body_text()
    };
    ApiError::new(status, message)
}

/// JSON body that may be absent altogether (connect accepts no body as `{}`).
pub(crate) struct OptionalJson<T>(pub T);

impl<T: DeserializeOwned + Default, S: Send + Sync> FromRequest<S> for OptionalJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let empty = req
            .headers()
            .get(axum::http::header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() == b"0")
            || (!req.headers().contains_key(axum::http::header::CONTENT_TYPE)
                && !req
                    .headers()
                    .contains_key(axum::http::header::TRANSFER_ENCODING)
                && !req
                    .headers()
                    .contains_key(axum::http::header::CONTENT_LENGTH));
        if empty {
            return Ok(OptionalJson(T::default()));
        }
        ApiJson::<T>::from_request(req, state)
            .await
            .map(|ApiJson(v)| OptionalJson(v))
    }
}

/// A caller holding a valid API key (`X-API-KEY`).
pub(crate) struct Authed;

impl FromRequestParts<AppState> for Authed {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let key = parts
            .headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        state.control.authenticate(key).await?;
        Ok(Authed)
    }
}

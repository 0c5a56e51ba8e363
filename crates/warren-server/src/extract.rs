//! Extractors whose rejections are [`ApiError`]s, so malformed input gets the JSON error shape
//! and the right status (400; 413 for oversized bodies; 401 for keys).

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use warren_control::Tenant;

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

/// A caller holding a valid API key (`X-API-KEY`), and the control plane as that key sees it
/// (its team's sandboxes and snapshots only, unless it is an admin key).
pub(crate) struct Authed(pub Tenant);

impl FromRequestParts<AppState> for Authed {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let key = parts
            .headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let key = state.control.keys().authenticate(key).await?;
        Ok(Authed(state.control.tenant(&key)))
    }
}

/// Bodies up to this size are read to the end before an oversized request gets its 413.
const DRAIN_CAP: u64 = 64 * 1024 * 1024;

/// Answers 413 to an API request whose declared body is over the limit. For a caller with a
/// valid API key the body is read to the end first (up to [`DRAIN_CAP`]): answering while the
/// client is still sending would make the kernel reset the connection when it closes with
/// unread data, and the client would see a reset instead of the answer. A caller without one
/// gets its 401 at once and the connection is closed: nothing of the body is read for a
/// stranger.
pub(crate) async fn reject_oversized(
    axum::extract::State((state, limit)): axum::extract::State<(AppState, usize)>,
    req: Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    use http_body_util::BodyExt;
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(len) if len > limit as u64 => {
            let key = req
                .headers()
                .get("x-api-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            if let Err(e) = state.control.keys().authenticate(key).await {
                let mut resp = ApiError::from(e).into_response();
                resp.headers_mut().insert(
                    axum::http::header::CONNECTION,
                    axum::http::HeaderValue::from_static("close"),
                );
                return resp;
            }
            if len <= DRAIN_CAP {
                let mut body = req.into_body();
                while let Some(frame) = body.frame().await {
                    if frame.is_err() {
                        break;
                    }
                }
            }
            ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "request body is too large")
                .into_response()
        }
        _ => next.run(req).await,
    }
}

//! `GET /metrics`: the server's numbers for Prometheus (OpenMetrics text), for admin keys.
//!
//! A scraper sends the key as `Authorization: Bearer <key>` (Prometheus's `authorization`
//! scrape setting) or as `X-API-KEY`; a team's key gets 403: the numbers are host-wide.

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::AppState;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

fn key_of(headers: &HeaderMap) -> &str {
    if let Some(k) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return k;
    }
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or_default()
}

/// Sandboxes by state, operation latencies and errors, limits (and, with
/// `--metrics-per-sandbox`, each running sandbox's CPU, memory and disk).
#[utoipa::path(
    get, path = "/metrics",
    responses((status = 200, description = "OpenMetrics text", content_type = "application/openmetrics-text"),
              (status = 401, body = crate::types::ErrorBody),
              (status = 403, description = "Not an admin key", body = crate::types::ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn metrics(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let key = st.control.keys().authenticate(key_of(&headers)).await?;
    if !key.admin {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "the server's metrics are host-wide: they need an admin key, not a team's",
        ));
    }
    let text = st.control.prometheus_text().await?;
    let mut resp = text.into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(OPENMETRICS));
    Ok(resp)
}

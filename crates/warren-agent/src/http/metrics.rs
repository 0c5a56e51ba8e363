//! `GET /metrics`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

pub async fn metrics() -> Response {
    StatusCode::NOT_IMPLEMENTED.into_response()
}

//! `GET /files` and `POST /files`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

pub async fn download() -> Response {
    StatusCode::NOT_IMPLEMENTED.into_response()
}

pub async fn upload() -> Response {
    StatusCode::NOT_IMPLEMENTED.into_response()
}

//! Dispatch of `filesystem.Filesystem` RPCs.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};

use crate::connect::RpcError;
use crate::state::AppState;

pub async fn rpc(
    State(_state): State<AppState>,
    Path(method): Path<String>,
    _headers: HeaderMap,
    _body: Body,
) -> Response {
    RpcError::unimplemented(format!("filesystem.Filesystem/{method} is not implemented"))
        .into_response()
}

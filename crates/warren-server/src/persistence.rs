//! Handlers of pause, snapshots and fork (`e2b-compat.md` §2.2 #8-#12). Resume is connect.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use warren_control::SnapshotQuery;

use crate::error::ApiError;
use crate::extract::{Authed, OptionalJson};
use crate::types::{
    ErrorBody, ForkResultItem, ForkSandbox, NewSnapshot, PauseSandbox, SandboxCreated,
    SnapshotInfo, SnapshotListParams,
};
use crate::AppState;

type ApiResult<T> = Result<T, ApiError>;

/// Pauses a running sandbox; connect resumes it. Its open streams are cut.
#[utoipa::path(
    post, path = "/sandboxes/{sandboxID}/pause", request_body = PauseSandbox,
    params(("sandboxID" = String, Path)),
    responses(
        (status = 204, description = "Paused; everything it wrote is on disk"),
        (status = 400, description = "The runtime lacks this pause mode", body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "Already paused", body = ErrorBody),
        (status = 500, body = ErrorBody),
        (status = 503, description = "The pause failed; the sandbox keeps running", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn pause_sandbox(
    Authed(me): Authed,
    Path(id): Path<String>,
    OptionalJson(body): OptionalJson<PauseSandbox>,
) -> ApiResult<StatusCode> {
    me.pause(&id, body.memory).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Snapshots a running sandbox (it keeps running); the id works as `templateID` in create.
#[utoipa::path(
    post, path = "/sandboxes/{sandboxID}/snapshots", request_body = NewSnapshot,
    params(("sandboxID" = String, Path)),
    responses(
        (status = 201, description = "Snapshot taken", body = SnapshotInfo),
        (status = 400, description = "Bad name, or the runtime lacks this mode", body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "The sandbox is not running", body = ErrorBody),
        (status = 500, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn create_snapshot(
    Authed(me): Authed,
    Path(id): Path<String>,
    OptionalJson(body): OptionalJson<NewSnapshot>,
) -> ApiResult<impl IntoResponse> {
    let snap = me.create_snapshot(&id, body.name, body.memory).await?;
    Ok((StatusCode::CREATED, Json(SnapshotInfo::new(&snap))))
}

/// Lists snapshots, newest first; more pages are announced by `x-next-token`.
#[utoipa::path(
    get, path = "/snapshots", params(SnapshotListParams),
    responses(
        (status = 200, body = Vec<SnapshotInfo>,
         headers(("x-next-token" = String, description = "Cursor of the next page"))),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 500, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn list_snapshots(
    Authed(me): Authed,
    Query(p): Query<SnapshotListParams>,
) -> ApiResult<impl IntoResponse> {
    let query = SnapshotQuery {
        sandbox_id: p.sandbox_id.filter(|s| !s.is_empty()),
        name: p.name.filter(|s| !s.is_empty()),
        // The caller's scope decides this.
        team: None,
        limit: p
            .limit
            .as_deref()
            .map(|l| {
                l.parse::<u32>()
                    .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))
            })
            .transpose()?,
        next_token: p.next_token.filter(|t| !t.is_empty()),
    };
    let page = me.list_snapshots(&query).await?;
    let mut headers = HeaderMap::new();
    if let Some(token) = page.next_token {
        let value = HeaderValue::from_str(&token)
            .map_err(|_| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error"))?;
        headers.insert("x-next-token", value);
    }
    let items: Vec<SnapshotInfo> = page.items.iter().map(SnapshotInfo::new).collect();
    Ok((headers, Json(items)))
}

/// Forks a running sandbox into `count` children; each child succeeds or fails on its own.
#[utoipa::path(
    post, path = "/sandboxes/{sandboxID}/fork", request_body = ForkSandbox,
    params(("sandboxID" = String, Path)),
    responses(
        (status = 201, description = "One result per child", body = Vec<ForkResultItem>),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The sandbox is not running", body = ErrorBody),
        (status = 500, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn fork_sandbox(
    State(st): State<AppState>,
    Authed(me): Authed,
    Path(id): Path<String>,
    OptionalJson(body): OptionalJson<ForkSandbox>,
) -> ApiResult<impl IntoResponse> {
    let results = me.fork(&id, body.count, body.timeout).await?;
    let cfg = st.control.config();
    let items: Vec<ForkResultItem> = results
        .into_iter()
        .map(|r| match r {
            Ok(sb) => ForkResultItem {
                sandbox: Some(SandboxCreated::new(
                    &sb,
                    &cfg.envd_version,
                    cfg.domain.as_deref(),
                )),
                error: None,
            },
            Err(e) => {
                let e = ApiError::from(e);
                ForkResultItem {
                    sandbox: None,
                    error: Some(ErrorBody {
                        code: e.status.as_u16(),
                        message: e.message,
                    }),
                }
            }
        })
        .collect();
    Ok((StatusCode::CREATED, Json(items)))
}

//! The v1 forms of E2B's sandbox routes that older SDKs and the `e2b` CLI call (`e2b` Python
//! before 2.46 and JS before the v2 create, `@e2b/cli` 2.x). Each translates to the same
//! control-plane operation as its v2 form; `POST /sandboxes` and `POST /sandboxes/{id}/connect`
//! are the v2 handlers under their v1 paths (`lib.rs`).

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};
use warren_control::{parse_metadata_query, ListQuery, ListStates, SandboxState};

use crate::error::ApiError;
use crate::extract::{Authed, OptionalJson};
use crate::types::{ErrorBody, ListedSandbox, SandboxCreated};
use crate::AppState;

type ApiResult<T> = Result<T, ApiError>;

/// Query of the v1 list.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListV1Params {
    /// `k1=v1&k2=v2`, keys and values URL-encoded.
    pub metadata: Option<String>,
}

/// Lists the running sandboxes, all of them in one answer (v1 has no pages; `GET
/// /v2/sandboxes` does, and lists paused ones too).
#[utoipa::path(
    get, path = "/sandboxes", params(ListV1Params),
    responses((status = 200, body = Vec<ListedSandbox>), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn list_sandboxes_v1(
    State(st): State<AppState>,
    Authed(me): Authed,
    Query(p): Query<ListV1Params>,
) -> ApiResult<Json<Vec<ListedSandbox>>> {
    let mut query = ListQuery {
        team: None,
        states: ListStates {
            running: true,
            paused: false,
        },
        metadata: p
            .metadata
            .as_deref()
            .map(parse_metadata_query)
            .transpose()?
            .unwrap_or_default(),
        order: Default::default(),
        started_after: None,
        template: None,
        limit: None,
        next_token: None,
    };
    let version = &st.control.config().envd_version;
    let mut items = Vec::new();
    loop {
        let page = me.list(&query).await?;
        items.extend(page.items.iter().map(|s| ListedSandbox::new(s, version)));
        match page.next_token {
            Some(token) if !token.is_empty() => query.next_token = Some(token),
            _ => return Ok(Json(items)),
        }
    }
}

/// Request of `POST /sandboxes/{sandboxID}/resume`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResumeSandbox {
    /// Seconds the resumed sandbox lives (default 300).
    pub timeout: Option<i64>,
    /// Accepted for older SDKs; the sandbox keeps the lifecycle it was created with.
    #[allow(dead_code)]
    pub auto_pause: Option<bool>,
}

/// Resumes a paused sandbox (v1; `POST /v2/sandboxes/{id}/connect` also connects to a running
/// one). A running sandbox gives 409, as on E2B.
#[utoipa::path(
    post, path = "/sandboxes/{sandboxID}/resume", request_body = ResumeSandbox,
    params(("sandboxID" = String, Path)),
    responses(
        (status = 201, description = "Sandbox resumed", body = SandboxCreated),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The sandbox is already running", body = ErrorBody),
        (status = 503, description = "Resume failed; the sandbox stays paused", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn resume_sandbox(
    State(st): State<AppState>,
    Authed(me): Authed,
    Path(id): Path<String>,
    OptionalJson(body): OptionalJson<ResumeSandbox>,
) -> ApiResult<impl IntoResponse> {
    let current = me.get(&id).await?;
    if current.state == SandboxState::Running {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} is already running"),
        ));
    }
    let (sandbox, _) = me.connect(&id, body.timeout).await?;
    let cfg = st.control.config();
    Ok((
        StatusCode::CREATED,
        Json(SandboxCreated::new(
            &sandbox,
            &cfg.envd_version,
            cfg.domain.as_deref(),
        )),
    ))
}

/// Request of `POST /sandboxes/{sandboxID}/refreshes`.
#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct RefreshSandbox {
    /// Seconds the sandbox is kept alive from now at least (default 15; it never shortens).
    pub duration: Option<i64>,
}

/// Keeps a running sandbox alive for at least `duration` more seconds (older SDKs' keepalive).
#[utoipa::path(
    post, path = "/sandboxes/{sandboxID}/refreshes", request_body = RefreshSandbox,
    params(("sandboxID" = String, Path)),
    responses((status = 204, description = "Refreshed"), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn refresh_sandbox(
    Authed(me): Authed,
    Path(id): Path<String>,
    OptionalJson(body): OptionalJson<RefreshSandbox>,
) -> ApiResult<StatusCode> {
    let current = me.get(&id).await?;
    if current.state != SandboxState::Running {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("sandbox {id} is not running"),
        ));
    }
    me.connect(&id, Some(body.duration.unwrap_or(15))).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Creates a sandbox (v1: what `POST /v2/sandboxes` does; `secure` is accepted and every
/// sandbox's agent requires its token).
#[utoipa::path(
    post, path = "/sandboxes", request_body = crate::types::NewSandbox,
    responses(
        (status = 201, description = "Sandbox created", body = SandboxCreated),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, description = "Unknown template", body = ErrorBody),
        (status = 429, description = "Concurrency limit reached; see Retry-After", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn create_sandbox_v1(
    st: State<AppState>,
    me: Authed,
    body: crate::extract::ApiJson<crate::types::NewSandbox>,
) -> ApiResult<impl IntoResponse> {
    crate::routes::create_sandbox(st, me, body).await
}

/// Connects to a sandbox, resuming a paused one (v1 path of `POST /v2/sandboxes/{id}/connect`).
#[utoipa::path(
    post, path = "/sandboxes/{sandboxID}/connect", request_body = crate::types::ConnectSandbox,
    params(("sandboxID" = String, Path)),
    responses(
        (status = 200, description = "Sandbox was running", body = SandboxCreated),
        (status = 201, description = "Sandbox was resumed", body = SandboxCreated),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn connect_sandbox_v1(
    st: State<AppState>,
    me: Authed,
    id: Path<String>,
    body: OptionalJson<crate::types::ConnectSandbox>,
) -> ApiResult<impl IntoResponse> {
    crate::routes::connect_sandbox(st, me, id, body).await
}

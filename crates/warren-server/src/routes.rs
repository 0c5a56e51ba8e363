//! Handlers: extract, call one control-plane operation, map the result. Nothing else.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use chrono::DateTime;
use warren_control::{parse_metadata_query, CreateRequest, ListQuery, ListStates, Order};

use crate::error::ApiError;
use crate::extract::{ApiJson, Authed, OptionalJson};
use crate::types::{
    lifecycle_of, ConnectSandbox, ErrorBody, FlowEntry, FlowList, ListParams, ListedSandbox,
    MetricsParams, NetworkUpdateBody, NewSandbox, RuntimeInfo, SandboxCreated, SandboxDetail,
    SandboxMetric, SandboxesMetricsParams, SandboxesWithMetrics, SetTimeout,
};
use crate::AppState;

type ApiResult<T> = Result<T, ApiError>;

/// Liveness of the API server.
#[utoipa::path(get, path = "/health", responses((status = 200, description = "Healthy", body = String)))]
pub(crate) async fn health() -> &'static str {
    "Health check successful"
}

pub(crate) async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such route")
}

/// Creates a sandbox from a template.
#[utoipa::path(
    post, path = "/v2/sandboxes", request_body = NewSandbox,
    responses(
        (status = 201, description = "Sandbox created", body = SandboxCreated),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, description = "Unknown template", body = ErrorBody),
        (status = 413, body = ErrorBody),
        (status = 429, description = "Concurrency limit reached; see Retry-After", body = ErrorBody),
        (status = 500, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn create_sandbox(
    State(st): State<AppState>,
    Authed(me): Authed,
    ApiJson(body): ApiJson<NewSandbox>,
) -> ApiResult<impl IntoResponse> {
    let lifecycle = lifecycle_of(&body);
    let network = body
        .network
        .unwrap_or_default()
        .into_network(body.allow_internet_access)
        .map_err(ApiError::bad_request)?;
    let networks = body
        .networks
        .unwrap_or_default()
        .into_iter()
        .map(crate::networks::JoinSpec::into_join)
        .collect::<Result<Vec<_>, _>>()?;
    let volume_mounts = body
        .volume_mounts
        .unwrap_or_default()
        .into_iter()
        .map(crate::types::VolumeMountSpec::into_request)
        .collect();
    let sandbox = me
        .create(CreateRequest {
            networks,
            volume_mounts,
            template: body.template_id,
            timeout: body.timeout,
            metadata: body.metadata.unwrap_or_default(),
            env_vars: body.env_vars.unwrap_or_default(),
            allow_internet_access: body.allow_internet_access,
            lifecycle,
            network,
            // The caller's team is set by its scope.
            team: String::new(),
        })
        .await?;
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

/// Connects to a sandbox, extending its life to at least `timeout` seconds; a paused sandbox
/// is resumed (201).
#[utoipa::path(
    post, path = "/v2/sandboxes/{sandboxID}/connect", request_body = ConnectSandbox,
    params(("sandboxID" = String, Path)),
    responses(
        (status = 200, description = "Sandbox was running", body = SandboxCreated),
        (status = 201, description = "Sandbox was resumed", body = SandboxCreated),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 429, body = ErrorBody), (status = 500, body = ErrorBody),
        (status = 503, description = "Resume failed; the sandbox stays paused", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn connect_sandbox(
    State(st): State<AppState>,
    Authed(me): Authed,
    Path(id): Path<String>,
    OptionalJson(body): OptionalJson<ConnectSandbox>,
) -> ApiResult<impl IntoResponse> {
    let (sandbox, resumed) = me.connect(&id, body.timeout).await?;
    let cfg = st.control.config();
    let status = if resumed {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(SandboxCreated::new(
            &sandbox,
            &cfg.envd_version,
            cfg.domain.as_deref(),
        )),
    ))
}

/// Lists sandboxes; more pages are announced by a non-empty `x-next-token` header.
#[utoipa::path(
    get, path = "/v2/sandboxes", params(ListParams),
    responses(
        (status = 200, body = Vec<ListedSandbox>,
         headers(("x-next-token" = String, description = "Cursor of the next page"))),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn list_sandboxes(
    State(st): State<AppState>,
    Authed(me): Authed,
    Query(p): Query<ListParams>,
) -> ApiResult<impl IntoResponse> {
    let query = ListQuery {
        team: None,
        states: p
            .state
            .as_deref()
            .map(ListStates::parse)
            .transpose()?
            .unwrap_or_default(),
        metadata: p
            .metadata
            .as_deref()
            .map(parse_metadata_query)
            .transpose()?
            .unwrap_or_default(),
        order: p
            .order
            .as_deref()
            .map(Order::parse)
            .transpose()?
            .unwrap_or_default(),
        started_after: p
            .started_after
            .as_deref()
            .map(|s| {
                DateTime::parse_from_rfc3339(s)
                    .map(|t| t.to_utc())
                    .map_err(|_| {
                        ApiError::bad_request(format!("startedAfter is not RFC 3339: {s:?}"))
                    })
            })
            .transpose()?,
        template: p.template,
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
    let page = me.list(&query).await?;
    let version = &st.control.config().envd_version;
    let items: Vec<ListedSandbox> = page
        .items
        .iter()
        .map(|s| ListedSandbox::new(s, version))
        .collect();
    let mut headers = HeaderMap::new();
    if let Some(token) = page.next_token {
        let value = HeaderValue::from_str(&token)
            .map_err(|_| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error"))?;
        headers.insert("x-next-token", value);
    }
    Ok((headers, Json(items)))
}

/// One sandbox.
#[utoipa::path(
    get, path = "/sandboxes/{sandboxID}", params(("sandboxID" = String, Path)),
    responses((status = 200, body = SandboxDetail), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn get_sandbox(
    State(st): State<AppState>,
    Authed(me): Authed,
    Path(id): Path<String>,
) -> ApiResult<Json<SandboxDetail>> {
    let sandbox = me.get(&id).await?;
    let cfg = st.control.config();
    let (name, caps) = st.control.runtime_info();
    Ok(Json(SandboxDetail::new(
        &sandbox,
        &cfg.envd_version,
        cfg.domain.as_deref(),
        RuntimeInfo::new(name, caps),
    )))
}

/// Kills a sandbox; its open streams are cut.
#[utoipa::path(
    delete, path = "/sandboxes/{sandboxID}", params(("sandboxID" = String, Path)),
    responses((status = 204, description = "Killed"), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn kill_sandbox(
    Authed(me): Authed,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    me.kill(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Sets the sandbox's end time to now + `timeout` seconds (may shorten it).
#[utoipa::path(
    post, path = "/sandboxes/{sandboxID}/timeout", request_body = SetTimeout,
    params(("sandboxID" = String, Path)),
    responses((status = 204, description = "Timeout set"), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn set_timeout(
    Authed(me): Authed,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<SetTimeout>,
) -> ApiResult<StatusCode> {
    me.set_timeout(&id, body.timeout).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Replaces a sandbox's egress policy (an omitted list is cleared). A running sandbox gets it
/// at once, open connections it no longer allows included; a paused one when it resumes.
#[utoipa::path(
    put, path = "/sandboxes/{sandboxID}/network", request_body = NetworkUpdateBody,
    params(("sandboxID" = String, Path)),
    responses((status = 204, description = "Policy replaced"), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, description = "The sandbox is not running or paused", body = ErrorBody),
              (status = 503, description = "The policy is stored but could not be applied yet",
               body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn update_network(
    Authed(me): Authed,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<NetworkUpdateBody>,
) -> ApiResult<StatusCode> {
    let update = body.into_update().map_err(ApiError::bad_request)?;
    me.update_network(&id, update).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The sandbox's flow log: its egress policy's recent decisions about DNS queries and (with
/// rules by name) TCP connections, oldest first.
#[utoipa::path(
    get, path = "/sandboxes/{sandboxID}/network/flows",
    params(("sandboxID" = String, Path)),
    responses((status = 200, body = FlowList), (status = 401, body = ErrorBody),
              (status = 404, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn network_flows(
    Authed(me): Authed,
    Path(id): Path<String>,
) -> ApiResult<Json<FlowList>> {
    let flows = me.network_flows(&id).await?;
    Ok(Json(FlowList {
        flows: flows.into_iter().map(FlowEntry::from).collect(),
    }))
}

/// The sandbox's resource samples (every 5 s while it runs, kept an hour), oldest first;
/// `start`/`end` (unix seconds) narrow them to a window.
#[utoipa::path(
    get, path = "/sandboxes/{sandboxID}/metrics",
    params(("sandboxID" = String, Path), MetricsParams),
    responses((status = 200, body = Vec<SandboxMetric>), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn sandbox_metrics(
    Authed(me): Authed,
    Path(id): Path<String>,
    Query(q): Query<MetricsParams>,
) -> ApiResult<Json<Vec<SandboxMetric>>> {
    let start = seconds_param(q.start.as_deref(), "start")?;
    let end = seconds_param(q.end.as_deref(), "end")?;
    let points = me.metrics(&id, start, end).await?;
    Ok(Json(points.iter().map(SandboxMetric::from).collect()))
}

/// The newest sample of each named sandbox (`sandbox_ids=a,b`, at most 100); sandboxes that
/// are unknown, not yours or have no sample yet are left out.
#[utoipa::path(
    get, path = "/sandboxes/metrics", params(SandboxesMetricsParams),
    responses((status = 200, body = SandboxesWithMetrics), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn sandboxes_metrics(
    Authed(me): Authed,
    Query(q): Query<SandboxesMetricsParams>,
) -> ApiResult<Json<SandboxesWithMetrics>> {
    let ids: Vec<String> = q
        .sandbox_ids
        .as_deref()
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    if ids.len() > 100 {
        return Err(ApiError::bad_request(format!(
            "sandbox_ids names {} sandboxes; at most 100",
            ids.len()
        )));
    }
    let latest = me.latest_metrics(&ids).await?;
    Ok(Json(SandboxesWithMetrics {
        sandboxes: latest
            .iter()
            .map(|(id, p)| (id.clone(), SandboxMetric::from(p)))
            .collect(),
    }))
}

fn seconds_param(v: Option<&str>, name: &str) -> Result<Option<i64>, ApiError> {
    v.map(|s| {
        s.trim().parse::<i64>().map_err(|_| {
            ApiError::bad_request(format!(
                "{name} must be unix seconds (an integer), not {s:?}"
            ))
        })
    })
    .transpose()
}

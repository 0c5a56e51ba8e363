//! Template build handlers (E2B's v2 builder protocol, `e2b-compat-wave2.md` §1): extract,
//! call one control-plane operation, map the result.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use futures::TryStreamExt;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use warren_control::{
    Build, BuildRequest, BuildSource, BuildSpec, LogEntry, RawStep, RegistryAuth, Template,
};

use crate::error::ApiError;
use crate::extract::{ApiJson, Authed};
use crate::types::ErrorBody;
use crate::AppState;

type ApiResult<T> = Result<T, ApiError>;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NewBuild {
    name: Option<String>,
    /// Deprecated spelling of `name`.
    alias: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
    cpu_count: Option<u32>,
    #[serde(rename = "memoryMB")]
    memory_mb: Option<u32>,
    min_free_disk_mb: Option<u32>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct Registered {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "buildID")]
    build_id: String,
    public: bool,
    names: Vec<String>,
    tags: Vec<String>,
    aliases: Vec<String>,
}

fn names_of(t: &Template) -> Vec<String> {
    t.alias.iter().map(|a| format!("{}/{a}", t.team)).collect()
}

/// `POST /v3/templates`: registers a build (202, exactly, as the Python SDK demands).
#[utoipa::path(
    post, path = "/v3/templates", request_body = NewBuild,
    responses((status = 202, description = "Build registered", body = Registered),
              (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 409, description = "The name is another team's", body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn register_build(
    Authed(me): Authed,
    ApiJson(body): ApiJson<NewBuild>,
) -> ApiResult<impl IntoResponse> {
    let name = body.name.or(body.alias).unwrap_or_default();
    let r = me
        .register_build(BuildRequest {
            name,
            tags: body.tags,
            cpu_count: body.cpu_count,
            memory_mb: body.memory_mb,
            min_free_disk_mb: body.min_free_disk_mb,
        })
        .await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(Registered {
            names: names_of(&r.template),
            aliases: r.template.alias.iter().cloned().collect(),
            template_id: r.template.id,
            build_id: r.build_id,
            public: r.template.public,
            tags: r.tags,
        }),
    ))
}

#[derive(Debug, Serialize, ToSchema)]
struct UploadLink {
    present: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<String>,
}

/// The absolute base URL the caller reached us at (upload URLs must be absolute).
fn base_url(headers: &HeaderMap) -> String {
    let host = headers
        .get("x-forwarded-host")
        .or_else(|| headers.get(axum::http::header::HOST))
        .and_then(|v| v.to_str().ok())
        .unwrap_or("localhost");
    let scheme = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .filter(|s| *s == "https" || *s == "http")
        .unwrap_or("http");
    format!("{scheme}://{host}")
}

/// `GET /templates/{templateID}/files/{hash}`: whether a COPY's files are here (201).
#[utoipa::path(
    get, path = "/templates/{templateID}/files/{hash}",
    params(("templateID" = String, Path), ("hash" = String, Path, description = "SHA-256, 64 lowercase hex digits")),
    responses((status = 201, description = "Whether the files are here, and where to upload them", body = UploadLink),
              (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn upload_link(
    Authed(me): Authed,
    headers: HeaderMap,
    Path((template_id, hash)): Path<(String, String)>,
) -> ApiResult<impl IntoResponse> {
    let link = me.upload_link(&template_id, &hash).await?;
    Ok((
        StatusCode::CREATED,
        Json(UploadLink {
            present: link.present,
            url: link
                .path_and_query
                .map(|p| format!("{}{p}", base_url(&headers))),
        }),
    ))
}

#[derive(Debug, Deserialize, IntoParams)]
pub(crate) struct UploadQuery {
    team: String,
    expires: i64,
    token: String,
}

/// `PUT /templates/{templateID}/files/{hash}/upload?team=&expires=&token=`: the upload itself.
/// It carries no API key: the signed query authenticates it.
#[utoipa::path(
    put, path = "/templates/{templateID}/files/{hash}/upload",
    params(("templateID" = String, Path), ("hash" = String, Path), UploadQuery),
    request_body(content = Vec<u8>, description = "A tar archive, gzip-compressed or not", content_type = "application/octet-stream"),
    responses((status = 200, description = "Stored"), (status = 400, body = ErrorBody),
              (status = 403, description = "Invalid or expired URL", body = ErrorBody),
              (status = 413, body = ErrorBody))
)]
pub(crate) async fn upload_files(
    State(st): State<AppState>,
    Path((template_id, hash)): Path<(String, String)>,
    query: Result<Query<UploadQuery>, axum::extract::rejection::QueryRejection>,
    body: Body,
) -> ApiResult<StatusCode> {
    let Query(q) = query.map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "the upload URL lacks team, expires or token",
        )
    })?;
    let stream = body
        .into_data_stream()
        .map_err(|e| std::io::Error::other(e.to_string()));
    let reader = tokio_util::io::StreamReader::new(stream);
    st.control
        .accept_upload(
            &template_id,
            &hash,
            &q.team,
            q.expires,
            &q.token,
            Box::new(reader),
        )
        .await?;
    Ok(StatusCode::OK)
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WireStep {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    force: bool,
    files_hash: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
enum WireRegistry {
    Registry {
        username: String,
        password: String,
    },
    Aws {
        #[serde(rename = "awsAccessKeyId")]
        access_key_id: String,
        #[serde(rename = "awsSecretAccessKey")]
        secret_access_key: String,
        #[serde(rename = "awsRegion")]
        region: String,
    },
    Gcp {
        #[serde(rename = "serviceAccountJson")]
        service_account_json: String,
    },
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StartBuild {
    steps: Option<Vec<WireStep>>,
    #[serde(default)]
    force: bool,
    from_image: Option<String>,
    from_template: Option<String>,
    from_image_registry: Option<WireRegistry>,
    start_cmd: Option<String>,
    ready_cmd: Option<String>,
    /// Warren's extension: a Dockerfile the server parses and builds (multi-stage included),
    /// instead of `steps` and `fromImage`/`fromTemplate`. A start or ready command given next
    /// to it replaces the Dockerfile's (CMD/ENTRYPOINT, HEALTHCHECK).
    dockerfile: Option<String>,
    /// The build context that the Dockerfile's COPY and ADD read: one tar of it, uploaded
    /// like a COPY's files (`GET /templates/{templateID}/files/{hash}`, then the PUT).
    context_files_hash: Option<String>,
    /// Values for the Dockerfile's ARGs (`--build-arg`).
    #[serde(default)]
    build_args: std::collections::HashMap<String, String>,
}

impl StartBuild {
    /// A Dockerfile build: nothing else may say where the build starts or what it runs.
    fn dockerfile_spec(self, text: String) -> Result<BuildSpec, ApiError> {
        let conflicts: Vec<&str> = [
            ("steps", self.steps.is_some()),
            ("fromImage", self.from_image.is_some()),
            ("fromTemplate", self.from_template.is_some()),
            ("fromImageRegistry", self.from_image_registry.is_some()),
        ]
        .into_iter()
        .filter_map(|(k, set)| set.then_some(k))
        .collect();
        if !conflicts.is_empty() {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "dockerfile conflicts with {}: the Dockerfile says where the build starts and what it runs",
                    conflicts.join(", ")
                ),
            ));
        }
        let mut spec = warren_control::dockerfile_build(
            &text,
            self.context_files_hash.as_deref(),
            &self.build_args,
            self.force,
        )?;
        if let Some(c) = self.start_cmd.filter(|c| !c.trim().is_empty()) {
            spec.start_cmd = Some(c);
        }
        if let Some(c) = self.ready_cmd.filter(|c| !c.trim().is_empty()) {
            spec.ready_cmd = Some(c);
        }
        Ok(spec)
    }

    fn into_spec(mut self) -> Result<BuildSpec, ApiError> {
        let bad = |m: &str| ApiError::new(StatusCode::BAD_REQUEST, m);
        if let Some(text) = self.dockerfile.take() {
            return self.dockerfile_spec(text);
        }
        if self.context_files_hash.is_some() || !self.build_args.is_empty() {
            return Err(bad("contextFilesHash and buildArgs go with dockerfile"));
        }
        let registry = self.from_image_registry.map(|r| match r {
            WireRegistry::Registry { username, password } => {
                RegistryAuth::Basic { username, password }
            }
            WireRegistry::Aws {
                access_key_id,
                secret_access_key,
                region,
            } => RegistryAuth::Aws {
                access_key_id,
                secret_access_key,
                region,
            },
            WireRegistry::Gcp {
                service_account_json,
            } => RegistryAuth::Gcp {
                service_account_json,
            },
        });
        let source = match (self.from_template, self.from_image) {
            (Some(t), None) if !t.trim().is_empty() => BuildSource::Template(t),
            (None, Some(i)) if !i.trim().is_empty() => BuildSource::Image {
                reference: i.trim().to_string(),
                registry,
            },
            (Some(_), Some(_)) => return Err(bad("give fromImage or fromTemplate, not both")),
            _ => return Err(bad("fromImage or fromTemplate is required")),
        };
        let wire_steps = self.steps.unwrap_or_default();
        let mut steps = Vec::with_capacity(wire_steps.len());
        for (i, s) in wire_steps.into_iter().enumerate() {
            let raw = RawStep {
                kind: s.kind,
                args: s.args,
                force: s.force,
                files_hash: s.files_hash,
            };
            steps.push(
                raw.parse(i + 1)
                    .map_err(warren_control::ControlError::from)?,
            );
        }
        Ok(BuildSpec {
            source,
            steps,
            force: self.force,
            start_cmd: self.start_cmd.filter(|c| !c.trim().is_empty()),
            ready_cmd: self.ready_cmd.filter(|c| !c.trim().is_empty()),
            stages: Vec::new(),
            notes: Vec::new(),
        })
    }
}

/// `POST /v2/templates/{templateID}/builds/{buildID}`: starts a registered build (202).
#[utoipa::path(
    post, path = "/v2/templates/{templateID}/builds/{buildID}", request_body = StartBuild,
    params(("templateID" = String, Path), ("buildID" = String, Path)),
    responses((status = 202, description = "Build started"), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn start_build(
    Authed(me): Authed,
    Path((template_id, build_id)): Path<(String, String)>,
    ApiJson(body): ApiJson<StartBuild>,
) -> ApiResult<StatusCode> {
    let spec = body.into_spec()?;
    me.start_build(&template_id, &build_id, spec).await?;
    Ok(StatusCode::ACCEPTED)
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StatusQuery {
    logs_offset: Option<usize>,
    limit: Option<usize>,
    level: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
struct WireLog {
    timestamp: String,
    message: String,
    #[schema(value_type = String)]
    level: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<String>,
}

fn wire_log(e: LogEntry) -> WireLog {
    WireLog {
        timestamp: e
            .timestamp
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        message: e.message,
        level: e.level.as_str(),
        step: e.step,
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct WireReason {
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<String>,
    log_entries: Vec<WireLog>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct BuildInfo {
    logs: Vec<String>,
    log_entries: Vec<WireLog>,
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "buildID")]
    build_id: String,
    #[schema(value_type = String)]
    status: &'static str,
    // Omitted, never null: the Python SDK cannot parse a null reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<WireReason>,
}

/// `GET /templates/{templateID}/builds/{buildID}/status?logsOffset=`: status and log page.
#[utoipa::path(
    get, path = "/templates/{templateID}/builds/{buildID}/status",
    params(("templateID" = String, Path), ("buildID" = String, Path), StatusQuery),
    responses((status = 200, description = "Status and a page of the log", body = BuildInfo),
              (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn build_status(
    Authed(me): Authed,
    Path((template_id, build_id)): Path<(String, String)>,
    Query(q): Query<StatusQuery>,
) -> ApiResult<impl IntoResponse> {
    let min_level = match q.level.as_deref() {
        None | Some("") => None,
        Some(l) => Some(warren_control::LogLevel::parse(l).ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "level must be debug, info, warn or error",
            )
        })?),
    };
    let page = me
        .build_status(&template_id, &build_id, q.logs_offset.unwrap_or(0), q.limit)
        .await?;
    let keep = |e: &LogEntry| min_level.is_none_or(|l| e.level >= l);
    let build = page.build;
    Ok(Json(BuildInfo {
        logs: Vec::new(),
        log_entries: page
            .entries
            .into_iter()
            .filter(keep)
            .map(wire_log)
            .collect(),
        template_id: build.template_id,
        build_id: build.id,
        status: build.status.as_str(),
        reason: build.reason.map(|r| WireReason {
            message: r.message,
            step: r.step,
            log_entries: page.reason_entries.into_iter().map(wire_log).collect(),
        }),
    }))
}

#[derive(Debug, Serialize, ToSchema)]
struct AliasInfo {
    #[serde(rename = "templateID")]
    template_id: String,
    public: bool,
}

/// `GET /templates/aliases/{alias}`: 200 for the caller's (or a public) template, 403 for
/// another team's, 404 when there is none (what `Template.exists` reads).
#[utoipa::path(
    get, path = "/templates/aliases/{alias}", params(("alias" = String, Path)),
    responses((status = 200, description = "The template of this name", body = AliasInfo),
              (status = 401, body = ErrorBody),
              (status = 403, description = "Another team's template", body = ErrorBody),
              (status = 404, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn alias_info(
    Authed(me): Authed,
    Path(alias): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let target = me.template_alias(&alias).await?;
    Ok(Json(AliasInfo {
        template_id: target.template_id,
        public: target.public,
    }))
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct ListedTemplate {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "buildID")]
    build_id: String,
    cpu_count: u32,
    #[serde(rename = "memoryMB")]
    memory_mb: u32,
    #[serde(rename = "diskSizeMB")]
    disk_size_mb: u32,
    public: bool,
    aliases: Vec<String>,
    names: Vec<String>,
    created_at: String,
    updated_at: String,
    #[schema(value_type = Option<Object>)]
    created_by: Option<serde_json::Value>,
    last_spawned_at: Option<String>,
    spawn_count: u64,
    build_count: u32,
    envd_version: String,
    #[schema(value_type = String)]
    build_status: &'static str,
}

fn listed(t: Template, latest: Option<Build>, envd: &str) -> ListedTemplate {
    let ts =
        |d: chrono::DateTime<chrono::Utc>| d.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    ListedTemplate {
        build_id: latest.as_ref().map(|b| b.id.clone()).unwrap_or_default(),
        build_status: latest.as_ref().map_or("waiting", |b| b.status.as_str()),
        names: names_of(&t),
        aliases: t.alias.iter().cloned().collect(),
        template_id: t.id,
        cpu_count: t.resources.cpu_count,
        memory_mb: t.resources.memory_mb,
        disk_size_mb: t.resources.disk_mb,
        public: t.public,
        created_at: ts(t.created_at),
        updated_at: ts(t.updated_at),
        created_by: None,
        last_spawned_at: t.last_spawned_at.map(ts),
        spawn_count: t.spawn_count,
        build_count: t.build_count,
        envd_version: envd.to_string(),
    }
}

/// `GET /templates`: the caller's templates (and public ones).
#[utoipa::path(
    get, path = "/templates",
    responses((status = 200, description = "Templates built here", body = Vec<ListedTemplate>),
              (status = 401, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn list_templates(
    State(st): State<AppState>,
    Authed(me): Authed,
) -> ApiResult<impl IntoResponse> {
    let envd = st.control.config().envd_version.clone();
    let mut out = Vec::new();
    for (t, latest) in me.templates().await? {
        out.push(listed(t, latest, &envd));
    }
    Ok(Json(out))
}

#[derive(Debug, Deserialize, ToSchema)]
pub(crate) struct Publish {
    public: bool,
}

/// `PATCH /v2/templates/{templateID}` (and v1): publishes or unpublishes.
#[utoipa::path(
    patch, path = "/v2/templates/{templateID}", request_body = Publish,
    params(("templateID" = String, Path)),
    responses((status = 200, description = "The template's names"), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn set_public(
    Authed(me): Authed,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<Publish>,
) -> ApiResult<impl IntoResponse> {
    let t = me.set_template_public(&id, body.public).await?;
    let mut out = BTreeMap::new();
    out.insert("names", names_of(&t));
    Ok(Json(out))
}

/// Deletes a snapshot (the SDKs delete snapshots through this route) or a template built
/// here (refused while sandboxes or snapshots use it).
#[utoipa::path(
    delete, path = "/templates/{templateID}", params(("templateID" = String, Path)),
    responses((status = 204, description = "Deleted"), (status = 401, body = ErrorBody),
              (status = 404, body = ErrorBody),
              (status = 409, description = "Sandboxes or snapshots use it", body = ErrorBody),
              (status = 500, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn delete_template(
    Authed(me): Authed,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    me.delete_snapshot_or_template(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

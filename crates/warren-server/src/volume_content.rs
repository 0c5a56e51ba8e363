//! E2B's volume content API (`/volumecontent/{volumeID}/dir|path|file`): read and write a
//! volume's files with no sandbox running. Authenticated by the volume's token
//! (`Authorization: Bearer`), not an API key. Errors are `{"code": "<status>", "message"}`:
//! this API's `code` is a string (its spec and the SDK's tests say so).
//!
//! Every filesystem access is `warren-volume`'s, confined beneath the volume's root, so a
//! symbolic link a sandbox left in the volume cannot lead the server anywhere else.

use std::sync::Arc;
use std::time::SystemTime;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, SecondsFormat, Utc};
use futures::TryStreamExt;
use serde::{Deserialize, Serialize};
use warren_control::ControlError;
use warren_volume::{Content, EntryKind, EntryStat, Owner, VolumeError};

use crate::AppState;

/// An error of this API, in its own shape.
pub(crate) struct ContentError {
    status: StatusCode,
    message: String,
}

impl ContentError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ContentError {
            status,
            message: message.into(),
        }
    }
}

#[derive(Serialize)]
struct ContentErrorBody {
    code: String,
    message: String,
}

impl IntoResponse for ContentError {
    fn into_response(self) -> Response {
        let body = ContentErrorBody {
            code: self.status.as_u16().to_string(),
            message: self.message,
        };
        (self.status, Json(body)).into_response()
    }
}

impl From<VolumeError> for ContentError {
    fn from(e: VolumeError) -> Self {
        let status = StatusCode::from_u16(e.kind().http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(error = %warren_runtime::chain(&e), "volume content operation failed");
            return ContentError::new(status, "internal error");
        }
        ContentError::new(status, e.to_string())
    }
}

impl From<ControlError> for ContentError {
    fn from(e: ControlError) -> Self {
        let api = crate::error::ApiError::from(e);
        ContentError::new(api.status, api.message)
    }
}

type Result<T> = std::result::Result<T, ContentError>;

/// `VolumeEntryStat`.
#[derive(Debug, Serialize, Deserialize)]
pub struct EntryInfo {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub path: String,
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: String,
    pub mtime: String,
    pub ctime: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

fn time(t: SystemTime) -> String {
    DateTime::<Utc>::from(t).to_rfc3339_opts(SecondsFormat::Millis, true)
}

impl From<EntryStat> for EntryInfo {
    fn from(s: EntryStat) -> Self {
        EntryInfo {
            name: s.name,
            kind: match s.kind {
                EntryKind::File => "file",
                EntryKind::Directory => "directory",
                EntryKind::Symlink => "symlink",
                EntryKind::Unknown => "unknown",
            }
            .to_string(),
            path: s.path,
            size: s.size,
            mode: s.mode,
            uid: s.uid,
            gid: s.gid,
            atime: time(s.atime),
            mtime: time(s.mtime),
            ctime: time(s.ctime),
            target: s.target,
        }
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct PathQuery {
    path: String,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ListQuery {
    path: String,
    depth: Option<u32>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct WriteQuery {
    path: String,
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
    #[serde(default)]
    force: bool,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct Metadata {
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
}

fn bad_query(e: axum::extract::rejection::QueryRejection) -> ContentError {
    ContentError::new(StatusCode::BAD_REQUEST, e.body_text())
}

/// The volume the request's bearer token opens, as [`Content`].
async fn open(st: &AppState, id: &str, headers: &HeaderMap) -> Result<Arc<Content>> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .ok_or_else(|| ContentError::new(StatusCode::UNAUTHORIZED, "missing volume token"))?;
    let host = crate::volumes::host(st).ok_or_else(|| {
        ContentError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "volumes are not enabled on this server",
        )
    })?;
    let volume = st.control.volume_by_token(id, token).await?;
    blocking(move || host.content(&volume.id).map(Arc::new)).await
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::result::Result<T, VolumeError> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ContentError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(ContentError::from)
}

fn owner(uid: Option<u32>, gid: Option<u32>, mode: Option<u32>) -> Owner {
    Owner { uid, gid, mode }
}

/// `GET /volumecontent/{id}/dir?path=&depth=`.
pub(crate) async fn list_dir(
    State(st): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    q: std::result::Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Vec<EntryInfo>>> {
    let Query(q) = q.map_err(bad_query)?;
    let c = open(&st, &id, &headers).await?;
    let depth = q.depth.unwrap_or(1).max(1);
    let entries = blocking(move || c.list(&q.path, depth)).await?;
    Ok(Json(entries.into_iter().map(EntryInfo::from).collect()))
}

/// `POST /volumecontent/{id}/dir?path=&uid=&gid=&mode=&force=` (`force`: make parents).
pub(crate) async fn make_dir(
    State(st): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    q: std::result::Result<Query<WriteQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<impl IntoResponse> {
    let Query(q) = q.map_err(bad_query)?;
    let c = open(&st, &id, &headers).await?;
    let o = owner(q.uid, q.gid, q.mode);
    let made = blocking(move || c.make_dir(&q.path, &o, q.force)).await?;
    Ok((StatusCode::CREATED, Json(EntryInfo::from(made))))
}

/// `GET /volumecontent/{id}/path?path=`.
pub(crate) async fn stat(
    State(st): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    q: std::result::Result<Query<PathQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<EntryInfo>> {
    let Query(q) = q.map_err(bad_query)?;
    let c = open(&st, &id, &headers).await?;
    Ok(Json(blocking(move || c.stat(&q.path)).await?.into()))
}

/// `PATCH /volumecontent/{id}/path?path=` with `{"uid"?, "gid"?, "mode"?}`.
pub(crate) async fn set_metadata(
    State(st): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    q: std::result::Result<Query<PathQuery>, axum::extract::rejection::QueryRejection>,
    body: axum::body::Bytes,
) -> Result<Json<EntryInfo>> {
    let Query(q) = q.map_err(bad_query)?;
    let m: Metadata = if body.is_empty() {
        Metadata::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            ContentError::new(StatusCode::BAD_REQUEST, format!("invalid metadata: {e}"))
        })?
    };
    let c = open(&st, &id, &headers).await?;
    let o = owner(m.uid, m.gid, m.mode);
    Ok(Json(
        blocking(move || c.set_metadata(&q.path, &o)).await?.into(),
    ))
}

/// `DELETE /volumecontent/{id}/path?path=` (recursive).
pub(crate) async fn remove(
    State(st): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    q: std::result::Result<Query<PathQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<StatusCode> {
    let Query(q) = q.map_err(bad_query)?;
    let c = open(&st, &id, &headers).await?;
    blocking(move || c.remove(&q.path)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /volumecontent/{id}/file?path=`: the file's bytes, streamed.
pub(crate) async fn read_file(
    State(st): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    q: std::result::Result<Query<PathQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response> {
    let Query(q) = q.map_err(bad_query)?;
    let c = open(&st, &id, &headers).await?;
    let (file, size) = blocking(move || c.open_file(&q.path)).await?;
    // Large reads: the default 4 KiB frames cost a download of 128 MiB over a second.
    let stream =
        tokio_util::io::ReaderStream::with_capacity(tokio::fs::File::from_std(file), 256 * 1024);
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, size.to_string()),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

/// `PUT /volumecontent/{id}/file?path=&uid=&gid=&mode=&force=` (`force`: overwrite); the
/// body is the content, streamed to disk and durable when this answers 201.
pub(crate) async fn write_file(
    State(st): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    q: std::result::Result<Query<WriteQuery>, axum::extract::rejection::QueryRejection>,
    body: Body,
) -> Result<impl IntoResponse> {
    let Query(q) = q.map_err(bad_query)?;
    let c = open(&st, &id, &headers).await?;
    let stream = body
        .into_data_stream()
        .map_err(|e| std::io::Error::other(e.to_string()));
    let reader = tokio_util::io::StreamReader::new(stream);
    let mut reader = tokio_util::io::SyncIoBridge::new(reader);
    let o = owner(q.uid, q.gid, q.mode);
    let made = blocking(move || c.write_file(&q.path, &o, q.force, &mut reader)).await?;
    Ok((StatusCode::CREATED, Json(EntryInfo::from(made))))
}

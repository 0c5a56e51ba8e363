//! Volumes, E2B's API (`/volumes`, authenticated by API key): create, list, get (with the
//! content-API token) and delete. The content API is in `volume_content`; the control plane's
//! disks on this host (`HostDisks`) are in `warren-adapters`.

use std::sync::Arc;

use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use warren_control::{QuotaRequest, Volume, VolumeUsage};
use warren_volume::VolumeHost;

use crate::error::ApiError;
use crate::extract::{ApiJson, Authed};
use crate::types::{rfc3339, ErrorBody};
use crate::AppState;

type ApiResult<T> = Result<T, ApiError>;

/// Body of `POST /volumes`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NewVolume {
    /// Letters, digits, `_` and `-`; unique in the team.
    pub name: String,
    /// Warren: the volume's quota (absent: the server's defaults).
    #[serde(default)]
    pub quota: Option<QuotaSpec>,
    /// Warren: start with the content of this volume snapshot (and its quota).
    #[serde(default)]
    pub from_snapshot: Option<String>,
}

/// Body of `PATCH /volumes/{volumeID}` (Warren's): a larger byte quota.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VolumeChange {
    pub quota: GrowSpec,
}

/// The new size of a volume.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GrowSpec {
    /// Bytes the volume may hold from now on: more than today, at most the server's maximum.
    pub bytes: u64,
}

/// A volume snapshot (Warren's `/v1/volumes/{volume}/snapshots`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotInfo {
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    #[serde(rename = "volumeID")]
    pub volume_id: String,
    pub volume_name: String,
    pub quota: QuotaInfo,
    /// Bytes it takes on the server's disk.
    pub size_bytes: u64,
    pub created_at: String,
}

impl VolumeSnapshotInfo {
    fn new(s: &warren_control::VolumeSnapshot) -> Self {
        VolumeSnapshotInfo {
            snapshot_id: s.id.clone(),
            volume_id: s.volume_id.clone(),
            volume_name: s.volume_name.clone(),
            quota: QuotaInfo {
                bytes: s.quota.bytes,
                inodes: s.quota.inodes,
            },
            size_bytes: s.bytes,
            created_at: rfc3339(s.created_at),
        }
    }
}

/// Warren's quota of a volume: bytes its files may take and files it may hold.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotaSpec {
    pub bytes: Option<u64>,
    pub inodes: Option<u64>,
}

/// A volume with its content-API token (E2B's `VolumeAndToken`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeAndToken {
    #[serde(rename = "volumeID")]
    pub volume_id: String,
    pub name: String,
    /// `Authorization: Bearer <token>` of the content API (`/volumecontent/{volumeID}/...`).
    pub token: String,
    /// Warren: its quota and what it uses now.
    pub quota: QuotaInfo,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageInfo>,
    pub created_at: String,
}

/// A volume in a listing (no token).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeEntry {
    #[serde(rename = "volumeID")]
    pub volume_id: String,
    pub name: String,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotaInfo {
    pub bytes: u64,
    pub inodes: u64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageInfo {
    pub bytes_used: u64,
    pub bytes_total: u64,
    pub inodes_used: u64,
    pub inodes_total: u64,
}

fn with_token(v: &Volume, usage: Option<VolumeUsage>) -> VolumeAndToken {
    VolumeAndToken {
        volume_id: v.id.clone(),
        name: v.name.clone(),
        token: v.token.clone(),
        quota: QuotaInfo {
            bytes: v.quota.bytes,
            inodes: v.quota.inodes,
        },
        usage: usage.map(|u| UsageInfo {
            bytes_used: u.bytes_used,
            bytes_total: u.bytes_total,
            inodes_used: u.inodes_used,
            inodes_total: u.inodes_total,
        }),
        created_at: rfc3339(v.created_at),
    }
}

/// Creates a volume.
#[utoipa::path(
    post, path = "/volumes", request_body = NewVolume,
    responses((status = 201, body = VolumeAndToken), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 503, description = "Volumes not enabled", body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn create_volume(
    Authed(me): Authed,
    ApiJson(body): ApiJson<NewVolume>,
) -> ApiResult<impl IntoResponse> {
    let q = body.quota.unwrap_or_default();
    let quota = QuotaRequest {
        bytes: q.bytes,
        inodes: q.inodes,
    };
    let v = me
        .create_volume(&body.name, quota, body.from_snapshot.as_deref())
        .await?;
    Ok((StatusCode::CREATED, Json(with_token(&v, None))))
}

/// The caller's volumes.
#[utoipa::path(
    get, path = "/volumes",
    responses((status = 200, body = Vec<VolumeEntry>), (status = 401, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn list_volumes(Authed(me): Authed) -> ApiResult<Json<Vec<VolumeEntry>>> {
    let all = me.volumes().await?;
    Ok(Json(
        all.into_iter()
            .map(|v| VolumeEntry {
                volume_id: v.id,
                name: v.name,
            })
            .collect(),
    ))
}

/// One volume (by id or name) with its token, quota and usage.
#[utoipa::path(
    get, path = "/volumes/{volumeID}", params(("volumeID" = String, Path, description = "Id or name")),
    responses((status = 200, body = VolumeAndToken), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn get_volume(
    Authed(me): Authed,
    Path(volume): Path<String>,
) -> ApiResult<Json<VolumeAndToken>> {
    let (v, usage) = me.volume(&volume).await?;
    Ok(Json(with_token(&v, usage)))
}

/// Grows a volume (Warren's). Sandboxes that mount it keep running where the server may
/// resize a mounted filesystem; elsewhere only an unmounted volume grows (409 otherwise).
#[utoipa::path(
    patch, path = "/volumes/{volumeID}", params(("volumeID" = String, Path, description = "Id or name")),
    request_body = VolumeChange,
    responses((status = 200, body = VolumeAndToken), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, description = "In use where it cannot grow while mounted", body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn grow_volume(
    Authed(me): Authed,
    Path(volume): Path<String>,
    ApiJson(body): ApiJson<VolumeChange>,
) -> ApiResult<Json<VolumeAndToken>> {
    let (v, usage) = me.grow_volume(&volume, body.quota.bytes).await?;
    Ok(Json(with_token(&v, usage)))
}

/// Deletes a volume and its files; refused while a sandbox mounts it.
#[utoipa::path(
    delete, path = "/volumes/{volumeID}", params(("volumeID" = String, Path, description = "Id or name")),
    responses((status = 204, description = "Deleted"), (status = 401, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, description = "Mounted by a sandbox", body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn delete_volume(
    Authed(me): Authed,
    Path(volume): Path<String>,
) -> ApiResult<StatusCode> {
    me.delete_volume(&volume).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Takes a snapshot of a volume (its sandboxes' writes wait while it is copied).
#[utoipa::path(
    post, path = "/v1/volumes/{volume}/snapshots", params(("volume" = String, Path, description = "Id or name")),
    responses((status = 201, body = VolumeSnapshotInfo), (status = 401, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 507, description = "Too many snapshots", body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn snapshot_volume(
    Authed(me): Authed,
    Path(volume): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let s = me.snapshot_volume(&volume).await?;
    Ok((StatusCode::CREATED, Json(VolumeSnapshotInfo::new(&s))))
}

/// A volume's snapshots, oldest first.
#[utoipa::path(
    get, path = "/v1/volumes/{volume}/snapshots", params(("volume" = String, Path, description = "Id or name")),
    responses((status = 200, body = Vec<VolumeSnapshotInfo>), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn list_volume_snapshots(
    Authed(me): Authed,
    Path(volume): Path<String>,
) -> ApiResult<Json<Vec<VolumeSnapshotInfo>>> {
    let all = me.volume_snapshots(&volume).await?;
    Ok(Json(all.iter().map(VolumeSnapshotInfo::new).collect()))
}

/// Deletes a volume snapshot.
#[utoipa::path(
    delete, path = "/v1/volume-snapshots/{snapshotID}", params(("snapshotID" = String, Path)),
    responses((status = 204, description = "Deleted"), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn delete_volume_snapshot(
    Authed(me): Authed,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    me.delete_volume_snapshot(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The content API's host, if volumes are enabled.
pub(crate) fn host(st: &AppState) -> Option<Arc<VolumeHost>> {
    st.volumes.clone()
}

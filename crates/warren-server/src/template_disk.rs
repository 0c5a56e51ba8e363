//! Warren's own template routes (no E2B counterpart): what builds keep on disk, and pruning
//! what nothing uses. Host-wide, so they take an admin key.

use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;
use warren_control::{DiskPart, DiskUse};

use crate::error::ApiError;
use crate::extract::Authed;
use crate::types::ErrorBody;

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DiskPartBody {
    count: u64,
    bytes: u64,
}

/// Template data on disk, by kind (or, from a prune, what was freed).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DiskUseBody {
    /// Images a tag, a sandbox or a snapshot uses.
    images_in_use: DiskPartBody,
    /// Images nothing uses (older builds, pulled bases, build stages).
    images_unused: DiskPartBody,
    /// Cached build steps.
    layers: DiskPartBody,
    /// Pulled registry layers.
    blobs: DiskPartBody,
    /// What a prune would free (or freed).
    prunable_bytes: u64,
}

fn part(p: DiskPart) -> DiskPartBody {
    DiskPartBody {
        count: p.count,
        bytes: p.bytes,
    }
}

fn body(u: DiskUse) -> DiskUseBody {
    DiskUseBody {
        prunable_bytes: u.images_unused.bytes + u.layers.bytes + u.blobs.bytes,
        images_in_use: part(u.images_in_use),
        images_unused: part(u.images_unused),
        layers: part(u.layers),
        blobs: part(u.blobs),
    }
}

/// `GET /v1/templates/disk`: what template images, build layers and pulled layers take.
#[utoipa::path(
    get, path = "/v1/templates/disk",
    responses((status = 200, body = DiskUseBody), (status = 401, body = ErrorBody),
              (status = 403, description = "Not an admin key", body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn disk_use(Authed(me): Authed) -> Result<Json<DiskUseBody>, ApiError> {
    let u = me.template_disk_use().await?;
    Ok(Json(body(u)))
}

/// `POST /v1/templates/prune`: deletes unused images, every cached build step and every
/// pulled layer (a running build is waited for); answers what was freed.
#[utoipa::path(
    post, path = "/v1/templates/prune",
    responses((status = 200, body = DiskUseBody), (status = 401, body = ErrorBody),
              (status = 403, description = "Not an admin key", body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn prune(Authed(me): Authed) -> Result<Json<DiskUseBody>, ApiError> {
    let u = me.prune_templates().await?;
    Ok(Json(body(u)))
}

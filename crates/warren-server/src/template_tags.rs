//! Template tag handlers (`e2b-compat-wave2.md` §1.8): `Template.assign_tags`, `remove_tags`
//! and `get_tags` in the SDKs.

use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::ApiError;
use crate::extract::{ApiJson, Authed};
use crate::types::ErrorBody;

type ApiResult<T> = Result<T, ApiError>;

#[derive(Debug, Deserialize, ToSchema)]
pub(crate) struct AssignTags {
    /// The build to tag, by name: `name[:tag]` (no tag: `default`).
    target: String,
    tags: Vec<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AssignedTags {
    tags: Vec<String>,
    #[serde(rename = "buildID")]
    build_id: String,
}

/// `POST /templates/tags`: points tags at the build `target` names.
#[utoipa::path(
    post, path = "/templates/tags", request_body = AssignTags,
    responses((status = 201, body = AssignedTags), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn assign_tags(
    Authed(me): Authed,
    ApiJson(body): ApiJson<AssignTags>,
) -> ApiResult<impl IntoResponse> {
    let done = me.assign_tags(&body.target, &body.tags).await?;
    Ok((
        StatusCode::CREATED,
        Json(AssignedTags {
            tags: done.tags,
            build_id: done.build_id,
        }),
    ))
}

#[derive(Debug, Deserialize, ToSchema)]
pub(crate) struct RemoveTags {
    /// The template's name, without a tag.
    name: String,
    tags: Vec<String>,
}

/// `DELETE /templates/tags` (JSON body): removes tags; `default` stays.
#[utoipa::path(
    delete, path = "/templates/tags", request_body = RemoveTags,
    responses((status = 204, description = "Removed"), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn remove_tags(
    Authed(me): Authed,
    ApiJson(body): ApiJson<RemoveTags>,
) -> ApiResult<StatusCode> {
    me.remove_tags(&body.name, &body.tags).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TagItem {
    tag: String,
    #[serde(rename = "buildID")]
    build_id: String,
    created_at: String,
}

/// `GET /templates/{templateID}/tags`: a template's tags, by id or name.
#[utoipa::path(
    get, path = "/templates/{templateID}/tags", params(("templateID" = String, Path)),
    responses((status = 200, body = [TagItem]), (status = 401, body = ErrorBody),
              (status = 404, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn list_tags(
    Authed(me): Authed,
    Path(id): Path<String>,
) -> ApiResult<Json<Vec<TagItem>>> {
    let tags = me.template_tags(&id).await?;
    Ok(Json(
        tags.into_iter()
            .map(|t| TagItem {
                tag: t.tag,
                build_id: t.build_id,
                created_at: t
                    .created_at
                    .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            })
            .collect(),
    ))
}

//! Secrets, E2B's API (`/secrets`, authenticated by API key): create, list (paged by the
//! `x-next-token` header), get, update and delete. Values go in and never come out: no
//! response, log line or sandbox ever holds one.

use std::collections::BTreeMap;

use axum::extract::{Path, Query};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use warren_control::SecretInfo;

use crate::error::ApiError;
use crate::extract::{ApiJson, Authed};
use crate::types::{rfc3339, ErrorBody};

type ApiResult<T> = Result<T, ApiError>;

/// Body of `POST /secrets`.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NewSecret {
    /// Letters, digits, `_` and `-` (kept lower-cased); not starting with `sec_`.
    pub name: String,
    /// Write-only.
    pub value: String,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// Body of `POST /secrets/{secret}`.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretUpdate {
    pub value: String,
    /// Absent: kept; `{}`: cleared.
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// A secret without its value (E2B's `Secret`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretView {
    #[serde(rename = "secretID")]
    pub secret_id: String,
    pub name: String,
    pub current_version: u32,
    pub metadata: BTreeMap<String, String>,
    pub created_at: String,
    pub updated_at: String,
}

impl From<SecretInfo> for SecretView {
    fn from(s: SecretInfo) -> Self {
        SecretView {
            secret_id: s.id,
            name: s.name,
            current_version: s.version,
            metadata: s.metadata,
            created_at: rfc3339(s.created_at),
            updated_at: rfc3339(s.updated_at),
        }
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct SecretListParams {
    pub limit: Option<u32>,
    pub next_token: Option<String>,
}

/// Stores a secret.
#[utoipa::path(
    post, path = "/secrets", request_body = NewSecret,
    responses((status = 201, body = SecretView), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 409, description = "Name taken", body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn create_secret(
    Authed(me): Authed,
    ApiJson(body): ApiJson<NewSecret>,
) -> ApiResult<impl IntoResponse> {
    let s = me
        .create_secret(&body.name, body.value, body.metadata.unwrap_or_default())
        .await?;
    Ok((StatusCode::CREATED, Json(SecretView::from(s))))
}

/// The caller's secrets, oldest first; `x-next-token` names the next page.
#[utoipa::path(
    get, path = "/secrets", params(SecretListParams),
    responses((status = 200, body = Vec<SecretView>), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn list_secrets(
    Authed(me): Authed,
    q: Result<Query<SecretListParams>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<impl IntoResponse> {
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let page = me.secrets(q.limit, q.next_token.as_deref()).await?;
    let mut headers = HeaderMap::new();
    if let Some(t) = page.next_token.and_then(|t| HeaderValue::from_str(&t).ok()) {
        headers.insert("x-next-token", t);
    }
    let list: Vec<SecretView> = page.secrets.into_iter().map(SecretView::from).collect();
    Ok((headers, Json(list)))
}

/// One secret, by id or name (never its value).
#[utoipa::path(
    get, path = "/secrets/{secret}", params(("secret" = String, Path, description = "Id or name")),
    responses((status = 200, body = SecretView), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn get_secret(
    Authed(me): Authed,
    Path(secret): Path<String>,
) -> ApiResult<Json<SecretView>> {
    Ok(Json(me.secret(&secret).await?.into()))
}

/// Replaces a secret's value (a new `currentVersion`) and, when given, its metadata.
#[utoipa::path(
    post, path = "/secrets/{secret}", params(("secret" = String, Path, description = "Id or name")),
    request_body = SecretUpdate,
    responses((status = 200, body = SecretView), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn update_secret(
    Authed(me): Authed,
    Path(secret): Path<String>,
    ApiJson(body): ApiJson<SecretUpdate>,
) -> ApiResult<Json<SecretView>> {
    let s = me.update_secret(&secret, body.value, body.metadata).await?;
    Ok(Json(s.into()))
}

/// Deletes a secret.
#[utoipa::path(
    delete, path = "/secrets/{secret}", params(("secret" = String, Path, description = "Id or name")),
    responses((status = 204, description = "Deleted"), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn delete_secret(
    Authed(me): Authed,
    Path(secret): Path<String>,
) -> ApiResult<StatusCode> {
    me.delete_secret(&secret).await?;
    Ok(StatusCode::NO_CONTENT)
}

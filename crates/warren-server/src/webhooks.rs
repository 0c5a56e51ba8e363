//! Webhooks (E2B's `/events/webhooks`): the routes, which only translate. The sender that
//! signs and posts deliveries for the control plane is `warren-adapters`'
//! `HttpWebhookSender`; a delivery's body is the event's JSON as `GET /events/sandboxes`
//! shows it ([`crate::event_payload`]).

use axum::extract::Path;
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use warren_control::{Webhook, WebhookChange};

use crate::error::ApiError;
use crate::extract::{ApiJson, Authed};
use crate::types::{rfc3339, ErrorBody};

type ApiResult<T> = Result<T, ApiError>;

/// A webhook as the API shows it (never its secret).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookBody {
    pub id: String,
    #[serde(rename = "teamID")]
    pub team_id: String,
    pub name: String,
    pub url: String,
    pub enabled: bool,
    pub events: Vec<String>,
    pub created_at: String,
    pub updated_at: String,
}

impl From<Webhook> for WebhookBody {
    fn from(h: Webhook) -> Self {
        WebhookBody {
            id: h.id,
            team_id: h.team,
            name: h.name,
            url: h.url,
            enabled: h.enabled,
            events: h.events.iter().map(|k| k.type_name().to_string()).collect(),
            created_at: rfc3339(h.created_at),
            updated_at: rfc3339(h.updated_at),
        }
    }
}

/// Body of `POST /events/webhooks` (all but `name` and `enabled` required) and of `PATCH`
/// (what it names is replaced).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookRequest {
    pub name: Option<String>,
    pub url: Option<String>,
    pub enabled: Option<bool>,
    pub events: Option<Vec<String>>,
    pub signature_secret: Option<String>,
}

impl From<WebhookRequest> for WebhookChange {
    fn from(r: WebhookRequest) -> Self {
        WebhookChange {
            name: r.name,
            url: r.url,
            enabled: r.enabled,
            events: r.events,
            secret: r.signature_secret,
        }
    }
}

/// Registers a webhook for the key's team.
#[utoipa::path(post, path = "/events/webhooks", request_body = WebhookRequest,
    responses((status = 201, body = WebhookBody), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 429, body = ErrorBody)),
    security(("api_key" = [])))]
pub(crate) async fn create(
    Authed(me): Authed,
    ApiJson(body): ApiJson<WebhookRequest>,
) -> ApiResult<(StatusCode, Json<WebhookBody>)> {
    let hook = me.create_webhook(body.into()).await?;
    Ok((StatusCode::CREATED, Json(hook.into())))
}

/// The team's webhooks, oldest first.
#[utoipa::path(get, path = "/events/webhooks",
    responses((status = 200, body = Vec<WebhookBody>), (status = 401, body = ErrorBody)),
    security(("api_key" = [])))]
pub(crate) async fn list(Authed(me): Authed) -> ApiResult<Json<Vec<WebhookBody>>> {
    Ok(Json(
        me.webhooks().await?.into_iter().map(Into::into).collect(),
    ))
}

#[utoipa::path(get, path = "/events/webhooks/{webhookID}", params(("webhookID" = String, Path)),
    responses((status = 200, body = WebhookBody), (status = 401, body = ErrorBody),
              (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub(crate) async fn get(
    Authed(me): Authed,
    Path(id): Path<String>,
) -> ApiResult<Json<WebhookBody>> {
    Ok(Json(me.webhook(&id).await?.into()))
}

/// Replaces what the body names.
#[utoipa::path(patch, path = "/events/webhooks/{webhookID}", params(("webhookID" = String, Path)),
    request_body = WebhookRequest,
    responses((status = 200, body = WebhookBody), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub(crate) async fn update(
    Authed(me): Authed,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<WebhookRequest>,
) -> ApiResult<Json<WebhookBody>> {
    Ok(Json(me.update_webhook(&id, body.into()).await?.into()))
}

/// Unregisters it; its pending deliveries are dropped.
#[utoipa::path(delete, path = "/events/webhooks/{webhookID}", params(("webhookID" = String, Path)),
    responses((status = 204), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub(crate) async fn delete(Authed(me): Authed, Path(id): Path<String>) -> ApiResult<StatusCode> {
    me.delete_webhook(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

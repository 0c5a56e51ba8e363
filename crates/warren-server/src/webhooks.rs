//! Webhooks (E2B's `/events/webhooks`): the routes, which only translate, and the sender that
//! posts deliveries for the control plane.
//!
//! A delivery is the event's JSON as `GET /events/sandboxes` shows it, with E2B's headers
//! `e2b-webhook-id`, `e2b-delivery-id` (the same on every retry), `e2b-signature-version: v1`
//! and `e2b-signature`: the unpadded base64 of SHA-256 over the secret followed by the raw
//! body. Receivers on loopback, private, link-local or other internal addresses are refused
//! (a tenant must not reach the host's own services through the control plane) unless the
//! operator allows them (`warren serve --webhooks-to-private-addresses`); the address checked is
//! the one connected to, and redirects are not followed.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use axum::extract::Path;
use axum::http::StatusCode;
use axum::Json;
use base64::Engine;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use utoipa::ToSchema;
use warren_control::{Delivery, SealedWebhook, Webhook, WebhookChange};

use crate::error::ApiError;
use crate::events::EventBody;
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

/// E2B's `e2b-signature`: unpadded base64 of SHA-256(secret || body).
pub fn signature(secret: &str, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(secret.as_bytes());
    h.update(body);
    base64::engine::general_purpose::STANDARD_NO_PAD.encode(h.finalize())
}

/// Whether `ip` is one a tenant's webhook must not reach by default: the ranges sandbox
/// egress blocks, and the IPv6 ones, IPv6 forms carrying an IPv4 address judged by that
/// address (`warren_runtime::blocked`, shared with registry pulls).
fn internal(ip: IpAddr) -> bool {
    warren_runtime::blocked::HostPolicy::default()
        .check(ip)
        .is_err()
}

/// Posts deliveries for the control plane.
pub struct HttpWebhookSender {
    /// Let receivers be on internal addresses (tests, a receiver beside the server).
    pub allow_private: bool,
}

#[async_trait::async_trait]
impl warren_control::WebhookSender for HttpWebhookSender {
    async fn send(&self, hook: &SealedWebhook, d: &Delivery) -> Result<(), String> {
        let url = reqwest_oci::Url::parse(&hook.hook.url).map_err(|e| format!("url: {e}"))?;
        let host = url.host_str().ok_or("url has no host")?.to_string();
        let port = url.port_or_known_default().ok_or("url has no port")?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let addrs: Vec<SocketAddr> = match bare.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => tokio::net::lookup_host((bare, port))
                .await
                .map_err(|e| format!("resolving {host}: {e}"))?
                .collect(),
        };
        let addr = addrs
            .into_iter()
            .find(|a| self.allow_private || !internal(a.ip()))
            .ok_or_else(|| format!("{host} is an internal address; webhooks may not reach it"))?;
        let body = serde_json::to_vec(&EventBody::from(d.event.clone()))
            .map_err(|e| format!("encoding the event: {e}"))?;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let builder = reqwest_oci::Client::builder();
        let client = builder
            .tls_certs_only(host_roots().iter().cloned())
            .redirect(reqwest_oci::redirect::Policy::none())
            .timeout(Duration::from_secs(10))
            .resolve(bare, addr)
            .build()
            .map_err(|e| format!("client: {e}"))?;
        let resp = client
            .post(url)
            .header("content-type", "application/json")
            .header("e2b-webhook-id", &hook.hook.id)
            .header("e2b-delivery-id", &d.id)
            .header("e2b-signature-version", "v1")
            .header("e2b-signature", signature(&hook.secret, &body))
            .body(body)
            .send()
            .await
            .map_err(|e| format!("posting: {e}"))?;
        if resp.status().is_success() {
            Ok(())
        } else {
            Err(format!("the receiver answered {}", resp.status()))
        }
    }
}

/// The host's trust store (read once), which HTTPS receivers (and OTLP collectors) are
/// verified against.
pub(crate) fn host_roots() -> &'static [reqwest_oci::Certificate] {
    static ROOTS: std::sync::OnceLock<Vec<reqwest_oci::Certificate>> = std::sync::OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::warn!(error = %warren_runtime::chain(&e), "reading the host's trust store for webhooks");
        }
        found
            .certs
            .iter()
            .filter_map(|c| reqwest_oci::Certificate::from_der(c.as_ref()).ok())
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses_are_known() {
        for a in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            // What the egress list has and this filter once missed.
            "168.63.129.16",
            "192.0.0.170",
            "198.18.0.1",
            "198.19.255.254",
            "240.0.0.1",
            "255.255.255.255",
            // NAT64, 6to4 and IPv4-compatible forms of internal IPv4 addresses.
            "64:ff9b::7f00:1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::a00:1",
            "2002:7f00:1::1",
            "2002:a9fe:a9fe::",
            "2002:c0a8:101::1",
            "::127.0.0.1",
            "::a00:1",
            "::ffff:168.63.129.16",
            "fec0::1",
            "ff02::1",
        ] {
            assert!(internal(a.parse().unwrap()), "{a}");
        }
        for a in [
            "::ffff:203.0.113.5",
            "64:ff9b::cb00:7105",
            "2002:cb00:7105::1",
        ] {
            assert!(!internal(a.parse().unwrap()), "{a}");
        }
        for a in ["192.0.2.1", "203.0.113.5", "2001:db8::1"] {
            assert!(!internal(a.parse().unwrap()), "{a}");
        }
    }

    #[test]
    fn the_signature_is_the_hash_of_secret_and_body() {
        // sha256("secretbody"), base64 without padding.
        assert_eq!(
            signature("secret", b"body"),
            "YuouM0o8pKJyrkZVR45vYimhIRzExMogPwMGjY/kzew"
        );
        assert!(!signature("secret", b"body").ends_with('='));
    }
}

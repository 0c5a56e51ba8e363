//! Warren's HTTP front end: the E2B-compatible control-plane REST API (`e2b-compat.md` §2) and
//! the sandbox proxy (§3.8) on one listener.
//!
//! Handlers only translate: they extract input, call one [`warren_control::Control`] operation
//! and map the result. Errors are mapped to HTTP once, in [`error`]. Requests that carry the
//! sandbox routing headers (or a `{port}-{id}.{domain}` Host) never reach the API router; they
//! are streamed to the sandbox by [`proxy`].

#![forbid(unsafe_code)]

mod audit;
mod dashboard;
pub mod error;
mod events;
mod extract;
mod ingress;
mod legacy;
pub mod listener;
mod networks;
mod normalize;
pub mod openapi;
pub mod otel;
mod persistence;
mod prometheus;
pub mod proxy;
mod proxy_body;
mod routes;
mod secrets;
mod template_disk;
mod template_tags;
mod templates;
pub mod types;
mod volume_content;
pub mod volumes;
pub mod webhooks;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{delete, get, post, put};
use axum::{middleware, Router};
use warren_control::Control;

pub use events::event_payload;
pub use listener::{serve, serve_all, ListenerLimits, TlsListener};

/// Limit of JSON request bodies on the API (the proxy streams bodies of any size).
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub body_limit: usize,
    /// Domain of `{port}-{id}.{domain}` hosts; `None` accepts any domain.
    pub domain: Option<String>,
    /// This host's volume storage, for the volume content API (`None`: volumes are off).
    pub volumes: Option<Arc<warren_volume::VolumeHost>>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            body_limit: DEFAULT_BODY_LIMIT,
            domain: None,
            volumes: None,
        }
    }
}

#[derive(Clone)]
pub struct AppState {
    pub control: Control,
    pub proxy: Arc<proxy::Proxy>,
    pub volumes: Option<Arc<warren_volume::VolumeHost>>,
}

/// The whole application: proxy first, then the API. `proxy` is the one the control plane
/// reads guests through (`ControlBuilder::guest_metrics`). Building it starts nothing.
pub fn app(control: Control, proxy: Arc<proxy::Proxy>, config: ServerConfig) -> Router {
    let state = AppState {
        control,
        proxy,
        volumes: config.volumes.clone(),
    };
    let api = Router::new()
        .route("/health", get(routes::health))
        .route("/metrics", get(prometheus::metrics))
        .route(
            "/v2/sandboxes",
            post(routes::create_sandbox).get(routes::list_sandboxes),
        )
        .route(
            "/v2/sandboxes/{sandbox_id}/connect",
            post(routes::connect_sandbox),
        )
        .route(
            "/sandboxes",
            post(legacy::create_sandbox_v1).get(legacy::list_sandboxes_v1),
        )
        .route(
            "/sandboxes/{sandbox_id}/connect",
            post(legacy::connect_sandbox_v1),
        )
        .route(
            "/sandboxes/{sandbox_id}/resume",
            post(legacy::resume_sandbox),
        )
        .route(
            "/sandboxes/{sandbox_id}/refreshes",
            post(legacy::refresh_sandbox),
        )
        .route(
            "/sandboxes/{sandbox_id}",
            get(routes::get_sandbox).delete(routes::kill_sandbox),
        )
        .route("/sandboxes/{sandbox_id}/timeout", post(routes::set_timeout))
        .route(
            "/sandboxes/{sandbox_id}/network",
            put(routes::update_network),
        )
        .route(
            "/sandboxes/{sandbox_id}/network/flows",
            get(routes::network_flows),
        )
        .route("/sandboxes/metrics", get(routes::sandboxes_metrics))
        .route("/sandboxes/{sandbox_id}/logs", get(audit::sandbox_logs_v1))
        .route(
            "/v2/sandboxes/{sandbox_id}/logs",
            get(audit::sandbox_logs_v2),
        )
        .route(
            "/v1/sandboxes/{sandbox_id}/audit",
            get(audit::sandbox_audit),
        )
        .route("/events/sandboxes", get(events::team_events))
        .route("/events/sandboxes/stream", get(events::stream))
        .route(
            "/events/webhooks",
            post(webhooks::create).get(webhooks::list),
        )
        .route(
            "/events/webhooks/{webhook_id}",
            get(webhooks::get)
                .patch(webhooks::update)
                .delete(webhooks::delete),
        )
        .route(
            "/events/sandboxes/{sandbox_id}",
            get(events::sandbox_events),
        )
        .route(
            "/sandboxes/{sandbox_id}/metrics",
            get(routes::sandbox_metrics),
        )
        .route(
            "/sandboxes/{sandbox_id}/pause",
            post(persistence::pause_sandbox),
        )
        .route(
            "/sandboxes/{sandbox_id}/snapshots",
            post(persistence::create_snapshot),
        )
        .route(
            "/sandboxes/{sandbox_id}/fork",
            post(persistence::fork_sandbox),
        )
        .route("/snapshots", get(persistence::list_snapshots))
        .route(
            "/v1/networks",
            post(networks::create_network).get(networks::list_networks),
        )
        .route(
            "/v1/networks/{network}",
            get(networks::get_network).delete(networks::delete_network),
        )
        .route(
            "/v1/networks/{network}/members",
            post(networks::join_network),
        )
        .route(
            "/v1/networks/{network}/members/{sandbox_id}",
            delete(networks::leave_network),
        )
        .route(
            "/templates/{template_id}",
            delete(templates::delete_template),
        )
        .route(
            "/volumes",
            get(volumes::list_volumes).post(volumes::create_volume),
        )
        .route(
            "/volumes/{volume_id}",
            get(volumes::get_volume)
                .delete(volumes::delete_volume)
                .patch(volumes::grow_volume),
        )
        .route(
            "/v1/volumes/{volume}/snapshots",
            get(volumes::list_volume_snapshots).post(volumes::snapshot_volume),
        )
        .route(
            "/v1/volume-snapshots/{snapshot_id}",
            delete(volumes::delete_volume_snapshot),
        )
        .route(
            "/secrets",
            get(secrets::list_secrets).post(secrets::create_secret),
        )
        .route(
            "/secrets/{secret}",
            get(secrets::get_secret)
                .post(secrets::update_secret)
                .delete(secrets::delete_secret),
        )
        .route("/templates", get(templates::list_templates))
        .route("/v3/templates", post(templates::register_build))
        .route(
            "/templates/{template_id}/files/{hash}",
            get(templates::upload_link),
        )
        .route(
            "/v2/templates/{template_id}/builds/{build_id}",
            post(templates::start_build),
        )
        .route(
            "/templates/{template_id}/builds/{build_id}/status",
            get(templates::build_status),
        )
        .route("/templates/aliases/{alias}", get(templates::alias_info))
        .route(
            "/templates/tags",
            post(template_tags::assign_tags).delete(template_tags::remove_tags),
        )
        .route(
            "/templates/{template_id}/tags",
            get(template_tags::list_tags),
        )
        .route("/v1/templates/disk", get(template_disk::disk_use))
        .route("/v1/templates/prune", post(template_disk::prune))
        .route(
            "/v2/templates/{template_id}",
            axum::routing::patch(templates::set_public),
        )
        .fallback(routes::not_found)
        .layer(DefaultBodyLimit::max(config.body_limit))
        .layer(middleware::from_fn_with_state(
            (state.clone(), config.body_limit),
            extract::reject_oversized,
        ))
        .layer(middleware::from_fn(normalize::json_errors))
        .with_state(state.clone());
    // Uploads carry no API key (their signed URL authenticates them) and may be far larger
    // than an API body: they skip the API's body limit; the builder enforces its own.
    let uploads = Router::new()
        .route(
            "/templates/{template_id}/files/{hash}/upload",
            axum::routing::put(templates::upload_files),
        )
        .layer(middleware::from_fn(normalize::json_errors))
        .with_state(state.clone());
    // The volume content API authenticates with the volume's token, streams files of any
    // size (the volume's quota bounds them) and answers errors in its own shape.
    let content = Router::new()
        .route(
            "/volumecontent/{volume_id}/dir",
            get(volume_content::list_dir).post(volume_content::make_dir),
        )
        .route(
            "/volumecontent/{volume_id}/path",
            get(volume_content::stat)
                .patch(volume_content::set_metadata)
                .delete(volume_content::remove),
        )
        .route(
            "/volumecontent/{volume_id}/file",
            get(volume_content::read_file).put(volume_content::write_file),
        )
        .layer(DefaultBodyLimit::disable())
        .with_state(state.clone());
    // The web dashboard's static files (no data, no key: the page calls the API itself).
    let api = uploads.merge(content).merge(dashboard::router()).merge(api);
    // A span per API request (inside routing, which names the route); sandbox traffic never
    // reaches it: the proxy gives traced requests a span of its own.
    let api = api.layer(middleware::from_fn(otel::request::trace_api));
    api.layer(middleware::from_fn_with_state(state, proxy::route_or_api))
}

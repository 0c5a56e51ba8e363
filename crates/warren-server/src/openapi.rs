//! The OpenAPI document, generated from the handlers and wire types. `openapi/control.json` is
//! this document, committed; `tests/openapi.rs` fails when the two drift.

use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::networks::{JoinSpec, MemberInfo, NetworkDetail, NewMember, NewNetwork};
use crate::secrets::{NewSecret, SecretUpdate, SecretView};
use crate::types::{
    AutoResume, ConnectSandbox, ErrorBody, FlowEntry, FlowList, ForkResultItem, ForkSandbox,
    LifecycleInfo, ListedSandbox, NetworkConfig, NetworkInfo, NetworkUpdateBody, NewSandbox,
    NewSnapshot, PauseSandbox, RuntimeInfo, SandboxCreated, SandboxDetail, SandboxMetric,
    SandboxesWithMetrics, SetTimeout, SnapshotInfo, VolumeMountSpec,
};
use crate::volumes::{
    GrowSpec, NewVolume, QuotaInfo, QuotaSpec, UsageInfo, VolumeAndToken, VolumeChange,
    VolumeEntry, VolumeSnapshotInfo,
};
use crate::{
    legacy, networks, persistence, routes, secrets, template_disk, template_tags, templates,
    volumes,
};

#[derive(OpenApi)]
#[openapi(
    info(title = "Warren control plane", description = "E2B-compatible sandbox API."),
    paths(
        routes::health,
        routes::create_sandbox,
        routes::connect_sandbox,
        legacy::create_sandbox_v1,
        legacy::list_sandboxes_v1,
        legacy::connect_sandbox_v1,
        legacy::resume_sandbox,
        legacy::refresh_sandbox,
        routes::list_sandboxes,
        routes::get_sandbox,
        routes::kill_sandbox,
        routes::set_timeout,
        routes::update_network,
        routes::network_flows,
        routes::sandbox_metrics,
        routes::sandboxes_metrics,
        crate::prometheus::metrics,
        crate::events::team_events,
        crate::events::stream,
        crate::audit::sandbox_audit,
        crate::audit::sandbox_logs_v1,
        crate::audit::sandbox_logs_v2,
        crate::events::sandbox_events,
        crate::webhooks::create,
        crate::webhooks::list,
        crate::webhooks::get,
        crate::webhooks::update,
        crate::webhooks::delete,
        persistence::pause_sandbox,
        persistence::create_snapshot,
        persistence::list_snapshots,
        templates::delete_template,
        templates::register_build,
        templates::upload_link,
        templates::upload_files,
        templates::start_build,
        templates::build_status,
        templates::alias_info,
        templates::list_templates,
        templates::set_public,
        template_tags::assign_tags,
        template_tags::remove_tags,
        template_tags::list_tags,
        template_disk::disk_use,
        template_disk::prune,
        persistence::fork_sandbox,
        networks::create_network,
        networks::list_networks,
        networks::get_network,
        networks::delete_network,
        networks::join_network,
        networks::leave_network,
        volumes::create_volume,
        volumes::list_volumes,
        volumes::get_volume,
        volumes::delete_volume,
        volumes::grow_volume,
        volumes::snapshot_volume,
        volumes::list_volume_snapshots,
        volumes::delete_volume_snapshot,
        secrets::create_secret,
        secrets::list_secrets,
        secrets::get_secret,
        secrets::update_secret,
        secrets::delete_secret,
    ),
    components(schemas(
        ErrorBody, NewSandbox, ConnectSandbox, SetTimeout, SandboxCreated, SandboxDetail,
        ListedSandbox, SandboxMetric, SandboxesWithMetrics, crate::events::EventBody, crate::audit::AuditBody, crate::audit::AuditPage, crate::audit::LogEntryBody, crate::audit::LogLineBody, crate::audit::SandboxLogsV1, crate::audit::SandboxLogsV2, crate::webhooks::WebhookBody, crate::webhooks::WebhookRequest, AutoResume, PauseSandbox, NewSnapshot, SnapshotInfo,
        ForkSandbox, ForkResultItem, LifecycleInfo, RuntimeInfo, NetworkConfig, NetworkInfo,
        NetworkUpdateBody, FlowEntry, FlowList, NewNetwork, NewMember, MemberInfo, NetworkDetail,
        JoinSpec, VolumeMountSpec, NewVolume, VolumeChange, GrowSpec, QuotaSpec, QuotaInfo, UsageInfo, VolumeAndToken,
        VolumeEntry, VolumeSnapshotInfo, NewSecret, SecretUpdate, SecretView,
        legacy::ResumeSandbox, legacy::RefreshSandbox
    )),
    modifiers(&ApiKeyAuth)
)]
pub struct ApiDoc;

struct ApiKeyAuth;

impl Modify for ApiKeyAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("X-API-KEY"))),
        );
    }
}

/// The document as committed: pretty JSON with a trailing newline.
pub fn document() -> String {
    let mut doc = ApiDoc::openapi();
    // The crate version would make every release "drift"; the document has its own lifecycle.
    doc.info.version = "1".into();
    let mut out = doc
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    out.push('\n');
    out
}

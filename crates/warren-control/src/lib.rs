//! Warren's control-plane domain.
//!
//! This crate decides and records: it owns the sandbox lifecycle state machine (pause and
//! resume included), snapshots and forks, expiry at `end_at`, API keys, access tokens, listing
//! and the concurrency limit. It reaches the outside world only through two traits: [`Store`]
//! (durable records; SQLite today, PostgreSQL later) and [`warren_runtime::SandboxRuntime`]
//! (makes sandboxes exist). It has no HTTP and no SQL in it; `tests/layering.rs` checks that
//! with `cargo tree`.

#![forbid(unsafe_code)]

mod audit;
mod audit_budget;
mod builder;
mod config;
mod control;
mod error;
mod events;
mod guest;
mod keys;
mod locks;
mod model;
mod networks;
mod random;
mod sandboxes;
mod secrets;
pub mod store;
mod telemetry;
mod templates;
mod tenant;
mod usage;
mod volumes;
mod webhooks;

pub use audit::{
    AuditEntry, AuditObserver, AuditQuery, StoredAudit, AUDIT_RETENTION, KIND_DROPPED,
    MAX_AUDIT_PAGE, SOURCE_AGENT, SOURCE_BUDGET, SOURCE_HOST, SOURCE_LIFECYCLE, SOURCE_NETWORK,
};
pub use audit_budget::ROW_OVERHEAD as AUDIT_ROW_OVERHEAD;
pub use builder::ControlBuilder;
pub use config::AuditBudget;
pub use control::Control;
pub use error::dockerfile_build;
pub use error::{ControlError, StoreError};
pub use events::{EventKind, EventQuery, SandboxEvent, EVENT_RETENTION, MAX_EVENT_PAGE};
pub use keys::{
    generate as new_api_key, hash_api_key, sdk_accepts_key, ApiKey, Keys, NewApiKey, Scope,
    DEFAULT_TEAM,
};
pub use model::{Lifecycle, Network, OnTimeout, Sandbox, SandboxState, TransitionError};
pub use networks::{
    joins_from_metadata, Join, Member, NetworkView, PrivateNetwork, MAX_NETWORKS_PER_SANDBOX,
    METADATA_KEY,
};
pub use sandboxes::create::CreateRequest;
pub use sandboxes::fork::{ForkResult, MAX_FORK_COUNT};
pub use sandboxes::list::{parse_metadata_query, ListQuery, ListStates, Order, Page};
pub use sandboxes::network::NetworkUpdate;
pub use sandboxes::snapshots::{Snapshot, SnapshotPage, SnapshotQuery};
pub use sandboxes::{Access, Config, Route, SERVICE_PORT};
pub use secrets::{canonical_name as canonical_secret_name, SealedSecret, SecretInfo, SecretPage};
pub use store::{
    AuditStore, EventStore, KeyStore, NetworkStore, SandboxStore, SecretStore, SnapshotStore,
    Store, TemplateStore, VolumeStore, WebhookStore,
};
pub use telemetry::{OperationObserver, SandboxCount, SandboxCounts};
pub use templates::builds::{BuildPage, BuildRequest, Registered, UploadLink, MAX_LOG_PAGE};
pub use templates::disk::{DiskPart, DiskUse};
pub use templates::port::{
    BuildFailure, BuildJob, BuildLog, BuilderError, BuiltImage, TemplateBuilder, BUILD_LAYER_PREFIX,
};
pub use templates::tags::{Assigned, TagInfo};
pub use templates::{
    Build, BuildReason, BuildStatus, LogEntry, LogLevel, TagRef, Template, TemplateName,
    DEFAULT_TAG,
};
pub use tenant::{AliasTarget, Tenant};
pub use usage::{GuestMetrics, GuestView, MetricPoint, RETAINED as METRICS_RETAINED, SAMPLE_EVERY};
pub use volumes::{
    DiskError, MountRequest, QuotaRequest, Volume, VolumeDisks, VolumeMountRecord, VolumeQuota,
    VolumeSnapshot, VolumeUsage, MAX_VOLUME_MOUNTS,
};
pub use warren_buildspec::{
    is_files_hash, valid_account, BuildSource, BuildSpec, CopyOrigin, RawStep, RegistryAuth,
    StageSpec, Step, StepKind, E2B_BASE_IMAGE,
};
pub use warren_proto::journal::Level as AuditLevel;
pub use warren_runtime::egress::EgressPolicy;
pub use warren_runtime::flows::{Flow, FlowKind, FlowVerdict};
pub use warren_runtime::transforms::{HeaderRules, HostRule};
pub use warren_runtime::{Capabilities, PauseMode};
pub use warren_types::Resources;
pub use webhooks::{
    Delivery, SealedWebhook, Webhook, WebhookChange, WebhookSender, DELIVERY_ATTEMPTS, MAX_WEBHOOKS,
};

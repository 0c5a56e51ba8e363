//! The durable store the control plane records into. Every method returns only once the change
//! is durable, so anything the API acknowledged survives a crash.

use async_trait::async_trait;

use crate::error::StoreError;
use crate::keys::ApiKey;
use crate::model::Snapshot;
use crate::model::{Sandbox, SandboxState};
use crate::networks::{Member, PrivateNetwork};
use crate::templates::{Build, BuildStatus, LogEntry, Template};

/// Every record the control plane keeps: one store (SQLite today) implements each
/// aggregate's trait, and none of them has a default, so a store that leaves one out
/// does not compile. Services hold only the aggregate's trait they use.
pub trait Store:
    SandboxStore
    + SnapshotStore
    + TemplateStore
    + KeyStore
    + NetworkStore
    + VolumeStore
    + SecretStore
    + EventStore
    + WebhookStore
    + AuditStore
{
}

impl<T> Store for T where
    T: SandboxStore
        + SnapshotStore
        + TemplateStore
        + KeyStore
        + NetworkStore
        + VolumeStore
        + SecretStore
        + EventStore
        + WebhookStore
        + AuditStore
{
}

/// Sandbox records: the one record per sandbox, live or ended.
#[async_trait]
pub trait SandboxStore: Send + Sync + 'static {
    /// Records a new sandbox. Fails if the id exists.
    async fn insert_sandbox(&self, sandbox: &Sandbox) -> Result<(), StoreError>;

    /// Replaces the record of an existing sandbox.
    async fn update_sandbox(&self, sandbox: &Sandbox) -> Result<(), StoreError>;

    async fn get_sandbox(&self, id: &str) -> Result<Option<Sandbox>, StoreError>;

    /// Every sandbox in one of `states`, in no particular order.
    async fn sandboxes_in(&self, states: &[SandboxState]) -> Result<Vec<Sandbox>, StoreError>;

    /// Forgets killed and failed sandboxes whose end time is before `before`; returns how
    /// many.
    async fn prune_ended(&self, before: chrono::DateTime<chrono::Utc>)
        -> Result<usize, StoreError>;
}

/// Snapshot records (the runtime keeps their files).
#[async_trait]
pub trait SnapshotStore: Send + Sync + 'static {
    /// Records a snapshot and, in the same transaction, forgets `replaces` (the older
    /// snapshot of the same name), so exactly one of them is ever recorded under the name.
    async fn insert_snapshot(
        &self,
        snapshot: &Snapshot,
        replaces: Option<&str>,
    ) -> Result<(), StoreError>;

    async fn get_snapshot(&self, id: &str) -> Result<Option<Snapshot>, StoreError>;

    /// The snapshot recorded under `name`.
    async fn snapshot_by_name(&self, name: &str) -> Result<Option<Snapshot>, StoreError>;

    /// Every snapshot, in no particular order. Recovery's sweep of unrecorded runtime copies
    /// needs them all; listings and quotas use [`Store::snapshot_page`] and
    /// [`Store::snapshot_usage`], which do not load every row.
    async fn snapshots(&self) -> Result<Vec<Snapshot>, StoreError>;

    /// One page of snapshots, newest first: ordered by creation time, then id, both
    /// descending (a total order, so pages never overlap or skip). Only those strictly after
    /// `after` (creation time in µs, id) in that order; only `team`'s when given (`None` is an
    /// admin's view of every team); only `sandbox_id`'s when given; only the one whose id or
    /// name is `name` when given. At most `limit` of them.
    async fn snapshot_page(
        &self,
        team: Option<&str>,
        sandbox_id: Option<&str>,
        name: Option<&str>,
        after: Option<(i64, &str)>,
        limit: usize,
    ) -> Result<Vec<Snapshot>, StoreError>;

    /// How many snapshots there are and how many bytes they hold, as `(count, bytes)`: every
    /// snapshot on the server, or only `sandbox_id`'s when given. The one named
    /// `except_name` is left out (a new snapshot of that name replaces it).
    async fn snapshot_usage(
        &self,
        sandbox_id: Option<&str>,
        except_name: Option<&str>,
    ) -> Result<(u64, u64), StoreError>;

    /// Forgets a snapshot; `false` if there was none with this id.
    async fn delete_snapshot(&self, id: &str) -> Result<bool, StoreError>;
}

/// Templates, their builds and the builds' logs.
#[async_trait]
pub trait TemplateStore: Send + Sync + 'static {
    /// Records a template, replacing the record with the same id. Fails if another template
    /// holds its alias.
    async fn put_template(&self, template: &Template) -> Result<(), StoreError>;

    async fn get_template(&self, id: &str) -> Result<Option<Template>, StoreError>;

    async fn template_by_alias(&self, alias: &str) -> Result<Option<Template>, StoreError>;

    /// Every template, in no particular order.
    async fn templates(&self) -> Result<Vec<Template>, StoreError>;

    /// Forgets a template with its builds and their logs; `false` if there was none.
    async fn delete_template(&self, id: &str) -> Result<bool, StoreError>;

    /// Records a build, replacing the record with the same id.
    async fn put_build(&self, build: &Build) -> Result<(), StoreError>;

    async fn get_build(&self, id: &str) -> Result<Option<Build>, StoreError>;

    /// Every build of a template.
    async fn builds_of(&self, template_id: &str) -> Result<Vec<Build>, StoreError>;

    /// Every build in `status`.
    async fn builds_in(&self, status: BuildStatus) -> Result<Vec<Build>, StoreError>;

    /// Appends log entries to a build's log, the first of them at position `first`.
    async fn append_build_logs(
        &self,
        build_id: &str,
        first: usize,
        entries: &[LogEntry],
    ) -> Result<(), StoreError>;

    /// At most `limit` log entries of a build from position `offset` on, in order.
    async fn build_logs(
        &self,
        build_id: &str,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<LogEntry>, StoreError>;
}

/// API keys (hashes only).
#[async_trait]
pub trait KeyStore: Send + Sync + 'static {
    async fn insert_api_key(&self, key: &ApiKey) -> Result<(), StoreError>;

    /// The non-revoked key with this SHA-256 hash.
    async fn api_key_by_hash(&self, hash: &str) -> Result<Option<ApiKey>, StoreError>;

    async fn api_keys(&self) -> Result<Vec<ApiKey>, StoreError>;

    /// Revokes a key by id; `false` if no such active key.
    async fn revoke_api_key(&self, id: &str) -> Result<bool, StoreError>;
}

/// Private networks and their members.
#[async_trait]
pub trait NetworkStore: Send + Sync + 'static {
    /// Records a private network, replacing the record with the same id.
    async fn put_network(&self, network: &PrivateNetwork) -> Result<(), StoreError>;

    /// Forgets a private network and its members; `false` if there was none.
    async fn delete_network(&self, id: &str) -> Result<bool, StoreError>;

    /// Every private network, in no particular order.
    async fn networks(&self) -> Result<Vec<PrivateNetwork>, StoreError>;

    /// Records a membership, replacing the one of the same network and sandbox.
    async fn put_member(&self, member: &Member) -> Result<(), StoreError>;

    /// Forgets a membership; `false` if there was none.
    async fn delete_member(&self, network_id: &str, sandbox_id: &str) -> Result<bool, StoreError>;

    /// Every membership of every network.
    async fn members(&self) -> Result<Vec<Member>, StoreError>;
}

/// Volumes and volume snapshots (records; the disks are the host's).
#[async_trait]
pub trait VolumeStore: Send + Sync + 'static {
    /// Records a volume (with its token), replacing the record with the same id.
    async fn put_volume(&self, volume: &crate::volumes::Volume) -> Result<(), StoreError>;

    async fn get_volume(&self, id: &str) -> Result<Option<crate::volumes::Volume>, StoreError>;

    async fn volume_by_name(
        &self,
        team: &str,
        name: &str,
    ) -> Result<Option<crate::volumes::Volume>, StoreError>;

    /// Every volume of `team` (`None`: of every team), in no particular order.
    async fn volumes(&self, team: Option<&str>) -> Result<Vec<crate::volumes::Volume>, StoreError>;

    /// Forgets a volume; `false` if there was none.
    async fn delete_volume(&self, id: &str) -> Result<bool, StoreError>;

    async fn put_volume_snapshot(
        &self,
        snapshot: &crate::volumes::VolumeSnapshot,
    ) -> Result<(), StoreError>;

    async fn get_volume_snapshot(
        &self,
        id: &str,
    ) -> Result<Option<crate::volumes::VolumeSnapshot>, StoreError>;

    /// Every volume snapshot of `team` (`None`: of every team), in no particular order.
    async fn volume_snapshots(
        &self,
        team: Option<&str>,
    ) -> Result<Vec<crate::volumes::VolumeSnapshot>, StoreError>;

    async fn delete_volume_snapshot(&self, id: &str) -> Result<bool, StoreError>;
}

/// Team secrets, sealed by the store.
#[async_trait]
pub trait SecretStore: Send + Sync + 'static {
    /// Records a secret with its value (sealed by the store), replacing the one with its id.
    async fn put_secret(&self, secret: &crate::secrets::SealedSecret) -> Result<(), StoreError>;

    async fn get_secret(
        &self,
        id: &str,
    ) -> Result<Option<crate::secrets::SealedSecret>, StoreError>;

    async fn secret_by_name(
        &self,
        team: &str,
        name: &str,
    ) -> Result<Option<crate::secrets::SealedSecret>, StoreError>;

    /// Every secret of `team` (`None`: of every team), without values, in no particular order.
    async fn secrets(
        &self,
        team: Option<&str>,
    ) -> Result<Vec<crate::secrets::SecretInfo>, StoreError>;

    async fn delete_secret(&self, id: &str) -> Result<bool, StoreError>;
}

/// Lifecycle events.
#[async_trait]
pub trait EventStore: Send + Sync + 'static {
    /// Records a lifecycle event.
    async fn append_event(&self, event: &crate::events::SandboxEvent) -> Result<(), StoreError>;

    /// Events as `query` asks, newest first unless it says ascending.
    async fn events(
        &self,
        query: &crate::events::EventQuery,
    ) -> Result<Vec<crate::events::SandboxEvent>, StoreError>;

    /// Forgets events from before `before`; returns how many.
    async fn prune_events(
        &self,
        before: chrono::DateTime<chrono::Utc>,
    ) -> Result<usize, StoreError>;
}

/// Webhooks (with their sealed secrets) and their pending deliveries.
#[async_trait]
pub trait WebhookStore: Send + Sync + 'static {
    /// Records a webhook with its secret (sealed by the store), replacing the one with its id.
    async fn put_webhook(&self, hook: &crate::webhooks::SealedWebhook) -> Result<(), StoreError>;

    async fn get_webhook(
        &self,
        id: &str,
    ) -> Result<Option<crate::webhooks::SealedWebhook>, StoreError>;

    /// Every webhook of `team` (`None`: of every team), without secrets.
    async fn webhooks(
        &self,
        team: Option<&str>,
    ) -> Result<Vec<crate::webhooks::Webhook>, StoreError>;

    /// Forgets a webhook and its pending deliveries.
    async fn delete_webhook(&self, id: &str) -> Result<bool, StoreError>;

    /// Records a pending delivery (new, or its next attempt).
    async fn put_delivery(&self, d: &crate::webhooks::Delivery) -> Result<(), StoreError>;

    /// Every pending delivery.
    async fn deliveries(&self) -> Result<Vec<crate::webhooks::Delivery>, StoreError>;

    async fn delete_delivery(&self, id: &str) -> Result<(), StoreError>;
}

/// The audit trail of every sandbox.
#[async_trait]
pub trait AuditStore: Send + Sync + 'static {
    /// Keeps audit entries; one already kept (same sandbox, source and position) is skipped.
    /// Returns the indices of the entries that were new.
    async fn append_audit(
        &self,
        entries: &[crate::audit::StoredAudit],
    ) -> Result<Vec<usize>, StoreError>;

    /// The bytes a sandbox's kept audit entries take, estimated as the trail's budget counts
    /// them: the texts (fields as JSON) plus 64 bytes a row.
    async fn audit_usage(&self, sandbox_id: &str) -> Result<u64, StoreError>;

    /// The highest position and the newest time of a sandbox's kept entries from `source`
    /// (`None`: it has none): where reading that source goes on after a restart.
    async fn audit_last(
        &self,
        sandbox_id: &str,
        source: &str,
    ) -> Result<Option<(u64, chrono::DateTime<chrono::Utc>)>, StoreError>;

    /// A sandbox's kept audit entries that `q` wants, at most `q.limit`, in time order.
    async fn audit(
        &self,
        q: &crate::audit::AuditQuery,
    ) -> Result<Vec<crate::audit::AuditEntry>, StoreError>;

    /// Forgets audit entries from before `before`; returns how many.
    async fn prune_audit(&self, before: chrono::DateTime<chrono::Utc>)
        -> Result<usize, StoreError>;
}

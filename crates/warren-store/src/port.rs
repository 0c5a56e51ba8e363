//! [`SqliteStore`] as the control plane's store ports, one trait per aggregate: each method
//! runs that aggregate's queries (in `sandboxes.rs`, `volumes.rs`, `audit.rs`, ...) on the
//! connection, off the async workers.

use super::*;
use warren_control::{
    AuditStore, EventStore, KeyStore, NetworkStore, SandboxStore, SecretStore, SnapshotStore,
    TemplateStore, VolumeStore, WebhookStore,
};

#[async_trait]
impl SandboxStore for SqliteStore {
    async fn prune_ended(&self, before: DateTime<Utc>) -> Result<usize, StoreError> {
        self.with(move |c| {
            c.conn
                .execute(
                    "DELETE FROM sandboxes WHERE state IN ('killed', 'failed') AND end_at_us < ?1",
                    [micros(before)],
                )
                .map_err(backend)
        })
        .await
    }

    async fn insert_sandbox(&self, sandbox: &Sandbox) -> Result<(), StoreError> {
        let s = sandbox.clone();
        self.with(move |c| write_sandbox(c, &s, true)).await
    }

    async fn update_sandbox(&self, sandbox: &Sandbox) -> Result<(), StoreError> {
        let s = sandbox.clone();
        self.with(move |c| write_sandbox(c, &s, false)).await
    }

    async fn get_sandbox(&self, id: &str) -> Result<Option<Sandbox>, StoreError> {
        let id = id.to_string();
        self.with(move |c| {
            c.conn
                .query_row(
                    &format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE id = ?1"),
                    [id],
                    read_row,
                )
                .optional()
                .map_err(backend)?
                .map(|r| r.decode(&c.sealer))
                .transpose()
        })
        .await
    }

    async fn sandboxes_in(&self, states: &[SandboxState]) -> Result<Vec<Sandbox>, StoreError> {
        let states: Vec<&'static str> = states.iter().map(|s| s.as_str()).collect();
        self.with(move |c| {
            let mut stmt = c
                .conn
                .prepare(&format!(
                    "SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE state = ?1"
                ))
                .map_err(backend)?;
            let mut out = Vec::new();
            for state in states {
                let rows = stmt.query_map([state], read_row).map_err(backend)?;
                for row in rows {
                    out.push(row.map_err(backend)?.decode(&c.sealer)?);
                }
            }
            Ok(out)
        })
        .await
    }
}

#[async_trait]
impl SnapshotStore for SqliteStore {
    async fn insert_snapshot(
        &self,
        snapshot: &Snapshot,
        replaces: Option<&str>,
    ) -> Result<(), StoreError> {
        let s = snapshot.clone();
        let replaces = replaces.map(str::to_string);
        self.with(move |c| snapshots::insert(c, &s, replaces.as_deref()))
            .await
    }

    async fn get_snapshot(&self, id: &str) -> Result<Option<Snapshot>, StoreError> {
        let id = id.to_string();
        self.with(move |c| snapshots::get(c, "id", &id)).await
    }

    async fn snapshot_by_name(&self, name: &str) -> Result<Option<Snapshot>, StoreError> {
        let name = name.to_string();
        self.with(move |c| snapshots::get(c, "name", &name)).await
    }

    async fn snapshots(&self) -> Result<Vec<Snapshot>, StoreError> {
        self.with(snapshots::all).await
    }

    async fn snapshot_page(
        &self,
        team: Option<&str>,
        sandbox_id: Option<&str>,
        name: Option<&str>,
        after: Option<(i64, &str)>,
        limit: usize,
    ) -> Result<Vec<Snapshot>, StoreError> {
        let team = team.map(str::to_string);
        let sandbox_id = sandbox_id.map(str::to_string);
        let name = name.map(str::to_string);
        let after = after.map(|(t, id)| (t, id.to_string()));
        self.with(move |c| {
            snapshots::page(
                c,
                team.as_deref(),
                sandbox_id.as_deref(),
                name.as_deref(),
                after.as_ref().map(|(t, id)| (*t, id.as_str())),
                limit,
            )
        })
        .await
    }

    async fn snapshot_usage(
        &self,
        sandbox_id: Option<&str>,
        except_name: Option<&str>,
    ) -> Result<(u64, u64), StoreError> {
        let sandbox_id = sandbox_id.map(str::to_string);
        let except_name = except_name.map(str::to_string);
        self.with(move |c| snapshots::usage(c, sandbox_id.as_deref(), except_name.as_deref()))
            .await
    }

    async fn delete_snapshot(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.with(move |c| snapshots::delete(c, &id)).await
    }
}

#[async_trait]
impl TemplateStore for SqliteStore {
    async fn put_template(&self, t: &warren_control::Template) -> Result<(), StoreError> {
        let t = t.clone();
        self.with(move |c| templates::put_template(c, &t)).await
    }

    async fn get_template(&self, id: &str) -> Result<Option<warren_control::Template>, StoreError> {
        let id = id.to_string();
        self.with(move |c| templates::get_template(c, &id)).await
    }

    async fn template_by_alias(
        &self,
        alias: &str,
    ) -> Result<Option<warren_control::Template>, StoreError> {
        let alias = alias.to_string();
        self.with(move |c| templates::template_by_alias(c, &alias))
            .await
    }

    async fn templates(&self) -> Result<Vec<warren_control::Template>, StoreError> {
        self.with(templates::templates).await
    }

    async fn delete_template(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.with(move |c| templates::delete_template(c, &id)).await
    }

    async fn put_build(&self, b: &warren_control::Build) -> Result<(), StoreError> {
        let b = b.clone();
        self.with(move |c| templates::put_build(c, &b)).await
    }

    async fn get_build(&self, id: &str) -> Result<Option<warren_control::Build>, StoreError> {
        let id = id.to_string();
        self.with(move |c| templates::get_build(c, &id)).await
    }

    async fn builds_of(&self, template_id: &str) -> Result<Vec<warren_control::Build>, StoreError> {
        let id = template_id.to_string();
        self.with(move |c| templates::builds_of(c, &id)).await
    }

    async fn builds_in(
        &self,
        status: warren_control::BuildStatus,
    ) -> Result<Vec<warren_control::Build>, StoreError> {
        self.with(move |c| templates::builds_in(c, status)).await
    }

    async fn append_build_logs(
        &self,
        build_id: &str,
        first: usize,
        entries: &[warren_control::LogEntry],
    ) -> Result<(), StoreError> {
        let (id, entries) = (build_id.to_string(), entries.to_vec());
        self.with(move |c| templates::append_logs(c, &id, first, &entries))
            .await
    }

    async fn build_logs(
        &self,
        build_id: &str,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<warren_control::LogEntry>, StoreError> {
        let id = build_id.to_string();
        self.with(move |c| templates::logs(c, &id, offset, limit))
            .await
    }
}

#[async_trait]
impl KeyStore for SqliteStore {
    async fn insert_api_key(&self, key: &ApiKey) -> Result<(), StoreError> {
        let k = key.clone();
        self.with(move |c| {
            c.conn
                .execute(
                    &format!(
                        "INSERT INTO api_keys ({KEY_COLUMNS}) VALUES (?1,?2,?3,?4,?5,?6,?7,?8)"
                    ),
                    params![
                        k.id,
                        k.name,
                        k.hash,
                        k.prefix,
                        micros(k.created_at),
                        k.revoked_at.map(micros),
                        k.team,
                        k.admin
                    ],
                )
                .map_err(backend)?;
            Ok(())
        })
        .await
    }

    async fn api_key_by_hash(&self, hash: &str) -> Result<Option<ApiKey>, StoreError> {
        let hash = hash.to_string();
        self.with(move |c| {
            c.conn
                .query_row(
                    &format!(
                    "SELECT {KEY_COLUMNS} FROM api_keys WHERE hash = ?1 AND revoked_at_us IS NULL"
                ),
                    [hash],
                    read_key,
                )
                .optional()
                .map_err(backend)?
                .map(decode_key)
                .transpose()
        })
        .await
    }

    async fn api_keys(&self) -> Result<Vec<ApiKey>, StoreError> {
        self.with(|c| {
            let mut stmt = c
                .conn
                .prepare(&format!(
                    "SELECT {KEY_COLUMNS} FROM api_keys ORDER BY created_at_us"
                ))
                .map_err(backend)?;
            let rows = stmt.query_map([], read_key).map_err(backend)?;
            rows.map(|r| r.map_err(backend).and_then(decode_key))
                .collect()
        })
        .await
    }

    async fn revoke_api_key(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.with(move |c| {
            let n = c
                .conn
                .execute(
                    "UPDATE api_keys SET revoked_at_us = ?2 WHERE id = ?1 AND revoked_at_us IS NULL",
                    params![id, micros(Utc::now())],
                )
                .map_err(backend)?;
            Ok(n == 1)
        })
        .await
    }
}

#[async_trait]
impl NetworkStore for SqliteStore {
    async fn put_network(&self, n: &warren_control::PrivateNetwork) -> Result<(), StoreError> {
        let n = n.clone();
        self.with(move |c| networks::put_network(c, &n)).await
    }

    async fn delete_network(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.with(move |c| networks::delete_network(c, &id)).await
    }

    async fn networks(&self) -> Result<Vec<warren_control::PrivateNetwork>, StoreError> {
        self.with(networks::networks).await
    }

    async fn put_member(&self, m: &warren_control::Member) -> Result<(), StoreError> {
        let m = m.clone();
        self.with(move |c| networks::put_member(c, &m)).await
    }

    async fn delete_member(&self, network_id: &str, sandbox_id: &str) -> Result<bool, StoreError> {
        let (n, s) = (network_id.to_string(), sandbox_id.to_string());
        self.with(move |c| networks::delete_member(c, &n, &s)).await
    }

    async fn members(&self) -> Result<Vec<warren_control::Member>, StoreError> {
        self.with(networks::members).await
    }
}

#[async_trait]
impl VolumeStore for SqliteStore {
    async fn put_volume(&self, v: &warren_control::Volume) -> Result<(), StoreError> {
        let v = v.clone();
        self.with(move |c| volumes::put(c, &v)).await
    }

    async fn get_volume(&self, id: &str) -> Result<Option<warren_control::Volume>, StoreError> {
        let id = id.to_string();
        self.with(move |c| volumes::get(c, "id = ?1", &[&id])).await
    }

    async fn volume_by_name(
        &self,
        team: &str,
        name: &str,
    ) -> Result<Option<warren_control::Volume>, StoreError> {
        let (t, n) = (team.to_string(), name.to_string());
        self.with(move |c| volumes::get(c, "team = ?1 AND name = ?2", &[&t, &n]))
            .await
    }

    async fn volumes(&self, team: Option<&str>) -> Result<Vec<warren_control::Volume>, StoreError> {
        let team = team.map(str::to_string);
        self.with(move |c| volumes::all(c, team.as_deref())).await
    }

    async fn delete_volume(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.with(move |c| volumes::delete(c, &id)).await
    }

    async fn put_volume_snapshot(
        &self,
        s: &warren_control::VolumeSnapshot,
    ) -> Result<(), StoreError> {
        let s = s.clone();
        self.with(move |c| volumes::put_snapshot(c, &s)).await
    }

    async fn get_volume_snapshot(
        &self,
        id: &str,
    ) -> Result<Option<warren_control::VolumeSnapshot>, StoreError> {
        let id = id.to_string();
        self.with(move |c| volumes::get_snapshot(c, &id)).await
    }

    async fn volume_snapshots(
        &self,
        team: Option<&str>,
    ) -> Result<Vec<warren_control::VolumeSnapshot>, StoreError> {
        let team = team.map(str::to_string);
        self.with(move |c| volumes::snapshots(c, team.as_deref()))
            .await
    }

    async fn delete_volume_snapshot(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.with(move |c| volumes::delete_snapshot(c, &id)).await
    }
}

#[async_trait]
impl SecretStore for SqliteStore {
    async fn put_secret(&self, s: &warren_control::SealedSecret) -> Result<(), StoreError> {
        let s = s.clone();
        self.with(move |c| vault::put(c, &s)).await
    }

    async fn get_secret(
        &self,
        id: &str,
    ) -> Result<Option<warren_control::SealedSecret>, StoreError> {
        let id = id.to_string();
        self.with(move |c| vault::get(c, "id = ?1", &[&id])).await
    }

    async fn secret_by_name(
        &self,
        team: &str,
        name: &str,
    ) -> Result<Option<warren_control::SealedSecret>, StoreError> {
        let (t, n) = (team.to_string(), name.to_string());
        self.with(move |c| vault::get(c, "team = ?1 AND name = ?2", &[&t, &n]))
            .await
    }

    async fn secrets(
        &self,
        team: Option<&str>,
    ) -> Result<Vec<warren_control::SecretInfo>, StoreError> {
        let team = team.map(str::to_string);
        self.with(move |c| vault::all(c, team.as_deref())).await
    }

    async fn delete_secret(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.with(move |c| vault::delete(c, &id)).await
    }
}

#[async_trait]
impl EventStore for SqliteStore {
    async fn append_event(&self, e: &warren_control::SandboxEvent) -> Result<(), StoreError> {
        let e = e.clone();
        self.with(move |c| events::append(c, &e)).await
    }

    async fn events(
        &self,
        q: &warren_control::EventQuery,
    ) -> Result<Vec<warren_control::SandboxEvent>, StoreError> {
        let q = q.clone();
        self.with(move |c| events::query(c, &q)).await
    }

    async fn prune_events(
        &self,
        before: chrono::DateTime<chrono::Utc>,
    ) -> Result<usize, StoreError> {
        let before = before.timestamp_micros();
        self.with(move |c| events::prune(c, before)).await
    }
}

#[async_trait]
impl WebhookStore for SqliteStore {
    async fn put_webhook(&self, h: &warren_control::SealedWebhook) -> Result<(), StoreError> {
        let h = h.clone();
        self.with(move |c| webhooks::put(c, &h)).await
    }

    async fn get_webhook(
        &self,
        id: &str,
    ) -> Result<Option<warren_control::SealedWebhook>, StoreError> {
        let id = id.to_string();
        self.with(move |c| webhooks::get(c, &id)).await
    }

    async fn webhooks(
        &self,
        team: Option<&str>,
    ) -> Result<Vec<warren_control::Webhook>, StoreError> {
        let team = team.map(str::to_string);
        self.with(move |c| webhooks::all(c, team.as_deref())).await
    }

    async fn delete_webhook(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.with(move |c| webhooks::delete(c, &id)).await
    }

    async fn put_delivery(&self, d: &warren_control::Delivery) -> Result<(), StoreError> {
        let d = d.clone();
        self.with(move |c| webhooks::put_delivery(c, &d)).await
    }

    async fn deliveries(&self) -> Result<Vec<warren_control::Delivery>, StoreError> {
        self.with(webhooks::deliveries).await
    }

    async fn delete_delivery(&self, id: &str) -> Result<(), StoreError> {
        let id = id.to_string();
        self.with(move |c| webhooks::delete_delivery(c, &id)).await
    }
}

#[async_trait]
impl AuditStore for SqliteStore {
    async fn append_audit(
        &self,
        entries: &[warren_control::StoredAudit],
    ) -> Result<Vec<usize>, StoreError> {
        let entries = entries.to_vec();
        self.with(move |c| audit::append(c, &entries)).await
    }

    async fn audit(
        &self,
        q: &warren_control::AuditQuery,
    ) -> Result<Vec<warren_control::AuditEntry>, StoreError> {
        let q = q.clone();
        self.with(move |c| audit::query(c, &q)).await
    }

    async fn prune_audit(
        &self,
        before: chrono::DateTime<chrono::Utc>,
    ) -> Result<usize, StoreError> {
        let before = before.timestamp_micros();
        self.with(move |c| audit::prune(c, before)).await
    }

    async fn audit_usage(&self, sandbox_id: &str) -> Result<u64, StoreError> {
        let id = sandbox_id.to_string();
        self.with(move |c| audit::usage(c, &id)).await
    }

    async fn audit_last(
        &self,
        sandbox_id: &str,
        source: &str,
    ) -> Result<Option<(u64, chrono::DateTime<chrono::Utc>)>, StoreError> {
        let (id, source) = (sandbox_id.to_string(), source.to_string());
        self.with(move |c| audit::last(c, &id, &source)).await
    }
}

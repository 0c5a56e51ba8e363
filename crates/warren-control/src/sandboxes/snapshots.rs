//! Snapshots: a running sandbox's state saved by the runtime (the sandbox keeps running), from
//! which new sandboxes start. A snapshot id (or name) is a valid `templateID` in create.
//!
//! The runtime's copy is made durable first, then the record; a name that is reused replaces the
//! older snapshot, whose runtime copy is deleted only after the new record is durable, so at
//! every moment the name resolves to a complete snapshot.

use chrono::Utc;
use tracing::Instrument;

use crate::error::ControlError;
use crate::model::SandboxState;
pub use crate::model::Snapshot;
use crate::random::random_id;
use crate::sandboxes::list::{decode_position, encode_position};
use crate::sandboxes::Sandboxes;

/// Filters and page of `list_snapshots`.
#[derive(Debug, Clone, Default)]
pub struct SnapshotQuery {
    pub sandbox_id: Option<String>,
    /// Name or id, optionally tag-qualified (`name:default`).
    pub name: Option<String>,
    /// Only this team's snapshots (`None`: every team's).
    pub team: Option<String>,
    pub limit: Option<u32>,
    pub next_token: Option<String>,
}

#[derive(Debug, Clone)]
pub struct SnapshotPage {
    pub items: Vec<Snapshot>,
    pub next_token: Option<String>,
}

const MAX_LIMIT: u32 = 100;

/// `name:tag` → `name`; SDKs and upstream ids carry a `:default` tag.
fn strip_tag(s: &str) -> &str {
    s.rsplit_once(':').map_or(s, |(n, _)| n)
}

/// A store count as a `usize` quota figure (saturating: a count past `usize` is over any quota).
fn count(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'))
}

impl Sandboxes {
    /// The snapshot a `templateID` (or list filter) names: by id, then by name; an optional
    /// tag is ignored.
    pub(crate) async fn find_snapshot(&self, r: &str) -> Result<Option<Snapshot>, ControlError> {
        let r = strip_tag(r.trim());
        if r.is_empty() {
            return Ok(None);
        }
        let store = &self.inner.store;
        if let Some(s) = store.get_snapshot(r).await? {
            return Ok(Some(s));
        }
        Ok(store.snapshot_by_name(r).await?)
    }

    /// Snapshots a running sandbox (it keeps running). `memory`: ask for memory in it
    /// (`true`), only files (`false`), or the best the runtime has (`None`); the record says
    /// which it got.
    pub(crate) async fn create_snapshot(
        &self,
        sandbox_id: &str,
        name: Option<String>,
        memory: Option<bool>,
    ) -> Result<Snapshot, ControlError> {
        let sandbox_id = sandbox_id.to_string();
        self.timed("snapshot", |c| async move {
            c.create_snapshot_now(&sandbox_id, name, memory).await
        })
        .await
    }

    async fn create_snapshot_now(
        &self,
        sandbox_id: &str,
        name: Option<String>,
        memory: Option<bool>,
    ) -> Result<Snapshot, ControlError> {
        crate::telemetry::trace_sandbox(sandbox_id);
        let name = self.check_snapshot_name(name)?;
        let memory = self.check_snapshot_mode(memory)?;
        self.check_snapshot_quota(sandbox_id, name.as_deref())
            .await?;
        let sb = self.locked(sandbox_id).await?;
        if sb.state != SandboxState::Running {
            return Err(ControlError::FailedPrecondition(format!(
                "sandbox {sandbox_id} is {}; only running sandboxes can be snapshotted",
                sb.state.as_str()
            )));
        }
        let id = random_id("s", 20)?;
        let key = id.clone();
        // The sandbox's lock is held so a pause or kill waits for the snapshot to finish.
        let info = self
            .inner
            .runtime
            .snapshot(sandbox_id, &key, memory)
            .instrument(self.stage("runtime.snapshot"))
            .await
            .map_err(|e| {
                self.runtime_error(e, &format!("snapshotting sandbox {sandbox_id} failed"))
            })?;
        let snap = Snapshot {
            id,
            names: name.iter().cloned().collect(),
            key,
            sandbox_id: sb.id.to_string(),
            template: sb.template.clone(),
            resources: sb.resources,
            allow_internet_access: sb.allow_internet_access,
            env_vars: sb.env_vars.clone(),
            metadata: sb.metadata.clone(),
            memory: info.memory,
            bytes: info.bytes,
            created_at: Utc::now(),
            team: sb.team.clone(),
            volume_mounts: sb.volume_mounts.clone(),
        };
        let owner = (*sb).clone();
        drop(sb);
        let older = match &name {
            Some(n) => self.inner.store.snapshot_by_name(n).await?,
            None => None,
        };
        if let Err(e) = self
            .inner
            .store
            .insert_snapshot(&snap, older.as_ref().map(|o| o.id.as_str()))
            .await
        {
            // Not acknowledged: do not keep an unrecorded copy.
            self.forget_runtime_snapshot(&snap.key).await;
            return Err(e.into());
        }
        if let Some(old) = older {
            self.forget_runtime_snapshot(&old.key).await;
        }
        let data = serde_json::json!({"snapshot_id": snap.id, "memory": snap.memory});
        self.inner
            .events
            .record(&owner, crate::events::EventKind::Checkpointed, Some(data))
            .await;
        tracing::info!(snapshot_id = %snap.id, sandbox_id = %sandbox_id, memory = snap.memory, bytes = snap.bytes, "snapshot created");
        Ok(snap)
    }

    /// Refuses a snapshot that would take more than the quotas allow (a replaced name frees
    /// its older snapshot, so it does not count).
    async fn check_snapshot_quota(
        &self,
        sandbox_id: &str,
        name: Option<&str>,
    ) -> Result<(), ControlError> {
        self.check_headroom()?;
        let cfg = &self.inner.config;
        let store = &self.inner.store;
        // Counted by the store (aggregates), not by loading every record.
        let (total, bytes) = store.snapshot_usage(None, name).await?;
        let (mine, _) = store.snapshot_usage(Some(sandbox_id), name).await?;
        let (total, mine) = (count(total), count(mine));
        let refuse = |what: String| Err(ControlError::QuotaExceeded(what));
        if total >= cfg.max_snapshots {
            return refuse(format!(
                "this server keeps at most {} snapshots; delete one first",
                cfg.max_snapshots
            ));
        }
        if mine >= cfg.max_snapshots_per_sandbox {
            return refuse(format!(
                "sandbox {sandbox_id} has {mine} snapshots, the most one sandbox may have; \
                 delete one first"
            ));
        }
        if bytes >= cfg.max_snapshot_bytes {
            return refuse(format!(
                "snapshots take {bytes} bytes, the most this server keeps ({}); delete some \
                 first",
                cfg.max_snapshot_bytes
            ));
        }
        Ok(())
    }

    /// A snapshot name as asked (`None` or blank: none), checked: its characters, and not a
    /// template's name. Checked before anything else, ownership included.
    pub(crate) fn check_snapshot_name(
        &self,
        name: Option<String>,
    ) -> Result<Option<String>, ControlError> {
        let name = name.map(|n| n.trim().to_string()).filter(|n| !n.is_empty());
        if let Some(n) = &name {
            if !valid_name(n) {
                return Err(ControlError::InvalidArgument(format!(
                    "invalid snapshot name {n:?}: use 1-128 letters, digits, '-', '_', '.', '/'"
                )));
            }
            if self
                .inner
                .config
                .template_names
                .iter()
                .any(|t| t == strip_tag(n))
            {
                return Err(ControlError::InvalidArgument(format!(
                    "snapshot name {n:?} is a template's name; choose another"
                )));
            }
        }
        Ok(name)
    }

    /// Whether a snapshot keeps memory: what was asked if the runtime has it, else the best it
    /// has when nothing was asked. Refuses a mode the runtime does not have.
    pub(crate) fn check_snapshot_mode(&self, memory: Option<bool>) -> Result<bool, ControlError> {
        let caps = self.inner.runtime.capabilities();
        let name = self.inner.runtime.name();
        if !caps.snapshot {
            return Err(ControlError::InvalidArgument(format!(
                "the {name} runtime cannot take snapshots"
            )));
        }
        if memory == Some(true) && !caps.snapshot_memory {
            return Err(ControlError::InvalidArgument(format!(
                "the {name} runtime's snapshots cannot keep memory; a filesystem snapshot \
                 (memory: false, mode=\"filesystem\") works"
            )));
        }
        if memory == Some(false) && !caps.snapshot_filesystem {
            return Err(ControlError::InvalidArgument(format!(
                "the {name} runtime cannot take filesystem-only snapshots; a full snapshot \
                 (mode=\"full\") works"
            )));
        }
        Ok(memory.unwrap_or(caps.snapshot_memory))
    }

    pub(crate) async fn forget_runtime_snapshot(&self, key: &str) {
        match self.inner.runtime.delete_snapshot(key).await {
            Ok(()) | Err(warren_runtime::RuntimeError::NotFound(_)) => {}
            Err(e) => {
                tracing::warn!(snapshot_key = %key, error = %warren_runtime::chain(&e), "deleting runtime snapshot")
            }
        }
    }

    /// Snapshots, newest first, filtered by source sandbox and/or name.
    pub(crate) async fn list_snapshots(
        &self,
        q: &SnapshotQuery,
    ) -> Result<SnapshotPage, ControlError> {
        let limit = match q.limit {
            None => MAX_LIMIT,
            Some(l) if (1..=MAX_LIMIT).contains(&l) => l,
            Some(l) => {
                return Err(ControlError::InvalidArgument(format!(
                    "limit must be between 1 and {MAX_LIMIT}, not {l}"
                )))
            }
        } as usize;
        let cursor = q.next_token.as_deref().map(decode_position).transpose()?;
        let name = q.name.as_deref().map(|n| strip_tag(n.trim()));
        // One more than the page, to know whether another page follows.
        let mut items = self
            .inner
            .store
            .snapshot_page(
                q.team.as_deref(),
                q.sandbox_id.as_deref(),
                name,
                cursor.as_ref().map(|(t, id)| (*t, id.as_str())),
                limit + 1,
            )
            .await?;
        let more = items.len() > limit;
        items.truncate(limit);
        let next_token = if more {
            items
                .last()
                .map(|s| encode_position(s.created_at.timestamp_micros(), &s.id))
        } else {
            None
        };
        Ok(SnapshotPage { items, next_token })
    }

    /// Deletes a snapshot by id or name (tag optional); sandboxes created from it live on.
    pub(crate) async fn delete_snapshot(&self, r: &str) -> Result<(), ControlError> {
        let r = r.to_string();
        self.detached(|c| async move {
            let snap = c
                .find_snapshot(&r)
                .await?
                .ok_or_else(|| ControlError::NotFound(format!("snapshot {r} not found")))?;
            // The record goes first: once it is gone nothing can start from the key.
            if !c.inner.store.delete_snapshot(&snap.id).await? {
                return Err(ControlError::NotFound(format!("snapshot {r} not found")));
            }
            c.forget_runtime_snapshot(&snap.key).await;
            tracing::info!(snapshot_id = %snap.id, "snapshot deleted");
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_and_names() {
        assert_eq!(strip_tag("sabc:default"), "sabc");
        assert_eq!(strip_tag("team/name:v1"), "team/name");
        assert_eq!(strip_tag("plain"), "plain");
        assert!(valid_name("my-snap_1.0/x"));
        assert!(!valid_name("a:b"));
        assert!(!valid_name(""));
        assert!(!valid_name(&"x".repeat(129)));
    }
}

//! Volumes: storage that outlives sandboxes, mounted into several at once.
//!
//! A volume belongs to a team, has a name unique in it (E2B's rule: `[a-zA-Z0-9_-]+`), a
//! quota in bytes and inodes, and a token for E2B's volume content API (the SDK's `Volume`
//! reads and writes files with it, no sandbox needed). Where its files live is the host's
//! business ([`VolumeDisks`]); the control plane records volumes, checks mounts at create
//! (E2B's `volumeMounts`, by volume name), keeps them on the sandbox's record so pause,
//! resume, snapshots and forks mount the same volumes again, and refuses to delete a volume
//! a sandbox still mounts.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;
use warren_runtime::{SandboxRuntime, VolumeMount};

use crate::config::Config;
use crate::error::ControlError;
use crate::random::{random_id, random_secret};
use crate::store::VolumeStore;

/// Volumes one sandbox may mount.
pub const MAX_VOLUME_MOUNTS: usize = 16;
/// Longest volume name.
pub const MAX_NAME_LEN: usize = 128;

/// Sandbox paths no volume may cover: the kernel's views and the agent.
const RESERVED_PATHS: &[&str] = &["/proc", "/sys", "/dev", "/usr/local/bin/warren-agent"];

/// A volume as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Volume {
    pub id: String,
    pub name: String,
    pub team: String,
    pub quota: VolumeQuota,
    pub created_at: DateTime<Utc>,
    /// Bearer token of the content API. A credential: the store seals it, and it is kept
    /// out of the record's document.
    #[serde(skip)]
    pub token: String,
}

/// What a volume may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeQuota {
    pub bytes: u64,
    pub inodes: u64,
}

/// What a volume holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeUsage {
    pub bytes_used: u64,
    pub bytes_total: u64,
    pub inodes_used: u64,
    pub inodes_total: u64,
}

/// One volume a caller asks to mount (E2B's `{name, path}`, plus Warren's `readOnly` and
/// `subpath`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MountRequest {
    /// The volume's name (E2B refers to volumes by name here) or id.
    pub name: String,
    pub path: String,
    pub read_only: bool,
    /// A directory inside the volume to mount instead of its root (made if missing).
    pub subpath: Option<String>,
}

/// One volume a sandbox mounts, on its record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeMountRecord {
    pub volume_id: String,
    pub name: String,
    pub path: String,
    #[serde(default)]
    pub read_only: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subpath: Option<String>,
}

/// Why the host could not do something with a volume's disk.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// The caller's input (a quota, a subpath) is not acceptable.
    #[error("{0}")]
    Invalid(String),
    /// The host's disk (not the volume) is full.
    #[error("{0}")]
    NoSpace(String),
    /// The operation needs the volume unused.
    #[error("{0}")]
    Busy(String),
    #[error("{0}")]
    Failed(String),
}

/// Where volumes' files live on this host.
#[async_trait]
pub trait VolumeDisks: Send + Sync + 'static {
    /// Makes an empty volume with `quota`.
    async fn create(&self, id: &str, quota: VolumeQuota) -> Result<(), DiskError>;
    /// Removes a volume and everything in it. Idempotent.
    async fn delete(&self, id: &str) -> Result<(), DiskError>;
    /// The volume's root on the host (mounted there first), with `subpath` made inside it
    /// if missing (never through a symbolic link).
    async fn source(&self, id: &str, subpath: Option<&str>) -> Result<PathBuf, DiskError>;
    async fn usage(&self, id: &str) -> Result<VolumeUsage, DiskError>;
    /// A consistent copy of volume `id` as snapshot `snap_id`; returns the bytes it takes.
    async fn snapshot(&self, id: &str, snap_id: &str) -> Result<u64, DiskError>;
    /// A new volume `id` with snapshot `snap_id`'s content and size.
    async fn create_from_snapshot(&self, snap_id: &str, id: &str) -> Result<(), DiskError>;
    /// Removes a snapshot. Idempotent.
    async fn delete_snapshot(&self, snap_id: &str) -> Result<(), DiskError>;
    /// Every volume and every snapshot on the host, by id.
    async fn inventory(&self) -> Result<(Vec<String>, Vec<String>), DiskError>;
    /// Grows volume `id` to `bytes` (its filesystem with it); repeating a grow is harmless.
    async fn grow(&self, id: &str, bytes: u64) -> Result<(), DiskError> {
        let _ = (id, bytes);
        Err(DiskError::Invalid(
            "this server's volume storage cannot grow volumes".into(),
        ))
    }
}

/// A point-in-time copy of a volume; new volumes can start from it. It outlives its volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeSnapshot {
    pub id: String,
    pub volume_id: String,
    /// The volume's name when the snapshot was taken.
    pub volume_name: String,
    pub team: String,
    /// Its volume's quota: a volume made from it gets the same.
    pub quota: VolumeQuota,
    /// Bytes it takes on the host's disk.
    pub bytes: u64,
    pub created_at: DateTime<Utc>,
}

/// What a caller may ask of a new volume's quota (omitted: the server's defaults).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuotaRequest {
    pub bytes: Option<u64>,
    pub inodes: Option<u64>,
}

fn disk_error(e: DiskError) -> ControlError {
    match e {
        DiskError::Invalid(m) => ControlError::InvalidArgument(m),
        DiskError::NoSpace(m) => ControlError::QuotaExceeded(m),
        DiskError::Busy(m) => ControlError::FailedPrecondition(m),
        DiskError::Failed(m) => ControlError::internal(m),
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `path` is absolute and clean (no `.`, `..`, empty or trailing components): E2B's rule.
fn clean_absolute(path: &str) -> bool {
    path.len() > 1
        && path.starts_with('/')
        && !path.ends_with('/')
        && path[1..]
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\0'))
}

/// `subpath` is relative and clean.
fn clean_relative(subpath: &str) -> bool {
    subpath
        .split('/')
        .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\0'))
}

fn under(path: &str, dir: &str) -> bool {
    path == dir || path.strip_prefix(dir).is_some_and(|r| r.starts_with('/'))
}

fn volume_not_found(r: &str) -> ControlError {
    ControlError::NotFound(format!("volume {r} not found"))
}

/// Who mounts a volume: the sandboxes' side, which volumes do not depend on.
#[async_trait]
pub(crate) trait MountedBy: Send + Sync {
    /// Live sandboxes (not killed or failed) that mount volume `id`.
    async fn mounted_by(&self, id: &str) -> Vec<String>;
}

/// Sizes and counts volumes keep to, from the server's configuration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct VolumeLimits {
    /// A new volume's bytes and inodes when it asks for none.
    pub bytes: u64,
    pub inodes: u64,
    pub max_bytes: u64,
    pub max_volumes: usize,
    pub max_snapshots: usize,
}

impl VolumeLimits {
    pub(crate) fn of(config: &Config) -> Self {
        Self {
            bytes: config.volume_bytes,
            inodes: config.volume_inodes,
            max_bytes: config.max_volume_bytes,
            max_volumes: config.max_volumes,
            max_snapshots: config.max_volume_snapshots,
        }
    }
}

/// Volumes and their snapshots: records, the host's disks, and the mounts a create asks
/// for. Depends on no other service; whether a sandbox still mounts a volume is the caller's
/// to say ([`Volumes::delete`]).
pub(crate) struct Volumes {
    store: Arc<dyn VolumeStore>,
    /// The host's volume storage (`None`: volumes are off).
    disks: Option<Arc<dyn VolumeDisks>>,
    /// Whether the runtime mounts volumes, and its name for the refusal.
    runtime: Arc<dyn SandboxRuntime>,
    limits: VolumeLimits,
    /// Serialises creation and deletion of volumes and their snapshots: name, count and
    /// in-use checks.
    lock: Mutex<()>,
}

impl Volumes {
    pub(crate) fn new(
        store: Arc<dyn VolumeStore>,
        disks: Option<Arc<dyn VolumeDisks>>,
        runtime: Arc<dyn SandboxRuntime>,
        limits: VolumeLimits,
    ) -> Self {
        Self {
            store,
            disks,
            runtime,
            limits,
            lock: Mutex::new(()),
        }
    }

    /// Removes the volumes and snapshots on the host that no record names: what a crash
    /// between a disk's creation and its record (or a record's removal and its disk's) left.
    /// Call it before serving (nothing may be created meanwhile). Returns how many went.
    pub(crate) async fn sweep(&self) -> Result<usize, ControlError> {
        let disks = self.disks()?;
        let _g = self.lock.lock().await;
        let (volumes, snapshots) = disks.inventory().await.map_err(disk_error)?;
        let known: std::collections::HashSet<String> = self
            .store
            .volumes(None)
            .await?
            .into_iter()
            .map(|v| v.id)
            .collect();
        let known_snaps: std::collections::HashSet<String> = self
            .store
            .volume_snapshots(None)
            .await?
            .into_iter()
            .map(|s| s.id)
            .collect();
        let mut n = 0;
        for id in volumes.iter().filter(|id| !known.contains(*id)) {
            tracing::warn!(volume_id = %id, "removing a volume no record names");
            disks.delete(id).await.map_err(disk_error)?;
            n += 1;
        }
        for id in snapshots.iter().filter(|id| !known_snaps.contains(*id)) {
            tracing::warn!(snapshot_id = %id, "removing a volume snapshot no record names");
            disks.delete_snapshot(id).await.map_err(disk_error)?;
            n += 1;
        }
        Ok(n)
    }

    fn disks(&self) -> Result<&dyn VolumeDisks, ControlError> {
        self.disks.as_deref().ok_or_else(|| {
            ControlError::Unavailable("volumes are not enabled on this server".into())
        })
    }

    /// Makes a volume for `team`, empty or with the content of snapshot `from` (one of
    /// `team`'s; the volume gets the snapshot's quota).
    pub(crate) async fn create(
        &self,
        team: &str,
        name: &str,
        quota: QuotaRequest,
        from: Option<&str>,
    ) -> Result<Volume, ControlError> {
        if !valid_name(name) {
            return Err(ControlError::InvalidArgument(format!(
                "Invalid volume name {name:?}: use 1 to {MAX_NAME_LEN} letters, digits, '_' \
                 and '-'"
            )));
        }
        let cfg = &self.limits;
        let source = match from {
            Some(s) => Some(self.get_snapshot(Some(team), s).await?),
            None => None,
        };
        let quota = match &source {
            Some(s) if quota == QuotaRequest::default() => s.quota,
            Some(_) => {
                return Err(ControlError::InvalidArgument(
                    "a volume made from a snapshot has the snapshot's quota".into(),
                ))
            }
            None => {
                let bytes = quota.bytes.unwrap_or(cfg.bytes);
                // Without an inode count, the default, or one per 4 KiB for a small volume
                // (whose inode tables must fit in it).
                let inodes = quota
                    .inodes
                    .unwrap_or_else(|| cfg.inodes.min(bytes / 4096).max(64));
                VolumeQuota { bytes, inodes }
            }
        };
        if quota.bytes > cfg.max_bytes {
            return Err(ControlError::InvalidArgument(format!(
                "a volume may hold at most {} bytes",
                cfg.max_bytes
            )));
        }
        let disks = self.disks()?;
        // One create per name at a time: the check and the record must not interleave.
        let _g = self.lock.lock().await;
        if self.store.volume_by_name(team, name).await?.is_some() {
            return Err(ControlError::InvalidArgument(format!(
                "volume {name} already exists"
            )));
        }
        if self.store.volumes(None).await?.len() >= cfg.max_volumes {
            return Err(ControlError::QuotaExceeded(format!(
                "this server keeps at most {} volumes; delete one first",
                cfg.max_volumes
            )));
        }
        let volume = Volume {
            id: random_id("vol", 17)?,
            name: name.to_string(),
            team: team.to_string(),
            quota,
            created_at: Utc::now(),
            token: random_secret("wvt_")?,
        };
        match &source {
            Some(s) => disks.create_from_snapshot(&s.id, &volume.id).await,
            None => disks.create(&volume.id, quota).await,
        }
        .map_err(disk_error)?;
        if let Err(e) = self.store.put_volume(&volume).await {
            // Not acknowledged: no disk without a record.
            if let Err(d) = disks.delete(&volume.id).await {
                tracing::warn!(volume_id = %volume.id, error = %d, "removing an unrecorded volume");
            }
            return Err(e.into());
        }
        tracing::info!(volume_id = %volume.id, name = %volume.name, %team, "volume created");
        Ok(volume)
    }

    /// The volume `r` (an id, or a name in `team`) if `team` may see it (`None`: any team).
    pub(crate) async fn get(&self, team: Option<&str>, r: &str) -> Result<Volume, ControlError> {
        let by_id = self.store.get_volume(r).await?;
        let found = match (by_id, team) {
            (Some(v), None) => Some(v),
            (Some(v), Some(t)) if v.team == t => Some(v),
            (_, Some(t)) => self.store.volume_by_name(t, r).await?,
            // An admin names a volume of any team: only a name no other team uses will do.
            (None, None) => {
                let mut named: Vec<Volume> = self
                    .store
                    .volumes(None)
                    .await?
                    .into_iter()
                    .filter(|v| v.name == r)
                    .collect();
                if named.len() > 1 {
                    return Err(ControlError::InvalidArgument(format!(
                        "several teams have a volume named {r}; use its id"
                    )));
                }
                named.pop()
            }
        };
        found.ok_or_else(|| volume_not_found(r))
    }

    /// Every volume `team` may see (`None`: all), oldest first.
    pub(crate) async fn list(&self, team: Option<&str>) -> Result<Vec<Volume>, ControlError> {
        let mut all = self.store.volumes(team).await?;
        all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(all)
    }

    pub(crate) async fn usage(&self, volume: &Volume) -> Result<VolumeUsage, ControlError> {
        self.disks()?.usage(&volume.id).await.map_err(disk_error)
    }

    /// The volume whose content-API token is `token` (`id` is the path's volume id).
    /// Wrong tokens and unknown ids look the same.
    pub(crate) async fn by_token(&self, id: &str, token: &str) -> Result<Volume, ControlError> {
        let denied = || ControlError::PermissionDenied("invalid or missing volume token".into());
        let v = self.store.get_volume(id).await?.ok_or_else(denied)?;
        let ok: bool = subtle::ConstantTimeEq::ct_eq(v.token.as_bytes(), token.as_bytes()).into();
        if ok && !token.is_empty() {
            Ok(v)
        } else {
            Err(denied())
        }
    }

    /// Deletes volume `r` and its files, unless a sandbox (running or paused) mounts it:
    /// `users` says which do, asked while no other volume change can interleave.
    pub(crate) async fn delete(
        &self,
        team: Option<&str>,
        r: &str,
        users: &dyn MountedBy,
    ) -> Result<(), ControlError> {
        let v = self.get(team, r).await?;
        let _g = self.lock.lock().await;
        let users = users.mounted_by(&v.id).await;
        if !users.is_empty() {
            return Err(ControlError::FailedPrecondition(format!(
                "volume {} is mounted by sandbox {}; kill it first",
                v.name,
                users.join(", ")
            )));
        }
        self.store.delete_volume(&v.id).await?;
        self.disks()?.delete(&v.id).await.map_err(disk_error)?;
        tracing::info!(volume_id = %v.id, name = %v.name, "volume deleted");
        Ok(())
    }

    /// Grows volume `r` to `bytes` (more than it has, at most the server's maximum). Where the
    /// host can resize a mounted filesystem its sandboxes keep running and see the new size;
    /// else only a volume no sandbox mounts can grow (409 otherwise).
    pub(crate) async fn grow(
        &self,
        team: Option<&str>,
        r: &str,
        bytes: u64,
    ) -> Result<Volume, ControlError> {
        let max = self.limits.max_bytes;
        let mut v = self.get(team, r).await?;
        if bytes <= v.quota.bytes {
            return Err(ControlError::InvalidArgument(format!(
                "volume {} holds {} bytes; a new size must be larger (volumes do not shrink)",
                v.name, v.quota.bytes
            )));
        }
        if bytes > max {
            return Err(ControlError::InvalidArgument(format!(
                "a volume may hold at most {max} bytes"
            )));
        }
        let disks = self.disks()?;
        let _g = self.lock.lock().await;
        disks.grow(&v.id, bytes).await.map_err(disk_error)?;
        // ext4 adds inodes with the space: record what the volume has now.
        let inodes = match disks.usage(&v.id).await {
            Ok(u) => u.inodes_total.max(v.quota.inodes),
            Err(_) => v.quota.inodes,
        };
        v.quota = VolumeQuota { bytes, inodes };
        self.store.put_volume(&v).await?;
        tracing::info!(volume_id = %v.id, name = %v.name, bytes, "volume grown");
        Ok(v)
    }

    /// Takes a snapshot of volume `r` (writers in its sandboxes wait while it is copied).
    pub(crate) async fn snapshot(
        &self,
        team: Option<&str>,
        r: &str,
    ) -> Result<VolumeSnapshot, ControlError> {
        let v = self.get(team, r).await?;
        let disks = self.disks()?;
        let _g = self.lock.lock().await;
        let max = self.limits.max_snapshots;
        if self.store.volume_snapshots(None).await?.len() >= max {
            return Err(ControlError::QuotaExceeded(format!(
                "this server keeps at most {max} volume snapshots; delete one first"
            )));
        }
        let id = random_id("vsn", 17)?;
        let bytes = disks.snapshot(&v.id, &id).await.map_err(disk_error)?;
        let snap = VolumeSnapshot {
            id,
            volume_id: v.id,
            volume_name: v.name,
            team: v.team,
            quota: v.quota,
            bytes,
            created_at: Utc::now(),
        };
        if let Err(e) = self.store.put_volume_snapshot(&snap).await {
            let _ = disks.delete_snapshot(&snap.id).await;
            return Err(e.into());
        }
        Ok(snap)
    }

    /// Snapshots `team` may see (`None`: all), of volume `volume_id` only when given, oldest
    /// first.
    pub(crate) async fn snapshots(
        &self,
        team: Option<&str>,
        volume_id: Option<&str>,
    ) -> Result<Vec<VolumeSnapshot>, ControlError> {
        let mut all: Vec<VolumeSnapshot> = self
            .store
            .volume_snapshots(team)
            .await?
            .into_iter()
            .filter(|s| volume_id.is_none_or(|v| s.volume_id == v))
            .collect();
        all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(all)
    }

    pub(crate) async fn get_snapshot(
        &self,
        team: Option<&str>,
        id: &str,
    ) -> Result<VolumeSnapshot, ControlError> {
        match self.store.get_volume_snapshot(id).await? {
            Some(s) if team.is_none_or(|t| s.team == t) => Ok(s),
            _ => Err(ControlError::NotFound(format!(
                "volume snapshot {id} not found"
            ))),
        }
    }

    pub(crate) async fn delete_snapshot(
        &self,
        team: Option<&str>,
        id: &str,
    ) -> Result<(), ControlError> {
        let s = self.get_snapshot(team, id).await?;
        self.store.delete_volume_snapshot(&s.id).await?;
        self.disks()?
            .delete_snapshot(&s.id)
            .await
            .map_err(disk_error)
    }

    /// Checks a create's `volumeMounts` for `team` and resolves them to volumes (errors as
    /// E2B words them: `invalid mounts:` and one line per bad mount).
    pub(crate) async fn resolve_mounts(
        &self,
        team: &str,
        mounts: &[MountRequest],
    ) -> Result<Vec<VolumeMountRecord>, ControlError> {
        if mounts.is_empty() {
            return Ok(Vec::new());
        }
        if !self.runtime.capabilities().volumes {
            return Err(ControlError::InvalidArgument(format!(
                "the {} runtime does not mount volumes yet",
                self.runtime.name()
            )));
        }
        self.disks()?;
        if mounts.len() > MAX_VOLUME_MOUNTS {
            return Err(ControlError::InvalidArgument(format!(
                "invalid mounts: at most {MAX_VOLUME_MOUNTS} volumes per sandbox"
            )));
        }
        let mut problems = Vec::new();
        let mut out: Vec<VolumeMountRecord> = Vec::new();
        for (i, m) in mounts.iter().enumerate() {
            let problem = if m.path.is_empty() {
                Some("path must not be empty".to_string())
            } else if !clean_absolute(&m.path) {
                Some(format!("path {:?} must be absolute and clean", m.path))
            } else if let Some(r) = RESERVED_PATHS.iter().find(|r| under(&m.path, r)) {
                Some(format!("path {} is reserved ({r})", m.path))
            } else if out.iter().any(|o| o.path == m.path) {
                Some(format!("path {} is used twice", m.path))
            } else if m.subpath.as_deref().is_some_and(|s| !clean_relative(s)) {
                Some("subpath must be relative and clean".to_string())
            } else {
                match self.get(Some(team), &m.name).await {
                    Ok(v) => {
                        out.push(VolumeMountRecord {
                            volume_id: v.id,
                            name: v.name,
                            path: m.path.clone(),
                            read_only: m.read_only,
                            subpath: m.subpath.clone(),
                        });
                        None
                    }
                    Err(ControlError::NotFound(_)) => {
                        Some(format!("volume {:?} not found", m.name))
                    }
                    Err(e) => return Err(e),
                }
            };
            if let Some(p) = problem {
                problems.push(format!("\t- volume mount #{i}: {p}"));
            }
        }
        if !problems.is_empty() {
            return Err(ControlError::InvalidArgument(format!(
                "invalid mounts:\n{}",
                problems.join("\n")
            )));
        }
        // Parents before what lies inside them.
        out.sort_by_key(|m| m.path.matches('/').count());
        Ok(out)
    }

    /// The runtime's view of `mounts`: each volume mounted on the host (again, after a host
    /// restart) and its directory.
    pub(crate) async fn mount_sources(
        &self,
        mounts: &[VolumeMountRecord],
    ) -> Result<Vec<VolumeMount>, ControlError> {
        let mut out = Vec::with_capacity(mounts.len());
        for m in mounts {
            let source = self
                .disks()?
                .source(&m.volume_id, m.subpath.as_deref())
                .await
                .map_err(|e| match e {
                    DiskError::Failed(msg) => ControlError::Unavailable(format!(
                        "volume {} cannot be mounted: {msg}",
                        m.name
                    )),
                    other => disk_error(other),
                })?;
            out.push(VolumeMount {
                volume_id: m.volume_id.clone(),
                source,
                subpath: m.subpath.clone(),
                path: m.path.clone(),
                read_only: m.read_only,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_paths() {
        assert!(valid_name("data_1-x"));
        assert!(!valid_name("") && !valid_name("a b") && !valid_name("a/b"));
        assert!(clean_absolute("/mnt/data"));
        for bad in [
            "",
            "/",
            "mnt",
            "/mnt/",
            "/mnt//d",
            "/mnt/./d",
            "/mnt/../etc",
        ] {
            assert!(!clean_absolute(bad), "{bad}");
        }
        assert!(clean_relative("a/b") && !clean_relative("../a") && !clean_relative("/a"));
        assert!(under("/proc/self", "/proc") && under("/proc", "/proc"));
        assert!(!under("/process", "/proc"));
    }
}

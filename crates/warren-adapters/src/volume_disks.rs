//! [`HostDisks`]: the control plane's volume disks ([`VolumeDisks`]) over this host's
//! volume storage (`warren-volume`), its errors mapped to [`DiskError`]s.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use warren_control::{DiskError, VolumeDisks, VolumeQuota, VolumeUsage};
use warren_volume::{ErrorKind, VolumeError, VolumeHost};

/// The control plane's view of this host's volume storage.
pub struct HostDisks(pub Arc<VolumeHost>);

fn disk_error(e: VolumeError) -> DiskError {
    if let VolumeError::Busy(m) = e {
        return DiskError::Busy(m);
    }
    match e.kind() {
        ErrorKind::BadRequest | ErrorKind::Conflict | ErrorKind::NotFound => {
            DiskError::Invalid(e.to_string())
        }
        ErrorKind::InsufficientStorage => DiskError::NoSpace(e.to_string()),
        ErrorKind::Internal => DiskError::Failed(e.to_string()),
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, VolumeError> + Send + 'static,
) -> Result<T, DiskError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| DiskError::Failed(format!("volume task: {e}")))?
        .map_err(disk_error)
}

#[async_trait]
impl VolumeDisks for HostDisks {
    async fn create(&self, id: &str, quota: VolumeQuota) -> Result<(), DiskError> {
        let (host, id) = (self.0.clone(), id.to_string());
        let quota = warren_volume::Quota {
            bytes: quota.bytes,
            inodes: quota.inodes,
        };
        blocking(move || host.create(&id, quota)).await
    }

    async fn delete(&self, id: &str) -> Result<(), DiskError> {
        let (host, id) = (self.0.clone(), id.to_string());
        blocking(move || host.delete(&id)).await
    }

    async fn source(&self, id: &str, subpath: Option<&str>) -> Result<PathBuf, DiskError> {
        let (host, id, sub) = (self.0.clone(), id.to_string(), subpath.map(str::to_string));
        blocking(move || {
            let root = host.ensure_mounted(&id)?;
            if let Some(sub) = sub {
                // Made (or found) beneath the volume's root; a link in the way is an error.
                let made =
                    host.content(&id)?
                        .make_dir(&sub, &warren_volume::Owner::default(), true)?;
                if made.kind != warren_volume::EntryKind::Directory {
                    return Err(VolumeError::NotADirectory(sub));
                }
            }
            Ok(root)
        })
        .await
    }

    async fn snapshot(&self, id: &str, snap_id: &str) -> Result<u64, DiskError> {
        let (host, id, snap) = (self.0.clone(), id.to_string(), snap_id.to_string());
        blocking(move || host.snapshot(&id, &snap)).await
    }

    async fn create_from_snapshot(&self, snap_id: &str, id: &str) -> Result<(), DiskError> {
        let (host, id, snap) = (self.0.clone(), id.to_string(), snap_id.to_string());
        blocking(move || host.create_from_snapshot(&snap, &id)).await
    }

    async fn delete_snapshot(&self, snap_id: &str) -> Result<(), DiskError> {
        let (host, snap) = (self.0.clone(), snap_id.to_string());
        blocking(move || host.delete_snapshot(&snap)).await
    }

    async fn grow(&self, id: &str, bytes: u64) -> Result<(), DiskError> {
        let (host, id) = (self.0.clone(), id.to_string());
        blocking(move || host.grow(&id, bytes)).await
    }

    async fn inventory(&self) -> Result<(Vec<String>, Vec<String>), DiskError> {
        let host = self.0.clone();
        blocking(move || Ok((host.volume_ids()?, host.snapshot_ids()?))).await
    }

    async fn usage(&self, id: &str) -> Result<VolumeUsage, DiskError> {
        let (host, id) = (self.0.clone(), id.to_string());
        let u = blocking(move || host.usage(&id)).await?;
        Ok(VolumeUsage {
            bytes_used: u.bytes_used,
            bytes_total: u.bytes_total,
            inodes_used: u.inodes_used,
            inodes_total: u.inodes_total,
        })
    }
}

//! What builds leave on disk, and removing what nothing uses.
//!
//! ```text
//! <data>/images/b<24 hex>/        built and pulled images   (kept while a tag, sandbox or snapshot names them)
//! <data>/build-cache/<layer>.json  a cached step -> runtime snapshot `bl<30 hex>`
//! <data>/oci/blobs/sha256/<hex>   pulled registry layers, shared by every pull
//! ```
//!
//! Sizes are blocks really allocated (sparse files count for what they hold). The control
//! plane holds the build gate while pruning, so no build loses a layer it is using.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use warren_control::{BuilderError, DiskPart, DiskUse};

use crate::Builder;

/// Bytes allocated under `path` (files, directories, links; not following links).
fn allocated(path: &Path) -> u64 {
    let Ok(meta) = path.symlink_metadata() else {
        return 0;
    };
    let mut total = meta.blocks() * 512;
    if meta.is_dir() {
        if let Ok(dir) = std::fs::read_dir(path) {
            for e in dir.flatten() {
                total += allocated(&e.path());
            }
        }
    }
    total
}

fn io(what: &str) -> impl FnOnce(std::io::Error) -> BuilderError + '_ {
    move |source| BuilderError::Io {
        what: what.to_string(),
        source,
    }
}

/// The built images on disk: (key, bytes).
fn images(data: &Path) -> Vec<(String, u64)> {
    let Ok(dir) = std::fs::read_dir(warren_template::images_dir(data)) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let key = e.file_name().to_string_lossy().into_owned();
            warren_template::is_built_key(&key).then(|| (key, allocated(&e.path())))
        })
        .collect()
}

/// Leftovers of builds and pulls that never finished (their staging directories).
fn staging_dirs(data: &Path) -> Vec<std::path::PathBuf> {
    let Ok(dir) = std::fs::read_dir(warren_template::images_dir(data)) else {
        return Vec::new();
    };
    dir.flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with(".build-b") || n.starts_with(".pull-b")
        })
        .map(|e| e.path())
        .collect()
}

fn files_in(dir: &Path) -> DiskPart {
    let mut part = DiskPart::default();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            part.count += 1;
            part.bytes += allocated(&e.path());
        }
    }
    part
}

impl Builder {
    fn blobs_dir(&self) -> std::path::PathBuf {
        self.config
            .data_dir
            .join("oci")
            .join("blobs")
            .join("sha256")
    }

    /// The build layers the runtime holds: their snapshot keys and bytes on disk.
    async fn layers(&self) -> Vec<(String, u64)> {
        let data = self.config.data_dir.clone();
        let keys: Vec<String> = self
            .runtime
            .snapshot_keys()
            .await
            .into_iter()
            .filter(|k| k.starts_with(warren_control::BUILD_LAYER_PREFIX))
            .collect();
        tokio::task::spawn_blocking(move || {
            keys.into_iter()
                .map(|k| {
                    // Where the runtimes keep a filesystem snapshot (ns; vm).
                    let bytes = allocated(&data.join("snapshots").join(&k))
                        + allocated(&data.join("vm-checkpoints").join("snapshots").join(&k));
                    (k, bytes)
                })
                .collect()
        })
        .await
        .unwrap_or_default()
    }

    pub(crate) async fn disk_use_now(&self, keep: &[String]) -> Result<DiskUse, BuilderError> {
        let keep: HashSet<String> = keep.iter().cloned().collect();
        let data = self.config.data_dir.clone();
        let blobs = self.blobs_dir();
        let (mut usage, _) = tokio::task::spawn_blocking(move || {
            let mut u = DiskUse::default();
            for (key, bytes) in images(&data) {
                let part = if keep.contains(&key) {
                    &mut u.images_in_use
                } else {
                    &mut u.images_unused
                };
                part.count += 1;
                part.bytes += bytes;
            }
            u.blobs = files_in(&blobs);
            (u, ())
        })
        .await
        .map_err(|e| io("measure template images")(std::io::Error::other(e.to_string())))?;
        for (_, bytes) in self.layers().await {
            usage.layers.count += 1;
            usage.layers.bytes += bytes;
        }
        Ok(usage)
    }

    pub(crate) async fn prune_now(&self, keep: &[String]) -> Result<DiskUse, BuilderError> {
        let before = self.disk_use_now(keep).await?;
        // Cached steps first: their records, then the snapshots they name.
        let cache = self.cache_dir();
        if cache.exists() {
            tokio::fs::remove_dir_all(&cache)
                .await
                .map_err(io("remove the build cache"))?;
        }
        let mut freed = DiskUse::default();
        for (key, bytes) in self.layers().await {
            match self.runtime.delete_snapshot(&key).await {
                Ok(()) => {
                    freed.layers.count += 1;
                    freed.layers.bytes += bytes;
                }
                Err(e) => tracing::warn!(snapshot = %key, error = %e, "pruning a build layer"),
            }
        }
        let keep_set: HashSet<String> = keep.iter().cloned().collect();
        let data = self.config.data_dir.clone();
        let blobs = self.blobs_dir();
        let (images_freed, blobs_freed) = tokio::task::spawn_blocking(move || {
            let mut part = DiskPart::default();
            for (key, bytes) in images(&data) {
                if keep_set.contains(&key) {
                    continue;
                }
                match warren_template::remove_built(&data, &key) {
                    Ok(()) => {
                        part.count += 1;
                        part.bytes += bytes;
                    }
                    Err(e) => tracing::warn!(image = %key, error = %e, "pruning an image"),
                }
            }
            for dir in staging_dirs(&data) {
                let _ = std::fs::remove_dir_all(dir);
            }
            // The blobs, not their directory: the puller keeps writing into it.
            let mut removed = Ok(DiskPart::default());
            if let Ok(entries) = std::fs::read_dir(&blobs) {
                let mut freed = DiskPart::default();
                for e in entries.flatten() {
                    let bytes = allocated(&e.path());
                    if let Err(err) = std::fs::remove_file(e.path()) {
                        removed = Err(err);
                        break;
                    }
                    freed.count += 1;
                    freed.bytes += bytes;
                }
                if removed.is_ok() {
                    removed = Ok(freed);
                }
            }
            (part, removed)
        })
        .await
        .map_err(|e| io("prune template images")(std::io::Error::other(e.to_string())))?;
        freed.images_unused = images_freed;
        freed.blobs = blobs_freed.map_err(io("remove pulled layers"))?;
        tracing::info!(
            images = freed.images_unused.count,
            layers = freed.layers.count,
            blobs = freed.blobs.count,
            bytes = freed.images_unused.bytes + freed.layers.bytes + freed.blobs.bytes,
            before_bytes = before.images_unused.bytes + before.layers.bytes + before.blobs.bytes,
            "pruned template data"
        );
        Ok(freed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_counts_blocks_not_apparent_size() {
        let dir = tempfile::tempdir().unwrap();
        let sparse = dir.path().join("sparse");
        let f = std::fs::File::create(&sparse).unwrap();
        f.set_len(64 << 20).unwrap();
        std::fs::write(dir.path().join("full"), vec![1u8; 1 << 20]).unwrap();
        let total = allocated(dir.path());
        assert!(total >= 1 << 20, "{total}");
        assert!(total < 8 << 20, "a 64 MiB hole counted as data: {total}");
    }
}

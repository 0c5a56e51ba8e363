//! One builder at a time per cached artefact (kernel, initramfs, template snapshot).
//!
//! Several servers, tests or benchmarks on one host share the data directory. Without a lock two
//! of them building the same artefact would write the same staging path and rename it under each
//! other (or delete a snapshot another one is about to restore). Each builder takes an exclusive
//! `flock` on `<artefact>.lock`, then checks again whether the artefact now exists.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::error::{Error, Result};

/// Held while building; dropping it releases the lock.
pub struct BuildLock {
    _lock: Flock<File>,
}

fn lock_path(artefact: &Path) -> PathBuf {
    let mut name = artefact.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    artefact.with_file_name(name)
}

/// Waits for and takes the build lock of `artefact` (blocking).
pub fn lock(artefact: &Path) -> Result<BuildLock> {
    let path = lock_path(artefact);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(Error::io("create", parent))?;
    }
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(Error::io("open", &path))?;
    let lock = Flock::lock(file, FlockArg::LockExclusive)
        .map_err(|(_, e)| Error::io("lock", &path)(e.into()))?;
    Ok(BuildLock { _lock: lock })
}

/// [`lock`] without blocking the async runtime's worker.
pub async fn lock_async(artefact: &Path) -> Result<BuildLock> {
    let artefact = artefact.to_path_buf();
    tokio::task::spawn_blocking(move || lock(&artefact))
        .await
        .map_err(|e| Error::Invalid(format!("lock task: {e}")))?
}

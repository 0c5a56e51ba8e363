//! Durable directories: saves that survive a crash whole or not at all, shared by both
//! runtimes (a namespace sandbox's saved layer, a VM's checkpoint).
//!
//! A save is written to a staging sibling, every file and directory in it fsynced, then renamed
//! into place (atomically exchanging an earlier save) and the parent directory synced. Names of
//! saves are checked keys, so a listing never mistakes a staging or trash directory for one.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use warren_runtime::RuntimeError;

/// An I/O failure while doing `what`, its cause kept (a full disk is the host's capacity,
/// which [`RuntimeError::category`] tells apart).
pub fn failed(what: &str) -> impl FnOnce(std::io::Error) -> RuntimeError + '_ {
    move |source| RuntimeError::Io {
        what: what.to_string(),
        source,
    }
}

/// Snapshot keys become directory names.
pub fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 128
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Names of the finished saves in `dir` (no `.partial` or `.trash` ones).
pub fn complete_entries(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| valid_key(n))
                .collect()
        })
        .unwrap_or_default()
}

/// Deletes a directory of saved state without making the caller wait: renamed out of the way
/// at once (a new save may be written there right away), deleted in the background. A crash
/// before the deletion leaves a `.trash` directory that the next start's sweep removes.
pub fn discard_dir(dir: &std::path::Path) {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let trash = sibling(dir, &format!("{stamp}.trash"));
    match std::fs::rename(dir, &trash) {
        Ok(()) => {
            tokio::task::spawn_blocking(move || {
                let _ = std::fs::remove_dir_all(trash);
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "could not remove saved state"),
    }
}

/// A staging directory removed when the guard drops unless [`RemoveOnDrop::disarm`] was
/// called: a save that fails, or whose task is dropped mid-way (the server stopping), leaves
/// no RAM- or disk-sized files behind until the next start's sweep.
pub struct RemoveOnDrop {
    dir: Option<PathBuf>,
}

impl RemoveOnDrop {
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: Some(dir.to_path_buf()),
        }
    }

    /// The directory is kept (it was installed, or someone else owns it now).
    pub fn disarm(mut self) {
        self.dir = None;
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let Some(dir) = self.dir.take() else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            discard_dir(&dir);
        } else {
            let _ = remove_tree(&dir);
        }
    }
}

/// Runs blocking work (file trees, copies, a process that must run synchronously) on the
/// blocking pool instead of an async worker. A panic in `f` comes back as `E`.
pub async fn blocking<T, E>(f: impl FnOnce() -> Result<T, E> + Send + 'static) -> Result<T, E>
where
    T: Send + 'static,
    E: From<tokio::task::JoinError> + Send + 'static,
{
    tokio::task::spawn_blocking(f).await?
}

/// [`remove_tree`] on the blocking pool, for async callers.
pub async fn remove_tree_async(path: &Path) -> io::Result<()> {
    let path = path.to_path_buf();
    blocking(move || remove_tree(&path)).await
}

/// Makes the directory `staging` durable (every file and directory fsynced) and renames it to
/// `dest`, atomically replacing an earlier `dest`; the parent is synced too. Returns the bytes
/// `dest` takes. The work runs on a blocking thread, never on an async worker.
pub async fn install(staging: &Path, dest: &Path) -> io::Result<u64> {
    let (staging, dest) = (staging.to_path_buf(), dest.to_path_buf());
    blocking(move || install_now(&staging, &dest)).await
}

fn install_now(staging: &Path, dest: &Path) -> io::Result<u64> {
    let parent = dest
        .parent()
        .ok_or_else(|| io::Error::other(format!("{} has no parent", dest.display())))?;
    sync_tree(staging)?;
    if dest.exists() {
        // Swap in one step, then delete the old copy (now at the staging path).
        nix::fcntl::renameat2(
            nix::fcntl::AT_FDCWD,
            staging,
            nix::fcntl::AT_FDCWD,
            dest,
            nix::fcntl::RenameFlags::RENAME_EXCHANGE,
        )
        .map_err(io::Error::from)?;
        remove_tree(staging)?;
    } else {
        fs::rename(staging, dest)?;
    }
    fs::File::open(parent)?.sync_all()?;
    disk_usage(dest)
}

/// `<path>.<suffix>` next to `path` (staging and trash names).
pub fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{suffix}"));
    path.with_file_name(name)
}

/// Removes the tree at `path`; one that is not there is no error.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Flushes every file and directory under `path` to disk. Per-file `fsync` rather than one
/// `syncfs`: the latter would also wait for every other dirty page on the host's disk, which
/// on a busy host costs far more than the layer itself.
fn sync_tree(root: &Path) -> io::Result<()> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                fs::File::open(entry.path())?.sync_all()?;
            }
            // Symlinks and device nodes (whiteouts) are directory entries: syncing the
            // directory below persists them.
        }
        fs::File::open(&dir)?.sync_all()?;
    }
    Ok(())
}

/// Bytes of file data under `path` (allocated blocks, so sparse files count what they use).
fn disk_usage(path: &Path) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0u64;
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            total += meta.blocks() * 512;
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    Ok(total)
}

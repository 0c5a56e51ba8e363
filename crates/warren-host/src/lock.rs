//! One sandbox manager per host state: the lock every runtime takes when it starts.

use std::path::Path;

use warren_runtime::RuntimeError;

/// Held for a runtime's lifetime (`<run_dir>/host.lock`), so that a second server can never
/// mistake the first one's sandboxes for a crashed predecessor's and remove them.
pub struct HostLock {
    _file: nix::fcntl::Flock<std::fs::File>,
}

impl HostLock {
    /// Takes the lock of `run_dir` (created if missing), or says who holds it.
    pub fn acquire(run_dir: &Path) -> Result<Self, RuntimeError> {
        std::fs::create_dir_all(run_dir)
            .map_err(|e| RuntimeError::Failed(format!("create {}: {e}", run_dir.display())))?;
        let path = run_dir.join("host.lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| RuntimeError::Failed(format!("open {}: {e}", path.display())))?;
        let file = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| {
                RuntimeError::Failed(format!(
                    "another Warren server already runs sandboxes on this host ({} is locked: {e})",
                    path.display()
                ))
            })?;
        Ok(Self { _file: file })
    }
}

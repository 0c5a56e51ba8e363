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
            .map_err(RuntimeError::io(format!("create {}", run_dir.display())))?;
        let path = run_dir.join("host.lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(RuntimeError::io(format!("open {}", path.display())))?;
        let file = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| match e {
                // Held: by a server that runs now; it may be gone later.
                nix::errno::Errno::EWOULDBLOCK => RuntimeError::unavailable(
                    format!(
                        "another Warren server already runs sandboxes on this host ({} is locked)",
                        path.display()
                    ),
                    std::io::Error::from(e),
                ),
                e => RuntimeError::Io {
                    what: format!("lock {}", path.display()),
                    source: e.into(),
                },
            })?;
        Ok(Self { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_runtime::Category;

    fn scratch() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("warren-lock-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_held_lock_is_unavailable_with_its_cause() {
        let dir = scratch();
        let _first = HostLock::acquire(&dir).unwrap();
        let Err(e) = HostLock::acquire(&dir) else {
            panic!("a second lock of the same run directory was granted");
        };
        assert_eq!(e.category(), Category::Unavailable, "{e:?}");
        let text = warren_runtime::chain(&e);
        assert!(text.contains("another Warren server"), "{text}");
        assert!(
            std::error::Error::source(&e).is_some(),
            "the errno is kept as the cause: {e:?}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_run_dir_that_cannot_be_created_is_an_io_error() {
        let dir = scratch();
        let file = dir.join("file");
        std::fs::write(&file, b"").unwrap();
        let Err(e) = HostLock::acquire(&file.join("run")) else {
            panic!("a run directory under a file was created");
        };
        assert!(matches!(e, RuntimeError::Io { .. }), "{e:?}");
        let _ = std::fs::remove_dir_all(dir);
    }
}

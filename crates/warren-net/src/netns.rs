//! Entering a slot's network namespace from a dedicated thread.

use std::fs::File;
use std::path::{Path, PathBuf};

use nix::sched::{setns, CloneFlags};

use crate::error::{Error, Result};

/// Where `ip netns add NAME` binds named network namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// Path of the named network namespace `name`.
pub fn netns_path(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
}

/// Moves the **calling thread** into the network namespace bound at `path`.
///
/// Only call this on a thread that is dedicated to the job and exits afterwards: the
/// namespace sticks to the thread, so doing it on a shared (e.g. tokio worker) thread would
/// move unrelated work into the slot.
pub(crate) fn enter(path: &Path) -> Result<()> {
    let file = File::open(path).map_err(|source| Error::EnterNetns {
        path: path.to_owned(),
        source,
    })?;
    setns(&file, CloneFlags::CLONE_NEWNET).map_err(|errno| Error::EnterNetns {
        path: path.to_owned(),
        source: errno.into(),
    })
}

/// Runs `f` on a new thread inside the network namespace at `path` and returns its result.
///
/// Sockets remember the namespace they were created in, so a socket made by `f` can be
/// returned and used from any thread afterwards: this is how a caller opens a listener or a
/// connection "inside" a slot without an `ip netns exec` process.
pub fn run_in<F, T>(path: &Path, f: F) -> Result<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let path = path.to_owned();
    let thread = std::thread::Builder::new()
        .name("warren-net-ns".into())
        .spawn(move || enter(&path).map(|()| f()))
        .map_err(|source| Error::Spawn {
            command: "network namespace thread".into(),
            source,
        })?;
    match thread.join() {
        Ok(result) => result,
        // Re-raise the closure's panic on the caller's thread, where it belongs.
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

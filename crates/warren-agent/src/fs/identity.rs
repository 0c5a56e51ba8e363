//! Filesystem work done with the caller's filesystem identity.
//!
//! The agent runs as root but acts for a Unix user. If it opened, created or listed paths as
//! root, a user could make it read or write anything through a symlink (`~/x -> /etc/shadow`)
//! or through a directory swapped between a check and a use. So every path operation done for
//! a caller runs with the caller's filesystem uid, gid and supplementary groups: the kernel
//! then checks each lookup, open and mkdir exactly as it would for that user's own process,
//! symlinks and `fs.protected_*` rules included, and a symlink can lead nowhere the user could
//! not reach directly.
//!
//! Linux credentials belong to a thread. `setfsuid`/`setfsgid` and the raw `setgroups`
//! syscall change only the calling thread (the libc `setgroups` wrapper would change every
//! thread of the agent). Each operation runs on a thread of its own which exits afterwards,
//! so no pooled thread is ever left with a borrowed identity.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use nix::fcntl::{openat, OFlag, AT_FDCWD};
use nix::sys::stat::{mkdirat, Mode};

use crate::users::User;

/// Runs `f` with `user`'s filesystem identity, off the async workers.
///
/// When the agent already is that user (root acting as root, or a non-root agent acting as
/// itself) `f` runs on the blocking pool unchanged.
pub async fn run_as<T, F>(user: &User, f: F) -> io::Result<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    if nix::unistd::geteuid().as_raw() == user.uid && nix::unistd::getegid().as_raw() == user.gid {
        return tokio::task::spawn_blocking(f)
            .await
            .map_err(io::Error::other);
    }
    let (uid, gid, groups) = (user.uid, user.gid, user.groups.clone());
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("warren-fs-as-user".into())
        .spawn(move || {
            let outcome = assume(uid, gid, &groups).map(|()| f());
            // The receiver may have gone (client disconnected): nothing to report then.
            let _ = tx.send(outcome);
        })?;
    rx.await
        .map_err(|_| io::Error::other("filesystem worker thread panicked"))?
}

/// Gives the calling thread the filesystem identity `uid:gid` with `groups`, and checks that
/// the kernel took it (`setfsuid` reports no errors, only the previous value).
fn assume(uid: u32, gid: u32, groups: &[u32]) -> io::Result<()> {
    // Groups first: dropping the fsuid below also drops the capabilities that depend on it.
    // SAFETY: `groups` is a live slice of `gid_t`-sized values for the call's duration, and
    // the syscall only reads it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_setgroups,
            groups.len() as libc::size_t,
            groups.as_ptr() as *const libc::gid_t,
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        // Without CAP_SETGID (a non-root agent) the thread keeps its own groups; that is only
        // acceptable when they grant nothing the user's would not.
        let current = nix::unistd::getgroups().map_err(io::Error::from)?;
        if current.iter().any(|g| !groups.contains(&g.as_raw())) {
            return Err(io::Error::new(
                e.kind(),
                format!("cannot take the supplementary groups of uid {uid}: {e}"),
            ));
        }
    }
    // SAFETY: setfsgid/setfsuid take plain integers and change only this thread's
    // credentials; (u32::MAX) is the documented "no change, report current" probe.
    let (fsgid, fsuid) = unsafe {
        libc::syscall(libc::SYS_setfsgid, gid);
        let fsgid = libc::syscall(libc::SYS_setfsgid, u32::MAX) as u32;
        libc::syscall(libc::SYS_setfsuid, uid);
        let fsuid = libc::syscall(libc::SYS_setfsuid, u32::MAX) as u32;
        (fsgid, fsuid)
    };
    if fsuid != uid || fsgid != gid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "cannot act as {uid}:{gid} (filesystem identity stayed {fsuid}:{fsgid}); \
                 the agent needs to run as root"
            ),
        ));
    }
    Ok(())
}

/// Opens the directory `dir` (absolute), creating missing components (mode 0755 before the
/// umask) with the thread's identity. Each component is looked up relative to its parent's
/// descriptor, so nothing is resolved twice and a swapped path component cannot redirect a
/// later step. `..` is not expected (paths are cleaned before they get here) and refused.
pub fn open_dirs(dir: &Path) -> io::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let mut current = openat(AT_FDCWD, "/", flags, Mode::empty()).map_err(io::Error::from)?;
    for component in dir.components() {
        let name = match component {
            Component::RootDir | Component::CurDir => continue,
            Component::Normal(name) => name,
            Component::ParentDir | Component::Prefix(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("unexpected component in {}", dir.display()),
                ))
            }
        };
        current = step(&current, name, flags)?;
    }
    Ok(current)
}

/// Opens (creating if missing) the directory `name` in `parent`.
fn step(parent: &OwnedFd, name: &OsStr, flags: OFlag) -> io::Result<OwnedFd> {
    match openat(parent, name, flags, Mode::empty()) {
        Ok(fd) => return Ok(fd),
        Err(nix::errno::Errno::ENOENT) => {}
        Err(e) => return Err(not_a_dir(e, name)),
    }
    match mkdirat(parent, name, Mode::from_bits_truncate(0o755)) {
        // Created concurrently by someone else: fine as long as it is a directory, which the
        // open below checks.
        Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
        Err(e) => return Err(io::Error::from(e)),
    }
    openat(parent, name, flags, Mode::empty()).map_err(|e| not_a_dir(e, name))
}

fn not_a_dir(e: nix::errno::Errno, name: &OsStr) -> io::Error {
    if e == nix::errno::Errno::ENOTDIR {
        io::Error::new(
            io::ErrorKind::NotADirectory,
            format!(
                "{} exists and is not a directory",
                String::from_utf8_lossy(name.as_bytes())
            ),
        )
    } else {
        io::Error::from(e)
    }
}

/// Opens `name` in the directory `dir` for writing: created (mode 0666 before the umask) or
/// truncated, with the thread's identity.
pub fn create_file(dir: &OwnedFd, name: &OsStr) -> io::Result<File> {
    let flags =
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC | OFlag::O_CLOEXEC | OFlag::O_NOCTTY;
    let fd = openat(dir, name, flags, Mode::from_bits_truncate(0o666)).map_err(io::Error::from)?;
    Ok(File::from(fd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn scratch() -> std::path::PathBuf {
        std::env::temp_dir().join(format!("warren-identity-{}", uuid::Uuid::new_v4()))
    }

    #[test]
    fn open_dirs_creates_missing_and_refuses_files() {
        let root = scratch();
        let deep = root.join("a/b/c");
        let fd = open_dirs(&deep).unwrap();
        assert!(deep.is_dir());
        let f = create_file(&fd, OsStr::new("f")).unwrap();
        drop(f);
        assert!(deep.join("f").is_file());
        let e = open_dirs(&deep.join("f/g")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotADirectory, "{e}");
        let e = open_dirs(Path::new("/tmp/../etc")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[tokio::test]
    async fn run_as_takes_the_users_identity() {
        if !warren_testkit::require("root", warren_testkit::is_root()) {
            return;
        }
        let user = crate::users::UserDb::load().by_name("user").cloned();
        if !warren_testkit::require("an account named `user` (useradd -m user)", user.is_some()) {
            return;
        }
        let user = user.expect("checked above");
        let root = scratch();
        std::fs::create_dir(&root).unwrap();
        // World-writable, so the user may create inside it.
        std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        let dir = root.join("mine/sub");
        let made = dir.clone();
        run_as(&user, move || open_dirs(&made).map(drop))
            .await
            .unwrap()
            .unwrap();
        let meta = std::fs::metadata(&dir).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (user.uid, user.gid));
        // Root-only files stay out of reach.
        let denied = run_as(&user, || File::open("/etc/shadow")).await.unwrap();
        assert_eq!(denied.unwrap_err().kind(), io::ErrorKind::PermissionDenied);
        std::fs::remove_dir_all(&root).unwrap();
    }
}

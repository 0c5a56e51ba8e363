//! Running a call as its caller: the calling thread takes on the caller's fsuid, fsgid and
//! supplementary groups, so the kernel makes every permission check and new files get the
//! caller's owner. All three are per-thread in the kernel (glibc's `setgroups` would change
//! every thread, so the raw per-thread syscall is used), and are restored when the guard drops.
//!
//! A non-zero fsuid also clears the filesystem capabilities (CAP_DAC_OVERRIDE, CAP_FOWNER,
//! CAP_DAC_READ_SEARCH, ...) from the thread's effective set; fsuid 0 gives them back. So a
//! guest's root is root inside the export, and everyone else is checked like a local user.

use std::io;

use rustix::process::Gid;

use crate::rpc::Cred;

fn fsuid_now() -> u32 {
    // SAFETY: setfsuid with an invalid id (-1) changes nothing and returns the current fsuid.
    unsafe { libc::setfsuid(u32::MAX) as u32 }
}

fn fsgid_now() -> u32 {
    // SAFETY: as above, for the fsgid.
    unsafe { libc::setfsgid(u32::MAX) as u32 }
}

/// The ids the server thread runs with between calls (root's, read once at startup).
#[derive(Clone, Debug)]
pub(crate) struct Baseline {
    groups: Vec<Gid>,
}

impl Baseline {
    /// Fails unless the process can change its ids (the server must run as root).
    pub fn capture() -> io::Result<Self> {
        if !rustix::process::geteuid().is_root() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "warren-nfs runs every call as its caller (setfsuid) and resolves handles \
                 with open_by_handle_at: it must run as root",
            ));
        }
        Ok(Baseline {
            groups: rustix::process::getgroups()?,
        })
    }
}

/// While alive, the thread runs as the caller. Dropping it restores root; if that fails the
/// process aborts rather than serve later calls with someone's leftover ids.
pub(crate) struct AsCaller<'a> {
    base: &'a Baseline,
}

/// Takes on `cred` for the current thread.
pub(crate) fn become_caller<'a>(base: &'a Baseline, cred: &Cred) -> io::Result<AsCaller<'a>> {
    let guard = AsCaller { base };
    let groups: Vec<Gid> = cred.gids.iter().map(|g| Gid::from_raw(*g)).collect();
    rustix::thread::set_thread_groups(&groups)?;
    // SAFETY: setfsgid/setfsuid only change this thread's filesystem ids; they take any id.
    unsafe {
        libc::setfsgid(cred.gid);
        libc::setfsuid(cred.uid);
    }
    if fsuid_now() != cred.uid || fsgid_now() != cred.gid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "setfsuid/setfsgid did not take",
        ));
    }
    Ok(guard)
}

impl Drop for AsCaller<'_> {
    fn drop(&mut self) {
        // SAFETY: as in become_caller; 0 is root's id.
        unsafe {
            libc::setfsuid(0);
            libc::setfsgid(0);
        }
        let groups_ok = rustix::thread::set_thread_groups(&self.base.groups).is_ok();
        if fsuid_now() != 0 || fsgid_now() != 0 || !groups_ok {
            tracing::error!("could not restore the server thread's ids; aborting");
            std::process::abort();
        }
    }
}

/// Whether the current thread runs with root's filesystem ids (between calls it must).
pub(crate) fn is_root_now() -> bool {
    fsuid_now() == 0 && fsgid_now() == 0
}

//! Detached bind mounts with the new mount API, as both runtimes make them: `open_tree` a copy
//! of a mount, give it attributes (and an id mapping) with `mount_setattr`, attach it with
//! `move_mount`. The ns runtime mounts template images and volumes into sandboxes this way,
//! the vm runtime the files of its jails. rustix wraps `open_tree` and `move_mount`; it has no
//! `mount_setattr`, which is called here.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

pub use rustix::fs::CWD;
pub use rustix::mount::{MountAttrFlags, OpenTreeFlags};

/// `struct mount_attr` (`MOUNT_ATTR_SIZE_VER0`).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// A detached copy (`open_tree` with `OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC`) of the mount at
/// `path` from `dirfd`. `flags` adds to these: `AT_RECURSIVE` copies the mounts beneath it
/// too, `AT_EMPTY_PATH` with an empty `path` copies the mount of `dirfd` itself.
pub fn clone_tree(dirfd: impl AsFd, path: &CStr, flags: OpenTreeFlags) -> io::Result<OwnedFd> {
    let flags = OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC | flags;
    Ok(rustix::mount::open_tree(dirfd, path, flags)?)
}

/// Sets `set` and clears `clear` on the detached mount `tree` (`mount_setattr` on `tree`
/// itself; its propagation unchanged). With `userns` (a user namespace's descriptor) it also
/// gets that namespace's id mapping (`MOUNT_ATTR_IDMAP`).
pub fn set_attrs(
    tree: BorrowedFd<'_>,
    set: MountAttrFlags,
    clear: MountAttrFlags,
    userns: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let idmap = match userns {
        Some(_) => MountAttrFlags::MOUNT_ATTR_IDMAP,
        None => MountAttrFlags::empty(),
    };
    let attr = MountAttr {
        attr_set: u64::from((set | idmap).bits()),
        attr_clr: u64::from(clear.bits()),
        propagation: 0,
        userns_fd: userns.map_or(0, |u| u.as_raw_fd() as u64),
    };
    // SAFETY: `attr` is a live, correctly laid out `struct mount_attr` whose size is passed,
    // and the path a NUL-terminated empty string; with AT_EMPTY_PATH the call acts on `tree`
    // itself, which the borrow keeps open. The kernel only reads both.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Attaches the detached mount `tree` on `target` (`move_mount` with
/// `MOVE_MOUNT_F_EMPTY_PATH`, `target` from the working directory). It allocates nothing: a
/// child may call it between fork and exec.
pub fn attach(tree: BorrowedFd<'_>, target: &CStr) -> io::Result<()> {
    Ok(rustix::mount::move_mount(
        tree,
        c"",
        CWD,
        target,
        rustix::mount::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_are_the_kernel_values() {
        // The values both runtimes passed before rustix named them.
        assert_eq!(MountAttrFlags::MOUNT_ATTR_RDONLY.bits(), 0x1);
        assert_eq!(MountAttrFlags::MOUNT_ATTR_NOSUID.bits(), 0x2);
        assert_eq!(MountAttrFlags::MOUNT_ATTR_NODEV.bits(), 0x4);
        assert_eq!(MountAttrFlags::MOUNT_ATTR_NOEXEC.bits(), 0x8);
        assert_eq!(MountAttrFlags::MOUNT_ATTR_IDMAP.bits(), 0x0010_0000);
        assert_eq!(OpenTreeFlags::OPEN_TREE_CLONE.bits(), 1);
        assert_eq!(OpenTreeFlags::AT_RECURSIVE.bits(), 0x8000);
        assert_eq!(
            OpenTreeFlags::OPEN_TREE_CLOEXEC.bits(),
            libc::O_CLOEXEC as libc::c_uint
        );
        assert_eq!(
            OpenTreeFlags::AT_EMPTY_PATH.bits(),
            libc::AT_EMPTY_PATH as libc::c_uint
        );
        assert_eq!(
            rustix::mount::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH.bits(),
            0x4
        );
        assert_eq!(std::mem::size_of::<MountAttr>(), 32);
    }
}

//! Raw system calls nix does not wrap: the new mount API for id-mapped mounts.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// Mounts a read-only copy of the mount at `source` on `target`, with file ownership mapped
/// through the user namespace `userns` (a `/proc/<pid>/ns/user` descriptor): files owned by
/// host uid 0 appear owned by the uid that namespace maps to 0. The host mounts template
/// images `nosuid` (`warren_host::Templates`); the copy honours set-id bits again (they now
/// mean the sandbox's own ids: `sudo` in it works) and stays `nodev`.
pub fn idmapped_bind(source: &Path, target: &Path, userns: &OwnedFd) -> io::Result<()> {
    let tree = clone_tree(libc::AT_FDCWD, &cpath(source)?, 0)?;
    attach_idmapped(
        tree,
        target,
        userns,
        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV,
        MOUNT_ATTR_NOSUID,
    )
}

/// [`idmapped_bind`] of a volume, or of the directory `subpath` inside it: writable unless
/// `read_only`, never honouring set-id bits or device nodes (a sandbox could plant them there
/// for another sandbox or the host). Other sandboxes write to the volume, so `subpath` is
/// resolved beneath it without following any symbolic link (`openat2` with
/// `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`) and the mount is made from that descriptor: no
/// link planted on the way can redirect it elsewhere on the host.
pub fn idmapped_volume(
    source: &Path,
    subpath: Option<&str>,
    target: &Path,
    userns: &OwnedFd,
    read_only: bool,
) -> io::Result<()> {
    let ro = if read_only { MOUNT_ATTR_RDONLY } else { 0 };
    let root = open_path(libc::AT_FDCWD, &cpath(source)?, 0)?;
    let dir = match subpath {
        Some(sub) => open_path(
            root.as_raw_fd(),
            &cpath(Path::new(sub))?,
            libc::RESOLVE_BENEATH
                | libc::RESOLVE_NO_SYMLINKS
                | libc::RESOLVE_NO_MAGICLINKS
                | libc::RESOLVE_NO_XDEV,
        )?,
        None => root,
    };
    let tree = clone_tree(dir.as_raw_fd(), c"", libc::AT_EMPTY_PATH as libc::c_uint)?;
    attach_idmapped(
        tree,
        target,
        userns,
        ro | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        0,
    )
}

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// An `O_PATH` descriptor of the directory `path` (relative to `dirfd`), resolved as
/// `resolve` says.
fn open_path(dirfd: libc::c_int, path: &CString, resolve: u64) -> io::Result<OwnedFd> {
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve,
    };
    // SAFETY: `path` is NUL-terminated and `how` a live `struct open_how` whose size is
    // passed; openat2 returns a new descriptor (or -1) and writes no memory of ours.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dirfd,
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openat2 just returned this descriptor to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A detached copy (`open_tree(OPEN_TREE_CLONE)`) of the mount at `path` from `dirfd`.
fn clone_tree(
    dirfd: libc::c_int,
    path: &std::ffi::CStr,
    flags: libc::c_uint,
) -> io::Result<OwnedFd> {
    // SAFETY: `path` is a valid NUL-terminated string for the duration of the call; open_tree
    // returns a new descriptor (or -1) and touches no memory of ours otherwise.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            dirfd,
            path.as_ptr(),
            OPEN_TREE_CLONE | AT_RECURSIVE | libc::O_CLOEXEC as libc::c_uint | flags,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open_tree just returned this descriptor to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Gives the detached mount `tree` the id mapping of `userns`, sets `attrs` and clears
/// `clear`, and attaches it on `target`.
fn attach_idmapped(
    tree: OwnedFd,
    target: &Path,
    userns: &OwnedFd,
    attrs: u64,
    clear: u64,
) -> io::Result<()> {
    let dst = cpath(target)?;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP | attrs,
        attr_clr: clear,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    // SAFETY: `attr` is a live, correctly laid out `struct mount_attr` and its size is passed;
    // the empty path with AT_EMPTY_PATH makes the call act on `tree` itself.
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
    // SAFETY: both paths are valid for the call; `tree` is the detached mount to attach.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

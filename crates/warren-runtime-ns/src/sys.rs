//! Id-mapped bind mounts of template images and volumes into a sandbox: the new mount API
//! (`warren_host::mount`), and the one raw system call nix does not wrap, `openat2`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use warren_host::mount::{self, MountAttrFlags, OpenTreeFlags};

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
    let tree = mount::clone_tree(mount::CWD, &cpath(source)?, OpenTreeFlags::AT_RECURSIVE)?;
    attach_idmapped(
        tree,
        target,
        userns,
        MountAttrFlags::MOUNT_ATTR_RDONLY | MountAttrFlags::MOUNT_ATTR_NODEV,
        MountAttrFlags::MOUNT_ATTR_NOSUID,
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
    let ro = if read_only {
        MountAttrFlags::MOUNT_ATTR_RDONLY
    } else {
        MountAttrFlags::empty()
    };
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
    let tree = mount::clone_tree(
        &dir,
        c"",
        OpenTreeFlags::AT_RECURSIVE | OpenTreeFlags::AT_EMPTY_PATH,
    )?;
    attach_idmapped(
        tree,
        target,
        userns,
        ro | MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV,
        MountAttrFlags::empty(),
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

/// Gives the detached mount `tree` the id mapping of `userns`, sets `attrs` and clears
/// `clear`, and attaches it on `target`.
fn attach_idmapped(
    tree: OwnedFd,
    target: &Path,
    userns: &OwnedFd,
    attrs: MountAttrFlags,
    clear: MountAttrFlags,
) -> io::Result<()> {
    let dst = cpath(target)?;
    mount::set_attrs(tree.as_fd(), attrs, clear, Some(userns.as_fd()))?;
    mount::attach(tree.as_fd(), &dst)
}

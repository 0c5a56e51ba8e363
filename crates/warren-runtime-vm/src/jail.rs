//! The jail every tenant-facing QEMU (and every `qemu-img` that reads a guest-written image)
//! runs in, in the spirit of Firecracker's jailer.
//!
//! The child starts as the init of a pid namespace of its own ([`spawn_in_own_pid_ns`]).
//! Between fork and exec it (still root) enters a mount, IPC and UTS namespace of its
//! own, mounts an empty tmpfs on [`Jail::root`] and moves detached bind mounts into it at the
//! same paths as on the host: the program and the system libraries and firmware it loads
//! (read-only), a few harmless devices, and the files [`Jail::read`] and [`Jail::write`] name.
//! It then `pivot_root`s into the tmpfs (made read-only), sets rlimits, drops to
//! [`Jail::uid`]/[`Jail::gid`] with [`Jail::groups`] as its only supplementary groups and sets
//! `PR_SET_NO_NEW_PRIVS`. The environment is cleared by the caller (`env_clear`).
//!
//! The data files are **id-mapped** mounts: a file that belongs to root on the host appears to
//! belong to the jail's user inside the jail, and what that user creates there belongs to root
//! on the host. So checkpoints, overlays and VM directories stay `0400`/`0600`/`0700` root on
//! the host, nothing the jail user owns is left behind, and the directories above them (a data
//! directory of mode 0700) need not be traversable by that user.
//!
//! Everything the child uses is prepared here, in the parent ([`Jail::prepare`]): between fork
//! and exec it only makes system calls on strings and descriptors that already exist.

use std::collections::{BTreeSet, HashMap};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::{Error, Result};
use warren_host::mount::{self, MountAttrFlags, OpenTreeFlags};

/// Limits set on the jailed process.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Open descriptors.
    pub nofile: u64,
    /// Processes and threads of the jail's user (QEMU's own threads count).
    pub nproc: u64,
    /// Largest file it may write (its disk overlay, a memory file).
    pub fsize: u64,
}

/// Where and as whom a process runs.
#[derive(Debug, Clone)]
pub struct Jail {
    pub uid: u32,
    pub gid: u32,
    /// Its only supplementary groups (the group of `/dev/kvm` under KVM, else none).
    pub groups: Vec<u32>,
    /// An empty directory on the host (root's): the jail's tmpfs root is mounted on it in the
    /// child's own mount namespace.
    pub root: PathBuf,
    /// Files and directories it may read (id-mapped, read-only).
    pub read: Vec<PathBuf>,
    /// Files and directories it may write (id-mapped).
    pub write: Vec<PathBuf>,
    /// Device nodes (e.g. `/dev/kvm`), id-mapped where the filesystem allows it.
    pub devices: Vec<PathBuf>,
    pub limits: Limits,
}

/// System directories bound read-only when present: libraries and QEMU's firmware.
const SYSTEM: &[&str] = &[
    "/usr/lib",
    "/usr/lib64",
    "/usr/share/qemu",
    "/usr/share/seabios",
    "/etc/ld.so.cache",
];
/// Top-level library paths: recreated as the same symlink (merged /usr) or bound.
const TOP_LIBS: &[&str] = &["/lib", "/lib64", "/lib32", "/libx32"];
/// Devices QEMU and its libraries may open; none gives access to anything.
const PLAIN_DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"];

/// One detached mount and where it goes in the jail.
#[derive(Debug)]
struct Bind {
    tree: OwnedFd,
    target: CString,
}

/// A [`Jail`] ready to be entered between fork and exec.
#[derive(Debug)]
pub struct Prepared {
    root: CString,
    dirs: Vec<CString>,
    files: Vec<CString>,
    symlinks: Vec<(CString, CString)>,
    binds: Vec<Bind>,
    groups: Vec<libc::gid_t>,
    uid: u32,
    gid: u32,
    limits: Limits,
}

/// Descriptors the child uses are kept at or above this number, so that the `dup2` onto the
/// fixed numbers QEMU inherits (100-102) can never overwrite one of them.
pub const FD_FLOOR: i32 = 200;

/// `fd` moved to a number at or above [`FD_FLOOR`] (close-on-exec).
pub fn above_floor(fd: OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own returns a new descriptor or -1.
    let new = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, FD_FLOOR) };
    if new < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fcntl just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

fn cpath(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|e| Error::Invalid(format!("path: {e}")))
}

/// `path` inside the jail mounted at `root`.
fn inside(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// User namespaces that map uid/gid 0 to a jail's user, for id-mapped mounts; one per user,
/// made once (a namespace outlives the process that made it while a descriptor holds it).
static USERNS: Mutex<Option<HashMap<(u32, u32), OwnedFd>>> = Mutex::new(None);

fn userns_for(uid: u32, gid: u32) -> Result<OwnedFd> {
    let mut cache = USERNS.lock().unwrap_or_else(|e| e.into_inner());
    let map = cache.get_or_insert_with(HashMap::new);
    if let Some(fd) = map.get(&(uid, gid)) {
        return fd.try_clone().map_err(Error::io("dup", "user namespace"));
    }
    let fd = make_userns(uid, gid)?;
    let copy = fd.try_clone().map_err(Error::io("dup", "user namespace"))?;
    map.insert((uid, gid), fd);
    Ok(copy)
}

/// A user namespace whose 0 is `uid`/`gid` on the host: a short-lived child unshares it, the
/// parent writes its maps and keeps a descriptor of it.
fn make_userns(uid: u32, gid: u32) -> Result<OwnedFd> {
    let mut cmd = std::process::Command::new("sleep");
    cmd.arg("60")
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    use std::os::unix::process::CommandExt;
    // SAFETY: unshare is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(Error::io("start", "sleep"))?;
    let pid = child.id();
    let result = (|| {
        let proc = PathBuf::from(format!("/proc/{pid}"));
        std::fs::write(proc.join("uid_map"), format!("0 {uid} 1\n"))
            .map_err(Error::io("write", proc.join("uid_map")))?;
        std::fs::write(proc.join("gid_map"), format!("0 {gid} 1\n"))
            .map_err(Error::io("write", proc.join("gid_map")))?;
        let ns = std::fs::File::open(proc.join("ns/user"))
            .map_err(Error::io("open", proc.join("ns/user")))?;
        Ok(OwnedFd::from(ns))
    })();
    let _ = child.kill();
    let _ = child.wait();
    result
}

/// A detached copy of the mount at `source` (not of the mounts beneath it) with `attrs` (and
/// an id-mapping through `userns`).
fn detached(source: &Path, attrs: MountAttrFlags, userns: Option<&OwnedFd>) -> io::Result<OwnedFd> {
    let src = CString::new(source.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let tree = above_floor(mount::clone_tree(mount::CWD, &src, OpenTreeFlags::empty())?)?;
    mount::set_attrs(
        tree.as_fd(),
        attrs,
        MountAttrFlags::empty(),
        userns.map(|u| u.as_fd()),
    )?;
    Ok(tree)
}

impl Jail {
    /// Opens every mount the jail needs (for running `program`) and lays out its tree.
    pub fn prepare(&self, program: &Path) -> Result<Prepared> {
        let userns = userns_for(self.uid, self.gid)?;
        let binds: Vec<(PathBuf, OwnedFd)> = Vec::new();
        let mut symlinks = Vec::new();
        let system_attrs = MountAttrFlags::MOUNT_ATTR_RDONLY
            | MountAttrFlags::MOUNT_ATTR_NOSUID
            | MountAttrFlags::MOUNT_ATTR_NODEV;
        let binds = std::cell::RefCell::new(binds);
        let bind_tree = |path: &Path, tree: OwnedFd| binds.borrow_mut().push((path.into(), tree));
        let bind = |path: &Path, attrs: MountAttrFlags, ns: Option<&OwnedFd>| -> Result<()> {
            let tree = detached(path, attrs, ns).map_err(Error::io("bind into the jail", path))?;
            bind_tree(path, tree);
            Ok(())
        };
        let program = std::fs::canonicalize(crate::qemu::resolve(program)?)
            .map_err(Error::io("resolve", program))?;
        bind(&program, system_attrs, None)?;
        for p in SYSTEM.iter().map(Path::new).filter(|p| p.exists()) {
            if !program.starts_with(p) {
                bind(p, system_attrs, None)?;
            }
        }
        for p in TOP_LIBS.iter().map(Path::new) {
            match std::fs::read_link(p) {
                Ok(target) => symlinks.push((cpath(&target)?, cpath(&inside(&self.root, p))?)),
                Err(_) if p.is_dir() => bind(p, system_attrs, None)?,
                Err(_) => {}
            }
        }
        for p in PLAIN_DEVICES.iter().map(Path::new).filter(|p| p.exists()) {
            bind(
                p,
                MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NOEXEC,
                None,
            )?;
        }
        for p in &self.devices {
            // devtmpfs may refuse id-mapping: the device's group (in `groups`) then opens it.
            let attrs = MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NOEXEC;
            let tree = match detached(p, attrs, Some(&userns)) {
                Ok(tree) => tree,
                Err(_) => detached(p, attrs, None).map_err(Error::io("bind into the jail", p))?,
            };
            bind_tree(p, tree);
        }
        let data = MountAttrFlags::MOUNT_ATTR_NOSUID
            | MountAttrFlags::MOUNT_ATTR_NODEV
            | MountAttrFlags::MOUNT_ATTR_NOEXEC;
        for p in &self.read {
            bind(p, data | MountAttrFlags::MOUNT_ATTR_RDONLY, Some(&userns))?;
        }
        for p in &self.write {
            bind(p, data, Some(&userns))?;
        }
        let mut binds = binds.into_inner();
        // Parents before children, so that a path inside another bind finds its mount point.
        binds.sort_by_key(|(p, _)| p.components().count());
        let mut dirs = BTreeSet::new();
        let mut files = Vec::new();
        for (path, _) in &binds {
            for a in path.ancestors().skip(1) {
                if a != Path::new("/") {
                    dirs.insert(a.to_path_buf());
                }
            }
            if path.is_dir() {
                dirs.insert(path.clone());
            } else {
                files.push(cpath(&inside(&self.root, path))?);
            }
        }
        let dirs = dirs
            .iter()
            .map(|d| cpath(&inside(&self.root, d)))
            .collect::<Result<Vec<_>>>()?;
        let binds = binds
            .into_iter()
            .map(|(p, tree)| {
                Ok(Bind {
                    tree,
                    target: cpath(&inside(&self.root, &p))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Prepared {
            root: cpath(&self.root)?,
            dirs,
            files,
            symlinks,
            binds,
            groups: self.groups.clone(),
            uid: self.uid,
            gid: self.gid,
            limits: self.limits,
        })
    }
}

/// Spawns `cmd` as the init (pid 1) of a new pid namespace: the jailed process sees no other
/// process, and whatever it could start (nothing, under `-sandbox spawn=deny`) would die with
/// it. The parent sees it under its host pid as with any child, so pid files, reattach and
/// signals are unchanged; as a namespace's init it gets from the host only SIGKILL, SIGSTOP and
/// the signals it handles (QEMU handles SIGTERM).
///
/// `unshare(CLONE_NEWPID)` changes the namespace of the calling thread's *next children*, and
/// only once per thread, so the spawn runs on a short-lived thread of its own; the caller's
/// threads, and every other child of the manager, stay in the host's namespace.
pub fn spawn_in_own_pid_ns(cmd: &mut tokio::process::Command) -> io::Result<tokio::process::Child> {
    // tokio registers the child with the runtime's reaper: the thread needs its handle.
    let runtime = tokio::runtime::Handle::try_current()
        .map_err(|e| io::Error::other(format!("no async runtime to own the child: {e}")))?;
    std::thread::scope(|s| {
        s.spawn(|| {
            let _enter = runtime.enter();
            // SAFETY: unshare takes no pointers; it changes only this thread's namespace for
            // the children it forks next.
            check(unsafe { libc::unshare(libc::CLONE_NEWPID) })
                .map_err(|e| io::Error::new(e.kind(), format!("new pid namespace: {e}")))?;
            cmd.spawn()
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the spawning thread panicked")))
    })
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl Prepared {
    /// Enters the jail. Only for the child between fork and exec: it makes async-signal-safe
    /// system calls on strings and descriptors prepared beforehand, and allocates nothing.
    ///
    /// # Safety
    /// Must run in a freshly forked, single-threaded child that is about to exec.
    pub unsafe fn enter(&self) -> io::Result<()> {
        // SAFETY: every pointer passed is a NUL-terminated string or a struct
        // owned by `self`, alive for the duration of each call.
        unsafe {
            check(libc::unshare(
                libc::CLONE_NEWNS | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS,
            ))?;
            // Nothing mounted here may propagate back to the host.
            check(libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            check(libc::mount(
                c"warren-jail".as_ptr(),
                self.root.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                c"mode=0755,size=1m,nr_inodes=4096".as_ptr().cast(),
            ))?;
            for d in &self.dirs {
                if libc::mkdir(d.as_ptr(), 0o755) != 0 && *libc::__errno_location() != libc::EEXIST
                {
                    return Err(io::Error::last_os_error());
                }
            }
            for f in &self.files {
                if libc::access(f.as_ptr(), libc::F_OK) != 0 {
                    let fd = libc::open(f.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o600);
                    if fd < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    libc::close(fd);
                }
            }
            for (target, link) in &self.symlinks {
                check(libc::symlink(target.as_ptr(), link.as_ptr()))?;
            }
            for b in &self.binds {
                mount::attach(b.tree.as_fd(), &b.target)?;
            }
            check(libc::chdir(self.root.as_ptr()))?;
            check(
                libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) as libc::c_int,
            )?;
            // The old root is stacked under the new one: detach it.
            check(libc::umount2(c".".as_ptr(), libc::MNT_DETACH))?;
            check(libc::chdir(c"/".as_ptr()))?;
            check(libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REMOUNT
                    | libc::MS_BIND
                    | libc::MS_RDONLY
                    | libc::MS_NOSUID
                    | libc::MS_NODEV
                    | libc::MS_NOEXEC,
                std::ptr::null(),
            ))?;
            for (res, value) in [
                (libc::RLIMIT_NOFILE, self.limits.nofile),
                (libc::RLIMIT_NPROC, self.limits.nproc),
                (libc::RLIMIT_FSIZE, self.limits.fsize),
                (libc::RLIMIT_CORE, 0),
            ] {
                let lim = libc::rlimit {
                    rlim_cur: value,
                    rlim_max: value,
                };
                check(libc::setrlimit(res, &lim))?;
            }
            check(libc::setgroups(self.groups.len(), self.groups.as_ptr()))?;
            check(libc::setgid(self.gid))?;
            check(libc::setuid(self.uid))?;
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
        }
        Ok(())
    }
}

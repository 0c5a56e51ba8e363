//! The exports and the objects in them: resolving handles (as root), looking names up (as the
//! caller) without leaving an export, attributes, and errno to NFS status.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nfs3_types::nfs3::{
    fattr3, ftype3, nfs_fh3, nfsstat3, nfstime3, post_op_attr, pre_op_attr, specdata3, wcc_attr,
    wcc_data,
};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Stat, StatxFlags};
use rustix::io::Errno;

use crate::creds::Baseline;
use crate::handle::{self, Codec};
use crate::Export;

pub(crate) type Res<T> = Result<T, nfsstat3>;

/// One export, opened at startup.
pub(crate) struct ExportState {
    pub path: String,
    /// The export's root directory, opened for reading (`open_by_handle_at` refuses an
    /// O_PATH descriptor as its mount argument).
    pub root: OwnedFd,
    pub dev: u64,
    pub root_ino: u64,
    pub read_only: bool,
    pub tag: u32,
    /// The root is its filesystem's root, so everything `open_by_handle_at` finds on it is
    /// inside the export; otherwise directories are checked to be beneath the root.
    pub whole_fs: bool,
}

/// Everything a call needs.
pub(crate) struct Ctx {
    pub exports: Vec<ExportState>,
    pub codec: Codec,
    /// The write verifier: random per server process, so a restart makes clients resend
    /// UNSTABLE writes they have not seen committed.
    pub verf: [u8; 8],
    pub base: Baseline,
}

/// An object of an export: an O_PATH descriptor and its attributes when it was resolved.
pub(crate) struct Obj {
    pub exp: usize,
    pub fd: OwnedFd,
    pub st: Stat,
}

const O_PATH_FLAGS: OFlags = OFlags::PATH.union(OFlags::NOFOLLOW).union(OFlags::CLOEXEC);

/// How single names are looked up: never through a symlink, a mount or "..".
const CONFINED: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

impl Ctx {
    pub fn new(exports: Vec<Export>, key: [u8; 32]) -> io::Result<Ctx> {
        let base = Baseline::capture()?;
        let mut states: Vec<ExportState> = Vec::with_capacity(exports.len());
        for e in exports {
            let root = rustix::fs::open(
                &e.root,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|err| {
                io::Error::new(
                    io::Error::from(err).kind(),
                    format!("opening export {} ({}): {err}", e.path, e.root.display()),
                )
            })?;
            let st = rustix::fs::fstat(&root)?;
            let tag = handle::export_tag(&e.path);
            if states.iter().any(|s| s.tag == tag) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("export path {} given twice (or a tag collision)", e.path),
                ));
            }
            // The kernel handle must fit in an NFS handle: check once, here.
            let kh = handle::name_to_handle(root.as_fd())?;
            if Codec::new([0; 32]).encode(tag, &e.path, &kh).is_none() {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!(
                        "{}: the filesystem's handles are too large",
                        e.root.display()
                    ),
                ));
            }
            let whole_fs = is_fs_root(root.as_fd())?;
            states.push(ExportState {
                path: e.path,
                dev: st.st_dev,
                root_ino: st.st_ino,
                read_only: e.read_only,
                tag,
                whole_fs,
                root,
            });
        }
        let mut verf = [0u8; 8];
        getrandom::fill(&mut verf).map_err(|e| io::Error::other(e.to_string()))?;
        Ok(Ctx {
            exports: states,
            codec: Codec::new(key),
            verf,
            base,
        })
    }

    pub fn export_index(&self, path: &[u8]) -> Option<usize> {
        let want = trim_path(path);
        self.exports
            .iter()
            .position(|e| trim_path(e.path.as_bytes()) == want)
    }

    /// The handle of an object of export `exp`.
    pub fn handle(&self, exp: usize, fd: BorrowedFd<'_>) -> Res<nfs_fh3> {
        let e = &self.exports[exp];
        let kh = handle::name_to_handle(fd).map_err(io_err)?;
        self.codec
            .encode(e.tag, &e.path, &kh)
            .ok_or(nfsstat3::NFS3ERR_SERVERFAULT)
    }

    pub fn root_handle(&self, exp: usize) -> Res<nfs_fh3> {
        self.handle(exp, self.exports[exp].root.as_fd())
    }

    /// Resolves a handle to its object. Runs with root's ids (open_by_handle_at needs
    /// CAP_DAC_READ_SEARCH). Forged or malformed: BADHANDLE; gone or outside: STALE.
    pub fn resolve(&self, fh: &nfs_fh3) -> Res<Obj> {
        let (exp, kh) = self.codec.decode(&fh.data, |tag| {
            self.exports
                .iter()
                .position(|e| e.tag == tag)
                .map(|i| (i, self.exports[i].path.as_str()))
        })?;
        let e = &self.exports[exp];
        let stale = nfsstat3::NFS3ERR_STALE;
        let fd = handle::open_by_handle(e.root.as_fd(), &kh).map_err(|err| {
            match err.raw_os_error() {
                Some(libc::ESTALE) | Some(libc::ENOENT) | Some(libc::EINVAL) => stale,
                _ => io_err(err),
            }
        })?;
        let st = rustix::fs::fstat(&fd).map_err(errno)?;
        if st.st_dev != e.dev {
            return Err(stale);
        }
        // Removed (but still held open somewhere): gone, as far as NFS is concerned.
        if st.st_nlink == 0 {
            return Err(stale);
        }
        let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
        if is_dir && !self.beneath(exp, &fd, &st) {
            return Err(stale);
        }
        Ok(Obj { exp, fd, st })
    }

    fn is_root(&self, exp: usize, st: &Stat) -> bool {
        let e = &self.exports[exp];
        st.st_dev == e.dev && st.st_ino == e.root_ino
    }

    /// Whether directory `fd` is the export's root or beneath it, walking "..".
    fn beneath(&self, exp: usize, fd: &OwnedFd, st: &Stat) -> bool {
        let e = &self.exports[exp];
        if e.whole_fs || self.is_root(exp, st) {
            return st.st_dev == e.dev;
        }
        let mut cur = match rustix::io::dup(fd) {
            Ok(f) => f,
            Err(_) => return false,
        };
        let mut cur_st = *st;
        for _ in 0..4096 {
            let flags = ResolveFlags::NO_XDEV | ResolveFlags::NO_SYMLINKS;
            let Ok(parent) = rustix::fs::openat2(&cur, "..", O_PATH_FLAGS, Mode::empty(), flags)
            else {
                return false;
            };
            let Ok(pst) = rustix::fs::fstat(&parent) else {
                return false;
            };
            if pst.st_dev != e.dev || (pst.st_ino == cur_st.st_ino) {
                return false;
            }
            if self.is_root(exp, &pst) {
                return true;
            }
            cur = parent;
            cur_st = pst;
        }
        false
    }

    /// Looks `name` up in directory `dir`, as the caller (the kernel checks search
    /// permission). Never follows a symlink (a symlink's own object comes back), never leaves
    /// the filesystem, and ".." at the export's root is the root.
    pub fn lookup(&self, dir: &Obj, name: &[u8]) -> Res<Obj> {
        if FileType::from_raw_mode(dir.st.st_mode) != FileType::Directory {
            return Err(nfsstat3::NFS3ERR_NOTDIR);
        }
        check_component(name)?;
        let fd = match name {
            b"." => rustix::fs::openat2(&dir.fd, ".", O_PATH_FLAGS, Mode::empty(), CONFINED),
            b".." if self.is_root(dir.exp, &dir.st) => rustix::io::dup(&self.exports[dir.exp].root),
            b".." => rustix::fs::openat2(
                &dir.fd,
                "..",
                O_PATH_FLAGS | OFlags::DIRECTORY,
                Mode::empty(),
                ResolveFlags::NO_XDEV | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
            ),
            _ => rustix::fs::openat2(&dir.fd, name, O_PATH_FLAGS, Mode::empty(), CONFINED),
        }
        .map_err(errno)?;
        let st = rustix::fs::fstat(&fd).map_err(errno)?;
        if st.st_dev != self.exports[dir.exp].dev {
            return Err(nfsstat3::NFS3ERR_ACCES);
        }
        if name == b".." && !self.beneath(dir.exp, &fd, &st) {
            return Err(nfsstat3::NFS3ERR_ACCES);
        }
        Ok(Obj {
            exp: dir.exp,
            fd,
            st,
        })
    }

    /// Opens `name` in `dir` (a name already checked by [`check_name`]) as an O_PATH object.
    pub fn open_child(&self, dir: &Obj, name: &[u8]) -> Res<Obj> {
        let fd = rustix::fs::openat2(&dir.fd, name, O_PATH_FLAGS, Mode::empty(), CONFINED)
            .map_err(errno)?;
        let st = rustix::fs::fstat(&fd).map_err(errno)?;
        Ok(Obj {
            exp: dir.exp,
            fd,
            st,
        })
    }

    pub fn fattr(&self, exp: usize, st: &Stat) -> fattr3 {
        fattr_of(u64::from(self.exports[exp].tag), st)
    }

    /// Attributes of `fd` now, if they can be had.
    pub fn post(&self, exp: usize, fd: BorrowedFd<'_>) -> post_op_attr {
        match rustix::fs::fstat(fd) {
            Ok(st) => post_op_attr::Some(self.fattr(exp, &st)),
            Err(_) => post_op_attr::None,
        }
    }

    pub fn post_obj(&self, o: &Obj) -> post_op_attr {
        self.post(o.exp, o.fd.as_fd())
    }

    /// Weak cache consistency data: `pre` as resolved, the attributes after from `o` now.
    pub fn wcc(&self, o: &Obj) -> wcc_data {
        wcc_data {
            before: pre_op_attr::Some(wcc_attr_of(&o.st)),
            after: self.post_obj(o),
        }
    }
}

fn trim_path(p: &[u8]) -> &[u8] {
    let mut p = p;
    while p.len() > 1 && p.ends_with(b"/") {
        p = &p[..p.len() - 1];
    }
    p
}

/// Whether `fd` is the root of its filesystem (a mount root whose mountinfo root is "/").
fn is_fs_root(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let sx = rustix::fs::statx(fd, "", AtFlags::EMPTY_PATH, StatxFlags::MNT_ID)?;
    if !sx
        .stx_attributes
        .contains(rustix::fs::StatxAttributes::MOUNT_ROOT)
    {
        return Ok(false);
    }
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(info.lines().any(|l| {
        let mut f = l.split(' ');
        let id = f.next();
        let root = f.nth(2);
        id == Some(sx.stx_mnt_id.to_string().as_str()) && root == Some("/")
    }))
}

/// A single directory entry name: not empty, no '/' or NUL, at most 255 bytes.
pub(crate) fn check_component(name: &[u8]) -> Res<()> {
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(nfsstat3::NFS3ERR_ACCES);
    }
    if name.len() > 255 {
        return Err(nfsstat3::NFS3ERR_NAMETOOLONG);
    }
    Ok(())
}

/// A name to create, remove or rename: a component, and not "." or "..".
pub(crate) fn check_name(name: &[u8]) -> Res<()> {
    check_component(name)?;
    if name == b"." || name == b".." {
        return Err(nfsstat3::NFS3ERR_INVAL);
    }
    Ok(())
}

/// Reopens an O_PATH object for I/O through its /proc magic link. Runs as the caller, so the
/// kernel checks the caller's permission for `flags` as for any open.
pub(crate) fn reopen(fd: BorrowedFd<'_>, flags: OFlags) -> Res<OwnedFd> {
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    rustix::fs::open(
        path.as_str(),
        flags | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )
    .map_err(errno)
}

/// Whether the current thread's ids may access `fd`'s object in `mode` (R_OK, W_OK, X_OK):
/// `faccessat2(fd, "", mode, AT_EMPTY_PATH | AT_EACCESS)`, which checks the fsuid and fsgid
/// (rustix's accessat refuses AT_EMPTY_PATH, so the raw syscall).
pub(crate) fn may_access(fd: BorrowedFd<'_>, mode: libc::c_int) -> bool {
    // SAFETY: a valid descriptor, a NUL-terminated empty path, and integer mode and flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_faccessat2,
            fd.as_raw_fd(),
            c"".as_ptr(),
            mode,
            libc::AT_EMPTY_PATH | libc::AT_EACCESS,
        )
    };
    rc == 0
}

pub(crate) fn is_type(st: &Stat, t: FileType) -> bool {
    FileType::from_raw_mode(st.st_mode) == t
}

#[allow(clippy::unnecessary_cast)]
fn time(sec: i64, nsec: u64) -> nfstime3 {
    nfstime3 {
        seconds: sec.clamp(0, i64::from(u32::MAX)) as u32,
        nseconds: nsec as u32,
    }
}

#[allow(clippy::unnecessary_cast)]
pub(crate) fn mtime(st: &Stat) -> nfstime3 {
    time(st.st_mtime as i64, st.st_mtime_nsec as u64)
}

#[allow(clippy::unnecessary_cast)]
pub(crate) fn ctime(st: &Stat) -> nfstime3 {
    time(st.st_ctime as i64, st.st_ctime_nsec as u64)
}

#[allow(clippy::unnecessary_cast)]
fn fattr_of(fsid: u64, st: &Stat) -> fattr3 {
    let type_ = match FileType::from_raw_mode(st.st_mode) {
        FileType::Directory => ftype3::NF3DIR,
        FileType::Symlink => ftype3::NF3LNK,
        FileType::BlockDevice => ftype3::NF3BLK,
        FileType::CharacterDevice => ftype3::NF3CHR,
        FileType::Socket => ftype3::NF3SOCK,
        FileType::Fifo => ftype3::NF3FIFO,
        _ => ftype3::NF3REG,
    };
    let rdev = st.st_rdev as u64;
    fattr3 {
        type_,
        mode: (st.st_mode as u32) & 0o7777,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        size: st.st_size as u64,
        used: (st.st_blocks as u64).saturating_mul(512),
        rdev: specdata3 {
            specdata1: rustix::fs::major(rdev),
            specdata2: rustix::fs::minor(rdev),
        },
        fsid,
        fileid: st.st_ino as u64,
        atime: time(st.st_atime as i64, st.st_atime_nsec as u64),
        mtime: mtime(st),
        ctime: ctime(st),
    }
}

#[allow(clippy::unnecessary_cast)]
pub(crate) fn wcc_attr_of(st: &Stat) -> wcc_attr {
    wcc_attr {
        size: st.st_size as u64,
        mtime: mtime(st),
        ctime: ctime(st),
    }
}

/// The NFS status for an errno.
pub(crate) fn errno(e: Errno) -> nfsstat3 {
    use nfsstat3::*;
    match e {
        Errno::PERM => NFS3ERR_PERM,
        Errno::NOENT => NFS3ERR_NOENT,
        Errno::NXIO => NFS3ERR_NXIO,
        Errno::ACCESS => NFS3ERR_ACCES,
        Errno::EXIST => NFS3ERR_EXIST,
        Errno::XDEV => NFS3ERR_XDEV,
        Errno::NODEV => NFS3ERR_NODEV,
        Errno::NOTDIR => NFS3ERR_NOTDIR,
        Errno::ISDIR => NFS3ERR_ISDIR,
        Errno::INVAL => NFS3ERR_INVAL,
        Errno::FBIG => NFS3ERR_FBIG,
        Errno::NOSPC => NFS3ERR_NOSPC,
        Errno::ROFS => NFS3ERR_ROFS,
        Errno::MLINK => NFS3ERR_MLINK,
        Errno::NAMETOOLONG => NFS3ERR_NAMETOOLONG,
        Errno::NOTEMPTY => NFS3ERR_NOTEMPTY,
        Errno::DQUOT => NFS3ERR_DQUOT,
        Errno::STALE => NFS3ERR_STALE,
        Errno::OPNOTSUPP => NFS3ERR_NOTSUPP,
        // A symlink met where RESOLVE_NO_SYMLINKS or O_NOFOLLOW refuses it.
        Errno::LOOP => NFS3ERR_INVAL,
        Errno::TXTBSY => NFS3ERR_ACCES,
        Errno::AGAIN => NFS3ERR_JUKEBOX,
        _ => {
            tracing::debug!("errno {e:?} answered as NFS3ERR_IO");
            NFS3ERR_IO
        }
    }
}

pub(crate) fn io_err(e: io::Error) -> nfsstat3 {
    match e.raw_os_error() {
        Some(n) => errno(Errno::from_raw_os_error(n)),
        None => nfsstat3::NFS3ERR_IO,
    }
}

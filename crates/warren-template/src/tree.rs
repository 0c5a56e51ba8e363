//! Changing an image's root filesystem from outside it without leaving it: the builder's
//! fix-ups of a pulled image, the vm export's tidy, and nsinit's setup of a sandbox's root
//! before it pivots into it.
//!
//! An unpacked image may hold symlinks that are absolute (`tmp -> /etc/shadow`) or climb
//! (`usr -> ../../etc`): inside a sandbox they name the image's own files, but a root process
//! on the host that resolves them with plain path calls reaches the host's. Everything here
//! resolves directories with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` against a
//! descriptor of the image root, as the kernel would for a process whose root is the image,
//! and then acts on the last component with `*at` calls that never follow it. Modes are set
//! through descriptors (`fchmod`), never by path.

use std::ffi::{OsStr, OsString};
use std::io::{self, Write as _};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, openat2, readlinkat, AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fchmod, fchmodat, fstatat, mkdirat, FchmodatFlags, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

/// An image's root directory, for changes that must stay inside it.
#[derive(Debug)]
pub struct ImageTree {
    root: OwnedFd,
}

impl ImageTree {
    /// Opens the image root at `path` (a host path the caller trusts).
    pub fn open(path: &Path) -> io::Result<Self> {
        let root = nix::fcntl::open(
            path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Self { root })
    }

    /// Makes `rel` a real directory (not a symlink, whatever a symlink there pointed to) and,
    /// with `mode`, gives it that mode. Missing parents are made as [`resolve_dir`] makes them;
    /// a file or symlink in the way is removed (never followed).
    pub fn real_dir(&self, rel: &Path, mode: Option<u32>) -> io::Result<()> {
        let (parent, name) = self.parent_of(rel, true)?;
        let parent = parent.expect("made when missing");
        if !is_dir_at(&parent, &name) {
            remove_any(&parent, &name)?;
            mkdirat(&parent, name.as_os_str(), Mode::from_bits_truncate(0o755))?;
            // 0755 whatever the process umask is.
            fchmodat(
                &parent,
                name.as_os_str(),
                Mode::from_bits_truncate(0o755),
                FchmodatFlags::NoFollowSymlink,
            )
            .map_err(io::Error::from)
            .or_else(|_| set_mode_at(&parent, &name, 0o755))?;
        }
        if let Some(mode) = mode {
            set_mode_at(&parent, &name, mode)?;
        }
        Ok(())
    }

    /// Makes directory `rel` exist, resolving every component (symlinks included) inside the
    /// image, as a process in the sandbox would see it.
    pub fn dir_all(&self, rel: &Path) -> io::Result<()> {
        resolve_dir(&self.root, &clean(rel)?, true).map(drop)
    }

    /// Makes `rel` a regular file unless it already is one: anything else there (a symlink,
    /// a directory) is replaced by a file holding `content` with `mode`.
    pub fn ensure_file(&self, rel: &Path, content: &[u8], mode: u32) -> io::Result<()> {
        let (parent, name) = self.parent_of(rel, true)?;
        let parent = parent.expect("made when missing");
        if let Ok(st) = fstatat(&parent, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFREG {
                return Ok(());
            }
        }
        replace_with_file(&parent, &name, content, mode)
    }

    /// Makes `rel` a regular file holding `content` with `mode`, replacing whatever is there
    /// (a symlink is replaced, never written through).
    pub fn write_file(&self, rel: &Path, content: &[u8], mode: u32) -> io::Result<()> {
        let (parent, name) = self.parent_of(rel, true)?;
        let parent = parent.expect("made when missing");
        replace_with_file(&parent, &name, content, mode)
    }

    /// An `O_PATH` descriptor of directory `rel` resolved inside the image (made when
    /// `create` and missing): `/proc/self/fd/<fd>/<name>` then names an entry in it from
    /// outside, e.g. as a mount target.
    pub fn dir(&self, rel: &Path, create: bool) -> io::Result<OwnedFd> {
        resolve_dir(&self.root, &clean(rel)?, create)
    }

    /// Removes `rel` (a whole tree if it is a directory) without following it; a missing
    /// entry, or a missing (or looping) parent, is not an error.
    pub fn remove(&self, rel: &Path) -> io::Result<()> {
        match self.parent_of(rel, false)? {
            (Some(parent), name) => remove_any(&parent, &name),
            (None, _) => Ok(()),
        }
    }

    /// The names in directory `rel` (resolved inside the image); none when it is missing or
    /// not a directory.
    pub fn names(&self, rel: &Path) -> io::Result<Vec<OsString>> {
        match resolve_dir(&self.root, &clean(rel)?, false) {
            Ok(dir) => list(&dir),
            Err(e) if missing(&e) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// The directory holding `rel`'s last component, resolved inside the image (made when
    /// `create`; `None` when missing and not `create`), and that component.
    fn parent_of(&self, rel: &Path, create: bool) -> io::Result<(Option<OwnedFd>, OsString)> {
        let rel = clean(rel)?;
        let (parent, name) = match (rel.parent(), rel.file_name()) {
            (Some(p), Some(n)) => (p.to_path_buf(), n.to_os_string()),
            _ => return Err(invalid(format!("{} names the image root", rel.display()))),
        };
        match resolve_dir(&self.root, &parent, create) {
            Ok(fd) => Ok((Some(fd), name)),
            Err(e) if !create && missing(&e) => Ok((None, name)),
            Err(e) => Err(e),
        }
    }
}

/// Whether a lookup found nothing to act on: a missing entry, a file where a directory
/// should be, or symlinks that loop (inside the image: they name nothing).
fn missing(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(code) if code == Errno::ENOENT as i32
            || code == Errno::ENOTDIR as i32
            || code == Errno::ELOOP as i32
    )
}

/// Replaces whatever `name` in `parent` is (never following it) by a new regular file holding
/// `content` with `mode`.
fn replace_with_file(parent: &OwnedFd, name: &OsStr, content: &[u8], mode: u32) -> io::Result<()> {
    remove_any(parent, name)?;
    let fd = openat(
        parent,
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )?;
    fchmod(&fd, Mode::from_bits_truncate(mode))?;
    std::fs::File::from(fd).write_all(content)
}

/// `rel` as plain components: a leading `/` or `.` is dropped, `..` refused.
fn clean(rel: &Path) -> io::Result<PathBuf> {
    let mut out = PathBuf::new();
    for comp in rel.components() {
        match comp {
            Component::Normal(c) => out.push(c),
            Component::RootDir | Component::CurDir => {}
            _ => return Err(invalid(format!("{} leaves the image", rel.display()))),
        }
    }
    Ok(out)
}

/// Sets the mode of `name` in `dir` through a descriptor of it; `name` must be a directory or
/// a regular file, and is not followed if it is a symlink.
fn set_mode_at(dir: &OwnedFd, name: &OsStr, mode: u32) -> io::Result<()> {
    let fd = openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    Ok(fchmod(&fd, Mode::from_bits_truncate(mode))?)
}

/// A descriptor (`O_PATH`) of directory `rel` resolved inside `root`, made (0755, root-owned,
/// as Docker does for missing parents) when `create` and missing. A dangling symlink on the way
/// is taken as the image would: the directory it names is made, inside the root too.
pub fn resolve_dir(root: &OwnedFd, rel: &Path, create: bool) -> io::Result<OwnedFd> {
    resolve_depth(root, rel, create, 0)
}

fn resolve_depth(root: &OwnedFd, rel: &Path, create: bool, depth: u32) -> io::Result<OwnedFd> {
    let how = || {
        OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS)
    };
    let path = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    match openat2(root, path, how()) {
        Ok(fd) => Ok(fd),
        Err(Errno::ENOSYS) => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the kernel lacks openat2 (Linux 5.6 or later is needed)",
        )),
        // The kernel's own limit on symlinks in one lookup.
        Err(Errno::ENOENT) if create && depth < 40 => {
            let mut prefix = PathBuf::new();
            let mut dir = openat2(root, ".", how())?;
            for comp in rel.components() {
                prefix.push(comp);
                dir = match openat2(root, &prefix, how()) {
                    Ok(fd) => fd,
                    Err(Errno::ENOENT) if matches!(comp, Component::Normal(_)) => {
                        let name = comp.as_os_str();
                        match mkdirat(&dir, name, Mode::from_bits_truncate(0o755)) {
                            // 0755 whatever the process umask is.
                            Ok(()) => fchmodat(
                                &dir,
                                name,
                                Mode::from_bits_truncate(0o755),
                                FchmodatFlags::NoFollowSymlink,
                            )
                            .or_else(|_| set_mode_at(&dir, name, 0o755).map_err(errno_of))?,
                            // A dangling symlink: make the directory it names, which is
                            // inside the root too.
                            Err(Errno::EEXIST) => {
                                let target = PathBuf::from(readlinkat(&dir, name)?);
                                let base = prefix.parent().unwrap_or(Path::new(""));
                                resolve_depth(root, &base.join(target), true, depth + 1)?;
                            }
                            Err(e) => return Err(e.into()),
                        }
                        openat2(root, &prefix, how())?
                    }
                    Err(e) => return Err(e.into()),
                };
            }
            Ok(dir)
        }
        Err(e) => Err(e.into()),
    }
}

fn errno_of(e: io::Error) -> Errno {
    e.raw_os_error().map_or(Errno::EIO, Errno::from_raw)
}

/// An error for input that names something outside the tree or is malformed.
pub fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Whether `name` in `dir` is a directory (not a symlink to one).
pub fn is_dir_at(dir: &impl AsFd, name: &OsStr) -> bool {
    fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .is_ok_and(|st| SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR)
}

/// The names in a directory, read before anything in it changes.
pub fn list(dir: &impl AsFd) -> io::Result<Vec<OsString>> {
    let fd = openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let mut d = nix::dir::Dir::from_fd(fd)?;
    let mut names = Vec::new();
    for ent in d.iter() {
        let ent = ent?;
        let name = ent.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(OsStr::from_bytes(name).to_os_string());
        }
    }
    Ok(names)
}

/// Removes `name` in `dir`, a whole tree if it is a directory; never follows a symlink.
pub fn remove_any(dir: &impl AsFd, name: &OsStr) -> io::Result<()> {
    if name == "." || name == ".." || name.as_bytes().contains(&b'/') {
        return Err(invalid(format!("removing {name:?}")));
    }
    let dir: BorrowedFd<'_> = dir.as_fd();
    match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(e.into()),
        Ok(st) if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR => {
            let sub = openat(
                dir,
                name,
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )?;
            for child in list(&sub)? {
                remove_any(&sub, &child)?;
            }
            unlinkat(dir, name, UnlinkatFlags::RemoveDir)?;
            Ok(())
        }
        Ok(_) => Ok(unlinkat(dir, name, UnlinkatFlags::NoRemoveDir)?),
    }
}

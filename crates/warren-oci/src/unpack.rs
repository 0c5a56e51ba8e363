//! Applying layers to a directory, as an overlay filesystem would show them stacked, without
//! letting any entry reach outside the directory.
//!
//! Every parent directory is resolved with `openat2(RESOLVE_IN_ROOT)` against a descriptor of
//! the destination, so symlinks (made by this layer or a lower one, absolute or relative, even
//! one to `/`) resolve as they would inside a container whose root is the destination. The
//! entry's own name is then created, replaced or removed with `*at` calls relative to that
//! parent, which never follow a symlink in the last component.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};

use nix::fcntl::AtFlags;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{
    fchmod, fchmodat, fstatat, futimens, mkdirat, mknodat, utimensat, FchmodatFlags, Mode, SFlag,
    UtimensatFlags,
};
use nix::sys::time::TimeSpec;
use nix::unistd::{fchown, fchownat, linkat, symlinkat, Gid, Uid};

use crate::tree::{invalid, is_dir_at, list, remove_any};
use crate::{decompress, PullError, PulledImage};

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// Applies `image`'s layers in order to `dest`, an empty directory. Blocking; meant to run as
/// root (ownership, devices). Returns the bytes of file content written.
pub fn unpack(image: &PulledImage, dest: &Path) -> Result<u64, PullError> {
    unpack_limited(image, dest, u64::MAX)
}

/// [`unpack`], refusing with [`PullError::TooLarge`] once the layers have written more than
/// `max_bytes` of file content (a small compressed layer can expand enormously).
pub fn unpack_limited(image: &PulledImage, dest: &Path, max_bytes: u64) -> Result<u64, PullError> {
    let root = open_root(dest)?;
    let mut written = 0;
    for layer in &image.layers {
        let tar = decompress::open(&layer.path, &layer.media_type)?;
        written +=
            apply_layer(&root, tar, &layer.digest, max_bytes - written).map_err(|e| match e {
                PullError::TooLarge { .. } => PullError::TooLarge { limit: max_bytes },
                e => e,
            })?;
    }
    Ok(written)
}

fn open_root(dest: &Path) -> Result<OwnedFd, PullError> {
    nix::fcntl::open(
        dest,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| PullError::io(format!("opening {}", dest.display()), e.into()))
}

/// The entry path as components below the root: `./` and a leading `/` are dropped (the root
/// is the image's `/`), and `..` is refused.
fn clean(path: &Path) -> Result<PathBuf, String> {
    let mut out = PathBuf::new();
    for comp in path.components() {
        match comp {
            Component::Normal(c) => out.push(c),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => return Err(format!("{} has a '..' component", path.display())),
            Component::Prefix(_) => return Err(format!("{} is not a unix path", path.display())),
        }
    }
    Ok(out)
}

/// Metadata of one entry, from its header and PAX records.
struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: i64,
    xattrs: Vec<(OsString, Vec<u8>)>,
}

fn meta_of<R: Read>(entry: &mut tar::Entry<'_, R>) -> io::Result<Meta> {
    let header = entry.header();
    let old = header.as_old();
    let mut meta = Meta {
        mode: numeric(header.mode().map(u64::from), &old.mode)? as u32 & 0o7777,
        uid: numeric(header.uid(), &old.uid)? as u32,
        gid: numeric(header.gid(), &old.gid)? as u32,
        mtime: numeric(header.mtime(), &old.mtime)? as i64,
        xattrs: Vec::new(),
    };
    if let Some(pax) = entry.pax_extensions()? {
        for ext in pax {
            let ext = ext?;
            let key = ext.key_bytes();
            let value = ext.value_bytes();
            let number = || std::str::from_utf8(value).ok().map(str::trim);
            if let Some(name) = key.strip_prefix(b"SCHILY.xattr.") {
                meta.xattrs
                    .push((OsStr::from_bytes(name).to_os_string(), value.to_vec()));
            } else if key == b"uid" {
                meta.uid = number().and_then(|n| n.parse().ok()).unwrap_or(meta.uid);
            } else if key == b"gid" {
                meta.gid = number().and_then(|n| n.parse().ok()).unwrap_or(meta.gid);
            } else if key == b"mtime" {
                let secs = number().and_then(|n| n.split('.').next()?.parse().ok());
                meta.mtime = secs.unwrap_or(meta.mtime);
            }
        }
    }
    Ok(meta)
}

/// A numeric header field; one left blank (all NULs or spaces) is 0, as Go's archive/tar
/// (which wrote most layers) reads it.
fn numeric(parsed: io::Result<u64>, raw: &[u8]) -> io::Result<u64> {
    match parsed {
        Ok(n) => Ok(n),
        Err(_) if raw.iter().all(|b| *b == 0 || *b == b' ') => Ok(0),
        Err(e) => Err(invalid(e.to_string())),
    }
}

/// One layer being applied.
struct Layer<'a> {
    root: &'a OwnedFd,
    /// Paths this layer has made: an opaque marker removes only what lower layers made.
    made: HashSet<PathBuf>,
    /// Directory mtimes, set once the layer is done (adding children changes them).
    dir_times: Vec<(PathBuf, i64)>,
    /// File bytes this layer may still write.
    room: u64,
}

fn apply_layer(
    root: &OwnedFd,
    tar: Box<dyn Read>,
    digest: &str,
    room: u64,
) -> Result<u64, PullError> {
    let mut layer = Layer {
        root,
        made: HashSet::new(),
        dir_times: Vec::new(),
        room,
    };
    let mut archive = tar::Archive::new(tar);
    let bad_tar = |e: io::Error| PullError::bad(format!("layer {digest} is not a valid tar: {e}"));
    let mut written = 0;
    for entry in archive.entries().map_err(bad_tar)? {
        let mut entry = entry.map_err(bad_tar)?;
        let raw = entry.path().map_err(bad_tar)?.into_owned();
        let rel = clean(&raw).map_err(|e| PullError::bad(format!("layer {digest}: {e}")))?;
        written += layer.entry(&mut entry, &rel).map_err(|e| match e.kind() {
            io::ErrorKind::FileTooLarge => PullError::TooLarge { limit: room },
            io::ErrorKind::InvalidData => {
                PullError::bad(format!("layer {digest}: {}: {e}", raw.display()))
            }
            _ => PullError::io(format!("layer {digest}: unpacking {}", raw.display()), e),
        })?;
    }
    for (rel, mtime) in layer.dir_times.iter().rev() {
        let (parent, name) = match split(rel) {
            Some(split) => split,
            None => continue,
        };
        if let Ok(dir) = layer.resolve(parent, false) {
            let t = TimeSpec::new(*mtime, 0);
            // Best effort, like the rest of the metadata a filesystem may refuse.
            let _ = utimensat(&dir, name, &t, &t, UtimensatFlags::NoFollowSymlink);
        }
    }
    Ok(written)
}

fn split(rel: &Path) -> Option<(&Path, &OsStr)> {
    Some((rel.parent()?, rel.file_name()?))
}

impl Layer<'_> {
    /// A descriptor of directory `rel` resolved inside the root, made when `create` and
    /// missing ([`crate::tree::resolve_dir`]).
    fn resolve(&self, rel: &Path, create: bool) -> io::Result<OwnedFd> {
        crate::tree::resolve_dir(self.root, rel, create)
    }

    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>, rel: &Path) -> io::Result<u64> {
        let Some((parent_rel, name)) = split(rel) else {
            // The root itself (`./`): it already exists, and its mode is the builder's.
            return Ok(0);
        };
        let name_bytes = name.as_bytes();
        if name_bytes == OPAQUE.as_bytes() {
            let dir = self.resolve(parent_rel, true)?;
            self.made.insert(parent_rel.to_path_buf());
            return self.empty_lower(&dir, parent_rel).map(|()| 0);
        }
        if let Some(hidden) = name_bytes.strip_prefix(WHITEOUT.as_bytes()) {
            if hidden.starts_with(WHITEOUT.as_bytes()) || hidden.is_empty() {
                // Other `.wh..wh.` names are aufs bookkeeping, not content.
                return Ok(0);
            }
            if hidden == b"." || hidden == b".." {
                // `.wh..` would remove the directory itself, `.wh...` its parent: outside
                // the root when the parent is the root.
                return Err(invalid(format!(
                    "a whiteout of {:?}",
                    OsStr::from_bytes(hidden)
                )));
            }
            return match self.resolve(parent_rel, false) {
                Ok(dir) => remove_any(&dir, OsStr::from_bytes(hidden)),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
                Err(e) => Err(e),
            }
            .map(|()| 0);
        }

        let meta = meta_of(entry)?;
        let kind = entry.header().entry_type();
        let parent = self.resolve(parent_rel, true)?;
        self.made.insert(rel.to_path_buf());
        let mut written = 0;
        match kind {
            tar::EntryType::Directory => {
                let existing = fstatat(&parent, name, AtFlags::AT_SYMLINK_NOFOLLOW);
                let is_dir = existing.as_ref().is_ok_and(|st| {
                    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR
                });
                if !is_dir {
                    remove_any(&parent, name)?;
                    mkdirat(&parent, name, Mode::from_bits_truncate(0o700))?;
                }
                let fd = openat(
                    &parent,
                    name,
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )?;
                set_fd_meta(fd, &meta, false)?;
                self.dir_times.push((rel.to_path_buf(), meta.mtime));
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                remove_any(&parent, name)?;
                let fd = openat(
                    &parent,
                    name,
                    OFlag::O_WRONLY
                        | OFlag::O_CREAT
                        | OFlag::O_EXCL
                        | OFlag::O_NOFOLLOW
                        | OFlag::O_CLOEXEC,
                    Mode::from_bits_truncate(0o600),
                )?;
                let mut file = std::fs::File::from(fd);
                written = io::copy(&mut entry.take(self.room.saturating_add(1)), &mut file)?;
                if written > self.room {
                    return Err(io::ErrorKind::FileTooLarge.into());
                }
                self.room -= written;
                set_fd_meta(file.into(), &meta, true)?;
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()?
                    .ok_or_else(|| invalid("a symlink without a target".into()))?
                    .into_owned();
                remove_any(&parent, name)?;
                symlinkat(&target, &parent, name)?;
                self.set_link_meta(&parent, name, &meta)?;
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name()?
                    .ok_or_else(|| invalid("a hard link without a target".into()))?;
                let target = clean(&target).map_err(invalid)?;
                let (t_parent_rel, t_name) =
                    split(&target).ok_or_else(|| invalid("a hard link to the root".into()))?;
                if target == rel {
                    return Ok(0);
                }
                let t_parent = self.resolve(t_parent_rel, false)?;
                remove_any(&parent, name)?;
                linkat(&t_parent, t_name, &parent, name, AtFlags::empty())?;
            }
            tar::EntryType::Char | tar::EntryType::Block => {
                // Never made: an image's device nodes would be live wherever its tree is
                // reachable on the host (the raw disk with mode 0666, say), and the sandbox's
                // own /dev provides the ones programs need. What a lower layer had under this
                // name is gone, as the layer says.
                remove_any(&parent, name)?;
            }
            tar::EntryType::Fifo => {
                remove_any(&parent, name)?;
                mknodat(
                    &parent,
                    name,
                    SFlag::S_IFIFO,
                    Mode::from_bits_truncate(0o600),
                    0,
                )?;
                self.set_link_meta(&parent, name, &meta)?;
                // The fifo was just made under this name, so following is safe (Linux has no
                // chmod that does not follow).
                fchmodat(
                    &parent,
                    name,
                    Mode::from_bits_truncate(meta.mode),
                    FchmodatFlags::FollowSymlink,
                )?;
            }
            tar::EntryType::XGlobalHeader => {}
            other => {
                return Err(invalid(format!(
                    "entry type {other:?} is not supported in layers"
                )))
            }
        }
        Ok(written)
    }

    /// Owner and times of a symlink or device, set without following it.
    fn set_link_meta(&self, parent: &OwnedFd, name: &OsStr, meta: &Meta) -> io::Result<()> {
        fchownat(
            parent,
            name,
            Some(Uid::from_raw(meta.uid)),
            Some(Gid::from_raw(meta.gid)),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )?;
        let t = TimeSpec::new(meta.mtime, 0);
        let _ = utimensat(parent, name, &t, &t, UtimensatFlags::NoFollowSymlink);
        Ok(())
    }

    /// Removes what lower layers put in `dir` (an opaque directory), keeping what this layer
    /// made, and descending into this layer's directories, which lower content must not show
    /// through either.
    fn empty_lower(&self, dir: &OwnedFd, rel: &Path) -> io::Result<()> {
        for name in list(dir)? {
            let child = rel.join(&name);
            if !self.made.contains(&child) {
                remove_any(dir, &name)?;
            } else if is_dir_at(dir, &name) {
                let sub = openat(
                    dir,
                    name.as_os_str(),
                    OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )?;
                self.empty_lower(&sub, &child)?;
            }
        }
        Ok(())
    }
}

/// Owner, mode (after the owner: chown clears set-id bits), xattrs and (for files) times.
fn set_fd_meta(fd: OwnedFd, meta: &Meta, times: bool) -> io::Result<()> {
    fchown(
        &fd,
        Some(Uid::from_raw(meta.uid)),
        Some(Gid::from_raw(meta.gid)),
    )?;
    fchmod(&fd, Mode::from_bits_truncate(meta.mode))?;
    let file = std::fs::File::from(fd);
    for (key, value) in &meta.xattrs {
        // Where possible: tmpfs or a non-root caller may refuse some namespaces.
        let _ = xattr::FileExt::set_xattr(&file, key, value);
    }
    if times {
        let t = TimeSpec::new(meta.mtime, 0);
        let _ = futimens(file.as_fd(), &t, &t);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_drops_roots_and_refuses_dotdot() {
        assert_eq!(clean(Path::new("./a/b")).unwrap(), Path::new("a/b"));
        assert_eq!(
            clean(Path::new("/etc/passwd")).unwrap(),
            Path::new("etc/passwd")
        );
        assert_eq!(clean(Path::new("./")).unwrap(), Path::new(""));
        assert!(clean(Path::new("a/../../b")).is_err());
    }
}

//! [`Content`]: file operations on a mounted volume for an HTTP content API, confined beneath
//! the volume's root.
//!
//! How confinement works: every path is first normalised lexically ([`VolPath`]), then every
//! directory on the way is opened through cap-std from the volume root's fd, which on Linux is
//! `openat2(RESOLVE_BENEATH)`: symlinks are followed only while they stay inside the volume,
//! and one that leads out (absolute, or climbing with `..`) fails the whole operation with
//! [`VolumeError::Escape`]. The last component is then handled relative to its parent's fd
//! without following a symlink there (lstat, `O_NOFOLLOW` opens, unlinkat, renameat, fchownat
//! with `AT_SYMLINK_NOFOLLOW`), so a symlink is always acted on as itself. Ownership and mode
//! changes are made on an fd (fchown/fchmod), never by path. Together this means nothing a
//! sandbox puts in its volume can make the server read, write, chown or delete anything outside
//! it, even while the sandbox swaps entries around during an operation: a lost race is an error,
//! never an escape.

use cap_std::fs::MetadataExt;
use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cap_fs_ext::{DirExt, FollowSymlinks, OpenOptionsFollowExt, OpenOptionsMaybeDirExt};
use cap_std::fs::{Dir, Metadata, OpenOptions, OpenOptionsExt};
use rustix::fs::{AtFlags, Gid, Mode, OFlags, Uid};

use crate::error::{content_error, is_no_space};
use crate::path::VolPath;
use crate::VolumeError;

/// Mode of a new file when the request names none.
pub const DEFAULT_FILE_MODE: u32 = 0o644;
/// Mode of a new directory when the request names none.
pub const DEFAULT_DIR_MODE: u32 = 0o755;
/// uids and gids are the sandbox's view (sandboxes see the volume through id-mapped mounts of
/// 65536 ids), so larger ones mean nothing inside and are refused.
pub const MAX_ID: u32 = 65535;

/// Prefix of the name an upload that replaces a file has for a moment, before it is renamed
/// over the file ([`Content::remove_leftover_uploads`] removes any a crash left).
pub(crate) const TEMP_PREFIX: &str = ".warren-upload-";

/// What kind of entry a path is. `Unknown` covers devices, FIFOs and sockets (which the content
/// API cannot create but a sandbox can).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Directory,
    Symlink,
    Unknown,
}

/// One entry's metadata, as lstat sees it (a symlink is described as itself).
#[derive(Debug, Clone)]
pub struct EntryStat {
    /// The last component (`/` for the root). Names that are not UTF-8 are shown lossily.
    pub name: String,
    pub kind: EntryKind,
    /// Absolute within the volume: `/a/b`.
    pub path: String,
    pub size: u64,
    /// Permission bits only (`& 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    /// A symlink's target, as stored.
    pub target: Option<String>,
}

/// Owner and mode for a new entry or a metadata change.
///
/// When creating, `None` means: uid/gid of the parent directory, mode 0644 for files and 0755
/// for directories. In [`Content::set_metadata`], `None` leaves the field as it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Owner {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mode: Option<u32>,
}

impl Owner {
    fn validate(&self) -> Result<(), VolumeError> {
        for (what, id) in [("uid", self.uid), ("gid", self.gid)] {
            if id.is_some_and(|id| id > MAX_ID) {
                return Err(VolumeError::InvalidArgument(format!(
                    "{what} {} is above {MAX_ID}",
                    id.unwrap_or_default()
                )));
            }
        }
        if let Some(mode) = self.mode {
            if mode > 0o7777 {
                return Err(VolumeError::InvalidArgument(format!(
                    "mode {mode:#o} is above 0o7777"
                )));
            }
        }
        Ok(())
    }

    /// This owner with its gaps filled: the parent's uid/gid, `mode`.
    fn resolve(
        &self,
        parent: &Dir,
        mode: u32,
        shown: &str,
    ) -> Result<(u32, u32, u32), VolumeError> {
        let (uid, gid) = match (self.uid, self.gid) {
            (Some(uid), Some(gid)) => (uid, gid),
            _ => {
                let m = parent
                    .dir_metadata()
                    .map_err(|e| content_error(e, shown, "checking the parent of"))?;
                (self.uid.unwrap_or(m.uid()), self.gid.unwrap_or(m.gid()))
            }
        };
        Ok((uid, gid, self.mode.unwrap_or(mode)))
    }
}

/// Content operations on one mounted volume. Holds an fd on the volume's root, so it keeps the
/// filesystem busy (a delete then detaches it lazily) and should not be kept long.
#[derive(Debug)]
pub struct Content {
    pub(crate) root: Dir,
    mount_point: PathBuf,
}

impl Content {
    /// Opens the volume's root. Checks through the fd that it is the mounted filesystem, not the
    /// empty directory under it (an unmount racing with us).
    pub(crate) fn open(mount_point: &Path) -> Result<Content, VolumeError> {
        let shown = mount_point.display().to_string();
        let root = Dir::open_ambient_dir(mount_point, cap_std::ambient_authority())
            .map_err(|e| VolumeError::io(format!("opening {shown}"), e))?;
        let dev = root
            .dir_metadata()
            .map_err(|e| VolumeError::io(format!("checking {shown}"), e))?
            .dev();
        let parent = mount_point.parent().unwrap_or(Path::new("/"));
        let parent_dev = std::os::unix::fs::MetadataExt::dev(
            &std::fs::metadata(parent)
                .map_err(|e| VolumeError::io(format!("checking {}", parent.display()), e))?,
        );
        if dev == parent_dev {
            return Err(VolumeError::Command {
                what: "opening the volume".into(),
                detail: format!("{shown} is not mounted"),
            });
        }
        Ok(Content {
            root,
            mount_point: mount_point.to_path_buf(),
        })
    }

    /// The host path where the volume is mounted.
    pub fn mount_point(&self) -> &Path {
        &self.mount_point
    }

    /// lstat of `path`: a final symlink is described, not followed.
    pub fn stat(&self, path: &str) -> Result<EntryStat, VolumeError> {
        let p = VolPath::parse(path)?;
        match p.name() {
            None => self.root_stat(),
            Some(name) => {
                let parent = self.parent(&p)?;
                entry_stat(&parent, name.as_ref(), &p)
                    .map_err(|e| content_error(e, &p.display(), "stat"))
            }
        }
    }

    /// The entries below directory `path` (following it if it is a symlink that stays inside),
    /// `depth` levels deep (1: its children only), sorted by path. Descends into directories,
    /// never into symlinks. Entries that vanish while listing are left out.
    pub fn list(&self, path: &str, depth: u32) -> Result<Vec<EntryStat>, VolumeError> {
        if depth == 0 {
            return Err(VolumeError::InvalidArgument(
                "depth must be at least 1".into(),
            ));
        }
        let p = VolPath::parse(path)?;
        let dir = open_dir_at(&self.root, &p.rel(), FollowSymlinks::Yes)
            .map_err(|e| content_error(e, &p.display(), "opening"))?;
        let mut out = Vec::new();
        walk(&dir, &p, depth, &mut out)?;
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// Makes directory `path`. If it exists: [`VolumeError::Exists`], unless `parents` and it is
    /// a directory (then its stat). A missing parent: [`VolumeError::NotFound`] unless
    /// `parents`, which makes the missing ones with the same owner and mode.
    pub fn make_dir(
        &self,
        path: &str,
        owner: &Owner,
        parents: bool,
    ) -> Result<EntryStat, VolumeError> {
        owner.validate()?;
        let p = VolPath::parse(path)?;
        let shown = p.display();
        if p.is_root() {
            return if parents {
                self.root_stat()
            } else {
                Err(VolumeError::Exists(shown))
            };
        }
        if !parents {
            let parent = self.parent(&p)?;
            let name = p.name().unwrap_or_default();
            make_one_dir(&parent, name, owner, &shown)?;
            return entry_stat(&parent, name.as_ref(), &p)
                .map_err(|e| content_error(e, &shown, "stat"));
        }
        let mut cur = self.dir_fd()?;
        let mut walked = VolPath::parse("/")?;
        let comps = p.components();
        for (i, comp) in comps.iter().enumerate() {
            let here = walked.join(comp);
            let last = i + 1 == comps.len();
            match make_one_dir(&cur, comp, owner, &here.display()) {
                Ok(()) => {}
                Err(VolumeError::Exists(_)) => {
                    // Like `mkdir -p`: an existing directory (or a symlink to one inside the
                    // volume) is fine on the way and at the end; anything else is not.
                    let is_dir = cur
                        .metadata(comp)
                        .map_err(|e| content_error(e, &here.display(), "checking"))?
                        .is_dir();
                    if !is_dir {
                        return Err(if last {
                            VolumeError::Exists(here.display())
                        } else {
                            VolumeError::NotADirectory(here.display())
                        });
                    }
                }
                Err(e) => return Err(e),
            }
            if last {
                return entry_stat(&cur, comp.as_ref(), &here)
                    .map_err(|e| content_error(e, &here.display(), "stat"));
            }
            cur = open_dir_at(&cur, Path::new(comp), FollowSymlinks::Yes)
                .map_err(|e| content_error(e, &here.display(), "opening"))?;
            walked = here;
        }
        unreachable!("a non-root path has a last component")
    }

    /// Writes `data` to file `path` atomically and durably.
    ///
    /// The data goes to a temporary file in the same directory, which is fsynced, given its
    /// owner and mode, renamed over `path` and the directory fsynced: readers see the old
    /// content or the new, never a mix, and on `Ok` the new content survives a host crash.
    /// Existing `path` and `!overwrite`: [`VolumeError::Exists`] (checked again atomically by
    /// the rename); an existing directory: [`VolumeError::IsADirectory`]; a missing parent:
    /// [`VolumeError::NotFound`]. A full volume: [`VolumeError::NoSpace`] with the temporary
    /// file removed. An existing symlink at `path` is replaced, not written through.
    pub fn write_file(
        &self,
        path: &str,
        owner: &Owner,
        overwrite: bool,
        data: &mut dyn Read,
    ) -> Result<EntryStat, VolumeError> {
        owner.validate()?;
        let p = VolPath::parse(path)?;
        let shown = p.display();
        let Some(name) = p.name() else {
            return Err(VolumeError::IsADirectory(shown));
        };
        let parent = self.parent(&p)?;
        match parent.symlink_metadata(name) {
            Ok(m) if m.is_dir() => return Err(VolumeError::IsADirectory(shown)),
            Ok(_) if !overwrite => return Err(VolumeError::Exists(shown)),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(content_error(e, &shown, "checking")),
        }
        let (uid, gid, mode) = owner.resolve(&parent, DEFAULT_FILE_MODE, &shown)?;

        // The data goes to a file with no name (O_TMPFILE) until it is complete and durable,
        // so a crash at any point leaves nothing behind in the volume.
        let file = unnamed_file(&parent)
            .map_err(|e| content_error(e, &shown, "creating a temporary file for"))?;
        copy_into(data, &file, &shown)?;
        file.sync_all()
            .map_err(|e| content_error(e, &shown, "syncing"))?;
        rustix::fs::fchown(&file, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
            .and_then(|()| rustix::fs::fchmod(&file, Mode::from_raw_mode(mode)))
            .map_err(|e| content_error(e.into(), &shown, "setting the owner of"))?;

        match link_unnamed(&file, &parent, name) {
            Ok(()) => {}
            // Replacing a file: link under a temporary name, then rename over it (a crash
            // between the two leaves that name; `remove_leftover_uploads` removes it).
            Err(rustix::io::Errno::EXIST) if overwrite => {
                let tmp_name = temp_name();
                link_unnamed(&file, &parent, &tmp_name)
                    .map_err(|e| content_error(e.into(), &shown, "naming"))?;
                let tmp = TempFile {
                    dir: &parent,
                    name: Some(tmp_name),
                };
                let tmp_name = tmp.name.as_deref().unwrap_or_default();
                match rustix::fs::renameat(&parent, tmp_name, &parent, name) {
                    Ok(()) => tmp.keep(),
                    // A directory appeared at `path` since the check above.
                    Err(
                        rustix::io::Errno::ISDIR
                        | rustix::io::Errno::EXIST
                        | rustix::io::Errno::NOTEMPTY,
                    ) => return Err(VolumeError::IsADirectory(shown)),
                    Err(e) => return Err(content_error(e.into(), &shown, "renaming into")),
                }
            }
            Err(rustix::io::Errno::EXIST) => {
                return match parent.symlink_metadata(name) {
                    Ok(m) if m.is_dir() => Err(VolumeError::IsADirectory(shown)),
                    _ => Err(VolumeError::Exists(shown)),
                }
            }
            Err(e) => return Err(content_error(e.into(), &shown, "naming")),
        }
        drop(file);
        rustix::fs::fsync(&parent)
            .map_err(|e| content_error(e.into(), &shown, "syncing the directory of"))?;
        entry_stat(&parent, name.as_ref(), &p).map_err(|e| content_error(e, &shown, "stat"))
    }

    /// Opens regular file `path` for reading and returns it with its size. A final symlink is
    /// followed only while it stays inside the volume; directories, devices, FIFOs and sockets
    /// are [`VolumeError::NotAFile`]. The open itself is non-blocking (a FIFO swapped in at the
    /// last moment cannot hang it) and the result is checked on the fd.
    pub fn open_file(&self, path: &str) -> Result<(std::fs::File, u64), VolumeError> {
        let p = VolPath::parse(path)?;
        let shown = p.display();
        let Some(name) = p.name() else {
            return Err(VolumeError::NotAFile(shown));
        };
        let parent = self.parent(&p)?;
        let m = parent
            .metadata(name)
            .map_err(|e| content_error(e, &shown, "checking"))?;
        if !m.is_file() {
            return Err(VolumeError::NotAFile(shown));
        }
        let mut opts = OpenOptions::new();
        opts.read(true)
            .custom_flags((OFlags::NONBLOCK | OFlags::NOCTTY).bits() as i32);
        let file = parent
            .open_with(name, &opts)
            .map_err(|e| content_error(e, &shown, "opening"))?;
        let m = file
            .metadata()
            .map_err(|e| content_error(e, &shown, "checking"))?;
        if !m.is_file() {
            return Err(VolumeError::NotAFile(shown));
        }
        // Reads of the returned file block as usual.
        rustix::fs::fcntl_getfl(&file)
            .and_then(|f| rustix::fs::fcntl_setfl(&file, f - OFlags::NONBLOCK))
            .map_err(|e| content_error(e.into(), &shown, "opening"))?;
        Ok((file.into_std(), m.len()))
    }

    /// Changes the owner and/or mode of `path` itself (a final symlink is not followed; a
    /// symlink's owner can change, it has no mode of its own). `None` fields stay as they are.
    /// The mode of a device or socket cannot be changed here ([`VolumeError::NotAFile`]).
    pub fn set_metadata(&self, path: &str, owner: &Owner) -> Result<EntryStat, VolumeError> {
        owner.validate()?;
        let p = VolPath::parse(path)?;
        let shown = p.display();
        let uid = owner.uid.map(Uid::from_raw);
        let gid = owner.gid.map(Gid::from_raw);
        let set_on = |fd: &dyn std::os::fd::AsFd| -> Result<(), VolumeError> {
            if uid.is_some() || gid.is_some() {
                rustix::fs::fchown(fd.as_fd(), uid, gid)
                    .map_err(|e| content_error(e.into(), &shown, "changing the owner of"))?;
            }
            // After the chown, which clears set-id bits.
            if let Some(mode) = owner.mode {
                rustix::fs::fchmod(fd.as_fd(), Mode::from_raw_mode(mode))
                    .map_err(|e| content_error(e.into(), &shown, "changing the mode of"))?;
            }
            Ok(())
        };
        let Some(name) = p.name() else {
            let root = self.dir_fd()?;
            set_on(&root)?;
            return self.root_stat();
        };
        let parent = self.parent(&p)?;
        let kind = entry_kind(
            &parent
                .symlink_metadata(name)
                .map_err(|e| content_error(e, &shown, "checking"))?,
        );
        match kind {
            EntryKind::Directory => {
                let dir = open_dir_at(&parent, Path::new(name), FollowSymlinks::No)
                    .map_err(|e| content_error(e, &shown, "opening"))?;
                set_on(&dir)?;
            }
            EntryKind::File => {
                let file =
                    open_node(&parent, name).map_err(|e| content_error(e, &shown, "opening"))?;
                set_on(&file)?;
            }
            EntryKind::Symlink => {
                if owner.mode.is_some() {
                    return Err(VolumeError::InvalidArgument(format!(
                        "{shown} is a symlink, which has no mode of its own"
                    )));
                }
                chown_nofollow(&parent, name, uid, gid, &shown)?;
            }
            // A FIFO opens (non-blocking). A device on this nodev mount or a socket does not;
            // its owner can still change by name without following, its mode cannot.
            EntryKind::Unknown => match open_node(&parent, name) {
                Ok(file) => set_on(&file)?,
                Err(_) if owner.mode.is_none() => chown_nofollow(&parent, name, uid, gid, &shown)?,
                Err(_) => return Err(VolumeError::NotAFile(shown)),
            },
        }
        entry_stat(&parent, name.as_ref(), &p).map_err(|e| content_error(e, &shown, "stat"))
    }

    /// Removes `path`: a directory with everything in it, anything else by unlinking it (a
    /// symlink itself, never what it points to). Nothing is followed below `path` either.
    /// Removing the root is refused ([`VolumeError::InvalidPath`]).
    pub fn remove(&self, path: &str) -> Result<(), VolumeError> {
        let p = VolPath::parse(path)?;
        let shown = p.display();
        let Some(name) = p.name() else {
            return Err(VolumeError::InvalidPath(
                "the volume's root cannot be removed".into(),
            ));
        };
        let parent = self.parent(&p)?;
        let m = parent
            .symlink_metadata(name)
            .map_err(|e| content_error(e, &shown, "checking"))?;
        if m.is_dir() {
            parent.remove_dir_all(name)
        } else {
            parent.remove_file_or_symlink(name)
        }
        .map_err(|e| content_error(e, &shown, "removing"))
    }

    /// A readable fd on the root (the cap-std root is an O_PATH fd, which cannot be fsynced,
    /// chowned or chmodded).
    fn dir_fd(&self) -> Result<Dir, VolumeError> {
        open_dir_at(&self.root, Path::new("."), FollowSymlinks::No)
            .map_err(|e| content_error(e, "/", "opening"))
    }

    /// The parent directory of non-root `p`, resolved beneath the root.
    fn parent(&self, p: &VolPath) -> Result<Dir, VolumeError> {
        open_dir_at(&self.root, &p.parent_rel(), FollowSymlinks::Yes)
            .map_err(|e| content_error(e, &p.display(), "opening the parent of"))
    }

    fn root_stat(&self) -> Result<EntryStat, VolumeError> {
        let m = self
            .root
            .dir_metadata()
            .map_err(|e| content_error(e, "/", "stat"))?;
        Ok(make_stat("/".into(), "/".into(), &m, None))
    }
}

/// Opens directory `rel` beneath `dir` as a readable fd (not O_PATH). `follow` applies to the
/// last component only; the ones before are followed while they stay beneath `dir`.
fn open_dir_at(dir: &Dir, rel: &Path, follow: FollowSymlinks) -> io::Result<Dir> {
    let mut opts = OpenOptions::new();
    opts.read(true)
        .maybe_dir(true)
        .follow(follow)
        .custom_flags((OFlags::DIRECTORY | OFlags::NOCTTY | OFlags::NONBLOCK).bits() as i32);
    let file = dir.open_with(rel, &opts)?;
    Ok(Dir::from_std_file(file.into_std()))
}

/// Opens entry `name` of `dir` itself for fchown/fchmod: no following, non-blocking (a FIFO),
/// never becoming a controlling terminal.
fn open_node(dir: &Dir, name: &str) -> io::Result<cap_std::fs::File> {
    let mut opts = OpenOptions::new();
    opts.read(true)
        .maybe_dir(true)
        .follow(FollowSymlinks::No)
        .custom_flags((OFlags::NOCTTY | OFlags::NONBLOCK).bits() as i32);
    dir.open_with(name, &opts)
}

/// fchownat(dir, name, AT_SYMLINK_NOFOLLOW): `name` is one component and is not followed, so
/// this changes an entry of `dir` and nothing else.
fn chown_nofollow(
    dir: &Dir,
    name: &str,
    uid: Option<Uid>,
    gid: Option<Gid>,
    shown: &str,
) -> Result<(), VolumeError> {
    if uid.is_none() && gid.is_none() {
        return Ok(());
    }
    rustix::fs::chownat(dir, name, uid, gid, AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|e| content_error(e.into(), shown, "changing the owner of"))
}

/// mkdir `name` in `parent`, then chown and chmod it through an fd opened without following
/// (a sandbox swapping in a symlink meanwhile makes this fail, not chown elsewhere).
fn make_one_dir(parent: &Dir, name: &str, owner: &Owner, shown: &str) -> Result<(), VolumeError> {
    let (uid, gid, mode) = owner.resolve(parent, DEFAULT_DIR_MODE, shown)?;
    parent
        .create_dir(name)
        .map_err(|e| content_error(e, shown, "creating"))?;
    let set = open_dir_at(parent, Path::new(name), FollowSymlinks::No)
        .and_then(|dir| {
            rustix::fs::fchown(&dir, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))?;
            rustix::fs::fchmod(&dir, Mode::from_raw_mode(mode))?;
            Ok(())
        })
        .map_err(|e| content_error(e, shown, "setting the owner of"));
    if set.is_err() {
        let _ = parent.remove_dir(name);
    }
    set
}

/// A new file in `dir` with no name (O_TMPFILE, mode 0600 until it is complete).
fn unnamed_file(dir: &Dir) -> io::Result<cap_std::fs::File> {
    let fd = rustix::fs::openat(
        dir,
        ".",
        OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    Ok(cap_std::fs::File::from_std(std::fs::File::from(fd)))
}

/// Gives the unnamed `file` the name `name` in `dir`; EEXIST if the name is taken.
fn link_unnamed(
    file: &cap_std::fs::File,
    dir: &Dir,
    name: impl rustix::path::Arg + Copy,
) -> rustix::io::Result<()> {
    match rustix::fs::linkat(file, "", dir, name, AtFlags::EMPTY_PATH) {
        // AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; the descriptor's /proc link does not.
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::PERM) => {
            use std::os::fd::AsRawFd;
            let proc_path = format!("/proc/self/fd/{}", file.as_raw_fd());
            rustix::fs::linkat(
                rustix::fs::CWD,
                proc_path.as_str(),
                dir,
                name,
                AtFlags::SYMLINK_FOLLOW,
            )
        }
        r => r,
    }
}

/// A name for a file being renamed over another ([`TEMP_PREFIX`], never one a user picks).
fn temp_name() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{TEMP_PREFIX}{}-{nanos}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A temporary file that is removed when dropped unless kept.
struct TempFile<'a> {
    dir: &'a Dir,
    name: Option<String>,
}

impl TempFile<'_> {
    fn keep(mut self) {
        self.name = None;
    }
}

impl Drop for TempFile<'_> {
    fn drop(&mut self) {
        if let Some(name) = self.name.take() {
            if let Err(e) = self.dir.remove_file(&name) {
                tracing::warn!(name, "removing an upload's temporary file: {e}");
            }
        }
    }
}

/// Copies `data` into `file`, telling the client's read errors apart from the volume's write
/// errors (a full volume is [`VolumeError::NoSpace`]).
fn copy_into(
    data: &mut dyn Read,
    mut file: &cap_std::fs::File,
    shown: &str,
) -> Result<(), VolumeError> {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match data.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(VolumeError::io(format!("reading the data for {shown}"), e)),
        };
        file.write_all(&buf[..n]).map_err(|e| {
            if is_no_space(&e) {
                VolumeError::NoSpace
            } else {
                content_error(e, shown, "writing")
            }
        })?;
    }
}

/// Adds the entries of `dir` (volume path `at`) to `out`, descending `levels - 1` more levels
/// into directories, never through symlinks.
fn walk(dir: &Dir, at: &VolPath, levels: u32, out: &mut Vec<EntryStat>) -> Result<(), VolumeError> {
    let shown = at.display();
    let entries = dir
        .entries()
        .map_err(|e| content_error(e, &shown, "listing"))?;
    for entry in entries {
        let entry = entry.map_err(|e| content_error(e, &shown, "listing"))?;
        let name_os = entry.file_name();
        let child = at.join(&name_os.to_string_lossy());
        let st = match entry_stat(dir, &name_os, &child) {
            Ok(st) => st,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(content_error(e, &child.display(), "stat")),
        };
        let descend = st.kind == EntryKind::Directory && levels > 1;
        out.push(st);
        if descend {
            match open_dir_at(dir, Path::new(&name_os), FollowSymlinks::No) {
                Ok(sub) => walk(&sub, &child, levels - 1, out)?,
                // Removed or replaced by something else since the stat.
                Err(e)
                    if matches!(
                        rustix::io::Errno::from_io_error(&e),
                        Some(
                            rustix::io::Errno::NOENT
                                | rustix::io::Errno::NOTDIR
                                | rustix::io::Errno::LOOP
                        )
                    ) => {}
                Err(e) => return Err(content_error(e, &child.display(), "opening")),
            }
        }
    }
    Ok(())
}

/// lstat of entry `name` of `dir`, shown as volume path `path`.
fn entry_stat(dir: &Dir, name: &OsStr, path: &VolPath) -> io::Result<EntryStat> {
    let m = dir.symlink_metadata(name)?;
    let target = if m.file_type().is_symlink() {
        Some(dir.read_link_contents(name)?.to_string_lossy().into_owned())
    } else {
        None
    };
    Ok(make_stat(
        name.to_string_lossy().into_owned(),
        path.display(),
        &m,
        target,
    ))
}

fn entry_kind(m: &Metadata) -> EntryKind {
    let ft = m.file_type();
    if ft.is_symlink() {
        EntryKind::Symlink
    } else if ft.is_dir() {
        EntryKind::Directory
    } else if ft.is_file() {
        EntryKind::File
    } else {
        EntryKind::Unknown
    }
}

fn make_stat(name: String, path: String, m: &Metadata, target: Option<String>) -> EntryStat {
    EntryStat {
        name,
        kind: entry_kind(m),
        path,
        size: m.len(),
        mode: m.mode() & 0o7777,
        uid: m.uid(),
        gid: m.gid(),
        atime: time(m.atime(), m.atime_nsec()),
        mtime: time(m.mtime(), m.mtime_nsec()),
        ctime: time(m.ctime(), m.ctime_nsec()),
        target,
    }
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    let nanos = Duration::from_nanos(nsecs.clamp(0, 999_999_999) as u64);
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs as u64) + nanos
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + nanos
    }
}

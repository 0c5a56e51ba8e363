//! [`VolumeHost`]: volumes' images, mounts, growth and snapshots under one root directory.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rustix::fs::{FlockOperation, RenameFlags, CWD};

use crate::path::validate_id;
use crate::{tools, Content, VolumeError};

/// The smallest volume: mkfs needs room for its metadata and journal, and a smaller volume is
/// no use to anyone.
pub const MIN_BYTES: u64 = 8 << 20;
/// The fewest inodes a volume may have (the root, lost+found and ext4's reserved inodes take
/// a dozen).
pub const MIN_INODES: u64 = 64;
/// ext4's limit on the inode count.
pub const MAX_INODES: u64 = u32::MAX as u64;

const IMAGE: &str = "disk.ext4";
const DATA: &str = "data";
const SNAPSHOTS: &str = ".snapshots";
const STAGING: &str = ".staging";
/// Staging directories older than this are left over from a crash and removed by `open`.
const STALE_STAGING: Duration = Duration::from_secs(3600);

/// A volume's size limits. Both are enforced by the kernel because they are the size of the
/// volume's filesystem: writes past them fail with ENOSPC, from the content API and from inside
/// sandboxes alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Quota {
    /// The image's size. The usable space ([`Usage::bytes_total`]) is somewhat smaller: ext4's
    /// metadata and journal live inside.
    pub bytes: u64,
    /// The minimum number of inodes (files, directories, symlinks); mkfs rounds up to fill its
    /// inode tables, so [`Usage::inodes_total`] can be a little larger.
    pub inodes: u64,
}

/// A mounted volume's use of its quota (statvfs of the mount).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    pub bytes_used: u64,
    pub bytes_total: u64,
    pub inodes_used: u64,
    pub inodes_total: u64,
}

/// The volumes of one host, under one root directory (see the crate docs for the layout).
///
/// All methods block (mkfs, mount, copies of whole images): call them from
/// `spawn_blocking`. Operations that change a volume's image or mount take an exclusive
/// `flock` on its directory, so they are serialised per volume across threads and processes.
///
/// Volumes own their size on the host's disk: an image is allocated in full when it is made
/// or grown (and again when it is mounted), so the host's disk filling up can never fail a
/// write inside a volume that has room, and a volume or snapshot that would eat into
/// [`reserve`](Self::with_reserve) bytes of the disk is refused up front
/// ([`VolumeError::HostFull`]).
#[derive(Debug, Clone)]
pub struct VolumeHost {
    root: PathBuf,
    /// Bytes of the host's disk no volume or snapshot may take.
    reserve: u64,
}

impl VolumeHost {
    /// Opens (creating it 0700 if missing) the volumes' root, e.g. `<data-dir>/volumes`, and
    /// removes staging directories a crash left behind.
    pub fn open(root: &Path) -> Result<VolumeHost, VolumeError> {
        if !root.exists() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(root)
                .map_err(|e| VolumeError::io(format!("creating {}", root.display()), e))?;
            fs::set_permissions(root, fs::Permissions::from_mode(0o700))
                .map_err(|e| VolumeError::io(format!("securing {}", root.display()), e))?;
        }
        let host = VolumeHost {
            root: root.to_path_buf(),
            reserve: 0,
        };
        host.clean_staging();
        Ok(host)
    }

    /// Keeps `bytes` of the host's disk free: a volume create, grow or snapshot that would
    /// leave less is refused with [`VolumeError::HostFull`].
    pub fn with_reserve(mut self, bytes: u64) -> VolumeHost {
        self.reserve = bytes;
        self
    }

    /// The directory holding the volumes.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where volume `id` is mounted: `<root>/<id>/data`.
    pub fn mount_point(&self, id: &str) -> PathBuf {
        self.root.join(id).join(DATA)
    }

    /// Volume `id`'s image: `<root>/<id>/disk.ext4`.
    pub fn image_path(&self, id: &str) -> PathBuf {
        self.root.join(id).join(IMAGE)
    }

    /// Snapshot `snap_id`'s image: `<root>/.snapshots/<snap_id>.ext4`.
    pub fn snapshot_path(&self, snap_id: &str) -> PathBuf {
        self.root.join(SNAPSHOTS).join(format!("{snap_id}.ext4"))
    }

    /// The ids of every volume on this host (for a sweep of volumes no record names).
    pub fn volume_ids(&self) -> Result<Vec<String>, VolumeError> {
        let entries = fs::read_dir(&self.root)
            .map_err(|e| VolumeError::io(format!("listing {}", self.root.display()), e))?;
        let mut out = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with('.') && validate_id("volume", &name).is_ok() {
                out.push(name);
            }
        }
        out.sort();
        Ok(out)
    }

    /// The ids of every snapshot on this host.
    pub fn snapshot_ids(&self) -> Result<Vec<String>, VolumeError> {
        let dir = self.root.join(SNAPSHOTS);
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(VolumeError::io(format!("listing {}", dir.display()), e)),
        };
        let mut out: Vec<String> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let id = name.strip_suffix(".ext4")?;
                (!id.starts_with('.') && validate_id("snapshot", id).is_ok())
                    .then(|| id.to_string())
            })
            .collect();
        out.sort();
        Ok(out)
    }

    /// Whether volume `id` exists (an invalid id never does).
    pub fn exists(&self, id: &str) -> bool {
        validate_id("volume", id).is_ok() && self.image_path(id).is_file()
    }

    /// Creates volume `id`: an image of `quota.bytes` (allocated in full) with at least `quota.inodes`
    /// inodes, its root owned by 1000:1000 mode 0755, no reserved blocks; then mounts it
    /// (loop, nosuid, nodev) at [`mount_point`](Self::mount_point).
    ///
    /// The image is made in `<root>/.staging/` and renamed into place only when complete (the
    /// rename refuses to replace an existing volume), so `<root>/<id>` never exists half made
    /// and a failure leaves nothing behind.
    pub fn create(&self, id: &str, quota: Quota) -> Result<(), VolumeError> {
        validate_id("volume", id)?;
        check_quota(quota)?;
        if self.root.join(id).exists() {
            return Err(VolumeError::Exists(id.to_string()));
        }
        self.make_room(&format!("a volume of {} bytes", quota.bytes), quota.bytes)?;
        let staging = self.staging_dir(id)?;
        let made = (|| {
            let image = staging.join(IMAGE);
            let file = File::create_new(&image)
                .map_err(|e| VolumeError::io("creating the volume image", e))?;
            file.set_len(quota.bytes)
                .map_err(|e| VolumeError::io("sizing the volume image", e))?;
            drop(file);
            tools::mkfs(&image, quota.inodes)?;
            // After mkfs, which discards (punches) the whole image first.
            tools::allocate(&image, quota.bytes)
        })();
        self.finish_staging(id, &staging, made)
    }

    /// Creates volume `new_id` from snapshot `snap_id` (a reflink or sparse copy of the
    /// snapshot's image) and mounts it.
    ///
    /// The copy keeps the original filesystem's UUID; ext4 does not mind two mounted
    /// filesystems sharing one.
    pub fn create_from_snapshot(&self, snap_id: &str, new_id: &str) -> Result<(), VolumeError> {
        validate_id("snapshot", snap_id)?;
        validate_id("volume", new_id)?;
        let snap = self.snapshot_path(snap_id);
        if !snap.is_file() {
            return Err(VolumeError::NotFound(format!("snapshot {snap_id}")));
        }
        if self.root.join(new_id).exists() {
            return Err(VolumeError::Exists(new_id.to_string()));
        }
        let bytes = fs::metadata(&snap)
            .map_err(|e| VolumeError::io(format!("checking snapshot {snap_id}"), e))?
            .len();
        self.make_room(&format!("a volume of {bytes} bytes"), bytes)?;
        let staging = self.staging_dir(new_id)?;
        let image = staging.join(IMAGE);
        let made = tools::copy_image(&snap, &image)
            .and_then(|()| tools::allocate(&image, bytes))
            .and_then(|()| sync_file(&image));
        self.finish_staging(new_id, &staging, made)
    }

    /// Mounts volume `id` if it is not mounted (after a host reboot) and returns its mount
    /// point. When it is mounted this costs two stats.
    pub fn ensure_mounted(&self, id: &str) -> Result<PathBuf, VolumeError> {
        validate_id("volume", id)?;
        let mount_point = self.mount_point(id);
        if !self.exists(id) {
            return Err(VolumeError::NotFound(id.to_string()));
        }
        if tools::is_mounted(&mount_point)? {
            return Ok(mount_point);
        }
        let _lock = self.lock(id)?;
        if !tools::is_mounted(&mount_point)? {
            let image = self.image_path(id);
            // Whatever a discard gave back while it was away (or a volume made before volumes
            // were allocated in full) is allocated again; a full disk must not keep a volume
            // from mounting, so that only warns.
            if let Ok(meta) = fs::metadata(&image) {
                if let Err(e) = tools::allocate(&image, meta.len()) {
                    tracing::warn!(volume = id, "volume image not fully allocated: {e}");
                }
            }
            tools::mount(&image, &mount_point)?;
        }
        Ok(mount_point)
    }

    /// Unmounts volume `id` (lazily if it is busy) and removes its image and directory.
    /// Deleting a volume that does not exist succeeds.
    ///
    /// Nothing is removed unless the unmount took: removing the directory tree with the
    /// volume still mounted would delete the volume's content file by file instead.
    pub fn delete(&self, id: &str) -> Result<(), VolumeError> {
        validate_id("volume", id)?;
        let dir = self.root.join(id);
        let lock = match self.lock(id) {
            Ok(lock) => lock,
            Err(VolumeError::NotFound(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        let mount_point = dir.join(DATA);
        if mount_point.exists() {
            tools::unmount_all(&mount_point)?;
        }
        fs::remove_dir_all(&dir)
            .or_else(ignore_not_found)
            .map_err(|e| VolumeError::io(format!("removing volume {id}"), e))?;
        drop(lock);
        sync_dir(&self.root)
    }

    /// Unmounts volume `id` without deleting it (a host shutting down). It is mounted again by
    /// [`ensure_mounted`](Self::ensure_mounted) or anything that needs it.
    pub fn unmount(&self, id: &str) -> Result<(), VolumeError> {
        validate_id("volume", id)?;
        let _lock = self.lock(id)?;
        tools::unmount_all(&self.mount_point(id))
    }

    /// The mounted volume's use of its quota (mounting it if needed).
    pub fn usage(&self, id: &str) -> Result<Usage, VolumeError> {
        let mount_point = self.ensure_mounted(id)?;
        let st = rustix::fs::statvfs(&mount_point)
            .map_err(|e| VolumeError::io(format!("statvfs of volume {id}"), e.into()))?;
        Ok(Usage {
            bytes_used: st.f_blocks.saturating_sub(st.f_bfree) * st.f_frsize,
            bytes_total: st.f_blocks * st.f_frsize,
            inodes_used: st.f_files.saturating_sub(st.f_ffree),
            inodes_total: st.f_files,
        })
    }

    /// Grows volume `id`'s image to `bytes` and its filesystem with it. Shrinking is refused.
    /// Growing to the current size re-runs the filesystem resize, so a grow interrupted after
    /// the image was enlarged can simply be repeated.
    ///
    /// With CAP_SYS_RESOURCE (which the kernel's online resize requires) the mounted filesystem
    /// grows in place and sandboxes keep running. Without it, the volume is unmounted, checked,
    /// grown and mounted again, which works only while nothing uses it (no sandbox has it
    /// mounted, no [`Content`] is open); otherwise the error says so and the volume stays
    /// mounted at its old size.
    pub fn grow(&self, id: &str, bytes: u64) -> Result<(), VolumeError> {
        let mount_point = self.ensure_mounted(id)?;
        let _lock = self.lock(id)?;
        let image = self.image_path(id);
        let meta = fs::metadata(&image)
            .map_err(|e| VolumeError::io(format!("checking volume {id}'s image"), e))?;
        let current = meta.len();
        if bytes < current {
            return Err(VolumeError::InvalidArgument(format!(
                "volume {id} is {current} bytes; shrinking to {bytes} is not supported"
            )));
        }
        let allocated = meta.blocks() * 512;
        self.make_room(
            &format!("volume {id} grown to {bytes} bytes"),
            bytes.saturating_sub(allocated),
        )?;
        let device = tools::loop_device(&mount_point, &image)?;
        let file = fs::OpenOptions::new()
            .write(true)
            .open(&image)
            .map_err(|e| VolumeError::io(format!("opening volume {id}'s image"), e))?;
        file.set_len(bytes)
            .map_err(|e| VolumeError::io(format!("enlarging volume {id}'s image"), e))?;
        tools::allocate(&image, bytes)?;
        file.sync_all()
            .map_err(|e| VolumeError::io(format!("enlarging volume {id}'s image"), e))?;
        if tools::can_resize_online() {
            tools::grow_online(&device)
        } else {
            Self::grow_offline(id, &image, &mount_point)
        }
    }

    fn grow_offline(id: &str, image: &Path, mount_point: &Path) -> Result<(), VolumeError> {
        let in_use = || {
            VolumeError::Busy(format!(
                "volume {id} is in use (a sandbox mounts it, or its content is open): growing \
                 it while in use needs CAP_SYS_RESOURCE, which this server lacks; retry when \
                 no sandbox mounts it"
            ))
        };
        tools::unmount_once(mount_point).map_err(|_| in_use())?;
        // The loop device detaches (autoclear) once the filesystem's last mount is gone.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let free = loop {
            match tools::image_in_use(image) {
                Ok(false) => break Ok(()),
                Ok(true) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Ok(true) => break Err(in_use()),
                Err(e) => break Err(e),
            }
        };
        let grown = free.and_then(|()| tools::grow_offline(image));
        let mounted = tools::mount(image, mount_point);
        grown.and(mounted)
    }

    /// Takes a consistent point-in-time copy of volume `id` as snapshot `snap_id` and returns
    /// the bytes it occupies on the host's disk.
    ///
    /// The mounted filesystem is frozen (flushed, writers blocked) for the copy and always
    /// thawed afterwards, error or not. On a host filesystem with reflinks (XFS, btrfs) the
    /// copy is instant and shares blocks; elsewhere it is a sparse copy and writers in the
    /// volume's sandboxes wait for it. The snapshot is written to a temporary name, fsynced and
    /// renamed, so a snapshot that exists is whole.
    pub fn snapshot(&self, id: &str, snap_id: &str) -> Result<u64, VolumeError> {
        validate_id("snapshot", snap_id)?;
        let mount_point = self.ensure_mounted(id)?;
        let _lock = self.lock(id)?;
        let dir = self.root.join(SNAPSHOTS);
        make_private_dir(&dir)?;
        let dest = self.snapshot_path(snap_id);
        if dest.exists() {
            return Err(VolumeError::Exists(format!("snapshot {snap_id}")));
        }
        // The copy is sparse (or shares blocks): it takes what the filesystem uses, at most.
        let used = rustix::fs::statvfs(&mount_point)
            .map(|st| st.f_blocks.saturating_sub(st.f_bfree) * st.f_frsize)
            .map_err(|e| VolumeError::io(format!("statvfs of volume {id}"), e.into()))?;
        self.make_room(&format!("a snapshot of volume {id} ({used} bytes)"), used)?;
        let tmp = dir.join(format!(".{snap_id}.{}.tmp", unique()));
        let copied = {
            let _frozen = tools::freeze(&mount_point)?;
            tools::copy_image(&self.image_path(id), &tmp)
        };
        let placed = copied.and_then(|()| sync_file(&tmp)).and_then(|()| {
            rustix::fs::renameat_with(CWD, &tmp, CWD, &dest, RenameFlags::NOREPLACE).map_err(|e| {
                if e == rustix::io::Errno::EXIST {
                    VolumeError::Exists(format!("snapshot {snap_id}"))
                } else {
                    VolumeError::io(format!("placing snapshot {snap_id}"), e.into())
                }
            })
        });
        if let Err(e) = placed {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        sync_dir(&dir)?;
        let on_disk = fs::metadata(&dest)
            .map_err(|e| VolumeError::io(format!("checking snapshot {snap_id}"), e))?
            .blocks()
            * 512;
        Ok(on_disk)
    }

    /// Removes snapshot `snap_id`. Removing one that does not exist succeeds.
    pub fn delete_snapshot(&self, snap_id: &str) -> Result<(), VolumeError> {
        validate_id("snapshot", snap_id)?;
        fs::remove_file(self.snapshot_path(snap_id))
            .or_else(ignore_not_found)
            .map_err(|e| VolumeError::io(format!("removing snapshot {snap_id}"), e))
    }

    /// Content operations on volume `id` (mounting it if needed), confined beneath its root.
    pub fn content(&self, id: &str) -> Result<Content, VolumeError> {
        let mount_point = self.ensure_mounted(id)?;
        Content::open(&mount_point)
    }

    /// A fresh, private staging directory for volume `id`'s image, with an empty `data/`.
    fn staging_dir(&self, id: &str) -> Result<PathBuf, VolumeError> {
        let staging_root = self.root.join(STAGING);
        make_private_dir(&staging_root)?;
        let dir = staging_root.join(format!("{id}.{}", unique()));
        let make = |p: &Path, mode| {
            fs::DirBuilder::new()
                .mode(mode)
                .create(p)
                .map_err(|e| VolumeError::io(format!("creating {}", p.display()), e))
        };
        make(&dir, 0o700)?;
        make(&dir.join(DATA), 0o755)?;
        Ok(dir)
    }

    /// Moves a made staging directory to `<root>/<id>` (never over an existing volume) and
    /// mounts it; on any failure removes what was made.
    fn finish_staging(
        &self,
        id: &str,
        staging: &Path,
        made: Result<(), VolumeError>,
    ) -> Result<(), VolumeError> {
        let dir = self.root.join(id);
        let placed = made.and_then(|()| {
            sync_dir(staging)?;
            rustix::fs::renameat_with(CWD, staging, CWD, &dir, RenameFlags::NOREPLACE).map_err(
                |e| {
                    if e == rustix::io::Errno::EXIST || e == rustix::io::Errno::NOTEMPTY {
                        VolumeError::Exists(id.to_string())
                    } else {
                        VolumeError::io(format!("placing volume {id}"), e.into())
                    }
                },
            )
        });
        if let Err(e) = placed {
            let _ = fs::remove_dir_all(staging);
            return Err(e);
        }
        sync_dir(&self.root)?;
        let mounted = {
            let _lock = self.lock(id)?;
            // An ensure_mounted racing with us may have got there first.
            if tools::is_mounted(&dir.join(DATA))? {
                Ok(())
            } else {
                tools::mount(&self.image_path(id), &dir.join(DATA))
            }
        };
        if let Err(e) = mounted {
            if let Err(cleanup) = self.delete(id) {
                tracing::warn!(
                    volume = id,
                    "removing a volume that failed to mount: {cleanup}"
                );
            }
            return Err(e);
        }
        Ok(())
    }

    /// Refuses (with the numbers) to write `needed` more bytes to the host's disk when that
    /// would leave less than the reserve free.
    fn make_room(&self, what: &str, needed: u64) -> Result<(), VolumeError> {
        let st = rustix::fs::statvfs(&self.root).map_err(|e| {
            VolumeError::io(format!("statvfs of {}", self.root.display()), e.into())
        })?;
        let free = st.f_bavail.saturating_mul(st.f_frsize);
        if free < needed.saturating_add(self.reserve) {
            return Err(VolumeError::HostFull {
                what: what.to_string(),
                needed,
                free,
                reserve: self.reserve,
            });
        }
        Ok(())
    }

    /// Takes the exclusive per-volume lock (an flock on `<root>/<id>`), held until dropped.
    /// NotFound when the volume does not exist (or was deleted while we waited).
    fn lock(&self, id: &str) -> Result<File, VolumeError> {
        let dir = self.root.join(id);
        let f = match File::open(&dir) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(VolumeError::NotFound(id.to_string()))
            }
            Err(e) => return Err(VolumeError::io(format!("opening volume {id}"), e)),
        };
        rustix::fs::flock(&f, FlockOperation::LockExclusive)
            .map_err(|e| VolumeError::io(format!("locking volume {id}"), e.into()))?;
        // A delete that held the lock before us removed the directory we opened.
        let still_there = f
            .metadata()
            .map(|m| m.nlink() > 0)
            .map_err(|e| VolumeError::io(format!("checking volume {id}"), e))?;
        if !still_there {
            return Err(VolumeError::NotFound(id.to_string()));
        }
        Ok(f)
    }

    fn clean_staging(&self) {
        let Ok(entries) = fs::read_dir(self.root.join(STAGING)) else {
            return;
        };
        let now = SystemTime::now();
        for entry in entries.flatten() {
            let old = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|age| age > STALE_STAGING);
            // Staged images are never mounted (mounting follows the rename), so removing the
            // tree removes only the image.
            if old {
                if let Err(e) = fs::remove_dir_all(entry.path()) {
                    tracing::warn!(path = %entry.path().display(), "removing stale staging: {e}");
                }
            }
        }
    }
}

fn check_quota(quota: Quota) -> Result<(), VolumeError> {
    if quota.bytes < MIN_BYTES {
        return Err(VolumeError::InvalidArgument(format!(
            "a volume needs at least {MIN_BYTES} bytes, not {}",
            quota.bytes
        )));
    }
    if !(MIN_INODES..=MAX_INODES).contains(&quota.inodes) {
        return Err(VolumeError::InvalidArgument(format!(
            "a volume's inode count must be between {MIN_INODES} and {MAX_INODES}, not {}",
            quota.inodes
        )));
    }
    // Every inode takes 256 bytes of table; mkfs.ext4 wants at least 1 KiB per inode.
    if quota.inodes > quota.bytes / 1024 {
        return Err(VolumeError::InvalidArgument(format!(
            "a volume of {} bytes holds at most {} inodes, not {}",
            quota.bytes,
            quota.bytes / 1024,
            quota.inodes
        )));
    }
    Ok(())
}

/// A name part unique within this host for a while: pid, time and a counter.
fn unique() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{}-{nanos}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn make_private_dir(dir: &Path) -> Result<(), VolumeError> {
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(VolumeError::io(format!("creating {}", dir.display()), e)),
    }
}

fn ignore_not_found(e: io::Error) -> io::Result<()> {
    if e.kind() == io::ErrorKind::NotFound {
        Ok(())
    } else {
        Err(e)
    }
}

fn sync_file(path: &Path) -> Result<(), VolumeError> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| VolumeError::io(format!("syncing {}", path.display()), e))
}

/// Makes a directory's entries (a rename, a removal) durable.
fn sync_dir(dir: &Path) -> Result<(), VolumeError> {
    sync_file(dir)
}

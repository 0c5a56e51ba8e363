//! The host tools a volume's life uses (mkfs.ext4, mount, umount, losetup, resize2fs,
//! fsfreeze, cp) and the checks around them (is it mounted, which loop device).
//!
//! Mounting goes through `mount -o loop` rather than a loop-device crate plus mount(2): util-linux
//! already allocates the device race-free through /dev/loop-control, sets it up in one
//! LOOP_CONFIGURE with autoclear (so unmounting, even lazily, releases the device), reuses a
//! device already backing the same file, and needs no bindgen/libclang at build time. The
//! cost is a process spawn per mount, which is noise next to the mount itself.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::VolumeError;

/// The uid:gid that owns a new filesystem's root: the sandboxes' default user.
pub(crate) const ROOT_OWNER: &str = "1000:1000";

/// Runs a tool to completion; a non-zero exit is a [`VolumeError::Command`] carrying stderr.
fn run(what: &str, program: &str, args: &[&OsStr]) -> Result<(), VolumeError> {
    let out = Command::new(program)
        .args(args)
        // Messages in one language for the logs, and no locale files looked up.
        .env("LC_ALL", "C")
        .output()
        .map_err(|e| VolumeError::io(format!("running {program} ({what})"), e))?;
    if out.status.success() {
        return Ok(());
    }
    let mut detail = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if detail.is_empty() {
        detail = String::from_utf8_lossy(&out.stdout).trim().to_string();
    }
    Err(VolumeError::Command {
        what: what.to_string(),
        detail: format!("{program} exited with {}: {detail}", out.status),
    })
}

/// Makes an ext4 filesystem filling `image` with at least `inodes` inodes.
///
/// `-m 0`: no blocks reserved for root, the quota is all the user's. `-I 256`: inodes large
/// enough for nanosecond timestamps and dates past 2038 (mke2fs's "small" profile, which it
/// picks for images under 512 MiB, would otherwise choose 128). `root_owner`: the root
/// directory belongs to the sandboxes' default user, mode 0755.
pub(crate) fn mkfs(image: &Path, inodes: u64) -> Result<(), VolumeError> {
    let inodes = inodes.to_string();
    let root_owner = format!("root_owner={ROOT_OWNER}");
    run(
        "making the volume's filesystem",
        "mkfs.ext4",
        &[
            "-q".as_ref(),
            "-F".as_ref(),
            "-m".as_ref(),
            "0".as_ref(),
            "-I".as_ref(),
            "256".as_ref(),
            "-N".as_ref(),
            inodes.as_ref(),
            "-E".as_ref(),
            root_owner.as_ref(),
            image.as_os_str(),
        ],
    )
}

/// Loop-mounts `image` at `target`. `nosuid,nodev`: nothing a sandbox stores in its volume can
/// become a set-uid program or a device node for anyone who later reaches the mount.
pub(crate) fn mount(image: &Path, target: &Path) -> Result<(), VolumeError> {
    run(
        "mounting the volume",
        "mount",
        &[
            "-t".as_ref(),
            "ext4".as_ref(),
            "-o".as_ref(),
            "loop,nosuid,nodev".as_ref(),
            image.as_os_str(),
            target.as_os_str(),
        ],
    )?;
    refuse_discards(target, image);
    Ok(())
}

/// Turns discards off on the volume's loop device. A discard (the host's weekly `fstrim`, a
/// `discard` mount) makes the loop driver punch holes in the image, giving back the space
/// the volume was allocated; a later write could then find the host's disk full and fail
/// inside the volume although the volume is not. With discards off, `fstrim` answers
/// "not supported" and the allocation stays. Kernels whose `discard_max_bytes` is read-only
/// keep discards: said once in the log, and the allocation is renewed at the next mount.
fn refuse_discards(target: &Path, image: &Path) {
    let done = loop_device(target, image).and_then(|dev| {
        let name = dev
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let knob = PathBuf::from(format!("/sys/block/{name}/queue/discard_max_bytes"));
        fs::write(&knob, "0").map_err(|e| VolumeError::io(format!("writing {}", knob.display()), e))
    });
    if let Err(e) = done {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            tracing::warn!(
                "cannot turn off discards on volumes' loop devices ({e}): the host's fstrim may \
                 return volumes' allocated space to the disk until they are mounted again"
            )
        });
    }
}

/// Allocates every byte of `image` on the host's disk (holes and all), so that nothing
/// written into the volume later can find the host's disk full. The data already there is
/// kept. A filesystem without `fallocate` leaves the image sparse: said once in the log.
pub(crate) fn allocate(image: &Path, bytes: u64) -> Result<(), VolumeError> {
    let file = fs::OpenOptions::new()
        .write(true)
        .open(image)
        .map_err(|e| VolumeError::io(format!("opening {}", image.display()), e))?;
    match rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, bytes) {
        Ok(()) => Ok(()),
        Err(e) if e == rustix::io::Errno::OPNOTSUPP => {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| {
                tracing::warn!(
                    "the volumes' filesystem cannot preallocate (fallocate: {e}): volumes stay \
                     sparse, and a full host disk shows as I/O errors inside them"
                )
            });
            Ok(())
        }
        Err(e) => Err(VolumeError::io(
            format!("allocating {bytes} bytes for {}", image.display()),
            e.into(),
        )),
    }
}

/// Unmounts `target` until nothing is mounted there: a plain unmount first, a lazy detach when
/// something still holds the filesystem (an open file, a sandbox's bind mount elsewhere); the
/// loop device goes away by autoclear once the last user lets go.
pub(crate) fn unmount_all(target: &Path) -> Result<(), VolumeError> {
    for _ in 0..8 {
        if !is_mounted(target)? {
            return Ok(());
        }
        if run("unmounting the volume", "umount", &[target.as_os_str()]).is_err() {
            run(
                "detaching the volume",
                "umount",
                &["-l".as_ref(), target.as_os_str()],
            )?;
        }
    }
    if is_mounted(target)? {
        return Err(VolumeError::Command {
            what: "unmounting the volume".into(),
            detail: format!("{} is still a mount point", target.display()),
        });
    }
    Ok(())
}

/// Whether something is mounted on `dir`: its device differs from its parent's. One stat each,
/// which is why this is used rather than reading /proc/self/mountinfo (long on a busy host).
pub(crate) fn is_mounted(dir: &Path) -> Result<bool, VolumeError> {
    let parent = dir.parent().unwrap_or(Path::new("/"));
    let d = fs::symlink_metadata(dir)
        .map_err(|e| VolumeError::io(format!("checking {}", dir.display()), e))?;
    let p = fs::symlink_metadata(parent)
        .map_err(|e| VolumeError::io(format!("checking {}", parent.display()), e))?;
    Ok(d.dev() != p.dev())
}

/// The loop device (`/dev/loopN`) whose filesystem is mounted at `mount_point`, checked through
/// sysfs to be backed by `image`, so a resize can never hit another device.
pub(crate) fn loop_device(mount_point: &Path, image: &Path) -> Result<PathBuf, VolumeError> {
    let dev = fs::metadata(mount_point)
        .map_err(|e| VolumeError::io(format!("checking {}", mount_point.display()), e))?
        .dev();
    let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let not_loop = || VolumeError::Command {
        what: "finding the volume's loop device".into(),
        detail: format!(
            "{} is not mounted from a loop device backed by {}",
            mount_point.display(),
            image.display()
        ),
    };
    let backing = fs::read_to_string(sys.join("loop/backing_file")).map_err(|_| not_loop())?;
    let want = fs::canonicalize(image)
        .map_err(|e| VolumeError::io(format!("resolving {}", image.display()), e))?;
    if Path::new(backing.trim_end()) != want {
        return Err(not_loop());
    }
    let target = fs::read_link(&sys).map_err(|_| not_loop())?;
    let name = target.file_name().ok_or_else(not_loop)?;
    Ok(Path::new("/dev").join(name))
}

/// Makes the loop device see its backing file's new size and grows the mounted filesystem
/// online to fill it.
pub(crate) fn grow_online(device: &Path) -> Result<(), VolumeError> {
    run(
        "updating the loop device's size",
        "losetup",
        &["-c".as_ref(), device.as_os_str()],
    )?;
    run("growing the filesystem", "resize2fs", &[device.as_os_str()])
}

/// Whether this process may grow a mounted ext4 filesystem: the kernel's online resize wants
/// CAP_SYS_RESOURCE, which some hosts (containers, some VMs) withhold even from root.
pub(crate) fn can_resize_online() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    let Ok(status) = fs::read_to_string("/proc/self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_RESOURCE) != 0)
}

/// Whether any loop device is backed by `image`: after our own unmount, that means the
/// filesystem is still mounted somewhere (a sandbox's bind mount keeps it alive) and must not
/// be touched offline.
pub(crate) fn image_in_use(image: &Path) -> Result<bool, VolumeError> {
    let want = fs::canonicalize(image)
        .map_err(|e| VolumeError::io(format!("resolving {}", image.display()), e))?;
    let entries =
        fs::read_dir("/sys/block").map_err(|e| VolumeError::io("listing /sys/block", e))?;
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with("loop") {
            continue;
        }
        if let Ok(backing) = fs::read_to_string(entry.path().join("loop/backing_file")) {
            if Path::new(backing.trim_end()) == want {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// One plain (not lazy) unmount: fails while anything holds the filesystem.
pub(crate) fn unmount_once(target: &Path) -> Result<(), VolumeError> {
    run("unmounting the volume", "umount", &[target.as_os_str()])
}

/// Checks and grows an unmounted image to its file's size: `e2fsck -f -p` (resize2fs insists on
/// a freshly checked filesystem), then `resize2fs`.
pub(crate) fn grow_offline(image: &Path) -> Result<(), VolumeError> {
    let out = Command::new("e2fsck")
        .args(["-f", "-p"])
        .arg(image)
        .env("LC_ALL", "C")
        .output()
        .map_err(|e| VolumeError::io("running e2fsck", e))?;
    // 0: clean, 1: errors corrected; anything else leaves the image alone.
    if !matches!(out.status.code(), Some(0 | 1)) {
        return Err(VolumeError::Command {
            what: "checking the filesystem before growing it".into(),
            detail: format!(
                "e2fsck exited with {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stdout).trim()
            ),
        });
    }
    run("growing the filesystem", "resize2fs", &[image.as_os_str()])
}

/// Copies an image file as a reflink where the host filesystem can (instant, shared blocks),
/// else its data only: the ranges `SEEK_DATA` finds, each copied in the kernel
/// (`copy_file_range`), holes left holes. A volume's image is allocated in full but mostly
/// unwritten, and unwritten ranges are holes to `SEEK_DATA`: `cp --sparse=always` read them
/// all instead (17 s for an empty 10 GiB volume here, with the volume frozen meanwhile).
/// Sandbox disks (the namespace runtime's writable layers) are copied the same way.
pub fn copy_data(from: &Path, to: &Path) -> io::Result<()> {
    use rustix::fs::SeekFrom;
    let failed = |what: &str| {
        let what = format!("{what} ({} to {})", from.display(), to.display());
        move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"))
    };
    let src = fs::File::open(from).map_err(failed("opening the image to copy"))?;
    let dst = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(to)
        .map_err(failed("creating the copy"))?;
    if rustix::fs::ioctl_ficlone(&dst, &src).is_ok() {
        return Ok(());
    }
    let len = src.metadata().map_err(failed("sizing the image"))?.len();
    dst.set_len(len).map_err(failed("sizing the copy"))?;
    let mut pos = 0;
    while pos < len {
        let data = match rustix::fs::seek(&src, SeekFrom::Data(pos)) {
            Ok(d) => d,
            // No data past `pos`: the rest is a hole.
            Err(rustix::io::Errno::NXIO) => break,
            Err(e) => return Err(failed("finding the image's data")(e.into())),
        };
        let hole = rustix::fs::seek(&src, SeekFrom::Hole(data))
            .map_err(|e| failed("finding the image's holes")(e.into()))?;
        let (mut off_in, mut off_out) = (data, data);
        while off_in < hole {
            let left = usize::try_from(hole - off_in).unwrap_or(usize::MAX);
            let n = rustix::fs::copy_file_range(
                &src,
                Some(&mut off_in),
                &dst,
                Some(&mut off_out),
                left,
            )
            .map_err(|e| failed("copying the image's data")(e.into()))?;
            if n == 0 {
                break;
            }
        }
        pos = hole;
    }
    Ok(())
}

/// The size of an image file whose ext4 filesystem, made by `mkfs.ext4` with `args`, shows
/// `usable` bytes as its size (what `df` says): ext4 keeps about 5 % for itself (the journal,
/// inode tables, bitmaps), which a disk advertised as N MiB should not take from its N. Found
/// by making the filesystem in a sparse scratch file in `scratch_dir` (milliseconds: nothing
/// but the superblock and group descriptors is written), reading its overhead and growing
/// the size by it until it fits.
pub fn ext4_image_bytes(scratch_dir: &Path, usable: u64, args: &[&str]) -> io::Result<u64> {
    const BLOCK: u64 = 4096;
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let scratch = scratch_dir.join(format!(".ext4-size-{}-{n}", std::process::id()));
    let found = (|| {
        let mut size = usable.div_ceil(BLOCK) * BLOCK;
        for _ in 0..4 {
            fs::File::create(&scratch)?.set_len(size)?;
            let out = Command::new("mkfs.ext4")
                .args(["-q", "-F"])
                .args(args)
                .args(["-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"])
                .arg(&scratch)
                .env("LC_ALL", "C")
                .output()?;
            if !out.status.success() {
                return Err(io::Error::other(format!(
                    "mkfs.ext4 exited with {}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
            let shown = ext4_usable_bytes(&scratch)?;
            if shown >= usable {
                return Ok(size);
            }
            size += (usable - shown).div_ceil(BLOCK) * BLOCK;
        }
        Ok(size)
    })();
    let _ = fs::remove_file(&scratch);
    found
}

/// What `df` shows as the size of the ext4 filesystem in `image`: its blocks less its own.
fn ext4_usable_bytes(image: &Path) -> io::Result<u64> {
    let out = Command::new("dumpe2fs")
        .arg("-h")
        .arg(image)
        .env("LC_ALL", "C")
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| -> io::Result<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| io::Error::other(format!("dumpe2fs shows no {name:?}")))
    };
    let blocks = field("Block count")?;
    let overhead = field("Overhead clusters")?;
    Ok(blocks.saturating_sub(overhead) * field("Block size")?)
}

/// [`copy_data`] for a volume's image.
pub(crate) fn copy_image(from: &Path, to: &Path) -> Result<(), VolumeError> {
    copy_data(from, to).map_err(|e| VolumeError::io("copying the image", e))
}

/// Freezes the filesystem mounted at `mount_point` until the returned guard is dropped.
pub(crate) fn freeze(mount_point: &Path) -> Result<Frozen, VolumeError> {
    run(
        "freezing the volume",
        "fsfreeze",
        &["-f".as_ref(), mount_point.as_os_str()],
    )?;
    Ok(Frozen {
        mount_point: mount_point.to_path_buf(),
    })
}

/// A frozen filesystem; dropping it thaws, whatever happened meanwhile (an error, a panic).
pub(crate) struct Frozen {
    mount_point: PathBuf,
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // A volume left frozen blocks every writer in its sandboxes, so try hard.
        for attempt in 1..=5 {
            match run(
                "thawing the volume",
                "fsfreeze",
                &["-u".as_ref(), self.mount_point.as_os_str()],
            ) {
                Ok(()) => return,
                Err(e) => {
                    tracing::error!(mount_point = %self.mount_point.display(), attempt, "{e}");
                    std::thread::sleep(std::time::Duration::from_millis(100 * attempt));
                }
            }
        }
    }
}

//! A sandbox's disk: the ext4 image on the data disk that holds its writable layer.
//!
//! Each sandbox gets `<disk_dir>/<id>.img`, a sparse file the size the create asks for,
//! loop-mounted by the host at `<sandbox dir>/rw`; the overlay's upper and work directories
//! live on it. Files are disk, not memory: writes past the size get ENOSPC inside the sandbox
//! and cost it only reclaimable page cache (a tmpfs layer was charged to the sandbox's memory
//! limit, so a sandbox keeping more files than memory was OOM-killed). Measured on the test
//! hosts, see `docs/runtime-ns.md`: a blank image is a copy of a cached, freshly made one
//! (its data is about 1 MiB: the journal and inode tables are left unwritten, which reads as
//! zeros), and mounting it takes a few milliseconds.
//!
//! The image is what pauses and snapshots keep: a pause links the image's file into the
//! pause's directory (no copy), a snapshot copies it by data or as a reflink, and a resume
//! takes the paused file back by linking it again. `discard` hands the blocks of deleted
//! files back to the data disk (holes punched in the image), so the image stays as small as
//! what the sandbox keeps.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Name of the image inside a saved directory (a pause's or a snapshot's).
pub const IMAGE: &str = "disk.img";

/// Where the disk of sandbox `id` is kept.
pub fn image_path(disk_dir: &Path, id: &str) -> PathBuf {
    disk_dir.join(format!("{id}.img"))
}

/// How a new disk gets its content.
#[derive(Debug, Clone)]
pub enum Source {
    /// An empty filesystem.
    Blank,
    /// A copy of the image at this path (a snapshot's: it stays as it is).
    Copy(PathBuf),
    /// The image at this path itself, linked (a paused sandbox resuming: its pause no longer
    /// needs it once the sandbox runs).
    Take(PathBuf),
}

/// Makes the disk `image` of `bytes` (ignored for a copied or taken image, which keeps its
/// own size) from `source`.
pub fn make(disk_dir: &Path, image: &Path, bytes: u64, source: &Source) -> io::Result<()> {
    fs::create_dir_all(disk_dir)?;
    remove(image)?;
    match source {
        Source::Blank => warren_volume::copy_data(&blank(disk_dir, bytes)?, image),
        Source::Copy(from) => warren_volume::copy_data(from, image),
        Source::Take(from) => link_or_copy(from, image),
    }
}

/// The cached empty filesystem of `bytes`, made on first use. Concurrent first uses each
/// make one and the last rename wins, which is harmless. The sandbox gets the size it asked
/// for as its filesystem's size (what `df` shows): the image is larger by ext4's own
/// structures ([`warren_volume::ext4_image_bytes`]).
fn blank(disk_dir: &Path, bytes: u64) -> io::Result<PathBuf> {
    let dir = disk_dir.join("blank");
    let path = dir.join(format!("{bytes}.img"));
    if path.exists() {
        return Ok(path);
    }
    fs::create_dir_all(&dir)?;
    let tmp = dir.join(format!(".{bytes}.{}.{}", std::process::id(), tmp_counter()));
    let made = warren_volume::ext4_image_bytes(&dir, bytes, MKFS_SHAPE)
        .and_then(|size| mkfs(&tmp, size))
        .and_then(|()| fs::rename(&tmp, &path));
    if made.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    made.map(|()| path)
}

fn tmp_counter() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The options that shape the filesystem (and with it ext4's overhead): 4 KiB blocks also
/// for small disks (mke2fs would pick 1 KiB), 256-byte inodes, no blocks kept for root.
const MKFS_SHAPE: &[&str] = &["-b", "4096", "-I", "256", "-m", "0"];

/// Makes an ext4 filesystem of `bytes` in the new file `image`.
///
/// [`MKFS_SHAPE`]; lazy inode tables and journal: left unwritten, so the image
/// stays about 1 MiB of data and copies of it are cheap; unwritten parts of a sparse file read
/// as zeros, which is what initialising them would write (`noinit_itable` at mount keeps the
/// kernel from zeroing them again). `-e remount-ro`: an I/O error (the data disk full under a
/// sparse image) stops writes instead of letting the filesystem run on damaged.
fn mkfs(image: &Path, bytes: u64) -> io::Result<()> {
    fs::File::create(image)?.set_len(bytes)?;
    let mut args: Vec<&std::ffi::OsStr> = vec!["-q".as_ref(), "-F".as_ref()];
    args.extend(MKFS_SHAPE.iter().map(std::ffi::OsStr::new));
    args.extend([
        "-e".as_ref(),
        "remount-ro".as_ref(),
        "-E".as_ref(),
        "lazy_itable_init=1,lazy_journal_init=1,nodiscard".as_ref(),
        image.as_os_str(),
    ]);
    run("mkfs.ext4", &args)
}

/// Loop-mounts `image` at `target`: `nosuid,nodev` (nothing the sandbox writes becomes a
/// set-uid program or a device node on the host's side of the mount), `discard` (deleted
/// files give their blocks back to the data disk), `noinit_itable` (see [`mkfs`]). The loop
/// device is set up by `mount` with autoclear, so the last unmount releases it.
pub fn mount(image: &Path, target: &Path) -> io::Result<()> {
    run(
        "mount",
        &[
            "-t".as_ref(),
            "ext4".as_ref(),
            "-o".as_ref(),
            "loop,nosuid,nodev,discard,noinit_itable".as_ref(),
            image.as_os_str(),
            target.as_os_str(),
        ],
    )
}

/// Writes everything the filesystem mounted at `mount_point` holds to its image (the caller
/// has frozen every process that could write to it, so the image is then consistent).
pub fn sync(mount_point: &Path) -> io::Result<()> {
    let dir = fs::File::open(mount_point)?;
    nix::unistd::syncfs(&dir).map_err(io::Error::from)
}

/// Saves the disk `image` of a sandbox into the directory `staging` (being written for a
/// durable install): linked when `link` (a pause: the sandbox stops writing to it or is
/// frozen until the pause ends), else copied. Returns the bytes the saved image takes on
/// the data disk.
pub fn save(image: &Path, staging: &Path, link: bool) -> io::Result<u64> {
    let dest = staging.join(IMAGE);
    if link {
        link_or_copy(image, &dest)?;
    } else {
        warren_volume::copy_data(image, &dest)?;
    }
    Ok(fs::metadata(&dest)?.blocks() * 512)
}

/// A hard link where both paths are on one filesystem (as the data dir's are), else a copy.
fn link_or_copy(from: &Path, to: &Path) -> io::Result<()> {
    match fs::hard_link(from, to) {
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => warren_volume::copy_data(from, to),
        r => r,
    }
}

/// Deletes a disk's file (the mount, if any, keeps its loop device until unmounted).
/// Idempotent.
pub fn remove(image: &Path) -> io::Result<()> {
    match fs::remove_file(image) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Removes the disks in `disk_dir` of sandboxes not in `keep`, and the cache of blank
/// images (made again on first use, by the server that uses them). Returns the ids removed.
pub fn remove_unkept(disk_dir: &Path, keep: &[String]) -> Vec<String> {
    let mut removed = Vec::new();
    let Ok(rd) = fs::read_dir(disk_dir) else {
        return removed;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(id) = name.strip_suffix(".img") else {
            continue;
        };
        if !keep.iter().any(|k| k == id) && fs::remove_file(e.path()).is_ok() {
            removed.push(id.to_string());
        }
    }
    remove_cache(disk_dir);
    removed
}

/// Removes the cache of blank images.
pub fn remove_cache(disk_dir: &Path) {
    let _ = fs::remove_dir_all(disk_dir.join("blank"));
}

fn run(program: &str, args: &[&std::ffi::OsStr]) -> io::Result<()> {
    let out = Command::new(program)
        .args(args)
        .env("LC_ALL", "C")
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("running {program}: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    Err(tool_failed(
        &format!("{program} exited with {}", out.status),
        &out.stderr,
    ))
}

/// The error of a host tool that failed doing `what`, with its stderr; a full disk is
/// `StorageFull`, which callers report as the host's capacity.
pub(crate) fn tool_failed(what: &str, stderr: &[u8]) -> io::Error {
    let stderr = String::from_utf8_lossy(stderr);
    let kind = if stderr.contains("No space left") {
        io::ErrorKind::StorageFull
    } else {
        io::ErrorKind::Other
    };
    io::Error::new(kind, format!("{what}: {}", stderr.trim()))
}

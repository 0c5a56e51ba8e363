//! Persistent volumes on a host's disk: one ext4 filesystem image per volume, loop-mounted,
//! with snapshots and safe content operations for an HTTP content API.
//!
//! # Layout
//!
//! Under the volumes' root (e.g. `<data-dir>/volumes`, mode 0700):
//!
//! ```text
//! <root>/<id>/              0700, one per volume; its flock serialises changes to the volume
//! <root>/<id>/disk.ext4     the volume's filesystem image, allocated in full
//! <root>/<id>/data/         where the image is mounted (loop, nosuid, nodev); sandboxes get
//!                           (id-mapped) bind mounts of this
//! <root>/.snapshots/<snap>.ext4   point-in-time copies of images
//! <root>/.staging/          images being made; renamed to <root>/<id> only when complete
//! ```
//!
//! Volume and snapshot ids are `[a-z0-9-]{1,64}`, so they can never collide with the dot
//! directories or name anything outside the root.
//!
//! # Why one filesystem image per volume
//!
//! - **Quotas the kernel enforces everywhere.** A volume's quota is the size of its filesystem
//!   ([`Quota::bytes`]) and its inode count ([`Quota::inodes`]). Writes past either fail with
//!   ENOSPC, whether they come from the content API ([`VolumeError::NoSpace`]) or from a
//!   process inside a sandbox, which sees an ordinary full disk. No quota accounting on the
//!   host's filesystem is needed, and no sandbox can fill the host's disk through a volume.
//! - **A volume's space is its own.** The image is allocated in full (`fallocate`) when it is
//!   made or grown, and its loop device refuses discards (so the host's `fstrim` cannot punch
//!   the allocation out again): a volume that has room never meets a full host disk, whatever
//!   else fills it. A create, grow or snapshot that would leave less than the host's reserve
//!   ([`VolumeHost::with_reserve`]) free is refused up front ([`VolumeError::HostFull`], 507).
//!   Sparse images would cost only what is written, but a host disk filled by anyone (another
//!   volume, snapshots, the store) then fails every volume's next block allocation: the
//!   journal aborts and the filesystem turns read-only.
//! - **Snapshots are a file copy.** The filesystem is frozen for a moment and its image copied,
//!   as a reflink where the host filesystem has them, else sparsely; a new volume from a
//!   snapshot is another copy. Growing is `truncate` plus an online `resize2fs`.
//! - **Isolation of metadata.** Inode numbers, free-space and the directory tree of one volume
//!   are invisible to every other volume and to the host's own files.
//!
//! # Durability
//!
//! Inside a sandbox the volume behaves like any POSIX filesystem: data a process has fsynced
//! survives a host crash, because the loop device passes flushes and FUA writes on to its
//! backing file (it fsyncs the image), and ext4's journal keeps the filesystem consistent.
//! Writes not yet fsynced may be lost in a crash, as on any disk.
//!
//! Through the content API, [`Content::write_file`] writes a temporary file, fsyncs it, renames
//! it into place and fsyncs the directory: when it returns `Ok` the file is durable, and at any
//! moment the path holds either the old content or the new one. Volume creation, deletion and
//! snapshots fsync what they write and the directories they change.
//!
//! # Confinement
//!
//! [`Content`] never trusts what a sandbox put in its volume: every path is normalised
//! lexically (`..` never climbs above the root), then resolved beneath the volume's root with
//! cap-std (openat2 `RESOLVE_BENEATH`), and the last component is acted on without following
//! a symlink. A symlink that would lead out of the volume makes the operation fail with
//! [`VolumeError::Escape`] (not NotFound: the entry exists, the client is told why it cannot
//! use it), and nothing outside is read, written, chowned or removed, even while a sandbox
//! swaps entries around during an operation. Paths that are not UTF-8 cannot be named through
//! this API; listings show such names lossily.
//!
//! # Host requirements
//!
//! Root (mount, chown), loop devices, and the tools `mkfs.ext4`, `resize2fs`, `e2fsck`
//! (e2fsprogs), `mount`, `umount`, `losetup`, `fsfreeze` (util-linux) and `cp` (coreutils).
//! Growing a mounted volume online also needs CAP_SYS_RESOURCE (see [`VolumeHost::grow`]).
//! Every method is blocking: call it from `spawn_blocking` in async code.

mod content;
mod error;
mod host;
mod path;
mod sweep;
mod tools;

pub use content::{
    Content, EntryKind, EntryStat, Owner, DEFAULT_DIR_MODE, DEFAULT_FILE_MODE, MAX_ID,
};
pub use error::{ErrorKind, VolumeError};
pub use host::{Quota, Usage, VolumeHost, MAX_INODES, MIN_BYTES, MIN_INODES};
pub use tools::{copy_data, ext4_image_bytes};

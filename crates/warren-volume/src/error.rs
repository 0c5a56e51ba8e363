//! The crate's error type and its coarse categories for an HTTP layer.

use std::io;

/// What can go wrong with a volume or a content operation.
///
/// Paths in the variants are volume paths (`/a/b`), never host paths, so the messages can be
/// shown to API clients as they are. [`VolumeError::kind`] gives the category an HTTP layer
/// maps to a status code ([`ErrorKind::http_status`]).
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// The volume, snapshot or path does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// The volume, snapshot or path already exists.
    #[error("already exists: {0}")]
    Exists(String),
    /// A path component (or the path itself) is not a directory where one is needed.
    #[error("not a directory: {0}")]
    NotADirectory(String),
    /// The path is a directory where a file is needed.
    #[error("is a directory: {0}")]
    IsADirectory(String),
    /// The path is not a regular file (a directory, device, FIFO or socket).
    #[error("not a regular file: {0}")]
    NotAFile(String),
    /// The path cannot be used (the volume root where that makes no sense, a NUL byte, too
    /// long, a symlink loop).
    #[error("invalid path: {0}")]
    InvalidPath(String),
    /// An argument is out of range (an id, a quota, a uid/gid/mode, a depth).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Resolving the path would leave the volume (through a symlink, absolute or with `..`).
    /// Nothing outside was touched.
    #[error("path leads outside the volume: {0}")]
    Escape(String),
    /// The volume's byte or inode quota is exhausted (ENOSPC or EDQUOT).
    #[error("no space left on the volume")]
    NoSpace,
    /// Any other I/O error, with what was being done.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    /// A host tool (mkfs.ext4, mount, resize2fs, fsfreeze, cp...) failed; `detail` is its
    /// stderr.
    #[error("{what} failed: {detail}")]
    Command { what: String, detail: String },
    /// The operation needs the volume unused, and something uses it.
    #[error("{0}")]
    Busy(String),
    /// The host's disk cannot take what the operation would write without eating into the
    /// space kept free for the server (its store, snapshots and other volumes).
    #[error(
        "the host's disk has no room for {what}: it needs {needed} bytes, {free} are free and \
         {reserve} of those stay free for the server; free space (delete volumes, snapshots or \
         templates) or ask for less"
    )]
    HostFull {
        what: String,
        needed: u64,
        free: u64,
        reserve: u64,
    },
}

/// Categories of [`VolumeError`], one per HTTP status an API would answer with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// 404.
    NotFound,
    /// 409: the target already exists.
    Conflict,
    /// 400: the request cannot work on this path or with these arguments.
    BadRequest,
    /// 507: the volume is full.
    InsufficientStorage,
    /// 500: a host-side failure.
    Internal,
}

impl ErrorKind {
    /// The HTTP status code for this category.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorKind::NotFound => 404,
            ErrorKind::Conflict => 409,
            ErrorKind::BadRequest => 400,
            ErrorKind::InsufficientStorage => 507,
            ErrorKind::Internal => 500,
        }
    }
}

impl VolumeError {
    /// The category of this error (see [`ErrorKind::http_status`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            VolumeError::NotFound(_) => ErrorKind::NotFound,
            VolumeError::Exists(_) | VolumeError::Busy(_) => ErrorKind::Conflict,
            VolumeError::NotADirectory(_)
            | VolumeError::IsADirectory(_)
            | VolumeError::NotAFile(_)
            | VolumeError::InvalidPath(_)
            | VolumeError::InvalidArgument(_)
            | VolumeError::Escape(_) => ErrorKind::BadRequest,
            VolumeError::NoSpace | VolumeError::HostFull { .. } => ErrorKind::InsufficientStorage,
            // The host's disk filled up under an operation (a copy, a grow): its cause says so.
            VolumeError::Io { source, .. } if is_no_space(source) => ErrorKind::InsufficientStorage,
            VolumeError::Io { .. } | VolumeError::Command { .. } => ErrorKind::Internal,
        }
    }

    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> VolumeError {
        VolumeError::Io {
            what: what.into(),
            source,
        }
    }
}

/// True when `e` is ENOSPC or EDQUOT: the volume's byte or inode quota ran out.
pub(crate) fn is_no_space(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(c) if c == rustix::io::Errno::NOSPC.raw_os_error()
        || c == rustix::io::Errno::DQUOT.raw_os_error())
}

/// True when `e` is cap-std's "a path led outside of the filesystem". cap-std reports an
/// escape (openat2's EXDEV, or its own check in the fallback resolver) as a PermissionDenied
/// error without an OS code; a genuine EACCES carries its code, so the two are told apart by
/// that. A raw EXDEV (openat2's own answer, should one come through unmapped) is an escape
/// too. The `hostile` tests pin this down.
fn is_escape(e: &io::Error) -> bool {
    (e.kind() == io::ErrorKind::PermissionDenied && e.raw_os_error().is_none())
        || e.raw_os_error() == Some(rustix::io::Errno::XDEV.raw_os_error())
}

/// Maps an error of a content operation on volume path `path` to a [`VolumeError`].
pub(crate) fn content_error(e: io::Error, path: &str, what: &str) -> VolumeError {
    use rustix::io::Errno;
    if is_escape(&e) {
        return VolumeError::Escape(path.to_string());
    }
    if is_no_space(&e) {
        return VolumeError::NoSpace;
    }
    let Some(code) = e.raw_os_error() else {
        return VolumeError::io(format!("{what} {path}"), e);
    };
    match Errno::from_raw_os_error(code) {
        Errno::NOENT => VolumeError::NotFound(path.to_string()),
        Errno::EXIST | Errno::NOTEMPTY => VolumeError::Exists(path.to_string()),
        Errno::NOTDIR => VolumeError::NotADirectory(path.to_string()),
        Errno::ISDIR => VolumeError::IsADirectory(path.to_string()),
        Errno::LOOP => VolumeError::InvalidPath(format!("{path}: too many levels of symlinks")),
        Errno::NAMETOOLONG => VolumeError::InvalidPath(format!("{path}: name too long")),
        Errno::NXIO | Errno::NODEV => VolumeError::NotAFile(path.to_string()),
        _ => VolumeError::io(format!("{what} {path}"), e),
    }
}

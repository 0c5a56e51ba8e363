//! The crate's error type. Every variant names the path or command involved, because an image
//! build touches dozens of both and "No such file or directory" alone is useless in a log.

use std::io;
use std::path::PathBuf;

/// Result alias for this crate.
pub type Result<T, E = ImageError> = std::result::Result<T, E>;

/// Everything that can go wrong while describing, building, caching or checking an image.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// A filesystem operation failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What we were doing ("create directory", "read", ...).
        op: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// A host tool the build needs is not installed.
    #[error(
        "required tool `{tool}` was not found in PATH or /usr/sbin:/sbin; install the Debian \
         package `{package}` (scripts/setup.sh does this)"
    )]
    ToolMissing {
        /// Executable name.
        tool: &'static str,
        /// Debian package that provides it.
        package: &'static str,
    },

    /// A command could not be started at all.
    #[error("could not start `{command}`: {source}")]
    Spawn {
        /// The command line, shell-quoted for copy and paste.
        command: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// A command ran and failed.
    #[error("`{command}` failed ({status}); last lines of its output:\n{tail}")]
    CommandFailed {
        /// The command line, shell-quoted for copy and paste.
        command: String,
        /// Exit status as printed by the OS ("exit status: 1", "signal: 9").
        status: String,
        /// The last lines the command wrote to stderr (stdout if stderr was empty).
        tail: String,
    },

    /// Layers that cannot be packed into an image (see [`crate::pack_layers`]).
    #[error("cannot pack layers: {0}")]
    Pack(String),

    /// The recipe is not something we can or should build.
    #[error("invalid image recipe: {0}")]
    InvalidRecipe(String),

    /// Building needs root: mmdebstrap's root mode, chown'd files, useradd --root.
    #[error(
        "building image `{name}` needs root (mmdebstrap --mode=root, useradd --root and \
         root-owned files); run the host manager as root"
    )]
    NeedsRoot {
        /// The recipe name.
        name: String,
    },

    /// A file claims to be an erofs image but is not a complete, intact one.
    #[error("{} is not a valid erofs image: {reason}", path.display())]
    CorruptImage {
        /// The image file.
        path: PathBuf,
        /// What check failed.
        reason: String,
    },

    /// A manifest could not be written or parsed.
    #[error("manifest {}: {reason}", path.display())]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },

    /// A directory we were about to delete still has something mounted inside it. Deleting
    /// recursively through a bind mount of /dev or /proc would damage the host, so we refuse.
    #[error(
        "refusing to delete {}: mount points remain inside it ({}); unmount them first",
        path.display(),
        mounts.join(", ")
    )]
    MountsInside {
        /// The directory.
        path: PathBuf,
        /// The mount points found under it.
        mounts: Vec<String>,
    },
}

impl ImageError {
    /// Shorthand for [`ImageError::Io`], for use in `map_err`.
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| ImageError::Io { op, path, source }
    }
}

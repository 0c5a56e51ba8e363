//! Errors of this crate. Messages are sentence case and never repeat their `#[source]`.

use std::io;
use std::path::PathBuf;

use crate::addr::Ipv4Cidr;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration cannot work; the message says which field and why.
    #[error("Invalid network configuration: {0}")]
    InvalidConfig(String),

    /// A required tool is not installed.
    #[error("`{program}` is not installed (Debian package `{package}`)")]
    ToolMissing {
        program: &'static str,
        package: &'static str,
        #[source]
        source: io::Error,
    },

    /// A tool could not be started for another reason than being absent.
    #[error("Could not run `{command}`")]
    Spawn {
        command: String,
        #[source]
        source: io::Error,
    },

    /// A tool ran and failed; `stderr` is what it printed.
    #[error("`{command}` failed ({status}): {stderr}")]
    CommandFailed {
        command: String,
        status: String,
        stderr: String,
    },

    /// A tool did not finish in time and was killed.
    #[error("`{command}` did not finish within {timeout_ms} ms")]
    CommandTimeout { command: String, timeout_ms: u64 },

    /// A tool printed something this crate cannot parse (e.g. a changed JSON shape).
    #[error("Unexpected output from `{command}`: {detail}")]
    BadOutput { command: String, detail: String },

    /// Entering a slot's network namespace failed.
    #[error("Could not enter network namespace {path}")]
    EnterNetns {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("I/O error on {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// The pool's DNS resolver could not start.
    #[error("Could not {what}")]
    Resolver {
        what: &'static str,
        #[source]
        source: io::Error,
    },

    /// The egress proxy could not listen in a slot (its sandbox's TCP by name stays cut).
    #[error("Could not start the egress proxy in slot {slot}")]
    Proxy {
        slot: String,
        #[source]
        source: io::Error,
    },

    /// Another pool (in this or another process) holds the prefix.
    #[error("Network prefix `{prefix}` is in use by another pool (lock file {path})")]
    PrefixInUse { prefix: String, path: PathBuf },

    /// A route that is not ours already covers part of the slot address pool.
    #[error("Slot address pool {pool} overlaps the existing route `{route}`")]
    RangeInUse { pool: Ipv4Cidr, route: String },

    /// Every slot the address pool (or `max_slots`) allows is in use.
    #[error("All {max} network slots are in use")]
    Exhausted { max: u32 },

    /// The slot was acquired from a different pool.
    #[error("Slot `{name}` does not belong to this pool")]
    ForeignSlot { name: String },

    /// A slot named for adoption is missing, damaged or not a slot of this pool; whatever
    /// was left of it has been removed.
    #[error("Cannot adopt network slot `{name}`: {reason}")]
    NotAdoptable { name: String, reason: String },

    /// The tokio runtime shut down while a pool operation was running.
    #[error("The async runtime shut down during a network slot operation")]
    RuntimeShutdown,

    /// `flush_conntrack` is on but the `conntrack` tool cannot be run.
    #[error(
        "The `conntrack` tool is required to forget a released slot's connections (install \
         the Debian package `conntrack`, or set flush_conntrack = false)"
    )]
    ConntrackRequired {
        #[source]
        source: Box<Error>,
    },

    /// The host's nftables table of the pool is missing or changed and could not be
    /// restored; no new slots are handed out until it is.
    #[error("The host nftables table `{table}` of the network pool is not in place")]
    HostTableMissing { table: String },

    /// Objects that should be gone are still there after removal.
    #[error("Could not remove {what}")]
    Leftover { what: String },
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

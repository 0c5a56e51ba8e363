//! The agent's journal: what happened inside a sandbox, in order, for the control plane.
//!
//! The agent keeps a bounded ring of [`JournalEntry`]s (processes started and ended through
//! the API and inside the sandbox, their output lines, files changed through the API, its own
//! messages) and serves it at `GET /journal?after=SEQ&limit=N` (token required). The control
//! plane reads it every few seconds and keeps what it reads (the audit trail and the sandbox
//! logs). `boot` changes when the agent starts again, so a reader knows its cursor is void.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A process started through the API (`process.Start`).
pub const PROCESS_START: &str = "process.start";
/// A process started through the API ended.
pub const PROCESS_END: &str = "process.end";
/// A program executed inside the sandbox (by anything: a shell in a terminal, a script).
pub const PROCESS_EXEC: &str = "process.exec";
/// A process seen by [`PROCESS_EXEC`] ended.
pub const PROCESS_EXIT: &str = "process.exit";
/// A line a process started through the API wrote (`fields.stream`: stdout or stderr).
pub const PROCESS_OUTPUT: &str = "process.output";
/// A file written through the API (upload or filesystem call).
pub const FILE_WRITE: &str = "file.write";
/// A file or directory removed through the API.
pub const FILE_REMOVE: &str = "file.remove";
/// A file or directory moved through the API.
pub const FILE_RENAME: &str = "file.rename";
/// A directory made through the API.
pub const FILE_MKDIR: &str = "file.mkdir";
/// The agent's own messages (initialised, mounts, warnings).
pub const AGENT: &str = "agent";

/// Every kind an entry may have.
pub const KINDS: [&str; 10] = [
    PROCESS_START,
    PROCESS_END,
    PROCESS_EXEC,
    PROCESS_EXIT,
    PROCESS_OUTPUT,
    FILE_WRITE,
    FILE_REMOVE,
    FILE_RENAME,
    FILE_MKDIR,
    AGENT,
];

/// Severity, as E2B's sandbox logs name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }

    pub fn parse(s: &str) -> Option<Level> {
        match s.to_ascii_lowercase().as_str() {
            "debug" => Some(Level::Debug),
            "info" => Some(Level::Info),
            "warn" | "warning" => Some(Level::Warn),
            "error" => Some(Level::Error),
            _ => None,
        }
    }
}

/// One thing that happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// Position in this boot's journal, from 1, without gaps (a reader that finds one lost
    /// entries to the ring's bound).
    pub seq: u64,
    /// Unix time in milliseconds.
    pub at_ms: i64,
    /// One of [`KINDS`].
    pub kind: String,
    pub level: Level,
    /// A line a person reads.
    pub message: String,
    /// The details, by name (`pid`, `argv`, `cwd`, `user`, `exit_code`, `path`, ...).
    #[serde(default)]
    pub fields: BTreeMap<String, String>,
}

/// The answer of `GET /journal`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalPage {
    /// Names this run of the agent.
    pub boot: String,
    /// The cursor for the next read (the last entry's `seq`, or the one given).
    pub next: u64,
    /// Entries older than the oldest kept that the reader has not seen (lost to the bound).
    pub dropped: u64,
    pub entries: Vec<JournalEntry>,
}

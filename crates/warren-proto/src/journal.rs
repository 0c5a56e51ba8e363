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

/// Values shorter than this are not masked: a short value (`1`, `true`, a port) would blank
/// out ordinary text everywhere, and is no secret worth the noise.
pub const MIN_MASKED_LEN: usize = 6;

/// Masks secret values (environment variables' values, tokens) in journal text before it is
/// kept: a command that prints `$DB_PASSWORD` must not put the password into the audit trail
/// or the logs, which are stored in the clear and exported.
#[derive(Debug, Clone, Default)]
pub struct Masker {
    /// (value, what replaces it), longest value first so a value that contains another is
    /// masked whole.
    values: Vec<(String, String)>,
}

impl Masker {
    /// Masks each value (of at least [`MIN_MASKED_LEN`] bytes) as `[masked:NAME]`.
    pub fn new<'a>(named: impl IntoIterator<Item = (&'a str, &'a str)>) -> Masker {
        let mut values: Vec<(String, String)> = named
            .into_iter()
            .filter(|(_, v)| v.len() >= MIN_MASKED_LEN)
            .map(|(name, v)| (v.to_string(), format!("[masked:{name}]")))
            .collect();
        values.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        values.dedup_by(|a, b| a.0 == b.0);
        Masker { values }
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// `text` with every value masked.
    pub fn mask(&self, text: &str) -> String {
        let mut out = text.to_string();
        for (value, with) in &self.values {
            if out.contains(value.as_str()) {
                out = out.replace(value.as_str(), with);
            }
        }
        out
    }

    /// Masks an entry's message and every field's value.
    pub fn mask_entry(&self, e: &mut JournalEntry) {
        if self.is_empty() {
            return;
        }
        e.message = self.mask(&e.message);
        for v in e.fields.values_mut() {
            *v = self.mask(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_long_values_whole_and_leaves_short_ones() {
        let m = Masker::new([
            ("DB_PASSWORD", "hunter2-horse"),
            ("PREFIX", "hunter2"),
            ("PORT", "8080"),
        ]);
        assert_eq!(
            m.mask("pw=hunter2-horse p=hunter2 port 8080"),
            "pw=[masked:DB_PASSWORD] p=[masked:PREFIX] port 8080"
        );
        let mut e = JournalEntry {
            seq: 1,
            at_ms: 0,
            kind: PROCESS_START.into(),
            level: Level::Info,
            message: "echo hunter2-horse".into(),
            fields: BTreeMap::from([("argv".into(), "[\"echo\",\"hunter2-horse\"]".into())]),
        };
        m.mask_entry(&mut e);
        assert!(!e.message.contains("hunter2") && !e.fields["argv"].contains("hunter2"));
        assert!(Masker::new([("A", "1")]).is_empty());
    }
}

//! The port a template build runs through ([`TemplateBuilder`], implemented by `warren-build`)
//! and what crosses it: the job, the image it makes, its failure and the build's log.

use std::sync::{Arc, Mutex as StdMutex};

use async_trait::async_trait;
use chrono::Utc;

use crate::templates::{LogEntry, LogLevel};
use warren_buildspec::BuildSpec;

/// What a builder reports when it cannot do what was asked of it.
#[derive(Debug, thiserror::Error)]
pub enum BuilderError {
    /// The input is wrong (a malformed or unsafe archive): the caller's to fix.
    #[error("{0}")]
    Invalid(String),
    /// The upload is larger than the host accepts.
    #[error("{0}")]
    TooLarge(String),
    /// The host's disk has no room for it without eating into the server's reserve.
    #[error("{0}")]
    NoSpace(String),
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// Everything a builder needs for one build.
#[derive(Debug, Clone)]
pub struct BuildJob {
    pub build_id: String,
    pub template_id: String,
    pub team: String,
    pub spec: BuildSpec,
    /// The runtime key of the template the build starts from, when it starts from one.
    pub parent: Option<String>,
    /// The same for each of `spec.stages`.
    pub stage_parents: Vec<Option<String>>,
    pub resources: warren_types::Resources,
}

/// Why a build failed: the message the SDK raises and the step it points at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildFailure {
    pub step: Option<String>,
    pub message: String,
}

/// The image a finished build made, by the runtime key sandboxes are created from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltImage {
    pub key: String,
}

/// Where a build writes its log as it runs.
#[derive(Clone, Default)]
pub struct BuildLog {
    entries: Arc<StdMutex<Vec<LogEntry>>>,
}

impl BuildLog {
    pub fn push(&self, level: LogLevel, step: Option<&str>, message: impl Into<String>) {
        let entry = LogEntry {
            timestamp: Utc::now(),
            level,
            message: message.into(),
            step: step.map(str::to_string),
        };
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(entry);
    }

    pub fn info(&self, step: Option<&str>, message: impl Into<String>) {
        self.push(LogLevel::Info, step, message);
    }

    pub fn error(&self, step: Option<&str>, message: impl Into<String>) {
        self.push(LogLevel::Error, step, message);
    }

    pub(crate) fn page(&self, offset: usize, limit: usize) -> Vec<LogEntry> {
        let all = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        // One page of the log, from the caller's offset (E2B's `logsOffset`).
        all.iter().skip(offset).take(limit).cloned().collect()
    }

    pub(crate) fn all(&self) -> Vec<LogEntry> {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Runs template builds; `warren-build` is the implementation.
#[async_trait]
pub trait TemplateBuilder: Send + Sync + 'static {
    /// Whether `team` already uploaded the files with this hash.
    async fn has_files(&self, team: &str, hash: &str) -> Result<bool, BuilderError>;
    /// Stores an uploaded archive (tar, gzip or not) under its hash for `team`, after checking
    /// that every entry stays inside its target. Nothing is kept of a refused upload.
    async fn put_files(
        &self,
        team: &str,
        hash: &str,
        body: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    ) -> Result<(), BuilderError>;
    /// Runs a build to its end, logging to `log`.
    async fn build(&self, job: BuildJob, log: BuildLog) -> Result<BuiltImage, BuildFailure>;
    /// Deletes a finished image no template refers to any more.
    async fn remove_image(&self, key: &str) -> Result<(), BuilderError>;
    /// What template images, build layers and pulled layers take on disk; `keep` are the
    /// images something still uses.
    async fn disk_use(&self, keep: &[String]) -> Result<crate::DiskUse, BuilderError>;
    /// Deletes what `disk_use` reports as unused: images not in `keep`, every cached build
    /// layer and every pulled layer. Answers what it freed.
    async fn prune(&self, keep: &[String]) -> Result<crate::DiskUse, BuilderError>;
}

/// Prefix of the runtime snapshots a builder keeps as its per-step cache. They are the
/// builder's records (`<data>/build-cache`), not the store's: recovery leaves them alone, and
/// only a prune removes them.
pub const BUILD_LAYER_PREFIX: &str = "bl";

//! What the control plane needs from a host's sandbox runtime, whatever the back end.
//!
//! The control plane decides and records; a [`SandboxRuntime`] makes sandboxes exist on this
//! host. Every sandbox's guest agent is reachable at a host address (`agent`), where the proxy
//! sends its traffic. Optional abilities (pause, snapshot, fork, resize) will be separate
//! traits; [`Capabilities`] says which a back end has.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// Everything a back end needs to create one sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateSpec {
    /// Sandbox id: lowercase letters and digits, at most 63 characters.
    pub id: String,
    /// Template name (e.g. `base`).
    pub template: String,
    pub cpu_count: u32,
    pub memory_mb: u32,
    /// Size of the sandbox's writable root filesystem.
    pub disk_mb: u32,
    pub allow_internet_access: bool,
    /// Sandbox-wide environment variables of every process.
    pub env_vars: BTreeMap<String, String>,
    /// Token the agent demands in `X-Access-Token` (none: open agent).
    pub access_token: Option<String>,
}

/// A sandbox as the runtime created or found it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuntimeSandbox {
    pub id: String,
    /// Where the host reaches the sandbox's agent (port 49983 inside the sandbox); other
    /// sandbox ports are reached at the same IP.
    pub agent: SocketAddr,
    /// Opaque state the control plane must persist and give back to [`SandboxRuntime::reattach`]
    /// after a restart (pids, slots, paths).
    pub record: serde_json::Value,
}

/// How a sandbox ended, when the runtime knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exit {
    pub reason: String,
}

/// Which optional abilities a back end has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    pub pause_memory: bool,
    pub pause_filesystem: bool,
    pub snapshot: bool,
    pub fork: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("unknown template {0:?}")]
    UnknownTemplate(String),
    #[error("sandbox {0:?} not found")]
    NotFound(String),
    #[error("invalid request: {0}")]
    InvalidArgument(String),
    #[error("host capacity exhausted: {0}")]
    Exhausted(String),
    #[error("{0}")]
    Failed(String),
}

#[async_trait::async_trait]
pub trait SandboxRuntime: Send + Sync + 'static {
    /// Short name of the back end (`ns`, `vm`).
    fn name(&self) -> &'static str;
    fn capabilities(&self) -> Capabilities;
    /// Creates a sandbox and returns once its agent answers and is initialised.
    async fn create(&self, spec: CreateSpec) -> Result<RuntimeSandbox, RuntimeError>;
    /// Kills a sandbox and frees everything it held. Killing an unknown id is `NotFound`.
    async fn kill(&self, id: &str) -> Result<(), RuntimeError>;
    /// Whether the sandbox still runs; `Some(exit)` once it has ended on its own.
    async fn status(&self, id: &str) -> Result<Option<Exit>, RuntimeError>;
    /// After a control-plane restart: takes back every sandbox in `records` that still runs
    /// and removes everything else this host's runtime owns (processes, mounts, cgroups,
    /// slots). Returns, per record, the reattached sandbox or why it could not be.
    async fn reattach(
        &self,
        records: Vec<RuntimeSandbox>,
    ) -> Vec<(String, Result<RuntimeSandbox, RuntimeError>)>;
}

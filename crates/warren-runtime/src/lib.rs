//! What the control plane needs from a host's sandbox runtime, whatever the back end.
//!
//! The control plane decides and records; a [`SandboxRuntime`] makes sandboxes exist on this
//! host. Every sandbox's guest agent is reachable at a host address (`agent`), where the proxy
//! sends its traffic. Optional abilities (pause, snapshots, fork) are trait methods with a
//! default that refuses; [`Capabilities`] says which a back end really has, so the API can say
//! so instead of pretending.

#![forbid(unsafe_code)]

pub mod blocked;
pub mod egress;
pub mod flows;
pub mod peers;
pub mod transforms;

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
pub use warren_types::{Resources, SandboxId};

/// Everything a back end needs to create one sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateSpec {
    pub id: SandboxId,
    /// Template name (e.g. `base`).
    pub template: String,
    /// CPUs, memory and the size of the sandbox's writable root filesystem.
    #[serde(flatten)]
    pub resources: warren_types::Resources,
    pub allow_internet_access: bool,
    /// What the sandbox may connect to. `allow_internet_access = false` overrides its
    /// `deny_out` (see [`CreateSpec::egress_policy`]).
    #[serde(default)]
    pub egress: egress::EgressPolicy,
    /// Sandbox-wide environment variables of every process.
    pub env_vars: BTreeMap<String, String>,
    /// Token the agent demands in `X-Access-Token` (none: open agent).
    pub access_token: Option<String>,
    /// Start from this snapshot (see [`SandboxRuntime::snapshot`]) instead of the template's
    /// pristine state: its filesystem, and its memory where the back end captures memory.
    #[serde(default)]
    pub from_snapshot: Option<String>,
    /// Volumes to mount, in order (a later path may lie inside an earlier one).
    #[serde(default)]
    pub volumes: Vec<VolumeMount>,
    /// The sandbox prepared ahead that this create claims ([`SandboxRuntime::reserve_prepared`];
    /// `id` is then the reservation's). Never recorded: a reservation lives a minute at most.
    #[serde(skip)]
    pub reservation: Option<Reservation>,
}

/// A sandbox a runtime prepared ahead, reserved for one create by
/// [`SandboxRuntime::reserve_prepared`]. The create that carries it in
/// [`CreateSpec::reservation`] (with [`Reservation::id`] as its id, no snapshot and no
/// volumes) claims that sandbox instead of starting one; a create without one never claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    id: SandboxId,
}

impl Reservation {
    /// The reservation of the prepared sandbox named `id` (what a runtime hands out).
    pub fn new(id: SandboxId) -> Reservation {
        Reservation { id }
    }

    /// The id the prepared sandbox runs under, which its create must use.
    pub fn id(&self) -> &SandboxId {
        &self.id
    }
}

/// One volume mounted into a sandbox ([`Capabilities::volumes`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMount {
    /// The volume's id (what the host serves it by).
    pub volume_id: String,
    /// The volume's filesystem on the host. Its files carry the ids the sandbox sees
    /// (0..65536): the back end maps them to the sandbox's own.
    pub source: std::path::PathBuf,
    /// A directory inside the volume to mount instead of its root (relative, clean; it
    /// exists). Other sandboxes write to the volume: the back end must resolve it beneath
    /// `source` without following symbolic links.
    #[serde(default)]
    pub subpath: Option<String>,
    /// Absolute, clean path inside the sandbox.
    pub path: String,
    pub read_only: bool,
}

impl CreateSpec {
    /// The policy the runtime enforces: `egress` with `allow_internet_access` folded in.
    pub fn egress_policy(&self) -> egress::EgressPolicy {
        self.egress
            .clone()
            .with_internet_access(self.allow_internet_access)
    }
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

/// Free space where the runtime keeps saved state (pauses, snapshots).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Headroom {
    pub free_bytes: u64,
    pub free_inodes: u64,
}

/// How a sandbox ended, when the runtime knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exit {
    pub reason: String,
}

/// Which optional abilities a back end has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// Pause keeping running processes (they continue where they were on resume).
    pub pause_memory: bool,
    /// Pause keeping only the filesystem (resume starts the sandbox afresh on it).
    pub pause_filesystem: bool,
    /// Snapshots of a running sandbox (it keeps running); new sandboxes start from them.
    pub snapshot: bool,
    /// Snapshots (and therefore forks) can carry memory and running processes.
    pub snapshot_memory: bool,
    /// Snapshots can keep only the filesystem (sandboxes from them start afresh on it).
    pub snapshot_filesystem: bool,
    /// Egress policies by address (`allowOut` / `denyOut` IPs and CIDRs), on create and
    /// live ([`SandboxRuntime::set_egress`]).
    pub egress_addresses: bool,
    /// Egress rules by name (domains, `*.domain`) are enforced too.
    pub egress_names: bool,
    /// Header rules (`network.rules`) are applied by a broker at egress, secrets filled in.
    #[serde(default)]
    pub egress_rules: bool,
    /// Private networks between sandboxes ([`SandboxRuntime::set_peers`]).
    #[serde(default)]
    pub private_networks: bool,
    /// Volumes mounted at create ([`CreateSpec::volumes`]), kept across pause, resume and
    /// snapshots.
    #[serde(default)]
    pub volumes: bool,
}

/// What a pause keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PauseMode {
    /// Memory, processes and files: resume continues where the sandbox stopped.
    Memory,
    /// Files only: resume starts the sandbox afresh on its saved filesystem.
    Filesystem,
}

/// How a resume brought a sandbox back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResumeKind {
    /// Its processes continue where they were paused.
    Memory,
    /// It started afresh on its saved filesystem (a filesystem pause, or its memory was lost,
    /// e.g. the host rebooted while it was paused).
    Filesystem,
}

/// What a snapshot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    /// Whether memory and processes are in it (else only the filesystem).
    pub memory: bool,
    /// Bytes it takes on the host's disk.
    pub bytes: u64,
}

/// The key of [`RuntimeSandbox::record`] that names the back end that wrote it (`ns`, `vm`):
/// a server restarted with another runtime must not hand it records it cannot read.
pub const RECORD_RUNTIME: &str = "runtime";

/// `record` tagged with the back end `runtime` (see [`RECORD_RUNTIME`]).
pub fn tag_record(runtime: &str, mut record: serde_json::Value) -> serde_json::Value {
    if let Some(map) = record.as_object_mut() {
        map.insert(RECORD_RUNTIME.into(), runtime.into());
    }
    record
}

/// The key of a reattached [`RuntimeSandbox::record`] by which a runtime says that a sandbox
/// the control plane recorded as running was paused after all: the server died after the
/// runtime's pause had finished (durably) and before the control plane recorded it.
pub const RECORD_FINISHED_PAUSE: &str = "finishedPause";

/// `record` marked as a pause that finished while the server was down (see
/// [`RECORD_FINISHED_PAUSE`]).
pub fn mark_finished_pause(mut record: serde_json::Value, mode: PauseMode) -> serde_json::Value {
    if let (Some(map), Ok(mode)) = (record.as_object_mut(), serde_json::to_value(mode)) {
        map.insert(RECORD_FINISHED_PAUSE.into(), mode);
    }
    record
}

/// Takes the mark of [`mark_finished_pause`] off `record`: the mode of the pause, if it had one.
pub fn take_finished_pause(record: &mut serde_json::Value) -> Option<PauseMode> {
    let mode = record.as_object_mut()?.remove(RECORD_FINISHED_PAUSE)?;
    serde_json::from_value(mode).ok()
}

/// The back end that wrote `record`; `None` for records of releases before the tag.
pub fn record_runtime(record: &serde_json::Value) -> Option<&str> {
    record.get(RECORD_RUNTIME).and_then(|v| v.as_str())
}

/// A cause of any type, kept for the log and the client's message.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// One cause behind several errors (a network pool that did not start fails every sandbox
/// it would have held): each keeps it as its source.
#[derive(Debug, Clone)]
pub struct SharedCause(std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>);

impl SharedCause {
    pub fn new(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(std::sync::Arc::new(e))
    }
}

impl std::fmt::Display for SharedCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SharedCause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// What a runtime failure means to whoever asked, decided once here and mapped once per
/// transport (the control plane turns it into its own categories, the server into HTTP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    /// The request cannot work as asked (bad value, ability the back end lacks).
    BadRequest,
    NotFound,
    /// The sandbox's state does not allow it now.
    Conflict,
    /// Something the runtime needs is missing or not working; it may work later or elsewhere.
    Unavailable,
    /// The host has no room: slots, memory, sandboxes.
    Exhausted,
    /// The host's disk is full.
    StorageFull,
    /// A bug or an unexpected state; the full chain goes to the log.
    Internal,
}

/// Errors of a back end. Messages never repeat their `#[source]`; [`chain`] joins both.
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
    /// The back end cannot do this (see [`Capabilities`]).
    #[error("not supported: {0}")]
    Unsupported(String),
    /// The sandbox's state does not allow the operation now.
    #[error("{0}")]
    Conflict(String),
    /// Something the runtime needs did not work: a QEMU that would not start, an agent that
    /// never answered, a template that does not boot.
    #[error("{what}")]
    Unavailable {
        what: String,
        #[source]
        source: Option<Cause>,
    },
    /// A host I/O failure while doing `what` (a full disk is [`Category::StorageFull`]).
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// Anything else: a bug or an unexpected state.
    #[error("{0}")]
    Failed(String),
}

impl RuntimeError {
    /// `what` failed because of `source`, which may work later.
    pub fn unavailable(what: impl Into<String>, source: impl Into<Cause>) -> Self {
        Self::Unavailable {
            what: what.into(),
            source: Some(source.into()),
        }
    }

    /// `what` cannot work on this host now, for a reason the message says.
    pub fn unavailable_now(what: impl Into<String>) -> Self {
        Self::Unavailable {
            what: what.into(),
            source: None,
        }
    }

    /// An I/O failure while doing `what`.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| Self::Io { what, source }
    }

    pub fn category(&self) -> Category {
        match self {
            Self::UnknownTemplate(_) | Self::NotFound(_) => Category::NotFound,
            Self::InvalidArgument(_) | Self::Unsupported(_) => Category::BadRequest,
            Self::Conflict(_) => Category::Conflict,
            Self::Exhausted(_) => Category::Exhausted,
            Self::Unavailable { .. } => Category::Unavailable,
            Self::Io { source, .. } if source.kind() == std::io::ErrorKind::StorageFull => {
                Category::StorageFull
            }
            Self::Io { .. } | Self::Failed(_) => Category::Internal,
        }
    }
}

/// `e` and every cause under it, as one line: what the client reads and the log keeps.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        // Some causes repeat the message they wrap; say each thing once.
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

/// How a runtime's network slots are used now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotStats {
    /// Made ahead and waiting for a sandbox.
    pub ready: usize,
    /// Held by sandboxes.
    pub in_use: usize,
    /// Being made.
    pub creating: usize,
    /// Out of circulation after a failure.
    pub broken: usize,
    /// How many the pool keeps ready.
    pub target: usize,
}

/// A runtime's sandboxes prepared ahead of creates (see [`SandboxRuntime::reserve_prepared`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PreparedStats {
    /// Started and waiting for a create.
    pub ready: usize,
    /// Handed to a create that has not claimed it yet.
    pub reserved: usize,
    /// How many the runtime keeps ready now (recent demand, bounded by memory).
    pub target: usize,
    /// Memory the waiting ones use (their cgroups' charge): the pool's idle cost.
    pub memory_bytes: u64,
}

#[async_trait::async_trait]
pub trait SandboxRuntime: Send + Sync + 'static {
    /// Short name of the back end (`ns`, `vm`).
    fn name(&self) -> &'static str;
    fn capabilities(&self) -> Capabilities;
    /// Free space of the filesystem saved state goes to, when the back end can tell; the
    /// control plane refuses new pauses and snapshots when it runs low.
    fn headroom(&self) -> Option<Headroom> {
        None
    }
    /// Notified when a sandbox may have ended on its own (a process the back end started
    /// exited), so the control plane asks [`Self::status`] at once instead of at its next
    /// poll. A back end without it is polled only.
    fn exit_signal(&self) -> Option<std::sync::Arc<tokio::sync::Notify>> {
        None
    }
    /// Makes template `name` ready for creates before the server takes requests: its image
    /// built and mounted (minutes the very first time), and what the back end starts from
    /// (the vm runtime's boot snapshot, its warm pool). Called after [`Self::reattach`], which
    /// must see the previous run's state first. `UnknownTemplate` for a name it cannot build.
    async fn prepare_template(&self, name: &str) -> Result<(), RuntimeError> {
        let _ = name;
        Ok(())
    }

    /// Keeps `size` sandboxes of `template` prepared ahead of creates (0 empties the pool), so
    /// that a create only claims one. Back ends without a pool refuse.
    async fn set_warm_pool(&self, template: &str, size: usize) -> Result<(), RuntimeError> {
        let _ = (template, size);
        Err(RuntimeError::Unsupported(format!(
            "the {} runtime has no warm pool",
            self.name()
        )))
    }

    /// A sandbox of `template` the runtime has prepared ahead (started and waiting for its
    /// tenant), now reserved for the caller's create: a [`Self::create`] whose spec carries it
    /// ([`CreateSpec::reservation`]) claims it instead of starting one. `None` when none is
    /// ready; the caller then picks a fresh id ([`SandboxId::generate`]). A reservation that no
    /// create claims within a minute is discarded.
    async fn reserve_prepared(&self, template: &str) -> Option<Reservation> {
        let _ = template;
        None
    }

    /// Template image `name` is going away (its template was deleted): drop what the
    /// runtime keeps of it ahead of creates.
    async fn forget_template(&self, name: &str) {
        let _ = name;
    }

    /// The sandboxes prepared ahead, where the runtime prepares them; for the server's gauges.
    fn prepared(&self) -> Option<PreparedStats> {
        None
    }

    /// The server is exiting: stop background work (warm pools, refills) and free what it
    /// held. Sandboxes keep running; the next start's [`Self::reattach`] takes them back.
    async fn stop(&self) {}

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

    /// Pauses a running sandbox. When it returns, everything the sandbox wrote is durable on
    /// the host's disk; the returned record replaces the stored one and is what `reattach`
    /// and `resume` get back.
    async fn pause(&self, id: &str, mode: PauseMode) -> Result<RuntimeSandbox, RuntimeError> {
        let _ = (id, mode);
        Err(RuntimeError::Unsupported(format!(
            "the {} runtime cannot pause sandboxes",
            self.name()
        )))
    }

    /// Resumes a paused sandbox. `spec` is the sandbox's create spec (with the current access
    /// token), needed when it starts afresh on its saved filesystem.
    async fn resume(&self, spec: CreateSpec) -> Result<(RuntimeSandbox, ResumeKind), RuntimeError> {
        Err(RuntimeError::Unsupported(format!(
            "the {} runtime cannot resume sandbox {}",
            self.name(),
            spec.id
        )))
    }

    /// Saves a running sandbox's state under `key` (letters, digits, `-`): with `memory` its
    /// memory and processes too, else its filesystem only. The sandbox keeps running. Durable
    /// when it returns; an existing snapshot with that key is replaced.
    async fn snapshot(
        &self,
        id: &str,
        key: &str,
        memory: bool,
    ) -> Result<SnapshotInfo, RuntimeError> {
        let _ = (id, key, memory);
        Err(RuntimeError::Unsupported(format!(
            "the {} runtime cannot take snapshots",
            self.name()
        )))
    }

    /// Writes sandbox `id`'s root filesystem (its template's image with everything the
    /// sandbox changed, without the agent) to `out` as an erofs image: what a template build
    /// keeps. The sandbox should be idle; it keeps running.
    async fn export_rootfs(&self, id: &str, out: &std::path::Path) -> Result<(), RuntimeError> {
        let _ = (id, out);
        Err(RuntimeError::Unsupported(format!(
            "the {} runtime cannot export a sandbox's filesystem (template builds need it)",
            self.name()
        )))
    }

    /// Replaces a running (or memory-paused) sandbox's egress policy; connections it no longer
    /// allows are cut. `policy` is complete (internet access folded in, see
    /// [`CreateSpec::egress_policy`]). The returned record replaces the stored one.
    async fn set_egress(
        &self,
        id: &str,
        policy: &egress::EgressPolicy,
    ) -> Result<RuntimeSandbox, RuntimeError> {
        let _ = policy;
        Err(RuntimeError::Unsupported(format!(
            "the {} runtime cannot change sandbox {id}'s egress policy",
            self.name()
        )))
    }

    /// Replaces a running (or memory-paused) sandbox's private-network peers: from now on it
    /// reaches exactly `peering.peers` at their addresses (connections to others are cut)
    /// and its DNS answers `peering.names`. Not kept across a server restart: the control
    /// plane applies it again.
    async fn set_peers(&self, id: &str, peering: &peers::Peering) -> Result<(), RuntimeError> {
        let _ = peering;
        Err(RuntimeError::Unsupported(format!(
            "the {} runtime has no private networks (sandbox {id})",
            self.name()
        )))
    }

    /// Sandbox `id`'s recent network decisions, oldest first (bounded; kept while the
    /// server runs, across pause and resume).
    async fn network_flows(&self, id: &str) -> Result<Vec<flows::Flow>, RuntimeError> {
        Err(RuntimeError::Unsupported(format!(
            "the {} runtime keeps no flow log (sandbox {id})",
            self.name()
        )))
    }

    /// What sandbox `id` has used so far, measured on the host (CPU time, memory in use);
    /// `None` for a sandbox that is not running here or a runtime that cannot tell.
    async fn usage(&self, id: &str) -> Option<Usage> {
        let _ = id;
        None
    }

    /// The host's network slots (one per live sandbox, some made ahead), where the runtime
    /// has them; for the server's gauges.
    fn slots(&self) -> Option<SlotStats> {
        None
    }

    /// What the host saw happen inside sandbox `id` (programs executed and their ends),
    /// after position `after` of the runtime's own journal for it, at most `limit` entries;
    /// `None` where the runtime does not watch (the `vm` runtime: its guest agent does, and
    /// its entries come with the agent's journal). Entries are in the agent's journal format
    /// with a `boot` of the runtime's own, so a reader keeps one cursor per source.
    async fn journal(
        &self,
        id: &str,
        after: u64,
        limit: usize,
    ) -> Option<warren_proto::journal::JournalPage> {
        let _ = (id, after, limit);
        None
    }

    /// Deletes a snapshot; deleting an unknown key is `NotFound`.
    async fn delete_snapshot(&self, key: &str) -> Result<(), RuntimeError> {
        Err(RuntimeError::NotFound(key.to_string()))
    }

    /// The keys of every snapshot this host holds (after a restart the control plane deletes
    /// those it has no record of, e.g. a fork's checkpoint when the server died mid-fork).
    async fn snapshot_keys(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Resources a sandbox has used, as the host accounts them (its cgroup).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU time of all its processes, living and ended, in microseconds.
    pub cpu_usec: Option<u64>,
    /// Memory in use now, in bytes.
    pub memory_bytes: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_carry_the_runtime_that_wrote_them() {
        let tagged = tag_record("vm", serde_json::json!({"pid": 7}));
        assert_eq!(record_runtime(&tagged), Some("vm"));
        assert_eq!(tagged["pid"], 7);
        assert_eq!(record_runtime(&serde_json::json!({"pid1": 1})), None);
    }

    #[test]
    fn errors_keep_their_cause_and_say_what_they_mean() {
        let full = std::io::Error::from(std::io::ErrorKind::StorageFull);
        let e = RuntimeError::io("save the layer of sandbox x")(full);
        assert_eq!(e.category(), Category::StorageFull);
        assert!(
            chain(&e).starts_with("save the layer of sandbox x: "),
            "{}",
            chain(&e)
        );
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert_eq!(RuntimeError::io("x")(denied).category(), Category::Internal);
        let qemu = RuntimeError::unavailable("start QEMU", "exec failed: No such file");
        assert_eq!(qemu.category(), Category::Unavailable);
        assert_eq!(chain(&qemu), "start QEMU: exec failed: No such file");
        assert_eq!(
            RuntimeError::UnknownTemplate("t".into()).category(),
            Category::NotFound
        );
        assert_eq!(
            RuntimeError::Conflict("paused".into()).category(),
            Category::Conflict
        );
    }
}

//! The settings of this host's sandbox manager, shared by both runtimes.

use std::path::PathBuf;
use std::time::Duration;

use warren_net::NetConfig;

/// Settings of the host manager.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// Persistent data: template images (`<data_dir>/images`).
    pub data_dir: PathBuf,
    /// Runtime state that dies with the host: per-sandbox directories.
    pub run_dir: PathBuf,
    /// Where template images are mounted (read-only, shared by every sandbox; kept mounted
    /// across server restarts).
    pub templates_dir: PathBuf,
    pub agent_bin: PathBuf,
    pub nsinit_bin: PathBuf,
    /// First host id of the ranges sandboxes get (each its own 65536 ids, none overlapping
    /// `/etc/subuid`/`/etc/subgid`; see `warren_runtime_ns::idrange`).
    pub id_base: u32,
    /// Parent cgroup of all sandboxes.
    pub cgroup_parent: String,
    pub net: NetConfig,
    /// How long a new sandbox's agent may take to answer.
    pub ready_timeout: Duration,
    /// Longest lifetime of a signed file URL (seconds from each request); URLs without an
    /// expiration are then refused. `None`: no limit, as upstream E2B.
    pub signed_url_max_age: Option<std::num::NonZeroU64>,
}

impl HostConfig {
    /// Defaults for a host whose persistent data lives in `data_dir`; helper binaries are
    /// looked up next to the running executable.
    pub fn new(data_dir: PathBuf) -> Self {
        let bin_dir = std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("/usr/local/bin"));
        Self {
            data_dir,
            run_dir: PathBuf::from("/run/warren"),
            templates_dir: PathBuf::from("/run/warren/templates"),
            agent_bin: bin_dir.join("warren-agent"),
            nsinit_bin: bin_dir.join("warren-nsinit"),
            // Above the ranges `useradd` hands out (100000 up to 600100000) and below 2^31.
            id_base: 1 << 30,
            cgroup_parent: "warren".into(),
            net: NetConfig::default(),
            ready_timeout: Duration::from_secs(30),
            signed_url_max_age: None,
        }
    }
}

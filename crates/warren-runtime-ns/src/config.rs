//! What the manager tells `warren-nsinit` about the sandbox it is to become.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Environment variable carrying the JSON-encoded [`InitConfig`].
pub const CONFIG_ENV: &str = "WARREN_NSINIT_CONFIG";
/// Descriptor on which the manager writes one byte once uid/gid maps and cgroups are in place,
/// followed by the agent's access token (possibly empty), then closes it.
pub const SYNC_FD: i32 = 3;
/// Descriptor on which nsinit reports progress lines to the manager (see [`Report`]).
pub const STATUS_FD: i32 = 4;

/// The sandbox's user namespace maps its ids 0..ID_COUNT onto the host's
/// `id_base..id_base+ID_COUNT`, so root inside is an unprivileged id outside.
pub const ID_COUNT: u32 = 65536;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InitConfig {
    /// Sandbox id; also its hostname.
    pub sandbox_id: String,
    /// Host directory owned by the manager; holds the mount points `lower`, `rw` and `root`.
    pub sandbox_dir: PathBuf,
    /// Bytes the sandbox may write to its root filesystem (size of the writable layer).
    pub writable_bytes: u64,
    /// The guest agent binary on the host, bind-mounted read-only into the sandbox.
    pub agent_bin: PathBuf,
    /// Arguments of the agent.
    pub agent_args: Vec<String>,
    /// Content of the sandbox's `/etc/resolv.conf`.
    pub resolv_conf: String,
    /// First host uid/gid of the sandbox's own id range. nsinit becomes this host uid before
    /// it creates the user namespace, so the kernel charges the sandbox's per-user counters
    /// (inotify instances, namespaces) to it rather than to host root.
    pub id_base: u32,
    /// How much of the confinement applies (see [`Confinement`]).
    #[serde(default)]
    pub confinement: Confinement,
    /// Let the sandbox create namespaces of its own (`clone`/`unshare` with `CLONE_NEW*`
    /// flags). Off by default: a new user namespace hands its creator every capability again.
    #[serde(default)]
    pub nested_namespaces: bool,
    /// Volumes, in mount order: the `i`th is mounted (by the manager, id-mapped, with its
    /// read-only and nosuid/nodev settings) at `vol/<i>` of `sandbox_dir`.
    #[serde(default)]
    pub volumes: Vec<InitVolume>,
    /// The manager bound an LXCFS mount at `lxcfs` of `sandbox_dir` (see [`crate::lxcfs`]):
    /// its files go over `/proc/meminfo` and the like, so the sandbox sees its own resources.
    #[serde(default)]
    pub lxcfs: bool,
}

/// Where one volume goes in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitVolume {
    /// Absolute and clean (the control plane checked it).
    pub path: String,
}

/// The sandbox's confinement.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Confinement {
    /// Allow-list seccomp profile, reduced capability bounding set.
    #[default]
    Full,
    /// The earlier confinement (a short seccomp deny-list, every capability in the user
    /// namespace). For measuring what confinement costs only: never for real tenants.
    Baseline,
}

impl std::str::FromStr for Confinement {
    type Err = String;

    /// `full` or `baseline`, as `warren serve --ns-confinement` takes it.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "full" => Ok(Confinement::Full),
            "baseline" => Ok(Confinement::Baseline),
            other => Err(format!("{other:?} is not a confinement (full or baseline)")),
        }
    }
}

/// Lines nsinit writes to [`STATUS_FD`]: `userns` once it created its user namespace (the
/// manager then writes the id maps), `pid <host pid>` once the sandbox's PID 1 exists, `ready`
/// just before PID 1 becomes the agent, or `error <message>`.
#[derive(Debug, PartialEq, Eq)]
pub enum Report {
    UserNs,
    Pid(u32),
    Ready,
    Error(String),
}

impl Report {
    pub fn parse(line: &str) -> Option<Report> {
        let line = line.trim_end();
        if line == "ready" {
            return Some(Report::Ready);
        }
        if line == "userns" {
            return Some(Report::UserNs);
        }
        if let Some(pid) = line.strip_prefix("pid ") {
            return pid.parse().ok().map(Report::Pid);
        }
        line.strip_prefix("error ")
            .map(|m| Report::Error(m.to_string()))
    }
}

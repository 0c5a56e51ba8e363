//! What the manager tells `warren-nsinit` about the sandbox it is to become.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Environment variable carrying the JSON-encoded [`InitConfig`].
pub const CONFIG_ENV: &str = "WARREN_NSINIT_CONFIG";
/// Descriptor on which the manager writes one byte once uid/gid maps and cgroups are in place.
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

//! One VM of this host: its QEMU process, files, cgroup and network slot, from the fork to
//! the teardown.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::qemu;
use crate::qmp::Qmp;
use crate::snapshot::{ForkSpec, Pending, Snapshot, SnapshotMeta, VmFiles};
use tokio::sync::watch;
use warren_host::cgroup::{Limits, SandboxCgroup};
use warren_net::Slot;
use warren_runtime::RuntimeError;

/// A VM's QEMU, started and waiting for its snapshot (warm) or already running.
pub struct Machine {
    /// Name of its directory and cgroup.
    pub name: String,
    pub dir: PathBuf,
    pub pid: u32,
    pub cgroup: SandboxCgroup,
    pub slot: std::sync::Mutex<Option<Slot>>,
    /// `Some(reason)` once QEMU has exited.
    pub exit: watch::Receiver<Option<String>>,
    pub qmp: Option<Arc<Qmp>>,
    /// What the VM was restored from (its command line), for checkpoints; `None` if its
    /// record was lost.
    pub source: Option<SnapshotMeta>,
    /// The user its QEMU runs as.
    pub run_as: Option<(u32, u32)>,
    pub allow_internet_access: bool,
}

/// File in a VM's directory (root's, 0700, which QEMU never sees) holding its agent's access
/// token (root only), which a
/// checkpoint needs so that the sandboxes started from it can be initialised.
const TOKEN_FILE: &str = "token";

/// Stores the access token of the VM in `dir` (or of a checkpoint) for [`read_token`].
pub fn write_token(dir: &Path, token: Option<&str>) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(TOKEN_FILE);
    let _ = std::fs::remove_file(&path);
    if let Some(token) = token {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?
            .write_all(token.as_bytes())?;
    }
    Ok(())
}

/// The token written by [`write_token`], if any.
pub fn read_token(dir: &Path) -> Option<String> {
    std::fs::read_to_string(dir.join(TOKEN_FILE))
        .ok()
        .filter(|t| !t.is_empty())
}

/// What a VM was restored from, as [`Pending::spawn`] recorded it in its directory.
pub fn read_source(dir: &Path) -> Option<SnapshotMeta> {
    let raw = std::fs::read(dir.join(crate::snapshot::SOURCE_META)).ok()?;
    serde_json::from_slice(&raw).ok()
}

/// Memory QEMU itself may use on top of the guest's RAM (cgroup limit).
const QEMU_OVERHEAD_MB: u64 = 256;

pub fn limits(memory_mb: u32, cpus: u32) -> Limits {
    Limits {
        cpu_millis: Some(cpus.max(1) * 1000),
        memory_bytes: Some((u64::from(memory_mb) + QEMU_OVERHEAD_MB) << 20),
        pids: Some(1024),
    }
}

/// Starts a fork's QEMU as `spec` says (in its slot's netns, laid out for a VM), in its own
/// cgroup `<cgroup_parent>/<name>`, waiting for the incoming snapshot. The returned pending
/// fork still has to be completed.
pub async fn spawn(
    snapshot: &Snapshot,
    spec: &ForkSpec,
    name: &str,
    cgroup_parent: &str,
) -> Result<(Pending, SandboxCgroup), RuntimeError> {
    let dir = &spec.dir;
    let cgroup = SandboxCgroup::create(
        cgroup_parent,
        name,
        limits(snapshot.meta.memory_mb, snapshot.meta.cpus),
    )
    .map_err(RuntimeError::io(format!("create the cgroup of {name}")))?;
    let pending = match Pending::spawn(snapshot, spec).await {
        Ok(p) => p,
        Err(e) => {
            let _ = cgroup.remove();
            return Err(crate::Error::runtime("start QEMU")(e));
        }
    };
    if let Some(pid) = pending.child.id() {
        if let Err(e) = cgroup.add(pid) {
            tracing::warn!(vm = name, error = %e, "could not move QEMU into its cgroup");
        }
        let _ = std::fs::write(dir.join(qemu::PID_FILE), pid.to_string());
    }
    Ok((pending, cgroup))
}

/// Why QEMU ended: its exit status, an OOM kill, the end of the guest console.
fn exit_reason(status: &str, cgroup: &SandboxCgroup, dir: &Path) -> String {
    let mut reason = format!("the VM's QEMU process exited ({status})");
    if cgroup.oom_kills() > 0 {
        reason.push_str(" (out of memory)");
    }
    let files = VmFiles::new(dir);
    let console = qemu::console_tail(&files.console, 15);
    let log = qemu::console_tail(&files.log, 5);
    // Both are the guest's (or QEMU's) text: escaped onto one line, so that it cannot forge
    // lines of the server's log or of anything the reason is copied into.
    if !log.trim().is_empty() {
        reason.push_str(&format!("; qemu: \"{}\"", qemu::escape(log.trim())));
    }
    if !console.trim().is_empty() {
        reason.push_str(&format!(
            "; guest console: \"{}\"",
            qemu::escape(console.trim())
        ));
    }
    reason
}

/// Watches a QEMU that is our child; `on_exit` runs once it has ended.
pub fn watch_child(
    mut child: tokio::process::Child,
    cgroup: SandboxCgroup,
    dir: PathBuf,
    on_exit: impl FnOnce() + Send + 'static,
) -> watch::Receiver<Option<String>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let status = match child.wait().await {
            Ok(s) => s.to_string(),
            Err(e) => format!("wait failed: {e}"),
        };
        let _ = tx.send(Some(exit_reason(&status, &cgroup, &dir)));
        on_exit();
    });
    rx
}

/// Watches a QEMU of an earlier server run (not our child): woken by its pidfd when it
/// exits; its pid is polled only where the kernel has no pidfds.
pub fn watch_pid(
    pid: u32,
    cgroup: SandboxCgroup,
    dir: PathBuf,
    on_exit: impl FnOnce() + Send + 'static,
) -> watch::Receiver<Option<String>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        wait_pid_exit(pid, &dir).await;
        let _ = tx.send(Some(exit_reason("status unknown", &cgroup, &dir)));
        on_exit();
    });
    rx
}

/// Returns once QEMU `pid` of VM directory `dir` is gone (or the pid is no longer that QEMU).
async fn wait_pid_exit(pid: u32, dir: &std::path::Path) {
    // The pidfd first, then the check: a pid reused after the check cannot be watched.
    let waited = match crate::pidfd::PidFd::open(pid) {
        Ok(fd) if qemu::is_our_qemu(pid, dir) => fd.exited().await,
        Ok(_) => return,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return,
        Err(e) => Err(e),
    };
    if let Err(e) = waited {
        tracing::warn!(pid, error = %e, "no pidfd for QEMU; polling its pid");
        while qemu::is_our_qemu(pid, dir) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Machine {
    /// The network decisions about this VM's slot go to sandbox `id`'s flow log.
    pub fn own_flows(&self, pool: Option<&warren_net::NetPool>, id: &str) {
        let slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(pool), Some(slot)) = (pool, slot.as_ref()) {
            pool.set_owner(slot, id);
        }
    }

    /// Where the host reaches its agent (none once the slot is released).
    pub fn agent(&self) -> Option<std::net::SocketAddr> {
        let slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        slot.as_ref()
            .map(|s| std::net::SocketAddr::V4(s.agent_endpoint()))
    }

    pub fn running(&self) -> bool {
        self.exit.borrow().is_none()
    }

    /// Kills QEMU (and anything else in its cgroup) and waits for the watcher to see it.
    pub async fn kill(&self) {
        if let (true, Some(qmp)) = (self.running(), &self.qmp) {
            // A clean quit closes QEMU's files in order; SIGKILL below covers a hung one.
            let _ = qmp
                .execute_timeout("quit", serde_json::json!({}), Duration::from_millis(500))
                .await;
        }
        if self.running() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let cg = self.cgroup.clone();
        let _ = tokio::task::spawn_blocking(move || cg.kill_all()).await;
        let mut exit = self.exit.clone();
        let _ = tokio::time::timeout(Duration::from_secs(10), exit.wait_for(|e| e.is_some())).await;
    }
}

/// Kills the processes of a VM directory left by an earlier run (warm VMs, VMs whose record
/// was lost) and removes the directory and cgroup.
pub fn remove_stale(dir: &Path, cgroup_parent: &str) {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    kill_recorded_qemu(dir);
    let cg = SandboxCgroup::at(cgroup_parent, &name);
    let _ = cg.kill_all();
    let _ = cg.remove();
    crate::snapshot::remove_vm_dir(dir);
}

/// Kills the QEMU whose pid `dir`'s pid file names, if that pid still runs `dir`'s QEMU.
pub fn kill_recorded_qemu(dir: &Path) {
    if let Some(pid) = std::fs::read_to_string(dir.join(qemu::PID_FILE))
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok())
    {
        if qemu::is_our_qemu(pid, dir) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

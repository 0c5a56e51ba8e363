//! Checkpoints of a running VM: its memory, device state and disk, written in the format of a
//! template snapshot ([`crate::snapshot::Snapshot`]), so that everything that restores a
//! template (forks, the warm path, private copy-on-write memory) restores a checkpoint too.
//!
//! A running VM's RAM is a private mapping (copy-on-write of the snapshot it came from), so
//! it cannot simply be left in a file as at a template boot. Instead:
//!
//! 1. the VM is stopped (QEMU flushes its disk caches on `stop`) and its qcow2 overlay is
//!    flattened into a self-contained `disk.qcow2` (`qemu-img convert`);
//! 2. a **helper QEMU** with the same devices, its RAM a *shared* file (`mem`) and `-S` (it
//!    never runs guest code), receives the VM over a local migration socket;
//! 3. the helper migrates with `x-ignore-shared` to `state` (device state only: the RAM already
//!    is in `mem`) and quits.
//!
//! The VM stays stopped when [`capture`] returns; the caller continues it (a snapshot) or
//! kills it (a pause). Making the directory durable and putting it in place is the caller's.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::error::{Error, Result};
use crate::qemu;
use crate::qmp::Qmp;
use crate::snapshot::VmFiles;
use crate::snapshot::{connect_spawned, create_overlay, set_capability, Snapshot, SnapshotMeta};

/// File name of a checkpoint's self-contained disk.
pub const DISK: &str = "disk.qcow2";

/// The helper's tap device: created in the VM's network namespace for the helper's lifetime
/// (a virtio-net device restores only onto a backend with the same offloads), never up.
const HELPER_TAP: &str = "wcap0";

/// How long a local migration of a stopped VM may take (RAM-sized copies on a busy host).
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(300);

/// Bytes per second: as fast as memory and the socket go.
const UNLIMITED_BANDWIDTH: u64 = 1 << 40;

/// What [`capture`] needs to know about the running VM.
#[derive(Debug, Clone)]
pub struct CaptureSpec {
    pub qemu: PathBuf,
    /// What the VM was restored from: its command line is rebuilt from this.
    pub source: SnapshotMeta,
    /// The VM's writable disk (its qcow2 overlay).
    pub disk: PathBuf,
    /// Whether the VM has a network device (then the helper gets a tap in `netns`).
    pub network: bool,
    pub netns: Option<PathBuf>,
    /// The user the VM's QEMU runs as; the helper runs as the same one.
    pub run_as: Option<(u32, u32)>,
    /// A scratch directory for the helper's sockets and logs (short path: socket names are
    /// limited to 108 bytes); removed afterwards.
    pub work: PathBuf,
    /// What becomes of the VM's memory.
    pub memory: Memory,
}

/// The forms a checkpoint's memory takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// Not captured: the disk only (a VM starts from it by booting).
    None,
    /// `mem` + `state`, through the helper: VMs restored from it map `mem` copy-on-write and
    /// share its pages (snapshots and forks).
    Shared,
    /// `ram`: the VM writes its own memory and device state in QEMU's `mapped-ram` format
    /// (pages at fixed offsets, zero pages left as holes). Restoring reads back only the pages
    /// in use into the new VM's own memory. Cheapest to write: for pauses.
    Saved,
}

/// File name of a [`Memory::Saved`] checkpoint's memory and device state.
pub const SAVED_RAM: &str = "ram";

/// Stops the VM behind `vm` and writes its checkpoint into `staging` (created; must not
/// exist): `disk.qcow2`, `meta.json`, and its memory as `spec.memory` says. On success the VM
/// stays stopped; on failure it is continued if it was running.
pub async fn capture(vm: &Qmp, spec: &CaptureSpec, staging: &Path) -> Result<()> {
    let was_running = vm.status().await? == "running";
    vm.execute("stop", json!({})).await?;
    let result = write(vm, spec, staging).await;
    let _ = std::fs::remove_dir_all(&spec.work);
    if result.is_err() && was_running {
        // A failed outgoing migration leaves the VM paused, a completed one "postmigrate"
        // with its disks handed over: `cont` takes both back.
        if let Err(e) = vm.execute("cont", json!({})).await {
            tracing::warn!(error = %e, "could not continue the VM after a failed checkpoint");
        }
    }
    result
}

async fn write(vm: &Qmp, spec: &CaptureSpec, staging: &Path) -> Result<()> {
    let started = Instant::now();
    std::fs::create_dir_all(staging).map_err(Error::io("create", staging))?;
    let disk = staging.join(DISK);
    let out = tokio::process::Command::new("qemu-img")
        // -U: QEMU still holds the image (stopped, its caches flushed).
        .args(["convert", "-U", "-q", "-f", "qcow2", "-O", "qcow2"])
        .arg(&spec.disk)
        .arg(&disk)
        .output()
        .await
        .map_err(Error::io("run qemu-img convert for", &disk))?;
    if !out.status.success() {
        return Err(Error::Command {
            command: format!("qemu-img convert {}", spec.disk.display()),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    let meta =
        serde_json::to_vec_pretty(&spec.source).map_err(|e| Error::Invalid(e.to_string()))?;
    let meta_path = staging.join("meta.json");
    std::fs::write(&meta_path, meta).map_err(Error::io("write", &meta_path))?;
    let disk_ms = started.elapsed().as_millis() as u64;
    match spec.memory {
        Memory::None => {}
        Memory::Shared => shared_memory(vm, spec, staging).await?,
        Memory::Saved => saved_memory(vm, spec, staging).await?,
    }
    tracing::debug!(
        disk_ms,
        total_ms = started.elapsed().as_millis() as u64,
        memory = ?spec.memory,
        "checkpoint captured"
    );
    // Forks of the checkpoint run as other users: they read these files, nobody writes them.
    for name in ["mem", "state", SAVED_RAM, DISK, "meta.json"] {
        let p = staging.join(name);
        if p.exists() {
            std::os::unix::fs::lchown(&p, Some(0), Some(0)).map_err(Error::io("chown", &p))?;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o444))
                .map_err(Error::io("chmod", &p))?;
        }
    }
    Ok(())
}

/// Creates `path` empty for QEMU running as `run_as` to write (the directory stays root's, so
/// nothing else can appear there).
fn writable_by(path: &Path, len: u64, run_as: Option<(u32, u32)>) -> Result<()> {
    let f = std::fs::File::create(path).map_err(Error::io("create", path))?;
    f.set_len(len).map_err(Error::io("size", path))?;
    if let Some((uid, gid)) = run_as {
        std::os::unix::fs::lchown(path, Some(uid), Some(gid)).map_err(Error::io("chown", path))?;
    }
    Ok(())
}

/// [`Memory::Saved`]: the stopped VM migrates to a `mapped-ram` file itself.
async fn saved_memory(vm: &Qmp, spec: &CaptureSpec, staging: &Path) -> Result<()> {
    let ram = staging.join(SAVED_RAM);
    writable_by(&ram, 0, spec.run_as)?;
    set_capability(vm, "x-ignore-shared", false).await?;
    set_capability(vm, "mapped-ram", true).await?;
    vm.execute(
        "migrate-set-parameters",
        json!({ "max-bandwidth": UNLIMITED_BANDWIDTH }),
    )
    .await?;
    vm.execute(
        "migrate",
        json!({ "uri": format!("file:{}", ram.display()) }),
    )
    .await?;
    vm.wait_migration(MIGRATION_TIMEOUT).await
}

/// Steps 2 and 3 of [`Memory::Shared`]: the helper QEMU receives the stopped VM and writes
/// `mem` and `state`.
async fn shared_memory(vm: &Qmp, spec: &CaptureSpec, staging: &Path) -> Result<()> {
    let _ = std::fs::remove_dir_all(&spec.work);
    std::fs::create_dir_all(&spec.work).map_err(Error::io("create", &spec.work))?;
    let overlay = spec.work.join("disk.qcow2");
    create_overlay(&staging.join(DISK), "qcow2", &overlay)?;
    // The helper may write only its two output files and its scratch directory.
    let (mem, state) = (staging.join("mem"), staging.join("state"));
    writable_by(&mem, u64::from(spec.source.memory_mb) << 20, spec.run_as)?;
    writable_by(&state, 0, spec.run_as)?;
    if let Some((uid, gid)) = spec.run_as {
        for p in [&spec.work, &overlay] {
            std::os::unix::fs::lchown(p, Some(uid), Some(gid)).map_err(Error::io("chown", p))?;
        }
    }
    let files = VmFiles::new(&spec.work);
    let source = Snapshot {
        dir: staging.to_path_buf(),
        meta: spec.source.clone(),
    };
    let tap = spec.network.then(|| HELPER_TAP.to_string());
    let mut cfg = source.config(overlay, "qcow2", &files, tap, true, &spec.qemu);
    cfg.incoming = true;
    cfg.run_as = spec.run_as;
    cfg.extra = vec!["-S".into()];
    let started = Instant::now();
    let mut child = qemu::spawn(&cfg, spec.netns.as_deref(), &files.log)?;
    let result = async {
        let helper = connect_spawned(&mut child, &files).await?;
        let helper_ms = started.elapsed().as_millis() as u64;
        // Both ends of a migration must agree on its capabilities, and a fork turned
        // x-ignore-shared on for its own restore (its RAM is private: nothing is skipped).
        set_capability(vm, "x-ignore-shared", false).await?;
        // A VM restored from a saved checkpoint had mapped-ram on (files only).
        set_capability(vm, "mapped-ram", false).await?;
        // QEMU caps migrations at 128 MiB/s by default (to spare a live VM's network); this
        // one is a local copy of a stopped VM.
        vm.execute(
            "migrate-set-parameters",
            json!({ "max-bandwidth": UNLIMITED_BANDWIDTH }),
        )
        .await?;
        let uri = format!("unix:{}", spec.work.join("in.sock").display());
        helper
            .execute("migrate-incoming", json!({ "uri": uri }))
            .await?;
        vm.execute("migrate", json!({ "uri": uri })).await?;
        vm.wait_migration(MIGRATION_TIMEOUT).await?;
        wait_loaded(&helper, &mut child).await?;
        let migrated_ms = started.elapsed().as_millis() as u64;
        set_capability(&helper, "x-ignore-shared", true).await?;
        helper
            .execute(
                "migrate",
                json!({ "uri": format!("file:{}", state.display()) }),
            )
            .await?;
        helper.wait_migration(MIGRATION_TIMEOUT).await?;
        tracing::debug!(
            helper_ms,
            migrated_ms,
            state_ms = started.elapsed().as_millis() as u64,
            "checkpoint memory written"
        );
        let _ = helper.execute("quit", json!({})).await;
        Ok::<(), Error>(())
    }
    .await;
    if tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .is_err()
    {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
    result.map_err(|e| match e {
        Error::VmDied { .. } => e,
        other => files.died(format!("checkpoint helper: {other}")),
    })
}

/// Waits until the helper has loaded the incoming VM (it then stays stopped: `-S`).
async fn wait_loaded(helper: &Qmp, child: &mut tokio::process::Child) -> Result<()> {
    let deadline = Instant::now() + MIGRATION_TIMEOUT;
    loop {
        match helper.status().await?.as_str() {
            "inmigrate" => {}
            "paused" | "prelaunch" | "postmigrate" => return Ok(()),
            other => return Err(Error::Invalid(format!("helper VM is {other}"))),
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(Error::Invalid(format!("helper QEMU exited ({status})")));
        }
        if Instant::now() > deadline {
            return Err(Error::QmpTimeout("incoming checkpoint".into()));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

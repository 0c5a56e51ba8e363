//! Checkpoints of a running VM: its disk, memory and device state on the host's disk.
//!
//! [`capture`] stops the VM (QEMU flushes its disk caches on `stop`), flattens its qcow2
//! overlay and everything below it into a self-contained `disk.qcow2` (`qemu-img convert`),
//! and has the VM migrate itself to [`SAVED_RAM`] in QEMU's `mapped-ram` format: pages at fixed
//! offsets, zero pages left out. A VM restored from that reads back only the pages in use into
//! RAM of its own: the form for a pause, restored once.
//!
//! [`share`] turns that into the format of a template snapshot ([`crate::snapshot::Snapshot`]:
//! `mem` + `state`), so that everything that restores a template (private copy-on-write
//! memory, shared pages) restores it too: the form for snapshots and forks. A running VM's RAM
//! is a private mapping and cannot simply be left in a file as at a template boot; instead a
//! **helper QEMU** with the same devices, its RAM a *shared* file and `-S` (it never runs guest
//! code), loads the saved pages and migrates with `x-ignore-shared` (device state only) to
//! `state`. The VM it came from may run again meanwhile.
//!
//! Making the directory durable and putting it in place is the caller's.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::error::{remove_tree, Error, Result};
use crate::qemu;
use crate::qmp::Qmp;
use crate::snapshot::{
    connect_spawned, create_overlay, qemu_jail, seal as seal_files, set_capability, virtual_size,
    Snapshot, SnapshotMeta, VmFiles,
};

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
    /// The VM's writable disk (its qcow2 overlay), written by the guest's QEMU.
    pub disk: PathBuf,
    /// The only backing file that overlay may have (the link the manager made) and its
    /// format: the flattening follows this chain, never the one the overlay's header names.
    pub backing: PathBuf,
    pub backing_format: &'static str,
    /// The directory the VM's jail may write a checkpoint's memory into (its `out/`).
    pub outbox: PathBuf,
    /// Whether the VM has a network device (then the helper gets a tap in `netns`).
    pub network: bool,
    pub netns: Option<PathBuf>,
    /// The user the VM's QEMU runs as; the helper and the disk flattening run as the same
    /// one, jailed.
    pub run_as: Option<(u32, u32)>,
    /// A scratch directory for the helper's sockets, logs, overlay and pid file (short
    /// path: socket names are limited to 108 bytes); removed afterwards, and by the next
    /// start's sweep if the server died meanwhile.
    pub work: PathBuf,
    /// Capture memory and device state too (`false`: the disk only).
    pub memory: bool,
}

/// File name of a checkpoint's memory and device state as the VM wrote them, in QEMU's
/// `mapped-ram` format: every page at a fixed offset, zero pages left out as holes.
pub const SAVED_RAM: &str = "ram";

/// Stops the VM behind `vm` and writes its checkpoint into `staging` (created; must not
/// exist): `disk.qcow2`, `meta.json`, and with `spec.memory` its memory and device state as
/// [`SAVED_RAM`] (a VM restored from it reads back only the pages in use into RAM of its own).
/// On success the VM stays stopped; on failure it is continued if it was running.
pub async fn capture(vm: &Qmp, spec: &CaptureSpec, staging: &Path) -> Result<()> {
    let was_running = vm.status().await? == "running";
    vm.execute("stop", json!({})).await?;
    let result = write(vm, spec, staging).await;
    remove_tree(&spec.work).await;
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
    crate::snapshot::private_dir(staging)?;
    let disk = staging.join(DISK);
    crate::flatten::flatten(spec, &disk).await?;
    let meta =
        serde_json::to_vec_pretty(&spec.source).map_err(|e| Error::Invalid(e.to_string()))?;
    let meta_path = staging.join("meta.json");
    std::fs::write(&meta_path, meta).map_err(Error::io("write", &meta_path))?;
    let disk_ms = started.elapsed().as_millis() as u64;
    if spec.memory {
        saved_memory(vm, spec, staging).await?;
    }
    tracing::debug!(
        disk_ms,
        total_ms = started.elapsed().as_millis() as u64,
        memory = spec.memory,
        "checkpoint captured"
    );
    seal(staging)
}

/// Sealed 0400 root: forks of a checkpoint read its files through their jails' id-mapped
/// mounts; nobody writes them.
fn seal(staging: &Path) -> Result<()> {
    let names = ["mem", "state", SAVED_RAM, DISK, "meta.json"];
    seal_files(&names.map(|n| staging.join(n)))
}

/// Creates `path` empty (root's, 0600) for a jailed QEMU to write through its id-mapped mount.
fn writable(path: &Path, len: u64) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(Error::io("create", path))?;
    f.set_len(len).map_err(Error::io("size", path))
}

/// The stopped VM migrates itself to a `mapped-ram` file: into its jail's `out/` (the only
/// place it may write), then moved into the checkpoint (same filesystem).
async fn saved_memory(vm: &Qmp, spec: &CaptureSpec, staging: &Path) -> Result<()> {
    let ram = if spec.run_as.is_some() {
        spec.outbox.join(SAVED_RAM)
    } else {
        staging.join(SAVED_RAM)
    };
    writable(&ram, 0)?;
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
    vm.wait_migration(MIGRATION_TIMEOUT).await?;
    let dest = staging.join(SAVED_RAM);
    if ram != dest {
        std::fs::rename(&ram, &dest).map_err(Error::io("move into the checkpoint", &ram))?;
    }
    Ok(())
}

/// Turns the [`SAVED_RAM`] of a checkpoint in `staging` into the form of a template snapshot,
/// `mem` + `state`, so that many VMs restored from it map `mem` copy-on-write and share its
/// pages. A helper QEMU with the same devices, its RAM a *shared* file and `-S` (it never runs
/// guest code), loads the saved pages (only those in use: `mapped-ram`) and migrates with
/// `x-ignore-shared` to `state`. The VM it came from may run meanwhile.
pub async fn share(spec: &CaptureSpec, staging: &Path) -> Result<()> {
    let started = Instant::now();
    remove_tree(&spec.work).await;
    // Gone however this ends, the task dropped as the server stops included (the helper is
    // killed with its handle: `Lifetime::Transient`).
    let work = warren_host::durable::RemoveOnDrop::new(&spec.work);
    let result = run_helper(spec, staging).await;
    remove_tree(&spec.work).await;
    work.disarm();
    result?;
    let ram = staging.join(SAVED_RAM);
    std::fs::remove_file(&ram).map_err(Error::io("remove", &ram))?;
    tracing::debug!(
        share_ms = started.elapsed().as_millis() as u64,
        "checkpoint memory shared"
    );
    seal(staging)
}

async fn run_helper(spec: &CaptureSpec, staging: &Path) -> Result<()> {
    let files = VmFiles::new(&spec.work);
    files.create(None)?;
    let overlay = spec.work.join("disk.qcow2");
    create_overlay(&staging.join(DISK), "qcow2", &overlay).await?;
    // The helper may write only its two output files and its overlay.
    let (mem, state) = (staging.join("mem"), staging.join("state"));
    writable(&mem, u64::from(spec.source.memory_mb) << 20)?;
    writable(&state, 0)?;
    let source = Snapshot {
        dir: staging.to_path_buf(),
        meta: spec.source.clone(),
    };
    let tap = spec.network.then(|| HELPER_TAP.to_string());
    let mut cfg = source.config(overlay.clone(), "qcow2", &files, tap, true, &spec.qemu);
    cfg.incoming = true;
    cfg.extra = vec!["-S".into()];
    if let Some(user) = spec.run_as {
        let read = vec![staging.join(SAVED_RAM), staging.join(DISK)];
        let write = vec![overlay.clone(), mem.clone(), state.clone()];
        let bytes = virtual_size(&overlay);
        cfg.jail = Some(qemu_jail(
            &cfg,
            user,
            files.root.clone(),
            read,
            write,
            bytes,
        ));
    }
    let mut child = qemu::spawn(
        &cfg,
        spec.netns.as_deref(),
        &files.log,
        qemu::Lifetime::Transient,
    )?;
    // For the next start's sweep, should the server die before the helper does.
    if let Some(pid) = child.id() {
        let _ = std::fs::write(files.dir.join(qemu::PID_FILE), pid.to_string());
    }
    let result = async {
        let helper = connect_spawned(&mut child, &files).await?;
        set_capability(&helper, "mapped-ram", true).await?;
        let from = staging.join(SAVED_RAM);
        helper
            .execute(
                "migrate-incoming",
                json!({ "uri": format!("file:{}", from.display()) }),
            )
            .await?;
        wait_loaded(&helper, &mut child).await?;
        set_capability(&helper, "mapped-ram", false).await?;
        set_capability(&helper, "x-ignore-shared", true).await?;
        helper
            .execute(
                "migrate",
                json!({ "uri": format!("file:{}", state.display()) }),
            )
            .await?;
        helper.wait_migration(MIGRATION_TIMEOUT).await?;
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
    let deadline = tokio::time::Instant::now() + MIGRATION_TIMEOUT;
    // Subscribed before each status read: the load's MIGRATION `completed` event wakes it.
    let mut events = helper.events();
    let mut recheck = crate::qmp::RECHECK_FIRST;
    loop {
        match helper.status().await?.as_str() {
            "inmigrate" => {}
            "paused" | "prelaunch" | "postmigrate" => return Ok(()),
            other => return Err(Error::Invalid(format!("helper VM is {other}"))),
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(Error::Invalid(format!("helper QEMU exited ({status})")));
        }
        if tokio::time::Instant::now() > deadline {
            return Err(Error::QmpTimeout("incoming checkpoint".into()));
        }
        // The helper's exit is checked again after at most `recheck`.
        crate::qmp::next_event(&mut events, &["MIGRATION", "STOP"], deadline, recheck).await;
        recheck = (recheck * 2).min(crate::qmp::RECHECK_MAX);
    }
}

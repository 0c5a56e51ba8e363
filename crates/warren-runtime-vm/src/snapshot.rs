//! Template snapshots and the forks restored from them.
//!
//! **Snapshot** (once per template, accelerator, CPU model, kernel, agent and image): boot the
//! template with its RAM in a shared memory-backend file on tmpfs, wait until the guest agent
//! listens, `stop`, migrate with `x-ignore-shared` (only device state is written: the RAM
//! already is in the memory file), quit. What stays: `mem` (guest RAM), `state` (device
//! state), `disk.raw` (the writable disk as the guest left it) and `meta.json`.
//!
//! **Fork** (every create): a qcow2 overlay on `disk.raw`, a new QEMU with the same command
//! line plus `-incoming defer` and the memory file mapped private (copy-on-write), then
//! `migrate-incoming` from `state` and `cont`. No kernel boots. [`Pending`] is the first half
//! (QEMU up and waiting), so a pool can keep some ready.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::accel::Accel;
use crate::error::{remove_tree, run, run_async, Error, Result};
use crate::qemu::{self, VmConfig};
use crate::qmp::Qmp;
use warren_host::durable::blocking;

/// How long a VM booting from a disk-only checkpoint may take until its agent listens.
pub(crate) const COLD_BOOT_TIMEOUT: Duration = Duration::from_secs(180);

/// The console line the agent prints once it listens.
const AGENT_READY: &str = "agent listening";

/// What a template snapshot is made from.
#[derive(Debug, Clone)]
pub struct TemplateSpec {
    pub qemu: PathBuf,
    pub accel: Accel,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub append: String,
    pub root_image: PathBuf,
    pub agent_bin: PathBuf,
    pub memory_mb: u32,
    pub cpus: u32,
    /// Size of the guest's writable disk (ext4).
    pub disk_mb: u32,
    /// Tap device for the template boot (the network device must exist as in every fork).
    pub tap: Option<String>,
    pub netns: Option<PathBuf>,
    pub boot_timeout: Duration,
    /// Boot jailed as this uid:gid (see [`crate::jail`]); `None`: as the caller (root).
    pub run_as: Option<(u32, u32)>,
}

/// Recorded next to a snapshot.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotMeta {
    pub key: String,
    pub accel: Accel,
    pub cpu: String,
    pub memory_mb: u32,
    pub cpus: u32,
    pub append: String,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub root_image: PathBuf,
    /// Cold boot to a listening agent, in milliseconds.
    pub boot_ms: u64,
    /// From a listening agent to the template's service being ready (the `prepare` step of
    /// [`create`]), in milliseconds; 0 when the template has no service.
    #[serde(default)]
    pub prepare_ms: u64,
}

/// A finished snapshot in `dir`.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub dir: PathBuf,
    pub meta: SnapshotMeta,
}

impl Snapshot {
    pub fn mem(&self) -> PathBuf {
        self.dir.join("mem")
    }
    pub fn state(&self) -> PathBuf {
        self.dir.join("state")
    }
    /// The writable disk as the guest left it: `disk.raw` for a template snapshot,
    /// `disk.qcow2` (self-contained) for a checkpoint of a running VM.
    pub fn disk(&self) -> PathBuf {
        let qcow2 = self.dir.join(crate::checkpoint::DISK);
        if qcow2.exists() {
            qcow2
        } else {
            self.dir.join("disk.raw")
        }
    }

    /// `raw` or `qcow2`, as [`Self::disk`] is.
    pub fn disk_format(&self) -> &'static str {
        if self.disk().extension().is_some_and(|e| e == "qcow2") {
            "qcow2"
        } else {
            "raw"
        }
    }

    /// A snapshot or checkpoint previously made in `dir` (they are renamed into place
    /// complete).
    pub fn open(dir: &Path) -> Option<Self> {
        let meta = std::fs::read(dir.join("meta.json")).ok()?;
        let meta: SnapshotMeta = serde_json::from_slice(&meta).ok()?;
        let s = Self {
            dir: dir.to_path_buf(),
            meta,
        };
        s.disk().exists().then_some(s)
    }

    /// Whether it holds memory and device state (a template snapshot or a checkpoint with
    /// memory); else only a disk, and a VM starts from it by booting.
    pub fn has_memory(&self) -> bool {
        self.shared_memory() || self.saved_ram().exists()
    }

    /// Memory in `mem` + `state` (mapped copy-on-write by the VMs restored from it), as
    /// opposed to a `mapped-ram` file read back into each VM's own memory.
    pub(crate) fn shared_memory(&self) -> bool {
        self.mem().exists() && self.state().exists()
    }

    /// A pause's memory and device state (see [`crate::checkpoint::Memory::Saved`]).
    pub fn saved_ram(&self) -> PathBuf {
        self.dir.join(crate::checkpoint::SAVED_RAM)
    }

    /// The command line of a VM restored from this snapshot (or, with `boot`, of the boot
    /// that makes it).
    pub(crate) fn config(
        &self,
        rw_disk: PathBuf,
        rw_format: &'static str,
        files: &VmFiles,
        tap: Option<String>,
        boot: bool,
        qemu: &Path,
    ) -> VmConfig {
        VmConfig {
            qemu: qemu.to_path_buf(),
            accel: self.meta.accel,
            memory_mb: self.meta.memory_mb,
            cpus: self.meta.cpus,
            kernel: self.meta.kernel.clone(),
            initrd: self.meta.initrd.clone(),
            append: self.meta.append.clone(),
            mem_file: Some(self.mem()),
            mem_shared: boot,
            root_image: self.meta.root_image.clone(),
            rw_disk,
            rw_format,
            tap,
            qmp_socket: files.qmp.clone(),
            console_log: files.console.clone(),
            incoming: !boot,
            jail: None,
            extra: Vec::new(),
        }
    }

    /// The command line of a fork with writable disk `rw_disk` (qcow2) and files in `files`
    /// (for callers that start QEMU themselves, e.g. a baseline measurement).
    pub fn fork_config(
        &self,
        qemu: &Path,
        rw_disk: PathBuf,
        files: &VmFiles,
        tap: Option<String>,
    ) -> VmConfig {
        self.config(rw_disk, "qcow2", files, tap, false, qemu)
    }
}

/// Per-VM files in a directory (root's, mode 0700): QMP socket, console log and QEMU's own
/// log (in `log/`), the jail's mount point (`root/`) and the directory QEMU writes a
/// checkpoint's memory into (`out/`).
#[derive(Debug, Clone)]
pub struct VmFiles {
    pub dir: PathBuf,
    pub qmp: PathBuf,
    pub console: PathBuf,
    pub log: PathBuf,
    pub root: PathBuf,
    pub out: PathBuf,
}

/// Size of the tmpfs a fork's console and QEMU log live on: a guest that floods its console
/// fills this, not the host's disk.
pub const LOG_CAP_BYTES: u64 = 2 << 20;

impl VmFiles {
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            qmp: dir.join("qmp.sock"),
            console: dir.join("log/console.log"),
            log: dir.join("log/qemu.log"),
            root: dir.join("root"),
            out: dir.join("out"),
        }
    }

    /// Creates the directories (root's, 0700); with `cap`, the log directory is a tmpfs of
    /// that size.
    pub fn create(&self, cap: Option<u64>) -> Result<()> {
        for d in [&self.dir, &self.dir.join("log"), &self.root, &self.out] {
            private_dir(d)?;
        }
        if let Some(bytes) = cap {
            let logs = self.dir.join("log");
            nix::mount::mount(
                Some("warren-vmlog"),
                &logs,
                Some("tmpfs"),
                nix::mount::MsFlags::MS_NOSUID
                    | nix::mount::MsFlags::MS_NODEV
                    | nix::mount::MsFlags::MS_NOEXEC,
                Some(format!("size={bytes},nr_inodes=64,mode=0700").as_str()),
            )
            .map_err(|e| Error::io("mount a tmpfs on", &logs)(e.into()))?;
        }
        Ok(())
    }

    /// Why a VM is gone, with the end of its console and QEMU log (escaped, each line
    /// prefixed: the guest wrote them).
    pub fn died(&self, reason: String) -> Error {
        let quote = |text: String| {
            text.lines()
                .map(|l| format!("| {}", qemu::escape(l)))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let mut console = quote(qemu::console_tail(&self.console, 30));
        let log = quote(qemu::console_tail(&self.log, 10));
        if !log.is_empty() {
            console.push_str("\n--- qemu ---\n");
            console.push_str(&log);
        }
        Error::VmDied { reason, console }
    }
}

/// Creates `dir` (and its parents) with mode 0700.
pub fn private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).map_err(Error::io("create", dir))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(Error::io("chmod", dir))
}

/// Removes a VM directory made with [`VmFiles::create`] (its log tmpfs first).
pub fn remove_vm_dir(dir: &Path) {
    let _ = nix::mount::umount2(&dir.join("log"), nix::mount::MntFlags::MNT_DETACH);
    let _ = std::fs::remove_dir_all(dir);
}

/// Virtual size of a disk image the manager made (raw: its length; qcow2: its header's).
pub(crate) fn virtual_size(path: &Path) -> u64 {
    use std::io::Read;
    let mut head = [0u8; 32];
    let Ok(mut f) = std::fs::File::open(path) else {
        return 0;
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if f.read_exact(&mut head).is_ok() && head[..4] == *b"QFI\xfb" {
        return u64::from_be_bytes(head[24..32].try_into().unwrap_or_default());
    }
    len
}

/// The jail of a QEMU that runs `cfg` as `uid:gid`: its kernel, initramfs and image, `read`
/// and `write`, `/dev/kvm` under KVM; files up to the larger of its RAM and `disk_bytes`.
pub(crate) fn qemu_jail(
    cfg: &VmConfig,
    (uid, gid): (u32, u32),
    root: PathBuf,
    mut read: Vec<PathBuf>,
    write: Vec<PathBuf>,
    disk_bytes: u64,
) -> crate::jail::Jail {
    read.extend([
        cfg.kernel.clone(),
        cfg.initrd.clone(),
        cfg.root_image.clone(),
    ]);
    let mut devices = Vec::new();
    let mut groups = Vec::new();
    if cfg.accel == Accel::Kvm {
        use std::os::unix::fs::MetadataExt;
        devices.push(PathBuf::from("/dev/kvm"));
        // With /dev/kvm group-accessible (0660 root:kvm), that group is QEMU's only one;
        // otherwise the jail's id-mapped bind of the device opens it.
        if let Ok(m) = std::fs::metadata("/dev/kvm") {
            if m.mode() & 0o060 == 0o060 && m.gid() != 0 {
                groups.push(m.gid());
            }
        }
    }
    let ram = u64::from(cfg.memory_mb) << 20;
    crate::jail::Jail {
        uid,
        gid,
        groups,
        root,
        read,
        write,
        devices,
        limits: crate::jail::Limits {
            nofile: 1024,
            nproc: 512,
            fsize: ram.max(disk_bytes) + (256 << 20),
        },
    }
}

/// Makes the files of a template snapshot or checkpoint root's and readable by root only:
/// the VMs restored from it read them through their jail's id-mapped mounts.
pub(crate) fn seal(paths: &[PathBuf]) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for p in paths.iter().filter(|p| p.exists()) {
        std::os::unix::fs::lchown(p, Some(0), Some(0)).map_err(Error::io("chown", p))?;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o400))
            .map_err(Error::io("chmod", p))?;
    }
    Ok(())
}

fn make_disk(spec: &TemplateSpec, staging: &Path, disk: &Path) -> Result<()> {
    let bin = staging.join("upper/usr/local/bin");
    std::fs::create_dir_all(&bin).map_err(Error::io("create", &bin))?;
    std::fs::create_dir_all(staging.join("work")).map_err(Error::io("create", staging))?;
    let agent = bin.join("warren-agent");
    std::fs::copy(&spec.agent_bin, &agent).map_err(Error::io("copy the agent to", &agent))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755))
        .map_err(Error::io("chmod", &agent))?;
    for d in [
        "upper",
        "upper/usr",
        "upper/usr/local",
        "upper/usr/local/bin",
    ] {
        let p = staging.join(d);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))
            .map_err(Error::io("chmod", &p))?;
    }
    // The guest's filesystem shows the size asked for; the image is larger by ext4's own
    // structures. `-m 0`: no blocks kept for root, the disk is all the sandbox's.
    let shape = ["-m", "0"];
    let scratch = disk.parent().unwrap_or(Path::new("/tmp"));
    let bytes = warren_volume::ext4_image_bytes(scratch, u64::from(spec.disk_mb) << 20, &shape)
        .map_err(Error::io("size the disk", disk))?;
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .args(shape)
        .args([
            "-E",
            "lazy_itable_init=0,lazy_journal_init=0,root_owner=0:0",
            "-d",
        ])
        .arg(staging)
        .arg(disk)
        .arg(format!("{}k", bytes / 1024)))?;
    Ok(())
}

/// A cold-booted VM whose agent listens.
pub struct Booted {
    pub child: tokio::process::Child,
    pub qmp: Qmp,
    pub files: VmFiles,
    /// Process start to the agent listening.
    pub boot_ms: u64,
}

/// Cold-boots the template with its files (RAM, disk, sockets, logs) in `dir`, until the
/// guest agent listens. The VM is killed on failure.
pub async fn boot(spec: &TemplateSpec, dir: &Path) -> Result<Booted> {
    let files = VmFiles::new(dir);
    files.create(None)?;
    let staging = dir.join("staging");
    let disk = dir.join("disk.raw");
    // mkfs.ext4 takes seconds: it runs on the blocking pool.
    {
        let (spec, staging, disk) = (spec.clone(), staging.clone(), disk.clone());
        blocking(move || {
            let made = make_disk(&spec, &staging, &disk);
            let _ = std::fs::remove_dir_all(&staging);
            made
        })
        .await?;
    }
    let mut cfg = VmConfig {
        qemu: spec.qemu.clone(),
        accel: spec.accel,
        memory_mb: spec.memory_mb,
        cpus: spec.cpus,
        kernel: spec.kernel.clone(),
        initrd: spec.initrd.clone(),
        append: spec.append.clone(),
        mem_file: Some(dir.join("mem")),
        mem_shared: true,
        root_image: spec.root_image.clone(),
        rw_disk: disk,
        rw_format: "raw",
        tap: spec.tap.clone(),
        qmp_socket: files.qmp.clone(),
        console_log: files.console.clone(),
        incoming: false,
        jail: None,
        extra: Vec::new(),
    };
    if let Some(user) = spec.run_as {
        // It writes the memory file, the disk and (at the snapshot) `state`, all in `dir`.
        let write = vec![dir.to_path_buf()];
        let disk_bytes = std::fs::metadata(&cfg.rw_disk)
            .map_err(Error::io("stat", &cfg.rw_disk))?
            .len();
        cfg.jail = Some(qemu_jail(
            &cfg,
            user,
            files.root.clone(),
            vec![],
            write,
            disk_bytes,
        ));
    }
    let started = Instant::now();
    let mut child = qemu::spawn(
        &cfg,
        spec.netns.as_deref(),
        &files.log,
        qemu::Lifetime::Transient,
    )?;
    let result = async {
        let qmp = Qmp::connect(&files.qmp, Duration::from_secs(10)).await?;
        wait_console(&files, &mut child, spec.boot_timeout).await?;
        Ok::<Qmp, Error>(qmp)
    }
    .await;
    match result {
        Ok(qmp) => Ok(Booted {
            child,
            qmp,
            boot_ms: started.elapsed().as_millis() as u64,
            files,
        }),
        Err(e) => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            Err(match e {
                Error::VmDied { .. } => e,
                other => files.died(other.to_string()),
            })
        }
    }
}

/// Boots the template once, runs `prepare` (which starts the template's service through the
/// agent and waits until it is ready, so that every fork restores a running service) and
/// snapshots it into `dir`. If another builder (another server, test or benchmark sharing
/// the data directory) made it meanwhile, returns that one and `prepare` never runs.
pub async fn create<F>(spec: &TemplateSpec, key: &str, dir: &Path, prepare: F) -> Result<Snapshot>
where
    F: std::future::Future<Output = std::result::Result<(), warren_runtime::RuntimeError>>,
{
    let _building = crate::cachelock::lock_async(dir).await?;
    if let Some(made) = Snapshot::open(dir) {
        return Ok(made);
    }
    let partial = dir.with_extension("partial");
    remove_tree(&partial).await;
    let Booted {
        mut child,
        qmp,
        files,
        boot_ms,
    } = boot(spec, &partial).await?;
    let prepared = Instant::now();
    if let Err(e) = prepare.await {
        let _ = child.start_kill();
        let _ = child.wait().await;
        let died = files.died(format!(
            "the template's service did not get ready: {}",
            warren_runtime::chain(&e)
        ));
        // Its memory file holds RAM on tmpfs; nothing retries this key by itself.
        remove_tree(&partial).await;
        return Err(died);
    }
    let prepare_ms = prepared.elapsed().as_millis() as u64;
    let snap = Snapshot {
        dir: partial.clone(),
        meta: SnapshotMeta {
            key: key.to_string(),
            accel: spec.accel,
            cpu: spec.accel.cpu_model().into(),
            memory_mb: spec.memory_mb,
            cpus: spec.cpus,
            append: spec.append.clone(),
            kernel: spec.kernel.clone(),
            initrd: spec.initrd.clone(),
            root_image: spec.root_image.clone(),
            boot_ms,
            prepare_ms,
        },
    };
    let result = async {
        qmp.execute("stop", json!({})).await?;
        set_ignore_shared(&qmp).await?;
        qmp.execute(
            "migrate",
            json!({ "uri": format!("file:{}", snap.state().display()) }),
        )
        .await?;
        qmp.wait_migration(Duration::from_secs(60)).await?;
        let _ = qmp.execute("quit", json!({})).await;
        Ok::<(), Error>(())
    }
    .await;
    if let Err(e) = result {
        let _ = child.start_kill();
        let _ = child.wait().await;
        return Err(files.died(e.to_string()));
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
    let _ = child.start_kill();
    let meta = serde_json::to_vec_pretty(&snap.meta).map_err(|e| Error::Invalid(e.to_string()))?;
    let dest = dir.to_path_buf();
    // Replacing an older snapshot deletes its files (RAM-sized): on the blocking pool.
    blocking(move || {
        // Forks read these files through their jails; nobody writes them.
        seal(&[snap.state(), snap.mem(), snap.disk()])?;
        std::fs::write(partial.join("meta.json"), meta).map_err(Error::io("write", &partial))?;
        seal(&[partial.join("meta.json")])?;
        let _ = std::fs::remove_file(&files.qmp);
        for d in [&files.root, &files.out] {
            let _ = std::fs::remove_dir(d);
        }
        let _ = std::fs::remove_dir_all(&dest);
        std::fs::rename(&partial, &dest).map_err(Error::io("rename to", &dest))?;
        Ok(Snapshot {
            dir: dest,
            meta: snap.meta,
        })
    })
    .await
}

pub(crate) async fn set_ignore_shared(qmp: &Qmp) -> Result<()> {
    set_capability(qmp, "x-ignore-shared", true).await
}

/// Sets one migration capability (both ends of a migration must agree on them).
pub(crate) async fn set_capability(qmp: &Qmp, capability: &str, on: bool) -> Result<()> {
    qmp.execute(
        "migrate-set-capabilities",
        json!({ "capabilities": [ { "capability": capability, "state": on } ] }),
    )
    .await
    .map(drop)
}

/// Waits until the console shows the agent listening; fails when QEMU exits first.
pub(crate) async fn wait_console(
    files: &VmFiles,
    child: &mut tokio::process::Child,
    timeout: Duration,
) -> Result<()> {
    crate::console::wait_for(files, child, AGENT_READY, timeout).await
}

pub use crate::restore::{ForkSpec, Pending, RestoreTimes, Restored, SOURCE_META};

/// A qcow2 overlay at `disk` on top of `backing` (`raw` or `qcow2`).
pub(crate) async fn create_overlay(backing: &Path, format: &str, disk: &Path) -> Result<()> {
    run_async(
        tokio::process::Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", format, "-b"])
            .arg(backing)
            .arg(disk),
    )
    .await?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(disk, std::fs::Permissions::from_mode(0o600))
        .map_err(Error::io("chmod", disk))
}

/// Connects to the QMP socket of a QEMU just started. Many QEMUs starting at once on a loaded
/// host (TCG) can take seconds to open it: wait generously, but stop at once if this one
/// exited. On failure QEMU is killed and the error carries its log.
pub(crate) async fn connect_spawned(
    child: &mut tokio::process::Child,
    files: &VmFiles,
) -> Result<Qmp> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let qmp = loop {
        match Qmp::connect(&files.qmp, Duration::from_secs(2)).await {
            Ok(q) => break Ok(q),
            Err(e) => {
                if let Ok(Some(status)) = child.try_wait() {
                    break Err(format!(
                        "QEMU exited ({status}) before answering on QMP: {e}"
                    ));
                }
                if Instant::now() >= deadline {
                    break Err(e.to_string());
                }
            }
        }
    };
    match qmp {
        Ok(q) => Ok(q),
        Err(e) => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            Err(files.died(e))
        }
    }
}

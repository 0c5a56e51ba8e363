//! The manager's side of a namespace sandbox: start, stop, and clean up after a crash.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use warren_types::SandboxId;

use nix::fcntl::OFlag;
use nix::mount::{mount, umount2, MntFlags, MsFlags};

use crate::config::{Confinement, InitConfig, Report, CONFIG_ENV, ID_COUNT, STATUS_FD, SYNC_FD};
use warren_host::cgroup::{self, Limits, SandboxCgroup};

/// Host-wide settings of the runtime.
#[derive(Debug, Clone)]
pub struct NsConfig {
    /// Directory of per-sandbox mount points and state (`<state_dir>/<id>/`).
    pub state_dir: PathBuf,
    /// Directory of the sandboxes' disks (see [`crate::disk`]), on the data disk and on the
    /// same filesystem as the saved pauses, which link their images.
    pub disk_dir: PathBuf,
    /// The `warren-nsinit` helper binary.
    pub nsinit_bin: PathBuf,
    /// The guest agent binary, bound into every sandbox.
    pub agent_bin: PathBuf,
    /// Parent cgroup of all sandboxes (relative to each hierarchy's root).
    pub cgroup_parent: String,
    /// How much confinement sandboxes get (full, except in benchmarks of the baseline).
    pub confinement: Confinement,
    /// The mount point of an LXCFS daemon that answers (see [`crate::lxcfs`]); `None`:
    /// sandboxes see the host's `/proc/meminfo` and the like.
    pub lxcfs: Option<PathBuf>,
}

/// One sandbox to start.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    pub id: String,
    /// Where the template image is mounted on the host (read-only, owned by host root).
    pub image_root: PathBuf,
    /// The network namespace to run in (e.g. `/run/netns/<slot>`).
    pub netns: PathBuf,
    pub resolv_conf: String,
    pub limits: Limits,
    /// The size of the sandbox's disk (its writable layer).
    pub writable_bytes: u64,
    pub agent_args: Vec<String>,
    /// A saved writable layer (see [`crate::layer`]) to start from instead of an empty one:
    /// how paused sandboxes resume from their files and snapshots become new sandboxes.
    pub seed: Option<Seed>,
    /// First host uid/gid of this sandbox's own id range (ids 0..65536 inside map onto
    /// `id_base..id_base+65536`); see [`crate::idrange`] for handing out disjoint ranges.
    pub id_base: u32,
    /// The token the agent requires on every request from its first one on.
    pub access_token: Option<String>,
    /// Let the sandbox create namespaces of its own (see [`InitConfig::nested_namespaces`]).
    pub nested_namespaces: bool,
    /// Volumes, in mount order: the host mounts each, id-mapped, at `vol/<i>` of the
    /// sandbox directory, and nsinit moves it to its path in the sandbox.
    pub volumes: Vec<warren_runtime::VolumeMount>,
}

/// A saved layer a sandbox starts from.
#[derive(Debug, Clone)]
pub struct Seed {
    /// The directory written by a pause or snapshot.
    pub dir: PathBuf,
    /// Take its disk image rather than copy it (a paused sandbox resuming; the pause's
    /// directory is removed once the sandbox runs).
    pub take: bool,
}

/// A started sandbox.
#[derive(Debug)]
pub struct Sandbox {
    pub id: String,
    /// Host pid of the sandbox's PID 1.
    pub pid1: u32,
    /// A pidfd of PID 1: its number alone may name a later process once it has ended (a
    /// `mount` of ours, whose exit is its own waiter's), so PID 1 is only waited for by this.
    pid1_fd: Option<OwnedFd>,
    pub cgroup: SandboxCgroup,
    pub dir: PathBuf,
    /// Its disk's image (see [`crate::disk`]).
    pub disk: PathBuf,
    /// First host id of the sandbox's id range.
    pub id_base: u32,
    /// The runtime's parent cgroup (for the accounting cgroups of [`crate::lxcfs`]).
    cgroup_parent: String,
    /// The `warren-nsinit` parent of PID 1 (absent after the manager restarted).
    shim: Option<tokio::process::Child>,
    /// The host's mount of the template it was made from, kept while the sandbox lives so
    /// later creates share it (and its page cache); absent after the manager restarted.
    image: Option<warren_host::TemplateRoot>,
}

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("invalid sandbox id {0:?}")]
    InvalidId(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("sandbox did not start: {0}")]
    Init(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LaunchError {
    let what = what.into();
    move |source| LaunchError::Io { what, source }
}

fn nix_io(what: &str) -> impl FnOnce(nix::errno::Errno) -> LaunchError + '_ {
    move |e| LaunchError::Io {
        what: what.to_string(),
        source: e.into(),
    }
}

/// Starts a sandbox and returns once its PID 1 is about to exec the agent.
pub async fn launch(cfg: &NsConfig, spec: &LaunchSpec) -> Result<Sandbox, LaunchError> {
    if !SandboxId::is_valid(&spec.id) {
        return Err(LaunchError::InvalidId(spec.id.clone()));
    }
    if let Some(entry) = crate::idrange::overlap(spec.id_base) {
        return Err(LaunchError::Init(format!(
            "host id range {}..+{ID_COUNT} overlaps the /etc/subuid or /etc/subgid entry {entry}",
            spec.id_base
        )));
    }
    let dir = cfg.state_dir.join(&spec.id);
    fs::create_dir_all(&dir).map_err(io(format!("create {}", dir.display())))?;
    // Only the manager and the sandbox's own ids (nsinit needs to pass through) may enter.
    nix::unistd::chown(&dir, None, Some(nix::unistd::Gid::from_raw(spec.id_base)))
        .map_err(nix_io("chown the sandbox directory"))?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o750))
        .map_err(io(format!("chmod {}", dir.display())))?;
    for sub in ["lower", "rw", "root"] {
        fs::create_dir_all(dir.join(sub))
            .map_err(io(format!("create {}", dir.join(sub).display())))?;
    }
    let cg = SandboxCgroup::create(&cfg.cgroup_parent, &spec.id, spec.limits)
        .map_err(io("create cgroup"))?;
    let image = crate::disk::image_path(&cfg.disk_dir, &spec.id);
    let started = match prepare_writable(cfg, spec, &dir, &image).await {
        Ok(()) => start(cfg, spec, &dir, cg.clone()).await,
        Err(e) => Err(e),
    };
    match started {
        Ok(sbx) => Ok(sbx),
        Err(e) => {
            // Killing waits for the processes to go, and the tree may be large.
            let (parent, id) = (cfg.cgroup_parent.clone(), spec.id.clone());
            let _ = tokio::task::spawn_blocking(move || {
                let _ = cg.kill_all();
                let _ = cg.remove();
                crate::lxcfs::remove_v1_accounting(&parent, &id);
                unmount_disk(&dir);
                let _ = crate::disk::remove(&image);
                let _ = remove_sandbox_dir(&dir);
            })
            .await;
            Err(e)
        }
    }
}

/// Makes and mounts the sandbox's disk (see [`crate::disk`]) on the host at `rw` (so the
/// manager can save it while the sandbox is frozen), filled from `spec.seed`. The sandbox's
/// mount namespace inherits it and builds its overlay on it; its root (the host's `id_base`)
/// owns the upper layer.
async fn prepare_writable(
    cfg: &NsConfig,
    spec: &LaunchSpec,
    dir: &Path,
    image: &Path,
) -> Result<(), LaunchError> {
    use crate::disk::{self, Source};
    let rw = dir.join("rw");
    // A seed saved before sandboxes had disks holds a directory tree instead of an image: it
    // is copied onto a blank disk.
    let (source, tree) = match &spec.seed {
        None => (Source::Blank, None),
        Some(seed) if seed.dir.join(disk::IMAGE).is_file() => {
            let saved = seed.dir.join(disk::IMAGE);
            // Files that change hands (another id range) are changed in place: never in the
            // paused sandbox's own image, which must stay as it was if this start fails.
            let same_ids = crate::layer::saved_id_base(&seed.dir).ok() == Some(spec.id_base);
            let source = if seed.take && same_ids {
                Source::Take(saved)
            } else {
                Source::Copy(saved)
            };
            (source, None)
        }
        Some(seed) => (Source::Blank, Some(seed.dir.clone())),
    };
    let (disk_dir, img, target, bytes) = (
        cfg.disk_dir.clone(),
        image.to_path_buf(),
        rw.clone(),
        spec.writable_bytes.max(MIN_DISK),
    );
    tokio::task::spawn_blocking(move || {
        disk::make(&disk_dir, &img, bytes, &source)?;
        disk::mount(&img, &target)
    })
    .await
    .map_err(|e| LaunchError::Init(format!("disk task: {e}")))?
    .map_err(io("make the sandbox's disk"))?;
    let owner = Some(nix::unistd::Uid::from_raw(spec.id_base));
    let group = Some(nix::unistd::Gid::from_raw(spec.id_base));
    // nsinit, as the sandbox's root, makes the overlay's work directory here.
    nix::unistd::chown(&rw, owner, group).map_err(nix_io("chown the sandbox's disk"))?;
    let _ = fs::remove_dir_all(rw.join("lost+found"));
    // The overlay's work directory is scratch space; an old one may belong to another range.
    let _ = fs::remove_dir_all(rw.join("work"));
    let upper = rw.join("upper");
    match (&spec.seed, tree) {
        (Some(_), Some(tree)) => crate::layer::restore(&tree, &upper, spec.id_base)
            .await
            .map_err(|e| LaunchError::Init(format!("restore the saved filesystem: {e}")))?,
        (Some(seed), None) => {
            let from = crate::layer::saved_id_base(&seed.dir)
                .map_err(|e| LaunchError::Init(format!("read the saved filesystem: {e}")))?;
            if from != spec.id_base {
                let (upper, to) = (upper.clone(), spec.id_base);
                tokio::task::spawn_blocking(move || crate::layer::shift_ids(&upper, from, to))
                    .await
                    .map_err(|e| LaunchError::Init(format!("id shift task: {e}")))?
                    .map_err(io("give the saved files the sandbox's ids"))?;
            }
        }
        (None, _) => fs::create_dir(&upper).map_err(io("create the upper layer"))?,
    }
    nix::unistd::chown(&upper, owner, group).map_err(nix_io("chown the upper layer"))?;
    Ok(())
}

/// The smallest disk a sandbox gets: room for ext4's own structures and a little more.
const MIN_DISK: u64 = 64 << 20;

/// Unmounts a sandbox's disk from the host. Its processes are gone by now, so the mount is
/// normally free and goes at once (and with it the loop device); a lazy unmount covers the
/// rest.
fn unmount_disk(dir: &Path) {
    let rw = dir.join("rw");
    if umount2(&rw, MntFlags::empty()).is_err() {
        let _ = umount2(&rw, MntFlags::MNT_DETACH);
    }
}

/// How long nsinit may take for each of its two steps (creating its user namespace; building
/// the sandbox up to the agent's exec).
const NSINIT_STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// Starts nsinit for the prepared sandbox directory and walks it through its handshake:
/// its user namespace gets the sandbox's id range, joins the cgroup and gets the image as its
/// lower layer, then the go byte and the token; returns once PID 1 is about to exec the agent.
async fn start(
    cfg: &NsConfig,
    spec: &LaunchSpec,
    dir: &Path,
    cg: SandboxCgroup,
) -> Result<Sandbox, LaunchError> {
    let init = InitConfig {
        sandbox_id: spec.id.clone(),
        sandbox_dir: dir.to_path_buf(),
        writable_bytes: spec.writable_bytes,
        agent_bin: stage_agent(cfg).await?,
        agent_args: spec.agent_args.clone(),
        resolv_conf: spec.resolv_conf.clone(),
        id_base: spec.id_base,
        confinement: cfg.confinement,
        nested_namespaces: spec.nested_namespaces,
        volumes: spec
            .volumes
            .iter()
            .map(|v| crate::config::InitVolume {
                path: v.path.clone(),
            })
            .collect(),
        lxcfs: cfg.lxcfs.is_some(),
    };
    write_boot_id(dir)?;
    let Spawned {
        shim,
        shim_pid,
        sync_w,
        status_r,
    } = spawn_nsinit(cfg, spec, dir, &init)?;
    let mut sbx = Sandbox {
        id: spec.id.clone(),
        pid1: 0,
        pid1_fd: None,
        cgroup: cg,
        dir: dir.to_path_buf(),
        disk: crate::disk::image_path(&cfg.disk_dir, &spec.id),
        id_base: spec.id_base,
        cgroup_parent: cfg.cgroup_parent.clone(),
        shim: Some(shim),
        image: None,
    };
    let reports = wait_for_user_ns(status_r).await?;
    enter_sandbox(cfg, spec, dir, shim_pid, &sbx.cgroup)?;
    // The go byte, then the token; closing the pipe ends the token.
    let mut go = b"1".to_vec();
    go.extend_from_slice(spec.access_token.as_deref().unwrap_or("").as_bytes());
    fs::File::from(sync_w)
        .write_all(&go)
        .map_err(io("signal nsinit"))?;
    let (pid1, result) = wait_for_ready(reports, dir).await?;
    sbx.pid1 = pid1.unwrap_or(0);
    sbx.pid1_fd = crate::reap::open_pidfd(sbx.pid1);
    result.map(|()| sbx)
}

/// A new boot id for this start of the sandbox (create, filesystem resume, fork), which
/// nsinit binds over `/proc/sys/kernel/random/boot_id` ([`crate::rootfs::BOOT_ID`]): every
/// start is a boot, as in a VM, where the host's id would never change. A frozen (memory)
/// pause is no new start and keeps it.
fn write_boot_id(dir: &Path) -> Result<(), LaunchError> {
    use std::os::unix::fs::PermissionsExt;
    let stage = dir.join(crate::rootfs::BOOT_ID_STAGE);
    fs::create_dir_all(&stage).map_err(io(format!("create {}", stage.display())))?;
    let path = dir.join(crate::rootfs::BOOT_ID);
    let _ = fs::remove_file(&path);
    fs::write(&path, format!("{}\n", uuid::Uuid::new_v4())).map_err(io("write the boot id"))?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o444)).map_err(io("chmod the boot id"))
}

/// The agent binary as sandboxes see it. Staging may copy the agent (and waits on a lock
/// while another launch copies it).
async fn stage_agent(cfg: &NsConfig) -> Result<PathBuf, LaunchError> {
    let cfg = cfg.clone();
    tokio::task::spawn_blocking(move || crate::stage::agent(&cfg))
        .await
        .map_err(|e| LaunchError::Init(e.to_string()))?
        .map_err(io("stage the agent binary"))
}

/// A started nsinit and our ends of its pipes.
struct Spawned {
    shim: tokio::process::Child,
    shim_pid: u32,
    /// The go byte and the token go here.
    sync_w: OwnedFd,
    /// nsinit's reports (see [`Report`]) come from here.
    status_r: OwnedFd,
}

/// Starts nsinit in the sandbox's network namespace with `init` as its configuration, its
/// pipes on [`SYNC_FD`] and [`STATUS_FD`] and its stderr in `nsinit.log`.
fn spawn_nsinit(
    cfg: &NsConfig,
    spec: &LaunchSpec,
    dir: &Path,
    init: &InitConfig,
) -> Result<Spawned, LaunchError> {
    let json = serde_json::to_string(init).map_err(|e| LaunchError::Init(e.to_string()))?;
    let netns: OwnedFd = fs::File::open(&spec.netns)
        .map_err(io(format!("open {}", spec.netns.display())))?
        .into();
    let (sync_r, sync_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(nix_io("pipe"))?;
    let (status_r, status_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(nix_io("pipe"))?;
    let log = fs::File::create(dir.join("nsinit.log")).map_err(io("create nsinit.log"))?;

    let mut cmd = tokio::process::Command::new(&cfg.nsinit_bin);
    cmd.env_clear()
        .env(CONFIG_ENV, json)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    let (sr, sw, nfd) = (sync_r.as_raw_fd(), status_w.as_raw_fd(), netns.as_raw_fd());
    // SAFETY: runs in the forked child before exec and makes only async-signal-safe system
    // calls (fcntl, dup2, setns, unshare) on descriptors that stay open until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            // Join the network namespace while still privileged on the host; nsinit creates
            // the user namespace itself. First: the namespace's descriptor may have one of the
            // fixed numbers the pipe ends move to below (a process with few open descriptors
            // hands out 3 and 4), and would be gone after the move.
            if libc::setns(nfd, libc::CLONE_NEWNET) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Move the pipe ends to fixed numbers, via high numbers so neither clobbers the other.
            let a = libc::fcntl(sr, libc::F_DUPFD_CLOEXEC, 10);
            let b = libc::fcntl(sw, libc::F_DUPFD_CLOEXEC, 10);
            if a < 0 || b < 0 || libc::dup2(a, SYNC_FD) < 0 || libc::dup2(b, STATUS_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let shim = cmd
        .spawn()
        .map_err(io(format!("start {}", cfg.nsinit_bin.display())))?;
    drop((sync_r, status_w, netns));
    let shim_pid = shim
        .id()
        .ok_or_else(|| LaunchError::Init("nsinit exited at once".into()))?;
    Ok(Spawned {
        shim,
        shim_pid,
        sync_w,
        status_r,
    })
}

/// Waits for nsinit's first report: its user namespace exists (and waits for its id map).
async fn wait_for_user_ns(status_r: OwnedFd) -> Result<BufReader<fs::File>, LaunchError> {
    let mut reports = BufReader::new(fs::File::from(status_r));
    let first = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        let r = reports.read_line(&mut line).map(|_| line);
        (reports, r)
    });
    let (reports, first) = tokio::time::timeout(NSINIT_STEP_TIMEOUT, first)
        .await
        .map_err(|_| LaunchError::Init("nsinit did not create its user namespace in time".into()))?
        .map_err(|e| LaunchError::Init(e.to_string()))?;
    match first.as_deref().ok().and_then(Report::parse) {
        Some(Report::UserNs) => Ok(reports),
        Some(Report::Error(m)) => Err(LaunchError::Init(m)),
        other => Err(LaunchError::Init(format!(
            "unexpected report from nsinit: {other:?}"
        ))),
    }
}

/// From the host, into nsinit's new user namespace: the sandbox's id range as its id maps,
/// the sandbox's cgroup, and the template image (host root's files shown as the sandbox's
/// root) as its lower layer.
fn enter_sandbox(
    cfg: &NsConfig,
    spec: &LaunchSpec,
    dir: &Path,
    shim_pid: u32,
    cgroup: &SandboxCgroup,
) -> Result<(), LaunchError> {
    let map = format!("0 {} {ID_COUNT}\n", spec.id_base);
    fs::write(format!("/proc/{shim_pid}/uid_map"), &map).map_err(io("write uid_map"))?;
    fs::write(format!("/proc/{shim_pid}/gid_map"), &map).map_err(io("write gid_map"))?;
    cgroup.add(shim_pid).map_err(io("join cgroup"))?;
    // Before nsinit creates its cgroup namespace, so these show as its root too.
    crate::lxcfs::join_v1_accounting(&cfg.cgroup_parent, &spec.id, shim_pid);
    if let Err(e) = crate::lxcfs::limit_affinity(shim_pid, spec.limits.cpu_millis) {
        tracing::warn!(sandbox = %spec.id, error = %e, "nproc will count the host's CPUs");
    }
    if let Some(lxcfs) = &cfg.lxcfs {
        // A plain bind, not recursive: nsinit needs the daemon's `proc` and `sys` files only.
        let staged = dir.join(crate::lxcfs::STAGED);
        fs::create_dir_all(&staged).map_err(io(format!("create {}", staged.display())))?;
        mount(
            Some(lxcfs),
            &staged,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(nix_io("bind the LXCFS mount"))?;
    }
    let userns: OwnedFd = fs::File::open(format!("/proc/{shim_pid}/ns/user"))
        .map_err(io("open the sandbox's user namespace"))?
        .into();
    crate::sys::idmapped_bind(&spec.image_root, &dir.join("lower"), &userns).map_err(io(
        format!("id-mapped mount of {}", spec.image_root.display()),
    ))?;
    // Volumes hold the ids the sandbox sees (0..65536), whoever wrote them: mapped through
    // this sandbox's namespace, its uid 1000 is the volume's 1000, as in every other sandbox
    // sharing the volume.
    for (i, v) in spec.volumes.iter().enumerate() {
        let target = volume_dir(dir, i);
        fs::create_dir_all(&target).map_err(io(format!("create {}", target.display())))?;
        crate::sys::idmapped_volume(
            &v.source,
            v.subpath.as_deref(),
            &target,
            &userns,
            v.read_only,
        )
        .map_err(io(format!("id-mapped mount of volume {}", v.volume_id)))?;
    }
    Ok(())
}

/// Where the host mounts a sandbox's `i`th volume before nsinit moves it into place.
pub(crate) fn volume_dir(dir: &Path, i: usize) -> PathBuf {
    dir.join("vol").join(i.to_string())
}

/// Detaches the host's copies of the image and volume mounts (the sandbox keeps its own).
fn detach_staging(dir: &Path) {
    let _ = umount2(&dir.join("lower"), MntFlags::MNT_DETACH);
    let _ = umount2(&dir.join(crate::lxcfs::STAGED), MntFlags::MNT_DETACH);
    if let Ok(entries) = fs::read_dir(dir.join("vol")) {
        for e in entries.flatten() {
            let _ = umount2(&e.path(), MntFlags::MNT_DETACH);
        }
    }
}

/// Removes the sandbox directory `dir` after [`detach_staging`]. The volume mount points go
/// first and one at a time (`rmdir` fails on a directory that is not empty): a volume still
/// mounted there must never be emptied by the recursive removal.
fn remove_sandbox_dir(dir: &Path) -> std::io::Result<()> {
    detach_staging(dir);
    // Alone and with rmdir for the same reason: a recursive removal through an LXCFS mount
    // still there would walk into its `cgroup/` tree, whose directories it removes on the host.
    match fs::remove_dir(dir.join(crate::lxcfs::STAGED)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    match fs::read_dir(dir.join("vol")) {
        Ok(entries) => {
            for e in entries {
                fs::remove_dir(e?.path())?;
            }
            fs::remove_dir(dir.join("vol"))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    fs::remove_dir_all(dir)
}

/// Waits for nsinit's remaining reports: PID 1's host pid, then `ready` (PID 1 is about to
/// exec the agent) or why it failed, with nsinit's log.
async fn wait_for_ready(
    reports: BufReader<fs::File>,
    dir: &Path,
) -> Result<(Option<u32>, Result<(), LaunchError>), LaunchError> {
    let reports = tokio::task::spawn_blocking(move || read_reports(reports));
    let outcome = tokio::time::timeout(NSINIT_STEP_TIMEOUT, reports).await;
    // The sandbox has its own copy of the image mount (its mount namespace is private by now,
    // or the start failed); the host's copy is no longer needed either way.
    detach_staging(dir);
    let (pid1, result) = match outcome {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Err(LaunchError::Init(format!("status reader: {e}"))),
        Err(_) => return Err(LaunchError::Init("timed out".into())),
    };
    let result = result.map_err(|msg| {
        let log = fs::read_to_string(dir.join("nsinit.log")).unwrap_or_default();
        LaunchError::Init(format!(
            "{msg}{}{}",
            if log.is_empty() { "" } else { "; log: " },
            log.trim()
        ))
    });
    Ok((pid1, result))
}

/// Reads nsinit's reports until `ready` or a failure.
fn read_reports(status: BufReader<fs::File>) -> (Option<u32>, Result<(), String>) {
    let mut pid = None;
    for line in status.lines() {
        match line.as_deref().ok().and_then(Report::parse) {
            Some(Report::Pid(p)) => pid = Some(p),
            Some(Report::Ready) => return (pid, Ok(())),
            Some(Report::Error(m)) => return (pid, Err(m)),
            Some(Report::UserNs) | None => {}
        }
    }
    (pid, Err("nsinit ended without reporting".into()))
}

impl Sandbox {
    /// A sandbox started by an earlier manager process, found again by id and PID 1.
    pub fn reattach(cfg: &NsConfig, id: &str, pid1: u32) -> Option<Sandbox> {
        let cgroup = SandboxCgroup::at(&cfg.cgroup_parent, id);
        if !cgroup.pids().contains(&pid1) {
            return None;
        }
        // The kernel's record of the range: the first line `0 <host id> <count>`.
        let map = fs::read_to_string(format!("/proc/{pid1}/uid_map")).ok()?;
        let id_base = map.split_whitespace().nth(1)?.parse().ok()?;
        Some(Sandbox {
            id: id.to_string(),
            pid1,
            pid1_fd: crate::reap::open_pidfd(pid1),
            cgroup,
            dir: cfg.state_dir.join(id),
            disk: crate::disk::image_path(&cfg.disk_dir, id),
            id_base,
            cgroup_parent: cfg.cgroup_parent.clone(),
            shim: None,
            image: None,
        })
    }

    /// Reaps PID 1 if it ended as the manager's child (its nsinit died first).
    pub fn reap_pid1_if_ours(&self) {
        if let Some(fd) = &self.pid1_fd {
            crate::reap::reap(fd);
        }
    }

    /// Keeps the host's mount of the sandbox's template while the sandbox lives.
    pub fn hold_image(&mut self, root: warren_host::TemplateRoot) {
        self.image = Some(root);
    }

    /// The upper directory of the sandbox's writable layer, as the host sees it: everything
    /// the sandbox changed relative to its image (overlayfs whiteouts mark deletions).
    pub fn upper_dir(&self) -> PathBuf {
        self.dir.join("rw").join("upper")
    }

    /// Where the host mounts the sandbox's disk.
    pub fn disk_mount(&self) -> PathBuf {
        self.dir.join("rw")
    }

    /// Whether PID 1 still runs.
    pub fn is_running(&self) -> bool {
        self.cgroup.pids().contains(&self.pid1)
    }

    /// How PID 1 ended (`exited N` / `signaled SIG`), once it has.
    pub fn exit_status(&self) -> Option<String> {
        // nsinit creates the file when it starts and fills it when PID 1 ends.
        fs::read_to_string(self.dir.join("exit-status"))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    }

    /// Kills everything in the sandbox and removes its cgroup and state. Idempotent.
    pub async fn destroy(mut self) -> Result<(), LaunchError> {
        let cg = self.cgroup.clone();
        tokio::task::spawn_blocking(move || cg.kill_all())
            .await
            .map_err(|e| LaunchError::Init(e.to_string()))?
            .map_err(io("kill the sandbox"))?;
        if let Some(mut shim) = self.shim.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), shim.wait()).await;
        }
        if let Some(fd) = self.pid1_fd.take() {
            tokio::task::spawn_blocking(move || {
                if !crate::reap::reap_orphaned(&fd) {
                    crate::reap::leave(fd);
                }
            })
            .await
            .map_err(|e| LaunchError::Init(e.to_string()))?;
        }
        // The cgroup's removal waits for it to empty; the tree may be large.
        let (cg, dir, disk, parent) = (
            self.cgroup.clone(),
            self.dir.clone(),
            self.disk.clone(),
            self.cgroup_parent.clone(),
        );
        tokio::task::spawn_blocking(move || remove_state(&parent, &cg, &dir, &disk))
            .await
            .map_err(|e| LaunchError::Init(e.to_string()))?
    }
}

fn remove_state(
    parent: &str,
    cg: &SandboxCgroup,
    dir: &Path,
    disk: &Path,
) -> Result<(), LaunchError> {
    cg.remove().map_err(io("remove cgroup"))?;
    if let Some(id) = dir.file_name() {
        crate::lxcfs::remove_v1_accounting(parent, &id.to_string_lossy());
    }
    // Unmount before deleting: removing files through the mount would only empty it.
    unmount_disk(dir);
    crate::disk::remove(disk).map_err(io(format!("remove {}", disk.display())))?;
    match remove_sandbox_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(LaunchError::Io {
            what: format!("remove {}", dir.display()),
            source: e,
        }),
    }
}

/// Removes one sandbox by id (processes, cgroup, state), e.g. one a restarted manager could not
/// take back. Idempotent.
pub fn remove_sandbox(cfg: &NsConfig, id: &str) -> Result<(), LaunchError> {
    if !SandboxId::is_valid(id) {
        return Err(LaunchError::InvalidId(id.to_string()));
    }
    let cg = SandboxCgroup::at(&cfg.cgroup_parent, id);
    cg.kill_all().map_err(io("kill the sandbox"))?;
    remove_state(
        &cfg.cgroup_parent,
        &cg,
        &cfg.state_dir.join(id),
        &crate::disk::image_path(&cfg.disk_dir, id),
    )
}

/// Removes every sandbox under this configuration that is not in `keep`: processes, cgroups,
/// mounts and state left by a crashed predecessor. Returns the ids removed.
pub fn cleanup_stale(cfg: &NsConfig, keep: &[String]) -> Vec<String> {
    let mut ids: Vec<String> = cgroup::children(&cfg.cgroup_parent);
    if let Ok(rd) = fs::read_dir(&cfg.state_dir) {
        ids.extend(
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned()),
        );
    }
    ids.sort();
    ids.dedup();
    ids.retain(|id| !keep.contains(id) && SandboxId::is_valid(id));
    for id in &ids {
        let cg = SandboxCgroup::at(&cfg.cgroup_parent, id);
        let _ = cg.kill_all();
        let disk = crate::disk::image_path(&cfg.disk_dir, id);
        if let Err(e) = remove_state(&cfg.cgroup_parent, &cg, &cfg.state_dir.join(id), &disk) {
            tracing::warn!(sandbox = %id, error = %e, "could not clean up a stale sandbox");
        }
    }
    // Disks whose sandbox left nothing else (a crash between making the disk and starting).
    for id in crate::disk::remove_unkept(&cfg.disk_dir, keep) {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

/// Removes the (empty) state directory and parent cgroups of this configuration, e.g. when a
/// manager shuts down for good. Fails if sandboxes still exist.
pub fn remove_empty_parents(cfg: &NsConfig) -> std::io::Result<()> {
    match fs::remove_dir(&cfg.state_dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    crate::disk::remove_cache(&cfg.disk_dir);
    match fs::remove_dir(&cfg.disk_dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    // The directory of every runtime's disks, if this was the last.
    if let Some(all) = cfg.disk_dir.parent().filter(|p| p.ends_with("disks")) {
        let _ = fs::remove_dir(all);
    }
    crate::stage::remove(cfg)?;
    crate::lxcfs::remove_v1_accounting(&cfg.cgroup_parent, "");
    cgroup::remove_parent(&cfg.cgroup_parent)
}

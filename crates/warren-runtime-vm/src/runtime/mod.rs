//! The microVM runtime: every sandbox is a QEMU `-M microvm` restored as a copy-on-write fork
//! of its template's snapshot (see docs/runtime-vm.md).
//!
//! [`VmRuntime`] mirrors `warren_runtime_ns::NsRuntime`: the same template images, the same pooled
//! network slots (laid out for a VM: `warren_net::Slot::lay_out_for_vm`), the same agent `/init`, and reattach
//! after a server restart (QEMUs outlive the server; their pid files and QMP sockets let the
//! next server take them back). A pool of QEMUs already waiting for their incoming snapshot
//! is kept per template, so a create pays only for the state load and the agent's `/init`.

mod egress;
mod fork;
mod machine;
mod nfs;
mod persist;
mod reattach;
mod snapshots;
pub mod uids;
mod warm;

pub use fork::STAGES_TARGET;

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::accel::{self, Detection};
use crate::snapshot::{Pending, Snapshot};
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, OnceCell};
use warren_host::cgroup::SandboxCgroup;
use warren_net::{NetPool, Slot, SlotPolicy};
use warren_runtime::{
    Capabilities, CreateSpec, Exit, PauseMode, ResumeKind, RuntimeError, RuntimeSandbox,
    SandboxRuntime, SnapshotInfo,
};

use machine::Machine;
use warren_host::{HostConfig, HostLock};

/// Settings of the VM runtime beyond [`HostConfig`].
#[derive(Debug, Clone)]
pub struct VmSettings {
    pub qemu: PathBuf,
    pub vminit_bin: PathBuf,
    pub agent_bin: PathBuf,
    /// The NFS helper that serves a VM's volumes (`warren-nfsd`, from `warren-nfs`).
    pub nfsd_bin: PathBuf,
    /// Guest RAM and vCPUs of the catalog templates' VMs (`base`, the code interpreter); a
    /// built template's VMs get the template's `memoryMB`/`cpuCount` (see [`Size`]).
    pub memory_mb: u32,
    pub cpus: u32,
    /// Size of the guest's writable disk.
    pub disk_mb: u32,
    /// QEMUs kept waiting for an incoming snapshot, per template.
    pub warm_pool: usize,
    /// Run every QEMU jailed as its own unprivileged user (`vm_uid_base` + slot index), under
    /// KVM too (see `crate::jail`). `false` (root, unjailed) is for measurements only.
    pub unprivileged: bool,
    pub vm_uid_base: u32,
    pub boot_timeout: Duration,
    /// The accelerator QEMU must use; `None`: KVM where it is truly usable, else TCG.
    pub accel: Option<crate::Accel>,
    /// The guest kernel package.
    pub kernel: crate::kernel::KernelPin,
}

impl VmSettings {
    /// Defaults: `warren-vminit` and `warren-nfsd` next to the agent binary, 512 MiB, 1 vCPU,
    /// 2 GiB disk, a warm pool of 2, the accelerator detected, the pinned kernel.
    pub fn new(host: &HostConfig) -> Self {
        Self {
            qemu: PathBuf::from("qemu-system-x86_64"),
            vminit_bin: host.agent_bin.with_file_name("warren-vminit"),
            nfsd_bin: host.agent_bin.with_file_name("warren-nfsd"),
            agent_bin: host.agent_bin.clone(),
            memory_mb: 512,
            cpus: 1,
            disk_mb: 2048,
            warm_pool: 2,
            boot_timeout: Duration::from_secs(180),
            unprivileged: true,
            vm_uid_base: 200_000,
            accel: None,
            kernel: Default::default(),
        }
    }
}

/// Guest RAM and vCPUs of a VM: fixed by the snapshot it is restored from, so every size of
/// a template has its own snapshot (and its own warm QEMUs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Size {
    pub memory_mb: u32,
    pub cpus: u32,
}

impl Size {
    /// The size of a VM restored from `snap`.
    fn of(snap: &Snapshot) -> Self {
        Self {
            memory_mb: snap.meta.memory_mb,
            cpus: snap.meta.cpus,
        }
    }
}

/// A template snapshot of one size, made once by whoever asks first.
type SnapshotCell = Arc<OnceCell<Arc<Snapshot>>>;

/// What the control plane persists per VM sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    pid: u32,
    #[serde(flatten)]
    net: warren_host::SlotRecord,
    /// The VM's directory name under `<data_dir>/vm/vms/<cgroup parent>-vm` (also its
    /// cgroup's name).
    name: String,
    /// Paused: no QEMU runs; its checkpoint is in `<data_dir>/vm-checkpoints/paused/<id>`.
    #[serde(default)]
    paused: bool,
}

/// A QEMU waiting for its snapshot, with its slot, ready to become a sandbox.
struct Warm {
    pending: Pending,
    slot: Slot,
    name: String,
    cgroup: SandboxCgroup,
}

/// Sandboxes as QEMU microVMs on this host.
pub struct VmRuntime {
    cfg: HostConfig,
    settings: VmSettings,
    accel: Detection,
    net: OnceCell<NetPool>,
    snapshots: Mutex<HashMap<(String, Size), SnapshotCell>>,
    live: Mutex<HashMap<String, Arc<Machine>>>,
    /// Paused sandboxes (their checkpoint is on disk, no QEMU runs).
    paused: Mutex<HashSet<String>>,
    warm: Mutex<HashMap<String, VecDeque<Warm>>>,
    refilling: Mutex<()>,
    /// Warm QEMUs to keep per template, where set (`set_warm_pool`); else the settings' size.
    warm_targets: std::sync::Mutex<HashMap<String, usize>>,
    /// The size of the last sandbox created per template: what its warm pool is filled with.
    warm_sizes: std::sync::Mutex<HashMap<String, Size>>,
    /// Set by `stop_warm`: refills still under way discard what they start.
    stopping: std::sync::atomic::AtomicBool,
    client: reqwest::Client,
    /// The key sealing the NFS helpers' file handles (see [`nfs::key_file`]).
    nfs_key: PathBuf,
    this: Weak<VmRuntime>,
    counter: AtomicU64,
    /// Notified when a VM's QEMU ended on its own (`SandboxRuntime::exit_signal`).
    exits: Arc<tokio::sync::Notify>,
    _lock: HostLock,
}

/// A bug or an unexpected state, in words (what is neither I/O nor a missing resource).
fn failed(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Failed(e.to_string())
}

/// Where this host's VM directories live: on the data disk (a guest's disk and logs must not
/// fill `/run`), one directory per runtime instance (named like its cgroups), so that
/// runtimes sharing a data directory never take each other's VMs for stale ones.
fn vms_dir(cfg: &HostConfig) -> PathBuf {
    cfg.data_dir
        .join("vm/vms")
        .join(format!("{}-vm", cfg.cgroup_parent))
}

impl VmRuntime {
    /// Prepares the runtime. Like `NsRuntime`, it holds the host lock; network slots and crash
    /// cleanup start with the first `reattach` (or create).
    pub async fn start(cfg: HostConfig, settings: VmSettings) -> Result<Arc<Self>, RuntimeError> {
        if !nix::unistd::geteuid().is_root() {
            return Err(RuntimeError::unavailable_now("the vm runtime needs root"));
        }
        for bin in [&settings.agent_bin, &settings.vminit_bin] {
            if !bin.exists() {
                return Err(RuntimeError::unavailable_now(format!(
                    "{} is missing (build the workspace: cargo build --release)",
                    bin.display()
                )));
            }
        }
        let accel = accel::choose(settings.accel);
        tracing::info!(accel = accel.accel.as_str(), reason = %accel.reason, "vm accelerator");
        if settings.unprivileged {
            let n = u32::try_from(cfg.net.pool_size).unwrap_or(u32::MAX);
            // Host configuration that clashes: this host cannot run VMs until it is fixed.
            uids::check_free(settings.vm_uid_base, n).map_err(RuntimeError::unavailable_now)?;
        }
        // VM directories (disks, logs) live on the data disk, root's alone: QEMU sees only
        // what its jail binds. The links to template disks stay next to the template
        // snapshots (hard links need the same filesystem).
        for d in [
            vms_dir(&cfg),
            cfg.data_dir.join("vm/capture"),
            cfg.run_dir.join("vm/links"),
        ] {
            crate::snapshot::private_dir(&d)
                .map_err(crate::Error::runtime("the vm runtime's directories"))?;
        }
        let lock = HostLock::acquire(&cfg.run_dir)?;
        let nfs_key = nfs::key_file(&cfg.data_dir).map_err(RuntimeError::io(
            "the NFS helpers' key (nfs.key in the data directory)",
        ))?;
        let client = reqwest::Client::builder()
            .no_proxy()
            .build()
            .map_err(|e| RuntimeError::unavailable("http client", e))?;
        Ok(Arc::new_cyclic(|this| Self {
            cfg,
            settings,
            accel,
            net: OnceCell::new(),
            snapshots: Mutex::new(HashMap::new()),
            live: Mutex::new(HashMap::new()),
            paused: Mutex::new(HashSet::new()),
            warm: Mutex::new(HashMap::new()),
            refilling: Mutex::new(()),
            warm_targets: std::sync::Mutex::new(HashMap::new()),
            warm_sizes: std::sync::Mutex::new(HashMap::new()),
            stopping: std::sync::atomic::AtomicBool::new(false),
            client,
            nfs_key,
            this: this.clone(),
            counter: AtomicU64::new(0),
            exits: Arc::new(tokio::sync::Notify::new()),
            _lock: lock,
        }))
    }

    /// The snapshot of `template`, made on first use (for tools that measure against it).
    pub async fn template_snapshot(&self, template: &str) -> Result<Arc<Snapshot>, RuntimeError> {
        self.snapshot(template, self.default_size()).await
    }

    /// The size of the catalog templates' VMs.
    fn default_size(&self) -> Size {
        Size {
            memory_mb: self.settings.memory_mb,
            cpus: self.settings.cpus,
        }
    }

    /// The size of `spec`'s VM: a built template's own (its `memoryMB` and `cpuCount`, which
    /// the control plane puts in every create of it, within the operator's limits), the
    /// settings' for the catalog templates.
    fn size_for(&self, spec: &CreateSpec) -> Size {
        if !warren_template::is_built_key(&spec.template) {
            return self.default_size();
        }
        Size {
            memory_mb: spec.resources.memory_mb.clamp(128, 65536),
            cpus: spec.resources.cpu_count.clamp(1, 64),
        }
    }

    /// QEMUs of `template` waiting in the warm pool.
    pub async fn warm_count(&self, template: &str) -> usize {
        self.warm.lock().await.get(template).map_or(0, |q| q.len())
    }

    /// The accelerator in use and why it was chosen.
    pub fn accelerator(&self) -> &Detection {
        &self.accel
    }

    fn vms_dir(&self) -> PathBuf {
        vms_dir(&self.cfg)
    }

    /// Scratch directories of checkpoint helpers, one per VM being checkpointed.
    fn captures_dir(&self) -> PathBuf {
        self.cfg
            .data_dir
            .join("vm/capture")
            .join(format!("{}-vm", self.cfg.cgroup_parent))
    }

    fn cgroup_parent(&self) -> String {
        format!("{}-vm", self.cfg.cgroup_parent)
    }

    fn new_name(&self) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        format!("vm{}x{n}x{nanos:x}", std::process::id())
    }

    /// The network pool; the first start removes what a crashed predecessor left.
    async fn pool(&self) -> Result<&NetPool, RuntimeError> {
        self.net
            .get_or_try_init(|| async {
                self.remove_stale_vms(Vec::new()).await;
                NetPool::start(self.cfg.net.clone())
                    .await
                    .map_err(|e| RuntimeError::unavailable("start the network pool", e))
            })
            .await
    }

    /// Kills and removes every VM directory (and cgroup) not named in `keep`.
    /// Removes every VM of an earlier run but those in `keep` (kills, unmounts, deletes: on
    /// the blocking pool).
    async fn remove_stale_vms(&self, keep: Vec<String>) {
        let Some(rt) = self.this.upgrade() else {
            return;
        };
        if let Err(e) = tokio::task::spawn_blocking(move || rt.remove_stale_vms_now(&keep)).await {
            tracing::warn!(error = %e, "removing the VMs of an earlier run");
        }
    }

    fn remove_stale_vms_now(&self, keep: &[String]) {
        let parent = self.cgroup_parent();
        let mut names: Vec<String> = warren_host::cgroup::children(&parent);
        if let Ok(rd) = std::fs::read_dir(self.vms_dir()) {
            names.extend(
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned()),
            );
        }
        names.extend(self.disk_link_names());
        if let Ok(rd) = std::fs::read_dir(self.cfg.run_dir.join("vm/links")) {
            names.extend(rd.flatten().filter_map(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.strip_suffix(".disk").map(str::to_string)
            }));
        }
        names.sort();
        names.dedup();
        for name in names.into_iter().filter(|n| !keep.contains(n)) {
            tracing::warn!(vm = %name, "removing a VM left by a previous run");
            machine::remove_stale(&self.vms_dir().join(&name), &parent);
            self.remove_links(&name);
        }
        // Nothing is checkpointed before the start: a helper still there was left by a server
        // that died mid-share (its pid file names it).
        if let Ok(rd) = std::fs::read_dir(self.captures_dir()) {
            for e in rd.flatten() {
                let dir = e.path();
                tracing::warn!(dir = %dir.display(), "removing a checkpoint helper left by a previous run");
                // Not `remove_stale`: the directory is named after a VM that may live on.
                machine::kill_recorded_qemu(&dir);
                crate::snapshot::remove_vm_dir(&dir);
            }
        }
    }

    async fn snapshot(&self, template: &str, size: Size) -> Result<Arc<Snapshot>, RuntimeError> {
        let cell = self
            .snapshots
            .lock()
            .await
            .entry((template.to_string(), size))
            .or_default()
            .clone();
        cell.get_or_try_init(|| self.make_snapshot(template, size))
            .await
            .cloned()
    }

    async fn make_snapshot(
        &self,
        template: &str,
        size: Size,
    ) -> Result<Arc<Snapshot>, RuntimeError> {
        let pool = self.pool().await?;
        let dns = pool.dns().servers.clone();
        let (t, data, dir, settings, accel) = (
            template.to_string(),
            self.cfg.data_dir.clone(),
            self.cfg.run_dir.join("vm/snapshots"),
            self.settings.clone(),
            self.accel.accel,
        );
        let inputs = tokio::task::spawn_blocking(move || {
            snapshots::inputs(&t, size, &data, &dir, &settings, accel, &dns)
        })
        .await
        // A panic while resolving the inputs: a bug.
        .map_err(failed)??;
        if let Some(s) = snapshots::existing(&inputs) {
            return Ok(s);
        }
        // A template's service starts with the internet its build had (E2B starts it at the
        // end of the build); forks get their own policy when restored.
        let policy = if inputs.launch.start.is_some() {
            SlotPolicy::open()
        } else {
            SlotPolicy::deny_all()
        };
        let slot = pool
            .acquire(&policy)
            .await
            .map_err(warren_host::slot_error)?;
        // The template boot is jailed as the slot's user like every fork (its inputs are
        // trusted, but QEMU still parses them).
        let run_as = self.run_as(&slot);
        let agent = std::net::SocketAddr::V4(slot.agent_endpoint());
        let prepare = self.start_service(template, &inputs.launch, agent);
        let in_use: Vec<PathBuf> = self
            .snapshots
            .lock()
            .await
            .values()
            .filter_map(|cell| cell.get().map(|s| s.dir.clone()))
            .collect();
        let result = match slot.lay_out_for_vm().await.map_err(slot_failed) {
            Ok(()) => snapshots::make(&inputs, slot.netns_path(), run_as, prepare, in_use).await,
            Err(e) => Err(e),
        };
        self.release_slot(slot).await;
        result
    }

    /// Starts `template`'s service in the VM being snapshotted (agent at `agent`) and waits
    /// until it is ready. The agent is initialised without a token (each fork's `/init`
    /// sets its own) and with the template's variables only: like E2B's, the service runs
    /// before any sandbox exists and does not see a sandbox's id or create-time variables.
    /// Its processes' user-space random state is shared by every fork (the kernel's pool
    /// is reseeded per fork).
    async fn start_service(
        &self,
        template: &str,
        launch: &warren_template::Launch,
        agent: std::net::SocketAddr,
    ) -> Result<(), RuntimeError> {
        let Some(cmd) = &launch.start else {
            return Ok(());
        };
        let env = warren_host::agent::template_env(template);
        let init = warren_host::agent::InitArgs {
            env_vars: &env,
            access_token: None,
            current_token: None,
            signed_url_max_age: self.cfg.signed_url_max_age,
            timeout: self.cfg.ready_timeout,
            launch,
            ca_bundle: None,
            volume_mounts: &[],
        };
        warren_host::agent::wait_and_init(&self.client, agent, &init).await?;
        warren_host::agent::run_start_command(&self.client, agent, None, cmd).await
    }

    async fn release_slot(&self, slot: Slot) {
        // A killed VM closes none of its TCP connections, and the next VM in this slot gets
        // its address: the proxy pools connections per route, never per address, for that.
        if let Err(e) = slot.lay_out_for_ns().await {
            tracing::warn!(slot = slot.name(), error = %e, "could not restore the slot layout");
        }
        if let Some(pool) = self.net.get() {
            if let Err(e) = pool.release(slot).await {
                tracing::warn!(error = %e, "could not release the network slot");
            }
        }
    }

    /// The user a VM's QEMU runs as: unique per slot, so no two VMs share one (see
    /// [`uids`]). Under KVM too: the jail opens `/dev/kvm` for it.
    fn run_as(&self, slot: &Slot) -> Option<(u32, u32)> {
        if !self.settings.unprivileged {
            return None;
        }
        let uid = self.settings.vm_uid_base + slot.index();
        Some((uid, uid))
    }

    /// Frees what a VM held once its QEMU has ended (slot, cgroup, files); its exit reason
    /// stays for `status`.
    async fn teardown(&self, m: &Machine) {
        // The cgroup first: its NFS helper listens in the slot, which the next VM there needs.
        let cg = m.cgroup.clone();
        let _ = tokio::task::spawn_blocking(move || {
            let _ = cg.kill_all();
            cg.remove()
        })
        .await;
        let slot = m.slot.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(slot) = slot {
            self.release_slot(slot).await;
        }
        crate::snapshot::remove_vm_dir(&m.dir);
        self.remove_links(&m.name);
    }

    /// Teardown after QEMU ended on its own (the sandbox stays listed, as failed).
    fn on_exit(&self, id: String) -> impl FnOnce() + Send + 'static {
        let rt = self.this.clone();
        move || {
            tokio::spawn(async move {
                let Some(rt) = rt.upgrade() else { return };
                let m = rt.live.lock().await.get(&id).cloned();
                if let Some(m) = m {
                    tracing::warn!(sandbox = %id, reason = ?m.exit.borrow().clone(), "VM exited");
                    rt.teardown(&m).await;
                    rt.exits.notify_one();
                }
            });
        }
    }

    /// Stops the warm QEMUs (not sandboxes: nothing to keep across a restart) and frees their
    /// slots; for a server that shuts down. Running sandboxes are left alone.
    pub async fn stop_warm(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        // A refill under way finishes (and discards) its QEMU before this returns.
        let _refill = self.refilling.lock().await;
        let warm: Vec<Warm> = self
            .warm
            .lock()
            .await
            .drain()
            .flat_map(|(_, q)| q)
            .collect();
        for w in warm {
            self.discard_warm(w).await;
        }
    }

    /// Kills every sandbox and warm VM and removes everything this runtime created on the
    /// host. For decommissioning and tests; a restarting server must not call it.
    /// Lets go of the host as a server that exits does: running sandboxes and warm VMs are
    /// left as they are, for the next manager to take back or clean up, and once this returns
    /// the runtime is gone and the host lock free, so a new manager can start at once. A runtime
    /// merely dropped lets go too, but only once its background work (a warm VM's refill takes
    /// seconds) is done with it.
    pub async fn release(self: Arc<Self>) -> Result<(), RuntimeError> {
        drop(self.sole().await?);
        Ok(())
    }

    /// The runtime itself once every other handle is gone: background tasks (refills,
    /// watchers) hold it for a moment, and are waited for (at most 30 s).
    async fn sole(self: Arc<Self>) -> Result<Self, RuntimeError> {
        let mut this = self;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            match Arc::try_unwrap(this) {
                Ok(t) => return Ok(t),
                Err(_) if tokio::time::Instant::now() > deadline => {
                    return Err(RuntimeError::Conflict("runtime still in use".into()));
                }
                Err(a) => {
                    this = a;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }

    pub async fn shutdown(self: Arc<Self>) -> Result<(), RuntimeError> {
        let ids: Vec<String> = self.live.lock().await.keys().cloned().collect();
        for id in ids {
            self.kill(&id).await?;
        }
        let warm: Vec<Warm> = self
            .warm
            .lock()
            .await
            .drain()
            .flat_map(|(_, q)| q)
            .collect();
        for w in warm {
            self.discard_warm(w).await;
        }
        let this = self.sole().await?;
        let captures = this.captures_dir();
        if let Some(pool) = this.net.into_inner() {
            pool.shutdown()
                .await
                .map_err(|e| RuntimeError::unavailable("stop the network pool", e))?;
        }
        let _ = warren_host::cgroup::remove_parent(&format!("{}-vm", this.cfg.cgroup_parent));
        crate::error::remove_tree(&vms_dir(&this.cfg)).await;
        // Every VM is gone, and no checkpoint is under way: nothing of this runtime's is left.
        crate::error::remove_tree(&captures).await;
        crate::error::remove_tree(&this.cfg.run_dir.join("vm/links")).await;
        let _ = std::fs::remove_dir(this.cfg.net.run_dir.as_path());
        Ok(())
    }
}

#[async_trait::async_trait]
impl SandboxRuntime for VmRuntime {
    fn name(&self) -> &'static str {
        "vm"
    }

    /// Makes sure template `name` has a snapshot (booting it once, minutes the very first
    /// time when the image must be built) and fills its warm pool.
    async fn prepare_template(&self, name: &str) -> Result<(), RuntimeError> {
        self.snapshot(name, self.warm_size(name)).await?;
        self.refill(name).await;
        Ok(())
    }

    async fn set_warm_pool(&self, template: &str, size: usize) -> Result<(), RuntimeError> {
        // The snapshot first: a template that cannot boot is refused here, not in a refill.
        self.snapshot(template, self.warm_size(template)).await?;
        self.warm_targets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(template.to_string(), size);
        self.shrink_warm(template, size).await;
        self.refill(template).await;
        Ok(())
    }

    async fn stop(&self) {
        self.stop_warm().await;
    }

    async fn forget_template(&self, name: &str) {
        self.forget_warm(name).await;
    }

    fn headroom(&self) -> Option<warren_runtime::Headroom> {
        warren_host::headroom(&self.cfg.data_dir)
    }

    fn exit_signal(&self) -> Option<Arc<tokio::sync::Notify>> {
        Some(self.exits.clone())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            pause_memory: true,
            pause_filesystem: true,
            snapshot: true,
            snapshot_memory: true,
            snapshot_filesystem: true,
            egress_addresses: true,
            egress_names: true,
            egress_rules: self.cfg.net.broker.is_some(),
            private_networks: true,
            volumes: true,
        }
    }

    async fn set_egress(
        &self,
        id: &str,
        policy: &warren_runtime::egress::EgressPolicy,
    ) -> Result<RuntimeSandbox, RuntimeError> {
        self.set_egress_now(id, policy).await
    }

    async fn set_peers(
        &self,
        id: &str,
        peering: &warren_runtime::peers::Peering,
    ) -> Result<(), RuntimeError> {
        self.set_peers_now(id, peering).await
    }

    async fn network_flows(
        &self,
        id: &str,
    ) -> Result<Vec<warren_runtime::flows::Flow>, RuntimeError> {
        Ok(self.pool().await?.flows(id))
    }

    fn slots(&self) -> Option<warren_runtime::SlotStats> {
        self.net.get().map(NetPool::slot_stats)
    }

    /// The QEMU process's cgroup: the CPU time is what emulating or running the guest cost
    /// the host; the memory is the guest RAM it touched plus QEMU's own.
    async fn usage(&self, id: &str) -> Option<warren_runtime::Usage> {
        let cgroup = self.live.lock().await.get(id)?.cgroup.clone();
        tokio::task::spawn_blocking(move || cgroup.usage())
            .await
            .ok()
    }

    async fn create(&self, spec: CreateSpec) -> Result<RuntimeSandbox, RuntimeError> {
        if self.live.lock().await.contains_key(spec.id.as_str()) {
            return Err(RuntimeError::InvalidArgument(format!(
                "sandbox {} already exists",
                spec.id
            )));
        }
        let checkpoint = match &spec.from_snapshot {
            Some(key) => Some(self.saved_snapshot(key)?),
            None => None,
        };
        // A sandbox from a checkpoint wakes up with the agent of the sandbox it was taken
        // from, which still wants that sandbox's token.
        let current_token = checkpoint
            .as_ref()
            .and_then(|c| machine::read_token(&c.dir));
        self.launch(spec, checkpoint.as_ref(), current_token.as_deref())
            .await
    }
    async fn kill(&self, id: &str) -> Result<(), RuntimeError> {
        if let Some(pool) = self.net.get() {
            pool.forget_flows(id);
        }
        if self.paused.lock().await.remove(id) {
            warren_host::durable::discard_dir(&self.paused_dir(id));
            return Ok(());
        }
        let m = self
            .live
            .lock()
            .await
            .remove(id)
            .ok_or_else(|| RuntimeError::NotFound(id.to_string()))?;
        m.kill().await;
        self.teardown(&m).await;
        Ok(())
    }

    async fn status(&self, id: &str) -> Result<Option<Exit>, RuntimeError> {
        if self.paused.lock().await.contains(id) {
            return Ok(None);
        }
        let live = self.live.lock().await;
        let m = live
            .get(id)
            .ok_or_else(|| RuntimeError::NotFound(id.to_string()))?;
        let reason = m.exit.borrow().clone();
        Ok(reason.map(|reason| Exit { reason }))
    }

    async fn reattach(
        &self,
        records: Vec<RuntimeSandbox>,
    ) -> Vec<(String, Result<RuntimeSandbox, RuntimeError>)> {
        self.reattach_now(records).await
    }

    async fn pause(&self, id: &str, mode: PauseMode) -> Result<RuntimeSandbox, RuntimeError> {
        self.pause_now(id, mode).await
    }

    async fn resume(&self, spec: CreateSpec) -> Result<(RuntimeSandbox, ResumeKind), RuntimeError> {
        self.resume_now(spec).await
    }

    async fn snapshot(
        &self,
        id: &str,
        key: &str,
        memory: bool,
    ) -> Result<SnapshotInfo, RuntimeError> {
        self.snapshot_now(id, key, memory).await
    }

    async fn snapshot_keys(&self) -> Vec<String> {
        self.snapshot_keys_now()
    }

    async fn delete_snapshot(&self, key: &str) -> Result<(), RuntimeError> {
        self.delete_snapshot_now(key)
    }
}

/// A slot that could not be laid out for a VM.
fn slot_failed(e: warren_net::Error) -> RuntimeError {
    RuntimeError::unavailable("lay out the network slot for a VM", e)
}

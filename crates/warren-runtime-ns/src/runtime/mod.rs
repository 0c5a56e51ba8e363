//! [`NsRuntime`]: sandboxes as namespace containers on this host, behind the runtime trait.
//!
//! It ties together the template images (mounted once per host, `warren_host::Templates`),
//! pooled network slots (`warren-net`) and the launcher of this crate, and implements
//! [`SandboxRuntime`] for the control plane. It makes itself a child subreaper so that no
//! sandbox process is ever left unreaped, and on its first `reattach` removes whatever a
//! crashed predecessor left behind.

mod egress;
mod persist;
mod prepared;
mod procwatch;
mod reattach;
mod start;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, OnceCell};
use tracing::Instrument;
use warren_host::{hardening, headroom, HostConfig, HostLock, SlotRecord, TemplateRoot, Templates};
use warren_net::{NetPool, Slot};
use warren_runtime::{
    Capabilities, CreateSpec, Exit, PauseMode, ResumeKind, RuntimeError, RuntimeSandbox,
    SandboxRuntime, SnapshotInfo,
};

use crate::config::Confinement;
use crate::idrange::IdRanges;
use crate::launch::{self, NsConfig, Sandbox};

/// Settings of the namespace runtime beyond [`HostConfig`] (`warren serve`'s `--ns-*` flags).
#[derive(Debug, Clone)]
pub struct NsSettings {
    /// Most sandboxes kept started ahead of creates (as many as recent demand asks for,
    /// within this and a share of the host's free memory); 0 prepares none.
    pub prepared_max: usize,
    /// How much confinement sandboxes get: [`Confinement::Baseline`] only to measure what
    /// confinement costs (the runtime logs a warning at start).
    pub confinement: Confinement,
}

impl Default for NsSettings {
    fn default() -> Self {
        Self {
            prepared_max: 64,
            confinement: Confinement::Full,
        }
    }
}

/// The launcher's settings for this host's configuration.
pub fn ns_config(cfg: &HostConfig, settings: &NsSettings) -> NsConfig {
    NsConfig {
        state_dir: cfg.run_dir.join("sandboxes"),
        // Named after the runtime's cgroup parent: runtimes that share a data dir (tests do)
        // never sweep each other's disks.
        disk_dir: cfg
            .data_dir
            .join("disks")
            .join(cfg.cgroup_parent.replace('/', "-")),
        nsinit_bin: cfg.nsinit_bin.clone(),
        agent_bin: cfg.agent_bin.clone(),
        cgroup_parent: cfg.cgroup_parent.clone(),
        confinement: settings.confinement,
        // Set by `NsRuntime::start` once the daemon answers (see `crate::lxcfs`).
        lxcfs: None,
    }
}

/// What the control plane persists for each sandbox so a restarted server can take it back.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    /// 0 while paused with only the filesystem kept (no processes).
    pid1: u32,
    #[serde(flatten)]
    net: SlotRecord,
    /// Set while paused: what the pause kept.
    #[serde(default)]
    paused: Option<PauseMode>,
    /// The template it runs on (records written before it was kept have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    template: Option<String>,
}

struct Live {
    sandbox: Sandbox,
    slot: Slot,
    template: Option<String>,
}

impl Record {
    /// The record of a running sandbox on `slot`.
    fn running(pid1: u32, slot: &Slot, template: Option<String>) -> Self {
        Self {
            pid1,
            net: SlotRecord::from(slot),
            paused: None,
            template,
        }
    }
}

/// Sandboxes as namespace containers on this host.
pub struct NsRuntime {
    cfg: HostConfig,
    settings: NsSettings,
    ns: NsConfig,
    net: OnceCell<NetPool>,
    templates: Arc<Templates>,
    live: Mutex<HashMap<String, Live>>,
    /// Sandboxes paused with only their filesystem kept: no processes, no slot, just the
    /// saved layer under `<data_dir>/paused/<id>`.
    paused_fs: Mutex<HashSet<String>>,
    client: reqwest::Client,
    /// Host id ranges of live, paused and saved sandboxes (`<data_dir>/ns-id-ranges`).
    ids: IdRanges,
    /// Journals of the programs executed in each sandbox, watched from the host.
    procs: procwatch::HostWatch,
    /// Sandboxes started ahead of creates (see `prepared`).
    prepared: prepared::Pool,
    /// Notified at every SIGCHLD: nsinit exits when its sandbox's PID 1 ends, so a sandbox
    /// that ended on its own is known at once (`SandboxRuntime::exit_signal`).
    exits: Arc<tokio::sync::Notify>,
    /// The task that waits for orphans handed to us (see `reap_orphans`).
    reaper: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Held for the runtime's lifetime: one manager per host state, so a second server can
    /// never mistake the first one's sandboxes for a crashed predecessor's and remove them.
    _lock: HostLock,
}

/// How often `status` looks for nsinit's record of PID 1's end (20 ms apart) before it reports
/// the end without its cause.
const EXIT_STATUS_TRIES: u32 = 25;

impl NsRuntime {
    /// Prepares the runtime; the network pool and crash cleanup start with the first
    /// `reattach` (or the first `create`).
    pub async fn start(cfg: HostConfig, settings: NsSettings) -> Result<Arc<Self>, RuntimeError> {
        if !nix::unistd::geteuid().is_root() {
            return Err(RuntimeError::unavailable_now(
                "the namespace runtime needs root",
            ));
        }
        for bin in [&cfg.agent_bin, &cfg.nsinit_bin] {
            if !bin.exists() {
                return Err(RuntimeError::unavailable_now(format!(
                    "{} is missing (build the workspace: cargo build --release)",
                    bin.display()
                )));
            }
        }
        let lock = HostLock::acquire(&cfg.run_dir)?;
        // Ours alone now: a crashed predecessor's template mounts go.
        Templates::sweep(&cfg.templates_dir);
        hardening::warn_if_missing();
        // Orphans of sandbox helpers come to us, not to the host's init (which reaps slowly).
        nix::sys::prctl::set_child_subreaper(true).map_err(|e| RuntimeError::Io {
            what: "become a child subreaper".into(),
            source: e.into(),
        })?;
        let client = reqwest::Client::builder()
            .no_proxy()
            .build()
            .map_err(|e| RuntimeError::unavailable("http client", e))?;
        let ids = IdRanges::open(&cfg.data_dir.join("ns-id-ranges"), cfg.id_base)
            .map_err(RuntimeError::io("open the id range assignments"))?;
        if settings.confinement != Confinement::Full {
            tracing::warn!(
                confinement = ?settings.confinement,
                "sandboxes get the baseline confinement (a short seccomp deny-list, every \
                 capability in their user namespace): for measuring what confinement costs, \
                 never for real tenants"
            );
        }
        let mut ns = ns_config(&cfg, &settings);
        ns.lxcfs = crate::lxcfs::start(cfg.lxcfs_dir.clone()).await;
        let rt = Arc::new(Self {
            ids,
            procs: procwatch::HostWatch::new(&cfg.cgroup_parent),
            ns,
            cfg,
            settings,
            net: OnceCell::new(),
            templates: Arc::new(Templates::default()),
            live: Mutex::new(HashMap::new()),
            paused_fs: Mutex::new(HashSet::new()),
            client,
            prepared: prepared::Pool::default(),
            reaper: std::sync::Mutex::new(None),
            exits: Arc::new(tokio::sync::Notify::new()),
            _lock: lock,
        });
        let reaper = tokio::spawn(reap_orphans(Arc::downgrade(&rt)));
        *rt.reaper.lock().unwrap_or_else(|e| e.into_inner()) = Some(reaper);
        rt.start_pool();
        Ok(rt)
    }

    /// The mounted root of template `name`, built and mounted on first use (the first build
    /// takes minutes and prints its progress); mounted while the returned root lives.
    pub async fn template_root(&self, name: &str) -> Result<TemplateRoot, RuntimeError> {
        let (data, dir, name) = (
            self.cfg.data_dir.clone(),
            self.cfg.templates_dir.clone(),
            name.to_string(),
        );
        let templates = self.templates.clone();
        // Building an image the first time is slow and blocking; keep it off the runtime.
        tokio::task::spawn_blocking(move || templates.root(&name, &data, &dir))
            .await
            // A panic in the build: a bug.
            .map_err(|e| RuntimeError::Failed(format!("template task: {e}")))?
    }

    /// Kills every sandbox and removes everything this runtime created on the host (network
    /// slots and rules, cgroups, state). For decommissioning a host and for tests; a server
    /// that merely restarts must not call it.
    pub async fn shutdown(self: Arc<Self>) -> Result<(), RuntimeError> {
        self.stop_pool().await;
        let ids: Vec<String> = self.live.lock().await.keys().cloned().collect();
        for id in ids {
            self.kill(&id).await?;
        }
        let this = self.sole().await?;
        if let Some(pool) = this.net.into_inner() {
            pool.shutdown()
                .await
                .map_err(|e| RuntimeError::unavailable("stop the network pool", e))?;
        }
        this.templates.unmount_all();
        launch::remove_empty_parents(&this.ns)
            .map_err(RuntimeError::io("remove the runtime's directories"))?;
        let _ = std::fs::remove_dir(this.cfg.net.run_dir.as_path());
        Ok(())
    }

    /// Lets go of the host as a server that exits does: every sandbox (prepared ones too) is
    /// left as it is, for the next manager to take back or clean up; the background work
    /// stops; and once this returns, the runtime is gone and the host lock is free, so a new
    /// manager can start at once. A runtime merely dropped lets go too, but only when its
    /// background work next looks at it. Fails (keeping nothing) if another handle to the
    /// runtime is still in use after 30 s.
    pub async fn release(self: Arc<Self>) -> Result<(), RuntimeError> {
        self.stop_refills().await;
        // Dropped here: the host lock with it.
        drop(self.sole().await?);
        Ok(())
    }

    /// The runtime itself once every other handle is gone: the orphan reaper stops first, and
    /// handles the background work took for a moment are waited for (at most 30 s).
    async fn sole(self: Arc<Self>) -> Result<Self, RuntimeError> {
        let reaper = self.reaper.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(reaper) = reaper {
            reaper.abort();
            let _ = reaper.await;
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut rt = self;
        loop {
            match Arc::try_unwrap(rt) {
                Ok(inner) => return Ok(inner),
                Err(_) if std::time::Instant::now() >= deadline => {
                    return Err(RuntimeError::Conflict(
                        "the runtime is still in use by another handle".into(),
                    ))
                }
                Err(back) => {
                    rt = back;
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
            }
        }
    }

    /// The network pool, started (with crash cleanup) on first use when `reattach` did not
    /// start it.
    async fn pool(&self) -> Result<&NetPool, RuntimeError> {
        self.net
            .get_or_try_init(|| async {
                let removed = launch::cleanup_stale(&self.ns, &[]);
                if !removed.is_empty() {
                    tracing::warn!(?removed, "removed sandboxes left by a previous run");
                }
                NetPool::start(self.cfg.net.clone())
                    .await
                    .map_err(|e| RuntimeError::unavailable("start the network pool", e))
            })
            .await
    }
}

#[async_trait::async_trait]
impl SandboxRuntime for NsRuntime {
    fn name(&self) -> &'static str {
        "ns"
    }

    async fn prepare_template(&self, name: &str) -> Result<(), RuntimeError> {
        self.template_root(name).await.map(|_| ())
    }

    async fn set_warm_pool(&self, template: &str, size: usize) -> Result<(), RuntimeError> {
        self.set_prepared_target(template, size).await
    }

    async fn reserve_prepared(&self, template: &str) -> Option<warren_runtime::Reservation> {
        // Prepared sandboxes are named by `SandboxId::generate`: the parse cannot fail.
        self.reserve_ready(template)
            .and_then(|id| id.parse().ok())
            .map(warren_runtime::Reservation::new)
    }

    fn prepared(&self) -> Option<warren_runtime::PreparedStats> {
        Some(self.prepared_stats())
    }

    async fn stop(&self) {
        self.stop_pool().await;
        // Running sandboxes keep their own copies; new ones are made by the next server.
        self.templates.unmount_all();
    }

    async fn forget_template(&self, name: &str) {
        self.forget_prepared(name).await;
        self.templates.forget(name);
    }

    fn headroom(&self) -> Option<warren_runtime::Headroom> {
        headroom(&self.cfg.data_dir)
    }

    fn exit_signal(&self) -> Option<Arc<tokio::sync::Notify>> {
        Some(self.exits.clone())
    }

    fn capabilities(&self) -> Capabilities {
        // Memory pause freezes the sandbox's processes in place; snapshots and forks carry
        // files only (memory checkpoints would need a working CRIU, which these hosts lack).
        Capabilities {
            pause_memory: true,
            pause_filesystem: true,
            snapshot: true,
            snapshot_memory: false,
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
        self.set_egress_and_record(id, policy).await
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

    async fn usage(&self, id: &str) -> Option<warren_runtime::Usage> {
        let cgroup = self.live.lock().await.get(id)?.sandbox.cgroup.clone();
        tokio::task::spawn_blocking(move || cgroup.usage())
            .await
            .ok()
    }

    async fn create(&self, spec: CreateSpec) -> Result<RuntimeSandbox, RuntimeError> {
        let seed = match &spec.from_snapshot {
            Some(key) => Some(self.snapshot_seed(key)?),
            None => None,
        };
        self.create_from(spec, seed).await
    }

    async fn kill(&self, id: &str) -> Result<(), RuntimeError> {
        if let Some(pool) = self.net.get() {
            pool.forget_flows(id);
        }
        if self.paused_fs.lock().await.remove(id) {
            let forgotten = self.forget_saved(id).await;
            self.release_ids(id);
            self.procs.forget(id);
            return forgotten;
        }
        let live = self
            .live
            .lock()
            .await
            .remove(id)
            .ok_or_else(|| RuntimeError::NotFound(id.to_string()))?;
        let result = live
            .sandbox
            .destroy()
            .await
            .map_err(|e| launch_error(&format!("kill sandbox {id}"), e));
        if let Some(pool) = self.net.get() {
            if let Err(e) = pool.release(live.slot).await {
                tracing::warn!(sandbox = %id, error = %e, "could not release the network slot");
            }
        }
        let result = result.and(self.forget_saved(id).await);
        self.release_ids(id);
        self.procs.forget(id);
        result
    }

    async fn status(&self, id: &str) -> Result<Option<Exit>, RuntimeError> {
        if self.paused_fs.lock().await.contains(id) {
            return Ok(None);
        }
        // nsinit writes how PID 1 ended right after PID 1 is gone from the cgroup: a moment
        // is allowed for it, so the cause is not lost to the generic reason.
        let mut attempt = 0;
        loop {
            {
                let live = self.live.lock().await;
                let l = live
                    .get(id)
                    .ok_or_else(|| RuntimeError::NotFound(id.to_string()))?;
                if l.sandbox.is_running() {
                    return Ok(None);
                }
                let status = l.sandbox.exit_status();
                if status.is_some() || attempt == EXIT_STATUS_TRIES {
                    let mut reason = status.unwrap_or_else(|| "sandbox process ended".into());
                    if l.sandbox.cgroup.oom_kills() > 0 {
                        reason.push_str(" (out of memory)");
                    }
                    return Ok(Some(Exit { reason }));
                }
            }
            attempt += 1;
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    async fn reattach(
        &self,
        records: Vec<RuntimeSandbox>,
    ) -> Vec<(String, Result<RuntimeSandbox, RuntimeError>)> {
        self.reattach_all(records).await
    }

    async fn pause(&self, id: &str, mode: PauseMode) -> Result<RuntimeSandbox, RuntimeError> {
        self.pause_now(id, mode).await
    }

    async fn resume(&self, spec: CreateSpec) -> Result<(RuntimeSandbox, ResumeKind), RuntimeError> {
        self.resume_now(spec).await
    }

    async fn export_rootfs(&self, id: &str, out: &std::path::Path) -> Result<(), RuntimeError> {
        self.export_now(id, out).await
    }

    async fn snapshot(
        &self,
        id: &str,
        key: &str,
        memory: bool,
    ) -> Result<SnapshotInfo, RuntimeError> {
        if memory {
            return Err(RuntimeError::Unsupported(
                "the ns runtime's snapshots keep files only".into(),
            ));
        }
        self.snapshot_now(id, key).await
    }

    async fn journal(
        &self,
        id: &str,
        after: u64,
        limit: usize,
    ) -> Option<warren_proto::journal::JournalPage> {
        self.procs.page(id, after, limit)
    }

    async fn snapshot_keys(&self) -> Vec<String> {
        self.snapshot_keys_now()
    }

    async fn delete_snapshot(&self, key: &str) -> Result<(), RuntimeError> {
        self.delete_snapshot_now(key)
    }
}

impl NsRuntime {
    /// Creates a sandbox whose writable layer starts from `seed` (or empty).
    async fn create_from(
        &self,
        spec: CreateSpec,
        seed: Option<launch::Seed>,
    ) -> Result<RuntimeSandbox, RuntimeError> {
        if self.live.lock().await.contains_key(spec.id.as_str())
            || self.paused_fs.lock().await.contains(spec.id.as_str())
        {
            return Err(RuntimeError::InvalidArgument(format!(
                "sandbox {} already exists",
                spec.id
            )));
        }
        // Sandboxes prepared ahead have empty layers and no volumes.
        let poolable = seed.is_none() && spec.volumes.is_empty();
        let reserved = match &spec.reservation {
            Some(r) if r.id() != &spec.id => {
                return Err(RuntimeError::InvalidArgument(format!(
                    "sandbox {} carries the reservation of {}",
                    spec.id,
                    r.id()
                )))
            }
            Some(r) if poolable => self.take_reserved(r.id().as_str()),
            _ => None,
        };
        if let Some(p) = reserved {
            let _in_flight = self.note_create(&spec);
            match self.claim(&spec, p).await {
                Ok(out) => return Ok(out),
                // Discarded; a sandbox started now takes its place.
                Err(RuntimeError::Conflict(_)) => {}
                Err(e) => {
                    tracing::warn!(sandbox = %spec.id, error = %warren_runtime::chain(&e), "could not claim the prepared sandbox")
                }
            }
        }
        let image_root = self.template_root(&spec.template).await?;
        // Counted once the template is known to exist: demand prepares sandboxes of it.
        let _in_flight = poolable.then(|| self.note_create(&spec));
        let pool = self.pool().await?;
        // A sandbox resumed from its files keeps its range; anything else gets a new one.
        let fresh_ids = self.ids.get(&ids_holder(&spec.id)).is_none();
        let id_base = self.assign_ids(&spec.id)?;
        let forget_ids = |this: &Self| {
            if fresh_ids {
                this.release_ids(&spec.id);
            }
        };
        let policy = warren_host::egress::slot_policy(&spec.egress_policy());
        let slot = match pool
            .acquire(&policy)
            .instrument(tracing::info_span!("network.slot.acquire"))
            .await
        {
            Ok(slot) => {
                pool.set_owner(&slot, &spec.id);
                slot
            }
            Err(e) => {
                forget_ids(self);
                return Err(warren_host::slot_error(e));
            }
        };
        let sandbox = match self
            .start_sandbox(&spec, &slot, image_root, seed, id_base)
            .await
        {
            Ok(s) => s,
            Err(e) => {
                let _ = pool.release(slot).await;
                forget_ids(self);
                self.procs.forget(&spec.id);
                return Err(e);
            }
        };
        self.register_running(spec.id.to_string(), &spec.template, sandbox, slot)
            .await
    }

    /// The host id range of sandbox `id`: its own if it has one (a sandbox paused with its
    /// files), else a new one that no live, paused or saved sandbox uses.
    fn assign_ids(&self, id: &str) -> Result<u32, RuntimeError> {
        let saved = persist::saved_id_bases(&self.cfg.data_dir);
        self.ids.assign(&ids_holder(id), &saved).map_err(|e| {
            if e.kind() == std::io::ErrorKind::StorageFull {
                RuntimeError::Exhausted(e.to_string())
            } else {
                RuntimeError::Io {
                    what: "assign a host id range".into(),
                    source: e,
                }
            }
        })
    }

    fn release_ids(&self, id: &str) {
        if let Err(e) = self.ids.release(&ids_holder(id)) {
            tracing::warn!(sandbox = %id, error = %e, "could not release the host id range");
        }
    }

    /// After a restart: frees the ranges of sandboxes that are neither live nor paused.
    async fn release_unclaimed_ids(&self) {
        let live = self.live.lock().await;
        let paused = self.paused_fs.lock().await;
        for holder in self.ids.holders().into_keys() {
            let Some(id) = holder.strip_prefix("sandbox-") else {
                continue;
            };
            if !live.contains_key(id) && !paused.contains(id) {
                let _ = self.ids.release(&holder);
            }
        }
    }
}

/// Name of a sandbox's id range assignment.
/// `record` as this runtime's tagged JSON. A plain struct always encodes: failing is a bug.
fn tagged(record: &Record) -> Result<serde_json::Value, RuntimeError> {
    let value = serde_json::to_value(record)
        .map_err(|e| RuntimeError::Failed(format!("encode the runtime record: {e}")))?;
    Ok(warren_runtime::tag_record("ns", value))
}

/// A launcher failure while doing `what`: host I/O keeps its `io::Error` (a full disk is
/// storage), anything else means the sandbox could not be handled now.
fn launch_error(what: &str, e: launch::LaunchError) -> RuntimeError {
    match e {
        launch::LaunchError::Io { what: step, source } => RuntimeError::Io {
            what: format!("{what}: {step}"),
            source,
        },
        e => RuntimeError::unavailable(what, e),
    }
}

fn ids_holder(id: &str) -> String {
    format!("sandbox-{id}")
}

/// Reaps sandbox PID 1s that became our children (their `warren-nsinit` parent died), so none
/// lingers as a zombie. Only known processes are waited for, by pidfd: tokio and std wait for
/// their own children, and a sandbox's PID 1 reaped by its nsinit leaves a number the next
/// `mount` may get (whose exit, taken here by number, failed that mount with ECHILD).
async fn reap_orphans(rt: std::sync::Weak<NsRuntime>) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut sigchld) = signal(SignalKind::child()) else {
        return;
    };
    while sigchld.recv().await.is_some() {
        let Some(rt) = rt.upgrade() else { return };
        rt.exits.notify_one();
        for l in rt.live.lock().await.values() {
            l.sandbox.reap_pid1_if_ours();
        }
        crate::reap::reap_unreaped();
        crate::reap::reap_stray_agents();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_runtime::Category;

    #[test]
    fn a_full_disk_in_the_launcher_is_storage_with_its_cause() {
        let e = launch_error(
            "kill sandbox a",
            launch::LaunchError::Io {
                what: "remove the upper layer".into(),
                source: std::io::Error::from_raw_os_error(libc::ENOSPC),
            },
        );
        assert_eq!(e.category(), Category::StorageFull, "{e:?}");
        assert!(std::error::Error::source(&e).is_some());
    }

    #[test]
    fn a_sandbox_that_did_not_start_is_unavailable_with_its_cause() {
        let e = launch_error("kill sandbox a", launch::LaunchError::Init("no pid".into()));
        assert_eq!(e.category(), Category::Unavailable, "{e:?}");
        assert_eq!(
            warren_runtime::chain(&e),
            "kill sandbox a: sandbox did not start: no pid"
        );
    }
}

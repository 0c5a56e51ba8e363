//! The create path of the vm runtime: a running VM for a sandbox, from a warm QEMU or a
//! fresh one restored from the template's snapshot or the sandbox's checkpoint.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;
use warren_host::agent;
use warren_runtime::{CreateSpec, RuntimeError, RuntimeSandbox};

use super::{failed, machine, nfs, slot_failed, Machine, Record, VmRuntime, Warm};
use crate::snapshot::{RestoreTimes, Snapshot};

/// The target of the debug event that gives each create's stages (`vm_bench` collects it).
pub const STAGES_TARGET: &str = "warren_runtime_vm::stages";

/// Where the time of one create went, logged at debug level under [`STAGES_TARGET`].
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Stages {
    /// Served by a QEMU started ahead (its `prepare` and `qemu_start` were not the create's).
    warm: bool,
    /// From the create's start until a QEMU waiting for its state was at hand.
    waiting: Duration,
    restore: RestoreTimes,
    /// From the VM running until its agent answered (the guest's first instructions after
    /// the restore, translated afresh under TCG, and the agent's reply).
    agent: Duration,
    /// The agent's `/init` (and a template service's readiness).
    init: Duration,
}

impl Stages {
    fn log(&self, sandbox: &str) {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        tracing::debug!(
            target: STAGES_TARGET,
            sandbox,
            warm = self.warm,
            waiting_ms = ms(self.waiting),
            prepare_ms = ms(self.restore.prepare),
            qemu_start_ms = ms(self.restore.qemu_start),
            load_ms = ms(self.restore.load),
            resume_ms = ms(self.restore.resume),
            agent_ms = ms(self.agent),
            init_ms = ms(self.init),
            "VM create stages"
        );
    }
}

impl VmRuntime {
    /// Starts one QEMU of `template` waiting for its snapshot, in a fresh slot.
    pub(super) async fn start_pending(
        &self,
        snap: &Snapshot,
        policy: &warren_runtime::egress::EgressPolicy,
    ) -> Result<Warm, RuntimeError> {
        let pool = self.pool().await?;
        let slot = pool
            .acquire(&warren_host::egress::slot_policy(policy))
            .instrument(tracing::info_span!("network.slot.acquire"))
            .await
            .map_err(warren_host::slot_error)?;
        if let Err(e) = slot.lay_out_for_vm().await.map_err(slot_failed) {
            self.release_slot(slot).await;
            return Err(e);
        }
        let name = self.new_name();
        let dir = self.vms_dir().join(&name);
        let run_as = self.run_as(&slot);
        // The fork's disk refers to a hard link of the snapshot's (same filesystem).
        let backing_link = if snap.dir.starts_with(&self.cfg.run_dir) {
            self.template_link(&name)
        } else {
            self.disk_link(&name)
        };
        let spec = crate::snapshot::ForkSpec {
            qemu: self.settings.qemu.clone(),
            dir: dir.clone(),
            tap: Some(warren_net::TAP_IFACE.into()),
            netns: Some(slot.netns_path()),
            run_as,
            backing_link: Some(backing_link),
        };
        match machine::spawn(snap, &spec, &name, &self.cgroup_parent()).await {
            Ok((pending, cgroup)) => Ok(Warm {
                pending,
                slot,
                name,
                cgroup,
            }),
            Err(e) => {
                crate::snapshot::remove_vm_dir(&dir);
                self.remove_links(&name);
                self.release_slot(slot).await;
                Err(e)
            }
        }
    }

    /// A running VM for `spec`: restored from `checkpoint` when given, else from the
    /// template's snapshot (a warm QEMU when one waits).
    pub(super) async fn fork(
        &self,
        spec: &CreateSpec,
        checkpoint: Option<&Snapshot>,
    ) -> Result<(Arc<Machine>, SocketAddr, Stages), RuntimeError> {
        let started = Instant::now();
        if let Some(snap) = checkpoint {
            let warm = self
                .start_pending(snap, &spec.egress_policy())
                .instrument(tracing::info_span!("vm.spawn"))
                .await?;
            return self
                .complete(spec, warm, started)
                .instrument(tracing::info_span!("vm.restore"))
                .await;
        }
        let size = self.size_for(spec);
        let snap = self.snapshot(&spec.template, size).await?;
        // Only a size that has a snapshot: a refill never boots one under its lock.
        self.set_warm_size(&spec.template, size);
        let taken = self.take_warm(&spec.template, size).await;
        let from_warm = taken.is_some();
        let warm = match taken {
            Some(mut w) => {
                let pool = self.pool().await?;
                let policy = spec.egress_policy();
                if let Err(e) = warren_host::egress::apply(pool, &mut w.slot, &policy).await {
                    self.discard_warm(w).await;
                    return Err(e);
                }
                w
            }
            None => {
                self.start_pending(&snap, &spec.egress_policy())
                    .instrument(tracing::info_span!("vm.spawn"))
                    .await?
            }
        };
        self.spawn_refill(&spec.template);
        let (m, agent, mut stages) = self
            .complete(spec, warm, started)
            .instrument(tracing::info_span!("vm.restore"))
            .await?;
        if from_warm {
            stages.warm = true;
            stages.restore.prepare = Duration::ZERO;
            stages.restore.qemu_start = Duration::ZERO;
        }
        Ok((m, agent, stages))
    }

    /// Loads the state into a waiting QEMU and watches it.
    pub(super) async fn complete(
        &self,
        spec: &CreateSpec,
        warm: Warm,
        started: Instant,
    ) -> Result<(Arc<Machine>, SocketAddr, Stages), RuntimeError> {
        let Warm {
            pending,
            slot,
            name,
            cgroup,
        } = warm;
        let dir = self.vms_dir().join(&name);
        let pid = pending.child.id().unwrap_or(0);
        let agent = SocketAddr::V4(slot.agent_endpoint());
        let waiting = started.elapsed();
        let source = pending.snapshot().meta.clone();
        let run_as = self.run_as(&slot);
        if let Err(e) = machine::write_token(&dir, spec.access_token.as_deref()) {
            tracing::warn!(vm = %name, error = %e, "could not record the access token");
        }
        // The volumes' server before the VM runs: a guest restored with mounts uses them at
        // once.
        let served = if spec.volumes.is_empty() {
            Ok(())
        } else {
            let helper = nfs::Helper {
                bin: &self.settings.nfsd_bin,
                key: &self.nfs_key,
                netns: &slot.netns_path(),
                dir: &dir,
                cgroup: &cgroup,
            };
            if let Err(e) = nfs::record(&dir, &spec.volumes) {
                tracing::warn!(vm = %name, error = %e, "could not record the VM's volumes");
            }
            nfs::start(&helper, &spec.volumes).await.map(drop)
        };
        let restored = match served {
            Ok(()) => pending.complete().await.map_err(|e| {
                RuntimeError::unavailable(
                    format!("restore VM {name} from the {} snapshot", spec.template),
                    e,
                )
            }),
            Err(e) => {
                drop(pending);
                Err(e)
            }
        };
        let (child, qmp, restore) = match restored {
            Ok(r) => (r.child, r.qmp, r.times),
            Err(e) => {
                let m = Machine {
                    name,
                    dir,
                    pid,
                    cgroup,
                    slot: std::sync::Mutex::new(Some(slot)),
                    exit: tokio::sync::watch::channel(Some(String::new())).1,
                    qmp: None,
                    source: None,
                    run_as,
                    allow_internet_access: spec.allow_internet_access,
                };
                self.teardown(&m).await;
                return Err(e);
            }
        };
        tracing::debug!(
            sandbox = %spec.id,
            qemu_waiting_ms = waiting.as_millis() as u64,
            running_ms = started.elapsed().as_millis() as u64,
            "VM restored"
        );
        let exit = machine::watch_child(
            child,
            cgroup.clone(),
            dir.clone(),
            self.on_exit(spec.id.to_string()),
        );
        let m = Arc::new(Machine {
            name,
            dir,
            pid,
            cgroup,
            slot: std::sync::Mutex::new(Some(slot)),
            exit,
            qmp: Some(Arc::new(qmp)),
            source: Some(source),
            run_as,
            allow_internet_access: spec.allow_internet_access,
        });
        let stages = Stages {
            waiting,
            restore,
            ..Stages::default()
        };
        Ok((m, agent, stages))
    }

    /// Restores a VM for `spec` (from `checkpoint`, else its template), registers it and
    /// initialises its agent (`current_token`: the token that agent still wants, if it was
    /// restored from another sandbox's memory).
    pub(super) async fn launch(
        &self,
        spec: CreateSpec,
        checkpoint: Option<&Snapshot>,
        current_token: Option<&str>,
    ) -> Result<RuntimeSandbox, RuntimeError> {
        let (m, agent, mut stages) = self.fork(&spec, checkpoint).await?;
        let running = Instant::now();
        m.own_flows(self.net.get(), &spec.id);
        // Registered before /init so that a QEMU dying now is torn down by its watcher.
        self.live
            .lock()
            .await
            .insert(spec.id.to_string(), m.clone());
        let env = warren_host::agent::sandbox_env(&spec);
        let launch = warren_template::launch(&spec.template, &self.cfg.data_dir)
            .map_err(|e| warren_host::image_error(&spec.template, e))?;
        let mounts = nfs::agent_mounts(&spec.volumes);
        let ready = async {
            let init = agent::InitArgs {
                env_vars: &env,
                access_token: spec.access_token.as_deref(),
                current_token,
                signed_url_max_age: self.cfg.signed_url_max_age,
                timeout: self.cfg.ready_timeout,
                launch: &launch,
                ca_bundle: self.cfg.ca_bundle(),
                volume_mounts: &mounts,
            };
            // `wait_and_init`, in two steps to time them.
            stages.agent = async {
                agent::wait_healthy(&self.client, agent, self.cfg.ready_timeout).await?;
                let answered = running.elapsed();
                agent::init(&self.client, agent, &init).await?;
                Ok::<_, RuntimeError>(answered)
            }
            .instrument(tracing::info_span!("agent.init"))
            .await?;
            // A VM restored with memory (every fork of the template snapshot, which was
            // taken with the service ready; a resume; a snapshot's child) has the template's
            // service running already; one booted from a disk-only checkpoint starts it.
            let Some(cmd) = &launch.start else {
                return Ok(());
            };
            let token = spec.access_token.as_deref();
            if checkpoint.is_none_or(|c| c.has_memory()) {
                agent::wait_ready(&self.client, agent, token, cmd).await
            } else {
                agent::run_start_command(&self.client, agent, token, cmd).await
            }
        };
        if let Err(e) = ready.await {
            self.live.lock().await.remove(spec.id.as_str());
            let why = m.exit.borrow().clone();
            m.kill().await;
            self.teardown(&m).await;
            let what = match why {
                Some(w) => format!("sandbox {} did not get ready ({w})", spec.id),
                None => format!("sandbox {} did not get ready", spec.id),
            };
            return Err(RuntimeError::unavailable(what, e));
        }
        stages.init = running.elapsed() - stages.agent;
        stages.log(&spec.id);
        let record = Record::running(&m);
        Ok(RuntimeSandbox {
            id: spec.id.to_string(),
            agent,
            record: warren_runtime::tag_record(
                "vm",
                // A plain struct always encodes: failing is a bug.
                serde_json::to_value(&record).map_err(failed)?,
            ),
        })
    }
}

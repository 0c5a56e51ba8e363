//! The create path of the vm runtime: a running VM for a sandbox, from a warm QEMU or a
//! fresh one restored from the template's snapshot or the sandbox's checkpoint.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use tracing::Instrument;
use warren_host::agent;
use warren_runtime::{CreateSpec, RuntimeError, RuntimeSandbox};

use super::{failed, machine, nfs, slot_failed, Machine, Record, VmRuntime, Warm};
use crate::snapshot::Snapshot;

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
            .map_err(|e| RuntimeError::Exhausted(format!("no network slot: {e}")))?;
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
    ) -> Result<(Arc<Machine>, SocketAddr), RuntimeError> {
        let started = std::time::Instant::now();
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
        let warm = match self.take_warm(&spec.template, size).await {
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
        self.complete(spec, warm, started)
            .instrument(tracing::info_span!("vm.restore"))
            .await
    }

    /// Loads the state into a waiting QEMU and watches it.
    pub(super) async fn complete(
        &self,
        spec: &CreateSpec,
        warm: Warm,
        started: std::time::Instant,
    ) -> Result<(Arc<Machine>, SocketAddr), RuntimeError> {
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
        let (child, qmp, _files) = match restored {
            Ok(r) => r,
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
            self.on_exit(spec.id.clone()),
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
        Ok((m, agent))
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
        let (m, agent) = self.fork(&spec, checkpoint).await?;
        m.own_flows(self.net.get(), &spec.id);
        // Registered before /init so that a QEMU dying now is torn down by its watcher.
        self.live.lock().await.insert(spec.id.clone(), m.clone());
        let mut env: BTreeMap<String, String> = spec.env_vars.clone();
        env.insert("E2B_SANDBOX".into(), "true".into());
        env.insert("E2B_SANDBOX_ID".into(), spec.id.clone());
        env.insert("E2B_TEMPLATE_ID".into(), spec.template.clone());
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
            agent::wait_and_init(&self.client, agent, &init).await?;
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
            self.live.lock().await.remove(&spec.id);
            let why = m.exit.borrow().clone();
            m.kill().await;
            self.teardown(&m).await;
            let what = match why {
                Some(w) => format!("sandbox {} did not get ready ({w})", spec.id),
                None => format!("sandbox {} did not get ready", spec.id),
            };
            return Err(RuntimeError::unavailable(what, e));
        }
        let record = Record::running(&m);
        Ok(RuntimeSandbox {
            id: spec.id,
            agent,
            record: warren_runtime::tag_record(
                "vm",
                // A plain struct always encodes: failing is a bug.
                serde_json::to_value(&record).map_err(failed)?,
            ),
        })
    }
}

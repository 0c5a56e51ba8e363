//! Taking VMs back after a server restart. QEMUs run in their own session and outlive the
//! server: every recorded VM whose QEMU still runs is adopted with its slot; a paused sandbox
//! is kept while its checkpoint is on disk; everything else this runtime owns on the host is
//! removed.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::qmp::Qmp;
use crate::snapshot::Snapshot;
use serde_json::json;
use warren_host::cgroup::SandboxCgroup;
use warren_host::SlotRecord;
use warren_net::Slot;
use warren_runtime::{PauseMode, RuntimeError, RuntimeSandbox};

use super::{failed, machine, Machine, Record, VmRuntime};

impl VmRuntime {
    pub(super) async fn reattach_now(
        &self,
        records: Vec<RuntimeSandbox>,
    ) -> Vec<(String, Result<RuntimeSandbox, RuntimeError>)> {
        let mut out = Vec::new();
        let (paused, running) = warren_host::split_records(records, |r: &Record| r.paused);
        for (r, _) in paused {
            let result = if Snapshot::open(&self.paused_dir(&r.id)).is_some() {
                self.paused.lock().await.insert(r.id.clone());
                Ok(r.clone())
            } else {
                Err(RuntimeError::unavailable_now(
                    "the paused sandbox's checkpoint is gone",
                ))
            };
            out.push((r.id, result));
        }
        let alive =
            |rec: &Record| crate::qemu::is_our_qemu(rec.pid, &self.vms_dir().join(&rec.name));
        // A VM whose pause finished (its checkpoint durable, its QEMU ended) before the
        // server that paused it could record the pause: paused, not lost.
        let (finished, running): (Vec<_>, Vec<_>) = running.into_iter().partition(|(r, rec)| {
            rec.as_ref().is_some_and(|rec| !alive(rec))
                && Snapshot::open(&self.paused_dir(&r.id)).is_some()
        });
        for (r, rec) in finished {
            let memory = Snapshot::open(&self.paused_dir(&r.id)).is_some_and(|c| c.has_memory());
            let record = Record {
                pid: 0,
                net: SlotRecord::unslotted(rec.is_some_and(|rec| rec.net.allow_internet_access)),
                name: String::new(),
                paused: true,
            };
            let result = serde_json::to_value(&record).map_err(failed).map(|v| {
                let mode = if memory { PauseMode::Memory } else { PauseMode::Filesystem };
                tracing::warn!(sandbox = %r.id, ?mode, "a pause finished while the server was down");
                warren_runtime::mark_finished_pause(warren_runtime::tag_record("vm", v), mode)
            });
            if result.is_ok() {
                self.paused.lock().await.insert(r.id.clone());
            }
            let id = r.id.clone();
            out.push((id, result.map(|record| RuntimeSandbox { record, ..r })));
        }
        let keep: Vec<String> = running
            .iter()
            .filter_map(|(_, rec)| rec.as_ref().filter(|r| alive(r)).map(|r| r.name.clone()))
            .collect();
        self.remove_stale_vms(keep).await;
        self.remove_unclaimed_checkpoints().await;
        let net = self.cfg.net.clone();
        let mut slots =
            match warren_host::start_adopting(&self.net, net, &running, |r| &r.net).await {
                Ok(slots) => slots,
                Err(failed) => {
                    out.extend(failed);
                    return out;
                }
            };
        for (r, rec) in running {
            let Some(rec) = rec else {
                // Records are this runtime's own, written by `create`: a bug or a damaged
                // store.
                out.push((r.id, Err(failed("unreadable runtime record"))));
                continue;
            };
            let dir = self.vms_dir().join(&rec.name);
            let result = match slots.next() {
                Some(Ok(slot)) => self.adopt(&r, &rec, slot, dir).await,
                Some(Err(e)) => {
                    {
                        // Kills a process and deletes its directory: on the blocking pool.
                        let (dir, parent) = (dir.clone(), self.cgroup_parent());
                        let _ = tokio::task::spawn_blocking(move || {
                            machine::remove_stale(&dir, &parent)
                        })
                        .await;
                    }
                    Err(RuntimeError::unavailable(
                        "the sandbox's network could not be kept",
                        e,
                    ))
                }
                // The pool answers every adoption it was asked for.
                None => Err(failed("no slot result")),
            };
            out.push((r.id, result));
        }
        out
    }

    /// Takes back one VM of an earlier run: its QEMU must run and answer on its QMP socket.
    /// A VM the previous server left stopped (a pause it never acknowledged, a snapshot it
    /// did not finish) is continued: it is still the running sandbox the record says.
    async fn adopt(
        &self,
        r: &RuntimeSandbox,
        rec: &Record,
        slot: Slot,
        dir: PathBuf,
    ) -> Result<RuntimeSandbox, RuntimeError> {
        let qmp_path = dir.join("qmp.sock");
        let qmp = if crate::qemu::is_our_qemu(rec.pid, &dir) {
            match Qmp::connect(&qmp_path, Duration::from_secs(5)).await {
                Ok(q) => match q.status().await {
                    Ok(s) if s == "running" => Ok(q),
                    Ok(s) if s == "paused" || s == "postmigrate" => {
                        tracing::warn!(sandbox = %r.id, state = %s, "continuing a VM left stopped");
                        match q.execute("cont", json!({})).await {
                            Ok(_) => Ok(q),
                            Err(e) => Err(crate::Error::runtime(format!(
                                "the VM was {s} and cannot continue"
                            ))(e)),
                        }
                    }
                    Ok(s) => Err(RuntimeError::unavailable_now(format!("the VM is {s}"))),
                    Err(e) => Err(crate::Error::runtime("ask the VM its state")(e)),
                },
                Err(e) => Err(crate::Error::runtime("connect to the VM's QMP socket")(e)),
            }
        } else {
            Err(RuntimeError::unavailable_now(
                "the VM's QEMU ended while the server was down",
            ))
        };
        let qmp = match qmp {
            Ok(q) => q,
            Err(e) => {
                {
                    // Kills a process and deletes its directory: on the blocking pool.
                    let (dir, parent) = (dir.clone(), self.cgroup_parent());
                    let _ =
                        tokio::task::spawn_blocking(move || machine::remove_stale(&dir, &parent))
                            .await;
                }
                self.remove_links(&rec.name);
                self.release_slot(slot).await;
                return Err(e);
            }
        };
        let cgroup = SandboxCgroup::at(&self.cgroup_parent(), &rec.name);
        // Its volumes' server normally outlives the server too; one that did not is started
        // again (the guest's hard mounts wait for it meanwhile).
        let helper = super::nfs::Helper {
            bin: &self.settings.nfsd_bin,
            key: &self.nfs_key,
            netns: &slot.netns_path(),
            dir: &dir,
            cgroup: &cgroup,
        };
        match super::nfs::ensure_running(&helper).await {
            Ok(true) => tracing::warn!(sandbox = %r.id, "restarted the VM's NFS helper"),
            Ok(false) => {}
            Err(e) => tracing::error!(
                sandbox = %r.id,
                error = %warren_runtime::chain(&e),
                "the VM's NFS helper could not be restarted: its volumes do not answer"
            ),
        }
        let exit = machine::watch_pid(
            rec.pid,
            cgroup.clone(),
            dir.clone(),
            self.on_exit(r.id.clone()),
        );
        let run_as = self.run_as(&slot);
        let m = Arc::new(Machine {
            name: rec.name.clone(),
            source: machine::read_source(&dir),
            dir,
            pid: rec.pid,
            cgroup,
            slot: std::sync::Mutex::new(Some(slot)),
            exit,
            qmp: Some(Arc::new(qmp)),
            run_as,
            allow_internet_access: rec.net.allow_internet_access,
        });
        let agent = {
            let s = m.slot.lock().unwrap_or_else(|e| e.into_inner());
            s.as_ref().map(|s| SocketAddr::V4(s.agent_endpoint()))
        };
        m.own_flows(self.net.get(), &r.id);
        self.live.lock().await.insert(r.id.clone(), m);
        Ok(RuntimeSandbox {
            id: r.id.clone(),
            agent: agent.unwrap_or(r.agent),
            record: r.record.clone(),
        })
    }
}

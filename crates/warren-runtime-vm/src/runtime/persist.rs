//! Pause, resume, snapshots and forks of VM sandboxes, all made of one operation: a
//! **checkpoint** of the running VM (disk, and memory with device state; see
//! [`crate::checkpoint`]), from which a sandbox starts much as from a template.
//!
//! - **Pause**: checkpoint into `<data_dir>/vm-checkpoints/paused/<id>` (memory in the form the
//!   VM writes itself, or with a filesystem pause the disk only), then the VM is killed and its
//!   slot freed: a paused sandbox holds disk, not memory. **Resume** restores it on this host:
//!   its processes continue where they were (or, from a disk only, it boots).
//! - **Snapshot**: checkpoint into `<data_dir>/vm-checkpoints/snapshots/<key>`, the VM then
//!   continues; its memory is turned into the form of a template snapshot, so the sandboxes
//!   created from it (forks) map it copy-on-write and share its pages.
//!
//! Each checkpoint is durable (every file fsynced, renamed into place, parent synced) before
//! the call returns. A VM restored from a checkpoint keeps a hard link of the checkpoint's disk
//! in `<data_dir>/vm-checkpoints/disks/<vm>.disk`, so deleting the snapshot or resuming (which
//! deletes the paused checkpoint) never takes the base of its disk away.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;
use warren_runtime::{
    CreateSpec, PauseMode, ResumeKind, RuntimeError, RuntimeSandbox, SnapshotInfo,
};

use crate::checkpoint::{self, CaptureSpec};
use crate::snapshot::Snapshot;

use super::{failed, machine, Machine, Record, VmRuntime};
use warren_host::durable::{failed as io_failed, valid_key};

/// Run in the guest before a disk-only checkpoint: every process but init (PID 1), the agent
/// (this shell's parent) and the shell itself stops, twice over to catch children forked
/// meanwhile, so nothing writes after the guest's caches are flushed to its disk.
const QUIESCE: &str = "for round in 1 2; do for d in /proc/[0-9]*; do p=${d#/proc/}; \
    case $p in 1|$PPID|$$) ;; *) kill -STOP $p 2>/dev/null ;; esac; done; done; sync";
/// Undoes [`QUIESCE`] when the checkpoint failed and the sandbox runs on.
const UNQUIESCE: &str = "for d in /proc/[0-9]*; do p=${d#/proc/}; \
    case $p in 1|$PPID|$$) ;; *) kill -CONT $p 2>/dev/null ;; esac; done; true";

impl VmRuntime {
    /// Runs `script` as root in the guest of `m` (see [`QUIESCE`]).
    async fn quiesce(
        &self,
        m: &Machine,
        agent: SocketAddr,
        script: &str,
    ) -> Result<(), RuntimeError> {
        let token = machine::read_token(&m.dir);
        match warren_host::agent::run_as_root(&self.client, agent, token.as_deref(), script).await {
            Ok(0) => Ok(()),
            Ok(code) => Err(RuntimeError::unavailable_now(format!(
                "stopping or continuing the guest's processes exited with {code}"
            ))),
            Err(e) => Err(RuntimeError::unavailable(
                "stopping or continuing the guest's processes",
                e,
            )),
        }
    }

    fn checkpoints_dir(&self) -> PathBuf {
        self.cfg.data_dir.join("vm-checkpoints")
    }

    pub(super) fn paused_dir(&self, id: &str) -> PathBuf {
        self.checkpoints_dir().join("paused").join(id)
    }

    fn snapshot_dir(&self, key: &str) -> PathBuf {
        self.checkpoints_dir().join("snapshots").join(key)
    }

    /// The hard link of its checkpoint's disk that VM `name` keeps while it runs.
    pub(super) fn disk_link(&self, name: &str) -> PathBuf {
        self.checkpoints_dir()
            .join("disks")
            .join(format!("{name}.disk"))
    }

    /// The hard link of its template snapshot's disk that VM `name` keeps while it runs.
    pub(super) fn template_link(&self, name: &str) -> PathBuf {
        self.cfg
            .run_dir
            .join("vm/links")
            .join(format!("{name}.disk"))
    }

    /// Removes both kinds of disk link VM `name` may have.
    pub(super) fn remove_links(&self, name: &str) {
        let _ = std::fs::remove_file(self.disk_link(name));
        let _ = std::fs::remove_file(self.template_link(name));
    }

    /// The backing file of VM `name`'s overlay (the link it keeps) and its format.
    pub(super) fn backing_of(&self, name: &str) -> Option<(PathBuf, &'static str)> {
        [self.template_link(name), self.disk_link(name)]
            .into_iter()
            .find(|p| p.exists())
            .map(|p| {
                let mut magic = [0u8; 4];
                let qcow2 = std::fs::File::open(&p)
                    .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
                    .is_ok()
                    && magic == *b"QFI\xfb";
                (p, if qcow2 { "qcow2" } else { "raw" })
            })
    }

    /// Names of the VMs that have a disk link.
    pub(super) fn disk_link_names(&self) -> Vec<String> {
        std::fs::read_dir(self.checkpoints_dir().join("disks"))
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| {
                        let n = e.file_name().to_string_lossy().into_owned();
                        n.strip_suffix(".disk").map(str::to_string)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The checkpoint of snapshot `key`, for a create from it.
    pub(super) fn saved_snapshot(&self, key: &str) -> Result<Snapshot, RuntimeError> {
        valid_key(key)
            .then(|| Snapshot::open(&self.snapshot_dir(key)))
            .flatten()
            .ok_or_else(|| RuntimeError::UnknownTemplate(format!("snapshot {key}")))
    }

    /// After a restart: removes paused checkpoints no paused sandbox owns (a pause the
    /// previous server never acknowledged, a sandbox that is gone) and unfinished or
    /// discarded checkpoints.
    pub(super) async fn remove_unclaimed_checkpoints(&self) {
        let paused = self.paused.lock().await.clone();
        for (kind, owned) in [("paused", Some(&paused)), ("snapshots", None)] {
            let Ok(rd) = std::fs::read_dir(self.checkpoints_dir().join(kind)) else {
                continue;
            };
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let leftover = name.ends_with(".partial") || name.ends_with(".trash");
                let unowned = owned.is_some_and(|o| !o.contains(&name));
                if leftover || unowned {
                    tracing::info!(checkpoint = %name, kind, "removing a checkpoint nothing owns");
                    crate::error::remove_tree(&e.path()).await;
                }
            }
        }
    }

    /// The running VM of sandbox `id`.
    async fn running(&self, id: &str) -> Result<Arc<Machine>, RuntimeError> {
        if self.paused.lock().await.contains(id) {
            return Err(RuntimeError::InvalidArgument(format!(
                "sandbox {id} is paused"
            )));
        }
        let m = self
            .live
            .lock()
            .await
            .get(id)
            .cloned()
            .ok_or_else(|| RuntimeError::NotFound(id.to_string()))?;
        if let Some(reason) = m.exit.borrow().clone() {
            return Err(RuntimeError::Conflict(format!(
                "sandbox {id} has ended: {reason}"
            )));
        }
        Ok(m)
    }

    /// Checkpoints VM `m` into `dest` (replacing an earlier one atomically): its disk, and with
    /// `memory` its memory and device state. Durable when it returns. For a pause
    /// (`snapshot: false`) the VM is left stopped; for a snapshot it continues as soon as its
    /// state is written, and the memory is then turned into the shared form its children map
    /// copy-on-write. On failure the VM runs on as before.
    async fn checkpoint(
        &self,
        m: &Machine,
        dest: &Path,
        memory: bool,
        snapshot: bool,
    ) -> Result<u64, RuntimeError> {
        let qmp = m
            .qmp
            .clone()
            .ok_or_else(|| failed("the VM has no QMP connection"))?;
        let source = m.source.clone().ok_or_else(|| {
            failed("what the VM was restored from is not recorded; it cannot be checkpointed")
        })?;
        let netns = m
            .slot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|s| s.netns_path());
        let parent = dest.parent().ok_or_else(|| failed("checkpoint path"))?;
        crate::snapshot::private_dir(parent)
            .map_err(crate::Error::runtime("create the checkpoint directory"))?;
        let staging = warren_host::durable::sibling(dest, "partial");
        crate::error::remove_tree(&staging).await;
        let unfinished = warren_host::durable::RemoveOnDrop::new(&staging);
        let (backing, backing_format) = self.backing_of(&m.name).ok_or_else(|| {
            failed("the VM's disk has no recorded base; it cannot be checkpointed")
        })?;
        let spec = CaptureSpec {
            qemu: self.settings.qemu.clone(),
            source,
            disk: m.dir.join("disk.qcow2"),
            backing,
            backing_format,
            outbox: crate::snapshot::VmFiles::new(&m.dir).out,
            network: true,
            netns,
            run_as: m.run_as,
            work: self.captures_dir().join(&m.name),
            memory,
        };
        if let Err(e) = checkpoint::capture(&qmp, &spec, &staging).await {
            crate::error::remove_tree(&staging).await;
            return Err(crate::Error::runtime("checkpoint")(e));
        }
        let started = std::time::Instant::now();
        let mut continued = Ok(());
        if snapshot {
            continued = qmp.execute("cont", json!({})).await.map(drop);
        }
        let installed = async {
            if snapshot && memory {
                checkpoint::share(&spec, &staging)
                    .await
                    .map_err(std::io::Error::other)?;
            }
            machine::write_token(&staging, machine::read_token(&m.dir).as_deref())?;
            warren_host::durable::install(&staging, dest).await
        }
        .await;
        tracing::debug!(
            vm = %m.name,
            install_ms = started.elapsed().as_millis() as u64,
            "checkpoint durable"
        );
        match installed {
            Ok(bytes) => {
                unfinished.disarm();
                continued.map_err(crate::Error::runtime(
                    "the snapshot was saved but the sandbox did not continue",
                ))?;
                Ok(bytes)
            }
            Err(e) => {
                crate::error::remove_tree(&staging).await;
                if !snapshot {
                    let _ = qmp.execute("cont", json!({})).await;
                }
                Err(io_failed("save the checkpoint")(e))
            }
        }
    }

    pub(super) async fn pause_now(
        &self,
        id: &str,
        mode: PauseMode,
    ) -> Result<RuntimeSandbox, RuntimeError> {
        let m = self.running(id).await?;
        let agent = m
            .agent()
            .ok_or_else(|| failed("the VM has no network slot"))?;
        // A paused VM is restored at most once: its memory stays in the form the VM wrote
        // itself, read back into the resumed VM's own RAM.
        let memory = mode == PauseMode::Memory;
        if !memory {
            self.quiesce(&m, agent, QUIESCE).await?;
        }
        if let Err(e) = self
            .checkpoint(&m, &self.paused_dir(id), memory, false)
            .await
        {
            if !memory {
                let _ = self.quiesce(&m, agent, UNQUIESCE).await;
            }
            return Err(e);
        }
        // Durable: the VM itself is no longer needed.
        self.paused.lock().await.insert(id.to_string());
        self.live.lock().await.remove(id);
        m.kill().await;
        self.teardown(&m).await;
        let record = Record {
            pid: 0,
            net: warren_host::SlotRecord::unslotted(m.allow_internet_access),
            name: String::new(),
            paused: true,
        };
        Ok(RuntimeSandbox {
            id: id.to_string(),
            agent,
            record: warren_runtime::tag_record(
                "vm",
                serde_json::to_value(&record).map_err(failed)?,
            ),
        })
    }

    pub(super) async fn resume_now(
        &self,
        spec: CreateSpec,
    ) -> Result<(RuntimeSandbox, ResumeKind), RuntimeError> {
        let id = spec.id.to_string();
        if !self.paused.lock().await.contains(&id) {
            return Err(if self.live.lock().await.contains_key(&id) {
                RuntimeError::InvalidArgument(format!("sandbox {id} is not paused"))
            } else {
                RuntimeError::NotFound(id)
            });
        }
        let dir = self.paused_dir(&id);
        let checkpoint = Snapshot::open(&dir).ok_or_else(|| {
            RuntimeError::unavailable_now(format!(
                "the checkpoint of paused sandbox {id} is missing"
            ))
        })?;
        let spec = CreateSpec {
            from_snapshot: None,
            ..spec
        };
        // From a memory checkpoint the agent wakes up with the token it had at the pause;
        // from a disk-only one a fresh agent boots.
        let (token, kind) = if checkpoint.has_memory() {
            (machine::read_token(&dir), ResumeKind::Memory)
        } else {
            (None, ResumeKind::Filesystem)
        };
        let sandbox = self
            .launch(spec, Some(&checkpoint), token.as_deref())
            .await?;
        self.paused.lock().await.remove(&id);
        // The new VM keeps what it needs (its memory mapped, a link of the disk).
        warren_host::durable::discard_dir(&dir);
        Ok((sandbox, kind))
    }

    pub(super) async fn snapshot_now(
        &self,
        id: &str,
        key: &str,
        memory: bool,
    ) -> Result<SnapshotInfo, RuntimeError> {
        if !valid_key(key) {
            return Err(RuntimeError::InvalidArgument(format!(
                "invalid snapshot key {key:?}"
            )));
        }
        let m = self.running(id).await?;
        let agent = m
            .agent()
            .ok_or_else(|| failed("the VM has no network slot"))?;
        if !memory {
            self.quiesce(&m, agent, QUIESCE).await?;
        }
        // Many sandboxes may start from a snapshot: they share its memory copy-on-write.
        let saved = self
            .checkpoint(&m, &self.snapshot_dir(key), memory, true)
            .await;
        if !memory {
            self.quiesce(&m, agent, UNQUIESCE).await?;
        }
        Ok(SnapshotInfo {
            memory,
            bytes: saved?,
        })
    }

    pub(super) fn snapshot_keys_now(&self) -> Vec<String> {
        warren_host::durable::complete_entries(&self.checkpoints_dir().join("snapshots"))
    }

    pub(super) fn delete_snapshot_now(&self, key: &str) -> Result<(), RuntimeError> {
        let dir = self.snapshot_dir(key);
        if !valid_key(key) || !dir.is_dir() {
            return Err(RuntimeError::NotFound(format!("snapshot {key}")));
        }
        // VMs started from it keep their memory mapping and disk link.
        warren_host::durable::discard_dir(&dir);
        Ok(())
    }
}

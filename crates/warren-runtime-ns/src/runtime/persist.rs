//! Pause, resume and snapshots of namespace sandboxes.
//!
//! - **Memory pause** freezes every process of the sandbox (cgroup freezer) and keeps its
//!   network slot: resume thaws them and they continue where they were. The sandbox's disk is
//!   also synced and kept (linked, not copied) while it is frozen, so if its memory is lost
//!   while paused (the host reboots) it still resumes, from its files.
//! - **Filesystem pause** keeps the sandbox's disk the same way, then kills the sandbox and
//!   frees its slot; resume starts a new sandbox on that same disk (linked back, not copied).
//! - **Snapshots** copy the disk of a briefly frozen sandbox (by data, or as a reflink where
//!   the data disk's filesystem can), which then runs on; new sandboxes start on a copy. They
//!   carry files, not processes.
//!
//! Saved layers live on the data disk: `<data_dir>/paused/<id>` and
//! `<data_dir>/snapshots/<key>`. Every save is durable before the call returns, which is what
//! lets the control plane acknowledge a pause.

use std::net::SocketAddr;
use std::path::PathBuf;

use warren_host::cgroup::SandboxCgroup;
use warren_host::durable::{blocking, complete_entries, discard_dir, failed, valid_key};
use warren_runtime::{
    CreateSpec, PauseMode, ResumeKind, RuntimeError, RuntimeSandbox, SnapshotInfo,
};

use super::{NsRuntime, Record};
use crate::launch::Seed;
use crate::layer;

/// How a save keeps a sandbox's files.
#[derive(Clone, Copy)]
enum Keep {
    /// Its disk, linked: a pause (the sandbox does not write to it until the pause ends).
    Link,
    /// A copy of its disk: a snapshot.
    Copy,
    /// A copy of its upper directory as a tree: the staging of an export.
    Tree,
}

/// Host id ranges that saved layers under `data_dir` (pauses and snapshots) are owned by: a
/// new sandbox must not get one of them, or it could reach those files on the host.
pub(super) fn saved_id_bases(data_dir: &std::path::Path) -> Vec<u32> {
    let mut out = Vec::new();
    for sub in ["paused", "snapshots"] {
        let dir = data_dir.join(sub);
        for name in complete_entries(&dir) {
            if let Ok(base) = layer::saved_id_base(&dir.join(name)) {
                out.push(base);
            }
        }
    }
    out
}

/// What an operation needs of a live sandbox, taken without holding the runtime's lock over
/// slow copies (the control plane serialises operations on one sandbox).
pub(super) struct Handle {
    pub(super) cgroup: SandboxCgroup,
    id_base: u32,
    upper: PathBuf,
    /// The sandbox's disk: its image and where the host mounts it.
    disk: PathBuf,
    disk_mount: PathBuf,
    pub(super) agent: SocketAddr,
    pub(super) record: Record,
}

impl NsRuntime {
    pub(crate) fn paused_dir(&self, id: &str) -> PathBuf {
        self.cfg.data_dir.join("paused").join(id)
    }

    fn snapshot_dir(&self, key: &str) -> PathBuf {
        self.cfg.data_dir.join("snapshots").join(key)
    }

    /// The saved layer a create from snapshot `key` starts on.
    pub(crate) fn snapshot_seed(&self, key: &str) -> Result<Seed, RuntimeError> {
        let dir = self.snapshot_dir(key);
        if valid_key(key) && layer::exists(&dir) {
            Ok(Seed { dir, take: false })
        } else {
            Err(RuntimeError::UnknownTemplate(format!("snapshot {key}")))
        }
    }

    /// Deletes the saved files of a paused sandbox, if any.
    pub(crate) async fn forget_saved(&self, id: &str) -> Result<(), RuntimeError> {
        let dir = self.paused_dir(id);
        blocking(move || layer::remove(&dir))
            .await
            .map_err(failed("remove the saved filesystem"))
    }

    /// Deletes the saved files of a resumed sandbox without making the resume wait: they are
    /// renamed out of the way at once (a new pause may save there right away) and deleted in
    /// the background. A crash before the deletion leaves a `.trash` directory that the next
    /// start's sweep removes.
    fn discard_saved(&self, id: &str) {
        discard_dir(&self.paused_dir(id));
    }

    /// After a restart: removes saved layers of sandboxes that are not paused (a pause the
    /// previous server never acknowledged, or a sandbox that is gone).
    pub(crate) async fn remove_unclaimed_saves(
        &self,
        reattached: &[(String, Result<RuntimeSandbox, RuntimeError>)],
    ) {
        let Ok(dir) = std::fs::read_dir(self.cfg.data_dir.join("paused")) else {
            return;
        };
        let paused_fs = self.paused_fs.lock().await;
        let live = self.live.lock().await;
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let id = name.strip_suffix(".partial").unwrap_or(&name);
            let claimed = !name.ends_with(".partial")
                && !name.ends_with(".trash")
                && (paused_fs.contains(id)
                    || (live.get(id).is_some_and(|l| l.sandbox.cgroup.is_frozen())
                        && reattached.iter().any(|(i, r)| i == id && r.is_ok())));
            if !claimed {
                tracing::info!(sandbox = %id, "removing a saved filesystem no paused sandbox owns");
                let _ = warren_host::durable::remove_tree_async(&entry.path()).await;
            }
        }
    }

    pub(super) async fn handle(&self, id: &str) -> Result<Handle, RuntimeError> {
        let live = self.live.lock().await;
        let Some(l) = live.get(id) else {
            return Err(if self.paused_fs.lock().await.contains(id) {
                RuntimeError::InvalidArgument(format!("sandbox {id} is paused"))
            } else {
                RuntimeError::NotFound(id.to_string())
            });
        };
        Ok(Handle {
            cgroup: l.sandbox.cgroup.clone(),
            id_base: l.sandbox.id_base,
            upper: l.sandbox.upper_dir(),
            disk: l.sandbox.disk.clone(),
            disk_mount: l.sandbox.disk_mount(),
            agent: SocketAddr::V4(l.slot.agent_endpoint()),
            record: Record::running(l.sandbox.pid1, &l.slot, l.template.clone()),
        })
    }

    /// Saves the layer of a sandbox into `dest` while its processes are frozen, as `keep`
    /// says. Leaves it frozen if `stay_frozen`, else as it was.
    async fn save_frozen(
        &self,
        h: &Handle,
        dest: PathBuf,
        stay_frozen: bool,
        keep: Keep,
    ) -> Result<u64, RuntimeError> {
        let was_frozen = h.cgroup.is_frozen();
        let cg = h.cgroup.clone();
        blocking(move || cg.freeze())
            .await
            .map_err(failed("freeze the sandbox"))?;
        let saved = match keep {
            Keep::Tree => layer::save(&h.upper, &dest, h.id_base).await,
            Keep::Link | Keep::Copy => {
                let mount = h.disk_mount.clone();
                match blocking(move || crate::disk::sync(&mount)).await {
                    Ok(()) => {
                        layer::save_disk(&h.disk, &dest, h.id_base, matches!(keep, Keep::Link))
                            .await
                    }
                    Err(e) => Err(e),
                }
            }
        };
        if saved.is_err() || (!stay_frozen && !was_frozen) {
            let cg = h.cgroup.clone();
            blocking(move || cg.thaw())
                .await
                .map_err(failed("thaw the sandbox"))?;
        }
        saved.map_err(failed("save the sandbox's filesystem"))
    }

    pub(crate) async fn pause_now(
        &self,
        id: &str,
        mode: PauseMode,
    ) -> Result<RuntimeSandbox, RuntimeError> {
        let h = self.handle(id).await?;
        if h.cgroup.is_frozen() {
            return Err(RuntimeError::InvalidArgument(format!(
                "sandbox {id} is paused"
            )));
        }
        self.save_frozen(&h, self.paused_dir(id), true, Keep::Link)
            .await?;
        let record = Record {
            paused: Some(mode),
            ..h.record
        };
        if mode == PauseMode::Filesystem {
            let live = self.live.lock().await.remove(id);
            if let Some(live) = live {
                let destroyed = live.sandbox.destroy().await;
                if let Some(pool) = self.net.get() {
                    if let Err(e) = pool.release(live.slot).await {
                        tracing::warn!(sandbox = %id, error = %e, "could not release the network slot");
                    }
                }
                // Its files are safe on disk; a failure to clean up is the host's problem,
                // not the sandbox's.
                if let Err(e) = destroyed {
                    tracing::warn!(sandbox = %id, error = %e, "cleanup after a filesystem pause");
                }
            }
            self.paused_fs.lock().await.insert(id.to_string());
        }
        let record = Record {
            pid1: if mode == PauseMode::Filesystem {
                0
            } else {
                record.pid1
            },
            ..record
        };
        Ok(RuntimeSandbox {
            id: id.to_string(),
            agent: h.agent,
            record: super::tagged(&record)?,
        })
    }

    pub(crate) async fn resume_now(
        &self,
        spec: CreateSpec,
    ) -> Result<(RuntimeSandbox, ResumeKind), RuntimeError> {
        let id = spec.id.to_string();
        if self.paused_fs.lock().await.contains(&id) {
            let seed = Seed {
                dir: self.paused_dir(&id),
                take: true,
            };
            // Take it out of the paused set for the create, and put it back if that fails:
            // the saved files stay until the new sandbox runs.
            self.paused_fs.lock().await.remove(&id);
            let spec = CreateSpec {
                from_snapshot: None,
                ..spec
            };
            return match self.create_from(spec, Some(seed)).await {
                Ok(sandbox) => {
                    self.discard_saved(&id);
                    Ok((sandbox, ResumeKind::Filesystem))
                }
                Err(e) => {
                    self.paused_fs.lock().await.insert(id);
                    Err(e)
                }
            };
        }
        // A policy changed while it was paused applies before its processes run again.
        self.set_egress_now(&id, &spec.egress_policy()).await?;
        let h = self.handle(&id).await?;
        let cg = h.cgroup.clone();
        blocking(move || cg.thaw())
            .await
            .map_err(failed("thaw the sandbox"))?;
        self.discard_saved(&id);
        Ok((
            RuntimeSandbox {
                id,
                agent: h.agent,
                record: super::tagged(&h.record)?,
            },
            ResumeKind::Memory,
        ))
    }

    pub(crate) async fn snapshot_now(
        &self,
        id: &str,
        key: &str,
    ) -> Result<SnapshotInfo, RuntimeError> {
        if !valid_key(key) {
            return Err(RuntimeError::InvalidArgument(format!(
                "invalid snapshot key {key:?}"
            )));
        }
        let h = self.handle(id).await?;
        let bytes = self
            .save_frozen(&h, self.snapshot_dir(key), false, Keep::Copy)
            .await?;
        Ok(SnapshotInfo {
            memory: false,
            bytes,
        })
    }

    /// Packs a sandbox's root filesystem (its template with the sandbox's changes) into the
    /// erofs image `out`: its upper layer is saved while it is frozen, its ids shifted back
    /// from the sandbox's host range to the image's own (root = 0), and the two layers
    /// merged and packed.
    pub(crate) async fn export_now(
        &self,
        id: &str,
        out: &std::path::Path,
    ) -> Result<(), RuntimeError> {
        let h = self.handle(id).await?;
        let template = h.record.template.clone().ok_or_else(|| {
            RuntimeError::Unsupported(format!(
                "sandbox {id} was started by an older server, which did not record its template"
            ))
        })?;
        let root = self.template_root(&template).await?;
        let staging = out.with_extension("layer");
        self.save_frozen(&h, staging.clone(), false, Keep::Tree)
            .await?;
        let (out, id_base, st) = (out.to_path_buf(), h.id_base, staging.clone());
        let packed = tokio::task::spawn_blocking(move || {
            let upper = layer::upper_of(&st);
            layer::shift_ids(&upper, id_base, 0)
                .map_err(RuntimeError::io("shift the layer's ids to the image's"))?;
            warren_template::pack_layers(&[upper.as_path(), root.path()], &out)
                .map_err(|e| RuntimeError::unavailable("pack the sandbox's filesystem", e))
        })
        .await
        .map_err(|e| RuntimeError::Failed(format!("pack task: {e}")))?;
        let _ = warren_host::durable::remove_tree_async(&staging).await;
        packed
    }

    pub(crate) fn snapshot_keys_now(&self) -> Vec<String> {
        complete_entries(&self.cfg.data_dir.join("snapshots"))
    }

    pub(crate) fn delete_snapshot_now(&self, key: &str) -> Result<(), RuntimeError> {
        let dir = self.snapshot_dir(key);
        if !valid_key(key) || !layer::exists(&dir) {
            return Err(RuntimeError::NotFound(format!("snapshot {key}")));
        }
        layer::remove(&dir).map_err(failed("delete the snapshot"))
    }
}

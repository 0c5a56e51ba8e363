//! Restoring a fork: a QEMU started waiting for its incoming state ([`Pending`]), then the
//! state loaded and the VM run ([`Pending::complete`]), with how long each stage took.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;
use warren_host::durable::blocking;

use crate::error::{Error, Result};
use crate::qemu;
use crate::qmp::Qmp;
use crate::snapshot::{
    connect_spawned, create_overlay, qemu_jail, set_capability, set_ignore_shared, virtual_size,
    wait_console, Snapshot, VmFiles, COLD_BOOT_TIMEOUT, LOG_CAP_BYTES,
};

/// How long the stages of one restore took: where a fork's time goes before its guest runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct RestoreTimes {
    /// The fork's directory, its disk overlay and the backing file's link.
    pub prepare: Duration,
    /// From starting QEMU until its QMP socket answers (QEMU's own start-up).
    pub qemu_start: Duration,
    /// From `migrate-incoming` until the saved state is loaded (for a disk-only checkpoint:
    /// until the booting guest's agent listens).
    pub load: Duration,
    /// From `cont` until QEMU reports the VM running.
    pub resume: Duration,
}

/// A restored, running VM.
pub struct Restored {
    pub child: tokio::process::Child,
    pub qmp: Qmp,
    pub files: VmFiles,
    pub times: RestoreTimes,
}

/// A fork whose QEMU runs and waits for its incoming state.
pub struct Pending {
    pub child: tokio::process::Child,
    pub qmp: Qmp,
    pub files: VmFiles,
    snapshot: Snapshot,
    /// The stages so far (`prepare`, `qemu_start`); [`Pending::complete`] adds the rest.
    pub times: RestoreTimes,
}

/// Where a fork lives and how it is started.
#[derive(Debug, Clone)]
pub struct ForkSpec {
    pub qemu: PathBuf,
    pub dir: PathBuf,
    pub tap: Option<String>,
    pub netns: Option<PathBuf>,
    pub run_as: Option<(u32, u32)>,
    /// Where to hard-link the snapshot's disk (same filesystem) so that the fork's overlay
    /// refers to a file of its own: deleting the snapshot then never takes the backing file
    /// away from a running fork, whose disk is read again when it is checkpointed.
    pub backing_link: Option<PathBuf>,
}

/// Written into every fork's directory: what it was restored from, so that a later
/// checkpoint (also by a restarted server) can start QEMU with the same command line.
pub const SOURCE_META: &str = "source.json";

impl Pending {
    /// Creates the fork's disk overlay and starts its QEMU waiting for an incoming snapshot.
    pub async fn spawn(snapshot: &Snapshot, spec: &ForkSpec) -> Result<Self> {
        let started = Instant::now();
        let files = VmFiles::new(&spec.dir);
        let disk = spec.dir.join("disk.qcow2");
        // Directories, a mount, a link and small writes: together on the blocking pool.
        let backing = {
            let (files, disk, snapshot, spec) =
                (files.clone(), disk.clone(), snapshot.clone(), spec.clone());
            blocking(move || {
                // The guest writes the console: its logs get a small filesystem of their own.
                files.create(spec.run_as.map(|_| LOG_CAP_BYTES))?;
                let _ = std::fs::remove_file(&disk);
                let meta = serde_json::to_vec(&snapshot.meta)
                    .map_err(|e| Error::Invalid(e.to_string()))?;
                let source = spec.dir.join(SOURCE_META);
                std::fs::write(&source, meta).map_err(Error::io("write", &source))?;
                Ok::<_, Error>(match &spec.backing_link {
                    Some(link) => {
                        let _ = std::fs::remove_file(link);
                        if let Some(parent) = link.parent() {
                            std::fs::create_dir_all(parent).map_err(Error::io("create", parent))?;
                        }
                        std::fs::hard_link(snapshot.disk(), link)
                            .map_err(Error::io("link", link))?;
                        link.clone()
                    }
                    None => snapshot.disk(),
                })
            })
            .await?
        };
        create_overlay(&backing, snapshot.disk_format(), &disk).await?;
        let mut cfg = snapshot.config(
            disk.clone(),
            "qcow2",
            &files,
            spec.tap.clone(),
            false,
            &spec.qemu,
        );
        let mut read = vec![backing];
        if !snapshot.shared_memory() {
            // The VM's RAM is its own, anonymous: it boots (a disk-only checkpoint) or reads
            // back its saved pages; untouched pages stay the kernel's shared zero page.
            cfg.mem_file = None;
            cfg.incoming = snapshot.has_memory();
            if cfg.incoming {
                read.push(snapshot.saved_ram());
            }
        } else {
            read.extend([snapshot.mem(), snapshot.state()]);
        }
        if let Some(user) = spec.run_as {
            // The overlay stays root's (0600): QEMU writes it through the jail's id-mapped
            // mount, and writes a checkpoint's memory into `out/`.
            let write = vec![disk.clone(), files.out.clone()];
            let bytes = virtual_size(&disk);
            cfg.jail = Some(qemu_jail(
                &cfg,
                user,
                files.root.clone(),
                read,
                write,
                bytes,
            ));
        }
        let prepare = started.elapsed();
        let mut child = qemu::spawn(
            &cfg,
            spec.netns.as_deref(),
            &files.log,
            qemu::Lifetime::Detached,
        )?;
        let qmp = connect_spawned(&mut child, &files).await?;
        Ok(Self {
            child,
            qmp,
            files,
            snapshot: snapshot.clone(),
            times: RestoreTimes {
                prepare,
                qemu_start: started.elapsed() - prepare,
                ..RestoreTimes::default()
            },
        })
    }

    /// The snapshot this fork is restored from.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// Loads the snapshot's device state and runs the VM (or, from a disk-only checkpoint,
    /// waits until the booting guest's agent listens).
    pub async fn complete(mut self) -> Result<Restored> {
        let started = Instant::now();
        if !self.snapshot.has_memory() {
            if let Err(e) = wait_console(&self.files, &mut self.child, COLD_BOOT_TIMEOUT).await {
                let _ = self.child.start_kill();
                let _ = self.child.wait().await;
                return Err(e);
            }
            self.times.load = started.elapsed();
            return Ok(self.restored());
        }
        // When `cont` went out (the state was loaded then).
        let mut resumed_at = None;
        let mut events = self.qmp.events();
        let result = async {
            let from = if self.snapshot.shared_memory() {
                set_ignore_shared(&self.qmp).await?;
                self.snapshot.state()
            } else {
                set_capability(&self.qmp, "mapped-ram", true).await?;
                self.snapshot.saved_ram()
            };
            self.qmp
                .execute(
                    "migrate-incoming",
                    json!({ "uri": format!("file:{}", from.display()) }),
                )
                .await?;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            // The load ends with a MIGRATION event (`completed`), `cont` with RESUME; each
            // state is read after subscribing, so no change between the two is missed.
            let mut recheck = crate::qmp::RECHECK_FIRST;
            loop {
                match self.qmp.status().await?.as_str() {
                    "running" => return Ok(resumed_at),
                    "paused" | "prelaunch" | "postmigrate" => {
                        resumed_at.get_or_insert_with(Instant::now);
                        self.qmp.execute("cont", json!({})).await?;
                    }
                    _ if tokio::time::Instant::now() > deadline => {
                        return Err(Error::QmpTimeout("incoming migration".into()))
                    }
                    _ => {
                        crate::qmp::next_event(
                            &mut events,
                            &["MIGRATION", "RESUME", "STOP"],
                            deadline,
                            recheck,
                        )
                        .await;
                        recheck = (recheck * 2).min(crate::qmp::RECHECK_MAX);
                    }
                }
            }
        }
        .await;
        match result {
            Ok(resumed_at) => {
                let resumed_at = resumed_at.unwrap_or_else(Instant::now);
                self.times.load = resumed_at - started;
                self.times.resume = resumed_at.elapsed();
                Ok(self.restored())
            }
            Err(e) => {
                let _ = self.child.start_kill();
                let _ = self.child.wait().await;
                Err(self.files.died(e.to_string()))
            }
        }
    }

    fn restored(self) -> Restored {
        Restored {
            child: self.child,
            qmp: self.qmp,
            files: self.files,
            times: self.times,
        }
    }
}

//! Taking back the sandboxes of an earlier run after a restart: their records are matched
//! with what the host still holds (slots adopted, processes and files found), sandboxes paused
//! with their files kept as saved, and whatever no record claims removed.

use super::*;

impl NsRuntime {
    /// Takes back one sandbox of an earlier run whose slot was adopted.
    async fn adopt(
        &self,
        r: &RuntimeSandbox,
        record: &Record,
        slot: Slot,
    ) -> Result<(Live, RuntimeSandbox), (Slot, RuntimeError)> {
        match Sandbox::reattach(&self.ns, &r.id, record.pid1) {
            Some(sandbox) => {
                if let Some(base) = self.ids.get(&ids_holder(&r.id)) {
                    self.procs.watch(&r.id, base, sandbox.cgroup.pids());
                }
                // Frozen but recorded as running: the previous server died in the middle of
                // a pause it never acknowledged. The sandbox runs on.
                if record.paused.is_none() && sandbox.cgroup.is_frozen() {
                    let cgroup = sandbox.cgroup.clone();
                    match tokio::task::spawn_blocking(move || cgroup.thaw()).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::warn!(sandbox = %r.id, error = %e, "could not thaw"),
                        Err(e) => tracing::warn!(sandbox = %r.id, error = %e, "could not thaw"),
                    }
                    let _ = self.forget_saved(&r.id).await;
                }
                let out = RuntimeSandbox {
                    id: r.id.clone(),
                    agent: SocketAddr::V4(slot.agent_endpoint()),
                    record: r.record.clone(),
                };
                Ok((
                    Live {
                        sandbox,
                        slot,
                        template: record.template.clone(),
                    },
                    out,
                ))
            }
            None => Err((
                slot,
                RuntimeError::unavailable_now(
                    "the sandbox's processes ended while the server was down",
                ),
            )),
        }
    }

    /// Takes back the sandboxes of an earlier run (see [`SandboxRuntime::reattach`]).
    pub(super) async fn reattach_all(
        &self,
        records: Vec<RuntimeSandbox>,
    ) -> Vec<(String, Result<RuntimeSandbox, RuntimeError>)> {
        // Sandboxes paused with only their files have nothing running to take back.
        let (fs_paused, parsed) = warren_host::split_records(records, |r: &Record| {
            r.paused == Some(PauseMode::Filesystem)
        });
        let mut out = Vec::new();
        for (r, _) in fs_paused {
            let result = if crate::layer::exists(&self.paused_dir(&r.id)) {
                self.paused_fs.lock().await.insert(r.id.clone());
                Ok(r.clone())
            } else {
                Err(RuntimeError::unavailable_now(
                    "the saved filesystem of the paused sandbox is missing",
                ))
            };
            out.push((r.id, result));
        }
        // Sandboxes whose processes still run keep their cgroups; everything else goes.
        let keep: Vec<String> = parsed
            .iter()
            .filter(|(r, rec)| {
                rec.as_ref()
                    .is_some_and(|rec| Sandbox::reattach(&self.ns, &r.id, rec.pid1).is_some())
            })
            .map(|(r, _)| r.id.clone())
            .collect();
        let removed = launch::cleanup_stale(&self.ns, &keep);
        if !removed.is_empty() {
            tracing::warn!(?removed, "removed sandboxes left by a previous run");
        }
        let net = self.cfg.net.clone();
        let mut slots = match warren_host::start_adopting(&self.net, net, &parsed, |r| &r.net).await
        {
            Ok(slots) => slots,
            Err(failed) => return failed,
        };
        let mut live = self.live.lock().await;
        for (r, rec) in parsed {
            let Some(rec) = rec else {
                out.push((
                    r.id,
                    // Records are this runtime's own, written by `create`: a bug or a
                    // damaged store.
                    Err(RuntimeError::Failed("unreadable runtime record".into())),
                ));
                continue;
            };
            let result = match slots.next() {
                Some(slot) => self.take_back(&mut live, &r, &rec, slot).await,
                // The pool answers every adoption it was asked for.
                None => Err(RuntimeError::Failed("no slot result".into())),
            };
            let result = match result {
                Err(e) => self.keep_files_of(&r, rec).await.ok_or(e),
                ok => ok,
            };
            out.push((r.id, result));
        }
        drop(live);
        self.remove_unclaimed_saves(&out).await;
        self.release_unclaimed_ids().await;
        out
    }

    /// Takes back one running (or memory-paused) sandbox of an earlier run into `live`, on
    /// the slot adopted for it; frees what it held when it cannot be.
    async fn take_back(
        &self,
        live: &mut HashMap<String, Live>,
        r: &RuntimeSandbox,
        rec: &Record,
        slot: warren_net::Result<Slot>,
    ) -> Result<RuntimeSandbox, RuntimeError> {
        match slot {
            Ok(slot) => match self.adopt(r, rec, slot).await {
                Ok((l, sbx)) => {
                    if let Some(pool) = self.net.get() {
                        pool.set_owner(&l.slot, &r.id);
                    }
                    live.insert(r.id.clone(), l);
                    Ok(sbx)
                }
                Err((slot, e)) => {
                    if let Some(pool) = self.net.get() {
                        let _ = pool.release(slot).await;
                    }
                    let _ = launch::remove_sandbox(&self.ns, &r.id);
                    Err(e)
                }
            },
            Err(e) => {
                let _ = launch::remove_sandbox(&self.ns, &r.id);
                Err(RuntimeError::unavailable(
                    "the sandbox's network could not be kept",
                    e,
                ))
            }
        }
    }

    /// A sandbox paused with its memory whose processes are gone (the host rebooted) still
    /// has its files: it stays paused and resumes from them. One recorded as running whose
    /// processes are gone but whose files were saved by a pause was paused with its files
    /// after all: the server died between the pause and its record (the record says so, see
    /// `warren_runtime::mark_finished_pause`). `None` when it has no saved files.
    async fn keep_files_of(&self, r: &RuntimeSandbox, rec: Record) -> Option<RuntimeSandbox> {
        let finished = rec.paused.is_none();
        if !(finished || rec.paused == Some(PauseMode::Memory))
            || !crate::layer::exists(&self.paused_dir(&r.id))
        {
            return None;
        }
        if finished {
            tracing::warn!(sandbox = %r.id, "a filesystem pause finished while the server was down");
        } else {
            tracing::warn!(sandbox = %r.id, "paused processes lost; keeping its saved files");
        }
        self.paused_fs.lock().await.insert(r.id.clone());
        let rec = Record {
            pid1: 0,
            paused: Some(PauseMode::Filesystem),
            ..rec
        };
        let record = tagged(&rec).ok()?;
        Some(RuntimeSandbox {
            record: if finished {
                warren_runtime::mark_finished_pause(record, PauseMode::Filesystem)
            } else {
                record
            },
            ..r.clone()
        })
    }
}

//! Startup recovery: never forget an acknowledged sandbox, never leak one.

use std::collections::HashMap;

use warren_runtime::RuntimeSandbox;

use crate::error::ControlError;
use crate::model::{Sandbox, SandboxState};
use crate::sandboxes::Sandboxes;

impl Sandboxes {
    /// Sandboxes that live on (running or paused) but were started by another runtime than
    /// this server's: their processes, mounts and saved state are that runtime's to read and
    /// free, so this one must not be handed their records (it would lose them, and leak what
    /// they hold). The server refuses to start instead, saying how to go on.
    fn refuse_foreign_records(&self, records: &[Sandbox]) -> Result<(), ControlError> {
        let mine = self.inner.runtime.name();
        let foreign: Vec<(&str, &str)> = records
            .iter()
            .filter(|sb| matches!(sb.state, SandboxState::Running | SandboxState::Paused))
            .filter_map(|sb| {
                let rt = warren_runtime::record_runtime(&sb.runtime.as_ref()?.record)?;
                (rt != mine).then_some((sb.id.as_str(), rt))
            })
            .collect();
        let Some(&(first, theirs)) = foreign.first() else {
            return Ok(());
        };
        Err(ControlError::FailedPrecondition(format!(
            "{} running or paused sandboxes (e.g. {first}) belong to the {theirs} runtime, \
             but this server runs the {mine} runtime; start it with --runtime {theirs} to keep \
             them, or kill them there first",
            foreign.len()
        )))
    }

    /// Hands the runtime every sandbox the store says is running, so it takes those back and
    /// frees everything else it owns; records the outcome of each.
    pub(crate) async fn recover(&self) -> Result<(), ControlError> {
        let store = &self.inner.store;
        let records = store
            .sandboxes_in(&[
                SandboxState::Pending,
                SandboxState::Running,
                SandboxState::Paused,
                SandboxState::Stopping,
            ])
            .await?;

        self.refuse_foreign_records(&records)?;
        let mut wanted: HashMap<String, Sandbox> = HashMap::new();
        let mut runtime_records: Vec<RuntimeSandbox> = Vec::new();
        for mut sb in records {
            match (sb.state, sb.runtime.clone()) {
                (SandboxState::Running | SandboxState::Paused, Some(rt)) => {
                    runtime_records.push(rt);
                    wanted.insert(sb.id.to_string(), sb);
                }
                (SandboxState::Stopping, _) => {
                    // The kill was acknowledged to nobody yet, but it was asked for: finish
                    // it. Not passing it to reattach makes the runtime free it.
                    sb.transition(SandboxState::Killed)
                        .map_err(ControlError::internal_cause("sandbox state"))?;
                    store.update_sandbox(&sb).await?;
                }
                (SandboxState::Pending, _) => {
                    sb.fail("the control plane restarted while the sandbox was being created");
                    store.update_sandbox(&sb).await?;
                }
                _ => {
                    sb.fail("no runtime record was stored for this sandbox");
                    store.update_sandbox(&sb).await?;
                }
            }
        }

        // Always called, even with nothing to keep: it is also how leftovers get cleaned.
        let results = self.inner.runtime.reattach(runtime_records).await;
        let mut reattached = 0usize;
        for (id, result) in results {
            let Some(mut sb) = wanted.remove(&id) else {
                tracing::warn!(sandbox_id = %id, "runtime reported a sandbox that was not asked for");
                continue;
            };
            match result {
                Ok(mut rt) => {
                    let finished = warren_runtime::take_finished_pause(&mut rt.record);
                    sb.runtime = Some(rt);
                    match finished {
                        // The server died between the runtime's pause and its record: the
                        // sandbox is paused, as the pause's caller asked.
                        Some(mode) if sb.state == SandboxState::Running => {
                            sb.transition(SandboxState::Paused)
                                .map_err(ControlError::internal_cause("sandbox state"))?;
                            sb.pause_mode = Some(mode);
                            tracing::warn!(sandbox_id = %id, ?mode, "recorded a pause that finished while the server was down");
                        }
                        _ if sb.state == SandboxState::Running => {
                            self.restore_egress(&mut sb).await;
                        }
                        _ => {}
                    }
                    store.update_sandbox(&sb).await?;
                    self.register(&sb, None);
                    if sb.state == SandboxState::Paused && finished.is_some() {
                        let memory = finished == Some(warren_runtime::PauseMode::Memory);
                        self.inner
                            .events
                            .record(
                                &sb,
                                crate::events::EventKind::Paused,
                                Some(serde_json::json!({"memory": memory})),
                            )
                            .await;
                    }
                    reattached += 1;
                }
                Err(e) => {
                    let cause = warren_runtime::chain(&e);
                    tracing::warn!(sandbox_id = %id, error = %cause, "sandbox lost across restart");
                    sb.fail(format!("lost across a control-plane restart: {cause}"));
                    store.update_sandbox(&sb).await?;
                }
            }
        }
        for (id, mut sb) in wanted {
            tracing::warn!(sandbox_id = %id, "runtime did not report on sandbox");
            sb.fail("the runtime did not report on this sandbox after a restart");
            store.update_sandbox(&sb).await?;
        }
        // Snapshots the runtime holds but nothing records: a fork's checkpoint when the server
        // died mid-fork, a snapshot whose record was never stored. A template build's cached
        // steps are the builder's (recorded in its cache), not the store's.
        let recorded: std::collections::HashSet<String> = store
            .snapshots()
            .await?
            .into_iter()
            .map(|s| s.key)
            .collect();
        for key in self.inner.runtime.snapshot_keys().await {
            if !recorded.contains(&key)
                && !key.starts_with(crate::templates::port::BUILD_LAYER_PREFIX)
            {
                tracing::info!(snapshot_key = %key, "removing a snapshot nothing records");
                self.forget_runtime_snapshot(&key).await;
            }
        }
        tracing::info!(reattached, "control plane recovered");
        Ok(())
    }
}

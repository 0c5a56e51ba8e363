//! Fork: `count` new sandboxes from one checkpoint of a running parent.
//!
//! The parent is checkpointed once (a runtime snapshot under a temporary key; it keeps
//! running), the children start from it concurrently with a bound, each succeeding or failing
//! on its own, and the checkpoint is deleted once every child has started or failed. Children
//! inherit the parent's template, resources, env vars, metadata, internet access and lifecycle.

use std::sync::Arc;

use tokio::sync::Semaphore;
use tracing::Instrument;

use crate::error::ControlError;
use crate::model::{Sandbox, SandboxState};
use crate::random::random_id;
use crate::sandboxes::create::Plan;
use crate::sandboxes::Sandboxes;

/// Most children of one fork request (the SDKs' limit too).
pub const MAX_FORK_COUNT: u32 = 100;

/// Children created at once: each is a full sandbox start, and a host has finite CPU and disk
/// bandwidth; more in parallel only makes each slower.
const PARALLEL_CHILDREN: usize = 8;

/// One child's outcome.
pub type ForkResult = Result<Sandbox, ControlError>;

impl Sandboxes {
    /// Checks a fork request's count and timeout without doing anything.
    pub(crate) fn check_fork_args(
        &self,
        count: Option<i64>,
        timeout: Option<i64>,
    ) -> Result<(), ControlError> {
        fork_count(count)?;
        self.timeout(timeout).map(drop)
    }

    /// Forks a running sandbox into `count` (default 1) children living `timeout` seconds.
    /// The whole request fails only when the parent cannot be checkpointed.
    pub(crate) async fn fork(
        &self,
        id: &str,
        count: Option<i64>,
        timeout: Option<i64>,
    ) -> Result<Vec<ForkResult>, ControlError> {
        let count = fork_count(count)?;
        let timeout = self.timeout(timeout)?;
        let id = id.to_string();
        self.timed("fork", move |c| async move {
            c.fork_now(&id, count, timeout).await
        })
        .await
    }

    async fn fork_now(
        &self,
        id: &str,
        count: usize,
        timeout: std::time::Duration,
    ) -> Result<Vec<ForkResult>, ControlError> {
        crate::telemetry::trace_sandbox(id);
        let caps = self.inner.runtime.capabilities();
        if !caps.snapshot {
            return Err(ControlError::InvalidArgument(format!(
                "the {} runtime cannot fork sandboxes (it takes no snapshots)",
                self.inner.runtime.name()
            )));
        }
        self.check_headroom()?;
        let key = random_id("fork", 20)?;
        let plan = {
            let sb = self.locked(id).await?;
            if sb.state != SandboxState::Running {
                return Err(ControlError::FailedPrecondition(format!(
                    "sandbox {id} is {}; only running sandboxes can be forked",
                    sb.state.as_str()
                )));
            }
            // Children continue the parent's processes where the runtime can carry them.
            let memory = caps.snapshot_memory;
            self.inner
                .runtime
                .snapshot(id, &key, memory)
                .instrument(self.stage("runtime.snapshot"))
                .await
                .map_err(|e| {
                    self.runtime_error(e, &format!("checkpointing sandbox {id} failed"))
                })?;
            Plan {
                template: sb.template.clone(),
                resources: sb.resources,
                allow_internet_access: sb.allow_internet_access,
                env_vars: sb.env_vars.clone(),
                metadata: sb.metadata.clone(),
                lifecycle: sb.lifecycle,
                network: sb.network.clone(),
                team: sb.team.clone(),
                timeout,
                from_snapshot: Some(key.clone()),
                volume_mounts: sb.volume_mounts.clone(),
            }
        };

        let gate = Arc::new(Semaphore::new(PARALLEL_CHILDREN));
        let mut tasks = Vec::with_capacity(count);
        for _ in 0..count {
            let c = self.clone();
            let plan = plan.clone();
            let gate = gate.clone();
            // Each child in a span of its own under the fork's (its id is recorded there).
            let child = tracing::info_span!(
                "sandbox.fork.child",
                warren.sandbox.id = tracing::field::Empty
            );
            tasks.push(tokio::spawn(
                async move {
                    let _permit = gate
                        .acquire()
                        .await
                        .map_err(|_| ControlError::internal("fork gate closed"))?;
                    c.create_planned(plan).await
                }
                .instrument(child),
            ));
        }
        let mut out = Vec::with_capacity(count);
        for t in tasks {
            out.push(match t.await {
                Ok(r) => r,
                Err(e) => Err(ControlError::internal(format!(
                    "fork child task failed: {e}"
                ))),
            });
        }
        self.forget_runtime_snapshot(&key).await;
        // Children are in their parent's networks, at addresses of their own.
        let joins = self.inner.networks.joins_of(id);
        for child in out.iter_mut() {
            let Ok(sb) = child else { continue };
            if let Err(e) = self
                .inner
                .networks
                .join_all(self, &sb.team, &sb.id, &joins)
                .await
            {
                let child_id = sb.id.clone();
                if let Err(k) = self.kill_now(&child_id).await {
                    tracing::warn!(sandbox_id = %child_id, error = %k, "killing a fork child whose networks failed");
                }
                *child = Err(e);
            }
        }
        let ok = out.iter().filter(|r| r.is_ok()).count();
        tracing::info!(sandbox_id = %id, count, ok, "sandbox forked");
        Ok(out)
    }
}

/// The number of children a fork request asks for (default 1).
fn fork_count(count: Option<i64>) -> Result<usize, ControlError> {
    match count {
        None => Ok(1),
        Some(n) if (1..=i64::from(MAX_FORK_COUNT)).contains(&n) => Ok(n as usize),
        Some(n) => Err(ControlError::InvalidArgument(format!(
            "count must be between 1 and {MAX_FORK_COUNT}, not {n}"
        ))),
    }
}

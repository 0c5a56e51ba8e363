//! Changing a live sandbox's egress policy and private-network peers.

use warren_runtime::egress::EgressPolicy;
use warren_runtime::peers::Peering;
use warren_runtime::{RuntimeError, RuntimeSandbox};

use super::NsRuntime;

impl NsRuntime {
    /// Puts `policy` on the slot of running (or memory-paused) sandbox `id`.
    pub(crate) async fn set_egress_now(
        &self,
        id: &str,
        policy: &EgressPolicy,
    ) -> Result<(), RuntimeError> {
        let pool = self.pool().await?;
        let mut live = self.live.lock().await;
        let Some(l) = live.get_mut(id) else {
            return Err(self.not_live(id, "policy").await);
        };
        warren_host::egress::apply(pool, &mut l.slot, policy).await
    }

    /// [`warren_runtime::SandboxRuntime::set_egress`]: the policy, then the new record.
    pub(crate) async fn set_egress_and_record(
        &self,
        id: &str,
        policy: &EgressPolicy,
    ) -> Result<RuntimeSandbox, RuntimeError> {
        self.set_egress_now(id, policy).await?;
        let h = self.handle(id).await?;
        let mut record = h.record;
        if h.cgroup.is_frozen() {
            record.paused = Some(warren_runtime::PauseMode::Memory);
        }
        Ok(RuntimeSandbox {
            id: id.to_string(),
            agent: h.agent,
            record: super::tagged(&record)?,
        })
    }

    /// [`warren_runtime::SandboxRuntime::set_peers`]: on the slot of running (or
    /// memory-paused) sandbox `id`.
    pub(crate) async fn set_peers_now(
        &self,
        id: &str,
        peering: &Peering,
    ) -> Result<(), RuntimeError> {
        let pool = self.pool().await?;
        let mut live = self.live.lock().await;
        let Some(l) = live.get_mut(id) else {
            return Err(self.not_live(id, "networks").await);
        };
        pool.set_peers(&mut l.slot, peering)
            .await
            .map_err(|e| RuntimeError::unavailable("change the sandbox's private networks", e))
    }

    /// Why sandbox `id` has no slot to change: paused without its processes (its `what`
    /// applies on resume), or unknown.
    async fn not_live(&self, id: &str, what: &str) -> RuntimeError {
        if self.paused_fs.lock().await.contains(id) {
            RuntimeError::Conflict(format!(
                "sandbox {id} is paused without its processes; its {what} applies on resume"
            ))
        } else {
            RuntimeError::NotFound(id.to_string())
        }
    }
}

//! A VM sandbox's egress policy: its record, and changing it (and its private-network peers)
//! while the VM runs.

use warren_host::SlotRecord;
use warren_runtime::egress::EgressPolicy;
use warren_runtime::peers::Peering;
use warren_runtime::{RuntimeError, RuntimeSandbox};

use super::{failed, Machine, Record, VmRuntime};

impl Record {
    /// The record of running VM `m`, with its slot's current policy.
    pub(super) fn running(m: &Machine) -> Self {
        let net = m
            .slot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or_else(
                || SlotRecord::unslotted(m.allow_internet_access),
                SlotRecord::from,
            );
        Self {
            pid: m.pid,
            net,
            name: m.name.clone(),
            paused: false,
        }
    }
}

impl VmRuntime {
    /// [`warren_runtime::SandboxRuntime::set_egress`] for a running VM. Its slot is taken
    /// out of the machine for the nft call (a std mutex cannot be held across it) and put
    /// back; a VM torn down meanwhile hands it back to the pool when it is dropped.
    pub(super) async fn set_egress_now(
        &self,
        id: &str,
        policy: &EgressPolicy,
    ) -> Result<RuntimeSandbox, RuntimeError> {
        let m = match self.live.lock().await.get(id) {
            Some(m) => m.clone(),
            None if self.paused.lock().await.contains(id) => {
                return Err(RuntimeError::Conflict(format!(
                    "sandbox {id} is paused; its policy applies on resume"
                )))
            }
            None => return Err(RuntimeError::NotFound(id.to_string())),
        };
        let pool = self.pool().await?;
        let taken = m.slot.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(mut slot) = taken else {
            return Err(RuntimeError::Conflict(format!(
                "sandbox {id} is being stopped"
            )));
        };
        let result = warren_host::egress::apply(pool, &mut slot, policy).await;
        let agent = std::net::SocketAddr::V4(slot.agent_endpoint());
        *m.slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(slot);
        result?;
        Ok(RuntimeSandbox {
            id: id.to_string(),
            agent,
            record: warren_runtime::tag_record(
                "vm",
                serde_json::to_value(Record::running(&m)).map_err(failed)?,
            ),
        })
    }

    /// [`warren_runtime::SandboxRuntime::set_peers`] for a running VM, with its slot taken
    /// out of the machine for the nft calls as above. Another change holding the slot at that
    /// moment (an egress update) is waited for, briefly.
    pub(super) async fn set_peers_now(
        &self,
        id: &str,
        peering: &Peering,
    ) -> Result<(), RuntimeError> {
        let pool = self.pool().await?;
        for _ in 0..100 {
            let m = match self.live.lock().await.get(id) {
                Some(m) => m.clone(),
                None if self.paused.lock().await.contains(id) => {
                    return Err(RuntimeError::Conflict(format!(
                        "sandbox {id} is paused; its networks apply on resume"
                    )))
                }
                None => return Err(RuntimeError::NotFound(id.to_string())),
            };
            let taken = m.slot.lock().unwrap_or_else(|e| e.into_inner()).take();
            let Some(mut slot) = taken else {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                continue;
            };
            let result = pool.set_peers(&mut slot, peering).await;
            *m.slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(slot);
            return result.map_err(|e| {
                RuntimeError::unavailable("change the sandbox's private networks", e)
            });
        }
        Err(RuntimeError::Conflict(format!(
            "sandbox {id} is being stopped"
        )))
    }
}

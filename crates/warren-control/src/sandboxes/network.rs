//! A sandbox's egress policy: checked against what the runtime enforces at create, replaced
//! on a live sandbox (`PUT /sandboxes/{id}/network`), and put back after a restart.
//!
//! The store is written first and the runtime second: a policy the caller got a 204 for is
//! on record, and a restart puts the recorded policy on every sandbox it takes back, so a
//! crash between the two never leaves a sandbox on an older policy than acknowledged.

use tokio::sync::OwnedMutexGuard;
use warren_runtime::egress::EgressPolicy;

use crate::error::ControlError;
use crate::model::{Sandbox, SandboxState};
use crate::sandboxes::Sandboxes;

/// A new egress configuration for a sandbox: everything it had is replaced.
#[derive(Debug, Clone, Default)]
pub struct NetworkUpdate {
    /// `allowOut` / `denyOut`, parsed.
    pub egress: EgressPolicy,
    /// `allow_internet_access`; absent means allowed (the update replaces the old value).
    pub allow_internet_access: Option<bool>,
}

impl Sandboxes {
    /// Refuses a policy this runtime would not enforce (rather than pretend to).
    pub(crate) fn check_egress(&self, policy: &EgressPolicy) -> Result<(), ControlError> {
        let caps = self.inner.runtime.capabilities();
        let name = self.inner.runtime.name();
        let restricted = !policy.allow_out.is_empty() || !policy.deny_out.is_empty();
        if restricted && !caps.egress_addresses {
            return Err(ControlError::InvalidArgument(format!(
                "the {name} runtime does not enforce egress policies (network.allowOut, \
                 network.denyOut); use allow_internet_access to cut egress"
            )));
        }
        if policy.has_names() && !caps.egress_names {
            return Err(ControlError::InvalidArgument(format!(
                "domain rules in network.allowOut/denyOut are not enforced by the {name} \
                 runtime yet; use IP addresses and CIDRs"
            )));
        }
        if policy.has_rules() && !caps.egress_rules {
            return Err(ControlError::InvalidArgument(format!(
                "network.rules (headers set at egress) are not applied by the {name} runtime \
                 on this server"
            )));
        }
        Ok(())
    }

    /// Sandbox `id`'s flow log, from the runtime that enforces its policy.
    pub(crate) async fn network_flows(&self, id: &str) -> Result<Vec<crate::Flow>, ControlError> {
        self.inner
            .runtime
            .network_flows(id)
            .await
            .map_err(|e| self.runtime_error(e, &format!("reading sandbox {id}'s flow log")))
    }

    /// Replaces the egress policy of sandbox `id`. A running sandbox gets it at once (open
    /// connections it no longer allows are cut); a paused one gets it when it resumes.
    pub(crate) async fn update_network(
        &self,
        id: &str,
        update: NetworkUpdate,
    ) -> Result<(), ControlError> {
        self.check_egress(&update.egress)?;
        let id = id.to_string();
        self.detached(|c| async move {
            let mut sb = c.locked(&id).await?;
            c.update_network_locked(&mut sb, update).await
        })
        .await
    }

    async fn update_network_locked(
        &self,
        sb: &mut OwnedMutexGuard<Sandbox>,
        update: NetworkUpdate,
    ) -> Result<(), ControlError> {
        let id = sb.id.clone();
        let allow = update.allow_internet_access != Some(false);
        match sb.state {
            SandboxState::Running | SandboxState::Paused => {}
            other => {
                return Err(ControlError::FailedPrecondition(format!(
                    "sandbox {id} is {}",
                    other.as_str()
                )))
            }
        }
        let mut next = (**sb).clone();
        next.network.egress = update.egress;
        next.allow_internet_access = allow;
        self.inner.store.update_sandbox(&next).await?;
        let running = next.state == SandboxState::Running;
        **sb = next;
        if !running {
            return Ok(());
        }
        let policy = sb.egress_policy();
        let rt = self
            .inner
            .runtime
            .set_egress(&id, &policy)
            .await
            .map_err(|e| self.runtime_error(e, &format!("changing sandbox {id}'s network")))?;
        sb.runtime = Some(rt);
        self.inner.store.update_sandbox(sb).await?;
        tracing::info!(sandbox_id = %id, "egress policy replaced");
        Ok(())
    }

    /// After a restart: the recorded policy goes on a taken-back sandbox whose runtime record
    /// may hold an older one (the server stopped between storing and applying it).
    pub(crate) async fn restore_egress(&self, sb: &mut Sandbox) {
        if !self.inner.runtime.capabilities().egress_addresses {
            return;
        }
        // Cheap when nothing changed: the slot already holds that policy and is left alone.
        let policy = sb.egress_policy();
        match self.inner.runtime.set_egress(&sb.id, &policy).await {
            Ok(rt) => sb.runtime = Some(rt),
            Err(e) => tracing::warn!(sandbox_id = %sb.id, error = %warren_runtime::chain(&e),
                "could not put the recorded egress policy back"),
        }
    }
}

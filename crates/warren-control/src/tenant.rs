//! The control plane as one API key sees it (threat model M9).
//!
//! Sandboxes and snapshots belong to the team of the key that made them. A key sees and acts
//! on its own team's only; another team's sandbox or snapshot is "not found", exactly like one
//! that does not exist, so ids of other tenants cannot even be confirmed. Admin keys (the
//! operator's: `WARREN_API_KEY`, the first key, `warren keys create --admin`) see every team.
//! Ownership never changes after creation, so checking it before delegating cannot race.
//! Arguments are validated before ownership, as the unscoped operations do, so malformed input
//! gets its 400 whoever's id it names.

mod resources;

pub use resources::AliasTarget;

use crate::control::Control;
use crate::error::ControlError;
use crate::keys::{ApiKey, Scope};
use crate::model::Sandbox;
use crate::sandboxes::create::CreateRequest;
use crate::sandboxes::fork::ForkResult;
use crate::sandboxes::list::{ListQuery, Page};
use crate::sandboxes::not_found;
use crate::sandboxes::snapshots::{Snapshot, SnapshotPage, SnapshotQuery};

/// [`Control`] restricted to what one key may see.
#[derive(Clone)]
pub struct Tenant {
    control: Control,
    team: String,
    scope: Scope,
}

fn snapshot_not_found(r: &str) -> ControlError {
    ControlError::NotFound(format!("snapshot {r} not found"))
}

impl Control {
    /// The control plane as `key` sees it.
    pub fn tenant(&self, key: &ApiKey) -> Tenant {
        Tenant {
            control: self.clone(),
            team: key.team.clone(),
            scope: Scope::of(key),
        }
    }
}

impl Tenant {
    /// The key's team.
    pub fn team(&self) -> &str {
        &self.team
    }

    /// Whose records this key sees: its team's, or everyone's (`None`) for an admin key.
    pub fn team_filter(&self) -> Option<&str> {
        match self.scope {
            Scope::All => None,
            Scope::Team(ref t) => Some(t),
        }
    }

    /// The control plane behind this view, for this crate's scoped operations only: handlers
    /// reach the domain through `Tenant`'s own methods, never unscoped.
    pub(crate) fn control(&self) -> &Control {
        &self.control
    }

    pub(crate) fn sandboxes(&self) -> &crate::sandboxes::Sandboxes {
        self.control.sandboxes()
    }

    /// The sandbox `id` if this key may see it.
    async fn own(&self, id: &str) -> Result<Sandbox, ControlError> {
        let sb = self.sandboxes().get(id).await?;
        if self.scope.allows(&sb.team) {
            Ok(sb)
        } else {
            Err(not_found(id))
        }
    }

    pub async fn create(&self, mut req: CreateRequest) -> Result<Sandbox, ControlError> {
        // A snapshot works as a template, but only for its own team.
        if let Some(snap) = self.sandboxes().find_snapshot(&req.template).await? {
            if !self.scope.allows(&snap.team) {
                return Err(ControlError::NotFound(format!(
                    "template '{}' not found",
                    req.template.trim()
                )));
            }
        }
        req.team = self.team.clone();
        self.sandboxes().create(req).await
    }

    pub async fn get(&self, id: &str) -> Result<Sandbox, ControlError> {
        self.own(id).await
    }

    /// Lifecycle events as they are recorded that this key may see (its team's, or all for
    /// an admin key).
    pub fn subscribe_events(&self) -> tokio::sync::broadcast::Receiver<crate::SandboxEvent> {
        self.control.events().subscribe()
    }

    /// Whether this key may see an event of `team`.
    pub fn sees_team(&self, team: &str) -> bool {
        self.scope.allows(team)
    }

    /// A sandbox's audit trail (also after it ended, while the trail is kept).
    pub async fn audit(
        &self,
        mut query: crate::AuditQuery,
    ) -> Result<Vec<crate::AuditEntry>, ControlError> {
        query.team = self.team_filter().map(String::from);
        let sandbox = match self.sandboxes().get(&query.sandbox_id).await {
            Ok(sb) if !self.scope.allows(&sb.team) => return Err(not_found(&query.sandbox_id)),
            Ok(sb) => Some(sb),
            Err(_) => None,
        };
        let entries = self.control.audit().query(&query, sandbox.as_ref()).await?;
        // A sandbox with no record and nothing kept is one this key never had.
        if sandbox.is_none() && entries.is_empty() {
            return Err(not_found(&query.sandbox_id));
        }
        Ok(entries)
    }

    /// Lifecycle events of this key's team (of one sandbox it may see, if `query` names one).
    pub async fn events(
        &self,
        mut query: crate::EventQuery,
    ) -> Result<Vec<crate::SandboxEvent>, ControlError> {
        query.team = self.team_filter().map(String::from);
        if let Some(id) = &query.sandbox_id {
            // A sandbox that is gone has events still; one of another team has none to show.
            if let Ok(sb) = self.sandboxes().get(id).await {
                if !self.scope.allows(&sb.team) {
                    return Err(not_found(id));
                }
            }
        }
        self.control.events().query(&query).await
    }

    /// Registers a webhook for this key's team.
    pub async fn create_webhook(
        &self,
        c: crate::WebhookChange,
    ) -> Result<crate::Webhook, ControlError> {
        self.control.webhooks().create(&self.team, c).await
    }
    pub async fn webhook(&self, id: &str) -> Result<crate::Webhook, ControlError> {
        Ok(self
            .control
            .webhooks()
            .get(self.team_filter(), id)
            .await?
            .hook)
    }
    pub async fn update_webhook(
        &self,
        id: &str,
        c: crate::WebhookChange,
    ) -> Result<crate::Webhook, ControlError> {
        self.control
            .webhooks()
            .update(self.team_filter(), id, c)
            .await
    }
    pub async fn delete_webhook(&self, id: &str) -> Result<(), ControlError> {
        self.control.webhooks().delete(self.team_filter(), id).await
    }
    pub async fn webhooks(&self) -> Result<Vec<crate::Webhook>, ControlError> {
        self.control.webhooks().list(self.team_filter()).await
    }

    /// Sandbox `id`'s resource samples in `[start, end]` (unix seconds), oldest first.
    pub async fn metrics(
        &self,
        id: &str,
        start: Option<i64>,
        end: Option<i64>,
    ) -> Result<Vec<crate::MetricPoint>, ControlError> {
        let sandbox = self.own(id).await?;
        self.sandboxes().metrics_of(&sandbox, start, end).await
    }

    /// The newest sample of each of `ids` this key may see (others are left out, as unknown
    /// ids are).
    pub async fn latest_metrics(
        &self,
        ids: &[String],
    ) -> Result<Vec<(String, crate::MetricPoint)>, ControlError> {
        let mut mine = Vec::new();
        for id in ids {
            if self.own(id).await.is_ok() {
                mine.push(id.clone());
            }
        }
        Ok(self.sandboxes().latest_metrics(&mine))
    }

    pub async fn connect(
        &self,
        id: &str,
        timeout: Option<i64>,
    ) -> Result<(Sandbox, bool), ControlError> {
        self.sandboxes().timeout(timeout)?;
        self.own(id).await?;
        self.sandboxes().connect(id, timeout).await
    }

    pub async fn set_timeout(&self, id: &str, timeout: i64) -> Result<(), ControlError> {
        if timeout != 0 {
            self.sandboxes().timeout(Some(timeout))?;
        }
        self.own(id).await?;
        self.sandboxes().set_timeout(id, timeout).await
    }

    pub async fn kill(&self, id: &str) -> Result<(), ControlError> {
        self.own(id).await?;
        self.sandboxes().kill(id).await
    }

    pub async fn list(&self, query: &ListQuery) -> Result<Page, ControlError> {
        let mut query = query.clone();
        if let Scope::Team(t) = &self.scope {
            query.team = Some(t.clone());
        }
        self.sandboxes().list(&query).await
    }

    pub async fn pause(&self, id: &str, memory: Option<bool>) -> Result<(), ControlError> {
        self.sandboxes().pause_mode(memory)?;
        self.own(id).await?;
        self.sandboxes().pause(id, memory).await
    }

    pub async fn update_network(
        &self,
        id: &str,
        update: crate::sandboxes::network::NetworkUpdate,
    ) -> Result<(), ControlError> {
        self.sandboxes().check_egress(&update.egress)?;
        self.own(id).await?;
        self.sandboxes().update_network(id, update).await
    }

    /// The sandbox's flow log: what its egress policy decided lately, oldest first.
    pub async fn network_flows(&self, id: &str) -> Result<Vec<crate::Flow>, ControlError> {
        self.own(id).await?;
        self.sandboxes().network_flows(id).await
    }

    pub async fn create_snapshot(
        &self,
        sandbox_id: &str,
        name: Option<String>,
        memory: Option<bool>,
    ) -> Result<Snapshot, ControlError> {
        self.sandboxes().check_snapshot_mode(memory)?;
        let name = self.sandboxes().check_snapshot_name(name)?;
        self.own(sandbox_id).await?;
        if let Some(n) = &name {
            // Names are unique across teams: reusing another team's name would replace its
            // snapshot, so it is refused (without saying whose it is).
            if let Some(other) = self.sandboxes().find_snapshot(n).await? {
                if !self.scope.allows(&other.team) {
                    return Err(ControlError::FailedPrecondition(format!(
                        "snapshot name {n:?} is taken; choose another"
                    )));
                }
            }
        }
        self.sandboxes()
            .create_snapshot(sandbox_id, name, memory)
            .await
    }

    pub async fn list_snapshots(&self, q: &SnapshotQuery) -> Result<SnapshotPage, ControlError> {
        let mut q = q.clone();
        if let Scope::Team(t) = &self.scope {
            q.team = Some(t.clone());
        }
        self.sandboxes().list_snapshots(&q).await
    }

    pub async fn delete_snapshot(&self, r: &str) -> Result<(), ControlError> {
        match self.sandboxes().find_snapshot(r).await? {
            Some(s) if self.scope.allows(&s.team) => self.sandboxes().delete_snapshot(r).await,
            _ => Err(snapshot_not_found(r)),
        }
    }

    pub async fn fork(
        &self,
        id: &str,
        count: Option<i64>,
        timeout: Option<i64>,
    ) -> Result<Vec<ForkResult>, ControlError> {
        self.sandboxes().check_fork_args(count, timeout)?;
        self.own(id).await?;
        self.sandboxes().fork(id, count, timeout).await
    }
}

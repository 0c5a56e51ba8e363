//! The rest of [`MemStore`]: networks, volumes, secrets, events, webhooks and pruning, kept in
//! maps. The store traits have no defaults, so the in-memory store keeps everything a real one
//! does; the suites of these aggregates run against SQLite in `warren-store`.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use warren_control::{
    Delivery, EventQuery, EventStore, Member, NetworkStore, PrivateNetwork, SandboxEvent,
    SealedSecret, SealedWebhook, SecretInfo, SecretStore, StoreError, Volume, VolumeSnapshot,
    VolumeStore, Webhook, WebhookStore,
};

use super::MemStore;

/// Records that hold no runtime state of their own: one map or list each.
#[derive(Default)]
pub struct Records {
    pub networks: Vec<PrivateNetwork>,
    pub members: Vec<Member>,
    pub volumes: Vec<Volume>,
    pub volume_snapshots: Vec<VolumeSnapshot>,
    pub secrets: Vec<SealedSecret>,
    pub events: Vec<SandboxEvent>,
    pub webhooks: Vec<SealedWebhook>,
    pub deliveries: Vec<Delivery>,
}

/// Replaces the element `same` finds, or appends.
fn put<T: Clone>(list: &mut Vec<T>, item: &T, same: impl Fn(&T) -> bool) {
    match list.iter_mut().find(|x| same(x)) {
        Some(x) => *x = item.clone(),
        None => list.push(item.clone()),
    }
}

/// Removes what `same` finds; whether there was any.
fn remove<T>(list: &mut Vec<T>, same: impl Fn(&T) -> bool) -> bool {
    let before = list.len();
    list.retain(|x| !same(x));
    list.len() != before
}

fn of_team(team: Option<&str>, t: &str) -> bool {
    team.is_none_or(|want| want == t)
}

#[async_trait]
impl NetworkStore for MemStore {
    async fn put_network(&self, n: &PrivateNetwork) -> Result<(), StoreError> {
        put(&mut self.records.lock().unwrap().networks, n, |x| {
            x.id == n.id
        });
        Ok(())
    }
    async fn delete_network(&self, id: &str) -> Result<bool, StoreError> {
        let mut r = self.records.lock().unwrap();
        r.members.retain(|m| m.network_id != id);
        Ok(remove(&mut r.networks, |x| x.id == id))
    }
    async fn networks(&self) -> Result<Vec<PrivateNetwork>, StoreError> {
        Ok(self.records.lock().unwrap().networks.clone())
    }
    async fn put_member(&self, m: &Member) -> Result<(), StoreError> {
        put(&mut self.records.lock().unwrap().members, m, |x| {
            x.network_id == m.network_id && x.sandbox_id == m.sandbox_id
        });
        Ok(())
    }
    async fn delete_member(&self, network_id: &str, sandbox_id: &str) -> Result<bool, StoreError> {
        Ok(remove(&mut self.records.lock().unwrap().members, |x| {
            x.network_id == network_id && x.sandbox_id == sandbox_id
        }))
    }
    async fn members(&self) -> Result<Vec<Member>, StoreError> {
        Ok(self.records.lock().unwrap().members.clone())
    }
}

#[async_trait]
impl VolumeStore for MemStore {
    async fn put_volume(&self, v: &Volume) -> Result<(), StoreError> {
        put(&mut self.records.lock().unwrap().volumes, v, |x| {
            x.id == v.id
        });
        Ok(())
    }
    async fn get_volume(&self, id: &str) -> Result<Option<Volume>, StoreError> {
        let r = self.records.lock().unwrap();
        Ok(r.volumes.iter().find(|v| v.id == id).cloned())
    }
    async fn volume_by_name(&self, team: &str, name: &str) -> Result<Option<Volume>, StoreError> {
        let r = self.records.lock().unwrap();
        Ok(r.volumes
            .iter()
            .find(|v| v.team == team && v.name == name)
            .cloned())
    }
    async fn volumes(&self, team: Option<&str>) -> Result<Vec<Volume>, StoreError> {
        let r = self.records.lock().unwrap();
        Ok(r.volumes
            .iter()
            .filter(|v| of_team(team, &v.team))
            .cloned()
            .collect())
    }
    async fn delete_volume(&self, id: &str) -> Result<bool, StoreError> {
        Ok(remove(&mut self.records.lock().unwrap().volumes, |v| {
            v.id == id
        }))
    }
    async fn put_volume_snapshot(&self, s: &VolumeSnapshot) -> Result<(), StoreError> {
        put(&mut self.records.lock().unwrap().volume_snapshots, s, |x| {
            x.id == s.id
        });
        Ok(())
    }
    async fn get_volume_snapshot(&self, id: &str) -> Result<Option<VolumeSnapshot>, StoreError> {
        let r = self.records.lock().unwrap();
        Ok(r.volume_snapshots.iter().find(|s| s.id == id).cloned())
    }
    async fn volume_snapshots(
        &self,
        team: Option<&str>,
    ) -> Result<Vec<VolumeSnapshot>, StoreError> {
        let r = self.records.lock().unwrap();
        Ok(r.volume_snapshots
            .iter()
            .filter(|s| of_team(team, &s.team))
            .cloned()
            .collect())
    }
    async fn delete_volume_snapshot(&self, id: &str) -> Result<bool, StoreError> {
        Ok(remove(
            &mut self.records.lock().unwrap().volume_snapshots,
            |s| s.id == id,
        ))
    }
}

#[async_trait]
impl SecretStore for MemStore {
    async fn put_secret(&self, s: &SealedSecret) -> Result<(), StoreError> {
        put(&mut self.records.lock().unwrap().secrets, s, |x| {
            x.info.id == s.info.id
        });
        Ok(())
    }
    async fn get_secret(&self, id: &str) -> Result<Option<SealedSecret>, StoreError> {
        let r = self.records.lock().unwrap();
        Ok(r.secrets.iter().find(|s| s.info.id == id).cloned())
    }
    async fn secret_by_name(
        &self,
        team: &str,
        name: &str,
    ) -> Result<Option<SealedSecret>, StoreError> {
        let r = self.records.lock().unwrap();
        Ok(r.secrets
            .iter()
            .find(|s| s.info.team == team && s.info.name == name)
            .cloned())
    }
    async fn secrets(&self, team: Option<&str>) -> Result<Vec<SecretInfo>, StoreError> {
        let r = self.records.lock().unwrap();
        Ok(r.secrets
            .iter()
            .filter(|s| of_team(team, &s.info.team))
            .map(|s| s.info.clone())
            .collect())
    }
    async fn delete_secret(&self, id: &str) -> Result<bool, StoreError> {
        Ok(remove(&mut self.records.lock().unwrap().secrets, |s| {
            s.info.id == id
        }))
    }
}

#[async_trait]
impl EventStore for MemStore {
    async fn append_event(&self, e: &SandboxEvent) -> Result<(), StoreError> {
        self.records.lock().unwrap().events.push(e.clone());
        Ok(())
    }
    async fn events(&self, q: &EventQuery) -> Result<Vec<SandboxEvent>, StoreError> {
        let r = self.records.lock().unwrap();
        let wanted = |e: &&SandboxEvent| {
            q.sandbox_id.as_ref().is_none_or(|id| *id == e.sandbox_id)
                && q.team.as_ref().is_none_or(|t| *t == e.team)
                && q.since.is_none_or(|s| e.at >= s)
                && (q.kinds.is_empty() || q.kinds.contains(&e.kind))
        };
        let mut found: Vec<SandboxEvent> = r.events.iter().filter(wanted).cloned().collect();
        if !q.ascending {
            found.reverse();
        }
        // Paging by offset, as the SQLite store's `LIMIT .. OFFSET ..` does.
        Ok(found.into_iter().skip(q.offset).take(q.limit).collect())
    }
    async fn prune_events(&self, before: DateTime<Utc>) -> Result<usize, StoreError> {
        let events = &mut self.records.lock().unwrap().events;
        let n = events.len();
        events.retain(|e| e.at >= before);
        Ok(n - events.len())
    }
}

#[async_trait]
impl WebhookStore for MemStore {
    async fn put_webhook(&self, h: &SealedWebhook) -> Result<(), StoreError> {
        put(&mut self.records.lock().unwrap().webhooks, h, |x| {
            x.hook.id == h.hook.id
        });
        Ok(())
    }
    async fn get_webhook(&self, id: &str) -> Result<Option<SealedWebhook>, StoreError> {
        let r = self.records.lock().unwrap();
        Ok(r.webhooks.iter().find(|h| h.hook.id == id).cloned())
    }
    async fn webhooks(&self, team: Option<&str>) -> Result<Vec<Webhook>, StoreError> {
        let r = self.records.lock().unwrap();
        Ok(r.webhooks
            .iter()
            .filter(|h| of_team(team, &h.hook.team))
            .map(|h| h.hook.clone())
            .collect())
    }
    async fn delete_webhook(&self, id: &str) -> Result<bool, StoreError> {
        let mut r = self.records.lock().unwrap();
        r.deliveries.retain(|d| d.webhook_id != id);
        Ok(remove(&mut r.webhooks, |h| h.hook.id == id))
    }
    async fn put_delivery(&self, d: &Delivery) -> Result<(), StoreError> {
        put(&mut self.records.lock().unwrap().deliveries, d, |x| {
            x.id == d.id
        });
        Ok(())
    }
    async fn deliveries(&self) -> Result<Vec<Delivery>, StoreError> {
        Ok(self.records.lock().unwrap().deliveries.clone())
    }
    async fn delete_delivery(&self, id: &str) -> Result<(), StoreError> {
        remove(&mut self.records.lock().unwrap().deliveries, |d| d.id == id);
        Ok(())
    }
}

//! The webhooks service: lifecycle webhooks (E2B's `/events/webhooks`): a team registers a URL and the event types it
//! wants; every such event is POSTed there, signed with the webhook's secret.
//!
//! Delivery is at least once: an event's deliveries are written to the store in the same step
//! that records the event's webhooks are due, before anything is sent, and a delivery leaves the
//! store only when the receiver answered 2xx or its retries ran out (E2B's: 3 more tries, 10 s
//! apart). A crash or restart in between sends it again, so receivers deduplicate by the
//! delivery id (`e2b-delivery-id`), which stays the same across retries.
//!
//! The HTTP side is the server's ([`WebhookSender`]): it signs, refuses receivers on private
//! addresses unless the operator allows them, and bounds each attempt in time.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, Notify};
use tokio_util::sync::CancellationToken;

use crate::events::{EventKind, EventSink, SandboxEvent};
use crate::store::WebhookStore;
use crate::ControlError;

/// Attempts per delivery: the first and three retries.
pub const DELIVERY_ATTEMPTS: u32 = 4;
/// Wait between attempts.
pub const RETRY_AFTER: Duration = Duration::from_secs(10);
/// Webhooks one team may register.
pub const MAX_WEBHOOKS: usize = 100;

/// A registered webhook (its secret is kept apart, sealed, and never shown).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Webhook {
    pub id: String,
    pub team: String,
    pub name: String,
    pub url: String,
    pub enabled: bool,
    pub events: Vec<EventKind>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A webhook with its signature secret, as the store keeps it.
#[derive(Clone)]
pub struct SealedWebhook {
    pub hook: Webhook,
    pub secret: String,
}

/// What a caller sends to create (all of it) or update (what it names) a webhook.
#[derive(Debug, Clone, Default)]
pub struct WebhookChange {
    pub name: Option<String>,
    pub url: Option<String>,
    pub enabled: Option<bool>,
    pub events: Option<Vec<String>>,
    pub secret: Option<String>,
}

/// One event on its way to one webhook.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    /// The same on every attempt: receivers deduplicate by it.
    pub id: String,
    pub webhook_id: String,
    pub event: SandboxEvent,
    /// Attempts made so far.
    pub attempts: u32,
    pub next_at: DateTime<Utc>,
}

/// Sends one delivery: `Ok` once the receiver answered 2xx.
#[async_trait]
pub trait WebhookSender: Send + Sync {
    async fn send(&self, hook: &SealedWebhook, delivery: &Delivery) -> Result<(), String>;
}

fn bad(m: impl Into<String>) -> ControlError {
    ControlError::InvalidArgument(m.into())
}

fn kinds(names: &[String]) -> Result<Vec<EventKind>, ControlError> {
    let mut out = Vec::new();
    for n in names {
        let k = EventKind::from_type_name(n.trim()).ok_or_else(|| {
            let known: Vec<&str> = EventKind::ALL.iter().map(|k| k.type_name()).collect();
            bad(format!(
                "unknown event type {n:?}; known: {}",
                known.join(", ")
            ))
        })?;
        if !out.contains(&k) {
            out.push(k);
        }
    }
    if out.is_empty() {
        return Err(bad("events must name at least one event type"));
    }
    Ok(out)
}

fn check_url(url: &str) -> Result<(), ControlError> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or_else(|| bad(format!("url must be http:// or https://, not {url:?}")))?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if host.is_empty()
        || host.contains('@')
        || url.len() > 2048
        || url.chars().any(char::is_control)
    {
        return Err(bad(format!(
            "url {url:?} is not a webhook address (a host, no credentials)"
        )));
    }
    Ok(())
}

fn check_secret(secret: &str) -> Result<(), ControlError> {
    if secret.len() < 8 || secret.len() > 256 || secret.chars().any(char::is_control) {
        return Err(bad("signatureSecret must be 8 to 256 printable characters"));
    }
    Ok(())
}

/// Webhooks and their deliveries. Depends on events' types only: it is one of their
/// [`EventSink`]s.
pub(crate) struct Webhooks {
    store: Arc<dyn WebhookStore>,
    /// Posts deliveries (`None`: none are queued).
    sender: Option<Arc<dyn WebhookSender>>,
    /// Woken when deliveries are queued.
    wake: Notify,
    /// Serialises the count check of creates with updates and deletes.
    lock: Mutex<()>,
}

impl Webhooks {
    pub(crate) fn new(
        store: Arc<dyn WebhookStore>,
        sender: Option<Arc<dyn WebhookSender>>,
    ) -> Self {
        Self {
            store,
            sender,
            wake: Notify::new(),
            lock: Mutex::new(()),
        }
    }

    /// Starts delivering until `shutdown`, when there is a way out to receivers.
    pub(crate) fn start(self: &Arc<Self>, shutdown: CancellationToken) {
        if self.sender.is_none() {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let me = self.clone();
        handle.spawn(async move { me.deliveries(shutdown).await });
    }

    async fn deliveries(&self, shutdown: CancellationToken) {
        loop {
            let next = self.deliver_due().await;
            let wait = next
                .map(|at| (at - Utc::now()).to_std().unwrap_or_default())
                .unwrap_or(Duration::from_secs(60))
                .max(Duration::from_millis(50));
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
    /// Sends what is due; answers when the next pending delivery is due.
    async fn deliver_due(&self) -> Option<DateTime<Utc>> {
        let sender = self.sender.clone()?;
        let store = &self.store;
        let pending = match store.deliveries().await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %warren_runtime::chain(&e), "reading pending webhook deliveries");
                return Some(Utc::now() + chrono::Duration::seconds(10));
            }
        };
        let now = Utc::now();
        let mut next: Option<DateTime<Utc>> = None;
        let mut sends = tokio::task::JoinSet::new();
        for mut d in pending {
            if d.next_at > now {
                next = Some(next.map_or(d.next_at, |n| n.min(d.next_at)));
                continue;
            }
            let hook = match store.get_webhook(&d.webhook_id).await {
                Ok(Some(h)) if h.hook.enabled => h,
                // Deleted or disabled since: nothing to send.
                _ => {
                    let _ = store.delete_delivery(&d.id).await;
                    continue;
                }
            };
            let sender = sender.clone();
            let store = self.store.clone();
            sends.spawn(async move {
                let result = sender.send(&hook, &d).await;
                d.attempts += 1;
                match result {
                    Ok(()) => {
                        let _ = store.delete_delivery(&d.id).await;
                        None
                    }
                    Err(e) if d.attempts >= DELIVERY_ATTEMPTS => {
                        tracing::warn!(webhook = %hook.hook.id, delivery = %d.id, error = %e,
                            "webhook delivery failed for the last time; dropped");
                        let _ = store.delete_delivery(&d.id).await;
                        None
                    }
                    Err(e) => {
                        tracing::info!(webhook = %hook.hook.id, delivery = %d.id, attempt = d.attempts,
                            error = %e, "webhook delivery failed; retrying");
                        d.next_at = Utc::now()
                            + chrono::Duration::from_std(RETRY_AFTER).unwrap_or_default();
                        let at = d.next_at;
                        let _ = store.put_delivery(&d).await;
                        Some(at)
                    }
                }
            });
        }
        while let Some(r) = sends.join_next().await {
            if let Ok(Some(at)) = r {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        next
    }

    /// Queues `event` for every enabled webhook of its team that asked for its type.
    pub(crate) async fn queue(&self, event: &SandboxEvent) {
        if self.sender.is_none() {
            return;
        }
        let hooks = match self.store.webhooks(Some(&event.team)).await {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(error = %warren_runtime::chain(&e), "reading webhooks for an event");
                return;
            }
        };
        let mut queued = false;
        for h in hooks
            .iter()
            .filter(|h| h.enabled && h.events.contains(&event.kind))
        {
            let d = Delivery {
                id: uuid::Uuid::new_v4().to_string(),
                webhook_id: h.id.clone(),
                event: event.clone(),
                attempts: 0,
                next_at: Utc::now(),
            };
            match self.store.put_delivery(&d).await {
                Ok(()) => queued = true,
                Err(e) => {
                    tracing::warn!(webhook = %h.id, error = %warren_runtime::chain(&e), "queueing a webhook delivery")
                }
            }
        }
        if queued {
            self.wake.notify_one();
        }
    }

    pub(crate) async fn create(
        &self,
        team: &str,
        c: WebhookChange,
    ) -> Result<Webhook, ControlError> {
        let url = c.url.ok_or_else(|| bad("url is required"))?;
        check_url(&url)?;
        let events = kinds(&c.events.ok_or_else(|| bad("events is required"))?)?;
        let secret = c.secret.ok_or_else(|| bad("signatureSecret is required"))?;
        check_secret(&secret)?;
        let name = c.name.unwrap_or_default();
        if name.len() > 256 {
            return Err(bad("name is longer than 256 bytes"));
        }
        let _one = self.lock.lock().await;
        if self.store.webhooks(Some(team)).await?.len() >= MAX_WEBHOOKS {
            return Err(ControlError::QuotaExceeded(format!(
                "team {team} has {MAX_WEBHOOKS} webhooks, the most it may keep; delete one first"
            )));
        }
        let now = Utc::now();
        let hook = Webhook {
            id: uuid::Uuid::new_v4().to_string(),
            team: team.to_string(),
            name,
            url,
            enabled: c.enabled.unwrap_or(true),
            events,
            created_at: now,
            updated_at: now,
        };
        self.store
            .put_webhook(&SealedWebhook {
                hook: hook.clone(),
                secret,
            })
            .await?;
        Ok(hook)
    }

    pub(crate) async fn get(
        &self,
        team: Option<&str>,
        id: &str,
    ) -> Result<SealedWebhook, ControlError> {
        match self.store.get_webhook(id).await? {
            Some(h) if team.is_none_or(|t| t == h.hook.team) => Ok(h),
            _ => Err(ControlError::NotFound(format!("webhook {id} not found"))),
        }
    }

    pub(crate) async fn update(
        &self,
        team: Option<&str>,
        id: &str,
        c: WebhookChange,
    ) -> Result<Webhook, ControlError> {
        let _one = self.lock.lock().await;
        let mut h = self.get(team, id).await?;
        if let Some(url) = c.url {
            check_url(&url)?;
            h.hook.url = url;
        }
        if let Some(events) = c.events {
            h.hook.events = kinds(&events)?;
        }
        if let Some(secret) = c.secret {
            check_secret(&secret)?;
            h.secret = secret;
        }
        if let Some(name) = c.name {
            if name.len() > 256 {
                return Err(bad("name is longer than 256 bytes"));
            }
            h.hook.name = name;
        }
        if let Some(enabled) = c.enabled {
            h.hook.enabled = enabled;
        }
        h.hook.updated_at = Utc::now();
        self.store.put_webhook(&h).await?;
        Ok(h.hook)
    }

    pub(crate) async fn delete(&self, team: Option<&str>, id: &str) -> Result<(), ControlError> {
        let _one = self.lock.lock().await;
        self.get(team, id).await?;
        self.store.delete_webhook(id).await?;
        Ok(())
    }

    pub(crate) async fn list(&self, team: Option<&str>) -> Result<Vec<Webhook>, ControlError> {
        let mut all = self.store.webhooks(team).await?;
        all.sort_by(|a, b| {
            a.created_at
                .cmp(&b.created_at)
                .then_with(|| a.id.cmp(&b.id))
        });
        Ok(all)
    }
}

#[async_trait]
impl EventSink for Webhooks {
    async fn recorded(&self, event: &SandboxEvent) {
        self.queue(event).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_event_types_are_checked() {
        assert!(check_url("https://hooks.example.test/x").is_ok());
        assert!(check_url("http://127.0.0.1:8080/h").is_ok());
        assert!(check_url("ftp://x").is_err());
        assert!(check_url("https://user:pw@x/").is_err());
        assert!(check_url("https:///nohost").is_err());
        assert!(kinds(&["sandbox.lifecycle.killed".into()]).is_ok());
        assert!(kinds(&[]).is_err());
        assert!(kinds(&["sandbox.lifecycle.nope".into()]).is_err());
        assert!(check_secret("short").is_err());
        assert!(check_secret("long-enough-secret").is_ok());
    }
}

//! Lifecycle events: what happened to each sandbox and when (E2B's `sandbox.lifecycle.*`).
//!
//! Every change of a sandbox's life the control plane makes is recorded in the store as it
//! happens (created, paused, resumed, checkpointed, updated, killed), kept for
//! [`EVENT_RETENTION`], and read back by sandbox or by team, newest first unless asked
//! otherwise. Recording is part of the operation's bookkeeping, not of its outcome: a store
//! that fails to take an event is logged and the operation still answers as it went.

use std::sync::Arc;

use async_trait::async_trait;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::store::EventStore;
use crate::{ControlError, Sandbox};

/// How long events are kept (E2B keeps seven days).
pub const EVENT_RETENTION: chrono::Duration = chrono::Duration::days(7);
/// Events a stream's reader may fall behind by before it loses the oldest.
pub const EVENT_FEED: usize = 1024;
/// Most events one read returns.
pub const MAX_EVENT_PAGE: usize = 100;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Created,
    Paused,
    Resumed,
    /// A snapshot was taken.
    Checkpointed,
    /// Its end time changed.
    Updated,
    /// Killed, or ended on its own (then `data.reason` says why).
    Killed,
}

impl EventKind {
    pub const ALL: [EventKind; 6] = [
        EventKind::Created,
        EventKind::Paused,
        EventKind::Resumed,
        EventKind::Checkpointed,
        EventKind::Updated,
        EventKind::Killed,
    ];

    /// E2B's type name, e.g. `sandbox.lifecycle.created`.
    pub fn type_name(self) -> &'static str {
        match self {
            EventKind::Created => "sandbox.lifecycle.created",
            EventKind::Paused => "sandbox.lifecycle.paused",
            EventKind::Resumed => "sandbox.lifecycle.resumed",
            EventKind::Checkpointed => "sandbox.lifecycle.checkpointed",
            EventKind::Updated => "sandbox.lifecycle.updated",
            EventKind::Killed => "sandbox.lifecycle.killed",
        }
    }

    pub fn from_type_name(name: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.type_name() == name)
    }
}

/// One recorded event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxEvent {
    pub id: String,
    pub kind: EventKind,
    pub sandbox_id: String,
    pub team: String,
    pub template: String,
    pub at: DateTime<Utc>,
    /// What else there is to say (the new end time, the snapshot, why it ended).
    pub data: Option<serde_json::Value>,
}

/// Which events a read wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventQuery {
    /// One sandbox's, or every sandbox's.
    pub sandbox_id: Option<String>,
    /// One team's (`None`: every team's, for admin keys).
    pub team: Option<String>,
    /// Only these kinds (empty: all).
    pub kinds: Vec<EventKind>,
    pub offset: usize,
    pub limit: usize,
    /// Oldest first instead of newest first.
    pub ascending: bool,
    /// Only events from this time on.
    pub since: Option<DateTime<Utc>>,
}

impl Default for EventQuery {
    fn default() -> Self {
        EventQuery {
            sandbox_id: None,
            team: None,
            kinds: Vec::new(),
            offset: 0,
            limit: 10,
            ascending: false,
            since: None,
        }
    }
}

/// Is handed every event as it is recorded (webhooks queue their deliveries this way), after
/// the store has it.
#[async_trait]
pub(crate) trait EventSink: Send + Sync {
    async fn recorded(&self, event: &SandboxEvent);
}

/// Lifecycle events: recorded, fed to streams and handed to the sinks (webhooks). Depends on
/// no other service.
pub(crate) struct Events {
    store: Arc<dyn EventStore>,
    /// Events as they are recorded, for streams.
    feed: broadcast::Sender<SandboxEvent>,
    sinks: Vec<Arc<dyn EventSink>>,
}

impl Events {
    pub(crate) fn new(store: Arc<dyn EventStore>, sinks: Vec<Arc<dyn EventSink>>) -> Self {
        Self {
            store,
            feed: broadcast::channel(EVENT_FEED).0,
            sinks,
        }
    }

    /// Records that `kind` happened to `sandbox` now.
    pub(crate) async fn record(
        &self,
        sandbox: &Sandbox,
        kind: EventKind,
        data: Option<serde_json::Value>,
    ) {
        let event = SandboxEvent {
            id: uuid::Uuid::new_v4().to_string(),
            kind,
            sandbox_id: sandbox.id.to_string(),
            team: sandbox.team.clone(),
            template: sandbox.template.clone(),
            at: Utc::now(),
            data,
        };
        if let Err(e) = self.store.append_event(&event).await {
            tracing::warn!(sandbox_id = %sandbox.id, kind = event.kind.type_name(), error = %warren_runtime::chain(&e),
                "recording a lifecycle event");
        }
        for sink in &self.sinks {
            sink.recorded(&event).await;
        }
        // Nobody listening is not an error.
        let _ = self.feed.send(event);
    }

    /// Every event recorded from now on, as it is recorded (the stream of events). A
    /// receiver that falls behind by more than [`EVENT_FEED`] events loses the oldest.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<SandboxEvent> {
        self.feed.subscribe()
    }

    /// Events as `query` asks (its limit capped at [`MAX_EVENT_PAGE`]).
    pub(crate) async fn query(
        &self,
        query: &EventQuery,
    ) -> Result<Vec<SandboxEvent>, ControlError> {
        if query.limit == 0 || query.limit > MAX_EVENT_PAGE {
            return Err(ControlError::InvalidArgument(format!(
                "limit must be 1..={MAX_EVENT_PAGE}, not {}",
                query.limit
            )));
        }
        Ok(self.store.events(query).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_names_are_e2bs_and_read_back() {
        for k in EventKind::ALL {
            assert!(k.type_name().starts_with("sandbox.lifecycle."));
            assert_eq!(EventKind::from_type_name(k.type_name()), Some(k));
        }
        assert_eq!(
            EventKind::from_type_name("sandbox.lifecycle.exploded"),
            None
        );
    }
}

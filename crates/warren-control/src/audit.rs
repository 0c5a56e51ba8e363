//! The audit trail and the sandbox logs: what happened inside each sandbox, kept by the
//! control plane.
//!
//! Three sources feed it, each read with a cursor of its own and kept in the store:
//! - **the agent's journal** (through [`GuestMetrics::journal`]): processes started through
//!   the API, their output lines and ends, files changed through the API, the agent's own
//!   messages, and (in a VM, where the agent is the guest's root) every program executed;
//! - **the runtime's journal** ([`SandboxRuntime::journal`]): programs executed, where the
//!   host watches them (the `ns` runtime);
//! - **the network flow log**: what the egress policy decided.
//!
//! Lifecycle events (the `events` table) join them when the trail is read. Journals are read
//! every [`SAMPLE_EVERY`](crate::SAMPLE_EVERY) with the metrics, when a sandbox is about to
//! be paused or killed, and when the trail or the logs are read. An entry is stored once
//! (the store ignores one it has, by source and position), so reading again after a restart
//! loses and repeats nothing the agent still holds. Kept for [`AUDIT_RETENTION`].
//!
//! [`GuestMetrics::journal`]: crate::GuestMetrics::journal
//! [`SandboxRuntime::journal`]: warren_runtime::SandboxRuntime::journal

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use warren_proto::journal::{JournalEntry, JournalPage, Level, Masker};

use crate::control::{lock, Control};
use crate::{ControlError, Sandbox, SandboxState};

/// How long the trail is kept (as long as lifecycle events).
pub const AUDIT_RETENTION: chrono::Duration = chrono::Duration::days(7);
/// Most entries one read of the trail returns.
pub const MAX_AUDIT_PAGE: usize = 10_000;
/// Most entries read from one source in one go.
const READ_PAGE: usize = 1000;
/// Most pages read from one source in one go (a source that writes faster waits for the
/// next round; its ring counts what it had to drop).
const READ_PAGES: usize = 20;
/// How long reading before a pause or a kill may take.
pub(crate) const FINAL_READ: Duration = Duration::from_millis(1500);

/// Where an entry came from (the source's run is in [`AuditEntry::fields`] only when it
/// matters).
pub const SOURCE_AGENT: &str = "agent";
pub const SOURCE_HOST: &str = "host";
pub const SOURCE_NETWORK: &str = "network";
pub const SOURCE_LIFECYCLE: &str = "lifecycle";

/// One thing that happened in a sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub sandbox_id: String,
    pub team: String,
    pub at: DateTime<Utc>,
    /// `process.start`, `process.exec`, `file.write`, `network.tcp`, `lifecycle.paused`, ...
    pub kind: String,
    pub level: Level,
    pub message: String,
    #[serde(default)]
    pub fields: BTreeMap<String, String>,
}

/// Told about entries as they are first kept (OpenTelemetry export). Must not block.
pub trait AuditObserver: Send + Sync + 'static {
    fn observe(&self, sandbox: &Sandbox, entries: &[AuditEntry]);
}

/// An entry as the store keeps it: its source and its position there, which make it unique.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredAudit {
    pub source: String,
    pub position: u64,
    pub entry: AuditEntry,
}

/// Which entries a read wants. Kinds match whole or by prefix (`process` is every
/// `process.*`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AuditQuery {
    pub sandbox_id: String,
    /// One team's entries only (`None`: any team's, for admin keys).
    pub team: Option<String>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    pub kinds: Vec<String>,
    pub min_level: Option<Level>,
    /// Entries whose message contains this (case-insensitive).
    pub search: Option<String>,
    /// Newest first.
    pub descending: bool,
    pub limit: usize,
}

impl AuditQuery {
    pub fn wants_kind(&self, kind: &str) -> bool {
        self.kinds.is_empty()
            || self.kinds.iter().any(|k| {
                kind == k
                    || (kind.starts_with(k.as_str()) && kind.as_bytes().get(k.len()) == Some(&b'.'))
            })
    }

    fn wants(&self, e: &AuditEntry) -> bool {
        self.since.is_none_or(|s| e.at >= s)
            && self.until.is_none_or(|u| e.at <= u)
            && self.wants_kind(&e.kind)
            && self.min_level.is_none_or(|l| e.level >= l)
            && self
                .search
                .as_deref()
                .is_none_or(|s| e.message.to_lowercase().contains(&s.to_lowercase()))
    }
}

/// Per sandbox and source: the run read and how far.
#[derive(Default)]
pub(crate) struct Cursors {
    by_source: HashMap<(String, &'static str), (String, u64)>,
}

impl Cursors {
    pub(crate) fn forget_gone(&mut self, alive: impl Fn(&str) -> bool) {
        self.by_source.retain(|(id, _), _| alive(id));
    }
}

/// What must never be kept in the clear: the sandbox's environment variables' values (given at
/// create, kept encrypted) and its tokens, wherever a process printed or passed them.
fn masker_of(sandbox: &Sandbox) -> Masker {
    Masker::new(
        sandbox
            .env_vars
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .chain([
                ("envd access token", sandbox.envd_access_token.as_str()),
                (
                    "traffic access token",
                    sandbox.traffic_access_token.as_str(),
                ),
            ]),
    )
}

fn entry_of(sandbox: &Sandbox, masker: &Masker, e: &JournalEntry) -> AuditEntry {
    let mut e = e.clone();
    masker.mask_entry(&mut e);
    AuditEntry {
        sandbox_id: sandbox.id.clone(),
        team: sandbox.team.clone(),
        at: DateTime::<Utc>::from_timestamp_millis(e.at_ms).unwrap_or_else(Utc::now),
        kind: e.kind.clone(),
        level: e.level,
        message: e.message,
        fields: e.fields,
    }
}

/// A flow's position in the store: its content, hashed (the flow log is a ring, so its
/// indices move; two identical decisions in one millisecond are one entry).
fn flow_position(flow: &crate::Flow) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(flow).unwrap_or_default().hash(&mut h);
    h.finish() >> 1
}

fn flow_entry(sandbox_id: &str, team: &str, f: &crate::Flow) -> AuditEntry {
    use crate::{FlowKind, FlowVerdict};
    let kind = match f.kind {
        FlowKind::Dns => "network.dns",
        FlowKind::Tcp => "network.tcp",
        FlowKind::Udp => "network.udp",
        FlowKind::Other => "network.other",
    };
    let verdict = match f.verdict {
        FlowVerdict::Allowed => "allowed",
        FlowVerdict::Denied => "denied",
    };
    let what = [f.name.as_deref(), f.destination.as_deref()]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(" ");
    let mut fields = BTreeMap::from([
        ("verdict".to_string(), verdict.to_string()),
        ("via".to_string(), f.via.clone()),
    ]);
    for (k, v) in [
        ("name", f.name.clone()),
        ("destination", f.destination.clone()),
        ("reason", f.reason.clone()),
    ] {
        if let Some(v) = v {
            fields.insert(k.into(), v);
        }
    }
    if !f.addresses.is_empty() {
        fields.insert("addresses".into(), f.addresses.join(","));
    }
    AuditEntry {
        sandbox_id: sandbox_id.to_string(),
        team: team.to_string(),
        at: DateTime::<Utc>::from_timestamp_millis(f.at_ms as i64).unwrap_or_else(Utc::now),
        kind: kind.into(),
        level: match f.verdict {
            FlowVerdict::Allowed => Level::Info,
            FlowVerdict::Denied => Level::Warn,
        },
        message: format!("{} {verdict} {what}", &kind["network.".len()..]),
        fields,
    }
}

fn lifecycle_entry(e: &crate::SandboxEvent) -> AuditEntry {
    let name = e
        .kind
        .type_name()
        .trim_start_matches("sandbox.lifecycle.")
        .to_string();
    let mut fields = BTreeMap::new();
    if let Some(serde_json::Value::Object(data)) = &e.data {
        for (k, v) in data {
            let v = match v {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            fields.insert(k.clone(), v);
        }
    }
    AuditEntry {
        sandbox_id: e.sandbox_id.clone(),
        team: e.team.clone(),
        at: e.at,
        kind: format!("lifecycle.{name}"),
        level: Level::Info,
        message: format!("sandbox {name}"),
        fields,
    }
}

impl Control {
    /// Hands every entry first kept from now on to `observer` (once; later calls are ignored).
    pub fn observe_audit_with(&self, observer: Arc<dyn AuditObserver>) {
        let _ = self.inner.audit_observer.set(observer);
    }

    /// Reads what is new from every source of a running sandbox and keeps it. Errors are
    /// the sources' (an agent that does not answer): logged by the caller, never fatal.
    pub(crate) async fn read_journals(&self, sandbox: &Sandbox) -> Result<(), String> {
        if !self.inner.config.audit || sandbox.runtime.is_none() {
            return Ok(());
        }
        let mut errors = Vec::new();
        if let Some(guest) = self.inner.guest_metrics.get().cloned() {
            let sb = sandbox.clone();
            let read = |after| {
                let guest = guest.clone();
                let sb = sb.clone();
                async move { guest.journal(&sb, after, READ_PAGE).await.map(Some) }
            };
            if let Err(e) = self.read_source(sandbox, SOURCE_AGENT, read).await {
                errors.push(format!("agent: {e}"));
            }
        }
        let runtime = self.inner.runtime.clone();
        let id = sandbox.id.clone();
        let read = |after| {
            let runtime = runtime.clone();
            let id = id.clone();
            async move { Ok(runtime.journal(&id, after, READ_PAGE).await) }
        };
        if let Err(e) = self.read_source(sandbox, SOURCE_HOST, read).await {
            errors.push(format!("host: {e}"));
        }
        if let Err(e) = self.read_flows(sandbox).await {
            errors.push(format!("network: {e}"));
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }

    /// Reads one journal source from its cursor until it has nothing new.
    async fn read_source<F, Fut>(
        &self,
        sandbox: &Sandbox,
        source: &'static str,
        read: F,
    ) -> Result<(), String>
    where
        F: Fn(u64) -> Fut,
        Fut: std::future::Future<Output = Result<Option<JournalPage>, String>>,
    {
        let key = (sandbox.id.clone(), source);
        let masker = masker_of(sandbox);
        for _ in 0..READ_PAGES {
            let known = lock(&self.inner.audit_cursors).by_source.get(&key).cloned();
            let after = known.as_ref().map(|(_, n)| *n).unwrap_or(0);
            let Some(page) = read(after).await? else {
                return Ok(());
            };
            if let Some((boot, _)) = &known {
                if *boot != page.boot {
                    // The source started again: its positions start again too.
                    lock(&self.inner.audit_cursors)
                        .by_source
                        .insert(key.clone(), (page.boot.clone(), 0));
                    continue;
                }
            }
            let done = page.entries.is_empty();
            let run = format!("{source}:{}", page.boot);
            let stored: Vec<StoredAudit> = page
                .entries
                .iter()
                .map(|e| StoredAudit {
                    source: run.clone(),
                    position: e.seq,
                    entry: entry_of(sandbox, &masker, e),
                })
                .collect();
            if page.dropped > 0 {
                tracing::debug!(sandbox_id = %sandbox.id, source, dropped = page.dropped,
                    "journal entries were dropped before they were read");
            }
            self.keep(sandbox, stored).await?;
            lock(&self.inner.audit_cursors)
                .by_source
                .insert(key.clone(), (page.boot, page.next));
            if done || page.next == after {
                return Ok(());
            }
        }
        Ok(())
    }

    async fn read_flows(&self, sandbox: &Sandbox) -> Result<(), String> {
        let flows = match self.inner.runtime.network_flows(&sandbox.id).await {
            Ok(f) => f,
            Err(warren_runtime::RuntimeError::Unsupported(_)) => return Ok(()),
            Err(e) => return Err(e.to_string()),
        };
        // Only what is not older than the newest flow already kept (one of the same
        // millisecond may be new; the store skips those it has).
        let key = (sandbox.id.clone(), SOURCE_NETWORK);
        let from = lock(&self.inner.audit_cursors)
            .by_source
            .get(&key)
            .map(|(_, at)| *at)
            .unwrap_or(0);
        let newest = flows.iter().map(|f| f.at_ms).max().unwrap_or(0).max(from);
        let stored: Vec<StoredAudit> = flows
            .iter()
            .filter(|f| f.at_ms >= from)
            .map(|f| StoredAudit {
                source: SOURCE_NETWORK.into(),
                position: flow_position(f),
                entry: flow_entry(&sandbox.id, &sandbox.team, f),
            })
            .collect();
        self.keep(sandbox, stored).await?;
        lock(&self.inner.audit_cursors)
            .by_source
            .insert(key, (String::new(), newest));
        Ok(())
    }

    /// Stores entries (those already kept are skipped) and tells the observer of the new.
    async fn keep(&self, sandbox: &Sandbox, entries: Vec<StoredAudit>) -> Result<(), String> {
        if entries.is_empty() {
            return Ok(());
        }
        let fresh = self
            .inner
            .store
            .append_audit(&entries)
            .await
            .map_err(|e| e.to_string())?;
        if let Some(observer) = self.inner.audit_observer.get() {
            let new: Vec<AuditEntry> = fresh
                .into_iter()
                .filter_map(|i| entries.get(i).map(|s| s.entry.clone()))
                .collect();
            if !new.is_empty() {
                observer.observe(sandbox, &new);
            }
        }
        Ok(())
    }

    /// Reads a sandbox's sources one last time before it stops running (bounded in time).
    pub(crate) async fn final_read(&self, sandbox: &Sandbox) {
        if !self.inner.config.audit || sandbox.state != SandboxState::Running {
            return;
        }
        match tokio::time::timeout(FINAL_READ, self.read_journals(sandbox)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::debug!(sandbox_id = %sandbox.id, error = %e, "last journal read")
            }
            Err(_) => tracing::debug!(sandbox_id = %sandbox.id, "last journal read timed out"),
        }
    }

    /// A sandbox's trail: its kept entries and lifecycle events, oldest first unless asked
    /// otherwise. A running sandbox's sources are read first.
    pub(crate) async fn audit(&self, q: &AuditQuery) -> Result<Vec<AuditEntry>, ControlError> {
        if q.limit == 0 || q.limit > MAX_AUDIT_PAGE {
            return Err(ControlError::InvalidArgument(format!(
                "limit must be 1..={MAX_AUDIT_PAGE}, not {}",
                q.limit
            )));
        }
        if let (Some(s), Some(u)) = (q.since, q.until) {
            if s > u {
                return Err(ControlError::InvalidArgument(
                    "the start of the time range is after its end".into(),
                ));
            }
        }
        if let Ok(sb) = self.get(&q.sandbox_id).await {
            if sb.state == SandboxState::Running {
                match tokio::time::timeout(FINAL_READ, self.read_journals(&sb)).await {
                    Ok(Err(e)) => {
                        tracing::debug!(sandbox_id = %sb.id, error = %e, "reading journals")
                    }
                    Err(_) => tracing::debug!(sandbox_id = %sb.id, "reading journals timed out"),
                    Ok(Ok(())) => {}
                }
            }
        }
        let mut entries = self.inner.store.audit(q).await?;
        if q.wants_kind("lifecycle") {
            let events = self
                .inner
                .store
                .events(&crate::EventQuery {
                    sandbox_id: Some(q.sandbox_id.clone()),
                    team: None,
                    kinds: Vec::new(),
                    ascending: true,
                    offset: 0,
                    limit: usize::MAX >> 1,
                    since: q.since,
                })
                .await?;
            entries.extend(
                events
                    .iter()
                    .map(lifecycle_entry)
                    .filter(|e| q.wants(e) && q.team.as_ref().is_none_or(|t| *t == e.team)),
            );
            entries.sort_by_key(|e| e.at);
            if q.descending {
                entries.reverse();
            }
            entries.truncate(q.limit);
        }
        Ok(entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(kind: &str, level: Level, message: &str, at_ms: i64) -> AuditEntry {
        AuditEntry {
            sandbox_id: "s".into(),
            team: "t".into(),
            at: DateTime::<Utc>::from_timestamp_millis(at_ms).unwrap(),
            kind: kind.into(),
            level,
            message: message.into(),
            fields: BTreeMap::new(),
        }
    }

    #[test]
    fn kinds_match_whole_or_by_prefix() {
        let q = AuditQuery {
            kinds: vec!["process".into(), "file.write".into()],
            ..AuditQuery::default()
        };
        assert!(q.wants_kind("process.exec"));
        assert!(q.wants_kind("file.write"));
        assert!(!q.wants_kind("file.remove"));
        assert!(!q.wants_kind("processes.x"));
        assert!(AuditQuery::default().wants_kind("anything"));
    }

    #[test]
    fn time_level_and_search_filter() {
        let q = AuditQuery {
            since: DateTime::from_timestamp_millis(1000),
            until: DateTime::from_timestamp_millis(2000),
            min_level: Some(Level::Warn),
            search: Some("Boom".into()),
            ..AuditQuery::default()
        };
        assert!(q.wants(&entry("agent", Level::Error, "a boom here", 1500)));
        assert!(!q.wants(&entry("agent", Level::Info, "a boom here", 1500)));
        assert!(!q.wants(&entry("agent", Level::Error, "a boom here", 2500)));
        assert!(!q.wants(&entry("agent", Level::Error, "quiet", 1500)));
    }

    #[test]
    fn flows_become_entries_with_stable_positions() {
        let f = crate::Flow {
            at_ms: 1_700_000_000_000,
            kind: crate::FlowKind::Tcp,
            verdict: crate::FlowVerdict::Denied,
            name: Some("example.com".into()),
            destination: Some("203.0.113.7:443".into()),
            addresses: vec![],
            via: "tls-sni".into(),
            reason: Some("not allowed".into()),
        };
        let e = flow_entry("s1", "t", &f);
        assert_eq!(e.kind, "network.tcp");
        assert_eq!(e.level, Level::Warn);
        assert_eq!(e.fields["verdict"], "denied");
        assert_eq!(e.message, "tcp denied example.com 203.0.113.7:443");
        assert_eq!(flow_position(&f), flow_position(&f.clone()));
    }
}

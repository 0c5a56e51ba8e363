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
//! What one sandbox may keep is bounded (`audit_budget.rs`): a rate, bytes over the retention
//! window, bytes read per round, and a free-space floor of the data disk; what a bound leaves
//! out is summed up in `audit.dropped` entries.
//!
//! [`GuestMetrics::journal`]: crate::GuestMetrics::journal
//! [`SandboxRuntime::journal`]: warren_runtime::SandboxRuntime::journal

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use warren_proto::journal::{JournalEntry, JournalPage, Level, Masker};
use warren_runtime::SandboxRuntime;

use crate::audit_budget::{clip_entry, Budget};
use crate::config::AuditBudget;
use crate::guest::GuestMetrics;
use crate::locks::lock;
use crate::store::{AuditStore, EventStore};
use crate::{ControlError, Sandbox, SandboxState};

/// How long the trail is kept (as long as lifecycle events).
pub const AUDIT_RETENTION: chrono::Duration = chrono::Duration::days(7);
/// Most entries one read of the trail returns.
pub const MAX_AUDIT_PAGE: usize = 10_000;
/// Most entries read from one source in one go.
const READ_PAGE: usize = 1000;
/// Most pages read from one source in one go (a source that writes faster waits for the
/// next round; its ring counts what it had to drop). Bytes are bounded too
/// ([`AuditBudget::round_bytes`](crate::AuditBudget::round_bytes)).
const READ_PAGES: usize = 20;
/// How often at most a sandbox whose byte budget is used up is counted again in the store
/// (pruning past the retention frees room).
const RECOUNT_EVERY: Duration = Duration::from_secs(300);
/// How long reading before a pause or a kill may take.
pub(crate) const FINAL_READ: Duration = Duration::from_millis(1500);

/// Where an entry came from (the source's run is in [`AuditEntry::fields`] only when it
/// matters).
pub const SOURCE_AGENT: &str = "agent";
pub const SOURCE_HOST: &str = "host";
pub const SOURCE_NETWORK: &str = "network";
pub const SOURCE_LIFECYCLE: &str = "lifecycle";
/// The summaries of what the budget left out.
pub const SOURCE_BUDGET: &str = "budget";
/// A summary's kind: how many entries (and bytes, kinds, reasons) were not kept.
pub const KIND_DROPPED: &str = "audit.dropped";

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

/// Per sandbox and source: the run read and how far; per sandbox: its budget.
#[derive(Default)]
pub(crate) struct Cursors {
    by_source: HashMap<(String, &'static str), (String, u64)>,
    budgets: HashMap<String, Budget>,
    /// The data disk was below the trail's floor at the last write (logged once per change).
    disk_full: bool,
}

impl Cursors {
    pub(crate) fn forget_gone(&mut self, alive: impl Fn(&str) -> bool) {
        self.by_source.retain(|(id, _), _| alive(id));
        self.budgets.retain(|id, b| {
            if alive(id) {
                return true;
            }
            // Its last summary could not be written (the disk was full): the log says it.
            if let Some(p) = b.unsummarised() {
                tracing::warn!(sandbox_id = %id, entries = p.entries(), lost = p.lost(),
                    "audit entries of an ended sandbox were left out and could not be summarised");
            }
            false
        });
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

fn entry_of(sandbox: &Sandbox, masker: &Masker, e: &JournalEntry, max: usize) -> AuditEntry {
    let mut e = e.clone();
    masker.mask_entry(&mut e);
    let mut entry = AuditEntry {
        sandbox_id: sandbox.id.to_string(),
        team: sandbox.team.clone(),
        at: DateTime::<Utc>::from_timestamp_millis(e.at_ms).unwrap_or_else(Utc::now),
        kind: e.kind.clone(),
        level: e.level,
        message: e.message,
        fields: e.fields,
    };
    clip_entry(&mut entry, max);
    entry
}

/// Bytes of a journal entry as read (before masking and clipping): what a round is bounded by.
fn read_bytes(e: &JournalEntry) -> u64 {
    (e.kind.len()
        + e.message.len()
        + e.fields
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>()) as u64
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

/// What the trail is allowed, from the server's configuration.
#[derive(Debug, Clone)]
pub(crate) struct AuditSettings {
    /// Off: nothing is read or kept.
    pub enabled: bool,
    pub budget: AuditBudget,
    /// The data disk's inode floor, with the budget's byte floor.
    pub min_free_inodes: u64,
}

/// The audit trail: reads the sandboxes' sources, keeps what the budget allows and answers
/// reads of the trail. Depends on no other service; the sandbox to read is always given.
pub(crate) struct Audit {
    records: Arc<dyn AuditStore>,
    /// Lifecycle events join the trail when it is read.
    events: Arc<dyn EventStore>,
    /// The runtime's journal, flow log and the data disk's headroom.
    runtime: Arc<dyn SandboxRuntime>,
    /// The agents' journals (`None`: only the runtime's sources are read).
    guest: Option<Arc<dyn GuestMetrics>>,
    observer: Option<Arc<dyn AuditObserver>>,
    settings: AuditSettings,
    /// How far each sandbox's sources have been read, and its budget.
    cursors: StdMutex<Cursors>,
}

impl Audit {
    pub(crate) fn new(
        records: Arc<dyn AuditStore>,
        events: Arc<dyn EventStore>,
        runtime: Arc<dyn SandboxRuntime>,
        guest: Option<Arc<dyn GuestMetrics>>,
        observer: Option<Arc<dyn AuditObserver>>,
        settings: AuditSettings,
    ) -> Self {
        Self {
            records,
            events,
            runtime,
            guest,
            observer,
            settings,
            cursors: StdMutex::default(),
        }
    }

    /// Forgets the cursors of sandboxes that are gone.
    pub(crate) fn forget_gone(&self, alive: impl Fn(&str) -> bool) {
        lock(&self.cursors).forget_gone(alive);
    }

    /// Reads what is new from every source of a running sandbox and keeps it. Errors are
    /// the sources' (an agent that does not answer): logged by the caller, never fatal.
    pub(crate) async fn read_journals(&self, sandbox: &Sandbox) -> Result<(), String> {
        self.read_all(sandbox, false).await
    }

    /// [`Self::read_journals`], then the summary of what the budget left out: when it is due,
    /// or with `last` (the sandbox is about to stop running) whatever it holds.
    async fn read_all(&self, sandbox: &Sandbox, last: bool) -> Result<(), String> {
        if !self.settings.enabled || sandbox.runtime.is_none() {
            return Ok(());
        }
        let mut errors = Vec::new();
        if let Some(guest) = self.guest.clone() {
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
        let runtime = self.runtime.clone();
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
        if let Err(e) = self.summarise(sandbox, last).await {
            errors.push(format!("summary: {e}"));
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
        let key = (sandbox.id.to_string(), source);
        let masker = masker_of(sandbox);
        let budget = &self.settings.budget;
        let mut round_bytes = 0u64;
        for _ in 0..READ_PAGES {
            let known = lock(&self.cursors).by_source.get(&key).cloned();
            let after = known.as_ref().map(|(_, n)| *n).unwrap_or(0);
            let Some(page) = read(after).await? else {
                return Ok(());
            };
            let run = format!("{source}:{}", page.boot);
            match &known {
                Some((boot, _)) if *boot != page.boot => {
                    // The source started again: its positions start again too.
                    lock(&self.cursors)
                        .by_source
                        .insert(key.clone(), (page.boot.clone(), 0));
                    continue;
                }
                None => {
                    // First read since the server started: go on from what the store has of
                    // this run, so entries kept before a restart are not read (and budgeted)
                    // again.
                    let last = self.records.audit_last(&sandbox.id, &run).await;
                    if let Ok(Some((position, _))) = last {
                        if position > after {
                            lock(&self.cursors)
                                .by_source
                                .insert(key.clone(), (page.boot.clone(), position));
                            continue;
                        }
                    }
                }
                Some(_) => {}
            }
            let done = page.entries.is_empty();
            round_bytes += page.entries.iter().map(read_bytes).sum::<u64>();
            let stored: Vec<StoredAudit> = page
                .entries
                .iter()
                .map(|e| StoredAudit {
                    source: run.clone(),
                    position: e.seq,
                    entry: entry_of(sandbox, &masker, e, budget.entry_bytes),
                })
                .collect();
            self.keep_budgeted(sandbox, stored, page.dropped).await?;
            lock(&self.cursors)
                .by_source
                .insert(key.clone(), (page.boot, page.next));
            if done || page.next == after || round_bytes >= budget.round_bytes {
                return Ok(());
            }
        }
        Ok(())
    }

    async fn read_flows(&self, sandbox: &Sandbox) -> Result<(), String> {
        let flows = match self.runtime.network_flows(&sandbox.id).await {
            Ok(f) => f,
            Err(warren_runtime::RuntimeError::Unsupported(_)) => return Ok(()),
            Err(e) => return Err(e.to_string()),
        };
        // Only what is not older than the newest flow already kept (one of the same
        // millisecond may be new; the store skips those it has).
        let key = (sandbox.id.to_string(), SOURCE_NETWORK);
        let known = lock(&self.cursors).by_source.get(&key).map(|(_, at)| *at);
        let from = match known {
            Some(at) => at,
            // First read since the server started: from the newest flow the store has.
            None => match self.records.audit_last(&sandbox.id, SOURCE_NETWORK).await {
                Ok(Some((_, at))) => u64::try_from(at.timestamp_millis()).unwrap_or(0),
                _ => 0,
            },
        };
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
        self.keep_budgeted(sandbox, stored, 0).await?;
        lock(&self.cursors)
            .by_source
            .insert(key, (String::new(), newest));
        Ok(())
    }

    /// Whether the data disk (which holds the store) is above the trail's floor. Logged when
    /// that changes.
    fn store_has_room(&self) -> bool {
        let cfg = &self.settings;
        let Some(h) = self.runtime.headroom() else {
            return true;
        };
        let full = h.free_bytes < cfg.budget.min_free_bytes || h.free_inodes < cfg.min_free_inodes;
        let mut cursors = lock(&self.cursors);
        if full != cursors.disk_full {
            cursors.disk_full = full;
            if full {
                tracing::warn!(
                    free_bytes = h.free_bytes,
                    free_inodes = h.free_inodes,
                    floor = cfg.budget.min_free_bytes,
                    "the data disk is nearly full: audit entries are counted, not kept"
                );
            } else {
                tracing::info!(free_bytes = h.free_bytes, "audit entries are kept again");
            }
        }
        !full
    }

    /// Keeps what `sandbox`'s budget allows of `entries`, counting the rest (and `lost`,
    /// entries the source dropped before they were read) for its next summary.
    async fn keep_budgeted(
        &self,
        sandbox: &Sandbox,
        entries: Vec<StoredAudit>,
        lost: u64,
    ) -> Result<(), String> {
        if entries.is_empty() && lost == 0 {
            return Ok(());
        }
        let cfg = &self.settings.budget;
        let recount = match lock(&self.cursors).budgets.get(sandbox.id.as_str()) {
            None => true,
            Some(b) => b.full(cfg) && b.counted.elapsed() >= RECOUNT_EVERY,
        };
        // What the store holds of this sandbox counts: a restart does not renew its budget.
        let counted = if recount {
            Some(
                self.records
                    .audit_usage(&sandbox.id)
                    .await
                    .map_err(|e| e.to_string())?,
            )
        } else {
            None
        };
        let room = self.store_has_room();
        let now = Instant::now();
        let kept = {
            let mut cursors = lock(&self.cursors);
            let budget = cursors
                .budgets
                .entry(sandbox.id.to_string())
                .or_insert_with(|| Budget::new(cfg, counted.unwrap_or(0), now));
            if let Some(bytes) = counted {
                budget.kept_bytes = bytes;
                budget.counted = now;
            }
            budget.count_lost(lost, now);
            budget.admit(cfg, entries, !room, now)
        };
        self.keep(sandbox, kept).await
    }

    /// Writes the summary of what `sandbox`'s budget left out, when it is due (or with
    /// `force`) and the disk has room; one that cannot be written stays counted.
    async fn summarise(&self, sandbox: &Sandbox, force: bool) -> Result<(), String> {
        let cfg = &self.settings.budget;
        let now = Instant::now();
        let due = lock(&self.cursors)
            .budgets
            .get_mut(sandbox.id.as_str())
            .and_then(|b| b.take_due(cfg, force, now));
        let Some((pending, position)) = due else {
            return Ok(());
        };
        // Below the floor the summary waits too (the floor's change is logged).
        let written = if self.store_has_room() {
            let summary = pending.entry(&sandbox.id, &sandbox.team, position);
            self.keep(sandbox, vec![summary]).await.map(|()| true)
        } else {
            Ok(false)
        };
        if !matches!(written, Ok(true)) {
            if let Some(b) = lock(&self.cursors).budgets.get_mut(sandbox.id.as_str()) {
                b.restore(pending);
            }
        }
        written.map(|_| ())
    }

    /// Stores entries (those already kept are skipped) and tells the observer of the new.
    async fn keep(&self, sandbox: &Sandbox, entries: Vec<StoredAudit>) -> Result<(), String> {
        if entries.is_empty() {
            return Ok(());
        }
        let fresh = self
            .records
            .append_audit(&entries)
            .await
            .map_err(|e| e.to_string())?;
        if let Some(observer) = &self.observer {
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
        if !self.settings.enabled || sandbox.state != SandboxState::Running {
            return;
        }
        match tokio::time::timeout(FINAL_READ, self.read_all(sandbox, true)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::debug!(sandbox_id = %sandbox.id, error = %e, "last journal read")
            }
            Err(_) => tracing::debug!(sandbox_id = %sandbox.id, "last journal read timed out"),
        }
    }

    /// A sandbox's trail: its kept entries and lifecycle events, oldest first unless asked
    /// otherwise. The sources of `running` (the sandbox asked about, when it runs) are read
    /// first.
    pub(crate) async fn query(
        &self,
        q: &AuditQuery,
        running: Option<&Sandbox>,
    ) -> Result<Vec<AuditEntry>, ControlError> {
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
        if let Some(sb) = running.filter(|sb| sb.state == SandboxState::Running) {
            match tokio::time::timeout(FINAL_READ, self.read_journals(sb)).await {
                Ok(Err(e)) => {
                    tracing::debug!(sandbox_id = %sb.id, error = %e, "reading journals")
                }
                Err(_) => tracing::debug!(sandbox_id = %sb.id, "reading journals timed out"),
                Ok(Ok(())) => {}
            }
        }
        let mut entries = self.records.audit(q).await?;
        if q.wants_kind("lifecycle") {
            let events = self
                .events
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

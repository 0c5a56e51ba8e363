//! In-test fakes of the runtime and the store, on purpose and ONLY for the domain unit tests:
//! they check the control plane's decisions (states, expiry, limits, recovery, pause, snapshot
//! and fork bookkeeping) without creating real sandboxes. Real agents, the SQLite store and
//! the real namespace runtime are exercised by `warren-server`'s, `warren-store`'s and the
//! end-to-end tests.

#![allow(dead_code)]

mod mem_records;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use warren_control::{
    ApiKey, AuditEntry, AuditQuery, AuditStore, Config, Control, CreateRequest, KeyStore, Sandbox,
    SandboxState, SandboxStore, Snapshot, SnapshotStore, StoreError, StoredAudit, TemplateStore,
};
use warren_proto::journal::{JournalEntry, JournalPage, Level};
use warren_runtime::egress::EgressPolicy;
use warren_runtime::{
    Capabilities, CreateSpec, Exit, PauseMode, ResumeKind, RuntimeError, RuntimeSandbox,
    SandboxRuntime, SnapshotInfo,
};

#[derive(Default)]
pub struct FakeRuntime {
    pub alive: Mutex<HashMap<String, RuntimeSandbox>>,
    /// Ids `reattach` should report as lost.
    pub lose: Mutex<Vec<String>>,
    /// Ids `reattach` should report as paused in a pause that finished while the server was
    /// down (and are paused in memory from then on).
    pub finish_pause: Mutex<Vec<String>>,
    pub caps: Mutex<Capabilities>,
    /// Paused sandboxes and how.
    pub paused: Mutex<HashMap<String, PauseMode>>,
    /// Snapshot key -> source sandbox id.
    pub snapshots: Mutex<HashMap<String, String>>,
    /// Every create and resume spec, in order.
    pub specs: Mutex<Vec<CreateSpec>>,
    pub fail_resume: Mutex<bool>,
    /// Creates from a snapshot fail for this many more calls.
    pub fail_creates: Mutex<usize>,
    /// Every pause fails (a sandbox that broke its own save).
    pub fail_pause: Mutex<bool>,
    /// Every pause fails with this I/O error (a full disk, ...).
    pub pause_io_error: Mutex<Option<std::io::ErrorKind>>,
    /// What `headroom` reports (`None`: the runtime cannot tell).
    pub headroom: Mutex<Option<warren_runtime::Headroom>>,
    /// Every policy `set_egress` applied, in order.
    pub egress: Mutex<Vec<(String, EgressPolicy)>>,
    /// `set_egress` fails (the host's nftables did not answer).
    pub fail_egress: Mutex<bool>,
    /// What the host saw in each sandbox (`journal`); sandboxes without one have no journal.
    pub journals: Mutex<HashMap<String, Vec<JournalEntry>>>,
    /// Most entries one journal page holds, whatever the reader asks (a source's choice).
    pub journal_page: Mutex<Option<usize>>,
    /// Journal pages read.
    pub journal_reads: Mutex<usize>,
}

impl FakeRuntime {
    /// Appends `n` program executions with `message_len`-byte messages to `id`'s journal.
    pub fn exec(&self, id: &str, n: usize, message_len: usize) {
        let mut journals = self.journals.lock().unwrap();
        let journal = journals.entry(id.to_string()).or_default();
        for _ in 0..n {
            let seq = journal.len() as u64 + 1;
            journal.push(JournalEntry {
                seq,
                at_ms: chrono::Utc::now().timestamp_millis(),
                kind: "process.exec".into(),
                level: Level::Info,
                message: format!("{seq} {}", "x".repeat(message_len)),
                fields: std::collections::BTreeMap::from([(
                    "argv".to_string(),
                    "[\"/bin/true\"]".to_string(),
                )]),
            });
        }
    }

    /// `spec`'s sandbox, now running with its agent at 127.0.0.1:`port` (which call made
    /// it run).
    fn run(&self, spec: &CreateSpec, port: u16) -> RuntimeSandbox {
        let rt = RuntimeSandbox {
            id: spec.id.to_string(),
            agent: SocketAddr::from(([127, 0, 0, 1], port)),
            record: serde_json::json!({"fake": true, "runtime": "fake"}),
        };
        self.alive
            .lock()
            .unwrap()
            .insert(spec.id.to_string(), rt.clone());
        rt
    }
}

#[async_trait]
impl SandboxRuntime for FakeRuntime {
    fn name(&self) -> &'static str {
        "fake"
    }
    fn capabilities(&self) -> Capabilities {
        *self.caps.lock().unwrap()
    }
    fn headroom(&self) -> Option<warren_runtime::Headroom> {
        *self.headroom.lock().unwrap()
    }
    async fn journal(&self, id: &str, after: u64, limit: usize) -> Option<JournalPage> {
        *self.journal_reads.lock().unwrap() += 1;
        let journals = self.journals.lock().unwrap();
        let all = journals.get(id)?;
        let limit = self
            .journal_page
            .lock()
            .unwrap()
            .map_or(limit, |p| p.min(limit));
        let entries: Vec<JournalEntry> = all
            .iter()
            .filter(|e| e.seq > after)
            .take(limit)
            .cloned()
            .collect();
        Some(JournalPage {
            boot: "fake-boot".into(),
            next: entries.last().map_or(after, |e| e.seq),
            dropped: 0,
            entries,
        })
    }
    async fn create(&self, spec: CreateSpec) -> Result<RuntimeSandbox, RuntimeError> {
        self.specs.lock().unwrap().push(spec.clone());
        if spec.template != "base" {
            return Err(RuntimeError::UnknownTemplate(spec.template));
        }
        if let Some(key) = &spec.from_snapshot {
            if !self.snapshots.lock().unwrap().contains_key(key) {
                return Err(RuntimeError::NotFound(key.clone()));
            }
            let mut fail = self.fail_creates.lock().unwrap();
            if *fail > 0 {
                *fail -= 1;
                return Err(RuntimeError::Failed("no room for this child".into()));
            }
        }
        Ok(self.run(&spec, 1))
    }
    async fn kill(&self, id: &str) -> Result<(), RuntimeError> {
        let was_paused = self.paused.lock().unwrap().remove(id).is_some();
        let was_alive = self.alive.lock().unwrap().remove(id).is_some();
        if was_paused || was_alive {
            Ok(())
        } else {
            Err(RuntimeError::NotFound(id.into()))
        }
    }
    async fn pause(&self, id: &str, mode: PauseMode) -> Result<RuntimeSandbox, RuntimeError> {
        if let Some(kind) = *self.pause_io_error.lock().unwrap() {
            return Err(RuntimeError::io(format!("save the layer of sandbox {id}"))(
                kind.into(),
            ));
        }
        if *self.fail_pause.lock().unwrap() {
            return Err(RuntimeError::Failed(
                "saving the writable layer: File name too long".into(),
            ));
        }
        let mut rt = self
            .alive
            .lock()
            .unwrap()
            .remove(id)
            .ok_or_else(|| RuntimeError::NotFound(id.into()))?;
        rt.record = serde_json::json!({"fake": true, "runtime": "fake", "paused": mode});
        self.paused.lock().unwrap().insert(id.into(), mode);
        Ok(rt)
    }
    async fn resume(&self, spec: CreateSpec) -> Result<(RuntimeSandbox, ResumeKind), RuntimeError> {
        self.specs.lock().unwrap().push(spec.clone());
        if *self.fail_resume.lock().unwrap() {
            return Err(RuntimeError::Failed("disk is full".into()));
        }
        let mode = self
            .paused
            .lock()
            .unwrap()
            .remove(spec.id.as_str())
            .ok_or_else(|| RuntimeError::NotFound(spec.id.to_string()))?;
        let rt = self.run(&spec, 2);
        let kind = match mode {
            PauseMode::Memory => ResumeKind::Memory,
            PauseMode::Filesystem => ResumeKind::Filesystem,
        };
        Ok((rt, kind))
    }
    async fn snapshot(
        &self,
        id: &str,
        key: &str,
        memory: bool,
    ) -> Result<SnapshotInfo, RuntimeError> {
        if !self.alive.lock().unwrap().contains_key(id) {
            return Err(RuntimeError::NotFound(id.into()));
        }
        self.snapshots.lock().unwrap().insert(key.into(), id.into());
        Ok(SnapshotInfo {
            memory,
            bytes: 4096,
        })
    }
    async fn snapshot_keys(&self) -> Vec<String> {
        self.snapshots.lock().unwrap().keys().cloned().collect()
    }
    async fn delete_snapshot(&self, key: &str) -> Result<(), RuntimeError> {
        self.snapshots
            .lock()
            .unwrap()
            .remove(key)
            .map(|_| ())
            .ok_or_else(|| RuntimeError::NotFound(key.into()))
    }
    async fn status(&self, id: &str) -> Result<Option<Exit>, RuntimeError> {
        if self.alive.lock().unwrap().contains_key(id) {
            Ok(None)
        } else {
            Err(RuntimeError::NotFound(id.into()))
        }
    }
    async fn set_egress(
        &self,
        id: &str,
        policy: &EgressPolicy,
    ) -> Result<RuntimeSandbox, RuntimeError> {
        if *self.fail_egress.lock().unwrap() {
            return Err(RuntimeError::unavailable(
                "load the slot's rules",
                "nft failed",
            ));
        }
        let rt = self
            .alive
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .ok_or_else(|| RuntimeError::NotFound(id.into()))?;
        self.egress
            .lock()
            .unwrap()
            .push((id.to_string(), policy.clone()));
        Ok(rt)
    }
    async fn reattach(
        &self,
        records: Vec<RuntimeSandbox>,
    ) -> Vec<(String, Result<RuntimeSandbox, RuntimeError>)> {
        let lose = self.lose.lock().unwrap().clone();
        let finish = self.finish_pause.lock().unwrap().clone();
        records
            .into_iter()
            .map(|r| {
                if lose.contains(&r.id) {
                    (
                        r.id.clone(),
                        Err(RuntimeError::Failed("process is gone".into())),
                    )
                } else if finish.contains(&r.id) {
                    self.paused
                        .lock()
                        .unwrap()
                        .insert(r.id.clone(), PauseMode::Memory);
                    let record =
                        warren_runtime::mark_finished_pause(r.record.clone(), PauseMode::Memory);
                    (r.id.clone(), Ok(RuntimeSandbox { record, ..r }))
                } else {
                    (r.id.clone(), Ok(r))
                }
            })
            .collect()
    }
}

#[derive(Default)]
pub struct MemStore {
    pub sandboxes: Mutex<HashMap<String, Sandbox>>,
    pub keys: Mutex<Vec<ApiKey>>,
    pub snapshots: Mutex<HashMap<String, Snapshot>>,
    /// `snapshots()` (every record at once) fails: proves a path pages or sums instead.
    pub refuse_full_scans: Mutex<bool>,
    pub templates: Mutex<HashMap<String, warren_control::Template>>,
    pub builds: Mutex<HashMap<String, warren_control::Build>>,
    pub build_logs: Mutex<HashMap<String, Vec<warren_control::LogEntry>>>,
    pub audit: Mutex<Vec<StoredAudit>>,
    pub records: Mutex<mem_records::Records>,
}

/// The store's estimate of an audit row's bytes (`warren-store`'s `audit::usage`).
pub fn row_bytes(s: &StoredAudit) -> u64 {
    let e = &s.entry;
    (e.sandbox_id.len()
        + e.team.len()
        + s.source.len()
        + e.kind.len()
        + e.message.len()
        + serde_json::to_string(&e.fields).unwrap().len()) as u64
        + warren_control::AUDIT_ROW_OVERHEAD
}

#[async_trait]
impl SandboxStore for MemStore {
    async fn prune_ended(
        &self,
        before: chrono::DateTime<chrono::Utc>,
    ) -> Result<usize, StoreError> {
        let mut all = self.sandboxes.lock().unwrap();
        let n = all.len();
        all.retain(|_, s| {
            !(matches!(s.state, SandboxState::Killed | SandboxState::Failed) && s.end_at < before)
        });
        Ok(n - all.len())
    }
    async fn insert_sandbox(&self, s: &Sandbox) -> Result<(), StoreError> {
        self.sandboxes
            .lock()
            .unwrap()
            .insert(s.id.to_string(), s.clone());
        Ok(())
    }

    async fn update_sandbox(&self, s: &Sandbox) -> Result<(), StoreError> {
        self.insert_sandbox(s).await
    }

    async fn get_sandbox(&self, id: &str) -> Result<Option<Sandbox>, StoreError> {
        Ok(self.sandboxes.lock().unwrap().get(id).cloned())
    }

    async fn sandboxes_in(&self, states: &[SandboxState]) -> Result<Vec<Sandbox>, StoreError> {
        Ok(self
            .sandboxes
            .lock()
            .unwrap()
            .values()
            .filter(|s| states.contains(&s.state))
            .cloned()
            .collect())
    }
}

#[async_trait]
impl SnapshotStore for MemStore {
    async fn insert_snapshot(
        &self,
        s: &Snapshot,
        replaces: Option<&str>,
    ) -> Result<(), StoreError> {
        let mut snaps = self.snapshots.lock().unwrap();
        if let Some(old) = replaces {
            snaps.remove(old);
        }
        snaps.insert(s.id.clone(), s.clone());
        Ok(())
    }

    async fn get_snapshot(&self, id: &str) -> Result<Option<Snapshot>, StoreError> {
        Ok(self.snapshots.lock().unwrap().get(id).cloned())
    }

    async fn snapshot_by_name(&self, name: &str) -> Result<Option<Snapshot>, StoreError> {
        Ok(self
            .snapshots
            .lock()
            .unwrap()
            .values()
            .find(|s| s.names.iter().any(|n| n == name))
            .cloned())
    }

    async fn snapshots(&self) -> Result<Vec<Snapshot>, StoreError> {
        if *self.refuse_full_scans.lock().unwrap() {
            return Err(StoreError::backend("every snapshot was loaded"));
        }
        Ok(self.snapshots.lock().unwrap().values().cloned().collect())
    }

    async fn snapshot_page(
        &self,
        team: Option<&str>,
        sandbox_id: Option<&str>,
        name: Option<&str>,
        after: Option<(i64, &str)>,
        limit: usize,
    ) -> Result<Vec<Snapshot>, StoreError> {
        let key = |s: &Snapshot| (s.created_at.timestamp_micros(), s.id.clone());
        let after = after.map(|(t, id)| (t, id.to_string()));
        let mut page: Vec<Snapshot> = self
            .snapshots
            .lock()
            .unwrap()
            .values()
            .filter(|s| {
                team.is_none_or(|t| s.team == t)
                    && sandbox_id.is_none_or(|id| s.sandbox_id == id)
                    && name.is_none_or(|n| s.id == n || s.names.iter().any(|m| m == n))
                    && after.as_ref().is_none_or(|a| key(s) < *a)
            })
            .cloned()
            .collect();
        page.sort_by_key(|s| std::cmp::Reverse(key(s)));
        page.truncate(limit);
        Ok(page)
    }

    async fn snapshot_usage(
        &self,
        sandbox_id: Option<&str>,
        except_name: Option<&str>,
    ) -> Result<(u64, u64), StoreError> {
        let snaps = self.snapshots.lock().unwrap();
        let counted = snaps.values().filter(|s| {
            sandbox_id.is_none_or(|id| s.sandbox_id == id)
                && except_name.is_none_or(|n| !s.names.iter().any(|m| m == n))
        });
        Ok(counted.fold((0, 0), |(n, b), s| (n + 1, b + s.bytes)))
    }

    async fn delete_snapshot(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self.snapshots.lock().unwrap().remove(id).is_some())
    }
}

#[async_trait]
impl TemplateStore for MemStore {
    async fn put_template(&self, t: &warren_control::Template) -> Result<(), StoreError> {
        let mut all = self.templates.lock().unwrap();
        if all
            .values()
            .any(|o| o.id != t.id && o.alias.is_some() && o.alias == t.alias)
        {
            return Err(StoreError::backend("alias taken"));
        }
        all.insert(t.id.clone(), t.clone());
        Ok(())
    }

    async fn get_template(&self, id: &str) -> Result<Option<warren_control::Template>, StoreError> {
        Ok(self.templates.lock().unwrap().get(id).cloned())
    }

    async fn template_by_alias(
        &self,
        alias: &str,
    ) -> Result<Option<warren_control::Template>, StoreError> {
        Ok(self
            .templates
            .lock()
            .unwrap()
            .values()
            .find(|t| t.alias.as_deref() == Some(alias))
            .cloned())
    }

    async fn templates(&self) -> Result<Vec<warren_control::Template>, StoreError> {
        Ok(self.templates.lock().unwrap().values().cloned().collect())
    }

    async fn delete_template(&self, id: &str) -> Result<bool, StoreError> {
        self.builds
            .lock()
            .unwrap()
            .retain(|_, b| b.template_id != id);
        Ok(self.templates.lock().unwrap().remove(id).is_some())
    }

    async fn put_build(&self, b: &warren_control::Build) -> Result<(), StoreError> {
        self.builds.lock().unwrap().insert(b.id.clone(), b.clone());
        Ok(())
    }

    async fn get_build(&self, id: &str) -> Result<Option<warren_control::Build>, StoreError> {
        Ok(self.builds.lock().unwrap().get(id).cloned())
    }

    async fn builds_of(&self, template_id: &str) -> Result<Vec<warren_control::Build>, StoreError> {
        Ok(self
            .builds
            .lock()
            .unwrap()
            .values()
            .filter(|b| b.template_id == template_id)
            .cloned()
            .collect())
    }

    async fn builds_in(
        &self,
        status: warren_control::BuildStatus,
    ) -> Result<Vec<warren_control::Build>, StoreError> {
        Ok(self
            .builds
            .lock()
            .unwrap()
            .values()
            .filter(|b| b.status == status)
            .cloned()
            .collect())
    }

    async fn append_build_logs(
        &self,
        build_id: &str,
        first: usize,
        entries: &[warren_control::LogEntry],
    ) -> Result<(), StoreError> {
        let mut logs = self.build_logs.lock().unwrap();
        let log = logs.entry(build_id.to_string()).or_default();
        log.truncate(first);
        log.extend_from_slice(entries);
        Ok(())
    }

    async fn build_logs(
        &self,
        build_id: &str,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<warren_control::LogEntry>, StoreError> {
        Ok(self
            .build_logs
            .lock()
            .unwrap()
            .get(build_id)
            // The page the store contract asks for: from `offset`, at most `limit`.
            .map(|l| l.iter().skip(offset).take(limit).cloned().collect())
            .unwrap_or_default())
    }
}

#[async_trait]
impl KeyStore for MemStore {
    async fn insert_api_key(&self, k: &ApiKey) -> Result<(), StoreError> {
        self.keys.lock().unwrap().push(k.clone());
        Ok(())
    }

    async fn api_key_by_hash(&self, hash: &str) -> Result<Option<ApiKey>, StoreError> {
        Ok(self
            .keys
            .lock()
            .unwrap()
            .iter()
            .find(|k| k.hash == hash && k.revoked_at.is_none())
            .cloned())
    }

    async fn api_keys(&self) -> Result<Vec<ApiKey>, StoreError> {
        Ok(self.keys.lock().unwrap().clone())
    }

    async fn revoke_api_key(&self, id: &str) -> Result<bool, StoreError> {
        let mut keys = self.keys.lock().unwrap();
        match keys
            .iter_mut()
            .find(|k| k.id == id && k.revoked_at.is_none())
        {
            Some(k) => {
                k.revoked_at = Some(chrono::Utc::now());
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

#[async_trait]
impl AuditStore for MemStore {
    async fn prune_audit(
        &self,
        before: chrono::DateTime<chrono::Utc>,
    ) -> Result<usize, StoreError> {
        let mut kept = self.audit.lock().unwrap();
        let n = kept.len();
        kept.retain(|s| s.entry.at >= before);
        Ok(n - kept.len())
    }
    async fn append_audit(&self, entries: &[StoredAudit]) -> Result<Vec<usize>, StoreError> {
        let mut kept = self.audit.lock().unwrap();
        let mut fresh = Vec::new();
        for (i, s) in entries.iter().enumerate() {
            let same = |k: &StoredAudit| {
                k.entry.sandbox_id == s.entry.sandbox_id
                    && k.source == s.source
                    && k.position == s.position
            };
            if !kept.iter().any(same) {
                kept.push(s.clone());
                fresh.push(i);
            }
        }
        Ok(fresh)
    }

    async fn audit(&self, q: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError> {
        let mut out: Vec<AuditEntry> = self
            .audit
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.entry.clone())
            .filter(|e| {
                e.sandbox_id == q.sandbox_id
                    && q.team.as_ref().is_none_or(|t| *t == e.team)
                    && q.wants_kind(&e.kind)
            })
            .collect();
        out.sort_by_key(|e| e.at);
        out.truncate(q.limit);
        Ok(out)
    }

    async fn audit_usage(&self, sandbox_id: &str) -> Result<u64, StoreError> {
        Ok(self
            .audit
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.entry.sandbox_id == sandbox_id)
            .map(row_bytes)
            .sum())
    }

    async fn audit_last(
        &self,
        sandbox_id: &str,
        source: &str,
    ) -> Result<Option<(u64, chrono::DateTime<chrono::Utc>)>, StoreError> {
        let kept = self.audit.lock().unwrap();
        let of: Vec<&StoredAudit> = kept
            .iter()
            .filter(|s| s.entry.sandbox_id == sandbox_id && s.source == source)
            .collect();
        Ok(of
            .iter()
            .map(|s| s.position)
            .max()
            .zip(of.iter().map(|s| s.entry.at).max()))
    }
}

/// The operator's view of `c` (an admin key of the default team): the tests reach sandboxes
/// through the same scoped entry the API's handlers use.
pub fn admin(c: &Control) -> warren_control::Tenant {
    c.tenant(&ApiKey {
        id: "k-admin".into(),
        name: "admin".into(),
        hash: "hash-admin".into(),
        prefix: "wr_".into(),
        created_at: chrono::Utc::now(),
        revoked_at: None,
        team: String::new(),
        admin: true,
    })
}

/// The state an admin sees sandbox `id` in.
pub async fn state(c: &Control, id: &str) -> SandboxState {
    admin(c).get(id).await.unwrap().state
}

pub fn base() -> CreateRequest {
    CreateRequest {
        template: "base".into(),
        ..Default::default()
    }
}

pub async fn start(config: Config) -> (Control, Arc<MemStore>, Arc<FakeRuntime>) {
    let store = Arc::new(MemStore::default());
    let rt = Arc::new(FakeRuntime::default());
    let c = Control::start(store.clone(), rt.clone(), config)
        .await
        .unwrap();
    (c, store, rt)
}

/// Everything a runtime can have.
pub fn full_caps() -> Capabilities {
    Capabilities {
        pause_memory: true,
        pause_filesystem: true,
        snapshot: true,
        snapshot_memory: true,
        snapshot_filesystem: true,
        egress_addresses: true,
        egress_names: false,
        egress_rules: false,
        private_networks: false,
        volumes: true,
    }
}

/// What the namespace runtime without CRIU has.
pub fn ns_caps() -> Capabilities {
    Capabilities {
        pause_memory: true,
        pause_filesystem: true,
        snapshot: true,
        snapshot_memory: false,
        snapshot_filesystem: true,
        egress_addresses: true,
        egress_names: false,
        egress_rules: false,
        private_networks: false,
        volumes: true,
    }
}

pub async fn start_with(
    caps: Capabilities,
    config: Config,
) -> (Control, Arc<MemStore>, Arc<FakeRuntime>) {
    let store = Arc::new(MemStore::default());
    let rt = Arc::new(FakeRuntime::default());
    *rt.caps.lock().unwrap() = caps;
    let c = Control::start(store.clone(), rt.clone(), config)
        .await
        .unwrap();
    (c, store, rt)
}

//! The sandboxes service: a sandbox's whole life, read top to bottom in one place.
//!
//! Create is in `create.rs`; connect, get, kill and set-timeout here; pause and resume in
//! `pause.rs`, snapshots in `snapshots.rs`, fork in `fork.rs`, a running sandbox's network
//! rules in `network.rs`, listing in `list.rs`, end times and exit watching in `expiry.rs`,
//! and the reattach after a restart in `recover.rs`.
//!
//! Live sandboxes (pending, running, paused, stopping) are kept in memory, each behind its own
//! async mutex, so operations on one sandbox are serialised (a kill never races a set-timeout)
//! while different sandboxes proceed in parallel. Every change is written to the [`Store`]
//! before the operation returns: what the API acknowledged survives a crash.
//!
//! This service calls templates, volumes, networks, events and audit; they reach it back only
//! through the narrow lookups it implements at the end of this file.

pub(crate) mod create;
pub(crate) mod expiry;
pub(crate) mod fork;
pub(crate) mod list;
pub(crate) mod network;
pub(crate) mod pause;
mod recover;
pub(crate) mod snapshots;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{Mutex, Notify, OwnedMutexGuard};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use warren_runtime::{RuntimeError, SandboxRuntime};

pub use crate::config::Config;
use crate::error::ControlError;
use crate::model::{Sandbox, SandboxState};
use crate::store::Store;
use crate::telemetry::trace_sandbox;
use list::{ListQuery, Page};

pub use crate::config::SERVICE_PORT;

/// Where the proxy sends a running sandbox's traffic.
#[derive(Debug, Clone)]
pub struct Route {
    pub agent: SocketAddr,
    /// Shared: the proxy clones a route per request.
    pub access: Arc<Access>,
    /// Cancelled when the sandbox stops: the proxy aborts its open streams.
    pub cancel: CancellationToken,
}

/// What the proxy checks before a request reaches a sandbox port (the agent checks its own).
#[derive(Clone)]
pub struct Access {
    pub envd_access_token: String,
    pub traffic_access_token: String,
    pub allow_public_traffic: bool,
    /// Ports that need a token whatever `allow_public_traffic` says.
    pub service_ports: Arc<[u16]>,
    /// `Host` for every port but the agent's (`${PORT}` replaced), if the sandbox asked.
    pub mask_request_host: Option<String>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Tokens are credentials: never in debug output.
        f.debug_struct("Access")
            .field("allow_public_traffic", &self.allow_public_traffic)
            .field("service_ports", &self.service_ports)
            .finish_non_exhaustive()
    }
}

pub(crate) type Entry = Arc<Mutex<Sandbox>>;

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) runtime: Arc<dyn SandboxRuntime>,
    pub(crate) config: Config,
    pub(crate) live: StdMutex<HashMap<String, Entry>>,
    routes: StdMutex<HashMap<String, Route>>,
    /// Paused (or pausing) sandboxes that traffic wakes (`autoResume`): the proxy looks here
    /// first, so requests for other unrouted sandboxes fail fast instead of waiting for a
    /// sandbox's lock.
    pub(crate) wakeable: StdMutex<HashMap<String, Arc<Access>>>,
    pub(crate) expiries: StdMutex<HashMap<String, DateTime<Utc>>>,
    /// Failed end-of-life pauses per sandbox.
    eol_failures: StdMutex<HashMap<String, u32>>,
    pub(crate) wake_reaper: Notify,
    pub(crate) shutdown: CancellationToken,
    /// Reads the agents' own view of their sandboxes' resources.
    pub(crate) guest_metrics: Option<Arc<dyn crate::usage::GuestMetrics>>,
    /// Recent resource samples of running sandboxes.
    pub(crate) series: StdMutex<crate::usage::Series>,
    /// The numbers `GET /metrics` gives Prometheus.
    pub(crate) telemetry: crate::telemetry::Telemetry,
    // The services a sandbox's life uses (none of them uses this one back but through the
    // narrow lookups it implements below).
    pub(crate) templates: Arc<crate::templates::Templates>,
    pub(crate) volumes: Arc<crate::volumes::Volumes>,
    pub(crate) networks: Arc<crate::networks::Networks>,
    pub(crate) events: Arc<crate::events::Events>,
    pub(crate) audit: Arc<crate::audit::Audit>,
}

/// What the sandboxes service is built from: its ports, its settings and the services it
/// calls.
pub(crate) struct Parts {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) runtime: Arc<dyn SandboxRuntime>,
    pub(crate) config: Config,
    pub(crate) guest_metrics: Option<Arc<dyn crate::usage::GuestMetrics>>,
    pub(crate) templates: Arc<crate::templates::Templates>,
    pub(crate) volumes: Arc<crate::volumes::Volumes>,
    pub(crate) networks: Arc<crate::networks::Networks>,
    pub(crate) events: Arc<crate::events::Events>,
    pub(crate) audit: Arc<crate::audit::Audit>,
}

/// The sandboxes service: every sandbox's life from create to kill (pause, resume, fork,
/// snapshots, expiry, recovery), the live table, the proxy's routes and the end-time
/// schedule. Cheap to clone.
#[derive(Clone)]
pub struct Sandboxes {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) use crate::locks::lock;

pub(crate) fn team_of(team: &str) -> String {
    if team.is_empty() {
        crate::keys::DEFAULT_TEAM.to_string()
    } else {
        team.to_string()
    }
}

pub(crate) use crate::error::sandbox_not_found as not_found;

impl Sandboxes {
    /// Builds the service and reattaches what the last run left: the sandboxes still running,
    /// their networks' peers and the builds a crash interrupted. Starts no task
    /// ([`Sandboxes::start_tasks`] does).
    pub(crate) async fn recovered(parts: Parts) -> Result<Sandboxes, ControlError> {
        let Parts {
            store,
            runtime,
            config,
            guest_metrics,
            templates,
            volumes,
            networks,
            events,
            audit,
        } = parts;
        let per_sandbox = config.per_sandbox_metrics;
        let sandboxes = Sandboxes {
            inner: Arc::new(Inner {
                store,
                runtime,
                config,
                live: StdMutex::new(HashMap::new()),
                routes: StdMutex::new(HashMap::new()),
                wakeable: StdMutex::new(HashMap::new()),
                expiries: StdMutex::new(HashMap::new()),
                eol_failures: StdMutex::new(HashMap::new()),
                wake_reaper: Notify::new(),
                shutdown: CancellationToken::new(),
                guest_metrics,
                series: StdMutex::default(),
                telemetry: crate::telemetry::Telemetry::new(per_sandbox),
                templates,
                volumes,
                networks,
                events,
                audit,
            }),
        };
        sandboxes.inner.networks.load().await?;
        sandboxes.recover().await?;
        sandboxes.inner.networks.restore(&sandboxes).await;
        sandboxes.inner.templates.fail_interrupted_builds().await?;
        Ok(sandboxes)
    }

    /// Starts the background tasks: expiry, exit watching and resource sampling.
    pub(crate) fn start_tasks(&self) {
        crate::sandboxes::expiry::spawn(self.clone());
        self.start_sampling();
    }

    /// Cancelled when the control plane shuts down: every background task ends with it.
    pub(crate) fn shutdown_token(&self) -> &CancellationToken {
        &self.inner.shutdown
    }

    pub(crate) fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Stops the background tasks (sandboxes keep running; a restart reattaches them).
    pub(crate) fn shutdown(&self) {
        self.inner.shutdown.cancel();
    }

    /// Registers a sandbox as live (used by create and by recovery); a running one is also
    /// routed and scheduled to end.
    pub(crate) fn register(&self, sandbox: &Sandbox, entry: Option<Entry>) {
        let entry = entry.unwrap_or_else(|| Arc::new(Mutex::new(sandbox.clone())));
        lock(&self.inner.live).insert(sandbox.id.to_string(), entry);
        match sandbox.state {
            SandboxState::Running => self.route_running(sandbox),
            SandboxState::Paused => self.set_wakeable(sandbox, sandbox.lifecycle.auto_resume),
            _ => {}
        }
    }

    /// Routes a running sandbox's traffic and schedules its end time.
    pub(crate) fn route_running(&self, sandbox: &Sandbox) {
        if let Some(rt) = &sandbox.runtime {
            let route = Route {
                agent: rt.agent,
                access: self.access_of(sandbox),
                cancel: CancellationToken::new(),
            };
            lock(&self.inner.routes).insert(sandbox.id.to_string(), route);
        }
        self.schedule_end(&sandbox.id, sandbox.end_at);
        self.peers_moved(&sandbox.id);
    }

    /// Refuses to put more on the data disk (a new sandbox's disk, a pause, a snapshot, a
    /// fork's checkpoint) when it is nearly full of bytes or of inodes.
    pub(crate) fn check_headroom(&self) -> Result<(), ControlError> {
        let Some(h) = self.inner.runtime.headroom() else {
            return Ok(());
        };
        let cfg = &self.inner.config;
        if h.free_bytes < cfg.min_free_bytes || h.free_inodes < cfg.min_free_inodes {
            return Err(ControlError::QuotaExceeded(format!(
                "the data disk that keeps sandboxes' disks, paused sandboxes and snapshots is \
                 nearly full ({} bytes and {} inodes free, {} bytes and {} inodes stay free for \
                 the server); delete snapshots or kill sandboxes first",
                h.free_bytes, h.free_inodes, cfg.min_free_bytes, cfg.min_free_inodes
            )));
        }
        Ok(())
    }

    /// Counts one more failed end-of-life pause of `id`; returns the count.
    pub(crate) fn count_eol_failure(&self, id: &str) -> u32 {
        let mut map = lock(&self.inner.eol_failures);
        let n = map.entry(id.to_string()).or_insert(0);
        *n += 1;
        *n
    }

    pub(crate) fn forget_eol_failures(&self, id: &str) {
        lock(&self.inner.eol_failures).remove(id);
    }

    pub(crate) fn schedule_end(&self, id: &str, end: DateTime<Utc>) {
        lock(&self.inner.expiries).insert(id.to_string(), end);
        self.inner.wake_reaper.notify_one();
    }

    /// Takes a sandbox off the end-time schedule (paused sandboxes never expire).
    pub(crate) fn unschedule(&self, id: &str) {
        lock(&self.inner.expiries).remove(id);
    }

    pub(crate) fn set_wakeable(&self, sandbox: &Sandbox, wakeable: bool) {
        let mut set = lock(&self.inner.wakeable);
        if wakeable {
            set.insert(sandbox.id.to_string(), self.access_of(sandbox));
        } else {
            set.remove(sandbox.id.as_str());
        }
    }

    /// A paused sandbox's access rules when traffic may wake it.
    pub(crate) fn wake_access(&self, id: &str) -> Option<Arc<Access>> {
        lock(&self.inner.wakeable).get(id).cloned()
    }

    fn access_of(&self, sandbox: &Sandbox) -> Arc<Access> {
        Arc::new(Access {
            envd_access_token: sandbox.envd_access_token.clone(),
            traffic_access_token: sandbox.traffic_access_token.clone(),
            allow_public_traffic: sandbox.network.allow_public_traffic,
            service_ports: self.inner.config.service_ports.clone().into(),
            mask_request_host: sandbox.network.mask_request_host.clone(),
        })
    }

    /// The runtime's name and what it can keep, for API callers.
    pub fn runtime_info(&self) -> (&'static str, warren_runtime::Capabilities) {
        (self.inner.runtime.name(), self.inner.runtime.capabilities())
    }

    /// Forgets a sandbox that is no longer live and cuts its proxied streams.
    fn unregister(&self, id: &str) {
        self.unroute(id);
        lock(&self.inner.live).remove(id);
        lock(&self.inner.expiries).remove(id);
        lock(&self.inner.wakeable).remove(id);
    }

    pub(crate) fn unroute(&self, id: &str) {
        if let Some(route) = lock(&self.inner.routes).remove(id) {
            route.cancel.cancel();
            self.peers_moved(id);
        }
    }

    /// Where the proxy should send traffic for `id`, if it is running.
    pub fn route(&self, id: &str) -> Option<Route> {
        lock(&self.inner.routes).get(id).cloned()
    }

    pub(crate) fn entry(&self, id: &str) -> Option<Entry> {
        lock(&self.inner.live).get(id).cloned()
    }

    pub(crate) fn timeout(&self, secs: Option<i64>) -> Result<Duration, ControlError> {
        let Some(secs) = secs else {
            return Ok(self.inner.config.default_timeout);
        };
        let max = self.inner.config.max_timeout.as_secs();
        match u64::try_from(secs) {
            Ok(s) if s >= 1 && s <= max => Ok(Duration::from_secs(s)),
            _ => Err(ControlError::InvalidArgument(format!(
                "timeout must be between 1 and {max} seconds, not {secs}"
            ))),
        }
    }

    /// Runs a state-changing operation on its own task: a caller that goes away (an HTTP
    /// client disconnecting) must not abandon a sandbox half-created or half-killed.
    pub(crate) async fn detached<T, F>(
        &self,
        f: impl FnOnce(Sandboxes) -> F,
    ) -> Result<T, ControlError>
    where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T, ControlError>> + Send + 'static,
    {
        tokio::spawn(f(self.clone()))
            .await
            .map_err(ControlError::internal_cause("operation task failed"))?
    }

    /// A live sandbox's current record, or the store's for others (gone ones are 404).
    pub(crate) async fn get(&self, id: &str) -> Result<Sandbox, ControlError> {
        if let Some(entry) = self.entry(id) {
            let sb = entry.lock().await;
            if !sb.state.is_gone() {
                return Ok(sb.clone());
            }
        }
        match self.inner.store.get_sandbox(id).await? {
            Some(sb) if !sb.state.is_gone() => Ok(sb),
            _ => Err(not_found(id)),
        }
    }

    pub(crate) async fn locked(&self, id: &str) -> Result<OwnedMutexGuard<Sandbox>, ControlError> {
        let entry = self.entry(id).ok_or_else(|| not_found(id))?;
        let guard = entry.lock_owned().await;
        if guard.state.is_gone() {
            return Err(not_found(id));
        }
        Ok(guard)
    }

    /// Connects to a sandbox: extends its life to at least now + timeout; a paused sandbox is
    /// resumed first. Returns the record and whether it was resumed.
    pub(crate) async fn connect(
        &self,
        id: &str,
        timeout: Option<i64>,
    ) -> Result<(Sandbox, bool), ControlError> {
        let id = id.to_string();
        self.timed(
            "connect",
            |c| async move { c.connect_now(&id, timeout).await },
        )
        .await
    }

    async fn connect_now(
        &self,
        id: &str,
        timeout: Option<i64>,
    ) -> Result<(Sandbox, bool), ControlError> {
        trace_sandbox(id);
        let timeout = self.timeout(timeout)?;
        let mut sb = self.locked(id).await?;
        match sb.state {
            SandboxState::Running => {}
            SandboxState::Paused => {
                self.resume_locked(&mut sb, timeout).await?;
                // Its networks know its new place before the caller uses it.
                self.inner.networks.refresh_peers_of(self, id).await;
                return Ok((sb.clone(), true));
            }
            other => {
                return Err(ControlError::FailedPrecondition(format!(
                    "sandbox {id} is {}",
                    other.as_str()
                )))
            }
        }
        let end = Utc::now() + timeout;
        if end > sb.end_at {
            let mut next = sb.clone();
            next.end_at = end;
            self.inner.store.update_sandbox(&next).await?;
            *sb = next;
            self.schedule_end(id, end);
        }
        Ok((sb.clone(), false))
    }

    /// Sets `end_at = now + timeout` (may shorten the sandbox's life).
    pub(crate) async fn set_timeout(&self, id: &str, timeout: i64) -> Result<(), ControlError> {
        let id = id.to_string();
        self.detached(|c| async move { c.set_timeout_now(&id, timeout).await })
            .await
    }

    async fn set_timeout_now(&self, id: &str, timeout: i64) -> Result<(), ControlError> {
        // `0` ends the sandbox now (killed, or paused if it was created to pause), as on E2B.
        let timeout = if timeout == 0 {
            Duration::ZERO
        } else {
            self.timeout(Some(timeout))?
        };
        let mut sb = self.locked(id).await?;
        if sb.state == SandboxState::Paused {
            // As on E2B, only a running sandbox has a timeout to set: a paused one is "not
            // found" here. SDK releases that resume through `connect` rely on it (they try
            // set_timeout first and resume only when it fails).
            return Err(ControlError::NotFound(format!(
                "sandbox {id} is paused: connect to it or resume it first"
            )));
        }
        if sb.state != SandboxState::Running {
            return Err(ControlError::FailedPrecondition(format!(
                "sandbox {id} is {}",
                sb.state.as_str()
            )));
        }
        let mut next = sb.clone();
        next.end_at = Utc::now() + timeout;
        self.inner.store.update_sandbox(&next).await?;
        self.schedule_end(id, next.end_at);
        *sb = next;
        let end = sb
            .end_at
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        self.inner
            .events
            .record(
                &sb,
                crate::events::EventKind::Updated,
                Some(serde_json::json!({"set_timeout": end})),
            )
            .await;
        Ok(())
    }

    pub(crate) async fn list(&self, query: &ListQuery) -> Result<Page, ControlError> {
        let candidates = self
            .inner
            .store
            .sandboxes_in(&query.states.stored_states())
            .await?;
        list::apply(query, candidates)
    }

    /// Kills a sandbox: stops routing to it (cutting open streams), has the runtime free
    /// everything, and records it as killed.
    pub(crate) async fn kill(&self, id: &str) -> Result<(), ControlError> {
        let id = id.to_string();
        self.timed("kill", |c| async move { c.kill_now(&id).await })
            .await
    }

    pub(crate) async fn kill_now(&self, id: &str) -> Result<(), ControlError> {
        trace_sandbox(id);
        let mut guard = self.locked(id).await?;
        let sb = &mut *guard;
        // What its journals hold that was not read yet: the agent ends with it.
        self.inner.audit.final_read(sb).await;
        sb.transition(SandboxState::Stopping)
            .map_err(|e| ControlError::FailedPrecondition(e.to_string()))?;
        // Cut traffic before the kill: clients see their streams aborted, then 502.
        self.unroute(id);
        // Persisted so that a crash mid-kill is finished by the next start (the runtime's
        // reattach frees whatever it is not asked to keep).
        self.inner.store.update_sandbox(sb).await?;
        let killed = self
            .inner
            .runtime
            .kill(id)
            .instrument(self.stage("runtime.kill"))
            .await;
        let result = match killed {
            Ok(()) | Err(RuntimeError::NotFound(_)) => {
                sb.transition(SandboxState::Killed)
                    .map_err(ControlError::internal_cause("sandbox state"))?;
                Ok(())
            }
            Err(e) => {
                sb.fail(format!("kill failed: {e}"));
                Err(ControlError::internal_cause("kill failed")(e))
            }
        };
        self.inner.store.update_sandbox(sb).await?;
        self.unregister(id);
        self.inner.networks.leave_all(self, id).await;
        let ran = Utc::now()
            .signed_duration_since(sb.started_at)
            .num_milliseconds();
        let data = serde_json::json!({"execution": {"started_at": sb.started_at,
            "vcpu_count": sb.resources.cpu_count, "memory_mb": sb.resources.memory_mb, "execution_time": ran}});
        self.inner
            .events
            .record(sb, crate::events::EventKind::Killed, Some(data))
            .await;
        tracing::info!(sandbox_id = %id, state = sb.state.as_str(), "sandbox stopped");
        result
    }

    /// Marks a running sandbox that ended on its own as failed.
    pub(crate) async fn mark_exited(&self, id: &str, reason: String) -> Result<(), ControlError> {
        let mut guard = self.locked(id).await?;
        let sb = &mut *guard;
        if sb.state != SandboxState::Running {
            return Ok(());
        }
        self.unroute(id);
        sb.fail(format!("sandbox exited: {reason}"));
        self.inner.store.update_sandbox(sb).await?;
        self.unregister(id);
        self.inner.networks.leave_all(self, id).await;
        self.inner
            .events
            .record(
                sb,
                crate::events::EventKind::Killed,
                Some(serde_json::json!({"reason": reason})),
            )
            .await;
        tracing::warn!(sandbox_id = %id, reason = %reason, "sandbox exited on its own");
        Ok(())
    }

    /// Ids of running sandboxes (for the exit watcher).
    pub(crate) fn running_ids(&self) -> Vec<String> {
        lock(&self.inner.routes).keys().cloned().collect()
    }
}

impl Sandboxes {
    /// A sandbox started running somewhere or stopped: its networks' members learn it, in
    /// the background.
    pub(crate) fn peers_moved(&self, id: &str) {
        self.inner.networks.peers_moved(Arc::new(self.clone()), id);
    }

    /// The team that owns `sandbox_id`, for brokering one of its requests (`None`: no such
    /// sandbox, or the store could not say).
    pub(crate) async fn team_of_sandbox(&self, sandbox_id: &str) -> Option<String> {
        match self.inner.store.get_sandbox(sandbox_id).await {
            Ok(Some(sb)) => Some(sb.team),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(sandbox_id, error = %warren_runtime::chain(&e), "cannot look up a sandbox's team");
                None
            }
        }
    }
}

#[async_trait::async_trait]
impl crate::volumes::MountedBy for Sandboxes {
    async fn mounted_by(&self, id: &str) -> Vec<String> {
        let live: Vec<Entry> = lock(&self.inner.live).values().cloned().collect();
        let mut out = Vec::new();
        for e in live {
            let sb = e.lock().await;
            if !sb.state.is_gone() && sb.volume_mounts.iter().any(|m| m.volume_id == id) {
                out.push(sb.id.to_string());
            }
        }
        out
    }
}

#[async_trait::async_trait]
impl crate::networks::SandboxLookup for Sandboxes {
    fn address(&self, id: &str) -> Option<std::net::Ipv4Addr> {
        match self.route(id)?.agent.ip() {
            std::net::IpAddr::V4(ip) => Some(ip),
            std::net::IpAddr::V6(_) => None,
        }
    }

    async fn team_and_state(&self, id: &str) -> Result<(String, SandboxState), ControlError> {
        let sb = self.get(id).await?;
        Ok((sb.team, sb.state))
    }
}

#[async_trait::async_trait]
impl crate::templates::ImageUsers for Sandboxes {
    async fn sandboxes_on(&self, images: &[String]) -> Vec<String> {
        let live: Vec<Entry> = lock(&self.inner.live).values().cloned().collect();
        let mut out = Vec::new();
        for e in live {
            let sb = e.lock().await;
            if !sb.state.is_gone() && images.contains(&sb.template) {
                out.push(sb.id.to_string());
            }
        }
        out
    }

    async fn snapshot_on(&self, images: &[String]) -> Result<Option<String>, ControlError> {
        let snapshots = self.inner.store.snapshots().await?;
        Ok(snapshots
            .into_iter()
            .find(|s| images.contains(&s.template))
            .map(|s| s.id))
    }

    async fn images_used(&self) -> Result<Vec<String>, ControlError> {
        let states = [
            SandboxState::Pending,
            SandboxState::Running,
            SandboxState::Paused,
            SandboxState::Stopping,
        ];
        let store = &self.inner.store;
        let mut used: Vec<String> = store
            .sandboxes_in(&states)
            .await?
            .into_iter()
            .map(|sb| sb.template)
            .collect();
        used.extend(store.snapshots().await?.into_iter().map(|s| s.template));
        Ok(used)
    }
}

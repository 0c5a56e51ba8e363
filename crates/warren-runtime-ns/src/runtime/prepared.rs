//! Sandboxes prepared ahead of creates, so that a create only claims one.
//!
//! A prepared sandbox is started in full under its future id (a fresh id, never shown to
//! anyone before its create): its own host id range, cgroup, network slot, empty writable
//! layer, boot id, and nsinit with the agent answering on the slot and waiting for `/init`.
//! Its agent requires a token only the runtime knows. A create claims it
//! ([`warren_runtime::SandboxRuntime::reserve_prepared`], then `create` with that id): the
//! runtime applies the create's limits, disk size and egress policy, and its `/init` gives
//! the agent the tenant's env vars and token in place of the runtime's. Nothing of one tenant
//! can reach another through the pool: a prepared sandbox is used once and killed with its
//! tenant, like any other.
//!
//! How many wait per template follows demand: the most creates of that template that arrived
//! within one second, or were in flight at once, over the last two minutes, plus one, within
//! [`NsSettings::prepared_max`] and an eighth of the host's available memory (see
//! [`PER_SANDBOX`]). Refills run one at a time; while some are left they wait until no create
//! is in flight and creates have been quiet for [`QUIET`], so the answer and the caller's
//! first command come first. A pool running dry (fewer than [`LOW`]) refills at once: the
//! next create would otherwise start a sandbox from scratch, which costs it far more than
//! sharing the CPU with a refill. A server restart discards them: they have no record,
//! so the next start's cleanup removes them, and their ids are never handed out again.
//!
//! [`NsSettings::prepared_max`]: super::NsSettings::prepared_max

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use warren_host::cgroup::Limits;
use warren_net::{Slot, SlotPolicy};
use warren_runtime::{CreateSpec, PreparedStats, RuntimeError, RuntimeSandbox};

use super::start::{limits_of, writable_of, Start};
use super::{ids_holder, NsRuntime};
use crate::launch::Sandbox;

/// How long a create may take to claim the sandbox it reserved before it is discarded.
const RESERVATION: Duration = Duration::from_secs(60);
/// Demand is counted per bucket of this length (creates that arrived in it, and the most in
/// flight at once)...
const BUCKET: Duration = Duration::from_secs(1);
/// ...over this window.
const WINDOW: Duration = Duration::from_secs(120);
/// Refills start only after creates have been quiet this long: a create's answer, its record
/// and the first command its caller sends right after come first.
const QUIET: Duration = Duration::from_millis(30);

/// With fewer than this many waiting for a template, refills do not wait for quiet: creates
/// back to back (one in flight at a time) would find the pool empty every other time.
const LOW: usize = 2;
/// What a waiting sandbox is counted at against the host's memory (it uses a few MiB: see
/// [`PreparedStats::memory_bytes`]; the rest is room for its first moments of work).
const PER_SANDBOX: u64 = 32 << 20;

/// One sandbox started ahead.
pub(super) struct Prepared {
    id: String,
    template: String,
    sandbox: Sandbox,
    slot: Slot,
    /// The token its agent requires until its claim's `/init` replaces it.
    token: String,
    limits: Limits,
    writable_bytes: u64,
}

/// The limits and disk size the pool of a template starts its sandboxes with: those of the
/// template's latest create.
#[derive(Clone, Copy)]
struct Shape {
    limits: Limits,
    writable_bytes: u64,
}

/// One bucket of demand for a template.
struct Bucket {
    start: Instant,
    arrived: usize,
    in_flight: usize,
}

#[derive(Default)]
struct State {
    ready: HashMap<String, VecDeque<Prepared>>,
    /// Handed out by `reserve_prepared`, not claimed yet.
    reserved: HashMap<String, (Instant, Prepared)>,
    /// Per template: creates in flight now, and per bucket the larger of the creates that
    /// arrived in it and the most in flight at once.
    in_flight: HashMap<String, usize>,
    peaks: HashMap<String, VecDeque<Bucket>>,
    /// Fixed targets (`set_warm_pool`), which replace demand.
    fixed: HashMap<String, usize>,
    shapes: HashMap<String, Shape>,
    /// Found ended while waiting; the refill task removes them.
    dead: Vec<Prepared>,
    /// When the latest create ended.
    last_end: Option<Instant>,
}

impl State {
    fn demand(&self, template: &str) -> usize {
        if let Some(n) = self.fixed.get(template) {
            return *n;
        }
        let peak = self.peaks.get(template).map_or(0, |b| {
            b.iter()
                .filter(|b| b.start.elapsed() < WINDOW)
                .map(|b| b.arrived.max(b.in_flight))
                .max()
                .unwrap_or(0)
        });
        if peak == 0 {
            0
        } else {
            peak + 1
        }
    }

    fn creating(&self) -> usize {
        self.in_flight.values().sum()
    }
}

/// The pool's state and its refill task.
#[derive(Default)]
pub(super) struct Pool {
    state: Mutex<State>,
    wake: Arc<tokio::sync::Notify>,
    stopping: AtomicBool,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A create of one template in flight, counted for demand until it ends.
pub(super) struct InFlight<'a> {
    pool: &'a Pool,
    template: String,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut st = lock(&self.pool.state);
        if let Some(n) = st.in_flight.get_mut(&self.template) {
            *n = n.saturating_sub(1);
        }
        st.last_end = Some(Instant::now());
        drop(st);
        // Refills wait for creates to end.
        self.pool.wake.notify_one();
    }
}

/// What the refill task does next.
enum Step {
    Discard(Vec<Prepared>),
    Fill(String, Shape),
    /// Until woken, or at most this long.
    Wait(Duration),
}

impl NsRuntime {
    /// Starts the pool's refill task.
    pub(super) fn start_pool(self: &Arc<Self>) {
        let task = tokio::spawn(tend(Arc::downgrade(self)));
        *lock(&self.prepared.task) = Some(task);
    }

    /// Counts a create of `spec`'s template for demand and keeps its shape for refills.
    pub(super) fn note_create(&self, spec: &CreateSpec) -> InFlight<'_> {
        let mut st = lock(&self.prepared.state);
        let n = st.in_flight.entry(spec.template.clone()).or_default();
        *n += 1;
        let now_in_flight = *n;
        let peaks = st.peaks.entry(spec.template.clone()).or_default();
        match peaks.back_mut() {
            Some(b) if b.start.elapsed() < BUCKET => {
                b.arrived += 1;
                b.in_flight = b.in_flight.max(now_in_flight);
            }
            _ => peaks.push_back(Bucket {
                start: Instant::now(),
                arrived: 1,
                in_flight: now_in_flight,
            }),
        }
        while peaks.front().is_some_and(|b| b.start.elapsed() >= WINDOW) {
            peaks.pop_front();
        }
        st.shapes.insert(
            spec.template.clone(),
            Shape {
                limits: limits_of(spec),
                writable_bytes: writable_of(spec),
            },
        );
        drop(st);
        self.prepared.wake.notify_one();
        InFlight {
            pool: &self.prepared,
            template: spec.template.clone(),
        }
    }

    /// [`warren_runtime::SandboxRuntime::reserve_prepared`]: the id of a ready sandbox of
    /// `template`, moved to the reserved set.
    pub(super) fn reserve_ready(&self, template: &str) -> Option<String> {
        let mut st = lock(&self.prepared.state);
        let queue = st.ready.get_mut(template)?;
        let mut dead = Vec::new();
        let found = loop {
            let Some(p) = queue.pop_front() else {
                break None;
            };
            if p.sandbox.is_running() {
                break Some(p);
            }
            dead.push(p);
        };
        if let Some(p) = found.as_ref() {
            tracing::debug!(sandbox = %p.id, template, "prepared sandbox reserved");
        }
        let id = found.map(|p| {
            let id = p.id.clone();
            st.reserved.insert(id.clone(), (Instant::now(), p));
            id
        });
        if !dead.is_empty() {
            tracing::warn!(
                template,
                n = dead.len(),
                "prepared sandboxes ended while waiting"
            );
            st.dead.extend(dead);
        }
        drop(st);
        self.prepared.wake.notify_one();
        id
    }

    /// The sandbox reserved as `id`, if any (the create claims it).
    pub(super) fn take_reserved(&self, id: &str) -> Option<Prepared> {
        lock(&self.prepared.state)
            .reserved
            .remove(id)
            .map(|(_, p)| p)
    }

    /// Hands prepared sandbox `p` to `spec`'s tenant. On failure `p` is gone entirely.
    pub(super) async fn claim(
        &self,
        spec: &CreateSpec,
        p: Prepared,
    ) -> Result<RuntimeSandbox, RuntimeError> {
        if p.writable_bytes != writable_of(spec) {
            // A disk's size is set when it is made: a create asking another size gets a
            // sandbox of its own (the pool follows the latest create's size).
            tracing::debug!(sandbox = %p.id, "prepared sandbox has another disk size");
            self.discard(p).await;
            return Err(RuntimeError::Conflict(
                "the prepared sandbox's disk has another size".into(),
            ));
        }
        let Prepared {
            id,
            template,
            sandbox,
            mut slot,
            token,
            limits,
            writable_bytes,
        } = p;
        let result = async {
            let want = limits_of(spec);
            if want != limits {
                sandbox
                    .cgroup
                    .apply(want)
                    .map_err(RuntimeError::io("apply the sandbox's limits"))?;
            }
            // Before the tenant can run anything.
            let policy = warren_host::egress::slot_policy(&spec.egress_policy());
            if !policy.is_open() {
                self.pool()
                    .await?
                    .set_policy(&mut slot, &policy)
                    .await
                    .map_err(|e| RuntimeError::unavailable("apply the egress policy", e))?;
            }
            self.hand_over(spec, &sandbox, &slot, Some(&token)).await
        }
        .await;
        if let Err(e) = result {
            self.discard(Prepared {
                id,
                template,
                sandbox,
                slot,
                token,
                limits,
                writable_bytes,
            })
            .await;
            return Err(e);
        }
        tracing::info!(sandbox = %id, template, "prepared sandbox claimed");
        self.register_running(id, &spec.template, sandbox, slot)
            .await
    }

    /// Kills a prepared sandbox and frees all it held.
    async fn discard(&self, p: Prepared) {
        if let Err(e) = p.sandbox.destroy().await {
            tracing::warn!(sandbox = %p.id, error = %e, "could not remove a prepared sandbox");
        }
        if let Some(pool) = self.net.get() {
            pool.forget_flows(&p.id);
            if let Err(e) = pool.release(p.slot).await {
                tracing::warn!(sandbox = %p.id, error = %e, "could not release the network slot");
            }
        }
        self.release_ids(&p.id);
        self.procs.forget(&p.id);
    }

    /// Starts one sandbox of `template` shaped as `shape`, ready for a claim.
    async fn prepare_one(&self, template: &str, shape: Shape) -> Result<Prepared, RuntimeError> {
        let image_root = self.template_root(template).await?;
        let pool = self.pool().await?;
        let id = warren_runtime::SandboxId::generate()
            .map_err(|e| RuntimeError::Failed(format!("no randomness available: {e}")))?
            .to_string();
        let id_base = self.assign_ids(&id)?;
        let slot = match pool.acquire(&SlotPolicy::default()).await {
            Ok(slot) => slot,
            Err(e) => {
                self.release_ids(&id);
                return Err(warren_host::slot_error(e));
            }
        };
        pool.set_owner(&slot, &id);
        let token = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        let started = self
            .launch_one(Start {
                id: &id,
                template,
                limits: shape.limits,
                writable_bytes: shape.writable_bytes,
                slot: &slot,
                image_root,
                seed: None,
                id_base,
                token: Some(&token),
                volumes: &[],
            })
            .await;
        let sandbox = match started {
            Ok(s) => s,
            Err(e) => {
                let _ = pool.release(slot).await;
                self.release_ids(&id);
                self.procs.forget(&id);
                return Err(e);
            }
        };
        let p = Prepared {
            id,
            template: template.to_string(),
            sandbox,
            slot,
            token,
            limits: shape.limits,
            writable_bytes: shape.writable_bytes,
        };
        let agent = SocketAddr::V4(p.slot.agent_endpoint());
        if let Err(e) =
            warren_host::agent::wait_healthy(&self.client, agent, self.cfg.ready_timeout).await
        {
            self.discard(p).await;
            return Err(e);
        }
        Ok(p)
    }

    /// How many sandboxes may wait, across templates: the configured cap, within an eighth
    /// of the host's available memory.
    fn prepared_cap(&self) -> usize {
        let by_memory = available_memory().map_or(usize::MAX, |m| {
            usize::try_from(m / 8 / PER_SANDBOX).unwrap_or(usize::MAX)
        });
        self.settings.prepared_max.min(by_memory)
    }

    /// What the refill task does next.
    fn next_step(&self) -> Step {
        let cap = self.prepared_cap();
        let mut st = lock(&self.prepared.state);
        if !st.dead.is_empty() {
            return Step::Discard(std::mem::take(&mut st.dead));
        }
        let expired: Vec<String> = st
            .reserved
            .iter()
            .filter(|(_, (at, _))| at.elapsed() >= RESERVATION)
            .map(|(id, _)| id.clone())
            .collect();
        if !expired.is_empty() {
            let gone = expired
                .iter()
                .filter_map(|id| st.reserved.remove(id).map(|(_, p)| p))
                .collect();
            return Step::Discard(gone);
        }
        let mut templates: Vec<String> = st.ready.keys().cloned().collect();
        templates.extend(st.shapes.keys().cloned());
        templates.sort();
        templates.dedup();
        let total: usize = st.ready.values().map(VecDeque::len).sum();
        // Over the target (demand fell, or the cap did): the newest go first.
        for t in &templates {
            let target = st.demand(t).min(cap);
            let queue = st.ready.entry(t.clone()).or_default();
            if queue.len() > target {
                let extra: Vec<Prepared> = queue.drain(target..).collect();
                return Step::Discard(extra);
            }
        }
        // Creates in flight, or ended less than `QUIET` ago: not yet, unless a pool is empty.
        let wait = if st.creating() > 0 {
            Some(Duration::from_secs(1))
        } else {
            st.last_end.and_then(|t| QUIET.checked_sub(t.elapsed()))
        };
        let mut later = None;
        for t in &templates {
            let target = st.demand(t).min(cap);
            let have = st.ready.get(t).map_or(0, VecDeque::len);
            if have < target && total < cap {
                let Some(shape) = st.shapes.get(t).copied() else {
                    continue;
                };
                match refill_now(have, wait) {
                    Ok(()) => return Step::Fill(t.clone(), shape),
                    Err(w) => later = Some(later.map_or(w, |l: Duration| l.min(w))),
                }
            }
        }
        if let Some(q) = later {
            return Step::Wait(q);
        }
        Step::Wait(Duration::from_secs(1))
    }

    /// [`warren_runtime::SandboxRuntime::set_warm_pool`]: a fixed number for `template`.
    pub(super) async fn set_prepared_target(
        &self,
        template: &str,
        size: usize,
    ) -> Result<(), RuntimeError> {
        self.template_root(template).await?;
        let mut st = lock(&self.prepared.state);
        st.fixed.insert(template.to_string(), size);
        st.shapes.entry(template.to_string()).or_insert(Shape {
            limits: Limits {
                cpu_millis: Some(1000),
                memory_bytes: Some(512 << 20),
                pids: Some(4096),
            },
            writable_bytes: 1 << 30,
        });
        drop(st);
        self.prepared.wake.notify_one();
        Ok(())
    }

    /// Template image `template` is going away: its prepared sandboxes go now, and demand
    /// for it is forgotten.
    pub(super) async fn forget_prepared(&self, template: &str) {
        let gone: Vec<Prepared> = {
            let mut st = lock(&self.prepared.state);
            st.fixed.remove(template);
            st.shapes.remove(template);
            st.peaks.remove(template);
            st.ready.remove(template).map(Vec::from).unwrap_or_default()
        };
        for p in gone {
            self.discard(p).await;
        }
    }

    /// Stops refills and discards every prepared sandbox (server exit, shutdown).
    pub(super) async fn stop_pool(&self) {
        self.stop_refills().await;
        let all: Vec<Prepared> = {
            let mut st = lock(&self.prepared.state);
            let mut all: Vec<Prepared> = st.ready.drain().flat_map(|(_, q)| q).collect();
            all.extend(st.reserved.drain().map(|(_, (_, p))| p));
            all
        };
        for p in all {
            self.discard(p).await;
        }
    }

    /// Stops the refill task and waits for it; what is prepared stays.
    pub(super) async fn stop_refills(&self) {
        self.prepared.stopping.store(true, Ordering::SeqCst);
        self.prepared.wake.notify_one();
        let task = lock(&self.prepared.task).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    /// For the server's gauges: counts, target and the waiting ones' memory.
    pub(super) fn prepared_stats(&self) -> PreparedStats {
        let cap = self.prepared_cap();
        let st = lock(&self.prepared.state);
        let mut templates: Vec<&String> = st.ready.keys().chain(st.shapes.keys()).collect();
        templates.sort();
        templates.dedup();
        PreparedStats {
            ready: st.ready.values().map(VecDeque::len).sum(),
            reserved: st.reserved.len(),
            target: templates
                .iter()
                .map(|t| st.demand(t))
                .sum::<usize>()
                .min(cap),
            memory_bytes: st
                .ready
                .values()
                .flatten()
                .filter_map(|p| p.sandbox.cgroup.usage().memory_bytes)
                .sum(),
        }
    }

    /// The ids of the prepared sandboxes of `template` (tests check they never surface).
    pub fn prepared_ids(&self, template: &str) -> Vec<String> {
        lock(&self.prepared.state)
            .ready
            .get(template)
            .map(|q| q.iter().map(|p| p.id.clone()).collect())
            .unwrap_or_default()
    }

    /// Whether `id` holds a host id range (tests check discarded ones are freed).
    pub fn holds_ids(&self, id: &str) -> bool {
        self.ids.get(&ids_holder(id)).is_some()
    }
}

/// The refill task: discards what is over the target or expired, and starts one sandbox at a
/// time where a template has fewer than its target while no create is in flight.
async fn tend(rt: Weak<NsRuntime>) {
    loop {
        let wake = {
            let Some(rt) = rt.upgrade() else { return };
            if rt.prepared.stopping.load(Ordering::SeqCst) {
                return;
            }
            match rt.next_step() {
                Step::Discard(ps) => {
                    for p in ps {
                        rt.discard(p).await;
                    }
                    continue;
                }
                Step::Fill(template, shape) => {
                    match rt.prepare_one(&template, shape).await {
                        Ok(p) if rt.prepared.stopping.load(Ordering::SeqCst) => {
                            rt.discard(p).await;
                            return;
                        }
                        Ok(p) => {
                            tracing::debug!(sandbox = %p.id, template, "sandbox prepared");
                            lock(&rt.prepared.state)
                                .ready
                                .entry(template)
                                .or_default()
                                .push_back(p);
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!(template, error = %warren_runtime::chain(&e), "could not prepare a sandbox");
                        }
                    }
                    // Not again at once: what failed (a full host, a broken image) rarely
                    // mends within the second. A create still wakes us.
                    (rt.prepared.wake.clone(), Duration::from_secs(10))
                }
                Step::Wait(limit) => (rt.prepared.wake.clone(), limit),
            }
        };
        // Woken by creates (starting or ending) and reservations; the tick expires the rest.
        tokio::select! {
            _ = wake.0.notified() => {}
            _ = tokio::time::sleep(wake.1) => {}
        }
    }
}

/// Whether a template with `have` sandboxes waiting is refilled now, when refills would
/// otherwise wait `wait` (creates in flight, or not quiet yet); `Err`: ask again after that.
/// A pool running dry cannot wait: the next creates would start from scratch.
fn refill_now(have: usize, wait: Option<Duration>) -> Result<(), Duration> {
    match wait {
        Some(w) if have >= LOW => Err(w),
        _ => Ok(()),
    }
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refills_wait_for_quiet_only_while_the_pool_has_some_to_spare() {
        let busy = Some(Duration::from_millis(20));
        assert_eq!(refill_now(0, busy), Ok(()), "an empty pool refills at once");
        assert_eq!(
            refill_now(1, busy),
            Ok(()),
            "one left: refilled beside the create"
        );
        assert_eq!(refill_now(LOW, busy), Err(Duration::from_millis(20)));
        assert_eq!(refill_now(10, None), Ok(()), "quiet: refilled");
    }
}

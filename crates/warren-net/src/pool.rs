//! The pool: slots built ahead of demand, leased in O(1), reset and recycled on release.

use std::collections::{BTreeSet, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::addr::SlotAddrs;
use crate::adopt::{self, AdoptSlot};

mod peers;
mod start;
mod table;
use crate::cleanup::{remove_prefix_objects, CleanupReport, Tables};
use crate::cmd::{Invocation, CONNTRACK};
use crate::config::NetConfig;
use crate::dns::DnsConfig;
use crate::error::{Error, Result};
use crate::flows::FlowLog;
use crate::host::{self, PrefixLock};
use crate::netns::netns_path;
use crate::pins::Pins;
use crate::policy::SlotPolicy;
use crate::proxy::Proxy;
use crate::resolver::Resolver;
use crate::rules::SlotFilter;
use crate::slot::{self, Returned, Slot};
use crate::watchdog::{self, TableCheck};

/// Pause of the background refill after a failed creation, so a persistent failure (e.g.
/// nftables missing) logs once in a while instead of spinning.
const REFILL_BACKOFF: Duration = Duration::from_secs(2);

static NEXT_POOL_ID: AtomicU64 = AtomicU64::new(1);

/// Counts of a pool's slots, for metrics and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolStats {
    /// Built and waiting for `acquire`.
    pub ready: usize,
    /// Leased to sandboxes.
    pub in_use: usize,
    /// Being built by the background refill.
    pub creating: usize,
    /// Failed to reset or be removed; kept out of circulation until the pool shuts down.
    pub broken: usize,
    /// The configured number of ready slots.
    pub target: usize,
}

/// A pool of network slots for one prefix. See the crate documentation.
///
/// Dropping the pool stops its background task but leaves every slot, link and table in
/// place (like a crash would): call [`NetPool::shutdown`] to remove them, or let the next
/// pool on the same prefix clean them up when it starts (or adopt those of sandboxes that
/// are still running: [`NetPool::start_adopting`]).
pub struct NetPool {
    inner: Arc<Inner>,
    worker: JoinHandle<()>,
    /// Checks the host table every `table_check_interval_ms` (none when that is 0).
    watchdog: Option<JoinHandle<()>>,
    startup_cleanup: CleanupReport,
    // Last field: released after the worker is told to stop.
    _lock: PrefixLock,
}

pub(crate) struct Inner {
    id: u64,
    config: NetConfig,
    max_slots: u32,
    dns: DnsConfig,
    resolv_conf: Arc<str>,
    flush_conntrack: bool,
    /// The in-slot filter every slot gets.
    filter: SlotFilter,
    /// Answers the DNS queries of sandboxes with name rules.
    resolver: Resolver,
    /// Decides their TCP connections by the name they carry.
    proxy: Proxy,
    /// What the resolver and the proxy pinned in each slot.
    pins: Arc<Pins>,
    /// What they decided, by the sandbox each slot serves.
    flows: Arc<FlowLog>,
    /// By slot name, the reader of what the slot's filter decided by address (leased slots).
    readers: Mutex<std::collections::HashMap<String, JoinHandle<()>>>,
    /// The runtime the pool started in: readers are spawned there whoever calls.
    runtime: tokio::runtime::Handle,
    /// Slot links need their own forwarding switch (the host has `ip_forward` off).
    forward_per_link: bool,
    /// Serialises changes of the host table (no-egress elements) with the watchdog's check
    /// and restore, so a restore never loses or resurrects an element.
    table_lock: tokio::sync::Mutex<()>,
    /// Shape of the host table as last loaded (see [`watchdog::Listing`]).
    expected_table: Mutex<String>,
    /// False while the host table is known to be missing or wrong and could not be restored:
    /// `acquire` then refuses new slots.
    healthy: AtomicBool,
    state: Mutex<State>,
    /// Serialises refills (background and [`NetPool::fill`]) so they never overshoot.
    refill_lock: tokio::sync::Mutex<()>,
    wake: Notify,
    returner: UnboundedSender<Returned>,
}

#[derive(Default)]
struct State {
    ready: VecDeque<(String, SlotAddrs)>,
    /// Every index whose objects exist or are being built. Registered *before* building, so
    /// a concurrent stale cleanup never mistakes a slot under construction for a leftover.
    allocated: BTreeSet<u32>,
    /// Indices below `next` that are free again; the lowest is reused first.
    free: BTreeSet<u32>,
    next: u32,
    refilling: usize,
    broken: usize,
    shutting_down: bool,
    /// Slot links that are (or may be) in the host's no-egress set: what a restored host
    /// table must contain.
    no_egress: BTreeSet<String>,
    /// (from, to) link pairs in the host's `peer_links` set, both directions of each pair,
    /// by the slot whose peers put them there: what a restored host table must contain.
    peer_links: std::collections::BTreeMap<String, BTreeSet<(String, String)>>,
}

impl State {
    /// The state of a new pool whose slots `leased` are already leased (adopted).
    fn with_leased(leased: impl IntoIterator<Item = u32>) -> Self {
        let allocated: BTreeSet<u32> = leased.into_iter().collect();
        let next = allocated.last().map_or(0, |i| i + 1);
        Self {
            free: (0..next).filter(|i| !allocated.contains(i)).collect(),
            allocated,
            next,
            ..Self::default()
        }
    }
}

impl NetPool {
    /// Starts a pool: takes the prefix lock, removes leftovers of a crashed predecessor,
    /// checks the address pool is free, enables IPv4 forwarding, installs the host table and
    /// starts filling the pool in the background.
    ///
    /// The same as [`NetPool::start_adopting`] with nothing to adopt: every slot of the
    /// prefix is removed, including those of sandboxes that are still running.
    pub async fn start(config: NetConfig) -> Result<Self> {
        Self::start_adopting(config, Vec::new())
            .await
            .map(|(pool, _)| pool)
    }

    /// Starts a pool like [`NetPool::start`], but takes over the slots listed in `adopt`
    /// (those of sandboxes that kept running while the server restarted) instead of
    /// removing them.
    ///
    /// Each listed slot is checked against what slot creation builds: its netns, its host
    /// veth (up, gateway MAC, host veth address, peer inside the netns), the permanent
    /// neighbour entry for its host-side address and its own NAT rules. An intact slot comes
    /// back as a leased [`Slot`], exactly like one from [`NetPool::acquire`]: its index is
    /// never handed out again until it is released or dropped, and its egress is set to
    /// `allow_internet_access`. Nothing inside it is touched, so the sandbox's open
    /// connections survive. A slot that is missing, damaged, listed twice or outside the
    /// pool gives [`Error::NotAdoptable`] and whatever is left of it is removed with the
    /// other stale objects of the prefix.
    ///
    /// The returned slots are in the order of `adopt`. The host table is replaced atomically,
    /// so adopted sandboxes stay isolated throughout. If the start itself fails, adoptable
    /// slots are left in place for the next attempt.
    pub async fn start_adopting(
        config: NetConfig,
        adopt: Vec<AdoptSlot>,
    ) -> Result<(Self, Vec<Result<Slot>>)> {
        let max_slots = config.validate()?;
        if config.flush_conntrack {
            // Without the flush, a recycled slot accepts late replies to its previous
            // tenant's connections: refuse to start rather than degrade silently.
            Invocation::new(CONNTRACK)
                .args(["--version"])
                .run()
                .await
                .map_err(|e| Error::ConntrackRequired {
                    source: Box::new(e),
                })?;
        }
        let lock = PrefixLock::acquire(&config)?;
        let verdicts = adopt::verify(&config, max_slots, &adopt).await?;
        let keep: HashSet<String> = verdicts
            .iter()
            .filter_map(|v| Some(config.slot_name(v.as_ref().ok()?.index)))
            .collect();
        let startup_cleanup = remove_prefix_objects(&config, &keep, Tables::KeepHostTable).await?;
        if !startup_cleanup.is_empty() {
            tracing::warn!(prefix = %config.prefix, removed = ?startup_cleanup,
                "removed network objects left by a previous run");
        }
        host::check_pool_free(&config).await?;

        let dns = DnsConfig::resolve(&config.dns)?;
        if dns.servers.is_empty() {
            tracing::warn!(
                "no usable DNS server for sandboxes (host has only loopback resolvers?); \
                 set `dns` in the network configuration"
            );
        }
        let pins = Arc::new(Pins::new(&config.prefix));
        let flows = Arc::new(FlowLog::default());
        let resolver = Resolver::start(pins.clone(), flows.clone(), dns.servers.clone()).await?;
        let proxy = Proxy::new(
            dns.servers.clone(),
            pins.clone(),
            flows.clone(),
            config.max_connections_per_slot,
            config.broker.clone(),
        );
        let layers =
            start::install_host_layers(&config, &dns, resolver.port(), &adopt, &verdicts).await?;
        let start::HostLayers {
            filter,
            forward_per_link,
            no_egress,
            expected_table,
        } = layers;

        let flush_conntrack = config.flush_conntrack;
        let mut state =
            State::with_leased(verdicts.iter().filter_map(|v| Some(v.as_ref().ok()?.index)));
        state.no_egress = no_egress.iter().cloned().collect();
        let (returner, returns) = unbounded_channel();
        let inner = Arc::new(Inner {
            id: NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed),
            resolv_conf: dns.resolv_conf().into(),
            dns,
            max_slots,
            flush_conntrack,
            filter,
            resolver,
            proxy,
            pins,
            flows,
            readers: Mutex::default(),
            runtime: tokio::runtime::Handle::current(),
            forward_per_link,
            table_lock: tokio::sync::Mutex::new(()),
            expected_table: Mutex::new(expected_table),
            healthy: AtomicBool::new(true),
            config,
            state: Mutex::new(state),
            refill_lock: tokio::sync::Mutex::new(()),
            wake: Notify::new(),
            returner,
        });
        let slots = start::adopted_slots(&inner, &adopt, verdicts);
        tracing::info!(prefix = %inner.config.prefix, pool = %inner.config.host_cidr,
            target = inner.config.pool_size, dns = ?inner.dns.servers,
            adopted = keep.len(), not_adopted = adopt.len() - keep.len(),
            "network pool started");
        let worker = tokio::spawn(background(inner.clone(), returns));
        let check_every = inner.config.table_check_interval_ms;
        let watchdog =
            (check_every > 0).then(|| tokio::spawn(table_watchdog(inner.clone(), check_every)));
        inner.wake.notify_one();
        let pool = Self {
            inner,
            worker,
            watchdog,
            startup_cleanup,
            _lock: lock,
        };
        Ok((pool, slots))
    }

    /// Leases a slot with egress `policy`. O(1) when a ready slot exists and the policy is
    /// open; a restricted policy costs one nft call in the slot (two when it denies
    /// everything). Otherwise builds one on the spot (about 10 ms).
    ///
    /// Cancel-safe, like every pool operation: work that touches the system runs in its own
    /// task, and a slot whose caller went away returns to the pool.
    ///
    /// Fails with [`Error::HostTableMissing`] while the host table is known to be gone and
    /// could not be restored (see [`NetPool::check_host_table`]).
    pub async fn acquire(&self, policy: &SlotPolicy) -> Result<Slot> {
        if !self.is_healthy() {
            return Err(Error::HostTableMissing {
                table: format!("inet {}", self.inner.config.prefix),
            });
        }
        let ready = self.inner.pop_ready();
        self.inner.wake.notify_one();
        if let (Some((name, addrs)), true) = (&ready, policy.is_open()) {
            return Ok(self.inner.slot(name.clone(), *addrs));
        }
        let inner = self.inner.clone();
        let policy = policy.clone();
        run_detached(async move {
            let (name, addrs) = match ready {
                Some(r) => r,
                None => inner.create_one(false).await?,
            };
            let mut slot = inner.slot(name, addrs);
            // On failure the slot is dropped here, which hands it back for recycling.
            inner.set_policy(&mut slot, &policy).await?;
            Ok(slot)
        })
        .await
    }

    /// Replaces the sandbox's egress policy. Open connections the new policy does not allow
    /// are cut (their next packet is refused); the host keeps reaching the sandbox either way.
    pub async fn set_policy(&self, slot: &mut Slot, policy: &SlotPolicy) -> Result<()> {
        self.check_owner(slot)?;
        self.inner.set_policy(slot, policy).await
    }

    /// The resolver's and the egress proxy's decisions about `slot`'s traffic go to `owner`'s
    /// flow log (a sandbox id) from now on, until the slot is released.
    ///
    /// Also starts the slot's reader of the connections its filter decides by address (for
    /// the same log), on the runtime the pool started in.
    pub fn set_owner(&self, slot: &Slot, owner: &str) {
        self.inner.flows.set_owner(&slot.name, Some(owner));
        let task = self.inner.runtime.spawn(crate::nflog::read(
            slot.name.clone(),
            slot.netns_path(),
            self.inner.flows.clone(),
        ));
        if let Some(old) = self.inner.readers().insert(slot.name.clone(), task) {
            old.abort();
        }
    }

    /// `owner`'s flow log, oldest first: the last decisions about its sandbox's DNS queries
    /// and (with rules by name) TCP connections, across every slot it held.
    pub fn flows(&self, owner: &str) -> Vec<warren_runtime::flows::Flow> {
        self.inner.flows.of(owner)
    }

    /// Drops `owner`'s flow log (its sandbox is gone).
    pub fn forget_flows(&self, owner: &str) {
        self.inner.flows.forget(owner);
    }

    /// Returns a slot: resets it (internet access back on, conntrack entries flushed) and
    /// keeps it ready for the next sandbox, or removes it when the pool is already full.
    ///
    /// The runtime must first remove anything it added inside the slot (e.g. a tap device).
    pub async fn release(&self, mut slot: Slot) -> Result<()> {
        self.check_owner(&slot)?;
        slot.returner = None;
        let name = std::mem::take(&mut slot.name);
        let (addrs, internet) = (slot.addrs, slot.internet);
        let inner = self.inner.clone();
        run_detached(async move { inner.recycle(name, addrs, internet).await }).await
    }

    /// Builds slots until the pool holds its target of ready slots (e.g. before a server
    /// starts accepting work); errors are returned instead of logged.
    pub async fn fill(&self) -> Result<()> {
        let inner = self.inner.clone();
        run_detached(async move { inner.refill().await }).await
    }

    /// Removes network objects of this pool's prefix that this pool did not create.
    pub async fn cleanup_stale(&self) -> Result<CleanupReport> {
        let keep: HashSet<String> = {
            let state = self.inner.lock();
            state
                .allocated
                .iter()
                .map(|i| self.inner.config.slot_name(*i))
                .collect()
        };
        remove_prefix_objects(&self.inner.config, &keep, Tables::KeepAll).await
    }

    /// What [`NetPool::start`] removed (for [`NetPool::start_adopting`]: including the
    /// remains of slots that could not be adopted). The host table is not listed: it is
    /// replaced, not removed.
    pub fn startup_cleanup(&self) -> &CleanupReport {
        &self.startup_cleanup
    }

    /// Checks that the host table is as the pool loaded it and loads it again if it is
    /// missing or was changed (logging a warning). The watchdog does this every
    /// `table_check_interval_ms`; this runs a check now.
    ///
    /// On failure the pool is unhealthy ([`NetPool::is_healthy`]) and refuses new slots until
    /// a later check succeeds. Running slots stay isolated by their in-slot filter meanwhile.
    pub async fn check_host_table(&self) -> Result<TableCheck> {
        let inner = self.inner.clone();
        run_detached(async move { inner.check_host_table().await }).await
    }

    /// Whether the last check found (or left) the host table in place.
    pub fn is_healthy(&self) -> bool {
        self.inner.healthy.load(Ordering::Relaxed)
    }

    /// [`Self::stats`] as the runtimes report them.
    pub fn slot_stats(&self) -> warren_runtime::SlotStats {
        let s = self.stats();
        warren_runtime::SlotStats {
            ready: s.ready,
            in_use: s.in_use,
            creating: s.creating,
            broken: s.broken,
            target: s.target,
        }
    }

    pub fn stats(&self) -> PoolStats {
        let state = self.inner.lock();
        let ready = state.ready.len();
        PoolStats {
            ready,
            in_use: (state.allocated.len()).saturating_sub(ready + state.refilling + state.broken),
            creating: state.refilling,
            broken: state.broken,
            target: self.inner.config.pool_size,
        }
    }

    pub fn config(&self) -> &NetConfig {
        &self.inner.config
    }

    /// The DNS servers sandboxes use.
    pub fn dns(&self) -> &DnsConfig {
        &self.inner.dns
    }

    /// The resolv.conf content every sandbox of this pool gets.
    pub fn resolv_conf(&self) -> &str {
        &self.inner.resolv_conf
    }

    /// Stops the pool and removes all its slots (leased ones too) and its host table.
    pub async fn shutdown(mut self) -> Result<()> {
        self.inner.lock().shutting_down = true;
        self.worker.abort();
        // Wait until the task is really gone, so no creation races the removal below.
        let _ = (&mut self.worker).await;
        // And the watchdog, which would otherwise restore the table removed below.
        if let Some(mut w) = self.watchdog.take() {
            w.abort();
            let _ = (&mut w).await;
        }
        let report =
            remove_prefix_objects(&self.inner.config, &HashSet::new(), Tables::RemoveAll).await?;
        tracing::info!(prefix = %self.inner.config.prefix, slots = report.netns.len(),
            "network pool shut down");
        Ok(())
    }

    fn check_owner(&self, slot: &Slot) -> Result<()> {
        if slot.pool_id == self.inner.id {
            Ok(())
        } else {
            Err(Error::ForeignSlot {
                name: slot.name.clone(),
            })
        }
    }
}

impl Drop for NetPool {
    fn drop(&mut self) {
        for (_, reader) in self.inner.readers().drain() {
            reader.abort();
        }
        self.worker.abort();
        if let Some(w) = &self.watchdog {
            w.abort();
        }
    }
}

impl Inner {
    fn readers(&self) -> MutexGuard<'_, std::collections::HashMap<String, JoinHandle<()>>> {
        self.readers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the counters half-updated in a way
        // that matters more than stopping the pool, so recover the guard.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes the next ready slot. Ready slots whose namespace vanished (someone ran
    /// `ip netns del`) go to the background task for removal: a stat is cheap insurance
    /// against handing out a broken slot.
    fn pop_ready(&self) -> Option<(String, SlotAddrs)> {
        let mut state = self.lock();
        while let Some((name, addrs)) = state.ready.pop_front() {
            if netns_path(&name).exists() {
                return Some((name, addrs));
            }
            tracing::warn!(slot = %name, "ready slot lost its namespace; replacing it");
            let _ = self.returner.send(Returned {
                name,
                addrs,
                internet: true,
                discard: true,
            });
        }
        None
    }

    /// A lease of an existing slot. It starts with an open policy, as every ready slot has.
    fn slot(&self, name: String, addrs: SlotAddrs) -> Slot {
        Slot {
            name,
            addrs,
            pool_id: self.id,
            internet: true,
            policy: SlotPolicy::open(),
            peers: Default::default(),
            resolv_conf: self.resolv_conf.clone(),
            returner: Some(self.returner.clone()),
        }
    }

    /// The slot filter's policy first, then the host's no-egress set: each layer holds the
    /// old policy or the new one at any moment, and the sandbox gets only what both allow.
    async fn set_policy(&self, slot: &mut Slot, policy: &SlotPolicy) -> Result<()> {
        if slot.policy != *policy {
            let at = self.filter.resolver_at(&slot.addrs);
            // The proxy listens before the slot redirects to it.
            if policy.names.is_some() {
                self.proxy.register(&slot.name, policy.names.as_ref())?;
            }
            let internal = !slot.peers.names.is_empty();
            slot::set_policy(&self.config.prefix, &slot.name, policy, at, internal).await?;
            self.pins.forget(&slot.name);
            slot.policy = policy.clone();
            self.resolver.register(
                slot.addrs.host_side,
                &slot.name,
                policy.name_rules(),
                policy.denies_everything(),
            );
            if policy.names.is_none() {
                self.proxy.register(&slot.name, None)?;
            }
        }
        self.set_internet_access(slot, !policy.denies_everything())
            .await
    }

    async fn set_internet_access(&self, slot: &mut Slot, allow: bool) -> Result<()> {
        if slot.internet == allow {
            return Ok(());
        }
        if allow {
            self.set_egress(&slot.name, true).await?;
            slot.internet = true;
        } else {
            // Pessimistic first (see `Slot::internet`); an nft failure means nothing changed.
            slot.internet = false;
            if let Err(e) = self.set_egress(&slot.name, false).await {
                slot.internet = true;
                return Err(e);
            }
        }
        Ok(())
    }

    /// Changes the slot's membership of the host's no-egress set, and the pool's record of
    /// it that a restored host table is built from.
    async fn set_egress(&self, name: &str, allow: bool) -> Result<()> {
        let _table = self.table_lock.lock().await;
        let result = slot::set_egress(&self.config, name, allow).await;
        let mut state = self.lock();
        if allow == result.is_ok() {
            state.no_egress.remove(name);
        } else {
            state.no_egress.insert(name.to_owned());
        }
        result
    }

    fn allocate(&self, for_refill: bool) -> Result<(String, SlotAddrs)> {
        let mut state = self.lock();
        let index = match state.free.pop_first() {
            Some(i) => i,
            None if state.next < self.max_slots => {
                state.next += 1;
                state.next - 1
            }
            None => {
                return Err(Error::Exhausted {
                    max: self.max_slots,
                })
            }
        };
        let addrs = SlotAddrs::for_index(self.config.host_cidr, index).ok_or_else(|| {
            Error::InvalidConfig(format!("slot {index} is outside {}", self.config.host_cidr))
        })?;
        state.allocated.insert(index);
        if for_refill {
            state.refilling += 1;
        }
        Ok((self.config.slot_name(index), addrs))
    }

    fn free_index(&self, index: u32) {
        let mut state = self.lock();
        state.allocated.remove(&index);
        state.free.insert(index);
    }

    /// Builds a new slot (not yet ready nor leased).
    async fn create_one(&self, for_refill: bool) -> Result<(String, SlotAddrs)> {
        let (name, addrs) = self.allocate(for_refill)?;
        let result = slot::create(
            &self.config,
            &name,
            &addrs,
            &self.filter,
            self.forward_per_link,
        )
        .await;
        if for_refill {
            self.lock().refilling -= 1;
        }
        match result {
            Ok(()) => Ok((name, addrs)),
            Err(e) => {
                if host::link_exists(&name) || netns_path(&name).exists() {
                    self.lock().broken += 1;
                } else {
                    self.free_index(addrs.index);
                }
                Err(e)
            }
        }
    }

    async fn refill(&self) -> Result<()> {
        let _serial = self.refill_lock.lock().await;
        loop {
            {
                let state = self.lock();
                if state.shutting_down || state.ready.len() >= self.config.pool_size {
                    return Ok(());
                }
            }
            let slot = self.create_one(true).await?;
            self.lock().ready.push_back(slot);
        }
    }

    /// Resets a returned slot and puts it back into the pool, or destroys it when the pool
    /// is full or the reset failed.
    async fn recycle(&self, name: String, addrs: SlotAddrs, internet: bool) -> Result<()> {
        self.resolver.forget(addrs.host_side);
        self.flows.set_owner(&name, None);
        if let Some(reader) = self.readers().remove(&name) {
            reader.abort();
        }
        // No link pair of the last tenant's networks survives it (the fresh filter table
        // below holds no peers either).
        if let Err(e) = self.drop_peer_links(&name).await {
            self.discard(&name, addrs.index, !internet).await;
            return Err(e);
        }
        // Cannot fail without name rules.
        let _ = self.proxy.register(&name, None);
        self.pins.forget(&name);
        // A fresh filter table, not only an open policy: nothing the last tenant left in it
        // (its connections in `ct count`, counters, pins) carries over to the next one.
        let open = SlotPolicy::open();
        if let Err(e) = slot::install_filter(&name, &addrs, &self.filter, &open).await {
            self.discard(&name, addrs.index, !internet).await;
            return Err(e);
        }
        if !internet {
            if let Err(e) = self.set_egress(&name, true).await {
                // Still listed as "no egress": removal must take the element out first.
                self.discard(&name, addrs.index, true).await;
                return Err(e);
            }
        }
        if self.flush_conntrack {
            // Best effort: a failure leaves only stale, soon-expiring entries behind.
            if let Err(e) = slot::flush_conntrack(&name, &addrs).await {
                tracing::warn!(slot = %name, error = %e, "could not flush conntrack entries");
            }
        }
        let keep = {
            let mut state = self.lock();
            let keep = !state.shutting_down && state.ready.len() < self.config.pool_size;
            if keep {
                state.ready.push_back((name.clone(), addrs));
            }
            keep
        };
        if keep {
            return Ok(());
        }
        if let Err(e) = slot::destroy(&self.config, &name, false).await {
            self.lock().broken += 1;
            return Err(e);
        }
        self.free_index(addrs.index);
        Ok(())
    }

    /// Removes a slot that must not be used again; on failure it stays allocated (broken)
    /// so its index and name are never reused while its remains exist.
    async fn discard(&self, name: &str, index: u32, in_no_egress_set: bool) {
        if in_no_egress_set {
            if let Err(e) = self.set_egress(name, true).await {
                tracing::warn!(slot = name, error = %e, "could not remove a slot");
                self.lock().broken += 1;
                return;
            }
        }
        match slot::destroy(&self.config, name, false).await {
            Ok(()) => self.free_index(index),
            Err(e) => {
                tracing::warn!(slot = name, error = %e, "could not remove a slot");
                self.lock().broken += 1;
            }
        }
    }
}

/// The background task: recycles slots that were dropped without `release` and keeps the
/// pool at its target size.
async fn background(inner: Arc<Inner>, mut returns: UnboundedReceiver<Returned>) {
    loop {
        tokio::select! {
            returned = returns.recv() => {
                let Some(r) = returned else { return };
                if r.discard {
                    inner.discard(&r.name, r.addrs.index, false).await;
                } else if let Err(e) =
                    inner.recycle(r.name.clone(), r.addrs, r.internet).await
                {
                    tracing::warn!(slot = %r.name, error = %e, "could not recycle a dropped slot");
                }
            }
            () = inner.wake.notified() => {}
        }
        match inner.refill().await {
            Ok(()) => {}
            // Every allowed slot is leased; the next release wakes us again.
            Err(Error::Exhausted { max }) => {
                tracing::debug!(max, "pool not refilled: all slots are in use");
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not refill the network slot pool");
                tokio::time::sleep(REFILL_BACKOFF).await;
                // Try again even without a new acquire.
                inner.wake.notify_one();
            }
        }
    }
}

/// Runs `work` as its own task and waits for it. If the caller is cancelled meanwhile, the
/// work still completes, so the pool's bookkeeping never stops halfway (and a slot it
/// produces for nobody is dropped, which returns it to the pool).
async fn run_detached<T: Send + 'static>(
    work: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    match tokio::spawn(work).await {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(Error::RuntimeShutdown),
    }
}

/// Checks the host table every `every_ms` for the life of the pool.
async fn table_watchdog(inner: Arc<Inner>, every_ms: u64) {
    watchdog::run(every_ms, || inner.check_host_table()).await
}

//! One network slot: what a sandbox gets, and the commands that build and remove it.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;

use crate::addr::{SlotAddrs, AGENT_PORT, SANDBOX_ADDR, SANDBOX_GATEWAY, SANDBOX_IFACE};
use crate::cmd::{Invocation, CONNTRACK, IP, NFT};
use crate::config::NetConfig;
use crate::error::{Error, Result};
use crate::netns::netns_path;
use crate::policy::{self, ResolverAt, SlotPolicy};
use crate::rules::SlotFilter;
use crate::{host, rules};

/// A network slot leased from a [`crate::NetPool`].
///
/// Give it back with [`crate::NetPool::release`]. A slot that is dropped instead is handed
/// to the pool's background task, which resets and recycles it the same way, so an error
/// path that forgets to release does not leak the slot.
#[derive(Debug)]
pub struct Slot {
    pub(crate) name: String,
    pub(crate) addrs: SlotAddrs,
    pub(crate) pool_id: u64,
    /// `false` means "may be in the no-egress set": it is cleared *before* an nft call that
    /// turns egress off and set only *after* one that turns it on, so an interrupted call
    /// errs on the side of a (idempotent) reset at release.
    pub(crate) internet: bool,
    /// The policy in the slot's filter table, as far as known.
    pub(crate) policy: SlotPolicy,
    /// Its private-network peers, as far as known (see [`crate::NetPool::set_peers`]).
    pub(crate) peers: warren_runtime::peers::Peering,
    pub(crate) resolv_conf: Arc<str>,
    /// Set while leased; taken by `release` so that `Drop` does nothing afterwards.
    pub(crate) returner: Option<UnboundedSender<Returned>>,
}

/// A slot on its way back to the pool without an explicit `release`.
#[derive(Debug)]
pub(crate) struct Returned {
    pub name: String,
    pub addrs: SlotAddrs,
    pub internet: bool,
    /// Remove instead of recycling (its namespace vanished).
    pub discard: bool,
}

impl Slot {
    /// The slot's name: that of its network namespace and of its host-side link.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Path to enter the slot's network namespace (`setns`, `nsenter --net=`, or
    /// `ip netns exec <name>`).
    pub fn netns_path(&self) -> PathBuf {
        netns_path(&self.name)
    }

    /// Position of the slot in the pool's address range.
    pub fn index(&self) -> u32 {
        self.addrs.index
    }

    /// The unique address at which the host reaches the sandbox (e.g. `10.11.0.2`); the slot
    /// translates it to [`SANDBOX_ADDR`].
    pub fn host_side_addr(&self) -> Ipv4Addr {
        self.addrs.host_side
    }

    /// The host's end of the veth pair: connections from the host to the sandbox come from
    /// this address.
    pub fn host_veth_addr(&self) -> Ipv4Addr {
        self.addrs.host_veth
    }

    /// Addresses of this slot on the host.
    pub fn addrs(&self) -> SlotAddrs {
        self.addrs
    }

    /// The sandbox's address inside the slot: the same for every slot.
    pub fn sandbox_addr(&self) -> Ipv4Addr {
        SANDBOX_ADDR
    }

    /// The sandbox's default gateway inside the slot: the same for every slot.
    pub fn sandbox_gateway(&self) -> Ipv4Addr {
        SANDBOX_GATEWAY
    }

    /// The sandbox's interface inside the slot.
    pub fn sandbox_iface(&self) -> &'static str {
        SANDBOX_IFACE
    }

    /// Where the host reaches the guest agent: `host_side_addr():49983`.
    pub fn agent_endpoint(&self) -> std::net::SocketAddrV4 {
        std::net::SocketAddrV4::new(self.addrs.host_side, AGENT_PORT)
    }

    /// Whether anything may leave the slot (`false`: its policy denies everything, and the
    /// host's no-egress set holds it too).
    pub fn internet_access(&self) -> bool {
        self.internet
    }

    /// The sandbox's egress policy (see [`crate::NetPool::set_policy`]).
    pub fn policy(&self) -> &SlotPolicy {
        &self.policy
    }

    /// The content of the sandbox's /etc/resolv.conf; the runtime writes it.
    pub fn resolv_conf(&self) -> &str {
        &self.resolv_conf
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(tx) = self.returner.take() {
            // A closed channel means the pool is gone; its cleanup owns the slot then.
            let _ = tx.send(Returned {
                name: std::mem::take(&mut self.name),
                addrs: self.addrs,
                internet: self.internet,
                discard: false,
            });
        }
    }
}

/// Builds slot `addrs` named `name`: 3 processes (host `ip -batch`, then the slot's
/// `ip -batch` and `nft -f` concurrently). On failure removes whatever was created.
pub(crate) async fn create(
    config: &NetConfig,
    name: &str,
    addrs: &SlotAddrs,
    filter: &SlotFilter,
    forward_per_link: bool,
) -> Result<()> {
    let result = create_inner(config, name, addrs, filter, forward_per_link).await;
    if let Err(e) = &result {
        tracing::warn!(slot = name, error = %e, "slot creation failed; removing the remains");
        if let Err(cleanup) = destroy(config, name, false).await {
            tracing::warn!(slot = name, error = %cleanup, "could not remove a half-built slot");
        }
    }
    result
}

async fn create_inner(
    config: &NetConfig,
    name: &str,
    addrs: &SlotAddrs,
    filter: &SlotFilter,
    forward_per_link: bool,
) -> Result<()> {
    Invocation::new(IP)
        .args(["-batch", "-"])
        .stdin(rules::host_create_batch(name, addrs))
        .run()
        .await?;
    if forward_per_link {
        host::enable_link_forwarding(name)?;
    }
    let ns = netns_path(name);
    let links = Invocation::new(IP)
        .args(["-batch", "-"])
        .stdin(rules::slot_create_batch())
        .in_netns(&ns)
        .run();
    let nat = Invocation::new(NFT)
        .args(["-f", "-"])
        .stdin(format!(
            "{}{}",
            rules::slot_ruleset(&config.prefix, addrs),
            rules::slot_filter_ruleset(filter, addrs, &SlotPolicy::open())
        ))
        .in_netns(&ns)
        .run();
    let (links, nat) = tokio::join!(links, nat);
    links?;
    nat?;
    Ok(())
}

/// (Re)installs the slot's filter table in one atomic replace: for adopted slots, which may
/// have been built before the table existed or with another configuration.
pub(crate) async fn install_filter(
    name: &str,
    addrs: &SlotAddrs,
    filter: &SlotFilter,
    policy: &SlotPolicy,
) -> Result<()> {
    let ns = netns_path(name);
    // The resolver's pins outlive the reinstall (with the time they have left): the
    // sandbox's connections to the names it resolved keep working across a server restart.
    let pins = match policy.name_rules() {
        Some(_) => Invocation::new(NFT)
            .args(["-j", "list", "set", "inet", &filter.table, "pinned"])
            .in_netns(&ns)
            .run()
            .await
            .map(|json| policy::parse_pins(&json))
            // No such set yet (a slot from an older release): nothing to keep.
            .unwrap_or_default(),
        None => Vec::new(),
    };
    let keep = if pins.is_empty() {
        String::new()
    } else {
        policy::pins(&filter.table, &pins)
    };
    Invocation::new(NFT)
        .args(["-f", "-"])
        .stdin(format!(
            "{}{}{keep}",
            rules::slot_filter_ruleset(filter, addrs, policy),
            // Peers are not part of an install: the control plane sets them again.
            policy::dns_redirect(&filter.table, policy, filter.resolver_at(addrs), false)
        ))
        .in_netns(&ns)
        .run()
        .await
        .map(drop)
}

/// Replaces the policy in the slot's filter table: one atomic nft transaction in the slot.
pub(crate) async fn set_policy(
    table: &str,
    name: &str,
    policy: &SlotPolicy,
    resolver: Option<ResolverAt>,
    internal_names: bool,
) -> Result<()> {
    Invocation::new(NFT)
        .args(["-f", "-"])
        .stdin(policy::update(table, policy, resolver, internal_names))
        .in_netns(&netns_path(name))
        .run()
        .await
        .map(drop)
}

/// Replaces the slot's peers in its filter table (one transaction) and, when whether it has
/// private-network names changes, its DNS redirect with them.
pub(crate) async fn set_peers(
    table: &str,
    name: &str,
    peering: &warren_runtime::peers::Peering,
    dns: Option<(&SlotPolicy, Option<ResolverAt>)>,
) -> Result<()> {
    let mut text = crate::peers::update(table, peering);
    if let Some((policy, resolver)) = dns {
        text.push_str(&policy::dns_redirect(
            table,
            policy,
            resolver,
            !peering.names.is_empty(),
        ));
    }
    Invocation::new(NFT)
        .args(["-f", "-"])
        .stdin(text)
        .in_netns(&netns_path(name))
        .run()
        .await
        .map(drop)
}

/// Changes the host table's set of link pairs that may talk (private networks).
pub(crate) async fn set_peer_links(
    config: &NetConfig,
    add: &[(String, String)],
    remove: &[(String, String)],
) -> Result<()> {
    if add.is_empty() && remove.is_empty() {
        return Ok(());
    }
    Invocation::new(NFT)
        .args(["-f", "-"])
        .stdin(crate::peers::host_update(&config.prefix, add, remove))
        .run()
        .await
        .map(drop)
}

/// Adds or removes the slot from the host's no-egress set: one small, idempotent nft
/// transaction.
pub(crate) async fn set_egress(config: &NetConfig, name: &str, allow: bool) -> Result<()> {
    Invocation::new(NFT)
        .args(["-f", "-"])
        .stdin(rules::egress_update(&config.prefix, name, allow))
        .run()
        .await
        .map(drop)
}

/// Forgets the conntrack entries of the slot's previous tenant: the host's (those the
/// sandbox originated), so that late replies to its connections are dropped instead of
/// delivered to the next one, and the whole table inside the slot, so that connections a
/// killed VM never closed do not count against the next tenant's `ct count` limit.
pub(crate) async fn flush_conntrack(name: &str, addrs: &SlotAddrs) -> Result<()> {
    let host = Invocation::new(CONNTRACK)
        .args(["-D", "-s", &addrs.host_side.to_string()])
        // conntrack-tools 1.4.7 exits 1 when nothing matched.
        .ok_codes(&[1])
        .run();
    let ns = netns_path(name);
    let in_slot = Invocation::new(CONNTRACK).args(["-F"]).in_netns(&ns).run();
    let (host, in_slot) = tokio::join!(host, in_slot);
    host?;
    in_slot.map(drop)
}

/// Removes the slot. With `in_no_egress_set` its element in the host's no-egress set is
/// removed first, so that a future slot of the same name does not inherit "internet off".
pub(crate) async fn destroy(config: &NetConfig, name: &str, in_no_egress_set: bool) -> Result<()> {
    if in_no_egress_set {
        set_egress(config, name, true).await?;
    }
    let result = Invocation::new(IP)
        .args(["-force", "-batch", "-"])
        .stdin(rules::destroy_batch(&[name], &[name]))
        .run()
        .await;
    if host::link_exists(name) || Path::new(&netns_path(name)).exists() {
        let err = result.err().map(|e| format!(" ({e})")).unwrap_or_default();
        return Err(Error::Leftover {
            what: format!("slot {name}{err}"),
        });
    }
    Ok(())
}

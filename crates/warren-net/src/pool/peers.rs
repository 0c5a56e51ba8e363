//! Private networks on the pool: a leased slot's peers, in its filter table, in the host
//! table's link pairs and in the resolver (see [`crate::peers`]).

use std::collections::BTreeSet;

use warren_runtime::peers::Peering;

use super::{Inner, NetPool};
use crate::addr::SlotAddrs;
use crate::error::Result;
use crate::slot::{self, Slot};

impl NetPool {
    /// Replaces the private-network peers of a leased slot: from now on its sandbox reaches
    /// exactly these peers at their addresses (open connections to others are cut) and its
    /// DNS answers `peering.names`. A peer whose host address is no slot of this pool is
    /// ignored (it cannot be reached). One `nft` call in the slot and one on the host.
    pub async fn set_peers(&self, slot: &mut Slot, peering: &Peering) -> Result<()> {
        self.check_owner(slot)?;
        self.inner.set_peers(slot, peering).await
    }
}

impl Inner {
    async fn set_peers(&self, slot: &mut Slot, peering: &Peering) -> Result<()> {
        let pool = self.config.host_cidr;
        let mut reachable = peering.clone();
        reachable.peers.retain(|p| {
            let ok = SlotAddrs::of_host_side(pool, p.host).is_some() && p.host != slot.addrs.host_side;
            if !ok {
                tracing::warn!(slot = %slot.name, peer = %p.host, "a peer outside the pool is ignored");
            }
            ok
        });
        // The DNS redirect changes only when whether the slot has names does.
        let dns = (reachable.names.is_empty() != slot.peers.names.is_empty())
            .then(|| (&slot.policy, self.filter.resolver_at(&slot.addrs)));
        slot::set_peers(&self.config.prefix, &slot.name, &reachable, dns).await?;
        slot.peers = reachable;
        self.resolver
            .register_internal(slot.addrs.host_side, &slot.name, &slot.peers.names);
        let links: BTreeSet<(String, String)> = slot
            .peers
            .peers
            .iter()
            .filter_map(|p| SlotAddrs::of_host_side(pool, p.host))
            .map(|a| self.config.slot_name(a.index))
            .flat_map(|other| {
                [
                    (slot.name.clone(), other.clone()),
                    (other, slot.name.clone()),
                ]
            })
            .collect();
        self.set_links_of(&slot.name, links).await
    }

    /// Removes every link pair with slot `name` in it from the host table, whoever's peers
    /// put it there: the slot is released, and its next tenant must inherit no path to its
    /// last tenant's networks (the other members' slots get their new peers from the
    /// control plane; until then their pairs to this link are simply gone).
    pub(super) async fn drop_peer_links(&self, name: &str) -> Result<()> {
        let _table = self.table_lock.lock().await;
        let remove: Vec<(String, String)> = {
            let state = self.lock();
            state
                .peer_links
                .values()
                .flatten()
                .filter(|(a, b)| a == name || b == name)
                .cloned()
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect()
        };
        slot::set_peer_links(&self.config, &[], &remove).await?;
        let mut state = self.lock();
        state.peer_links.remove(name);
        for links in state.peer_links.values_mut() {
            links.retain(|(a, b)| a != name && b != name);
        }
        state.peer_links.retain(|_, l| !l.is_empty());
        Ok(())
    }

    /// Makes `links` the host table's pairs on behalf of slot `name`. A pair another slot
    /// also asked for (its peer, asking for the same pair the other way round) stays.
    async fn set_links_of(&self, name: &str, links: BTreeSet<(String, String)>) -> Result<()> {
        let _table = self.table_lock.lock().await;
        let (add, remove) = {
            let state = self.lock();
            let others: BTreeSet<&(String, String)> = state
                .peer_links
                .iter()
                .filter(|(owner, _)| owner.as_str() != name)
                .flat_map(|(_, l)| l.iter())
                .collect();
            let mine = state.peer_links.get(name).cloned().unwrap_or_default();
            let add: Vec<_> = links
                .iter()
                .filter(|l| !mine.contains(*l) && !others.contains(l))
                .cloned()
                .collect();
            let remove: Vec<_> = mine
                .iter()
                .filter(|l| !links.contains(*l) && !others.contains(l))
                .cloned()
                .collect();
            (add, remove)
        };
        slot::set_peer_links(&self.config, &add, &remove).await?;
        let mut state = self.lock();
        if links.is_empty() {
            state.peer_links.remove(name);
        } else {
            state.peer_links.insert(name.to_owned(), links);
        }
        Ok(())
    }
}

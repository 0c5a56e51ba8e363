//! Private networks between sandboxes (Warren's own; no E2B-compatible platform has them).
//!
//! A network belongs to a team and has a /24 of its own (from [`Config::network_range`]);
//! each member gets an address in it that stays the same while it pauses, resumes and moves
//! between network slots, and names `<sandboxID>.<network>.internal` and, if it joined with
//! one, `<alias>.<network>.internal`. Members reach each other at those addresses (on every
//! port, or on the network's `ports` only); nobody else reaches them.
//!
//! Sandboxes join at create (a Warren create field, or the metadata key [`METADATA_KEY`] for
//! the unmodified E2B SDKs), later through the API, and a fork joins its parent's networks
//! with new addresses. Memberships are in the store and in memory; the runtime gets each
//! member's [`Peering`] whenever a member starts running somewhere or stops
//! ([`Networks::refresh_peers`]), and again after a server restart.
//!
//! [`Config::network_range`]: crate::Config

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex as StdMutex};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;
use warren_runtime::peers::{Peer, Peering};
use warren_runtime::{RuntimeError, SandboxRuntime};

use crate::error::{sandbox_not_found, ControlError};
use crate::locks::lock;
use crate::model::SandboxState;
use crate::random::random_id;
use crate::store::NetworkStore;

/// The metadata key through which an unmodified E2B SDK asks for networks at create:
/// `"backend"`, `"backend:db,frontend"` (network, optionally `:alias`, comma-separated).
pub const METADATA_KEY: &str = "warren.networks";
/// Networks one sandbox may be in.
pub const MAX_NETWORKS_PER_SANDBOX: usize = 8;
/// Ports a network's port policy may list.
pub const MAX_PORTS: usize = 64;

/// A private network.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrivateNetwork {
    pub id: String,
    /// A DNS label, unique in its team: the middle of its members' names.
    pub name: String,
    pub team: String,
    /// Its members' addresses (`.2` to `.254`).
    pub cidr: Ipv4Net,
    /// TCP and UDP ports members reach each other on; empty: every port.
    #[serde(default)]
    pub ports: Vec<u16>,
    pub created_at: DateTime<Utc>,
}

/// One sandbox in one network.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub network_id: String,
    pub sandbox_id: String,
    pub address: Ipv4Addr,
    #[serde(default)]
    pub alias: Option<String>,
    pub joined_at: DateTime<Utc>,
}

impl Member {
    /// The names that resolve to this member inside its network.
    pub fn names(&self, network: &str) -> Vec<String> {
        let mut names = vec![format!("{}.{network}.internal", self.sandbox_id)];
        if let Some(a) = &self.alias {
            names.push(format!("{a}.{network}.internal"));
        }
        names
    }
}

/// A request to be in a network (by id or name), under an optional alias.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Join {
    pub network: String,
    pub alias: Option<String>,
}

/// A network with its members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkView {
    pub network: PrivateNetwork,
    pub members: Vec<Member>,
}

/// Every network and membership, as recorded (the store is written first).
#[derive(Default)]
pub(crate) struct NetworkState {
    networks: BTreeMap<String, PrivateNetwork>,
    /// By network id, then sandbox id.
    members: BTreeMap<String, BTreeMap<String, Member>>,
}

impl NetworkState {
    fn of_sandbox(&self, id: &str) -> BTreeSet<String> {
        self.members
            .iter()
            .filter(|(_, m)| m.contains_key(id))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The network `r` (an id, or a name in `team`, or in any team for an admin when only
    /// one team has it) as a key of `team_filter` may see it.
    fn find(&self, team_filter: Option<&str>, r: &str) -> Option<&PrivateNetwork> {
        let visible = |n: &&PrivateNetwork| team_filter.is_none_or(|t| n.team == t);
        if let Some(n) = self.networks.get(r).filter(visible) {
            return Some(n);
        }
        let mut named = self
            .networks
            .values()
            .filter(visible)
            .filter(|n| n.name == r);
        let first = named.next()?;
        named.next().is_none().then_some(first)
    }

    fn view(&self, n: &PrivateNetwork) -> NetworkView {
        NetworkView {
            network: n.clone(),
            members: self
                .members
                .get(&n.id)
                .map(|m| m.values().cloned().collect())
                .unwrap_or_default(),
        }
    }

    /// What sandbox `id` reaches and resolves, given where running sandboxes are now.
    fn peering(&self, id: &str, host_of: &dyn Fn(&str) -> Option<Ipv4Addr>) -> Peering {
        let mut out = Peering::default();
        for net_id in self.of_sandbox(id) {
            let (Some(net), Some(members)) =
                (self.networks.get(&net_id), self.members.get(&net_id))
            else {
                continue;
            };
            for m in members.values() {
                for name in m.names(&net.name) {
                    out.names.insert(name, m.address);
                }
                if m.sandbox_id == id {
                    continue;
                }
                if let Some(host) = host_of(&m.sandbox_id) {
                    out.peers.push(Peer {
                        address: m.address,
                        host,
                        ports: net.ports.clone(),
                    });
                }
            }
        }
        out
    }

    /// The lowest /24 of `range` no network has.
    fn free_cidr(&self, range: Ipv4Net) -> Option<Ipv4Net> {
        let used: BTreeSet<Ipv4Net> = self.networks.values().map(|n| n.cidr).collect();
        range.subnets(24).ok()?.find(|c| !used.contains(c))
    }

    /// The lowest free member address of network `n`.
    fn free_address(&self, n: &PrivateNetwork) -> Option<Ipv4Addr> {
        let used: BTreeSet<Ipv4Addr> = self
            .members
            .get(&n.id)
            .map(|m| m.values().map(|m| m.address).collect())
            .unwrap_or_default();
        n.cidr
            .hosts()
            .skip(1) // .1 is left for a gateway-like role later.
            .find(|a| !used.contains(a))
    }
}

/// A DNS label: lowercase letters, digits and inner hyphens, at most 63 characters.
pub fn valid_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && !s.starts_with('-')
        && !s.ends_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The joins a create's metadata asks for under [`METADATA_KEY`].
pub fn joins_from_metadata(metadata: &BTreeMap<String, String>) -> Result<Vec<Join>, ControlError> {
    let Some(value) = metadata.get(METADATA_KEY) else {
        return Ok(Vec::new());
    };
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|item| {
            let (network, alias) = match item.split_once(':') {
                Some((n, a)) => (n.trim(), Some(a.trim().to_string())),
                None => (item, None),
            };
            if network.is_empty() {
                return Err(ControlError::InvalidArgument(format!(
                    "metadata {METADATA_KEY}: {item:?} names no network (network or network:alias)"
                )));
            }
            Ok(Join {
                network: network.to_string(),
                alias,
            })
        })
        .collect()
}

fn network_not_found(r: &str) -> ControlError {
    ControlError::NotFound(format!("network {r} not found"))
}

/// What networks need to know of sandboxes: the sandboxes' side, which networks do not
/// depend on.
#[async_trait]
pub(crate) trait SandboxLookup: Send + Sync {
    /// Where running sandbox `id` is reached (`None`: it is not running).
    fn address(&self, id: &str) -> Option<Ipv4Addr>;
    /// Sandbox `id`'s team and state (not found: an error).
    async fn team_and_state(&self, id: &str) -> Result<(String, SandboxState), ControlError>;
}

/// Private networks and their members: records, the state in memory, and the peers every
/// running member's slot is given. Depends on no other service; sandboxes are looked up
/// through [`SandboxLookup`].
pub(crate) struct Networks {
    store: Arc<dyn NetworkStore>,
    runtime: Arc<dyn SandboxRuntime>,
    /// Where networks' /24s come from.
    range: Ipv4Net,
    /// Networks and their members, as recorded.
    state: StdMutex<NetworkState>,
    /// Serialises changes of networks and the application of peers to runtimes.
    peering: Mutex<()>,
}

impl Networks {
    pub(crate) fn new(
        store: Arc<dyn NetworkStore>,
        runtime: Arc<dyn SandboxRuntime>,
        range: Ipv4Net,
    ) -> Self {
        Self {
            store,
            runtime,
            range,
            state: StdMutex::default(),
            peering: Mutex::new(()),
        }
    }

    /// Loads the recorded networks and memberships (at start, before recovery routes the
    /// sandboxes that are still running).
    pub(crate) async fn load(&self) -> Result<(), ControlError> {
        let networks = self.store.networks().await?;
        let members = self.store.members().await?;
        let mut st = lock(&self.state);
        for n in networks {
            st.networks.insert(n.id.clone(), n);
        }
        for m in members {
            st.members
                .entry(m.network_id.clone())
                .or_default()
                .insert(m.sandbox_id.clone(), m);
        }
        Ok(())
    }

    /// Puts the current peers on every running member of `networks` and of `also` (whose
    /// memberships just changed): one at a time, under the peering lock, each computed from
    /// the state at that moment, so the last one applied is always the latest.
    pub(crate) async fn refresh_peers(
        &self,
        sandboxes: &dyn SandboxLookup,
        networks: BTreeSet<String>,
        also: Vec<String>,
    ) {
        let _g = self.peering.lock().await;
        self.refresh_peers_locked(sandboxes, networks, also).await;
    }

    async fn refresh_peers_locked(
        &self,
        sandboxes: &dyn SandboxLookup,
        networks: BTreeSet<String>,
        also: Vec<String>,
    ) {
        let affected: BTreeSet<String> = {
            let st = lock(&self.state);
            networks
                .iter()
                .filter_map(|n| st.members.get(n))
                .flat_map(|m| m.keys().cloned())
                .chain(also)
                .collect()
        };
        for id in affected {
            if sandboxes.address(&id).is_none() {
                continue;
            }
            let peering = {
                let st = lock(&self.state);
                st.peering(&id, &|m| sandboxes.address(m))
            };
            match self.runtime.set_peers(&id, &peering).await {
                Ok(()) => {}
                // Stopped or paused meanwhile: its next start applies the peers again.
                Err(RuntimeError::NotFound(_) | RuntimeError::Conflict(_)) => {}
                Err(e) => tracing::warn!(sandbox_id = %id, error = %warren_runtime::chain(&e),
                    "could not update the sandbox's private networks"),
            }
        }
    }

    /// A sandbox started running somewhere or stopped: its networks' members learn it (in
    /// the background; callers that must see it done call [`Networks::refresh_peers`]).
    pub(crate) fn peers_moved(self: &Arc<Self>, sandboxes: Arc<dyn SandboxLookup>, id: &str) {
        let networks = lock(&self.state).of_sandbox(id);
        if networks.is_empty() {
            return;
        }
        let me = self.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            me.refresh_peers(sandboxes.as_ref(), networks, vec![id])
                .await
        });
    }

    /// After a restart: memberships of sandboxes that did not come back are forgotten, and
    /// every running member gets its peers (slots come back without them).
    pub(crate) async fn restore(&self, sandboxes: &dyn SandboxLookup) {
        let members: BTreeSet<String> = lock(&self.state)
            .members
            .values()
            .flat_map(|m| m.keys().cloned())
            .collect();
        for id in members {
            let live = matches!(
                sandboxes.team_and_state(&id).await,
                Ok((_, SandboxState::Running | SandboxState::Paused))
            );
            if !live {
                self.leave_all(sandboxes, &id).await;
            }
        }
        let all = lock(&self.state).members.keys().cloned().collect();
        self.refresh_peers(sandboxes, all, Vec::new()).await;
    }

    /// Waits until sandbox `id`'s networks know where it runs now (after a resume).
    pub(crate) async fn refresh_peers_of(&self, sandboxes: &dyn SandboxLookup, id: &str) {
        let networks = lock(&self.state).of_sandbox(id);
        if !networks.is_empty() {
            self.refresh_peers(sandboxes, networks, vec![id.to_string()])
                .await;
        }
    }

    /// Creates a network for `team`.
    pub(crate) async fn create(
        &self,
        team: &str,
        name: &str,
        ports: Vec<u16>,
    ) -> Result<PrivateNetwork, ControlError> {
        let name = name.trim().to_string();
        if !valid_label(&name) {
            return Err(ControlError::InvalidArgument(format!(
                "network name {name:?} must be a DNS label: lowercase letters, digits and \
                 hyphens, at most 63 characters"
            )));
        }
        let mut ports = ports;
        ports.sort_unstable();
        ports.dedup();
        if ports.contains(&0) || ports.len() > MAX_PORTS {
            return Err(ControlError::InvalidArgument(format!(
                "ports must be 1 to 65535, at most {MAX_PORTS} of them"
            )));
        }
        if !self.runtime.capabilities().private_networks {
            return Err(ControlError::InvalidArgument(format!(
                "the {} runtime has no private networks",
                self.runtime.name()
            )));
        }
        let _g = self.peering.lock().await;
        let network = {
            let st = lock(&self.state);
            if st
                .networks
                .values()
                .any(|n| n.team == team && n.name == name)
            {
                return Err(ControlError::FailedPrecondition(format!(
                    "network {name} already exists"
                )));
            }
            let cidr = st.free_cidr(self.range).ok_or_else(|| {
                ControlError::FailedPrecondition(format!(
                    "every /24 of {} holds a network: delete one first",
                    self.range
                ))
            })?;
            PrivateNetwork {
                id: random_id("net_", 16)?,
                name,
                team: team.to_string(),
                cidr,
                ports,
                created_at: Utc::now(),
            }
        };
        self.store.put_network(&network).await?;
        lock(&self.state)
            .networks
            .insert(network.id.clone(), network.clone());
        tracing::info!(network = %network.name, id = %network.id, cidr = %network.cidr, "network created");
        Ok(network)
    }

    /// The networks `team_filter` sees (all for `None`), by name.
    pub(crate) fn list(&self, team_filter: Option<&str>) -> Vec<NetworkView> {
        let st = lock(&self.state);
        let mut out: Vec<NetworkView> = st
            .networks
            .values()
            .filter(|n| team_filter.is_none_or(|t| n.team == t))
            .map(|n| st.view(n))
            .collect();
        out.sort_by(|a, b| a.network.name.cmp(&b.network.name));
        out
    }

    /// One network, by id or name.
    pub(crate) fn get(
        &self,
        team_filter: Option<&str>,
        r: &str,
    ) -> Result<NetworkView, ControlError> {
        let st = lock(&self.state);
        let n = st
            .find(team_filter, r)
            .ok_or_else(|| network_not_found(r))?;
        Ok(st.view(n))
    }

    /// Deletes a network that has no members (409 otherwise: they leave first).
    pub(crate) async fn delete(
        &self,
        team_filter: Option<&str>,
        r: &str,
    ) -> Result<(), ControlError> {
        let _g = self.peering.lock().await;
        let id = {
            let st = lock(&self.state);
            let n = st
                .find(team_filter, r)
                .ok_or_else(|| network_not_found(r))?;
            let members = st.members.get(&n.id).map_or(0, BTreeMap::len);
            if members > 0 {
                return Err(ControlError::FailedPrecondition(format!(
                    "network {} has {members} member(s): remove them first",
                    n.name
                )));
            }
            n.id.clone()
        };
        self.store.delete_network(&id).await?;
        let mut st = lock(&self.state);
        st.networks.remove(&id);
        st.members.remove(&id);
        Ok(())
    }

    /// Puts sandbox `sandbox_id` (of `team`) into network `r` and waits until every running
    /// member's slot knows it.
    pub(crate) async fn join(
        &self,
        sandboxes: &dyn SandboxLookup,
        team_filter: Option<&str>,
        r: &str,
        sandbox_id: &str,
        alias: Option<String>,
    ) -> Result<Member, ControlError> {
        let (team, state) = sandboxes.team_and_state(sandbox_id).await?;
        if team_filter.is_some_and(|t| team != t) {
            return Err(sandbox_not_found(sandbox_id));
        }
        if !matches!(state, SandboxState::Running | SandboxState::Paused) {
            return Err(ControlError::FailedPrecondition(format!(
                "sandbox {sandbox_id} is {}",
                state.as_str()
            )));
        }
        let _g = self.peering.lock().await;
        let member = {
            let st = lock(&self.state);
            let n = st
                .find(team_filter, r)
                .ok_or_else(|| network_not_found(r))?;
            if n.team != team {
                return Err(ControlError::InvalidArgument(format!(
                    "network {} belongs to another team than sandbox {sandbox_id}",
                    n.name
                )));
            }
            let members = st.members.get(&n.id);
            if let Some(existing) = members.and_then(|m| m.get(sandbox_id)) {
                if existing.alias == alias {
                    return Ok(existing.clone());
                }
                return Err(ControlError::FailedPrecondition(format!(
                    "sandbox {sandbox_id} is already in network {} (leave it to change its alias)",
                    n.name
                )));
            }
            if let Some(a) = &alias {
                if !valid_label(a) {
                    return Err(ControlError::InvalidArgument(format!(
                        "alias {a:?} must be a DNS label: lowercase letters, digits and hyphens"
                    )));
                }
                let taken = members.is_some_and(|m| {
                    m.values()
                        .any(|o| o.alias.as_deref() == Some(a.as_str()) || o.sandbox_id == *a)
                });
                if taken {
                    return Err(ControlError::FailedPrecondition(format!(
                        "alias {a} is taken in network {}",
                        n.name
                    )));
                }
            }
            if st.of_sandbox(sandbox_id).len() >= MAX_NETWORKS_PER_SANDBOX {
                return Err(ControlError::FailedPrecondition(format!(
                    "sandbox {sandbox_id} is in {MAX_NETWORKS_PER_SANDBOX} networks already"
                )));
            }
            let address = st.free_address(n).ok_or_else(|| {
                ControlError::FailedPrecondition(format!("network {} is full", n.name))
            })?;
            Member {
                network_id: n.id.clone(),
                sandbox_id: sandbox_id.to_string(),
                address,
                alias,
                joined_at: Utc::now(),
            }
        };
        self.store.put_member(&member).await?;
        lock(&self.state)
            .members
            .entry(member.network_id.clone())
            .or_default()
            .insert(sandbox_id.to_string(), member.clone());
        self.refresh_peers_locked(
            sandboxes,
            BTreeSet::from([member.network_id.clone()]),
            Vec::new(),
        )
        .await;
        tracing::info!(sandbox_id, network = %member.network_id, address = %member.address, "joined a network");
        Ok(member)
    }

    /// Takes sandbox `sandbox_id` out of network `r`; its open connections to members end.
    pub(crate) async fn leave(
        &self,
        sandboxes: &dyn SandboxLookup,
        team_filter: Option<&str>,
        r: &str,
        sandbox_id: &str,
    ) -> Result<(), ControlError> {
        let _g = self.peering.lock().await;
        let id = {
            let st = lock(&self.state);
            let n = st
                .find(team_filter, r)
                .ok_or_else(|| network_not_found(r))?;
            if !st
                .members
                .get(&n.id)
                .is_some_and(|m| m.contains_key(sandbox_id))
            {
                return Err(ControlError::NotFound(format!(
                    "sandbox {sandbox_id} is not in network {}",
                    n.name
                )));
            }
            n.id.clone()
        };
        self.store.delete_member(&id, sandbox_id).await?;
        if let Some(m) = lock(&self.state).members.get_mut(&id) {
            m.remove(sandbox_id);
        }
        self.refresh_peers_locked(
            sandboxes,
            BTreeSet::from([id]),
            vec![sandbox_id.to_string()],
        )
        .await;
        Ok(())
    }

    /// Checks, before a create, that every join names a network of `team` (so a bad name
    /// fails the create before anything starts).
    pub(crate) fn check_joins(&self, team: &str, joins: &[Join]) -> Result<(), ControlError> {
        if joins.len() > MAX_NETWORKS_PER_SANDBOX {
            return Err(ControlError::InvalidArgument(format!(
                "a sandbox may be in at most {MAX_NETWORKS_PER_SANDBOX} networks"
            )));
        }
        let st = lock(&self.state);
        for j in joins {
            if st.find(Some(team), &j.network).is_none() {
                return Err(network_not_found(&j.network));
            }
            if let Some(a) = &j.alias {
                if !valid_label(a) {
                    return Err(ControlError::InvalidArgument(format!(
                        "alias {a:?} must be a DNS label: lowercase letters, digits and hyphens"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Forgets every membership of a sandbox that is gone (killed, failed).
    pub(crate) async fn leave_all(&self, sandboxes: &dyn SandboxLookup, sandbox_id: &str) {
        let _g = self.peering.lock().await;
        let networks = lock(&self.state).of_sandbox(sandbox_id);
        for n in &networks {
            if let Err(e) = self.store.delete_member(n, sandbox_id).await {
                tracing::warn!(sandbox_id, network = %n, error = %warren_runtime::chain(&e), "could not forget a membership");
                continue;
            }
            if let Some(m) = lock(&self.state).members.get_mut(n) {
                m.remove(sandbox_id);
            }
        }
        if !networks.is_empty() {
            self.refresh_peers_locked(sandboxes, networks, Vec::new())
                .await;
        }
    }

    /// The networks (and aliases) of `parent`, for a fork's child: same networks, new
    /// addresses, no alias (an alias names one sandbox).
    pub(crate) fn joins_of(&self, parent: &str) -> Vec<Join> {
        let st = lock(&self.state);
        st.of_sandbox(parent)
            .into_iter()
            .map(|n| Join {
                network: n,
                alias: None,
            })
            .collect()
    }

    /// Joins a sandbox just created (team `team`) to `joins`.
    pub(crate) async fn join_all(
        &self,
        sandboxes: &dyn SandboxLookup,
        team: &str,
        sandbox_id: &str,
        joins: &[Join],
    ) -> Result<(), ControlError> {
        for j in joins {
            self.join(
                sandboxes,
                Some(team),
                &j.network,
                sandbox_id,
                j.alias.clone(),
            )
            .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;

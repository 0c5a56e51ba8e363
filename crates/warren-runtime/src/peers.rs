//! A sandbox's private-network peers: the other sandboxes it may reach directly, each at an
//! address that stays the same while the peer pauses, resumes and moves between network
//! slots, and the names (`<id>.<network>.internal`, aliases) that resolve to those addresses.
//!
//! The control plane computes them from network membership; a runtime hands them to the
//! host's network layer (`warren-net`), which translates each stable address to where the
//! peer is now and lets nothing else through.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

/// The suffix of every private-network name.
pub const INTERNAL_SUFFIX: &str = "internal";

/// One peer, as this sandbox reaches it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peer {
    /// The peer's address in the network: what this sandbox connects to, and what it sees
    /// as the source of the peer's connections.
    pub address: Ipv4Addr,
    /// Where the peer is now: its agent's host address (its slot's host-side address).
    pub host: Ipv4Addr,
    /// Ports (TCP and UDP) the two may reach each other on; empty: every port.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
}

/// Everything a sandbox's slot needs to know about its private networks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peering {
    pub peers: Vec<Peer>,
    /// Fully qualified names under `.internal` and the addresses they resolve to, for this
    /// sandbox's queries only (its own names included).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub names: BTreeMap<String, Ipv4Addr>,
}

impl Peering {
    /// No networks: nothing to reach, no names.
    pub fn is_empty(&self) -> bool {
        self.peers.is_empty() && self.names.is_empty()
    }
}

/// Whether `name` (lower case, no trailing dot) is a private-network name: it is answered
/// from the sandbox's own table and never sent to any DNS server.
pub fn is_internal_name(name: &str) -> bool {
    name == INTERNAL_SUFFIX || name.ends_with(".internal")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_names() {
        assert!(is_internal_name("abc.backend.internal"));
        assert!(is_internal_name("internal"));
        assert!(!is_internal_name("internal.example.com"));
        assert!(!is_internal_name("myinternal"));
    }

    #[test]
    fn serializes_small() {
        let p = Peering {
            peers: vec![Peer {
                address: Ipv4Addr::new(10, 200, 0, 2),
                host: Ipv4Addr::new(10, 11, 0, 6),
                ports: vec![],
            }],
            names: BTreeMap::new(),
        };
        assert_eq!(
            serde_json::to_string(&p).unwrap(),
            r#"{"peers":[{"address":"10.200.0.2","host":"10.11.0.6"}]}"#
        );
        assert!(Peering::default().is_empty());
    }
}

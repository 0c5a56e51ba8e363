//! Private networks between slots: what the in-slot filter and the host table hold for a
//! slot whose sandbox has peers ([`warren_runtime::peers::Peering`]).
//!
//! A peer has a stable address in the network (say `10.200.0.3`) and lives at its slot's
//! host-side address now (say `10.11.0.6`). Inside the sandbox's slot:
//!
//! - **out**: a connection to the stable address is translated to the host-side one before
//!   it leaves the slot (`peer_dnat`, NAT output for a namespace sandbox, prerouting from the
//!   tap for a VM), and the slot's usual SNAT makes it come from this slot's host-side
//!   address. The host forwards it only between the two slot links (`peer_links`).
//! - **in**: the peer's slot does the same in reverse; there a new connection is accepted only
//!   from the host-side address of a peer (`peer_any`, or `peer_ports` for a network with a
//!   port policy), and its source is translated to the sender's stable address (`peer_snat`,
//!   NAT input, or postrouting to the tap for a VM), so each side sees the other at the
//!   address its names resolve to.
//! - A connection the sandbox opens to another slot's address that is not a peer (any more)
//!   is dropped, established or not: leaving a network cuts what was open.
//!
//! Each side's slot checks its own peers, and the host checks the pair of links: three
//! layers that must all agree.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::net::Ipv4Addr;

use warren_runtime::peers::Peering;

use crate::addr::{SANDBOX_IFACE, TAP_IFACE};

/// Slot filter sets and maps; the host table's set of (from, to) link pairs.
pub(crate) const PEER_ANY: &str = "peer_any";
pub(crate) const PEER_PORTS: &str = "peer_ports";
const PEER_DNAT: &str = "peer_dnat";
const PEER_SNAT: &str = "peer_snat";
pub(crate) const PEER_LINKS: &str = "peer_links";

/// The sets and maps, empty, for the slot filter table's definition (before its chains).
pub(crate) fn sets() -> String {
    format!(
        "\tset {PEER_ANY} {{
\t\ttype ipv4_addr
\t}}
\tset {PEER_PORTS} {{
\t\ttype ipv4_addr . inet_proto . inet_service
\t}}
\tmap {PEER_DNAT} {{
\t\ttype ipv4_addr : ipv4_addr
\t}}
\tmap {PEER_SNAT} {{
\t\ttype ipv4_addr : ipv4_addr
\t}}
"
    )
}

/// The NAT chains that translate between peers' stable and host-side addresses. A lookup
/// that misses leaves the packet alone. Priority -150 runs before the egress proxy's
/// redirect (-100), so a peer's connection is never taken for internet traffic.
pub(crate) fn chains() -> String {
    format!(
        "\tchain peer_dst_out {{
\t\ttype nat hook output priority -150; policy accept;
\t\toifname \"{SANDBOX_IFACE}\" dnat ip to ip daddr map @{PEER_DNAT}
\t}}
\tchain peer_dst_pre {{
\t\ttype nat hook prerouting priority -150; policy accept;
\t\tiifname \"{TAP_IFACE}\" dnat ip to ip daddr map @{PEER_DNAT}
\t}}
\tchain peer_src_in {{
\t\ttype nat hook input priority 100; policy accept;
\t\tiifname \"{SANDBOX_IFACE}\" snat ip to ip saddr map @{PEER_SNAT}
\t}}
\tchain peer_src_post {{
\t\ttype nat hook postrouting priority 99; policy accept;
\t\toifname \"{TAP_IFACE}\" snat ip to ip saddr map @{PEER_SNAT}
\t}}
"
    )
}

/// The slot filter's `ingress` rules that admit new connections from peers (before the
/// rule that admits them only from the host).
pub(crate) fn ingress_rules() -> String {
    format!(
        "\t\tiifname \"{SANDBOX_IFACE}\" ct state new ip saddr @{PEER_ANY} accept
\t\tiifname \"{SANDBOX_IFACE}\" ct state new ip saddr . meta l4proto . th dport @{PEER_PORTS} accept
"
    )
}

/// The slot filter's `egress` rules for the sandbox's own connections to peers, and the
/// drop of its connections to any other slot (`pool`, but not `own_veth`, where the pool's
/// resolver listens).
pub(crate) fn egress_rules(pool: impl std::fmt::Display, own_veth: Ipv4Addr) -> String {
    format!(
        "\t\tct direction original ip daddr @{PEER_ANY} accept
\t\tct direction original ip daddr . meta l4proto . th dport @{PEER_PORTS} accept
\t\tct direction original ip daddr {pool} ip daddr != {own_veth} counter drop
"
    )
}

/// `nft -f` input, run inside the slot, that replaces its peers in one transaction.
pub(crate) fn update(table: &str, peering: &Peering) -> String {
    let mut s = String::new();
    for set in [PEER_ANY, PEER_PORTS] {
        let _ = writeln!(s, "flush set inet {table} {set}");
    }
    for map in [PEER_DNAT, PEER_SNAT] {
        let _ = writeln!(s, "flush map inet {table} {map}");
    }
    let mut any = Vec::new();
    let mut ports = Vec::new();
    let mut dnat = BTreeMap::new();
    let mut snat = BTreeMap::new();
    for p in &peering.peers {
        if p.ports.is_empty() {
            any.push(p.host.to_string());
        } else {
            for port in &p.ports {
                for proto in ["tcp", "udp"] {
                    ports.push(format!("{} . {proto} . {port}", p.host));
                }
            }
        }
        dnat.insert(p.address, p.host);
        // A peer met in two networks shows up from its first address.
        snat.entry(p.host).or_insert(p.address);
    }
    let mut add = |set: &str, items: Vec<String>| {
        if !items.is_empty() {
            let _ = writeln!(
                s,
                "add element inet {table} {set} {{ {} }}",
                items.join(", ")
            );
        }
    };
    any.sort();
    any.dedup();
    ports.sort();
    ports.dedup();
    add(PEER_ANY, any);
    add(PEER_PORTS, ports);
    add(
        PEER_DNAT,
        dnat.iter().map(|(a, h)| format!("{a} : {h}")).collect(),
    );
    add(
        PEER_SNAT,
        snat.iter().map(|(h, a)| format!("{h} : {a}")).collect(),
    );
    s
}

/// `nft -f` input for the host table: link pairs `add`ed to and `remove`d from `peer_links`
/// (each pair is listed in both directions by the caller). Only pairs the set holds may be
/// removed (the pool keeps the record).
pub(crate) fn host_update(
    table: &str,
    add: &[(String, String)],
    remove: &[(String, String)],
) -> String {
    let pairs = |list: &[(String, String)]| {
        list.iter()
            .map(|(a, b)| format!("\"{a}\" . \"{b}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut s = String::new();
    if !remove.is_empty() {
        let _ = writeln!(
            s,
            "delete element inet {table} {PEER_LINKS} {{ {} }}",
            pairs(remove)
        );
    }
    if !add.is_empty() {
        let _ = writeln!(
            s,
            "add element inet {table} {PEER_LINKS} {{ {} }}",
            pairs(add)
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_runtime::peers::Peer;

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    #[test]
    fn update_fills_sets_and_maps_in_one_batch() {
        let peering = Peering {
            peers: vec![
                Peer {
                    address: ip("10.200.0.3"),
                    host: ip("10.11.0.6"),
                    ports: vec![],
                },
                Peer {
                    address: ip("10.200.1.2"),
                    host: ip("10.11.0.10"),
                    ports: vec![5432],
                },
                // The first peer again, met in a second network.
                Peer {
                    address: ip("10.200.2.9"),
                    host: ip("10.11.0.6"),
                    ports: vec![],
                },
            ],
            names: BTreeMap::new(),
        };
        let text = update("w", &peering);
        assert!(text.starts_with(
            "flush set inet w peer_any\nflush set inet w peer_ports\n\
             flush map inet w peer_dnat\nflush map inet w peer_snat\n"
        ));
        assert!(
            text.contains("add element inet w peer_any { 10.11.0.6 }\n"),
            "{text}"
        );
        assert!(text.contains(
            "add element inet w peer_ports { 10.11.0.10 . tcp . 5432, 10.11.0.10 . udp . 5432 }\n"
        ));
        assert!(text.contains(
            "add element inet w peer_dnat { 10.200.0.3 : 10.11.0.6, 10.200.1.2 : 10.11.0.10, 10.200.2.9 : 10.11.0.6 }\n"
        ), "{text}");
        assert!(text.contains(
            "add element inet w peer_snat { 10.11.0.6 : 10.200.0.3, 10.11.0.10 : 10.200.1.2 }\n"
        ), "{text}");
        let none = update("w", &Peering::default());
        assert!(!none.contains("add element"), "{none}");
    }

    #[test]
    fn host_update_removes_before_it_adds() {
        let a = ("w-1".to_string(), "w-2".to_string());
        let b = ("w-2".to_string(), "w-1".to_string());
        assert_eq!(
            host_update("w", std::slice::from_ref(&a), std::slice::from_ref(&b)),
            "delete element inet w peer_links { \"w-2\" . \"w-1\" }\n\
             add element inet w peer_links { \"w-1\" . \"w-2\" }\n"
        );
        assert_eq!(host_update("w", &[], &[]), "");
    }

    #[test]
    fn rules_reference_the_sets() {
        let e = egress_rules("10.11.0.0/16", ip("10.11.0.5"));
        assert!(e.contains("ip daddr 10.11.0.0/16 ip daddr != 10.11.0.5 counter drop"));
        assert!(ingress_rules().contains("ct state new ip saddr @peer_any accept"));
        assert!(chains().contains("dnat ip to ip daddr map @peer_dnat"));
        for line in format!("{}{}", sets(), chains()).lines() {
            let t = line.trim();
            assert!(!t.ends_with('}') || t == "}" || t.contains('{'), "{line}");
        }
    }
}

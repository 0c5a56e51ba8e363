//! The text fed to `ip -batch -` and `nft -f -`. Pure functions, unit-tested without root.
//!
//! nftables 1.0.6 (Debian bookworm) needs a newline before every closing brace, so the
//! rulesets are written one statement per line.

use std::fmt::Write;
use std::net::Ipv4Addr;

use crate::addr::{
    Ipv4Cidr, SlotAddrs, GATEWAY_MAC, SANDBOX_ADDR, SANDBOX_GATEWAY, SANDBOX_IFACE, SANDBOX_MAC,
    SANDBOX_PREFIX_LEN,
};

/// Set of host links (slot names) whose sandbox has internet access off.
pub(crate) const NO_EGRESS_SET: &str = "no_egress";

/// Inputs of the host-wide table.
pub(crate) struct HostRules<'a> {
    /// Table name (= prefix) and glob of slot links (`<prefix>-*`).
    pub table: &'a str,
    pub link_glob: &'a str,
    pub pool: Ipv4Cidr,
    pub blocked: &'a [Ipv4Cidr],
    pub dns_servers: &'a [Ipv4Addr],
    /// Slot links that start in the no-egress set: adopted slots whose sandbox has internet
    /// access off. Part of the ruleset, so replacing the table never lets them out.
    pub no_egress: &'a [String],
}

/// The host-wide table `inet <prefix>`: isolation, egress policy and masquerade for every
/// slot of the pool. It only matches slot links and the pool's addresses, so it neither
/// depends on nor disturbs other rulesets on the host.
///
/// The leading `table`/`delete table` pair makes loading it an atomic replace.
pub(crate) fn host_ruleset(r: &HostRules<'_>) -> String {
    let HostRules {
        table,
        link_glob,
        pool,
        ..
    } = r;
    let mut s = String::new();
    // `write!` into a String cannot fail.
    let _ = writeln!(s, "table inet {table}\ndelete table inet {table}");
    let _ = writeln!(s, "table inet {table} {{");
    s.push_str(&format!(
        "\t# Slot links whose sandbox has internet access off.
\tset {NO_EGRESS_SET} {{
\t\ttype ifname
{no_egress}\t}}
\t# Hook for private networks: (from, to) slot link pairs whose sandboxes may talk.
\tset peer_links {{
\t\ttype ifname . ifname
\t}}
\tset dns_servers {{
\t\ttype ipv4_addr
{dns}\t}}
\tset blocked {{
\t\ttype ipv4_addr
\t\tflags interval
\t\tauto-merge
{blocked}\t}}
",
        no_egress = elements(r.no_egress.iter().map(|n| format!("\"{n}\""))),
        dns = elements(r.dns_servers.iter()),
        blocked = elements(r.blocked.iter()),
    ));
    let _ = write!(
        s,
        "\t# A sandbox reaches nothing on the host itself: only replies to connections the host
\t# opened (the agent port) and the configured DNS servers if they live on the host.
\tchain input {{
\t\ttype filter hook input priority filter; policy accept;
\t\tiifname \"{link_glob}\" jump slot_to_host
\t}}
\tchain slot_to_host {{
\t\tct state established,related accept
\t\tiifname != @{NO_EGRESS_SET} ip daddr @dns_servers meta l4proto {{ tcp, udp }} th dport 53 accept
\t\tcounter drop
\t}}
\tchain forward {{
\t\ttype filter hook forward priority filter; policy accept;
\t\tiifname \"{link_glob}\" jump slot_egress
\t\toifname \"{link_glob}\" jump slot_ingress
\t}}
\tchain slot_egress {{
\t\t# Strict reverse-path check: a slot only sends from its own host-side address.
\t\tfib saddr . iif oif missing counter drop
\t\tmeta nfproto ipv6 counter drop
\t\tiifname . oifname @peer_links accept
\t\toifname \"{link_glob}\" counter drop
\t\t# Before any conntrack accept, so that turning egress off also cuts open connections.
\t\t# Egress policy rejects (fails fast: `pip install` errors instead of hanging), while
\t\t# isolation violations above and below are silently dropped.
\t\tiifname @{NO_EGRESS_SET} counter reject with icmpx type admin-prohibited
\t\tip daddr @dns_servers meta l4proto {{ tcp, udp }} th dport 53 accept
\t\tip daddr @blocked counter reject with icmpx type admin-prohibited
\t\taccept
\t}}
\tchain slot_ingress {{
\t\tiifname . oifname @peer_links accept
\t\toifname @{NO_EGRESS_SET} counter drop
\t\tct state established,related accept
\t\tcounter drop
\t}}
\tchain postrouting {{
\t\ttype nat hook postrouting priority srcnat; policy accept;
\t\tip saddr {pool} oifname != \"{link_glob}\" masquerade
\t}}
}}
"
    );
    s
}

fn elements<T: std::fmt::Display>(items: impl Iterator<Item = T>) -> String {
    let list: Vec<String> = items.map(|i| i.to_string()).collect();
    if list.is_empty() {
        String::new()
    } else {
        format!("\t\telements = {{ {} }}\n", list.join(", "))
    }
}

/// The slot's own table (inside its netns): maps the unique host-side address to the fixed
/// sandbox address and back. Only traffic on eth0 is translated, so a tap device added later
/// for a microVM works unchanged (the guest is then the one holding [`SANDBOX_ADDR`]).
pub(crate) fn slot_ruleset(table: &str, a: &SlotAddrs) -> String {
    let host_side = a.host_side;
    format!(
        "table ip {table} {{
\tchain prerouting {{
\t\ttype nat hook prerouting priority dstnat; policy accept;
\t\tiifname \"{SANDBOX_IFACE}\" ip daddr {host_side} dnat to {SANDBOX_ADDR}
\t}}
\tchain postrouting {{
\t\ttype nat hook postrouting priority srcnat; policy accept;
\t\toifname \"{SANDBOX_IFACE}\" ip saddr {SANDBOX_ADDR} snat to {host_side}
\t}}
}}
"
    )
}

/// Host-side half of slot creation: the namespace, the veth pair (slot end created directly
/// inside the namespace) and the host end's address and static neighbour entry.
///
/// Fixed MACs plus permanent neighbour entries on both ends mean no ARP is ever needed
/// between host and slot, and nothing on the host has to own the gateway address.
pub(crate) fn host_create_batch(name: &str, a: &SlotAddrs) -> String {
    format!(
        "netns add {name}
link add name {name} address {GATEWAY_MAC} type veth peer name {SANDBOX_IFACE} address {SANDBOX_MAC} netns {name}
link set dev {name} addrgenmode none
address add {hv}/30 dev {name}
link set dev {name} up
neigh replace {hs} lladdr {SANDBOX_MAC} dev {name} nud permanent
",
        hv = a.host_veth,
        hs = a.host_side,
    )
}

/// Slot-side half of slot creation, run inside the namespace. `addrgenmode none` keeps IPv6
/// link-local addresses off both ends: slots are IPv4-only.
pub(crate) fn slot_create_batch() -> String {
    format!(
        "link set dev lo up
link set dev {SANDBOX_IFACE} addrgenmode none
address add {SANDBOX_ADDR}/{SANDBOX_PREFIX_LEN} dev {SANDBOX_IFACE}
link set dev {SANDBOX_IFACE} up
neigh replace {SANDBOX_GATEWAY} lladdr {GATEWAY_MAC} dev {SANDBOX_IFACE} nud permanent
route add default via {SANDBOX_GATEWAY} dev {SANDBOX_IFACE}
"
    )
}

/// Removes a slot. The link goes first because deleting it is synchronous, while the kernel
/// dismantles a deleted namespace (and the veth inside it) asynchronously: this way the name
/// is free for reuse as soon as the batch returns.
pub(crate) fn destroy_batch(links: &[&str], namespaces: &[&str]) -> String {
    let mut s = String::new();
    for l in links {
        let _ = writeln!(s, "link del dev {l}");
    }
    for n in namespaces {
        let _ = writeln!(s, "netns del {n}");
    }
    s
}

/// `nft -f` input that adds or removes one slot from the no-egress set. Both directions are
/// idempotent (`add` tolerates an existing element; removal adds before deleting, in one
/// transaction), so a retry after an interrupted call is always safe.
pub(crate) fn egress_update(table: &str, name: &str, allow: bool) -> String {
    let add = format!("add element inet {table} {NO_EGRESS_SET} {{ \"{name}\" }}\n");
    if allow {
        format!("{add}delete element inet {table} {NO_EGRESS_SET} {{ \"{name}\" }}\n")
    } else {
        add
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs() -> SlotAddrs {
        SlotAddrs::for_index("10.11.0.0/16".parse().unwrap(), 5).unwrap()
    }

    #[test]
    fn host_ruleset_mentions_everything() {
        let blocked: Vec<Ipv4Cidr> = vec!["10.0.0.0/8".parse().unwrap()];
        let text = host_ruleset(&HostRules {
            table: "warren",
            link_glob: "warren-*",
            pool: "10.11.0.0/16".parse().unwrap(),
            blocked: &blocked,
            dns_servers: &[Ipv4Addr::new(10, 255, 255, 53)],
            no_egress: &["warren-3".into(), "warren-7".into()],
        });
        assert!(text.contains("elements = { \"warren-3\", \"warren-7\" }"));
        assert!(text.starts_with("table inet warren\ndelete table inet warren\n"));
        assert!(text.contains("elements = { 10.255.255.53 }"));
        assert!(text.contains("elements = { 10.0.0.0/8 }"));
        assert!(text.contains("ip saddr 10.11.0.0/16 oifname != \"warren-*\" masquerade"));
        // nft 1.0.6 rejects `... }` on one line: every `}` must start its line.
        for line in text.lines() {
            let t = line.trim();
            assert!(!t.ends_with('}') || t == "}" || t.contains('{'), "{line}");
        }
    }

    #[test]
    fn empty_sets_have_no_elements_line() {
        let text = host_ruleset(&HostRules {
            table: "w",
            link_glob: "w-*",
            pool: "10.11.0.0/16".parse().unwrap(),
            blocked: &[],
            dns_servers: &[],
            no_egress: &[],
        });
        assert!(!text.contains("elements"));
    }

    #[test]
    fn slot_nat_maps_host_side_to_fixed_address() {
        let text = slot_ruleset("warren", &addrs());
        assert!(text.contains("ip daddr 10.11.0.22 dnat to 169.254.0.21"));
        assert!(text.contains("ip saddr 169.254.0.21 snat to 10.11.0.22"));
    }

    #[test]
    fn create_batches() {
        let host = host_create_batch("warren-5", &addrs());
        assert!(host.contains("address add 10.11.0.21/30 dev warren-5"));
        assert!(host.contains("neigh replace 10.11.0.22 lladdr 02:77:72:00:00:15"));
        let slot = slot_create_batch();
        assert!(slot.contains("address add 169.254.0.21/30 dev eth0"));
        assert!(slot.contains("route add default via 169.254.0.22 dev eth0"));
    }

    #[test]
    fn egress_and_destroy() {
        assert_eq!(
            egress_update("warren", "warren-5", false),
            "add element inet warren no_egress { \"warren-5\" }\n"
        );
        assert_eq!(
            egress_update("warren", "warren-5", true),
            "add element inet warren no_egress { \"warren-5\" }\n\
             delete element inet warren no_egress { \"warren-5\" }\n"
        );
        assert_eq!(
            destroy_batch(&["a-1"], &["a-1"]),
            "link del dev a-1\nnetns del a-1\n"
        );
    }
}

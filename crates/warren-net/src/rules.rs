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
use crate::policy::{self, ResolverAt, SlotPolicy, POLICY_CHAIN};

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
    /// The port of the pool's resolver (sandboxes with name rules reach it on their veth's
    /// host end).
    pub resolver_port: Option<u16>,
    /// Link pairs of private networks (both directions), so replacing the table keeps them.
    pub peer_links: &'a [(String, String)],
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
\t# Private networks: (from, to) slot link pairs whose sandboxes may talk.
\tset peer_links {{
\t\ttype ifname . ifname
{peer_links}\t}}
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
        peer_links = elements(
            r.peer_links
                .iter()
                .map(|(a, b)| format!("\"{a}\" . \"{b}\""))
        ),
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
{resolver}\t\tcounter drop
\t}}
\t# Only root (the manager and the proxy) opens connections from the host into slots:
\t# every other local user is kept away from agents and user ports. Replies (e.g. of a
\t# resolver on the host to a sandbox's query) are not new connections and pass.
\tchain output {{
\t\ttype filter hook output priority filter; policy accept;
\t\tip daddr {pool} jump host_to_slot
\t}}
\tchain host_to_slot {{
\t\tmeta skuid 0 accept
\t\tct state established,related accept
\t\tcounter reject with icmpx type admin-prohibited
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
",
        resolver = r
            .resolver_port
            .map(|p| format!("\t\tmeta l4proto {{ tcp, udp }} th dport {p} accept\n"))
            .unwrap_or_default(),
    );
    s
}

pub(crate) fn elements<T: std::fmt::Display>(items: impl Iterator<Item = T>) -> String {
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

/// Inputs of the filter table inside each slot: the second, independent layer of isolation.
#[derive(Clone, Debug)]
pub(crate) struct SlotFilter {
    pub table: String,
    /// Rejected like the host's `@blocked` (egress policy).
    pub blocked: Vec<Ipv4Cidr>,
    /// Silently dropped: the whole slot pool (other slots, the host's veth ends) and the
    /// host's own addresses.
    pub isolated: Vec<Ipv4Cidr>,
    pub dns_servers: Vec<Ipv4Addr>,
    pub max_connections: u32,
    pub new_per_second: Option<u32>,
    /// The port of the pool's resolver, reached at the host end of the slot's veth.
    pub resolver_port: Option<u16>,
    /// The pool's address range: the sandbox reaches other slots only when they are its
    /// private-network peers ([`crate::peers`]).
    pub pool: Ipv4Cidr,
}

impl SlotFilter {
    /// Where slot `a`'s sandbox reaches the pool's resolver.
    pub(crate) fn resolver_at(&self, a: &SlotAddrs) -> Option<ResolverAt> {
        self.resolver_port.map(|port| ResolverAt {
            host_veth: a.host_veth,
            port,
            host_side: a.host_side,
        })
    }
}

/// The filter table `inet <prefix>` inside a slot's netns. It repeats the host table's
/// isolation (no pool, host, special-purpose or metadata addresses; DNS only to the
/// configured servers) where a host-side `nft flush ruleset` cannot reach it and the
/// sandbox, which has no CAP_NET_ADMIN over this netns, cannot change it. It also caps the
/// sandbox's connections. It filters on `eth0` only, for both a namespace sandbox (its own
/// traffic: `output`) and a microVM behind `tap0` (routed by the slot: `forward`).
///
/// New connections into the slot are accepted only from the host end of its veth, so a
/// neighbour that routes to the pool through the host (a LAN peer, a slot with the host
/// table gone) reaches nothing either. The leading `table`/`delete table` pair makes
/// loading it an atomic replace (adoption re-installs it).
pub(crate) fn slot_filter_ruleset(f: &SlotFilter, a: &SlotAddrs, policy: &SlotPolicy) -> String {
    let table = &f.table;
    let host_veth = a.host_veth;
    let mut limits = String::new();
    if f.max_connections > 0 {
        let _ = writeln!(
            limits,
            "\t\tct state new ct count over {} counter reject with icmpx type admin-prohibited",
            f.max_connections
        );
    }
    if let Some(rate) = f.new_per_second {
        let _ = writeln!(
            limits,
            "\t\tct state new limit rate over {rate}/second burst {} packets counter reject \
             with icmpx type admin-prohibited",
            rate.saturating_mul(2)
        );
    }
    format!(
        "table inet {table}
delete table inet {table}
table inet {table} {{
\tset isolated {{
\t\ttype ipv4_addr
\t\tflags interval
\t\tauto-merge
{isolated}\t}}
\tset blocked {{
\t\ttype ipv4_addr
\t\tflags interval
\t\tauto-merge
{blocked}\t}}
\tset dns_servers {{
\t\ttype ipv4_addr
{dns}\t}}
{peer_sets}\tchain ingress {{
\t\ttype filter hook prerouting priority mangle; policy accept;
\t\tiifname \"{SANDBOX_IFACE}\" meta nfproto ipv6 counter drop
{peer_in}\t\tiifname \"{SANDBOX_IFACE}\" ct state new ip saddr != {host_veth} counter drop
\t}}
\tchain output {{
\t\ttype filter hook output priority filter; policy accept;
\t\toifname \"{SANDBOX_IFACE}\" jump egress
\t}}
\tchain forward {{
\t\ttype filter hook forward priority filter; policy accept;
\t\toifname \"{SANDBOX_IFACE}\" jump egress
\t}}
\tchain egress {{
\t\tmeta nfproto ipv6 counter drop
\t\t# Redirected to the egress proxy: the output hook keeps the original route's device.
\t\tip daddr 127.0.0.1 tcp dport {proxy_port} ct status dnat accept
\t\t# Private-network peers (not subject to the policy); no other slot, ever.
{peer_out}\t\t# The sandbox's own policy, for every packet of a connection it opened (not replies
\t\t# to the host's): before the established accept, so a new policy cuts open ones.
\t\tct direction original jump {POLICY_CHAIN}
\t\tct state established,related accept
{limits}\t\tip daddr @dns_servers meta l4proto {{ tcp, udp }} th dport 53 accept
{resolver}\t\tip daddr @isolated ct state new {log_block}
\t\tip daddr @isolated counter drop
\t\tip daddr @blocked ct state new {log_block}
\t\tip daddr @blocked counter reject with icmpx type admin-prohibited
\t\t# Reaching here: allowed by address; the flow log hears of it (not the egress proxy's own).
\t\tct state new meta mark != {mark:#x} {log_allow}
\t}}
{policy}{peer_chains}}}
",
        policy = policy::declarations(policy, f.resolver_at(a)),
        peer_sets = crate::peers::sets(),
        peer_in = crate::peers::ingress_rules(),
        peer_out = crate::peers::egress_rules(f.pool, host_veth),
        peer_chains = crate::peers::chains(),
        proxy_port = crate::proxy::PROXY_PORT,
        mark = crate::proxy::MARK,
        log_block = crate::nflog::log_statement(crate::nflog::BLOCK, crate::nflog::RATE),
        log_allow = crate::nflog::log_statement(crate::nflog::ALLOW, crate::nflog::RATE),
        resolver = f
            .resolver_at(a)
            .map(|r| format!(
                "\t\tip daddr {} meta l4proto {{ tcp, udp }} th dport {} accept\n",
                r.host_veth, r.port
            ))
            .unwrap_or_default(),
        isolated = elements(f.isolated.iter()),
        blocked = elements(f.blocked.iter()),
        dns = elements(f.dns_servers.iter()),
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
            resolver_port: Some(40053),
            peer_links: &[("warren-3".into(), "warren-9".into())],
        });
        // The pool's resolver is the one host port slots reach.
        let to_host = &text[text.find("chain slot_to_host").unwrap()..];
        let resolver = to_host.find("th dport 40053 accept").unwrap();
        assert!(
            resolver < to_host.find("counter drop").unwrap(),
            "{to_host}"
        );
        assert!(text.contains("elements = { \"warren-3\", \"warren-7\" }"));
        assert!(text.contains("elements = { \"warren-3\" . \"warren-9\" }"));
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
    fn host_output_admits_only_root_into_the_pool() {
        let text = host_ruleset(&HostRules {
            table: "w",
            link_glob: "w-*",
            pool: "10.11.0.0/16".parse().unwrap(),
            blocked: &[],
            dns_servers: &[],
            no_egress: &[],
            resolver_port: None,
            peer_links: &[],
        });
        assert!(text.contains("type filter hook output priority filter"));
        assert!(text.contains("ip daddr 10.11.0.0/16 jump host_to_slot"));
        let chain = &text[text.find("chain host_to_slot").unwrap()..];
        let root = chain.find("meta skuid 0 accept").unwrap();
        let reject = chain.find("reject").unwrap();
        assert!(root < reject, "{chain}");
    }

    #[test]
    fn slot_filter_repeats_the_isolation_inside_the_slot() {
        let filter = SlotFilter {
            table: "w".into(),
            blocked: vec!["169.254.0.0/16".parse().unwrap()],
            isolated: vec![
                "10.11.0.0/16".parse().unwrap(),
                "192.0.2.2/32".parse().unwrap(),
            ],
            dns_servers: vec![Ipv4Addr::new(10, 255, 255, 53)],
            max_connections: 4096,
            new_per_second: Some(50),
            resolver_port: Some(40053),
            pool: "10.11.0.0/16".parse().unwrap(),
        };
        let text = slot_filter_ruleset(&filter, &addrs(), &SlotPolicy::open());
        assert!(text.starts_with("table inet w\ndelete table inet w\n"));
        assert!(text.contains("elements = { 10.11.0.0/16, 192.0.2.2/32 }"));
        // New connections only from this slot's host veth end (slot 5: 10.11.0.21).
        assert!(text.contains("iifname \"eth0\" ct state new ip saddr != 10.11.0.21 counter drop"));
        // Peers come in before that rule; out, before the sandbox's policy, and no other slot.
        assert!(
            text.find("ip saddr @peer_any accept").unwrap()
                < text.find("ip saddr != 10.11.0.21 counter drop").unwrap()
        );
        let egress = &text[text.find("chain egress").unwrap()..];
        let peers = egress.find("ip daddr @peer_any accept").unwrap();
        let others = egress
            .find("ip daddr 10.11.0.0/16 ip daddr != 10.11.0.21 counter drop")
            .unwrap();
        assert!(peers < others && others < egress.find("jump sandbox_policy").unwrap());
        assert!(text.find("set peer_any").unwrap() < text.find("chain ingress").unwrap());
        // Both the namespace sandbox's own traffic and a VM's routed traffic.
        assert!(text.contains("type filter hook output priority filter"));
        assert!(text.contains("type filter hook forward priority filter"));
        assert!(text.contains("ct state new ct count over 4096"));
        assert!(text.contains("limit rate over 50/second burst 100 packets"));
        // The resolver at this slot's veth host end, before the pool is isolated.
        let resolver = text
            .find("ip daddr 10.11.0.21 meta l4proto { tcp, udp } th dport 40053 accept")
            .unwrap();
        assert!(resolver < text.find("ip daddr @isolated").unwrap());
        let egress = &text[text.find("chain egress").unwrap()..];
        let dns = egress.find("@dns_servers").unwrap();
        assert!(dns < egress.find("@isolated").unwrap() && dns < egress.find("@blocked").unwrap());
        for line in text.lines() {
            let t = line.trim();
            assert!(!t.ends_with('}') || t == "}" || t.contains('{'), "{line}");
        }
        let unlimited = slot_filter_ruleset(
            &SlotFilter {
                max_connections: 0,
                new_per_second: None,
                ..filter
            },
            &addrs(),
            &SlotPolicy::open(),
        );
        assert!(!unlimited.contains("ct count") && !unlimited.contains("limit rate over"));
        // What the filter decides by address goes to the flow log (NFLOG), rate-limited, the
        // verdict in a rule of its own.
        let egress = &unlimited[unlimited.find("chain egress").unwrap()..];
        let log_block = egress
            .find("ip daddr @blocked ct state new limit rate 50/second")
            .unwrap();
        assert!(log_block < egress.find("ip daddr @blocked counter reject").unwrap());
        assert!(egress.contains("ct state new meta mark != 0x57720001 limit rate 50/second burst 100 packets log prefix \"wr-allow\" group 7"));
        assert!(unlimited.contains("log prefix \"wr-deny\" group 7"));
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
            resolver_port: None,
            peer_links: &[],
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

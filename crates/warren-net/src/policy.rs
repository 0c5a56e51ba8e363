//! A slot's egress policy as address rules: the part of a sandbox's policy that nftables
//! enforces for every protocol, inside the slot's own filter table.
//!
//! The rules sit in the slot's netns, where neither the sandbox (no CAP_NET_ADMIN there) nor
//! a host-side `nft flush ruleset` reaches them, and they stay in the kernel while the server
//! is down. They are checked for every packet the sandbox sends in a connection it opened,
//! before conntrack's "established" accept, so a new policy also cuts open connections it no
//! longer allows. A refused TCP connection gets a reset at once (the client fails instead of
//! hanging); other protocols get ICMP admin-prohibited.

use std::fmt::Write;

use serde::{Deserialize, Serialize};

use crate::addr::Ipv4Cidr;

/// Name of the slot filter's chain that holds the policy (rewritten on every change).
pub(crate) const POLICY_CHAIN: &str = "sandbox_policy";

/// What a slot's sandbox may reach, by address. The operator's blocked ranges (private,
/// loopback, link-local, metadata) are checked after it and win over `allow`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SlotPolicy {
    /// Reachable even where `deny` covers them (allow beats deny).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<Ipv4Cidr>,
    /// Refused unless `allow` covers them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<Ipv4Cidr>,
    /// DNS (port 53) to the slot's configured resolvers stays open even where `deny` covers
    /// them: the policy allows names, which need resolving.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dns: bool,
}

impl SlotPolicy {
    /// No restriction beyond the operator's ranges.
    pub fn open() -> Self {
        Self::default()
    }

    /// Nothing may leave the slot (`allow_internet_access = false`), DNS included.
    pub fn deny_all() -> Self {
        Self {
            deny: vec![
                Ipv4Cidr::new(std::net::Ipv4Addr::UNSPECIFIED, 0).expect("a /0 is a valid prefix")
            ],
            ..Self::default()
        }
    }

    /// Whether the policy restricts nothing.
    pub fn is_open(&self) -> bool {
        self.deny.is_empty()
    }

    /// Whether nothing at all may leave: then the host table's no-egress set holds the slot
    /// too, a second layer outside the slot.
    pub fn denies_everything(&self) -> bool {
        self.allow.is_empty() && !self.dns && self.deny.iter().any(|c| c.prefix_len() == 0)
    }
}

/// The policy's sets and chains, as part of the slot filter table's definition.
pub(crate) fn declarations(policy: &SlotPolicy) -> String {
    format!(
        "\tset allow_net {{
\t\ttype ipv4_addr
\t\tflags interval
\t\tauto-merge
{allow}\t}}
\tset deny_net {{
\t\ttype ipv4_addr
\t\tflags interval
\t\tauto-merge
{deny}\t}}
\tchain {POLICY_CHAIN} {{
{rules}\t}}
\tchain refuse {{
\t\tmeta l4proto tcp counter reject with tcp reset
\t\tcounter reject with icmpx type admin-prohibited
\t}}
",
        allow = crate::rules::elements(policy.allow.iter()),
        deny = crate::rules::elements(policy.deny.iter()),
        rules = policy_rules(policy),
    )
}

/// The policy chain's rules. Sets are referenced, not inlined, so a change rewrites both in
/// one transaction ([`update`]).
fn policy_rules(policy: &SlotPolicy) -> String {
    let mut s = String::from("\t\tip daddr @allow_net return\n");
    if policy.dns {
        s.push_str("\t\tip daddr @dns_servers meta l4proto { tcp, udp } th dport 53 return\n");
    }
    s.push_str("\t\tip daddr @deny_net jump refuse\n");
    s
}

/// `nft -f` input, run inside the slot, that replaces the policy in one atomic transaction:
/// packets see the old policy or the new one, never none.
pub(crate) fn update(table: &str, policy: &SlotPolicy) -> String {
    let mut s = String::new();
    for (set, items) in [("allow_net", &policy.allow), ("deny_net", &policy.deny)] {
        let _ = writeln!(s, "flush set inet {table} {set}");
        if !items.is_empty() {
            let list: Vec<String> = items.iter().map(ToString::to_string).collect();
            let _ = writeln!(
                s,
                "add element inet {table} {set} {{ {} }}",
                list.join(", ")
            );
        }
    }
    let _ = writeln!(s, "flush chain inet {table} {POLICY_CHAIN}");
    for rule in policy_rules(policy).lines() {
        let _ = writeln!(s, "add rule inet {table} {POLICY_CHAIN} {}", rule.trim());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> Ipv4Cidr {
        s.parse().unwrap()
    }

    #[test]
    fn open_deny_all_and_everything() {
        assert!(SlotPolicy::open().is_open());
        assert!(!SlotPolicy::open().denies_everything());
        assert!(SlotPolicy::deny_all().denies_everything());
        let some = SlotPolicy {
            allow: vec![cidr("192.0.2.1/32")],
            ..SlotPolicy::deny_all()
        };
        assert!(!some.denies_everything() && !some.is_open());
        let names = SlotPolicy {
            dns: true,
            ..SlotPolicy::deny_all()
        };
        assert!(!names.denies_everything());
    }

    #[test]
    fn chain_allows_before_it_denies_and_resets_tcp() {
        let p = SlotPolicy {
            allow: vec![cidr("192.0.2.0/28")],
            deny: vec![cidr("0.0.0.0/0")],
            dns: true,
        };
        let text = declarations(&p);
        assert!(text.contains("elements = { 192.0.2.0/28 }"), "{text}");
        assert!(text.contains("elements = { 0.0.0.0/0 }"), "{text}");
        let allow = text.find("@allow_net return").unwrap();
        let dns = text.find("th dport 53 return").unwrap();
        let deny = text.find("@deny_net jump refuse").unwrap();
        assert!(allow < dns && dns < deny, "{text}");
        assert!(text.contains("meta l4proto tcp counter reject with tcp reset"));
        assert!(!declarations(&SlotPolicy::deny_all()).contains("dport 53"));
        for line in text.lines() {
            let t = line.trim();
            assert!(!t.ends_with('}') || t == "}" || t.contains('{'), "{line}");
        }
    }

    #[test]
    fn update_replaces_sets_and_chain_in_one_batch() {
        let text = update("w", &SlotPolicy::deny_all());
        assert_eq!(
            text,
            "flush set inet w allow_net\n\
             flush set inet w deny_net\n\
             add element inet w deny_net { 0.0.0.0/0 }\n\
             flush chain inet w sandbox_policy\n\
             add rule inet w sandbox_policy ip daddr @allow_net return\n\
             add rule inet w sandbox_policy ip daddr @deny_net jump refuse\n"
        );
    }

    #[test]
    fn serializes_small() {
        assert_eq!(serde_json::to_string(&SlotPolicy::open()).unwrap(), "{}");
        let p: SlotPolicy = serde_json::from_str(r#"{"deny":["0.0.0.0/0"]}"#).unwrap();
        assert_eq!(p, SlotPolicy::deny_all());
    }
}

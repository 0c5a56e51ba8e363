//! Adopting the slots of sandboxes that outlived a restart of the server.
//!
//! A server that restarts while its sandboxes keep running knows (from its database) which
//! slots they hold. [`crate::NetPool::start_adopting`] checks each of those slots against
//! what slot creation builds and takes the intact ones over as leased slots; everything else
//! with the prefix is removed as stale.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::addr::{SlotAddrs, GATEWAY_MAC, SANDBOX_ADDR, SANDBOX_IFACE, SANDBOX_MAC};
use crate::cmd::{Invocation, IP, NFT};
use crate::config::NetConfig;
use crate::error::{Error, Result};
use crate::netns::netns_path;
use crate::policy::SlotPolicy;
use crate::slot::Slot;

/// What a server persists for each leased slot, so that a restarted server can take the
/// slot over with [`crate::NetPool::start_adopting`] while its sandbox keeps running.
///
/// The slot's name and addresses follow from `index` and the pool's configuration
/// (`prefix`, `host_cidr`), which must therefore be the same after the restart.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AdoptSlot {
    /// [`Slot::index`].
    pub index: u32,
    /// [`Slot::internet_access`].
    pub allow_internet_access: bool,
    /// [`Slot::policy`]: the adopted slot's filter gets this policy. Records written before
    /// policies existed have none: then `allow_internet_access` decides (open or deny-all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<SlotPolicy>,
}

impl AdoptSlot {
    /// The policy the adopted slot gets.
    pub fn effective_policy(&self) -> SlotPolicy {
        match &self.policy {
            Some(p) => p.clone(),
            None if self.allow_internet_access => SlotPolicy::open(),
            None => SlotPolicy::deny_all(),
        }
    }
}

impl From<&Slot> for AdoptSlot {
    fn from(slot: &Slot) -> Self {
        Self {
            index: slot.index(),
            allow_internet_access: slot.internet_access(),
            policy: (!slot.policy().is_open()).then(|| slot.policy().clone()),
        }
    }
}

/// The host-side objects of every slot, read with three `ip` processes in total.
pub(crate) struct HostView {
    /// `ip -j -d addr show`, by link name.
    links: HashMap<String, Value>,
    /// `ip -j -4 neigh show nud permanent`.
    neighbours: Vec<Value>,
    /// `ip -j netns list`: name -> the id the host namespace gave it (if any).
    netns_ids: HashMap<String, Option<i64>>,
}

impl HostView {
    pub async fn read() -> Result<Self> {
        let links = run_json(&["-j", "-d", "addr", "show"]);
        let neighbours = run_json(&["-j", "-4", "neigh", "show", "nud", "permanent"]);
        let netns = run_json(&["-j", "netns", "list"]);
        let (links, neighbours, netns) = tokio::join!(links, neighbours, netns);
        Ok(Self::parse(links?, neighbours?, netns?))
    }

    fn parse(links: Vec<Value>, neighbours: Vec<Value>, netns: Vec<Value>) -> Self {
        let name = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_owned);
        Self {
            links: links
                .into_iter()
                .filter_map(|l| Some((name(&l, "ifname")?, l)))
                .collect(),
            neighbours,
            netns_ids: netns
                .iter()
                .filter_map(|n| Some((name(n, "name")?, n.get("id").and_then(Value::as_i64))))
                .collect(),
        }
    }

    /// Whether the host side of slot `name` is what [`crate::slot`] builds: the named
    /// netns, and a veth link of the same name that is up, has the gateway MAC and the host
    /// veth address, whose peer lives in that netns, and that has the permanent neighbour
    /// entry for the slot's host-side address. `Err` says what is wrong.
    pub fn check(&self, name: &str, addrs: &SlotAddrs) -> Result<(), String> {
        if !netns_path(name).exists() {
            return Err("its network namespace does not exist".into());
        }
        self.check_listed(name, addrs)
    }

    /// [`HostView::check`] without looking at the file system.
    fn check_listed(&self, name: &str, addrs: &SlotAddrs) -> Result<(), String> {
        if !self.netns_ids.contains_key(name) {
            return Err("its network namespace does not exist".into());
        }
        let Some(link) = self.links.get(name) else {
            return Err("its host link does not exist".into());
        };
        let kind = link
            .get("linkinfo")
            .map(|i| str_of(i, "info_kind"))
            .unwrap_or("");
        if kind != "veth" {
            return Err(format!("its host link is not a veth (kind `{kind}`)"));
        }
        let up = link
            .get("flags")
            .and_then(Value::as_array)
            .is_some_and(|f| f.iter().any(|f| f.as_str() == Some("UP")));
        if !up {
            return Err("its host link is down".into());
        }
        if !str_of(link, "address").eq_ignore_ascii_case(GATEWAY_MAC) {
            return Err(format!(
                "its host link has MAC {}, not {GATEWAY_MAC}",
                str_of(link, "address")
            ));
        }
        let has_addr = link
            .get("addr_info")
            .and_then(Value::as_array)
            .is_some_and(|addrs_info| {
                addrs_info.iter().any(|a| {
                    str_of(a, "family") == "inet"
                        && str_of(a, "local") == addrs.host_veth.to_string()
                        && a.get("prefixlen").and_then(Value::as_u64) == Some(30)
                })
            });
        if !has_addr {
            return Err(format!(
                "its host link lacks the address {}/30",
                addrs.host_veth
            ));
        }
        let peer_ns = link.get("link_netnsid").and_then(Value::as_i64);
        let ns_id = self.netns_ids.get(name).copied().flatten();
        if peer_ns.is_none() || peer_ns != ns_id {
            return Err("the peer of its host link is not in its network namespace".into());
        }
        let host_side = addrs.host_side.to_string();
        let neighbour = self.neighbours.iter().any(|n| {
            str_of(n, "dev") == name
                && str_of(n, "dst") == host_side
                && str_of(n, "lladdr").eq_ignore_ascii_case(SANDBOX_MAC)
        });
        if !neighbour {
            return Err(format!(
                "its host link lacks the permanent neighbour entry for {host_side}"
            ));
        }
        Ok(())
    }
}

/// Whether the slot's own NAT table (inside its netns) holds the DNAT and SNAT rules of
/// [`crate::rules::slot_ruleset`] for `addrs`: one `nft` process. The outer `Err` is a
/// failure to look, the inner one what is wrong with the slot.
pub(crate) async fn check_slot_nat(
    prefix: &str,
    name: &str,
    addrs: &SlotAddrs,
) -> Result<Result<(), String>> {
    let listing = Invocation::new(NFT)
        .args(["-j", "list", "table", "ip", prefix])
        .in_netns(&netns_path(name))
        .run()
        .await;
    match listing {
        Ok(json) => Ok(nat_rules_intact(&json, addrs)),
        // nft fails when the table does not exist ("No such file or directory").
        Err(Error::CommandFailed { stderr, .. }) => Ok(Err(format!(
            "its NAT table `ip {prefix}` cannot be listed: {}",
            stderr.lines().next().unwrap_or("")
        ))),
        Err(e) => Err(e),
    }
}

/// The check of [`check_slot_nat`] on the output of `nft -j list table ip <prefix>`.
pub(crate) fn nat_rules_intact(json: &str, addrs: &SlotAddrs) -> Result<(), String> {
    let doc: Value =
        serde_json::from_str(json).map_err(|e| format!("unreadable nft listing: {e}"))?;
    let items = doc
        .get("nftables")
        .and_then(Value::as_array)
        .ok_or("unreadable nft listing: no `nftables` array")?;
    // Chain name -> hook, for nat base chains only.
    let hooks: HashMap<&str, &str> = items
        .iter()
        .filter_map(|i| i.get("chain"))
        .filter(|c| c.get("type").and_then(Value::as_str) == Some("nat"))
        .filter_map(|c| Some((c.get("name")?.as_str()?, c.get("hook")?.as_str()?)))
        .collect();
    let rules: Vec<(&str, &Vec<Value>)> = items
        .iter()
        .filter_map(|i| i.get("rule"))
        .filter_map(|r| {
            let hook = hooks.get(r.get("chain")?.as_str()?)?;
            Some((*hook, r.get("expr")?.as_array()?))
        })
        .collect();
    let (sandbox, host_side) = (SANDBOX_ADDR.to_string(), addrs.host_side.to_string());
    let has = |hook: &str, iface_key: &str, field: &str, matched: &str, nat: &str, to: &str| {
        rules.iter().any(|(h, expr)| {
            *h == hook
                && expr
                    .iter()
                    .any(|e| is_match(e, "meta", iface_key, SANDBOX_IFACE))
                && expr.iter().any(|e| is_match(e, "payload", field, matched))
                && expr.iter().any(|e| {
                    e.get(nat)
                        .and_then(|n| n.get("addr"))
                        .and_then(Value::as_str)
                        == Some(to)
                })
        })
    };
    if !has(
        "prerouting",
        "iifname",
        "daddr",
        &host_side,
        "dnat",
        &sandbox,
    ) {
        return Err(format!(
            "its NAT table lacks the DNAT {host_side} -> {sandbox}"
        ));
    }
    if !has(
        "postrouting",
        "oifname",
        "saddr",
        &sandbox,
        "snat",
        &host_side,
    ) {
        return Err(format!(
            "its NAT table lacks the SNAT {sandbox} -> {host_side}"
        ));
    }
    Ok(())
}

/// `{"match": {"op": "==", "left": {<kind>: {<key or field>: ...}}, "right": <right>}}`.
fn is_match(expr: &Value, kind: &str, key: &str, right: &str) -> bool {
    let Some(m) = expr.get("match") else {
        return false;
    };
    let left = m.get("left").and_then(|l| l.get(kind));
    let key_ok = match kind {
        "meta" => left.and_then(|l| l.get("key")).and_then(Value::as_str) == Some(key),
        _ => {
            left.and_then(|l| l.get("protocol")).and_then(Value::as_str) == Some("ip")
                && left.and_then(|l| l.get("field")).and_then(Value::as_str) == Some(key)
        }
    };
    key_ok
        && m.get("op").and_then(Value::as_str).unwrap_or("==") == "=="
        && m.get("right").and_then(Value::as_str) == Some(right)
}

/// How many slots' NAT tables are checked at once (one `nft` process each).
const NAT_CHECKS_IN_PARALLEL: usize = 16;

/// Checks every slot of `adopt`; returns, in the same order, its addresses when it is intact
/// and may be adopted, or why not. The outer `Err` is a failure to look at all.
pub(crate) async fn verify(
    config: &NetConfig,
    max_slots: u32,
    adopt: &[AdoptSlot],
) -> Result<Vec<Result<SlotAddrs, String>>> {
    if adopt.is_empty() {
        return Ok(Vec::new());
    }
    let view = HostView::read().await?;
    let mut seen = std::collections::HashSet::new();
    let mut verdicts: Vec<Result<SlotAddrs, String>> = adopt
        .iter()
        .map(|a| {
            if a.index >= max_slots {
                return Err(format!(
                    "index {} is beyond the pool's {max_slots} slots",
                    a.index
                ));
            }
            let addrs = SlotAddrs::for_index(config.host_cidr, a.index)
                .ok_or_else(|| format!("index {} is outside {}", a.index, config.host_cidr))?;
            if !seen.insert(a.index) {
                return Err("it is listed more than once".into());
            }
            view.check(&config.slot_name(a.index), &addrs)?;
            Ok(addrs)
        })
        .collect();

    let candidates: Vec<(usize, SlotAddrs)> = verdicts
        .iter()
        .enumerate()
        .filter_map(|(i, v)| Some((i, *v.as_ref().ok()?)))
        .collect();
    for chunk in candidates.chunks(NAT_CHECKS_IN_PARALLEL) {
        let checks: Vec<_> = chunk
            .iter()
            .map(|(i, addrs)| {
                let (prefix, name, addrs) =
                    (config.prefix.clone(), config.slot_name(addrs.index), *addrs);
                let check =
                    tokio::spawn(async move { check_slot_nat(&prefix, &name, &addrs).await });
                (*i, check)
            })
            .collect();
        for (i, check) in checks {
            let nat = match check.await {
                Ok(nat) => nat?,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => return Err(Error::RuntimeShutdown),
            };
            if let Err(reason) = nat {
                verdicts[i] = Err(reason);
            }
        }
    }
    Ok(verdicts)
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

async fn run_json(args: &[&str]) -> Result<Vec<Value>> {
    let command = format!("ip {}", args.join(" "));
    let out = Invocation::new(IP).args(args.iter().copied()).run().await?;
    // iproute2 prints nothing at all (not `[]`) for some empty listings.
    if out.trim().is_empty() {
        return Ok(Vec::new());
    }
    match serde_json::from_str(&out) {
        Ok(Value::Array(items)) => Ok(items),
        Ok(_) => Err(Error::BadOutput {
            command,
            detail: "expected a JSON array".into(),
        }),
        Err(e) => Err(Error::BadOutput {
            command,
            detail: e.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs() -> SlotAddrs {
        SlotAddrs::for_index("10.11.0.0/16".parse().unwrap(), 5).unwrap()
    }

    /// `nft -j list table ip warren` of a slot built by this crate (nftables 1.0.6).
    const NAT_LISTING: &str = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"table": {"family": "ip", "name": "warren", "handle": 1}}, {"chain": {"family": "ip", "table": "warren", "name": "prerouting", "handle": 1, "type": "nat", "hook": "prerouting", "prio": -100, "policy": "accept"}}, {"chain": {"family": "ip", "table": "warren", "name": "postrouting", "handle": 2, "type": "nat", "hook": "postrouting", "prio": 100, "policy": "accept"}}, {"rule": {"family": "ip", "table": "warren", "chain": "prerouting", "handle": 3, "expr": [{"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "eth0"}}, {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "10.11.0.22"}}, {"dnat": {"addr": "169.254.0.21"}}]}}, {"rule": {"family": "ip", "table": "warren", "chain": "postrouting", "handle": 4, "expr": [{"match": {"op": "==", "left": {"meta": {"key": "oifname"}}, "right": "eth0"}}, {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "169.254.0.21"}}, {"snat": {"addr": "10.11.0.22"}}]}}]}"#;

    #[test]
    fn intact_nat_table_passes() {
        assert_eq!(nat_rules_intact(NAT_LISTING, &addrs()), Ok(()));
    }

    #[test]
    fn nat_table_of_another_slot_or_without_rules_fails() {
        let other = SlotAddrs::for_index("10.11.0.0/16".parse().unwrap(), 6).unwrap();
        let err = nat_rules_intact(NAT_LISTING, &other).unwrap_err();
        assert!(err.contains("DNAT 10.11.0.26"), "{err}");
        let snat_only = NAT_LISTING.replace("\"dnat\"", "\"masquerade\"");
        assert!(nat_rules_intact(&snat_only, &addrs())
            .unwrap_err()
            .contains("DNAT"));
        let dnat_only = NAT_LISTING.replace("\"snat\"", "\"masquerade\"");
        assert!(nat_rules_intact(&dnat_only, &addrs())
            .unwrap_err()
            .contains("SNAT"));
        let flushed =
            r#"{"nftables": [{"table": {"family": "ip", "name": "warren", "handle": 1}}]}"#;
        assert!(nat_rules_intact(flushed, &addrs()).is_err());
        assert!(nat_rules_intact("not json", &addrs()).is_err());
    }

    fn host_view(link: &str, neigh: &str, netns: &str) -> HostView {
        let parse = |s: &str| match serde_json::from_str(s).unwrap() {
            Value::Array(a) => a,
            _ => unreachable!(),
        };
        HostView::parse(parse(link), parse(neigh), parse(netns))
    }

    const LINK: &str = r#"[{"ifindex": 1201, "link_index": 2, "ifname": "warren-5", "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"], "address": "02:77:72:00:00:16", "link_netnsid": 3, "linkinfo": {"info_kind": "veth"}, "addr_info": [{"family": "inet", "local": "10.11.0.21", "prefixlen": 30}]}]"#;
    const NEIGH: &str = r#"[{"dst": "10.11.0.22", "dev": "warren-5", "lladdr": "02:77:72:00:00:15", "state": ["PERMANENT"]}]"#;
    const NETNS: &str = r#"[{"name": "warren-5", "id": 3}]"#;

    #[test]
    fn host_view_checks_link_address_peer_and_neighbour() {
        let a = addrs();
        assert_eq!(
            host_view(LINK, NEIGH, NETNS).check_listed("warren-5", &a),
            Ok(())
        );
        let broken = [
            (LINK, NEIGH, "[]", "network namespace"),
            ("[]", NEIGH, NETNS, "host link does not exist"),
            (&LINK.replace("veth", "dummy"), NEIGH, NETNS, "not a veth"),
            (&LINK.replace(r#""UP", "#, ""), NEIGH, NETNS, "down"),
            (&LINK.replace(":16", ":99"), NEIGH, NETNS, "MAC"),
            (
                &LINK.replace("10.11.0.21", "10.11.0.25"),
                NEIGH,
                NETNS,
                "10.11.0.21/30",
            ),
            (
                &LINK.replace(r#""prefixlen": 30"#, r#""prefixlen": 24"#),
                NEIGH,
                NETNS,
                "/30",
            ),
            (LINK, NEIGH, &NETNS.replace("3", "4"), "peer"),
            (
                &LINK.replace(r#""link_netnsid": 3, "#, ""),
                NEIGH,
                NETNS,
                "peer",
            ),
            (LINK, "[]", NETNS, "neighbour"),
            (LINK, &NEIGH.replace(":15", ":99"), NETNS, "neighbour"),
        ];
        for (link, neigh, netns, want) in broken {
            let err = host_view(link, neigh, netns)
                .check_listed("warren-5", &a)
                .unwrap_err();
            assert!(err.contains(want), "{want}: {err}");
        }
        // Another slot's objects do not count.
        let other = SlotAddrs::for_index("10.11.0.0/16".parse().unwrap(), 6).unwrap();
        assert!(host_view(LINK, NEIGH, NETNS)
            .check_listed("warren-5", &other)
            .is_err());
    }

    #[test]
    fn adopt_slot_serializes_as_a_small_record() {
        let a = AdoptSlot {
            index: 7,
            allow_internet_access: false,
            policy: None,
        };
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json, r#"{"index":7,"allow_internet_access":false}"#);
        assert_eq!(serde_json::from_str::<AdoptSlot>(&json).unwrap(), a);
        // A record without a policy (older releases) decides by internet access.
        assert_eq!(a.effective_policy(), SlotPolicy::deny_all());
        let open = AdoptSlot {
            allow_internet_access: true,
            ..a.clone()
        };
        assert!(open.effective_policy().is_open());
        let restricted = AdoptSlot {
            policy: Some(SlotPolicy {
                deny: vec!["192.0.2.0/24".parse().unwrap()],
                ..SlotPolicy::default()
            }),
            ..open
        };
        assert_eq!(
            serde_json::to_string(&restricted).unwrap(),
            r#"{"index":7,"allow_internet_access":true,"policy":{"deny":["192.0.2.0/24"]}}"#
        );
        assert_eq!(restricted.effective_policy().deny.len(), 1);
    }
}

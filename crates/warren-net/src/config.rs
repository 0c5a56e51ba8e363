//! Configuration of a slot pool.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::addr::{slot_capacity, Ipv4Cidr, SANDBOX_ADDR};
use crate::error::{Error, Result};

/// Linux limits interface names to 15 bytes (IFNAMSIZ - 1).
const MAX_IFNAME: usize = 15;
const MAX_PREFIX: usize = 8;

/// Where the DNS servers handed to sandboxes come from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DnsSource {
    /// The host's upstream resolvers: the non-loopback IPv4 nameservers of
    /// `/etc/resolv.conf`, or of systemd-resolved's `/run/systemd/resolve/resolv.conf` when
    /// the host only lists a loopback stub such as 127.0.0.53.
    Host,
    /// Exactly these servers.
    Servers(Vec<Ipv4Addr>),
}

/// Configuration of a [`crate::NetPool`]. Every field has a default suitable for a single
/// Warren server per host.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetConfig {
    /// Names every object this pool creates: network namespaces and host links are
    /// `<prefix>-<index>`, the nftables tables are `<prefix>`. Two pools on one host must use
    /// different prefixes (and address pools). 2-8 characters, `[a-z][a-z0-9]*`.
    pub prefix: String,
    /// Pool of host-side addresses; each slot takes one /30.
    pub host_cidr: Ipv4Cidr,
    /// Number of ready slots kept ahead of demand.
    pub pool_size: usize,
    /// Upper bound of slots in existence (ready + in use); `None` = as many as `host_cidr`
    /// holds (and slot names allow).
    pub max_slots: Option<u32>,
    /// Destinations that sandboxes never reach, even with internet access on. The default
    /// holds private, shared, link-local (cloud metadata!), loopback, multicast and reserved
    /// ranges, and Azure's WireServer 168.63.129.16. The DNS servers handed to sandboxes stay
    /// reachable on port 53 regardless (and only they: other DNS servers in these ranges are
    /// blocked like everything else there).
    pub blocked_destinations: Vec<Ipv4Cidr>,
    /// DNS servers written into sandboxes' resolv.conf.
    pub dns: DnsSource,
    /// Directory for the per-prefix lock file that keeps two pools off the same prefix.
    pub run_dir: PathBuf,
    /// Delete the host's conntrack entries of a slot when it is released, so replies to the
    /// previous sandbox's connections cannot reach the next one. Costs ~10 ms per release
    /// (a conntrack table walk). Needs the `conntrack` tool: the pool refuses to start
    /// without it unless this is turned off.
    pub flush_conntrack: bool,
    /// Most connections one sandbox may have open at once (tracked by conntrack inside its
    /// slot; new ones beyond it are rejected), so that one sandbox cannot fill the host's
    /// conntrack table for everyone. 0 = no limit.
    pub max_connections_per_slot: u32,
    /// Most new outgoing connections per second one sandbox may open (burst: twice as
    /// many); `None` = no rate limit.
    pub new_connections_per_second: Option<u32>,
    /// How often the pool checks that its host table is intact and restores it if not
    /// (e.g. after `nft flush ruleset`), in milliseconds. 0 = never.
    pub table_check_interval_ms: u64,
    /// Host interfaces on which IPv4 forwarding is turned on when the host has it off
    /// globally: the ones replies to sandboxes' connections arrive on. Empty = the
    /// interfaces of the host's default routes at pool start. Ignored when
    /// `net.ipv4.ip_forward` is already 1.
    pub forward_uplinks: Vec<String>,
    /// Brokers secrets at egress (`network.rules`): without one, rules are applied by no one
    /// and a policy that has them is refused.
    #[serde(skip)]
    pub broker: Option<std::sync::Arc<crate::Broker>>,
}

impl Default for NetConfig {
    fn default() -> Self {
        Self {
            prefix: "warren".into(),
            host_cidr: Ipv4Cidr::new(Ipv4Addr::new(10, 11, 0, 0), 16)
                .unwrap_or_else(|_| unreachable!("constant CIDR is valid")),
            pool_size: 4,
            max_slots: None,
            blocked_destinations: default_blocked(),
            dns: DnsSource::Host,
            run_dir: PathBuf::from("/run/warren-net"),
            flush_conntrack: true,
            max_connections_per_slot: 4096,
            new_connections_per_second: None,
            table_check_interval_ms: 2000,
            forward_uplinks: Vec::new(),
            broker: None,
        }
    }
}

/// Special-purpose IPv4 ranges (RFC 6890) a sandbox has no business reaching: the list the
/// server's own requests (webhooks, registry pulls) share, `warren_runtime::blocked::EGRESS_V4`.
pub fn default_blocked() -> Vec<Ipv4Cidr> {
    warren_runtime::blocked::EGRESS_V4
        .iter()
        .filter_map(|s| Ipv4Cidr::new(s.net.network(), s.net.prefix_len()).ok())
        .collect()
}

impl NetConfig {
    /// Lets sandboxes reach `ranges` although `blocked_destinations` covers them (an
    /// operator's decision, e.g. a company network; never a sandbox creator's).
    pub fn allow_destinations(&mut self, ranges: &[Ipv4Cidr]) {
        for hole in ranges {
            self.blocked_destinations = self
                .blocked_destinations
                .iter()
                .flat_map(|b| b.without(hole))
                .collect();
        }
    }

    /// Checks everything that can be checked without touching the system; returns the
    /// effective maximum number of slots.
    pub fn validate(&self) -> Result<u32> {
        let p = &self.prefix;
        let valid_chars = p.chars().next().is_some_and(|c| c.is_ascii_lowercase())
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        if !(2..=MAX_PREFIX).contains(&p.len()) || !valid_chars {
            return Err(Error::InvalidConfig(format!(
                "prefix `{p}` must be 2-{MAX_PREFIX} characters of [a-z0-9], starting with a letter"
            )));
        }
        let len = self.host_cidr.prefix_len();
        if !(8..=30).contains(&len) {
            return Err(Error::InvalidConfig(format!(
                "host_cidr {} must have a prefix length between /8 and /30",
                self.host_cidr
            )));
        }
        let special = ["127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/3", "0.0.0.0/8"];
        for s in special.iter().filter_map(|s| s.parse::<Ipv4Cidr>().ok()) {
            if self.host_cidr.overlaps(&s) {
                return Err(Error::InvalidConfig(format!(
                    "host_cidr {} overlaps the special range {s}",
                    self.host_cidr
                )));
            }
        }
        let capacity = u32::try_from(slot_capacity(self.host_cidr)).unwrap_or(u32::MAX);
        let max = self.max_slots.map_or(capacity, |m| m.min(capacity));
        if max == 0 {
            return Err(Error::InvalidConfig("max_slots must be at least 1".into()));
        }
        // Slot names are `<prefix>-<index>` and must fit in an interface name.
        let digits = (max - 1).to_string().len();
        if p.len() + 1 + digits > MAX_IFNAME {
            return Err(Error::InvalidConfig(format!(
                "prefix `{p}` with up to {max} slots gives interface names over {MAX_IFNAME} \
                 characters; shorten the prefix or set max_slots"
            )));
        }
        if self.pool_size > max as usize {
            return Err(Error::InvalidConfig(format!(
                "pool_size {} exceeds the maximum of {max} slots",
                self.pool_size
            )));
        }
        if self.new_connections_per_second == Some(0) {
            return Err(Error::InvalidConfig(
                "new_connections_per_second must be at least 1 (or unset)".into(),
            ));
        }
        if let Some(bad) = self.forward_uplinks.iter().find(|n| {
            n.is_empty()
                || n.len() > MAX_IFNAME
                || n.contains(['/', '\0'])
                || *n == "."
                || *n == ".."
        }) {
            return Err(Error::InvalidConfig(format!(
                "forward_uplinks: `{bad}` is not an interface name"
            )));
        }
        if let DnsSource::Servers(servers) = &self.dns {
            if let Some(bad) = servers
                .iter()
                .find(|a| a.is_loopback() || **a == SANDBOX_ADDR)
            {
                return Err(Error::InvalidConfig(format!(
                    "DNS server {bad} is not reachable from inside a slot"
                )));
            }
        }
        Ok(max)
    }

    /// Name of slot `index`: both its network namespace and its host-side link.
    pub fn slot_name(&self, index: u32) -> String {
        format!("{}-{index}", self.prefix)
    }

    /// Whether `name` is a slot name of this prefix (`<prefix>-<digits>`). Exact matching
    /// keeps prefix `wrn` away from objects of prefix `wrnt`.
    pub(crate) fn is_slot_name(&self, name: &str) -> bool {
        name.strip_prefix(self.prefix.as_str())
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    }

    /// nftables glob matching every slot link of this prefix.
    pub(crate) fn link_glob(&self) -> String {
        format!("{}-*", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_ranges_are_cut_out_of_the_blocked_ones() {
        let mut c = NetConfig::default();
        let office: Ipv4Cidr = "10.42.0.0/16".parse().unwrap();
        c.allow_destinations(&[office]);
        let blocked = |ip: [u8; 4]| {
            c.blocked_destinations
                .iter()
                .any(|b| b.contains(Ipv4Addr::from(ip)))
        };
        assert!(!blocked([10, 42, 7, 7]));
        assert!(blocked([10, 41, 0, 1]) && blocked([10, 43, 0, 1]));
        assert!(blocked([169, 254, 169, 254]) && blocked([192, 168, 1, 1]));
    }

    #[test]
    fn default_blocks_metadata_and_wireserver() {
        let blocked = default_blocked();
        // Every shared range made it into the egress list.
        assert_eq!(blocked.len(), warren_runtime::blocked::EGRESS_V4.len());
        for addr in ["169.254.169.254/32", "168.63.129.16/32"] {
            let a: Ipv4Cidr = addr.parse().unwrap();
            assert!(blocked.iter().any(|b| b.overlaps(&a)), "{addr}");
        }
    }

    #[test]
    fn default_is_valid() {
        let c = NetConfig::default();
        assert_eq!(c.validate().unwrap(), 16384);
        assert_eq!(c.slot_name(16383), "warren-16383");
    }

    #[test]
    fn rejects_bad_prefixes_and_ranges() {
        for p in ["", "w", "Warren", "1abc", "war-ren", "waaaaaaaay"] {
            let c = NetConfig {
                prefix: p.into(),
                ..NetConfig::default()
            };
            assert!(c.validate().is_err(), "{p}");
        }
        for cidr in [
            "169.254.0.0/24",
            "127.0.0.0/16",
            "10.0.0.0/31",
            "10.0.0.0/7",
        ] {
            let Ok(host_cidr) = cidr.parse() else {
                continue;
            };
            let c = NetConfig {
                host_cidr,
                ..NetConfig::default()
            };
            assert!(c.validate().is_err(), "{cidr}");
        }
        let c = NetConfig {
            pool_size: 2,
            max_slots: Some(1),
            ..NetConfig::default()
        };
        assert!(c.validate().is_err());
    }

    #[test]
    fn long_prefix_needs_small_pool() {
        let mut c = NetConfig {
            prefix: "abcdefgh".into(),
            host_cidr: "10.0.0.0/8".parse().unwrap(),
            ..NetConfig::default()
        };
        assert!(c.validate().is_err());
        c.max_slots = Some(100_000);
        assert_eq!(c.validate().unwrap(), 100_000);
    }

    #[test]
    fn slot_names_match_exactly() {
        let c = NetConfig {
            prefix: "wrn".into(),
            ..NetConfig::default()
        };
        assert!(c.is_slot_name("wrn-0") && c.is_slot_name("wrn-123"));
        for n in ["wrn", "wrn-", "wrnt-1", "wrn-1a", "xwrn-1", "wrn-out"] {
            assert!(!c.is_slot_name(n), "{n}");
        }
    }

    #[test]
    fn deserializes_with_defaults() {
        let c: NetConfig = serde_json::from_str(
            r#"{"prefix":"wt","host_cidr":"10.200.0.0/24","dns":{"servers":["192.0.2.53"]}}"#,
        )
        .unwrap();
        assert_eq!(c.pool_size, 4);
        assert_eq!(
            c.dns,
            DnsSource::Servers(vec![Ipv4Addr::new(192, 0, 2, 53)])
        );
        assert!(serde_json::from_str::<NetConfig>(r#"{"bogus":1}"#).is_err());
    }
}

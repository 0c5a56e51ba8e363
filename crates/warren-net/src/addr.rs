//! The address plan (see docs/networking.md).
//!
//! Two views of every slot:
//!
//! * **Inside** the slot's network namespace everything is fixed: the sandbox is always
//!   [`SANDBOX_ADDR`] on [`SANDBOX_IFACE`] with gateway [`SANDBOX_GATEWAY`] and the same MAC
//!   addresses. A VM snapshot taken in one slot therefore restores into any other slot with
//!   its address, routes and ARP cache still valid.
//! * **On the host** each slot owns one /30 of the configured pool (`10.11.0.0/16` by
//!   default): `.1` is the host end of the veth pair, `.2` is the slot's *host-side address*.
//!   The host reaches the sandbox at `.2`; nftables inside the slot translates `.2` to the
//!   fixed address and back (DNAT for inbound, SNAT for outbound), so no two slots ever share
//!   an address in the host's routing table or conntrack table.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Name of the sandbox-facing interface inside every slot (the slot end of the veth pair).
pub const SANDBOX_IFACE: &str = "eth0";
/// The sandbox's own address, identical in every slot.
pub const SANDBOX_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 0, 21);
/// The sandbox's default gateway, identical in every slot. No interface on the host carries
/// this address: the slot has a permanent neighbour entry that maps it to [`GATEWAY_MAC`],
/// the MAC of the host end of the veth, so packets to the gateway land on the host.
pub const SANDBOX_GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 0, 22);
/// Prefix length of the in-slot network `169.254.0.20/30`.
pub const SANDBOX_PREFIX_LEN: u8 = 30;
/// MAC of [`SANDBOX_IFACE`] in every slot (locally administered; "wr" = 0x77 0x72).
pub const SANDBOX_MAC: &str = "02:77:72:00:00:15";
/// MAC of the host end of every slot's veth, i.e. of the gateway as the sandbox sees it.
/// Sharing one MAC across host interfaces is fine: every veth is its own point-to-point link.
pub const GATEWAY_MAC: &str = "02:77:72:00:00:16";
/// Name reserved for the microVM runtime's tap device inside a slot (not created here).
pub const TAP_IFACE: &str = "tap0";
/// Port of the guest agent (envd) that the host must always be able to reach.
pub use warren_types::AGENT_PORT;
/// Port of a VM's NFS server (its volumes), on [`SANDBOX_GATEWAY`] inside a slot laid out
/// for a VM (where the tap device carries that address): the one service of the slot
/// itself that the guest is meant to reach, never sent to the egress proxy.
pub const NFS_PORT: u16 = 2049;

/// Number of addresses each slot takes from the host pool.
const ADDRS_PER_SLOT: u64 = 4;

/// An IPv4 network in CIDR notation whose host bits are zero, e.g. `10.11.0.0/16`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv4Cidr {
    network: Ipv4Addr,
    prefix_len: u8,
}

/// Why a string is not a valid [`Ipv4Cidr`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Invalid IPv4 CIDR `{input}`: {reason}")]
pub struct ParseCidrError {
    input: String,
    reason: &'static str,
}

impl Ipv4Cidr {
    /// A network; fails when `prefix_len > 32` or host bits are set (`10.0.0.1/8`), because
    /// such a value almost always hides a typo in configuration.
    pub fn new(network: Ipv4Addr, prefix_len: u8) -> Result<Self, ParseCidrError> {
        let input = || format!("{network}/{prefix_len}");
        if prefix_len > 32 {
            return Err(ParseCidrError {
                input: input(),
                reason: "prefix length is larger than 32",
            });
        }
        if u32::from(network) & !mask(prefix_len) != 0 {
            return Err(ParseCidrError {
                input: input(),
                reason: "host bits are set",
            });
        }
        Ok(Self {
            network,
            prefix_len,
        })
    }

    /// A single address as a /32.
    pub fn host(addr: Ipv4Addr) -> Self {
        Self {
            network: addr,
            prefix_len: 32,
        }
    }

    pub fn network(&self) -> Ipv4Addr {
        self.network
    }

    pub fn prefix_len(&self) -> u8 {
        self.prefix_len
    }

    /// Number of addresses in the network (2^32 for `0.0.0.0/0`).
    pub fn size(&self) -> u64 {
        1u64 << (32 - u32::from(self.prefix_len))
    }

    pub fn contains(&self, addr: Ipv4Addr) -> bool {
        u32::from(addr) & mask(self.prefix_len) == u32::from(self.network)
    }

    /// This network without the addresses of `hole`: itself when they do not overlap,
    /// nothing when `hole` covers it, else the smallest set of CIDRs that covers the rest.
    pub fn without(&self, hole: &Ipv4Cidr) -> Vec<Ipv4Cidr> {
        if !self.overlaps(hole) {
            return vec![*self];
        }
        if hole.prefix_len <= self.prefix_len {
            return Vec::new();
        }
        // Split in halves: the one without the hole stays whole, the other is split again.
        let len = self.prefix_len + 1;
        let low = Ipv4Cidr {
            network: self.network,
            prefix_len: len,
        };
        let high = Ipv4Cidr {
            network: Ipv4Addr::from(u32::from(self.network) | (1u32 << (32 - u32::from(len)))),
            prefix_len: len,
        };
        let mut out = low.without(hole);
        out.extend(high.without(hole));
        out
    }

    /// Whether the two networks share at least one address.
    pub fn overlaps(&self, other: &Ipv4Cidr) -> bool {
        let shorter = self.prefix_len.min(other.prefix_len);
        let m = mask(shorter);
        u32::from(self.network) & m == u32::from(other.network) & m
    }

    /// The `n`-th address of the network, if it is inside it.
    pub fn nth(&self, n: u64) -> Option<Ipv4Addr> {
        if n >= self.size() {
            return None;
        }
        // n < size <= 2^32 and network + n stays inside the network, so no overflow.
        Some(Ipv4Addr::from(u32::from(self.network) + n as u32))
    }
}

fn mask(prefix_len: u8) -> u32 {
    if prefix_len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix_len))
    }
}

impl fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix_len)
    }
}

impl FromStr for Ipv4Cidr {
    type Err = ParseCidrError;

    /// Accepts `a.b.c.d/len` and a bare address (taken as /32).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| ParseCidrError {
            input: s.to_owned(),
            reason,
        };
        let (addr, len) = match s.split_once('/') {
            Some((addr, len)) => (
                addr,
                len.parse::<u8>().map_err(|_| err("bad prefix length"))?,
            ),
            None => (s, 32),
        };
        let addr = addr
            .parse::<Ipv4Addr>()
            .map_err(|_| err("bad IPv4 address"))?;
        Ipv4Cidr::new(addr, len).map_err(|e| err(e.reason))
    }
}

impl Serialize for Ipv4Cidr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Ipv4Cidr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The host-side addresses of one slot: the `index`-th /30 of the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotAddrs {
    /// Position of the slot in the pool; also the numeric part of its name.
    pub index: u32,
    /// The slot's /30 on the host.
    pub subnet: Ipv4Cidr,
    /// Address of the host end of the veth (`.1`). Connections from the host to the sandbox
    /// come from this address.
    pub host_veth: Ipv4Addr,
    /// The slot's unique host-side address (`.2`): the host reaches the sandbox here, and the
    /// sandbox's outbound traffic leaves the slot with this source address.
    pub host_side: Ipv4Addr,
}

impl SlotAddrs {
    /// Addresses of slot `index` in `pool`, or `None` when the pool has no room for it.
    pub fn for_index(pool: Ipv4Cidr, index: u32) -> Option<Self> {
        let base = u64::from(index) * ADDRS_PER_SLOT;
        let network = pool.nth(base)?;
        // nth(base + 3) existing means the whole /30 is inside the pool.
        pool.nth(base + 3)?;
        let subnet = Ipv4Cidr::new(network, 30).ok()?;
        Some(Self {
            index,
            subnet,
            host_veth: subnet.nth(1)?,
            host_side: subnet.nth(2)?,
        })
    }
}

impl SlotAddrs {
    /// The slot of `pool` whose host-side address is `host_side` (`None`: no slot's).
    pub fn of_host_side(pool: Ipv4Cidr, host_side: Ipv4Addr) -> Option<Self> {
        if !pool.contains(host_side) {
            return None;
        }
        let offset = u64::from(u32::from(host_side) - u32::from(pool.network()));
        if offset % ADDRS_PER_SLOT != 2 {
            return None;
        }
        let addrs = Self::for_index(pool, u32::try_from(offset / ADDRS_PER_SLOT).ok()?)?;
        (addrs.host_side == host_side).then_some(addrs)
    }
}

/// How many slots fit in `pool`.
pub fn slot_capacity(pool: Ipv4Cidr) -> u64 {
    pool.size() / ADDRS_PER_SLOT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display() {
        let c: Ipv4Cidr = "10.11.0.0/16".parse().unwrap();
        assert_eq!(c.to_string(), "10.11.0.0/16");
        assert_eq!(c.size(), 65536);
        assert_eq!("1.2.3.4".parse::<Ipv4Cidr>().unwrap().prefix_len(), 32);
        assert!("10.11.0.1/16".parse::<Ipv4Cidr>().is_err());
        assert!("10.11.0.0/33".parse::<Ipv4Cidr>().is_err());
        assert!("10.11.0/16".parse::<Ipv4Cidr>().is_err());
        assert_eq!("0.0.0.0/0".parse::<Ipv4Cidr>().unwrap().size(), 1 << 32);
    }

    #[test]
    fn a_hole_is_cut_out_of_a_network() {
        let net: Ipv4Cidr = "10.0.0.0/8".parse().unwrap();
        let hole: Ipv4Cidr = "10.20.0.0/16".parse().unwrap();
        let rest = net.without(&hole);
        assert_eq!(rest.len(), 8);
        assert!(rest.iter().all(|c| !c.overlaps(&hole)));
        for probe in [
            [10, 0, 0, 1],
            [10, 19, 255, 255],
            [10, 21, 0, 0],
            [10, 255, 0, 9],
        ] {
            let ip = Ipv4Addr::from(probe);
            assert_eq!(rest.iter().filter(|c| c.contains(ip)).count(), 1, "{ip}");
        }
        assert!(!rest.iter().any(|c| c.contains(Ipv4Addr::new(10, 20, 3, 4))));
        assert_eq!(hole.without(&net), Vec::<Ipv4Cidr>::new());
        let other: Ipv4Cidr = "192.168.0.0/16".parse().unwrap();
        assert_eq!(net.without(&other), vec![net]);
        let one = Ipv4Cidr::host(Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(net.without(&one).len(), 24);
    }

    #[test]
    fn contains_and_overlaps() {
        let a: Ipv4Cidr = "10.0.0.0/8".parse().unwrap();
        let b: Ipv4Cidr = "10.11.0.0/16".parse().unwrap();
        let c: Ipv4Cidr = "192.168.0.0/16".parse().unwrap();
        assert!(a.overlaps(&b) && b.overlaps(&a));
        assert!(!a.overlaps(&c));
        assert!(a.contains(Ipv4Addr::new(10, 255, 1, 1)));
        assert!(!b.contains(Ipv4Addr::new(10, 12, 0, 1)));
    }

    #[test]
    fn slot_addresses() {
        let pool: Ipv4Cidr = "10.11.0.0/16".parse().unwrap();
        let s = SlotAddrs::for_index(pool, 0).unwrap();
        assert_eq!(s.host_veth, Ipv4Addr::new(10, 11, 0, 1));
        assert_eq!(s.host_side, Ipv4Addr::new(10, 11, 0, 2));
        let s = SlotAddrs::for_index(pool, 70).unwrap();
        assert_eq!(s.subnet.to_string(), "10.11.1.24/30");
        assert_eq!(s.host_side, Ipv4Addr::new(10, 11, 1, 26));
        assert_eq!(slot_capacity(pool), 16384);
        assert!(SlotAddrs::for_index(pool, 16383).is_some());
        assert!(SlotAddrs::for_index(pool, 16384).is_none());
    }

    #[test]
    fn in_slot_plan_is_consistent() {
        let net = Ipv4Cidr::new(Ipv4Addr::new(169, 254, 0, 20), SANDBOX_PREFIX_LEN).unwrap();
        assert!(net.contains(SANDBOX_ADDR) && net.contains(SANDBOX_GATEWAY));
    }
}

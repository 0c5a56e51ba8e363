//! The destinations Warren does not reach by default: one list for sandbox egress
//! (`warren-net`'s `NetConfig::blocked_destinations`), webhook deliveries and registry pulls.
//!
//! Sandbox egress takes [`EGRESS_V4`] (sandboxes have IPv4 only). Requests the server makes
//! itself from the host's network (webhooks, registry pulls) are judged by [`HostPolicy`]:
//! the same IPv4 ranges, plus 198.18.0.0/15, plus IPv6's special ranges, and every IPv6 form
//! that carries an IPv4 address (IPv4-mapped, IPv4-compatible, NAT64, 6to4) is judged by that
//! IPv4 address, so `::ffff:127.0.0.1` or `2002:7f00:1::` is loopback as `127.0.0.1` is.
//!
//! 198.18.0.0/15 (benchmarking, never globally routed) is in the host-side list only: the
//! network test suites use it as the stand-in internet that sandboxes reach.
//!
//! No I/O here: callers resolve names and check every address they are about to connect to.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// A range and why it is refused, in words for an error message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Special<N> {
    pub net: N,
    pub why: &'static str,
}

const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8, why: &'static str) -> Special<Ipv4Net> {
    Special {
        net: Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), len),
        why,
    }
}

const fn v6(s: [u16; 8], len: u8, why: &'static str) -> Special<Ipv6Net> {
    Special {
        net: Ipv6Net::new_assert(
            Ipv6Addr::new(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]),
            len,
        ),
        why,
    }
}

/// Special-purpose IPv4 ranges (RFC 6890) that neither sandboxes nor the server reach unless
/// the operator allows them.
pub const EGRESS_V4: &[Special<Ipv4Net>] = &[
    v4(0, 0, 0, 0, 8, "\"this network\""),
    v4(10, 0, 0, 0, 8, "private"),
    v4(100, 64, 0, 0, 10, "carrier-grade NAT"),
    v4(127, 0, 0, 0, 8, "loopback"),
    v4(169, 254, 0, 0, 16, "link-local (cloud metadata)"),
    v4(172, 16, 0, 0, 12, "private"),
    v4(192, 0, 0, 0, 24, "IETF protocol assignments"),
    v4(192, 168, 0, 0, 16, "private"),
    v4(224, 0, 0, 0, 4, "multicast"),
    v4(240, 0, 0, 0, 4, "reserved and broadcast"),
    // Azure's WireServer (host agent and DHCP/DNS of Azure VMs): a public address that
    // answers only to VMs on Azure hosts, with the VM's credentials in reach.
    v4(168, 63, 129, 16, 32, "Azure WireServer (cloud metadata)"),
];

/// IPv4 ranges refused for the server's own requests on top of [`EGRESS_V4`].
pub const HOST_EXTRA_V4: &[Special<Ipv4Net>] = &[v4(198, 18, 0, 0, 15, "benchmarking")];

/// IPv6 ranges refused for the server's own requests. The forms that embed an IPv4 address
/// are judged by that address instead (see [`embedded_ipv4`]).
pub const HOST_V6: &[Special<Ipv6Net>] = &[
    v6([0, 0, 0, 0, 0, 0, 0, 0], 128, "unspecified"),
    v6([0, 0, 0, 0, 0, 0, 0, 1], 128, "loopback"),
    // RFC 8215's local-use NAT64 prefix: what it translates to is the network's own choice.
    v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48, "local-use NAT64"),
    v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64, "discard-only"),
    // Teredo hides the IPv4 address it tunnels to (XOR-ed), and nobody serves from it.
    v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32, "Teredo tunnel"),
    v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, "private (unique local)"),
    v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, "link-local"),
    v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, "site-local"),
    v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, "multicast"),
];

/// The ranges sandbox egress blocks by default ([`EGRESS_V4`]).
pub fn egress_ipv4() -> Vec<Ipv4Net> {
    EGRESS_V4.iter().map(|s| s.net).collect()
}

/// The IPv4 address an IPv6 address stands for, when it has one of the forms that carry one,
/// with the form's name: IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible `::a.b.c.d`
/// (deprecated, but routed by some stacks), NAT64 `64:ff9b::a.b.c.d` and 6to4
/// `2002:AABB:CCDD::/48`.
pub fn embedded_ipv4(ip: Ipv6Addr) -> Option<(Ipv4Addr, &'static str)> {
    let s = ip.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some((v4, "IPv4-mapped"));
    }
    if s[..6] == [0; 6] && u32::from(low) > 1 {
        return Some((low, "IPv4-compatible"));
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some((low, "NAT64"));
    }
    if s[0] == 0x2002 {
        let v4 = Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8);
        return Some((v4, "6to4"));
    }
    None
}

/// Why an address is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The address asked for.
    pub addr: IpAddr,
    /// The IPv4 address it carries and the form that carries it, when it is such an IPv6 form.
    pub embedded: Option<(Ipv4Addr, &'static str)>,
    /// The refused range that holds it.
    pub range: IpNet,
    pub why: &'static str,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.embedded {
            Some((v4, form)) => write!(
                f,
                "{} ({form}, carrying {v4}) is {} ({})",
                self.addr, self.why, self.range
            ),
            None => write!(f, "{} is {} ({})", self.addr, self.why, self.range),
        }
    }
}

/// The address check for requests the server makes from the host's network: every range of
/// [`EGRESS_V4`], [`HOST_EXTRA_V4`] and [`HOST_V6`] is refused, except inside ranges the
/// operator allows.
#[derive(Debug, Clone, Default)]
pub struct HostPolicy {
    allowed: Vec<IpNet>,
}

impl HostPolicy {
    /// The default refusals, with holes for `allowed` (the operator's choice, e.g. a company
    /// registry network). An IPv6 form that carries an IPv4 address is allowed when that
    /// address is.
    pub fn new(allowed: Vec<IpNet>) -> Self {
        HostPolicy { allowed }
    }

    /// `Ok` when `ip` may be connected to.
    pub fn check(&self, ip: IpAddr) -> Result<(), Refusal> {
        if self.allowed.iter().any(|n| n.contains(&ip)) {
            return Ok(());
        }
        let v6 = match ip {
            IpAddr::V4(v4) => return self.check_v4(ip, v4, None),
            IpAddr::V6(v6) => v6,
        };
        if let Some((v4, form)) = embedded_ipv4(v6) {
            return self.check_v4(ip, v4, Some((v4, form)));
        }
        match HOST_V6.iter().find(|s| s.net.contains(&v6)) {
            Some(s) => Err(Refusal {
                addr: ip,
                embedded: None,
                range: IpNet::V6(s.net),
                why: s.why,
            }),
            None => Ok(()),
        }
    }

    fn check_v4(
        &self,
        addr: IpAddr,
        v4: Ipv4Addr,
        embedded: Option<(Ipv4Addr, &'static str)>,
    ) -> Result<(), Refusal> {
        if self.allowed.iter().any(|n| n.contains(&IpAddr::V4(v4))) {
            return Ok(());
        }
        match EGRESS_V4
            .iter()
            .chain(HOST_EXTRA_V4)
            .find(|s| s.net.contains(&v4))
        {
            Some(s) => Err(Refusal {
                addr,
                embedded,
                range: IpNet::V4(s.net),
                why: s.why,
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(ip: &str) -> Option<&'static str> {
        HostPolicy::default()
            .check(ip.parse().unwrap())
            .err()
            .map(|r| r.why)
    }

    #[test]
    fn ipv4_ranges_are_refused_with_their_reason() {
        for (ip, why) in [
            ("127.0.0.1", "loopback"),
            ("10.1.2.3", "private"),
            ("169.254.169.254", "link-local (cloud metadata)"),
            ("100.64.0.1", "carrier-grade NAT"),
            ("168.63.129.16", "Azure WireServer (cloud metadata)"),
            ("192.0.0.170", "IETF protocol assignments"),
            ("198.18.0.1", "benchmarking"),
            ("198.19.255.255", "benchmarking"),
            ("240.0.0.1", "reserved and broadcast"),
            ("255.255.255.255", "reserved and broadcast"),
            ("0.0.0.0", "\"this network\""),
        ] {
            assert_eq!(refused(ip), Some(why), "{ip}");
        }
        // Classified only, never contacted: documentation ranges, and WireServer's neighbour.
        for ip in ["192.0.2.1", "198.20.0.1", "203.0.113.8", "168.63.129.17"] {
            assert_eq!(refused(ip), None, "{ip}");
        }
    }

    #[test]
    fn ipv6_forms_of_internal_ipv4_are_refused_as_that_ipv4() {
        for (ip, why) in [
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:169.254.169.254", "link-local (cloud metadata)"),
            ("::10.0.0.1", "private"),
            ("64:ff9b::a9fe:a9fe", "link-local (cloud metadata)"),
            ("64:ff9b::a83f:8110", "Azure WireServer (cloud metadata)"),
            ("2002:7f00:1::1", "loopback"),
            ("2002:c0a8:0101::", "private"),
        ] {
            assert_eq!(refused(ip), Some(why), "{ip}");
        }
        let r = HostPolicy::default()
            .check("64:ff9b::7f00:1".parse().unwrap())
            .unwrap_err();
        assert_eq!(r.embedded, Some((Ipv4Addr::LOCALHOST, "NAT64")));
        assert!(r.to_string().contains("carrying 127.0.0.1"), "{r}");
        // The same forms carrying an address outside the list (203.0.113.8) are fine.
        for ip in [
            "::ffff:203.0.113.8",
            "64:ff9b::cb00:7108",
            "2002:cb00:7108::1",
        ] {
            assert_eq!(refused(ip), None, "{ip}");
        }
    }

    #[test]
    fn ipv6_special_ranges_are_refused() {
        for (ip, why) in [
            ("::1", "loopback"),
            ("::", "unspecified"),
            ("fd00:ec2::254", "private (unique local)"),
            ("fe80::1", "link-local"),
            ("ff02::1", "multicast"),
            ("64:ff9b:1::1", "local-use NAT64"),
            ("2001::1", "Teredo tunnel"),
            ("100::1", "discard-only"),
        ] {
            assert_eq!(refused(ip), Some(why), "{ip}");
        }
        assert_eq!(refused("2606:4700::1111"), None);
    }

    #[test]
    fn operator_ranges_open_holes_also_for_embedded_forms() {
        let p = HostPolicy::new(vec!["127.0.0.0/8".parse().unwrap()]);
        assert!(p.check("127.0.0.1".parse().unwrap()).is_ok());
        assert!(p.check("::ffff:127.0.0.5".parse().unwrap()).is_ok());
        assert!(p.check("10.0.0.1".parse().unwrap()).is_err());
        assert!(p.check("::1".parse().unwrap()).is_err());
    }

    #[test]
    fn egress_list_matches_the_shared_one() {
        let list = egress_ipv4();
        assert!(list.contains(&"168.63.129.16/32".parse().unwrap()));
        assert!(!list
            .iter()
            .any(|n| n.contains(&Ipv4Addr::new(198, 18, 0, 1))));
    }
}

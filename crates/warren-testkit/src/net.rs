//! Address ranges for tests that make network slots.
//!
//! A test picks `10.<second>.<third>.0/24` from its process id so that concurrent test
//! processes differ. A range can still be taken: by a test process that was killed before its
//! cleanup ran, or by anything else on the machine. The pool then refuses to start (a route
//! it does not own covers its addresses), and the test would fail for a reason that is not
//! its own. So a test takes the first of its candidates that no route touches.

use std::net::Ipv4Addr;
use std::process::Command;

/// The first `third` in `candidates` such that no route of the host (any table) overlaps
/// `10.<second>.<third>.0/24`. Panics, with the routes in the way, when every candidate is
/// taken or `ip` cannot list the routes.
///
/// Tests of one process that run at once must pass disjoint candidate lists: this only sees
/// routes that exist, not ranges another test has chosen and not yet used.
pub fn free_third_octet(second: u8, candidates: impl IntoIterator<Item = u8>) -> u8 {
    pick(&routes(), second, candidates)
}

fn pick(routes: &[(u32, u8)], second: u8, candidates: impl IntoIterator<Item = u8>) -> u8 {
    let mut tried = Vec::new();
    for third in candidates {
        let block = (u32::from(Ipv4Addr::new(10, second, third, 0)), 24);
        if !routes.iter().any(|r| overlaps(*r, block)) {
            return third;
        }
        tried.push(third);
    }
    panic!(
        "every candidate range 10.{second}.{tried:?}.0/24 overlaps a route of this host; \
         remove what earlier test runs left (`ip route show table all`)"
    );
}

/// Every IPv4 destination (address, prefix length) the host routes, in any table; local and
/// broadcast entries (which mirror addresses) and default routes left out.
fn routes() -> Vec<(u32, u8)> {
    let out = Command::new(crate::on_path("ip").unwrap_or_else(|| "ip".into()))
        .args(["-4", "-o", "route", "show", "table", "all"])
        .output()
        .expect("run `ip route` (iproute2)");
    assert!(
        out.status.success(),
        "ip route: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(parse_route)
        .collect()
}

fn parse_route(line: &str) -> Option<(u32, u8)> {
    let mut words = line.split_whitespace();
    let mut dst = words.next()?;
    // A typed route names its type first (`unreachable 10.0.0.0/8`); local and broadcast
    // entries mirror addresses that also show up as prefix routes.
    match dst {
        "local" | "broadcast" | "default" => return None,
        "unicast" | "unreachable" | "blackhole" | "prohibit" | "throw" | "multicast" => {
            dst = words.next()?;
        }
        _ => {}
    }
    let (addr, len) = match dst.split_once('/') {
        Some((a, l)) => (a, l.parse().ok()?),
        None => (dst, 32),
    };
    let addr: Ipv4Addr = addr.parse().ok()?;
    (len <= 32).then_some((u32::from(addr), len))
}

fn overlaps((a, alen): (u32, u8), (b, blen): (u32, u8)) -> bool {
    // Two prefixes overlap when they agree on the shorter one's bits.
    let len = alen.min(blen);
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    a & mask == b & mask
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> (u32, u8) {
        parse_route(s).unwrap()
    }

    #[test]
    fn routes_are_read_as_ip_prints_them() {
        assert_eq!(
            parse_route("10.21.75.0/30 dev wqf3038-0 proto kernel scope link src 10.21.75.1"),
            Some((u32::from(Ipv4Addr::new(10, 21, 75, 0)), 30))
        );
        assert_eq!(
            parse_route("unreachable 10.9.0.0/16 metric 5"),
            Some((u32::from(Ipv4Addr::new(10, 9, 0, 0)), 16))
        );
        assert_eq!(net("192.0.2.7 dev x").1, 32);
        assert_eq!(parse_route("default via 192.0.2.1 dev eth0"), None);
        assert_eq!(parse_route("local 10.1.1.1 dev lo table local"), None);
        assert_eq!(parse_route("broadcast 10.1.1.255 dev x table local"), None);
    }

    #[test]
    fn overlap_is_shared_prefix_bits() {
        let block = net("10.21.75.0/24");
        assert!(overlaps(net("10.21.75.0/30"), block));
        assert!(overlaps(net("10.0.0.0/8"), block));
        assert!(overlaps(net("10.21.75.200"), block));
        assert!(!overlaps(net("10.21.76.0/30"), block));
        assert!(!overlaps(net("10.21.74.252/30"), block));
    }

    #[test]
    fn the_first_candidate_no_route_touches_is_taken() {
        let routes = [
            net("10.21.75.0/30 dev wqf3038-0"),
            net("10.21.79.4/30 dev x"),
        ];
        assert_eq!(pick(&routes, 21, [75, 79, 83]), 83);
        assert_eq!(pick(&routes, 21, [71, 75]), 71);
        assert_eq!(pick(&routes, 22, [75]), 75, "another second octet is free");
        let all = std::panic::catch_unwind(|| pick(&[net("10.0.0.0/8")], 21, [1, 2]));
        assert!(all.is_err(), "no free candidate is a loud failure");
    }
}

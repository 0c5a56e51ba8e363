//! What a sandbox in a slot can and cannot reach. Run as root; see tests/common.

mod common;

use std::io::Write;
use std::net::Ipv4Addr;
use std::time::Duration;

use common::{
    accept, assert_blocked, assert_connects, connect, host_primary_addrs, listen, read_some, sa,
    udp_echo, udp_roundtrip, OPEN,
};
use warren_net::{DnsSource, SlotPolicy, AGENT_PORT, SANDBOX_ADDR};

#[test]
fn egress_follows_internet_access_and_the_agent_stays_reachable() {
    let Some(mut ctx) = common::setup() else {
        return;
    };
    let outside = ctx.outside();
    let (server_ip, masq_ip) = (outside.addr, outside.host_addr);
    let outside_ns = ctx.outside_netns();
    let (rt, pool) = common::start_pool(ctx.config(1));
    let mut slot = common::acquire(&rt, &pool, &SlotPolicy::open());
    let ns = slot.netns_path();
    let server = listen(Some(&outside_ns), sa(Ipv4Addr::UNSPECIFIED, 8080));
    let agent = listen(Some(&ns), sa(Ipv4Addr::UNSPECIFIED, AGENT_PORT));
    let target = sa(server_ip, 8080);

    // Egress on: the outside sees the host's masquerading address, not a slot address.
    let peer = assert_connects(Some(&ns), &server, target);
    assert_eq!(peer.ip(), std::net::IpAddr::V4(masq_ip));
    let mut open_conn = connect(Some(&ns), target, OPEN).expect("connect before cut");
    let (mut open_peer, _) = accept(&server, OPEN).expect("accepted before cut");
    open_conn.write_all(b"ping").expect("write");
    assert_eq!(read_some(&mut open_peer, OPEN), b"ping");

    // The host reaches the agent through the host-side address; the sandbox sees the host
    // end of its veth as the peer.
    let peer = assert_connects(None, &agent, slot.agent_endpoint().into());
    assert_eq!(peer.ip(), std::net::IpAddr::V4(slot.host_veth_addr()));

    // Egress off: new connections fail, the open one is cut, the agent is still reachable.
    rt.block_on(pool.set_policy(&mut slot, &SlotPolicy::deny_all()))
        .expect("internet off");
    assert!(!slot.internet_access());
    assert_blocked(Some(&ns), target, Some(&server));
    // Rejected, not dropped: software in the sandbox fails fast instead of hanging.
    let refused = connect(Some(&ns), target, OPEN).expect_err("egress is off");
    assert_ne!(refused.kind(), std::io::ErrorKind::TimedOut, "{refused}");
    open_conn
        .write_all(b"late")
        .expect("write is buffered locally");
    assert!(
        read_some(&mut open_peer, Duration::from_millis(800)).is_empty(),
        "data crossed after internet access was turned off"
    );
    assert_connects(None, &agent, slot.agent_endpoint().into());

    // And back on: toggling is cheap and symmetric.
    rt.block_on(pool.set_policy(&mut slot, &SlotPolicy::open()))
        .expect("internet on");
    assert_connects(Some(&ns), &server, target);

    // A slot acquired with internet access off starts without egress.
    let other = rt
        .block_on(pool.acquire(&SlotPolicy::deny_all()))
        .expect("acquire without internet");
    let other_ns = other.netns_path();
    assert_blocked(Some(&other_ns), target, Some(&server));
    let other_agent = listen(Some(&other_ns), sa(Ipv4Addr::UNSPECIFIED, AGENT_PORT));
    assert_connects(None, &other_agent, other.agent_endpoint().into());

    drop((agent, other_agent, open_conn, open_peer));
    common::release_and_shut_down(&rt, pool, [other, slot]);
}

#[test]
fn slots_reach_neither_each_other_nor_the_host() {
    let Some(mut ctx) = common::setup() else {
        return;
    };
    let outside_host_addr = ctx.outside().host_addr;
    let (rt, pool) = common::start_pool(ctx.config(2));
    let a = common::acquire(&rt, &pool, &SlotPolicy::open());
    let b = common::acquire(&rt, &pool, &SlotPolicy::open());
    let (a_ns, b_ns) = (a.netns_path(), b.netns_path());

    // B runs an agent; the host can reach it (so the listener is fine) ...
    let b_agent = listen(Some(&b_ns), sa(Ipv4Addr::UNSPECIFIED, AGENT_PORT));
    assert_connects(None, &b_agent, b.agent_endpoint().into());
    // ... but A cannot, by any address of B.
    assert_blocked(Some(&a_ns), b.agent_endpoint().into(), Some(&b_agent));
    assert_blocked(
        Some(&a_ns),
        sa(b.host_veth_addr(), AGENT_PORT),
        Some(&b_agent),
    );

    // Host services: one listener on every address, one on A's host-side veth address.
    let any = listen(None, sa(Ipv4Addr::UNSPECIFIED, 0));
    let port = any.local_addr().expect("addr").port();
    let on_veth = listen(None, sa(a.host_veth_addr(), 0));
    assert_blocked(
        Some(&a_ns),
        on_veth.local_addr().expect("addr"),
        Some(&on_veth),
    );
    let mut host_addrs = vec![
        a.host_veth_addr(),
        b.host_veth_addr(),
        outside_host_addr,
        // The gateway address is only a neighbour entry; nothing may answer on it.
        a.sandbox_gateway(),
    ];
    host_addrs.extend(host_primary_addrs());
    for ip in host_addrs {
        assert_blocked(Some(&a_ns), sa(ip, port), Some(&any));
    }
    // The host's loopback is not reachable either: 127.0.0.1 inside the slot is the slot's.
    let lo = listen(None, sa(Ipv4Addr::LOCALHOST, 0));
    assert_blocked(Some(&a_ns), lo.local_addr().expect("addr"), Some(&lo));
    // The host itself still reaches its own listener (the listener works).
    assert_connects(None, &any, sa(Ipv4Addr::LOCALHOST, port));

    drop(b_agent);
    common::release_and_shut_down(&rt, pool, [a, b]);
}

#[test]
fn every_slot_looks_the_same_inside() {
    let Some(ctx) = common::setup() else { return };
    let (rt, pool) = common::start_pool(ctx.config(2));
    let a = common::acquire(&rt, &pool, &SlotPolicy::open());
    let b = common::acquire(&rt, &pool, &SlotPolicy::open());
    assert_ne!(a.host_side_addr(), b.host_side_addr());
    assert_eq!(a.sandbox_addr(), SANDBOX_ADDR);

    let view = |name: &str| -> String {
        let mut s = String::new();
        for args in [
            &["-4", "-br", "addr", "show"][..],
            &["-br", "link", "show"][..],
            &["-6", "-br", "addr", "show", "dev", "eth0"][..],
            &["route", "show"][..],
            &["neigh", "show"][..],
        ] {
            let mut full = vec!["-n", name];
            full.extend_from_slice(args);
            let out = common::sh("ip", &full, None).expect("ip in slot");
            // `eth0@if123` names the host-side ifindex, which differs by construction.
            for line in out.lines() {
                let words: Vec<String> = line.split_whitespace().map(strip_ifindex).collect();
                s.push_str(&words.join(" "));
                s.push('\n');
            }
        }
        s
    };
    let (va, vb) = (view(a.name()), view(b.name()));
    assert_eq!(va, vb, "slots differ inside");
    assert!(va.contains("169.254.0.21/30"), "{va}");
    assert!(va.contains("default via 169.254.0.22 dev eth0"), "{va}");
    assert!(
        !va.contains("10."),
        "a host-side address leaks into the slot: {va}"
    );
    assert!(
        !va.contains("fe80"),
        "IPv6 link-local address in the slot: {va}"
    );

    common::release_and_shut_down(&rt, pool, [a, b]);
}

fn strip_ifindex(word: &str) -> String {
    match word.find("@if") {
        Some(i) if word[i + 3..].bytes().all(|b| b.is_ascii_digit()) => word[..i].to_owned(),
        _ => word.to_owned(),
    }
}

#[test]
fn dns_servers_stay_reachable_on_port_53_only() {
    let Some(mut ctx) = common::setup() else {
        return;
    };
    ctx.outside();
    let dns_ip = ctx.private_addr();
    let outside_ns = ctx.outside_netns();
    let mut config = ctx.config(1);
    config.dns = DnsSource::Servers(vec![dns_ip]);
    let (rt, pool) = common::start_pool(config);
    let mut slot = common::acquire(&rt, &pool, &SlotPolicy::open());
    let ns = slot.netns_path();

    // The runtime writes this file; it names the configured server.
    let conf = slot.resolv_conf().to_owned();
    let servers = warren_net::parse_nameservers(&conf);
    assert_eq!(servers, vec![std::net::IpAddr::V4(dns_ip)], "{conf}");

    // A stand-in DNS server on a private (normally blocked) address answers on port 53 ...
    let _dns = udp_echo(&outside_ns, sa(dns_ip, 53));
    if !udp_roundtrip(&ns, sa(dns_ip, 53), OPEN) {
        common::dump_diagnostics();
        panic!("DNS query got no answer");
    }
    // ... while other ports of the same private address stay blocked.
    let web = listen(Some(&outside_ns), sa(dns_ip, 80));
    assert_blocked(Some(&ns), sa(dns_ip, 80), Some(&web));
    // Only the configured resolver is an exception: another DNS server in a blocked range
    // (a split-horizon internal resolver) stays out of reach, port 53 or not.
    let other_ip = ctx.other_private_addr();
    let _other_dns = udp_echo(&outside_ns, sa(other_ip, 53));
    assert!(
        !udp_roundtrip(&ns, sa(other_ip, 53), Duration::from_millis(800)),
        "a DNS server other than the configured one answered"
    );

    // Without internet access, DNS goes too (it is a way out).
    rt.block_on(pool.set_policy(&mut slot, &SlotPolicy::deny_all()))
        .expect("internet off");
    assert!(!udp_roundtrip(
        &ns,
        sa(dns_ip, 53),
        Duration::from_millis(800)
    ));

    common::release_and_shut_down(&rt, pool, [slot]);
}

//! A slot's address policy ([`SlotPolicy`]) enforced for real: allow beats deny, a refused TCP
//! connection is reset at once, UDP is covered too, a new policy cuts open connections it no
//! longer allows, the host keeps reaching the agent, a released slot is open again, and an
//! adopted slot keeps its policy. Run as root; see tests/common.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use common::{
    accept, assert_connects, connect, listen, read_some, sa, udp_echo, udp_roundtrip, OPEN,
};
use warren_net::{AdoptSlot, Ipv4Cidr, SlotPolicy, AGENT_PORT};

fn host(ip: Ipv4Addr) -> Ipv4Cidr {
    Ipv4Cidr::new(ip, 32).expect("a /32")
}

/// Connecting to `target` fails with a reset (connection refused) well before a timeout.
fn assert_reset(ns: &std::path::Path, target: SocketAddr) {
    let started = Instant::now();
    let err = connect(Some(ns), target, OPEN).expect_err("the policy refuses this address");
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{target}: {err}");
    assert!(
        started.elapsed() < OPEN,
        "a refused connection must fail at once, not time out"
    );
}

#[test]
fn cidr_policy_allows_refuses_with_reset_and_cuts_open_connections() {
    let Some(mut ctx) = common::setup() else {
        return;
    };
    let (a, b, _, outside_ns) = ctx.internet();
    let (rt, pool) = common::start_pool(ctx.config(1));
    let server_a = listen(Some(&outside_ns), sa(a, 8080));
    let server_b = listen(Some(&outside_ns), sa(b, 8080));
    let _echo_a = udp_echo(&outside_ns, sa(a, 5353));
    let _echo_b = udp_echo(&outside_ns, sa(b, 5353));

    // Deny one address: the other stays reachable, the denied one is reset, over UDP too.
    let deny_b = SlotPolicy {
        deny: vec![host(b)],
        ..SlotPolicy::default()
    };
    let mut slot = common::acquire(&rt, &pool, &deny_b);
    let ns = slot.netns_path();
    assert!(slot.internet_access());
    assert_connects(Some(&ns), &server_a, sa(a, 8080));
    assert_reset(&ns, sa(b, 8080));
    assert!(
        accept(&server_b, Duration::ZERO).is_none(),
        "b saw a connection"
    );
    assert!(
        udp_roundtrip(&ns, sa(a, 5353), OPEN),
        "UDP to an allowed address"
    );
    assert!(
        !udp_roundtrip(&ns, sa(b, 5353), Duration::from_millis(800)),
        "UDP to b"
    );

    // An open connection to a, then a policy that denies all but b: the connection is cut
    // (its next packet is refused), b is allowed (allow beats deny), a is refused.
    let mut open = connect(Some(&ns), sa(a, 8080), OPEN).expect("connect to a");
    let (mut peer, _) = accept(&server_a, OPEN).expect("a accepted");
    open.write_all(b"ping").expect("write");
    assert_eq!(read_some(&mut peer, OPEN), b"ping");
    let only_b = SlotPolicy {
        allow: vec![host(b)],
        ..SlotPolicy::deny_all()
    };
    rt.block_on(pool.set_policy(&mut slot, &only_b))
        .expect("replace the policy");
    assert_eq!(slot.policy(), &only_b);
    let _ = open.write_all(b"late");
    assert!(
        read_some(&mut peer, Duration::from_millis(800)).is_empty(),
        "data crossed after the policy denied its destination"
    );
    open.set_read_timeout(Some(OPEN)).expect("timeout");
    let mut buf = [0u8; 8];
    let cut = open.read(&mut buf);
    assert!(
        matches!(&cut, Err(e) if e.kind() == ErrorKind::ConnectionReset),
        "the sandbox's end of the cut connection is reset: {cut:?}"
    );
    assert_reset(&ns, sa(a, 8080));
    assert_connects(Some(&ns), &server_b, sa(b, 8080));
    assert!(
        !udp_roundtrip(&ns, sa(a, 5353), Duration::from_millis(800)),
        "UDP to a"
    );
    assert!(udp_roundtrip(&ns, sa(b, 5353), OPEN), "UDP to b");

    // The host still reaches the agent; replies to its connections are not the policy's.
    let agent = listen(Some(&ns), sa(Ipv4Addr::UNSPECIFIED, AGENT_PORT));
    assert_connects(None, &agent, slot.agent_endpoint().into());

    // Released, the slot is open again for its next tenant.
    drop((agent, open, peer));
    rt.block_on(pool.release(slot)).expect("release");
    let next = common::acquire(&rt, &pool, &SlotPolicy::open());
    assert!(next.policy().is_open());
    let next_ns = next.netns_path();
    assert_connects(Some(&next_ns), &server_a, sa(a, 8080));
    assert_connects(Some(&next_ns), &server_b, sa(b, 8080));
    common::release_and_shut_down(&rt, pool, [next]);
}

#[test]
fn an_adopted_slot_keeps_its_policy() {
    let Some(mut ctx) = common::setup() else {
        return;
    };
    let (a, b, _, outside_ns) = ctx.internet();
    let config = ctx.config(0);
    let (rt, pool) = common::start_pool(config.clone());
    let only_a = SlotPolicy {
        allow: vec![host(a)],
        ..SlotPolicy::deny_all()
    };
    let slot = common::acquire(&rt, &pool, &only_a);
    let record = AdoptSlot::from(&slot);
    assert_eq!(record.policy.as_ref(), Some(&only_a));
    // Persisted as JSON by the server, read back after its restart.
    let record: AdoptSlot = serde_json::from_str(&serde_json::to_string(&record).unwrap()).unwrap();
    let (pool, slot) = common::crash_and_adopt(&rt, pool, slot, record, config);
    assert_eq!(slot.policy(), &only_a);
    let ns = slot.netns_path();
    let server_a = listen(Some(&outside_ns), sa(a, 8080));
    let _server_b = listen(Some(&outside_ns), sa(b, 8080));
    assert_connects(Some(&ns), &server_a, sa(a, 8080));
    assert_reset(&ns, sa(b, 8080));
    common::release_and_shut_down(&rt, pool, [slot]);
}

#[test]
fn the_operator_can_open_a_private_range_and_a_sandbox_cannot() {
    let Some(mut ctx) = common::setup() else {
        return;
    };
    ctx.outside();
    let (office, elsewhere) = (ctx.private_addr(), ctx.other_private_addr());
    let outside_ns = ctx.outside_netns();
    let mut config = ctx.config(1);
    config.allow_destinations(&[host(office)]);
    let (rt, pool) = common::start_pool(config);
    let server_office = listen(Some(&outside_ns), sa(office, 8080));
    let _server_elsewhere = listen(Some(&outside_ns), sa(elsewhere, 8080));
    // A sandbox's allowOut naming the other private address does not open it.
    let policy = SlotPolicy {
        allow: vec![host(elsewhere)],
        ..SlotPolicy::default()
    };
    let slot = common::acquire(&rt, &pool, &policy);
    let ns = slot.netns_path();
    assert_connects(Some(&ns), &server_office, sa(office, 8080));
    let err = connect(Some(&ns), sa(elsewhere, 8080), Duration::from_millis(800))
        .expect_err("still an operator-blocked range");
    assert_ne!(
        err.kind(),
        ErrorKind::TimedOut,
        "rejected, not dropped: {err}"
    );
    common::release_and_shut_down(&rt, pool, [slot]);
}

//! Private networks between slots, for real: peers reach each other at their stable
//! addresses and see each other there, names under `.internal` resolve from the slot's own
//! table, a slot outside the network reaches nobody, a port policy holds, leaving cuts open
//! connections, and a released slot leaves no link pair behind. Run as root; see
//! tests/common.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use common::dns::resolve;
use common::{accept, assert_blocked, assert_connects, connect, listen, read_some, sa, sh, OPEN};
use hickory_proto::op::ResponseCode;
use warren_net::{Slot, SlotPolicy};
use warren_runtime::peers::{Peer, Peering};

const A_ADDR: Ipv4Addr = Ipv4Addr::new(10, 230, 0, 2);
const B_ADDR: Ipv4Addr = Ipv4Addr::new(10, 230, 0, 3);

/// `me`'s view of a network holding `me` at `my_addr` and `other` at `other_addr`.
fn peering(
    other: &Slot,
    other_addr: Ipv4Addr,
    ports: &[u16],
    names: &[(&str, Ipv4Addr)],
) -> Peering {
    Peering {
        peers: vec![Peer {
            address: other_addr,
            host: other.host_side_addr(),
            ports: ports.to_vec(),
        }],
        names: names
            .iter()
            .map(|(n, ip)| (n.to_string(), *ip))
            .collect::<BTreeMap<_, _>>(),
    }
}

fn peer_links(prefix: &str) -> String {
    sh("nft", &["list", "set", "inet", prefix, "peer_links"], None).expect("list peer_links")
}

#[test]
fn peers_reach_each_other_at_stable_addresses_and_nobody_else_does() {
    let Some(ctx) = common::setup() else {
        return;
    };
    let config = ctx.config(3);
    let prefix = config.prefix.clone();
    let (rt, pool) = common::start_pool(config);
    let mut a = rt.block_on(pool.acquire(&SlotPolicy::open())).expect("a");
    let mut b = rt.block_on(pool.acquire(&SlotPolicy::open())).expect("b");
    let c = rt.block_on(pool.acquire(&SlotPolicy::open())).expect("c");
    let (a_ns, b_ns, c_ns) = (a.netns_path(), b.netns_path(), c.netns_path());
    let names = [
        ("a.net.internal", A_ADDR),
        ("b.net.internal", B_ADDR),
        ("db.net.internal", B_ADDR),
    ];
    let for_a = peering(&b, B_ADDR, &[], &names);
    let for_b = peering(&a, A_ADDR, &[], &names);
    rt.block_on(pool.set_peers(&mut a, &for_a))
        .expect("peers of a");
    rt.block_on(pool.set_peers(&mut b, &for_b))
        .expect("peers of b");

    // Each reaches the other at its stable address, and sees it coming from there.
    let b_server = listen(Some(&b_ns), sa(Ipv4Addr::UNSPECIFIED, 8000));
    let a_server = listen(Some(&a_ns), sa(Ipv4Addr::UNSPECIFIED, 9000));
    let seen = assert_connects(Some(&a_ns), &b_server, sa(B_ADDR, 8000));
    assert_eq!(
        seen.ip(),
        IpAddr::V4(A_ADDR),
        "b sees a at its network address"
    );
    let seen = assert_connects(Some(&b_ns), &a_server, sa(A_ADDR, 9000));
    assert_eq!(seen.ip(), IpAddr::V4(B_ADDR));

    // Names under .internal resolve from the slot's own table, at any DNS server address
    // the sandbox asks (the query is redirected); unknown ones are NXDOMAIN. The address
    // asked is another slot's, so nothing could leave the host if the redirect failed.
    let any_server = sa(c.host_side_addr(), 53);
    assert_eq!(
        resolve(&a_ns, any_server, "b.net.internal"),
        (ResponseCode::NoError, vec![B_ADDR])
    );
    assert_eq!(
        resolve(&a_ns, any_server, "db.net.internal"),
        (ResponseCode::NoError, vec![B_ADDR])
    );
    assert_eq!(resolve(&b_ns, any_server, "a.net.internal").1, vec![A_ADDR]);
    assert_eq!(
        resolve(&a_ns, any_server, "nobody.net.internal").0,
        ResponseCode::NXDomain
    );

    // A slot outside the network reaches neither, by stable or host-side address.
    assert_blocked(Some(&c_ns), sa(B_ADDR, 8000), Some(&b_server));
    assert_blocked(Some(&c_ns), sa(b.host_side_addr(), 8000), Some(&b_server));

    // A private network does not depend on internet access.
    rt.block_on(pool.set_policy(&mut a, &SlotPolicy::deny_all()))
        .expect("a: internet off");
    assert_connects(Some(&a_ns), &b_server, sa(B_ADDR, 8000));
    assert_eq!(resolve(&a_ns, any_server, "b.net.internal").1, vec![B_ADDR]);

    // A port policy: only 8000 between them.
    rt.block_on(pool.set_peers(&mut a, &peering(&b, B_ADDR, &[8000], &names)))
        .unwrap();
    rt.block_on(pool.set_peers(&mut b, &peering(&a, A_ADDR, &[8000], &names)))
        .unwrap();
    assert_connects(Some(&a_ns), &b_server, sa(B_ADDR, 8000));
    let b_other = listen(Some(&b_ns), sa(Ipv4Addr::UNSPECIFIED, 8001));
    assert_blocked(Some(&a_ns), sa(B_ADDR, 8001), Some(&b_other));
    assert_blocked(Some(&b_ns), sa(A_ADDR, 9000), Some(&a_server));

    // Leaving cuts what was open.
    let mut open = connect(Some(&a_ns), sa(B_ADDR, 8000), OPEN).expect("connect before leaving");
    let (mut accepted, _) = accept(&b_server, OPEN).expect("accepted");
    open.write_all(b"ping").unwrap();
    assert_eq!(read_some(&mut accepted, OPEN), b"ping");
    assert!(
        peer_links(&prefix).contains(a.name()),
        "{}",
        peer_links(&prefix)
    );
    rt.block_on(pool.set_peers(&mut a, &Peering::default()))
        .unwrap();
    rt.block_on(pool.set_peers(&mut b, &Peering::default()))
        .unwrap();
    open.write_all(b"late").expect("buffered locally");
    assert!(
        read_some(&mut accepted, Duration::from_millis(800)).is_empty(),
        "data crossed after leaving the network"
    );
    assert_blocked(Some(&a_ns), sa(B_ADDR, 8000), Some(&b_server));
    assert!(
        !peer_links(&prefix).contains(a.name()),
        "{}",
        peer_links(&prefix)
    );

    // Joined again, then a is released: no pair with its link stays on the host.
    rt.block_on(pool.set_peers(&mut a, &for_a)).unwrap();
    rt.block_on(pool.set_peers(&mut b, &for_b)).unwrap();
    let a_name = a.name().to_string();
    assert!(peer_links(&prefix).contains(&a_name));
    drop((open, accepted));
    rt.block_on(pool.release(a)).expect("release a");
    assert!(
        !peer_links(&prefix).contains(&a_name),
        "{}",
        peer_links(&prefix)
    );

    common::release_and_shut_down(&rt, pool, [b, c]);
}

#[test]
fn the_watchdog_restores_peer_links() {
    let Some(ctx) = common::setup() else {
        return;
    };
    let config = ctx.config(2);
    let prefix = config.prefix.clone();
    let (rt, pool) = common::start_pool(config);
    let mut a = rt.block_on(pool.acquire(&SlotPolicy::open())).expect("a");
    let mut b = rt.block_on(pool.acquire(&SlotPolicy::open())).expect("b");
    rt.block_on(pool.set_peers(&mut a, &peering(&b, B_ADDR, &[], &[])))
        .unwrap();
    rt.block_on(pool.set_peers(&mut b, &peering(&a, A_ADDR, &[], &[])))
        .unwrap();
    assert_eq!(
        rt.block_on(pool.check_host_table()).unwrap(),
        warren_net::TableCheck::Intact,
        "the pool's own link pairs are not a change"
    );
    sh(
        "nft",
        &["flush", "set", "inet", &prefix, "peer_links"],
        None,
    )
    .unwrap();
    assert_eq!(
        rt.block_on(pool.check_host_table()).unwrap(),
        warren_net::TableCheck::RestoredAltered
    );
    let links = peer_links(&prefix);
    assert!(
        links.contains(a.name()) && links.contains(b.name()),
        "{links}"
    );
    let b_server = listen(Some(&b.netns_path()), sa(Ipv4Addr::UNSPECIFIED, 8000));
    assert_connects(Some(&a.netns_path()), &b_server, sa(B_ADDR, 8000));
    common::release_and_shut_down(&rt, pool, [a, b]);
}

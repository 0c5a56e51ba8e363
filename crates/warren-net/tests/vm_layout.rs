//! A slot laid out the way the vm runtime lays it out (the sandbox address behind `tap0`,
//! the slot routing between `tap0` and `eth0`), with a network namespace standing in for
//! the guest on a veth named `tap0`: the in-slot filter must let the guest work exactly like
//! a namespace sandbox, and confine it the same way. Run as root; see tests/common.

mod common;

use std::net::Ipv4Addr;

use common::{assert_blocked, assert_connects, listen, sa, sh};
use warren_net::{
    netns, SlotPolicy, TableCheck, AGENT_PORT, GATEWAY_MAC, SANDBOX_ADDR, SANDBOX_GATEWAY,
    SANDBOX_IFACE, SANDBOX_MAC, SANDBOX_PREFIX_LEN, TAP_IFACE,
};

#[test]
fn a_guest_behind_tap0_is_served_and_confined_by_both_layers() {
    let Some(mut ctx) = common::setup() else {
        return;
    };
    let outside = ctx.outside();
    let (out_addr, out_host) = (outside.addr, outside.host_addr);
    let outside_ns = ctx.outside_netns();
    let mut config = ctx.config(1);
    config.table_check_interval_ms = 0;
    let prefix = config.prefix.clone();
    let pool_cidr = config.host_cidr.to_string();
    let (rt, pool) = common::start_pool(config);
    let slot = common::acquire(&rt, &pool, &SlotPolicy::open());
    let name = slot.name().to_owned();

    // The guest: its own netns (named with the test prefix, so the guard removes it).
    let guest = format!("{prefix}g");
    sh("ip", &["netns", "add", &guest], None).expect("guest netns");
    let slot_batch = format!(
        "link add name {TAP_IFACE} address {GATEWAY_MAC} type veth peer name {SANDBOX_IFACE} \
         address {SANDBOX_MAC} netns {guest}
address del {SANDBOX_ADDR}/{SANDBOX_PREFIX_LEN} dev {SANDBOX_IFACE}
neigh replace 169.254.0.1 lladdr {GATEWAY_MAC} dev {SANDBOX_IFACE} nud permanent
route replace default via 169.254.0.1 dev {SANDBOX_IFACE} onlink
link set dev {TAP_IFACE} addrgenmode none
address add {SANDBOX_GATEWAY}/{SANDBOX_PREFIX_LEN} dev {TAP_IFACE}
link set dev {TAP_IFACE} up
"
    );
    sh("ip", &["-n", &name, "-batch", "-"], Some(&slot_batch)).expect("vm layout");
    sh(
        "ip",
        &[
            "netns",
            "exec",
            &name,
            "sysctl",
            "-qw",
            "net.ipv4.ip_forward=1",
        ],
        None,
    )
    .expect("forwarding in the slot");
    let guest_batch = format!(
        "link set dev lo up
link set dev {SANDBOX_IFACE} addrgenmode none
address add {SANDBOX_ADDR}/{SANDBOX_PREFIX_LEN} dev {SANDBOX_IFACE}
link set dev {SANDBOX_IFACE} up
route add default via {SANDBOX_GATEWAY} dev {SANDBOX_IFACE}
"
    );
    sh("ip", &["-n", &guest, "-batch", "-"], Some(&guest_batch)).expect("guest layout");
    let guest_ns = netns::netns_path(&guest);

    let agent = listen(Some(&guest_ns), sa(Ipv4Addr::UNSPECIFIED, AGENT_PORT));
    let server = listen(Some(&outside_ns), sa(out_addr, 8080));
    let host_any = listen(None, sa(Ipv4Addr::UNSPECIFIED, 0));
    let host_port = host_any.local_addr().expect("addr").port();
    let probe = |what: &str| {
        // The host reaches the guest's agent; the guest reaches the internet ...
        assert_connects(None, &agent, slot.agent_endpoint().into());
        let peer = assert_connects(Some(&guest_ns), &server, sa(out_addr, 8080));
        // ... but neither the host nor the pool.
        for ip in [slot.host_veth_addr(), out_host, slot.host_side_addr()] {
            assert_blocked(Some(&guest_ns), sa(ip, host_port), Some(&host_any));
        }
        eprintln!("{what}: guest traffic arrives from {peer}");
        peer
    };

    // Both layers.
    let peer = probe("both layers");
    assert_eq!(peer.ip(), std::net::IpAddr::V4(out_host), "masqueraded");

    // The in-slot layer alone (forward path: tap0 -> eth0).
    ctx.route_pool_back(&pool_cidr);
    common::delete_host_table(&prefix);
    let peer = probe("in-slot layer only");
    assert_eq!(peer.ip(), std::net::IpAddr::V4(slot.host_side_addr()));
    let verdict = rt.block_on(pool.check_host_table()).expect("check");
    assert_eq!(verdict, TableCheck::RestoredMissing);

    // Back to the namespace layout before release, as the vm runtime does.
    drop(agent);
    let back = format!(
        "link del dev {TAP_IFACE}
address add {SANDBOX_ADDR}/{SANDBOX_PREFIX_LEN} dev {SANDBOX_IFACE}
route replace default via {SANDBOX_GATEWAY} dev {SANDBOX_IFACE}
neigh del 169.254.0.1 dev {SANDBOX_IFACE}
"
    );
    sh("ip", &["-n", &name, "-batch", "-"], Some(&back)).expect("ns layout");
    common::release_and_shut_down(&rt, pool, [slot]);
}

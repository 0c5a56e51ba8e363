//! The flow log hears of what a slot's filter decides by address (through NFLOG): an
//! allowed connection, one refused by the sandbox's policy, one into a range only the
//! operator may open, a UDP flow. Run as root; see tests/common.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{assert_connects, connect, listen, sa, udp_echo, udp_roundtrip, OPEN};
use warren_net::{Ipv4Cidr, NetPool, SlotPolicy};
use warren_runtime::flows::{Flow, FlowKind, FlowVerdict};

/// `owner`'s log once it holds an entry for which `pred` holds (or what it holds after 10 s).
fn wait_for(pool: &NetPool, owner: &str, pred: impl Fn(&Flow) -> bool) -> Vec<Flow> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let flows = pool.flows(owner);
        if flows.iter().any(&pred) || Instant::now() > deadline {
            return flows;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The entry of the test slot's log for `destination`, once there is one; `what` names it
/// when there is none.
fn logged(pool: &NetPool, destination: SocketAddr, what: &str) -> Flow {
    let to = |f: &Flow| f.destination.as_deref() == Some(&*destination.to_string());
    let flows = wait_for(pool, "sbx-flows", to);
    let found = flows.iter().find(|f| to(f)).cloned();
    found.unwrap_or_else(|| panic!("{what} is logged: {flows:?}"))
}

#[test]
fn connections_decided_by_address_are_logged() {
    let Some(mut ctx) = common::setup() else {
        return;
    };
    let (a, b, blocked, outside_ns) = ctx.internet();
    let (rt, pool) = common::start_pool(ctx.config(1));
    let server_a = listen(Some(&outside_ns), sa(a, 8080));
    let _echo = udp_echo(&outside_ns, sa(a, 5353));
    let policy = SlotPolicy {
        deny: vec![Ipv4Cidr::new(b, 32).unwrap()],
        ..SlotPolicy::default()
    };
    let slot = common::acquire(&rt, &pool, &policy);
    pool.set_owner(&slot, "sbx-flows");
    let ns = slot.netns_path();
    // The reader binds in the background: wait until an allowed connection shows up.
    let mut first = None;
    for _ in 0..50 {
        assert_connects(Some(&ns), &server_a, sa(a, 8080));
        let flows = pool.flows("sbx-flows");
        if let Some(f) = flows
            .iter()
            .find(|f| f.destination.as_deref() == Some(&*format!("{a}:8080")))
        {
            first = Some(f.clone());
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let allowed = first.expect("an allowed connection is logged");
    assert_eq!(allowed.kind, FlowKind::Tcp);
    assert_eq!(allowed.verdict, FlowVerdict::Allowed);
    assert_eq!(allowed.via, "address");

    let _ = connect(Some(&ns), sa(b, 8080), OPEN).expect_err("b is denied");
    let denied = logged(&pool, sa(b, 8080), "the refused connection");
    assert_eq!(denied.verdict, FlowVerdict::Denied);
    assert!(
        denied.reason.as_deref().unwrap().contains("policy"),
        "{denied:?}"
    );

    let _ = connect(Some(&ns), sa(blocked, 8080), Duration::from_millis(500));
    let range = logged(&pool, sa(blocked, 8080), "the blocked range");
    assert_eq!(range.verdict, FlowVerdict::Denied);
    assert!(
        range.reason.as_deref().unwrap().contains("operator"),
        "{range:?}"
    );

    assert!(udp_roundtrip(&ns, sa(a, 5353), OPEN));
    let flows = wait_for(&pool, "sbx-flows", |f| f.kind == FlowKind::Udp);
    assert!(
        flows.iter().any(|f| f.kind == FlowKind::Udp
            && f.verdict == FlowVerdict::Allowed
            && f.destination.as_deref() == Some(&*format!("{a}:5353"))),
        "{flows:?}"
    );

    common::release_and_shut_down(&rt, pool, [slot]);
}

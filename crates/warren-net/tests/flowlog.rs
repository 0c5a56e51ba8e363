//! The flow log hears of what a slot's filter decides by address (through NFLOG): an
//! allowed connection, one refused by the sandbox's policy, one into a range only the
//! operator may open, a UDP flow. Run as root; see tests/common.

mod common;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use common::{assert_connects, connect, listen, udp_echo, udp_roundtrip, OPEN};
use warren_net::{Ipv4Cidr, NetPool, SlotPolicy};
use warren_runtime::flows::{Flow, FlowKind, FlowVerdict};

fn sa(ip: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(ip, port))
}

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

#[test]
fn connections_decided_by_address_are_logged() {
    let Some(mut ctx) = common::setup() else {
        return;
    };
    let a = ctx.outside().addr;
    let b = ctx.outside_second();
    let blocked = ctx.private_addr();
    let outside_ns = ctx.outside_netns();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let pool = rt
        .block_on(NetPool::start(ctx.config(1)))
        .expect("start pool");
    let server_a = listen(Some(&outside_ns), sa(a, 8080));
    let _echo = udp_echo(&outside_ns, sa(a, 5353));
    let policy = SlotPolicy {
        deny: vec![Ipv4Cidr::new(b, 32).unwrap()],
        ..SlotPolicy::default()
    };
    let slot = rt.block_on(pool.acquire(&policy)).expect("acquire");
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
    let flows = wait_for(&pool, "sbx-flows", |f| {
        f.destination.as_deref() == Some(&*format!("{b}:8080"))
    });
    let denied = flows
        .iter()
        .find(|f| f.destination.as_deref() == Some(&*format!("{b}:8080")))
        .unwrap_or_else(|| panic!("the refused connection is logged: {flows:?}"));
    assert_eq!(denied.verdict, FlowVerdict::Denied);
    assert!(
        denied.reason.as_deref().unwrap().contains("policy"),
        "{denied:?}"
    );

    let _ = connect(Some(&ns), sa(blocked, 8080), Duration::from_millis(500));
    let flows = wait_for(&pool, "sbx-flows", |f| {
        f.destination.as_deref() == Some(&*format!("{blocked}:8080"))
    });
    let range = flows
        .iter()
        .find(|f| f.destination.as_deref() == Some(&*format!("{blocked}:8080")))
        .unwrap_or_else(|| panic!("the blocked range is logged: {flows:?}"));
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

    rt.block_on(pool.release(slot)).unwrap();
    rt.block_on(pool.shutdown()).unwrap();
}

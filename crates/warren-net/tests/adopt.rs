//! A restarted server adopts the slots of sandboxes that kept running. Run as root; see
//! tests/common.

mod common;

use std::collections::HashSet;
use std::io::Write;
use std::net::Ipv4Addr;

use common::{
    accept, assert_blocked, assert_connects, connect, egress_blocked, listen, read_some, sa,
    slot_links, slot_netns, wait_for, OPEN, SETTLE,
};
use warren_net::{AdoptSlot, Error, NetConfig, NetPool, Slot, SlotPolicy, AGENT_PORT};

/// Writes `data` on `from` and checks that `to` receives it.
fn assert_flows(from: &mut std::net::TcpStream, to: &mut std::net::TcpStream, data: &[u8]) {
    from.write_all(data).expect("write");
    let got = read_some(to, OPEN);
    if got != data {
        common::dump_diagnostics();
        panic!("expected {data:?} across the connection, got {got:?}");
    }
}

#[test]
fn a_restarted_pool_adopts_running_slots() {
    let Some(mut ctx) = common::setup() else {
        return;
    };
    let p = ctx.prefix.clone();
    let server_ip = ctx.outside().addr;
    let outside_ns = ctx.outside_netns();
    let server = listen(Some(&outside_ns), sa(Ipv4Addr::UNSPECIFIED, 8080));
    let target = sa(server_ip, 8080);
    let config = ctx.config(2);

    // The first server: two sandboxes, one without internet access, each with an agent.
    let (rt, pool) = common::start_pool(config.clone());
    rt.block_on(pool.fill()).expect("fill");
    let a = common::acquire(&rt, &pool, &SlotPolicy::open());
    let b = common::acquire(&rt, &pool, &SlotPolicy::deny_all());
    wait_for(SETTLE, "refill", || pool.stats().ready == 2);
    let (a_ns, b_ns) = (a.netns_path(), b.netns_path());
    let agent_a = listen(Some(&a_ns), sa(Ipv4Addr::UNSPECIFIED, AGENT_PORT));
    let agent_b = listen(Some(&b_ns), sa(Ipv4Addr::UNSPECIFIED, AGENT_PORT));
    assert_connects(None, &agent_a, a.agent_endpoint().into());
    assert_connects(Some(&a_ns), &server, target);
    assert_blocked(Some(&b_ns), target, Some(&server));

    // Connections that are open when the server goes down: host -> agent, sandbox -> out.
    let mut to_agent = connect(None, a.agent_endpoint().into(), OPEN).expect("connect agent");
    let (mut agent_side, _) = accept(&agent_a, OPEN).expect("agent accepted");
    let mut egress = connect(Some(&a_ns), target, OPEN).expect("connect out");
    let (mut server_side, _) = accept(&server, OPEN).expect("server accepted");

    // What the server keeps in its database.
    let records: Vec<AdoptSlot> = [&a, &b].into_iter().map(AdoptSlot::from).collect();
    assert_eq!(
        records,
        vec![
            AdoptSlot {
                index: a.index(),
                allow_internet_access: true,
                policy: None,
            },
            AdoptSlot {
                index: b.index(),
                allow_internet_access: false,
                policy: Some(SlotPolicy::deny_all()),
            },
        ]
    );
    let before: Vec<(String, u32, Ipv4Addr)> = [&a, &b]
        .iter()
        .map(|s| (s.name().to_owned(), s.index(), s.host_side_addr()))
        .collect();
    let ready_before: HashSet<String> = slot_netns(&p)
        .into_iter()
        .filter(|n| n != a.name() && n != b.name())
        .collect();
    assert_eq!(ready_before.len(), 2);

    // Crash: the sandboxes (and their sockets) live on, the server's pool is gone.
    std::mem::forget(a);
    std::mem::forget(b);
    drop(pool);

    // The restarted server adopts both slots.
    let (pool, adopted) = rt
        .block_on(NetPool::start_adopting(config.clone(), records.clone()))
        .expect("restart pool");
    let adopted: Vec<Slot> = adopted
        .into_iter()
        .map(|r| r.expect("slot adopted"))
        .collect();
    let after: Vec<(String, u32, Ipv4Addr)> = adopted
        .iter()
        .map(|s| (s.name().to_owned(), s.index(), s.host_side_addr()))
        .collect();
    assert_eq!(after, before);
    let [a, b] = <[Slot; 2]>::try_from(adopted).expect("two slots");
    assert!(a.internet_access() && !b.internet_access());
    assert_eq!(pool.stats().in_use, 2);
    // Only the old pool's ready slots were stale.
    let removed: HashSet<String> = pool.startup_cleanup().netns.iter().cloned().collect();
    assert_eq!(removed, ready_before);

    // Nothing was cut: open connections carry data both ways, the agents are reachable at
    // the same addresses, and egress is as it was.
    assert_flows(&mut to_agent, &mut agent_side, b"host to agent");
    assert_flows(&mut agent_side, &mut to_agent, b"agent to host");
    assert_flows(&mut egress, &mut server_side, b"sandbox to internet");
    assert_flows(&mut server_side, &mut egress, b"internet to sandbox");
    assert_connects(None, &agent_a, a.agent_endpoint().into());
    assert_connects(None, &agent_b, b.agent_endpoint().into());
    assert_connects(Some(&a_ns), &server, target);
    assert_blocked(Some(&b_ns), target, Some(&server));
    assert!(!egress_blocked(&p, a.name()));
    assert!(egress_blocked(&p, b.name()));

    // The pool never hands out an adopted index.
    rt.block_on(pool.fill()).expect("fill");
    let adopted_indices = [a.index(), b.index()];
    let fresh: Vec<Slot> = (0..3)
        .map(|_| common::acquire(&rt, &pool, &SlotPolicy::open()))
        .collect();
    for s in &fresh {
        assert!(!adopted_indices.contains(&s.index()), "{} reused", s.name());
    }
    let mut all: Vec<u32> = fresh.iter().map(Slot::index).collect();
    all.extend(adopted_indices);
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 5);
    assert_eq!(pool.stats().in_use, 5);
    for s in fresh {
        rt.block_on(pool.release(s)).expect("release fresh");
    }

    // Adopted slots are released like any other: b's egress is reset on the way.
    drop((to_agent, agent_side, egress, server_side, agent_a, agent_b));
    let b_name = b.name().to_owned();
    rt.block_on(pool.release(b)).expect("release adopted b");
    assert!(!egress_blocked(&p, &b_name));
    // ... or dropped, which hands them to the background task.
    drop(a);
    wait_for(SETTLE, "dropped adopted slot recycled", || {
        pool.stats().in_use == 0
    });
    assert_eq!(pool.stats().broken, 0);
    let s = rt
        .block_on(pool.acquire(&SlotPolicy::open()))
        .expect("acquire after release");
    rt.block_on(pool.release(s)).expect("release");

    rt.block_on(pool.shutdown()).expect("shutdown");
    // Everything but the outside world (removed by the guard).
    let outside = format!("{p}x");
    let left: Vec<String> = common::leftovers(&p)
        .into_iter()
        .filter(|o| !o.ends_with(&outside))
        .collect();
    assert_eq!(left, Vec::<String>::new());
}

#[test]
fn missing_or_broken_slots_are_not_adopted_and_removed() {
    let Some(ctx) = common::setup() else { return };
    let p = ctx.prefix.clone();
    let config = ctx.config(0);

    let (rt, pool) = common::start_pool(config.clone());
    let mut slots = Vec::new();
    for _ in 0..4 {
        slots.push(common::acquire(&rt, &pool, &SlotPolicy::deny_all()));
    }
    let names: Vec<String> = slots.iter().map(|s| s.name().to_owned()).collect();
    let indices: Vec<u32> = slots.iter().map(Slot::index).collect();
    let neighbour = slots[3].host_side_addr().to_string();
    for s in slots {
        std::mem::forget(s);
    }
    drop(pool);

    // Slot 0 stays intact; the others lose their netns, their NAT table, their neighbour
    // entry.
    common::sh("ip", &["netns", "del", &names[1]], None).expect("netns del");
    common::sh(
        "ip",
        &[
            "netns", "exec", &names[2], "nft", "delete", "table", "ip", &p,
        ],
        None,
    )
    .expect("delete slot NAT table");
    common::sh("ip", &["neigh", "del", &neighbour, "dev", &names[3]], None).expect("neigh del");

    let record = |index| AdoptSlot {
        index,
        allow_internet_access: false,
        policy: None,
    };
    let unknown = 40; // inside the /24 (64 slots), never created
    let records = vec![
        record(indices[0]),
        record(indices[1]),
        record(indices[2]),
        record(indices[3]),
        record(unknown),
        record(indices[0]), // twice
        record(1000),       // beyond the pool
    ];
    let (pool, results) = rt
        .block_on(NetPool::start_adopting(config.clone(), records))
        .expect("restart pool");
    let mut results = results.into_iter();
    let good = results
        .next()
        .expect("result")
        .expect("intact slot adopted");
    assert_eq!(good.name(), names[0]);
    assert!(!good.internet_access());
    let expected = [
        (names[1].clone(), "network namespace"),
        (names[2].clone(), "NAT table"),
        (names[3].clone(), "neighbour"),
        (format!("{p}-{unknown}"), "network namespace"),
        (names[0].clone(), "more than once"),
        (format!("{p}-1000"), "beyond"),
    ];
    for (result, (name, why)) in results.zip(expected) {
        match result {
            Err(Error::NotAdoptable {
                name: got_name,
                reason,
            }) => {
                assert_eq!(got_name, name);
                assert!(reason.contains(why), "{name}: {reason}");
            }
            other => panic!("{name}: expected NotAdoptable, got {other:?}"),
        }
    }

    // The broken slots' remains are gone; the adopted one is untouched and still has its
    // egress off.
    let only_good: HashSet<String> = [names[0].clone()].into();
    assert_eq!(slot_netns(&p), only_good);
    wait_for(SETTLE, "links of broken slots removed", || {
        slot_links(&p) == only_good
    });
    for name in &names[1..] {
        assert!(!egress_blocked(&p, name), "{name} still in no_egress");
    }
    assert!(egress_blocked(&p, good.name()));
    assert_eq!(pool.stats().in_use, 1);

    // Its index is not handed out again, the freed ones are.
    let next = common::acquire(&rt, &pool, &SlotPolicy::open());
    assert_ne!(next.index(), good.index());
    rt.block_on(pool.release(next)).expect("release");
    rt.block_on(pool.release(good)).expect("release adopted");
    assert!(slot_netns(&p).is_empty(), "pool_size 0 keeps nothing");

    rt.block_on(pool.shutdown()).expect("shutdown");
    assert_eq!(common::leftovers(&p), Vec::<String>::new());
}

#[test]
fn adopting_nothing_is_a_plain_start() {
    let Some(ctx) = common::setup() else { return };
    let p = ctx.prefix.clone();
    let config = ctx.config(1);
    let (rt, pool) = common::start_pool(config.clone());
    let slot = common::acquire(&rt, &pool, &SlotPolicy::deny_all());
    std::mem::forget(slot);
    rt.block_on(pool.fill()).expect("fill");
    drop(pool);

    // Restarted with no ready slots to keep: one filled in the background would race the
    // check that the old ones are gone.
    let restart = NetConfig {
        pool_size: 0,
        ..config
    };
    let (pool, adopted) = rt
        .block_on(NetPool::start_adopting(restart, Vec::new()))
        .expect("restart pool");
    assert!(adopted.is_empty());
    assert_eq!(pool.startup_cleanup().netns.len(), 2);
    assert!(slot_netns(&p).is_empty());
    let set = common::sh("nft", &["list", "set", "inet", &p, "no_egress"], None).expect("set");
    assert!(!set.contains("elements"), "{set}");
    rt.block_on(pool.shutdown()).expect("shutdown");
    assert_eq!(common::leftovers(&p), Vec::<String>::new());
}

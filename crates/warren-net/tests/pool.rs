//! The slot pool: acquire, release, recycling, crash cleanup, DNS data. Run as root.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{egress_blocked, rt, slot_netns, wait_for, SETTLE};
use warren_net::{cleanup_stale, DnsSource, Error, NetPool, SlotPolicy};

#[test]
fn acquire_release_and_recycle() {
    let Some(ctx) = common::setup() else { return };
    let p = ctx.prefix.clone();
    let (rt, pool) = common::start_pool(ctx.config(2));
    rt.block_on(pool.fill()).expect("fill");
    let stats = pool.stats();
    assert_eq!((stats.ready, stats.in_use, stats.target), (2, 0, 2));
    let ready_names = slot_netns(&p);
    assert_eq!(ready_names.len(), 2);

    // Two come from the pool, the third is built on demand.
    let a = common::acquire(&rt, &pool, &SlotPolicy::open());
    let mut b = common::acquire(&rt, &pool, &SlotPolicy::open());
    let c = common::acquire(&rt, &pool, &SlotPolicy::deny_all());
    assert!(ready_names.contains(a.name()) && ready_names.contains(b.name()));
    assert!(!c.internet_access());
    assert!(egress_blocked(&p, c.name()));
    assert_eq!(pool.stats().in_use, 3);
    // The background task refills behind the leases.
    wait_for(SETTLE, "refill", || pool.stats().ready == 2);
    assert_eq!(slot_netns(&p).len(), 5);

    // Releasing into a full pool destroys the slot and resets its egress state.
    let c_name = c.name().to_owned();
    rt.block_on(pool.release(c)).expect("release c");
    assert!(!slot_netns(&p).contains(&c_name));
    assert!(!egress_blocked(&p, &c_name));
    rt.block_on(pool.release(a)).expect("release a");
    assert_eq!(slot_netns(&p).len(), 3);

    // Releasing into a full pool also clears the no-egress state of the destroyed slot.
    rt.block_on(pool.set_policy(&mut b, &SlotPolicy::deny_all()))
        .expect("internet off");
    let b_name = b.name().to_owned();
    assert!(egress_blocked(&p, &b_name));
    rt.block_on(pool.release(b)).expect("release b");
    assert!(!slot_netns(&p).contains(&b_name));
    assert!(!egress_blocked(&p, &b_name));

    rt.block_on(pool.shutdown()).expect("shutdown");
    assert_eq!(common::leftovers(&p), Vec::<String>::new());
}

#[test]
fn released_slots_are_reset_and_reused() {
    let Some(ctx) = common::setup() else { return };
    let p = ctx.prefix.clone();
    let rt = rt();
    // max_slots = pool_size: the pool cannot refill behind leases, so releases go back to
    // the pool instead of being destroyed.
    let mut config = ctx.config(2);
    config.max_slots = Some(2);
    let pool = rt.block_on(NetPool::start(config)).expect("start pool");
    rt.block_on(pool.fill()).expect("fill");
    let mut x = common::acquire(&rt, &pool, &SlotPolicy::open());
    let y = common::acquire(&rt, &pool, &SlotPolicy::deny_all());
    match rt.block_on(pool.acquire(&SlotPolicy::open())) {
        Err(Error::Exhausted { max: 2 }) => {}
        other => panic!("expected Exhausted, got {other:?}"),
    }
    rt.block_on(pool.set_policy(&mut x, &SlotPolicy::deny_all()))
        .expect("internet off");
    let names: HashSet<String> = [x.name().to_owned(), y.name().to_owned()].into();
    rt.block_on(pool.release(x)).expect("release");
    rt.block_on(pool.release(y)).expect("release");
    assert_eq!(pool.stats().ready, 2);
    assert_eq!(
        slot_netns(&p),
        names,
        "released slots are kept, not rebuilt"
    );
    assert!(
        names.iter().all(|n| !egress_blocked(&p, n)),
        "internet access is back on"
    );

    let z = common::acquire(&rt, &pool, &SlotPolicy::open());
    assert!(names.contains(z.name()));
    assert!(z.internet_access());

    // A slot dropped without release is recycled by the background task.
    let z_name = z.name().to_owned();
    drop(z);
    wait_for(SETTLE, "dropped slot recycled", || pool.stats().ready == 2);
    assert!(slot_netns(&p).contains(&z_name));
    assert_eq!(pool.stats().in_use, 0);

    rt.block_on(pool.shutdown()).expect("shutdown");
    assert_eq!(common::leftovers(&p), Vec::<String>::new());
}

#[test]
fn a_new_pool_removes_what_a_crashed_one_left() {
    let Some(ctx) = common::setup() else { return };
    let p = ctx.prefix.clone();
    let config = ctx.config(2);

    // "Crash": fill, lease one with egress off, then drop everything without teardown.
    let (rt, pool) = common::start_pool(config.clone());
    rt.block_on(pool.fill()).expect("fill");
    let slot = common::acquire(&rt, &pool, &SlotPolicy::deny_all());
    wait_for(SETTLE, "refill", || pool.stats().ready == 2);
    std::mem::forget(slot);
    drop(pool);
    let before = common::leftovers(&p);
    assert_eq!(slot_netns(&p).len(), 3, "{before:?}");
    assert!(
        before.iter().any(|o| o == &format!("table inet {p}")),
        "{before:?}"
    );

    // Standalone cleanup (no pool): everything with the prefix goes.
    let report = rt.block_on(cleanup_stale(&config)).expect("cleanup");
    assert_eq!(report.netns.len(), 3, "{report:?}");
    assert_eq!(report.links.len(), 3, "{report:?}");
    assert_eq!(report.tables, vec![format!("inet {p}")]);
    assert_eq!(common::leftovers(&p), Vec::<String>::new());
    let listing = common::sh("ip", &["netns", "list"], None).expect("ip netns list")
        + &common::sh("ip", &["link"], None).expect("ip link")
        + &common::sh("nft", &["list", "tables"], None).expect("nft list tables");
    assert!(!listing.contains(&p), "{listing}");

    // Crash again; this time the next pool cleans up on start.
    let pool = rt
        .block_on(NetPool::start(config.clone()))
        .expect("start pool");
    rt.block_on(pool.fill()).expect("fill");
    drop(pool);
    let pool = rt
        .block_on(NetPool::start(config.clone()))
        .expect("restart pool");
    assert_eq!(pool.startup_cleanup().netns.len(), 2);

    // Only one pool per prefix at a time: the second start is refused, not destructive.
    match rt.block_on(NetPool::start(config.clone())) {
        Err(Error::PrefixInUse { .. }) => {}
        Err(e) => panic!("expected PrefixInUse, got {e}"),
        Ok(_) => panic!("two pools on one prefix"),
    }
    match rt.block_on(cleanup_stale(&config)) {
        Err(Error::PrefixInUse { .. }) => {}
        other => panic!("expected PrefixInUse, got {other:?}"),
    }

    // A live pool's own cleanup removes strangers with its prefix but keeps its slots.
    rt.block_on(pool.fill()).expect("fill");
    let stray = format!("{p}-999");
    common::sh("ip", &["netns", "add", &stray], None).expect("add stray netns");
    let report = rt.block_on(pool.cleanup_stale()).expect("cleanup");
    assert_eq!(report.netns, vec![stray.clone()]);
    assert!(report.tables.is_empty());
    assert_eq!(slot_netns(&p).len(), 2);
    let slot = rt
        .block_on(pool.acquire(&SlotPolicy::open()))
        .expect("pool still works");
    rt.block_on(pool.release(slot)).expect("release");

    rt.block_on(pool.shutdown()).expect("shutdown");
    assert_eq!(common::leftovers(&p), Vec::<String>::new());
}

#[test]
fn resolv_conf_names_the_hosts_upstream_servers() {
    let Some(ctx) = common::setup() else { return };
    let rt = rt();
    let mut config = ctx.config(0);
    config.dns = DnsSource::Host;
    let pool = rt.block_on(NetPool::start(config)).expect("start pool");
    let slot = common::acquire(&rt, &pool, &SlotPolicy::open());
    let conf = slot.resolv_conf().to_owned();
    assert_eq!(conf, pool.resolv_conf());

    let servers = warren_net::parse_nameservers(&conf);
    assert!(servers.len() <= 3, "{conf}");
    assert!(
        servers.iter().all(|s| s.is_ipv4() && !s.is_loopback()),
        "{conf}"
    );
    let host = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let host_upstreams: Vec<_> = warren_net::parse_nameservers(&host)
        .into_iter()
        .filter(|s| s.is_ipv4() && !s.is_loopback())
        .take(3)
        .collect();
    if !host_upstreams.is_empty() {
        assert_eq!(servers, host_upstreams, "{conf}");
    }
    for line in conf.lines() {
        let word = line.split_whitespace().next().unwrap_or("#");
        assert!(
            ["#", "nameserver", "options"].contains(&word) || word.starts_with('#'),
            "unexpected resolv.conf line: {line}"
        );
    }
    common::release_and_shut_down(&rt, pool, [slot]);
}

#[test]
fn a_pool_refuses_an_address_range_in_use() {
    let Some(ctx) = common::setup() else { return };
    let rt = rt();
    let config = ctx.config(0);
    // A foreign route inside the pool's range, on a link that is not a slot (a veth pair:
    // this kernel has no dummy links).
    let dummy = format!("{}d", ctx.prefix);
    let peer = format!("{}e", ctx.prefix);
    let route = config.host_cidr.nth(8).expect("in range").to_string();
    common::sh(
        "ip",
        &["link", "add", &dummy, "type", "veth", "peer", "name", &peer],
        None,
    )
    .expect("add veth");
    common::sh("ip", &["link", "set", &dummy, "up"], None).expect("dummy up");
    common::sh(
        "ip",
        &["route", "add", &format!("{route}/32"), "dev", &dummy],
        None,
    )
    .expect("add route");
    match rt.block_on(NetPool::start(config)) {
        Err(Error::RangeInUse { .. }) => {}
        Err(e) => panic!("expected RangeInUse, got {e}"),
        Ok(_) => panic!("pool started on a range in use"),
    }
}

#[test]
fn cancelled_operations_do_not_leak_slots() {
    let Some(ctx) = common::setup() else { return };
    let p = ctx.prefix.clone();
    let rt = rt();
    // pool_size 0: every slot that comes back is destroyed, so leaks are easy to see.
    let pool = rt
        .block_on(NetPool::start(ctx.config(0)))
        .expect("start pool");
    for allow in [true, false] {
        // Cancelled while the slot is being built on demand.
        let cancelled = rt.block_on(async {
            tokio::time::timeout(
                Duration::from_micros(1),
                pool.acquire(&if allow {
                    SlotPolicy::open()
                } else {
                    SlotPolicy::deny_all()
                }),
            )
            .await
        });
        assert!(cancelled.is_err(), "acquire finished in 1 us?");
    }
    // Cancelled while being released.
    let slot = common::acquire(&rt, &pool, &SlotPolicy::deny_all());
    let _ = rt.block_on(async {
        tokio::time::timeout(Duration::from_micros(1), pool.release(slot)).await
    });
    wait_for(SETTLE, "orphaned slots returned and removed", || {
        let s = pool.stats();
        s.in_use == 0 && s.ready == 0 && slot_netns(&p).is_empty()
    });
    assert_eq!(pool.stats().broken, 0);
    rt.block_on(pool.shutdown()).expect("shutdown");
    assert_eq!(common::leftovers(&p), Vec::<String>::new());
}

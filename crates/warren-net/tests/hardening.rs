//! Isolation that must hold even when the host is not cooperating: other local users, a
//! flushed host firewall, connection floods. Run as root; see tests/common.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{
    accept, assert_blocked, assert_connects, connect, host_primary_addrs, listen, sa, sh, wait_for,
    OPEN,
};
use warren_net::{SlotPolicy, TableCheck, AGENT_PORT};

/// The unprivileged user of the M7 test (`nobody` on Debian).
const NOBODY: u32 = 65534;

/// Opens a TCP connection to `target` from a host process running as `uid` (bash's
/// `/dev/tcp`), and reports whether it connected. The same program for every uid, so the
/// uid is the only difference. `timeout` only guards against a hang (a rejected connection
/// fails at once).
fn connects_as(uid: u32, target: SocketAddr) -> bool {
    let script = format!("exec 3<>/dev/tcp/{}/{}", target.ip(), target.port());
    let status = Command::new("timeout")
        .args(["10", "bash", "-c", &script])
        .uid(uid)
        .gid(uid)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run bash");
    status.success()
}

fn table_exists(prefix: &str) -> bool {
    common::table_names()
        .iter()
        .any(|(f, n)| f == "inet" && n == prefix)
}

fn in_no_egress_set(prefix: &str, name: &str) -> bool {
    sh("nft", &["list", "set", "inet", prefix, "no_egress"], None)
        .map(|s| s.contains(&format!("\"{name}\"")))
        .unwrap_or(false)
}

#[test]
fn only_root_on_the_host_reaches_slots() {
    let Some(ctx) = common::setup() else { return };
    let (rt, pool) = common::start_pool(ctx.config(1));
    let slot = common::acquire(&rt, &pool, &SlotPolicy::open());
    let ns = slot.netns_path();
    let agent = listen(Some(&ns), sa(Ipv4Addr::UNSPECIFIED, AGENT_PORT));
    let user_port = listen(Some(&ns), sa(Ipv4Addr::UNSPECIFIED, 8000));

    for (listener, port) in [(&agent, AGENT_PORT), (&user_port, 8000)] {
        let target = sa(slot.host_side_addr(), port);
        // Root (the manager, the proxy) connects ...
        assert!(connects_as(0, target), "root cannot reach {target}");
        assert!(
            accept(listener, OPEN).is_some(),
            "{target} saw no root connection"
        );
        // ... any other local user does not.
        assert!(
            !connects_as(NOBODY, target),
            "uid {NOBODY} reached the sandbox at {target}"
        );
        assert!(
            accept(listener, Duration::ZERO).is_none(),
            "{target} accepted a connection from uid {NOBODY}"
        );
    }

    drop((agent, user_port));
    common::release_and_shut_down(&rt, pool, [slot]);
}

/// A policy route that sends the pool's traffic to 169.254.169.254 into the test's outside
/// world (and nothing else: the host's own metadata route is untouched). Removed on drop.
struct MetadataRoute {
    rule: Vec<String>,
    table: String,
}

impl MetadataRoute {
    fn add(pool: &str, via: Ipv4Addr, dev: &str, table: u32) -> Self {
        let table = table.to_string();
        let rule: Vec<String> = [
            "from",
            pool,
            "to",
            "169.254.169.254/32",
            "lookup",
            &table,
            "pref",
            &table,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let via = via.to_string();
        sh(
            "ip",
            &[
                "route",
                "add",
                "169.254.169.254/32",
                "via",
                &via,
                "dev",
                dev,
                "table",
                &table,
            ],
            None,
        )
        .expect("metadata route");
        let this = Self { rule, table };
        let mut args = vec!["rule", "add"];
        args.extend(this.rule.iter().map(String::as_str));
        sh("ip", &args, None).expect("metadata rule");
        this
    }
}

impl Drop for MetadataRoute {
    fn drop(&mut self) {
        let mut args = vec!["rule", "del"];
        args.extend(self.rule.iter().map(String::as_str));
        let _ = sh("ip", &args, None);
        let _ = sh("ip", &["route", "flush", "table", &self.table], None);
    }
}

#[test]
fn isolation_survives_removal_of_the_host_table() {
    let Some(mut ctx) = common::setup() else {
        return;
    };
    let outside = ctx.outside();
    let (out_name, out_addr, out_host) = (outside.name.clone(), outside.addr, outside.host_addr);
    let outside_ns = ctx.outside_netns();
    let mut config = ctx.config(2);
    // Checked by hand below, so that the probes meet the in-slot layer alone.
    config.table_check_interval_ms = 0;
    let prefix = config.prefix.clone();
    let pool_cidr = config.host_cidr.to_string();
    let (rt, pool) = common::start_pool(config);
    let a = common::acquire(&rt, &pool, &SlotPolicy::open());
    let b = common::acquire(&rt, &pool, &SlotPolicy::deny_all());
    let (a_ns, b_ns) = (a.netns_path(), b.netns_path());

    // Without the host table nothing masquerades: let the outside world route the pool back
    // to the host, so that whatever leaks would really get an answer.
    ctx.route_pool_back(&pool_cidr);
    // A stand-in metadata service in the outside world, and a policy route to it that only
    // the pool's traffic takes; checked like every other test target.
    sh(
        "ip",
        &[
            "-n",
            &out_name,
            "addr",
            "add",
            "169.254.169.254/32",
            "dev",
            "eth0",
        ],
        None,
    )
    .expect("metadata address");
    let _route = MetadataRoute::add(&pool_cidr, out_addr, &out_name, 30000 + u32::from(ctx.no));
    let a_side = a.host_side_addr().to_string();
    let route = sh(
        "ip",
        &[
            "route",
            "get",
            "169.254.169.254",
            "from",
            &a_side,
            "iif",
            a.name(),
        ],
        None,
    )
    .expect("ip route get");
    assert!(
        route.contains(&format!("dev {out_name} ")),
        "metadata is not routed to the test namespace: {route}"
    );

    let metadata = listen(Some(&outside_ns), sa(Ipv4Addr::new(169, 254, 169, 254), 80));
    let server = listen(Some(&outside_ns), sa(out_addr, 8080));
    let b_agent = listen(Some(&b_ns), sa(Ipv4Addr::UNSPECIFIED, AGENT_PORT));
    let host_any = listen(None, sa(Ipv4Addr::UNSPECIFIED, 0));
    let host_port = host_any.local_addr().expect("addr").port();

    // What `nft flush ruleset` does to the pool, without touching anyone else's tables.
    common::delete_host_table(&prefix);
    assert!(!table_exists(&prefix));

    // The path itself still works: A gets out, unmasqueraded (the host table is gone) ...
    let peer = assert_connects(Some(&a_ns), &server, sa(out_addr, 8080));
    assert_eq!(peer.ip(), std::net::IpAddr::V4(a.host_side_addr()));
    // ... but not to the metadata service, the other slot, or any host address.
    assert_blocked(
        Some(&a_ns),
        sa(Ipv4Addr::new(169, 254, 169, 254), 80),
        Some(&metadata),
    );
    assert_blocked(Some(&a_ns), b.agent_endpoint().into(), Some(&b_agent));
    assert_blocked(
        Some(&a_ns),
        sa(b.host_veth_addr(), AGENT_PORT),
        Some(&b_agent),
    );
    let mut host_addrs = vec![a.host_veth_addr(), b.host_veth_addr(), out_host];
    host_addrs.extend(host_primary_addrs());
    for ip in host_addrs {
        assert_blocked(Some(&a_ns), sa(ip, host_port), Some(&host_any));
    }

    // A check restores the table, including B's "no internet".
    let verdict = rt.block_on(pool.check_host_table()).expect("check");
    assert_eq!(verdict, TableCheck::RestoredMissing);
    assert!(pool.is_healthy());
    assert!(table_exists(&prefix) && in_no_egress_set(&prefix, b.name()));
    let peer = assert_connects(Some(&a_ns), &server, sa(out_addr, 8080));
    assert_eq!(
        peer.ip(),
        std::net::IpAddr::V4(out_host),
        "masquerade is back"
    );
    assert_blocked(Some(&b_ns), sa(out_addr, 8080), Some(&server));

    // A changed table is replaced as well; an intact one is left alone.
    let elem = format!("{{ \"{}\" }}", b.name());
    sh(
        "nft",
        &["delete", "element", "inet", &prefix, "no_egress", &elem],
        None,
    )
    .expect("delete element");
    let verdict = rt.block_on(pool.check_host_table()).expect("check");
    assert_eq!(verdict, TableCheck::RestoredAltered);
    assert!(in_no_egress_set(&prefix, b.name()));
    let verdict = rt.block_on(pool.check_host_table()).expect("check");
    assert_eq!(verdict, TableCheck::Intact);

    drop(b_agent);
    common::release_and_shut_down(&rt, pool, [a, b]);
}

#[test]
fn the_watchdog_restores_a_removed_host_table() {
    let Some(ctx) = common::setup() else { return };
    let mut config = ctx.config(1);
    config.table_check_interval_ms = 100;
    let prefix = config.prefix.clone();
    let (rt, pool) = common::start_pool(config);
    let slot = common::acquire(&rt, &pool, &SlotPolicy::deny_all());

    common::delete_host_table(&prefix);
    wait_for(
        Duration::from_secs(20),
        "the watchdog to restore the host table",
        || table_exists(&prefix) && in_no_egress_set(&prefix, slot.name()),
    );
    assert!(pool.is_healthy());
    // Still in place after shutdown? No: the watchdog stops first.
    common::release_and_shut_down(&rt, pool, [slot]);
    assert!(!table_exists(&prefix), "the watchdog outlived shutdown");
}

#[test]
fn wireserver_and_connection_limit_are_in_place() {
    let Some(ctx) = common::setup() else { return };
    let prefix = ctx.prefix.clone();
    let (rt, pool) = common::start_pool(ctx.config(1));
    let slot = common::acquire(&rt, &pool, &SlotPolicy::open());

    let host_blocked = sh(
        "nft",
        &["-j", "list", "set", "inet", &prefix, "blocked"],
        None,
    )
    .expect("list set");
    assert_eq!(
        host_blocked.matches("168.63.129.16").count(),
        1,
        "{host_blocked}"
    );
    let in_slot = sh(
        "ip",
        &[
            "netns",
            "exec",
            slot.name(),
            "nft",
            "-j",
            "list",
            "table",
            "inet",
            &prefix,
        ],
        None,
    )
    .expect("list slot filter");
    assert!(in_slot.contains("168.63.129.16"), "{in_slot}");
    assert!(in_slot.contains("\"ct count\""), "{in_slot}");
    assert!(in_slot.contains("4096"), "{in_slot}");

    common::release_and_shut_down(&rt, pool, [slot]);
}

#[test]
fn a_sandbox_cannot_open_more_connections_than_its_limit() {
    let Some(mut ctx) = common::setup() else {
        return;
    };
    let server_ip = ctx.outside().addr;
    let outside_ns = ctx.outside_netns();
    let mut config = ctx.config(1);
    config.max_connections_per_slot = 3;
    // One slot only, so that the second tenant gets the recycled one.
    config.max_slots = Some(1);
    let (rt, pool) = common::start_pool(config);
    rt.block_on(pool.fill()).expect("fill");
    let slot = common::acquire(&rt, &pool, &SlotPolicy::open());
    let ns = slot.netns_path();
    let server = listen(Some(&outside_ns), sa(server_ip, 8080));
    let target = sa(server_ip, 8080);

    let mut open = Vec::new();
    for _ in 0..3 {
        let c = connect(Some(&ns), target, OPEN).expect("connection within the limit");
        let s = accept(&server, OPEN).expect("accepted");
        open.push((c, s));
    }
    let err = connect(Some(&ns), target, OPEN).expect_err("a fourth connection");
    // Rejected, so the sandbox learns at once.
    assert_ne!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
    assert!(accept(&server, Duration::ZERO).is_none());

    // The tenant goes away without closing its connections (a killed VM sends no FIN):
    // the next tenant of the recycled slot still gets the whole limit.
    let name = slot.name().to_owned();
    rt.block_on(pool.release(slot)).expect("release");
    let slot = common::acquire(&rt, &pool, &SlotPolicy::open());
    assert_eq!(slot.name(), name, "the slot was recycled");
    let mut again = Vec::new();
    for _ in 0..3 {
        let c = connect(Some(&ns), target, OPEN).expect("the next tenant's connection");
        let s = accept(&server, OPEN).expect("accepted");
        again.push((c, s));
    }

    drop((open, again));
    common::release_and_shut_down(&rt, pool, [slot]);
}

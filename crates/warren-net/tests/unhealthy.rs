//! A pool whose host table is gone and cannot be restored refuses new slots until it is back.
//! Its own test binary: it changes the process's PATH (to make `nft` unavailable for a
//! moment), which no other test may see.

mod common;

use warren_net::{Error, SlotPolicy, TableCheck};

#[test]
fn no_new_slots_while_the_host_table_cannot_be_restored() {
    let Some(ctx) = common::setup() else { return };
    let mut config = ctx.config(1);
    config.table_check_interval_ms = 0;
    let prefix = config.prefix.clone();
    let (rt, pool) = common::start_pool(config);
    rt.block_on(pool.fill()).expect("fill");
    assert!(pool.is_healthy());

    common::delete_host_table(&prefix);
    // A PATH without `nft`: the check can neither list nor load the table.
    let bin = common::bin_with_only(&prefix, &["ip", "conntrack"]);
    let old_path = std::env::var_os("PATH").unwrap_or_default();
    std::env::set_var("PATH", &bin);
    let failed = rt.block_on(pool.check_host_table());
    let healthy = pool.is_healthy();
    let refused = rt.block_on(pool.acquire(&SlotPolicy::open()));
    std::env::set_var("PATH", old_path);
    let _ = std::fs::remove_dir_all(&bin);

    assert!(failed.is_err(), "{failed:?}");
    assert!(!healthy);
    match refused {
        Err(Error::HostTableMissing { table }) => assert_eq!(table, format!("inet {prefix}")),
        other => panic!("acquire while unhealthy: {other:?}"),
    }

    // Once a check succeeds, the pool serves again.
    let verdict = rt.block_on(pool.check_host_table()).expect("check");
    assert_eq!(verdict, TableCheck::RestoredMissing);
    assert!(pool.is_healthy());
    let slot = rt
        .block_on(pool.acquire(&SlotPolicy::open()))
        .expect("acquire when healthy");
    common::release_and_shut_down(&rt, pool, [slot]);
}

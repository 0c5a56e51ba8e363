//! A pool that is to flush conntrack entries refuses to start without the `conntrack` tool.
//! Its own test binary: it changes the process's PATH, which no other test may see.

mod common;

use std::path::Path;

use warren_net::{Error, NetPool};

#[test]
fn a_pool_without_the_conntrack_tool_refuses_to_start() {
    let Some(ctx) = common::setup() else { return };
    // A PATH that has the required tools but not `conntrack`.
    let bin = common::bin_with_only(&ctx.prefix, &["ip", "nft"]);
    let old_path = std::env::var_os("PATH").unwrap_or_default();
    std::env::set_var("PATH", &bin);

    let rt = common::rt();
    let refused = rt.block_on(NetPool::start(ctx.config(0)));
    // Refused before anything was built.
    let leftovers = common::leftovers(&ctx.prefix);
    let mut config = ctx.config(0);
    config.flush_conntrack = false;
    let opted_out = rt.block_on(NetPool::start(config));

    std::env::set_var("PATH", old_path);
    let _ = std::fs::remove_dir_all(Path::new(&bin));

    let err = match refused {
        Ok(_) => panic!("a pool started without `conntrack`"),
        Err(e) => e,
    };
    assert!(matches!(err, Error::ConntrackRequired { .. }), "{err:?}");
    assert!(err.to_string().contains("flush_conntrack"), "{err}");
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // Turning the flush off is an explicit choice, and then the tool is not needed.
    let pool = opted_out.expect("pool with flush_conntrack = false");
    rt.block_on(pool.shutdown()).expect("shutdown");
}

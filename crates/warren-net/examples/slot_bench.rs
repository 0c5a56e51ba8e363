//! Prints how long slot operations take. Needs root; asserts nothing.
//!
//! `cargo run --release -p warren-net --example slot_bench [-- ROUNDS]`
//!
//! Uses its own prefix (`wbench`) and address pool (10.254.0.0/22), so it does not disturb
//! a running Warren server; leftovers of an interrupted run are removed on the next start.

use std::time::{Duration, Instant};

use warren_net::{NetConfig, NetPool, SlotPolicy};

fn config(pool_size: usize, flush_conntrack: bool) -> NetConfig {
    NetConfig {
        prefix: "wbench".into(),
        host_cidr: "10.254.0.0/22".parse().expect("valid CIDR"),
        pool_size,
        run_dir: std::env::temp_dir().join("warren-net-bench"),
        flush_conntrack,
        ..NetConfig::default()
    }
}

fn report(name: &str, mut samples: Vec<Duration>) {
    if samples.is_empty() {
        return;
    }
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let p90 = samples[(samples.len() * 9 / 10).min(samples.len() - 1)];
    println!(
        "{name:<44} median {:>7.2} ms   p90 {:>7.2} ms   (n={})",
        ms(samples[samples.len() / 2]),
        ms(p90),
        samples.len()
    );
}

async fn timed<T, F: std::future::Future<Output = T>>(f: F) -> (T, Duration) {
    let start = Instant::now();
    let out = f.await;
    (out, start.elapsed())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rounds: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(20);

    // Phase 1: an empty pool, so acquire builds and release destroys.
    let (pool, t) = timed(NetPool::start(config(0, true))).await;
    let pool = pool?;
    report("pool start (cleanup, checks, host table)", vec![t]);
    let mut slots = Vec::new();
    let mut create = Vec::new();
    for _ in 0..rounds {
        let (slot, t) = timed(pool.acquire(&SlotPolicy::open())).await;
        slots.push(slot?);
        create.push(t);
    }
    report("create on demand (acquire, empty pool)", create);
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for slot in &mut slots {
        off.push(
            timed(pool.set_policy(slot, &SlotPolicy::deny_all()))
                .await
                .1,
        );
        on.push(timed(pool.set_policy(slot, &SlotPolicy::open())).await.1);
    }
    report("internet access off (nft set element)", off);
    report("internet access on", on);
    let mut destroy = Vec::new();
    for slot in slots.drain(..) {
        let (r, t) = timed(pool.release(slot)).await;
        r?;
        destroy.push(t);
    }
    report("release + destroy (conntrack flush incl.)", destroy);
    pool.shutdown().await?;

    // Phase 2: a pool of `rounds` ready slots, so acquire is a pop and release a recycle.
    for flush in [true, false] {
        let pool = NetPool::start(config(rounds, flush)).await?;
        let (r, t) = timed(pool.fill()).await;
        r?;
        report(
            "fill, per slot (sequential creation)",
            vec![t / rounds as u32],
        );
        let mut acquire = Vec::new();
        for _ in 0..rounds {
            let (slot, t) = timed(pool.acquire(&SlotPolicy::open())).await;
            slots.push(slot?);
            acquire.push(t);
        }
        report("acquire from a full pool", acquire);
        let mut release = Vec::new();
        for slot in slots.drain(..) {
            let (r, t) = timed(pool.release(slot)).await;
            r?;
            release.push(t);
        }
        let label = if flush {
            "release + recycle (conntrack flush)"
        } else {
            "release + recycle (no conntrack flush)"
        };
        report(label, release);
        // Let the background refill go idle before measuring teardown.
        pool.fill().await?;
        let (r, t) = timed(pool.shutdown()).await;
        r?;
        report(
            "shutdown, per slot (one ip -batch)",
            vec![t / rounds as u32],
        );
    }
    Ok(())
}

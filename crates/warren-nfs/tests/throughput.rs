//! Sequential throughput over loopback with `nfs3_client` (one call in flight): a 64 MiB file
//! written in 1 MiB UNSTABLE writes and committed, then read back in 1 MiB reads. Prints the
//! numbers (`cargo test -p warren-nfs --test throughput -- --nocapture`); asserts only that the
//! data came back.

mod common;

use std::time::Instant;

use common::*;
use nfs3_client::nfs3_types::nfs3::stable_how;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_64_mib() {
    const MIB: usize = 1 << 20;
    const TOTAL: usize = 64 * MIB;
    let vol = ext4(160);
    let srv = start(vec![export("/v0", &vol.mnt, false)], KEY).await;
    let mut c = mount(srv.addr, "/v0", Some((1000, 1000, vec![]))).await;
    let root = c.root.clone();
    std::fs::set_permissions(
        &vol.mnt,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let f = c.create(&root, "big", 0o644).await.unwrap();
    let chunk = pattern(MIB, 9);

    let t = Instant::now();
    for i in 0..TOTAL / MIB {
        c.write(&f, (i * MIB) as u64, &chunk, stable_how::UNSTABLE)
            .await
            .unwrap();
    }
    c.commit(&f).await.unwrap();
    let w = t.elapsed();

    let t = Instant::now();
    let mut got = 0usize;
    let mut check = 0u64;
    loop {
        let (data, eof) = c.read(&f, got as u64, MIB as u32).await.unwrap();
        if got == 0 {
            check = sum(&data);
        }
        got += data.len();
        if eof || data.is_empty() {
            break;
        }
    }
    let r = t.elapsed();
    assert_eq!(got, TOTAL);
    assert_eq!(check, sum(&chunk));

    let t = Instant::now();
    let g = c.create(&root, "sync", 0o644).await.unwrap();
    for i in 0..16 {
        c.write(&g, (i * MIB) as u64, &chunk, stable_how::FILE_SYNC)
            .await
            .unwrap();
    }
    let s = t.elapsed();

    let mbs = |bytes: usize, d: std::time::Duration| bytes as f64 / MIB as f64 / d.as_secs_f64();
    println!(
        "warren-nfs loopback, 1 MiB calls, one in flight: write+COMMIT 64 MiB in {:.2?} \
         ({:.0} MiB/s), read 64 MiB in {:.2?} ({:.0} MiB/s), FILE_SYNC write 16 MiB in {:.2?} \
         ({:.0} MiB/s)",
        w,
        mbs(TOTAL, w),
        r,
        mbs(TOTAL, r),
        s,
        mbs(16 * MIB, s)
    );
    srv.stop().await;
}

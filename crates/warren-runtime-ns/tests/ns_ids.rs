//! Host id ranges of namespace sandboxes through the host manager: every sandbox has its own
//! range (none overlapping `/etc/subuid`/`/etc/subgid`), a sandbox created from another's
//! snapshot gets a new one (and still sees its files owned as they were), ranges of saved
//! layers are not handed out again, and assignments survive a manager restart. Needs root,
//! nftables and the base image.

mod common;

use common::run;

use warren_host::HostConfig;
use warren_runtime::{CreateSpec, RuntimeSandbox, SandboxRuntime};
use warren_runtime_ns::NsRuntime;

fn config() -> Option<HostConfig> {
    common::HostTest {
        name: "ids",
        tag: "",
        prefix: "wi",
        octet: 22,
        pool_size: 4,
        private_data: true,
    }
    .config()
}

fn spec(id: &str, from_snapshot: Option<&str>) -> CreateSpec {
    CreateSpec {
        from_snapshot: from_snapshot.map(String::from),
        ..common::small_spec(id)
    }
}

/// First host uid of a sandbox's range, as the kernel has it for its PID 1.
fn range_of(s: &RuntimeSandbox) -> u32 {
    let pid1 = s.record["pid1"].as_u64().unwrap();
    let map = std::fs::read_to_string(format!("/proc/{pid1}/uid_map")).unwrap();
    let fields: Vec<u32> = map.split_whitespace().map(|x| x.parse().unwrap()).collect();
    assert_eq!((fields[0], fields[2]), (0, 65536), "{map}");
    fields[1]
}

fn disjoint(ranges: &[u32]) {
    for (i, a) in ranges.iter().enumerate() {
        for b in &ranges[i + 1..] {
            assert!(a.abs_diff(*b) >= 65536, "ranges {a} and {b} overlap");
        }
        assert_eq!(
            warren_runtime_ns::idrange::overlap(*a),
            None,
            "range {a} overlaps /etc/subuid or /etc/subgid"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_sandbox_gets_its_own_range_and_snapshots_move_to_the_new_one() {
    let Some(cfg) = config() else { return };
    let rt = NsRuntime::start(cfg.clone(), common::ns_settings())
        .await
        .expect("start");
    rt.reattach(vec![]).await;
    let a = rt.create(spec("idsa", None)).await.expect("create a");
    let b = rt.create(spec("idsb", None)).await.expect("create b");
    let (ra, rb) = (range_of(&a), range_of(&b));
    disjoint(&[ra, rb]);

    let (code, out) = run(
        a.agent,
        "echo mine > /home/user/owned && stat -c '%U:%G' /home/user/owned",
    )
    .await;
    assert_eq!((code, out.as_str()), (0, "user:user\n"), "{out}");
    rt.snapshot("idsa", "idsnap", false)
        .await
        .expect("snapshot");
    let c = rt
        .create(spec("idsc", Some("idsnap")))
        .await
        .expect("create from the snapshot");
    let rc = range_of(&c);
    disjoint(&[ra, rb, rc]);
    let (code, out) = run(
        c.agent,
        "stat -c '%U:%G' /home/user/owned; cat /home/user/owned",
    )
    .await;
    assert_eq!((code, out.as_str()), (0, "user:user\nmine\n"), "{out}");

    // The snapshot's files still belong to a's range: killing a does not free it.
    rt.kill("idsa").await.expect("kill a");
    let d = rt.create(spec("idsd", None)).await.expect("create d");
    let rd = range_of(&d);
    disjoint(&[ra, rb, rc, rd]);

    // A restarted manager knows the ranges in use.
    let rt = common::restart(rt, &cfg, common::ns_settings()).await;
    let back = rt.reattach(vec![b.clone(), c.clone(), d.clone()]).await;
    assert!(back.iter().all(|(_, r)| r.is_ok()), "{back:?}");
    let e = rt.create(spec("idse", None)).await.expect("create e");
    disjoint(&[ra, rb, rc, rd, range_of(&e)]);

    for id in ["idsb", "idsc", "idsd", "idse"] {
        rt.kill(id).await.expect("kill");
    }
    rt.delete_snapshot("idsnap").await.expect("delete snapshot");
    let left: Vec<_> = std::fs::read_dir(cfg.data_dir.join("ns-id-ranges"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "assignments left: {left:?}");
    rt.shutdown().await.expect("shutdown");
    common::cleanup(&cfg);
}

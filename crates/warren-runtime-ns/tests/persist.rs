//! Pause, resume and snapshots of real namespace sandboxes: files are compared by checksum,
//! processes by what they remember. Needs root, nftables and the base image.

mod common;

use common::{cleanup, run};

use std::collections::BTreeMap;
use std::net::SocketAddr;

use warren_host::HostConfig;
use warren_runtime::{
    CreateSpec, PauseMode, ResumeKind, RuntimeError, RuntimeSandbox, SandboxRuntime,
};
use warren_runtime_ns::NsRuntime;

fn config(tag: &str, net: u32) -> Option<HostConfig> {
    common::HostTest {
        name: "persist",
        tag,
        prefix: "wp",
        octet: net,
        pool_size: 2,
        private_data: true,
    }
    .config()
}

fn spec(id: &str) -> CreateSpec {
    CreateSpec {
        resources: common::MEDIUM,
        env_vars: BTreeMap::from([("FROM_CREATE".to_string(), "yes".to_string())]),
        ..common::small_spec(id)
    }
}

/// Files of many sizes (never fsynced), a deletion from the image, a file in /tmp, and a
/// counter process; returns their checksums.
const WRITE: &str = "set -e; mkdir -p /home/user/w/deep/er; \
    for n in 0 1 100 4095 4096 65537 1048576 5000000; do head -c $n /dev/urandom > /home/user/w/f$n; done; \
    echo hello > /home/user/w/deep/er/x; ln -s f100 /home/user/w/link; ln /home/user/w/f1 /home/user/w/hard; \
    echo tmp > /tmp/t; sudo rm /etc/debian_version; \
    (i=0; while true; do i=$((i+1)); echo $i > /home/user/counter; sleep 0.05; done) > /dev/null 2>&1 & \
    sleep 0.3; echo started";
const SUMS: &str = "cd /home/user/w && find . -type f -o -type l | sort | xargs -d '\\n' sha256sum; \
    readlink link; stat -c %h hard; cat /tmp/t; test -e /etc/debian_version && echo present || echo deleted";

async fn counter(agent: SocketAddr) -> u64 {
    let (_, out) = run(agent, "cat /home/user/counter").await;
    out.trim().parse().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_pause_survives_a_restart_and_processes_continue() {
    let Some(cfg) = config("m", 18) else { return };
    let first = NsRuntime::start(cfg.clone(), common::ns_settings())
        .await
        .expect("start");
    first.reattach(vec![]).await;
    let sbx = first.create(spec("pausemem")).await.expect("create");
    assert_eq!(run(sbx.agent, WRITE).await, (0, "started\n".into()));
    let (code, sums) = run(sbx.agent, SUMS).await;
    assert_eq!(code, 0);
    assert!(sums.contains("deleted"), "{sums}");

    let before = counter(sbx.agent).await;
    let paused = first
        .pause("pausemem", PauseMode::Memory)
        .await
        .expect("pause");
    assert_eq!(
        first
            .pause("pausemem", PauseMode::Memory)
            .await
            .map(|_| ())
            .map_err(|e| matches!(e, RuntimeError::InvalidArgument(_))),
        Err(true),
        "pausing a paused sandbox is refused"
    );
    let at_pause = counter_from_disk(&cfg, "pausemem");
    assert!(at_pause >= before, "{at_pause} < {before}");
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(
        counter_from_disk(&cfg, "pausemem"),
        at_pause,
        "a paused sandbox does not run"
    );

    // The manager goes away while the sandbox is paused; a new one takes it back.
    let second = common::restart(first, &cfg, common::ns_settings()).await;
    let back = second.reattach(vec![paused.clone()]).await;
    let back = back[0]
        .1
        .as_ref()
        .expect("paused sandbox taken back")
        .clone();
    for round in 0..10 {
        let (resumed, kind) = second.resume(spec("pausemem")).await.expect("resume");
        assert_eq!(kind, ResumeKind::Memory);
        assert_eq!(resumed.agent, back.agent);
        let now = counter(resumed.agent).await;
        assert!(
            now >= at_pause,
            "round {round}: the counter restarted ({now} < {at_pause})"
        );
        assert_eq!(run(resumed.agent, SUMS).await, (0, sums.clone()));
        second
            .pause("pausemem", PauseMode::Memory)
            .await
            .expect("pause again");
    }
    let (resumed, _) = second.resume(spec("pausemem")).await.expect("resume");
    let a = counter(resumed.agent).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(counter(resumed.agent).await > a, "the counter runs again");
    second.kill("pausemem").await.expect("kill");
    assert!(!cfg.data_dir.join("paused/pausemem").exists());
    second.shutdown().await.expect("shutdown");
    cleanup(&cfg);
}

/// The counter as the paused sandbox's saved files hold it: read from its saved disk image
/// with `debugfs`, which reads an ext4 image without mounting it.
fn counter_from_disk(cfg: &HostConfig, id: &str) -> u64 {
    let image = cfg.data_dir.join(format!("paused/{id}/disk.img"));
    let out = std::process::Command::new("debugfs")
        .args(["-R", "cat /upper/home/user/counter"])
        .arg(&image)
        .output()
        .expect("debugfs");
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim().parse().unwrap_or_else(|e| {
        panic!(
            "{}: {e}: {text:?} {}",
            image.display(),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn filesystem_pause_and_snapshots_keep_every_file() {
    let Some(cfg) = config("f", 19) else { return };
    let first = NsRuntime::start(cfg.clone(), common::ns_settings())
        .await
        .expect("start");
    first.reattach(vec![]).await;
    let sbx = first.create(spec("pausefs")).await.expect("create");
    assert_eq!(run(sbx.agent, WRITE).await, (0, "started\n".into()));
    let (_, sums) = run(sbx.agent, SUMS).await;

    // A snapshot of the running sandbox, which keeps running.
    let info = first
        .snapshot("pausefs", "snap1", false)
        .await
        .expect("snapshot");
    assert!(!info.memory);
    assert!(info.bytes > 5_000_000, "{} bytes", info.bytes);
    let c = counter(sbx.agent).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(counter(sbx.agent).await > c, "the source runs on");

    let paused: RuntimeSandbox = first
        .pause("pausefs", PauseMode::Filesystem)
        .await
        .expect("pause");
    let second = common::restart(first, &cfg, common::ns_settings()).await;
    let back = second.reattach(vec![paused]).await;
    assert!(back[0].1.is_ok(), "{:?}", back[0].1);
    for _ in 0..3 {
        let (resumed, kind) = second.resume(spec("pausefs")).await.expect("resume");
        assert_eq!(kind, ResumeKind::Filesystem);
        assert_eq!(run(resumed.agent, SUMS).await, (0, sums.clone()));
        assert_eq!(
            run(resumed.agent, "pgrep -fx 'sleep 0.05' || echo none").await,
            (0, "none\n".into()),
            "processes do not survive a filesystem pause"
        );
        assert_eq!(
            run(resumed.agent, "echo $FROM_CREATE").await,
            (0, "yes\n".into())
        );
        second
            .pause("pausefs", PauseMode::Filesystem)
            .await
            .expect("pause again");
    }

    // Two sandboxes from the snapshot: the same files, independent of each other.
    let mut a = spec("fromsnapa");
    a.from_snapshot = Some("snap1".into());
    let mut b = spec("fromsnapb");
    b.from_snapshot = Some("snap1".into());
    let a = second.create(a).await.expect("create from snapshot");
    let b = second.create(b).await.expect("create from snapshot");
    assert_eq!(run(a.agent, SUMS).await, (0, sums.clone()));
    assert_eq!(
        run(a.agent, "echo only-a > /home/user/w/deep/er/x").await.0,
        0
    );
    assert_eq!(
        run(b.agent, "cat /home/user/w/deep/er/x").await,
        (0, "hello\n".into())
    );
    let mut missing = spec("nosnap");
    missing.from_snapshot = Some("nosuchsnapshot".into());
    assert!(matches!(
        second.create(missing).await,
        Err(RuntimeError::UnknownTemplate(_))
    ));
    second.delete_snapshot("snap1").await.expect("delete");
    assert!(matches!(
        second.delete_snapshot("snap1").await,
        Err(RuntimeError::NotFound(_))
    ));

    for id in ["pausefs", "fromsnapa", "fromsnapb"] {
        second.kill(id).await.expect("kill");
    }
    assert!(!cfg.data_dir.join("paused/pausefs").exists());
    second.shutdown().await.expect("shutdown");
    cleanup(&cfg);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pause_the_server_never_acknowledged_is_undone_after_a_restart() {
    let Some(cfg) = config("c", 20) else { return };
    let first = NsRuntime::start(cfg.clone(), common::ns_settings())
        .await
        .expect("start");
    first.reattach(vec![]).await;
    let sbx = first.create(spec("halfpaused")).await.expect("create");
    assert_eq!(run(sbx.agent, "echo kept > /home/user/f").await.0, 0);
    // What a server that died inside `pause` leaves: a frozen sandbox and a saved layer,
    // while the store still holds the running record.
    warren_host::cgroup::SandboxCgroup::at(&cfg.cgroup_parent, "halfpaused")
        .freeze()
        .expect("freeze");
    let stray = cfg.data_dir.join("paused/halfpaused/upper");
    std::fs::create_dir_all(&stray).unwrap();
    let orphan = cfg.data_dir.join("paused/gone.partial");
    std::fs::create_dir_all(&orphan).unwrap();

    let second = common::restart(first, &cfg, common::ns_settings()).await;
    let back = second.reattach(vec![sbx.clone()]).await;
    assert!(back[0].1.is_ok(), "{:?}", back[0].1);
    assert_eq!(
        run(sbx.agent, "cat /home/user/f").await,
        (0, "kept\n".into()),
        "the sandbox runs on"
    );
    assert!(
        !stray.exists() && !orphan.exists(),
        "unclaimed saves are removed"
    );
    second.kill("halfpaused").await.expect("kill");
    second.shutdown().await.expect("shutdown");
    cleanup(&cfg);
}

/// The server died after a filesystem pause had saved the files and ended the processes,
/// before the control plane recorded the pause: the store still holds the running record.
/// The restarted runtime reports the sandbox paused with its files (a pause that finished
/// while the server was down), and it resumes from them.
#[tokio::test(flavor = "multi_thread")]
async fn a_filesystem_pause_that_finished_while_the_server_was_down_is_reported_paused() {
    let Some(cfg) = config("d", 23) else { return };
    let first = NsRuntime::start(cfg.clone(), common::ns_settings())
        .await
        .expect("start");
    first.reattach(vec![]).await;
    let running = first.create(spec("donepaused")).await.expect("create");
    assert_eq!(run(running.agent, "echo kept > /home/user/f").await.0, 0);
    first
        .pause("donepaused", PauseMode::Filesystem)
        .await
        .expect("pause");

    let second = common::restart(first, &cfg, common::ns_settings()).await;
    let mut back = second.reattach(vec![running.clone()]).await;
    let (_, got) = back.pop().expect("one result");
    let mut got = got.unwrap_or_else(|e| panic!("lost: {}", warren_runtime::chain(&e)));
    assert_eq!(
        warren_runtime::take_finished_pause(&mut got.record),
        Some(PauseMode::Filesystem)
    );
    let (resumed, kind) = second.resume(spec("donepaused")).await.expect("resume");
    assert_eq!(kind, ResumeKind::Filesystem);
    assert_eq!(
        run(resumed.agent, "cat /home/user/f").await,
        (0, "kept\n".into())
    );
    second.kill("donepaused").await.expect("kill");
    second.shutdown().await.expect("shutdown");
    cleanup(&cfg);
}

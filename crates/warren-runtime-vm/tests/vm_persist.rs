//! Pause, resume and snapshots of real microVMs (TCG here): files are compared by checksum,
//! processes by what they remember. Needs root, nftables, QEMU and the base image; without
//! root or QEMU the tests print `SKIP:` and why (`WARREN_REQUIRE_ALL=1` makes that a failure).

mod common;

use common::{cleanup, run};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use warren_host::HostConfig;
use warren_runtime::{
    CreateSpec, PauseMode, ResumeKind, RuntimeError, RuntimeSandbox, SandboxRuntime,
};
use warren_runtime_vm::{VmRuntime, VmSettings};

/// A config of its own per test: its own run dir, cgroups, addresses and a private data dir
/// (checkpoints) that borrows the shared image and kernel caches.
fn config(tag: &str, n: u32) -> Option<(HostConfig, VmSettings)> {
    if !common::have_vm_host() {
        return None;
    }
    common::VmTest {
        name: "vmp",
        prefix: "wq",
        octet: 21,
        pool_size: 4,
        warm_pool: 0,
    }
    .config(tag, n, &common::private_data_dir(tag))
}

fn spec(id: &str) -> CreateSpec {
    CreateSpec {
        env_vars: BTreeMap::from([("FROM_CREATE".to_string(), "yes".to_string())]),
        ..common::small_spec(id)
    }
}

async fn start(cfg: &HostConfig, vm: &VmSettings, records: Vec<RuntimeSandbox>) -> Arc<VmRuntime> {
    let rt = VmRuntime::start(cfg.clone(), vm.clone())
        .await
        .expect("start");
    for (id, r) in rt.reattach(records).await {
        r.unwrap_or_else(|e| panic!("reattach {id}: {e}"));
    }
    rt.prepare_template("base")
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    rt
}

/// Files of many sizes never fsynced, a file in /tmp, a deletion, and a counter process
/// whose value lives only in its memory.
const WRITE: &str = "set -e; mkdir -p /home/user/w/deep; \
    for n in 0 1 4095 4096 65537 1048576 5000000; do head -c $n /dev/urandom > /home/user/w/f$n; done; \
    echo hello > /home/user/w/deep/x; ln -s f1 /home/user/w/link; head -c 70000 /dev/urandom > /tmp/t; \
    sudo rm /etc/debian_version; \
    setsid sh -c 'i=0; while true; do i=$((i+1)); echo \"$$ $i\" > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; sleep 0.05; done' \
      >/dev/null 2>&1 < /dev/null & \
    echo ok";
const SUMS: &str =
    "cd /home/user/w && find . /tmp/t -type f | sort | xargs sha256sum && readlink link \
    && test ! -e /etc/debian_version && echo deleted";

async fn counter(agent: SocketAddr) -> (u64, u64) {
    for _ in 0..100 {
        let (_, out) = run(agent, "cat /tmp/counter 2>/dev/null || true").await;
        let v: Vec<u64> = out
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        if v.len() == 2 {
            return (v[0], v[1]);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the counter never reported");
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn pause_restart_and_resume_keep_files_and_processes() {
    let Some((cfg, vm)) = config("p", 0) else {
        return;
    };
    let rt = start(&cfg, &vm, vec![]).await;
    let s = rt
        .create(spec("pausevm"))
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    assert_eq!(run(s.agent, WRITE).await, (0, "ok\n".into()));
    let (code, sums) = run(s.agent, SUMS).await;
    assert_eq!(code, 0, "{sums}");
    let (pid, before) = counter(s.agent).await;
    let qemu_pid = s.record["pid"].as_u64().unwrap();

    let paused = rt
        .pause("pausevm", PauseMode::Memory)
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    assert!(
        !Path::new(&format!("/proc/{qemu_pid}")).exists(),
        "a paused VM holds no QEMU (no memory)"
    );
    assert!(matches!(
        rt.pause("pausevm", PauseMode::Memory).await,
        Err(RuntimeError::InvalidArgument(_))
    ));
    assert!(matches!(
        rt.snapshot("pausevm", "k", true).await,
        Err(RuntimeError::InvalidArgument(_))
    ));

    // The server goes away and comes back.
    rt.release().await.expect("release");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rt = start(&cfg, &vm, vec![paused]).await;

    let mut agent;
    let mut last = before;
    for round in 0..3 {
        let (back, kind) = rt
            .resume(spec("pausevm"))
            .await
            .unwrap_or_else(|e| panic!("resume {round}: {e}"));
        assert_eq!(kind, ResumeKind::Memory);
        agent = back.agent;
        assert_eq!(run(agent, SUMS).await, (0, sums.clone()), "resume {round}");
        let (now_pid, value) = counter(agent).await;
        assert_eq!(now_pid, pid, "the same process continues (resume {round})");
        assert!(
            value >= last,
            "the counter continues from {last}, not {value}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (_, later) = counter(agent).await;
        assert!(later > value, "and keeps counting");
        last = later;
        assert_eq!(
            run(
                agent,
                &format!("echo {round} > /home/user/round && echo $E2B_SANDBOX_ID")
            )
            .await,
            (0, "pausevm\n".into())
        );
        rt.pause("pausevm", PauseMode::Memory)
            .await
            .unwrap_or_else(|e| panic!("pause {round}: {e}"));
    }
    let (back, _) = rt.resume(spec("pausevm")).await.unwrap();
    assert_eq!(
        run(back.agent, "cat /home/user/round").await,
        (0, "2\n".into())
    );

    // A filesystem pause keeps the files (also those still in the guest's caches), not the
    // processes; the sandbox boots afresh on them, and can be paused with memory again.
    run(back.agent, "head -c 300000 /dev/urandom > /home/user/w/late && sha256sum /home/user/w/late > /home/user/late.sum").await;
    rt.pause("pausevm", PauseMode::Filesystem)
        .await
        .unwrap_or_else(|e| panic!("filesystem pause: {e}"));
    let (back, kind) = rt
        .resume(spec("pausevm"))
        .await
        .unwrap_or_else(|e| panic!("resume after a filesystem pause: {e}"));
    assert_eq!(kind, ResumeKind::Filesystem);
    assert_eq!(
        run(
            back.agent,
            "sha256sum -c /home/user/late.sum >/dev/null && rm /home/user/w/late && echo ok"
        )
        .await,
        (0, "ok\n".into())
    );
    assert_eq!(run(back.agent, SUMS).await, (0, sums.clone()));
    assert_eq!(
        run(
            back.agent,
            &format!("kill -0 {pid} 2>/dev/null && echo alive || echo gone")
        )
        .await,
        (0, "gone\n".into())
    );
    assert_eq!(
        run(back.agent, "echo $FROM_CREATE $E2B_SANDBOX_ID").await,
        (0, "yes pausevm\n".into())
    );
    run(back.agent, "echo mem > /home/user/round").await;
    rt.pause("pausevm", PauseMode::Memory).await.unwrap();
    let (back, kind) = rt.resume(spec("pausevm")).await.unwrap();
    assert_eq!(kind, ResumeKind::Memory);
    assert_eq!(
        run(back.agent, "cat /home/user/round").await,
        (0, "mem\n".into())
    );
    rt.kill("pausevm").await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let checkpoints = cfg.data_dir.join("vm-checkpoints");
    assert_eq!(entries(&checkpoints.join("paused")), Vec::<String>::new());
    assert_eq!(entries(&checkpoints.join("disks")), Vec::<String>::new());
    rt.shutdown().await.expect("shutdown");
    cleanup(&cfg);
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshot_children_carry_processes_and_are_independent() {
    let Some((cfg, vm)) = config("s", 1) else {
        return;
    };
    let rt = start(&cfg, &vm, vec![]).await;
    let parent = rt
        .create(spec("parentvm"))
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    assert_eq!(run(parent.agent, WRITE).await, (0, "ok\n".into()));
    let (_, sums) = run(parent.agent, SUMS).await;
    let (pid, _) = counter(parent.agent).await;

    let info = rt
        .snapshot("parentvm", "snapone", true)
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    assert!(info.memory && info.bytes > 0, "{info:?}");
    // The parent runs on.
    assert_eq!(
        run(parent.agent, "echo later > /home/user/w/later && echo ok").await,
        (0, "ok\n".into())
    );
    let mut children = Vec::new();
    for n in 0..2 {
        let mut s = spec(&format!("childvm{n}"));
        s.from_snapshot = Some("snapone".into());
        s.access_token = Some("tok".into());
        let c = rt
            .create(s)
            .await
            .unwrap_or_else(|e| panic!("child {n}: {e}"));
        children.push(c);
    }
    for (n, c) in children.iter().enumerate() {
        assert_eq!(run(c.agent, SUMS).await, (0, sums.clone()), "child {n}");
        assert_eq!(
            counter(c.agent).await.0,
            pid,
            "child {n} runs the parent's process"
        );
        assert_ne!(run(c.agent, "cat /home/user/w/later").await.0, 0);
        assert_eq!(
            run(c.agent, "echo $E2B_SANDBOX_ID").await,
            (0, format!("childvm{n}\n"))
        );
        run(c.agent, &format!("echo {n} > /home/user/mine")).await;
    }
    assert_eq!(
        run(children[0].agent, "cat /home/user/mine").await,
        (0, "0\n".into())
    );
    assert_eq!(
        run(children[1].agent, "cat /home/user/mine").await,
        (0, "1\n".into())
    );
    assert_ne!(run(parent.agent, "cat /home/user/mine").await.0, 0);
    // Restored from one snapshot, yet their kernels' random streams differ (reseeded by /init).
    let rand = "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n'";
    let (r0, r1) = (
        run(children[0].agent, rand).await,
        run(children[1].agent, rand).await,
    );
    assert_eq!(r0.1.len(), 64, "{r0:?}");
    assert_ne!(r0, r1, "children of one snapshot share their random state");

    // A filesystem-only snapshot: the parent's processes go on afterwards; a sandbox from it
    // boots afresh on the files.
    let info = rt
        .snapshot("parentvm", "snapfiles", false)
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    assert!(!info.memory);
    let (_, c1) = counter(parent.agent).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        counter(parent.agent).await.1 > c1,
        "the parent's processes run on"
    );
    let mut s = spec("fileschild");
    s.from_snapshot = Some("snapfiles".into());
    let fc = rt
        .create(s)
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    assert_eq!(
        run(fc.agent, "cat /home/user/w/later && rm /home/user/w/later").await,
        (0, "later\n".into())
    );
    assert_eq!(run(fc.agent, SUMS).await, (0, sums.clone()));
    assert_eq!(
        run(
            fc.agent,
            &format!("kill -0 {pid} 2>/dev/null && echo alive || echo gone")
        )
        .await,
        (0, "gone\n".into())
    );
    rt.kill("fileschild").await.unwrap();
    rt.delete_snapshot("snapfiles").await.unwrap();

    // Deleting the snapshot leaves its children whole: they can still be paused and resumed.
    rt.delete_snapshot("snapone").await.unwrap();
    assert!(matches!(
        rt.delete_snapshot("snapone").await,
        Err(RuntimeError::NotFound(_))
    ));
    let mut gone = spec("orphan");
    gone.from_snapshot = Some("snapone".into());
    assert!(matches!(
        rt.create(gone).await,
        Err(RuntimeError::UnknownTemplate(_))
    ));
    rt.pause("childvm0", PauseMode::Memory).await.unwrap();
    let (back, _) = rt.resume(spec("childvm0")).await.unwrap();
    assert_eq!(
        run(back.agent, "cat /home/user/mine").await,
        (0, "0\n".into())
    );
    assert_eq!(run(back.agent, SUMS).await, (0, sums.clone()));

    for id in ["childvm0", "childvm1", "parentvm"] {
        rt.kill(id).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let checkpoints = cfg.data_dir.join("vm-checkpoints");
    assert_eq!(
        entries(&checkpoints.join("snapshots")),
        Vec::<String>::new()
    );
    assert_eq!(entries(&checkpoints.join("disks")), Vec::<String>::new());
    rt.shutdown().await.expect("shutdown");
    cleanup(&cfg);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_vm_left_stopped_by_a_dead_server_runs_again_after_restart() {
    let Some((cfg, vm)) = config("u", 2) else {
        return;
    };
    let rt = start(&cfg, &vm, vec![]).await;
    let s = rt
        .create(spec("stoppedvm"))
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    assert_eq!(run(s.agent, WRITE).await, (0, "ok\n".into()));
    let (pid, _) = counter(s.agent).await;
    // What a server that died in the middle of a pause or snapshot leaves: the VM stopped
    // (its checkpoint never acknowledged) and a partial checkpoint.
    let name = s.record["name"].as_str().unwrap().to_string();
    let qmp_path = cfg
        .data_dir
        .join("vm/vms")
        .join(format!("{}-vm", cfg.cgroup_parent))
        .join(&name)
        .join("qmp.sock");
    rt.release().await.expect("release");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let qmp = warren_runtime_vm::qmp::Qmp::connect(&qmp_path, Duration::from_secs(5))
        .await
        .unwrap();
    qmp.execute("stop", serde_json::json!({})).await.unwrap();
    assert_eq!(qmp.status().await.unwrap(), "paused");
    drop(qmp);
    let partial = cfg.data_dir.join("vm-checkpoints/paused/stoppedvm.partial");
    std::fs::create_dir_all(&partial).unwrap();

    let rt = start(&cfg, &vm, vec![s.clone()]).await;
    assert_eq!(counter(s.agent).await.0, pid, "the same VM runs on");
    let (_, a) = counter(s.agent).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(counter(s.agent).await.1 > a, "and is running, not stopped");
    assert!(!partial.exists(), "the unfinished checkpoint is removed");
    rt.kill("stoppedvm").await.unwrap();
    rt.shutdown().await.expect("shutdown");
    cleanup(&cfg);
}

/// The server died after a pause's checkpoint and kill, before the control plane recorded the
/// pause: its record still says running. The restarted runtime reports the sandbox paused
/// (marked as a pause that finished while the server was down), and it resumes with its
/// files and processes.
#[tokio::test(flavor = "multi_thread")]
async fn a_pause_that_finished_while_the_server_was_down_is_reported_paused() {
    let Some((cfg, vm)) = config("f", 3) else {
        return;
    };
    let rt = start(&cfg, &vm, vec![]).await;
    let running = rt
        .create(spec("finishedvm"))
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    assert_eq!(run(running.agent, WRITE).await, (0, "ok\n".into()));
    let sums = run(running.agent, SUMS).await;
    let (pid, _) = counter(running.agent).await;
    rt.pause("finishedvm", PauseMode::Memory)
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    rt.release().await.expect("release");

    let rt = VmRuntime::start(cfg.clone(), vm.clone())
        .await
        .expect("start");
    let mut back = rt.reattach(vec![running.clone()]).await;
    let (id, got) = back.pop().expect("one result");
    assert_eq!(id, "finishedvm");
    let mut got = got.unwrap_or_else(|e| panic!("lost: {}", warren_runtime::chain(&e)));
    assert_eq!(
        warren_runtime::take_finished_pause(&mut got.record),
        Some(PauseMode::Memory)
    );
    rt.prepare_template("base")
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    let (resumed, kind) = rt
        .resume(spec("finishedvm"))
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    assert_eq!(kind, warren_runtime::ResumeKind::Memory);
    assert_eq!(run(resumed.agent, SUMS).await, sums);
    assert_eq!(counter(resumed.agent).await.0, pid, "its processes go on");
    rt.kill("finishedvm").await.unwrap();
    rt.shutdown().await.expect("shutdown");
    cleanup(&cfg);
}

/// A snapshot whose task is dropped while its memory is being shared (the server stopping)
/// leaves no helper QEMU and no files, and the VM runs on; a helper left by a server that
/// died (here a stand-in process named as a helper's QEMU is, by its disk) is killed and its
/// directory removed at the next start, while the VM of the same name is kept.
#[tokio::test(flavor = "multi_thread")]
async fn a_checkpoint_helper_never_outlives_its_snapshot() {
    let Some((cfg, vm)) = config("h", 4) else {
        return;
    };
    let rt = start(&cfg, &vm, vec![]).await;
    let s = rt
        .create(spec("sharedvm"))
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    let name = s.record["name"].as_str().unwrap().to_string();
    let work = cfg
        .data_dir
        .join("vm/capture")
        .join(format!("{}-vm", cfg.cgroup_parent))
        .join(&name);
    let snapshots = cfg.data_dir.join("vm-checkpoints/snapshots");

    let mut snap = Box::pin(rt.snapshot("sharedvm", "dropped", true));
    let pid = loop {
        tokio::select! {
            r = &mut snap => panic!(
                "the snapshot ended ({:?}) before its helper was seen",
                r.map(|i| i.bytes).map_err(|e| warren_runtime::chain(&e))
            ),
            _ = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
        let recorded = std::fs::read_to_string(work.join("pid")).ok();
        if let Some(pid) = recorded.and_then(|p| p.trim().parse::<u32>().ok()) {
            break pid;
        }
    };
    assert!(alive(pid), "the helper runs");
    drop(snap);
    assert!(
        gone(pid).await,
        "the helper QEMU outlived its dropped snapshot"
    );
    assert!(!work.exists(), "the helper's directory is left behind");
    assert!(
        !entries(&snapshots).contains(&"dropped.partial".to_string()),
        "the unfinished checkpoint is left behind: {:?}",
        entries(&snapshots)
    );
    assert_eq!(run(s.agent, "echo ok").await, (0, "ok\n".into()));

    std::fs::create_dir_all(&work).unwrap();
    let disk = format!("file={},", work.join("disk.qcow2").display());
    let mut stray = std::process::Command::new("python3")
        .args(["-c", "import time; time.sleep(600)", &disk])
        .spawn()
        .expect("python3");
    std::fs::write(work.join("pid"), stray.id().to_string()).unwrap();
    rt.release().await.expect("release");
    let rt = start(&cfg, &vm, vec![s.clone()]).await;
    let stray_pid = stray.id();
    if !gone(stray_pid).await {
        let _ = stray.kill();
    }
    let status = stray.wait().expect("wait");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL),
        "the stray helper was not killed"
    );
    assert!(!work.exists(), "the stray helper's directory is left");
    assert_eq!(run(s.agent, "echo ok").await, (0, "ok\n".into()));
    rt.kill("sharedvm").await.unwrap();
    rt.shutdown().await.expect("shutdown");
    assert!(
        !work.parent().unwrap().exists(),
        "the runtime's capture directory outlived its shutdown"
    );
    cleanup(&cfg);
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

/// Whether `pid` has exited within a minute (a killed QEMU releases its RAM first).
async fn gone(pid: u32) -> bool {
    for _ in 0..600 {
        if !alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

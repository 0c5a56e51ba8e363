//! A host is back where it started after sandboxes come and go: no zombie children of the
//! manager (it is the child subreaper of everything it starts), and no state left; and a
//! sandbox that dies on its own is reported at once, with its cause. Needs root, nftables and
//! the base image.

mod common;

use common::run;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use warren_host::HostConfig;
use warren_runtime::{CreateSpec, SandboxRuntime};
use warren_runtime_ns::NsRuntime;

fn config(tag: &str, octet: u32) -> Option<HostConfig> {
    common::HostTest {
        name: "leaks",
        tag,
        prefix: "wz",
        octet,
        pool_size: 2,
        private_data: true,
    }
    .config()
}

fn spec(id: &str) -> CreateSpec {
    CreateSpec {
        volumes: Vec::new(),
        id: id.into(),
        template: "base".into(),
        cpu_count: 1,
        memory_mb: 256,
        disk_mb: 128,
        allow_internet_access: false,
        egress: Default::default(),
        env_vars: BTreeMap::new(),
        access_token: Some("tok".into()),
        from_snapshot: None,
    }
}

/// This process's children that ended and were never waited for: `(pid, name)`.
fn zombies() -> Vec<(u32, String)> {
    let me = std::process::id();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces and parentheses, so from the last ')'.
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let name = stat[stat.find('(').unwrap_or(0) + 1..close].to_string();
        let rest: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        if rest.first() == Some(&"Z") && rest.get(1).and_then(|p| p.parse::<u32>().ok()) == Some(me)
        {
            out.push((pid, name));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn sandboxes_that_come_and_go_leave_no_zombies_and_no_state() {
    let Some(cfg) = config("z", 47) else { return };
    let rt = NsRuntime::start(cfg.clone()).await.expect("start");
    rt.reattach(vec![]).await;
    let before = zombies();
    for round in 0..6 {
        let id = format!("leak{round}");
        let s = rt.create(spec(&id)).await.expect("create");
        let (code, out) = run(s.agent, "sleep 60 & echo started").await;
        assert_eq!((code, out.as_str()), (0, "started\n"));
        rt.kill(&id).await.expect("kill");
    }
    // Whatever ends is waited for at once; a moment for the last exit to arrive.
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut left = zombies();
    while left.len() > before.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        left = zombies();
    }
    assert_eq!(
        left, before,
        "zombie children of the manager after 6 sandboxes"
    );
    let state: Vec<_> = std::fs::read_dir(cfg.run_dir.join("sandboxes"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(state.is_empty(), "sandbox state left: {state:?}");
    rt.shutdown().await.expect("shutdown");
    common::cleanup(&cfg);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_that_dies_is_reported_at_once_with_its_cause() {
    let Some(cfg) = config("x", 48) else { return };
    let rt = NsRuntime::start(cfg.clone()).await.expect("start");
    rt.reattach(vec![]).await;
    let s = rt.create(spec("dies")).await.expect("create");
    assert_eq!(rt.status("dies").await.expect("status"), None, "running");
    let signal = rt
        .exit_signal()
        .expect("the ns runtime says when sandboxes end");
    let told = signal.notified();
    let pid1 = s.record["pid1"].as_u64().unwrap() as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid1),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // A deadline for a hang only: the signal comes with nsinit's exit.
    tokio::time::timeout(Duration::from_secs(60), told)
        .await
        .expect("no exit signal after PID 1 was killed");
    let exit = loop {
        match rt.status("dies").await.expect("status") {
            Some(exit) => break exit,
            // nsinit may still be writing the exit status.
            None => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    assert!(
        exit.reason.contains('9') || exit.reason.contains("KILL"),
        "{exit:?}"
    );
    rt.kill("dies").await.expect("kill");
    rt.shutdown().await.expect("shutdown");
    common::cleanup(&cfg);
}

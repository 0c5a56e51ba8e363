//! The vm runtime end to end under TCG (or KVM where truly usable): sandboxes forked from a
//! template snapshot in real network slots, a warm pool, kill and crash cleanup, and a
//! restarted manager taking running VMs back. Needs root, nftables, QEMU and the base image;
//! without root or QEMU the tests print `SKIP:` and why (`WARREN_REQUIRE_ALL=1` makes that a
//! failure).

mod common;

use common::run;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use warren_host::HostConfig;
use warren_runtime::{CreateSpec, RuntimeError, SandboxRuntime};
use warren_runtime_vm::{VmRuntime, VmSettings};

/// A config of its own (prefix, addresses, cgroups, state) per test.
fn config(tag: &str, n: u32) -> Option<(HostConfig, VmSettings)> {
    common::VmTest {
        name: "vm",
        prefix: "wv",
        octet: 15,
        pool_size: 2,
        warm_pool: 1,
    }
    .config(tag, n, Path::new(common::SHARED_DATA))
}

fn spec(id: &str) -> CreateSpec {
    CreateSpec {
        allow_internet_access: true,
        env_vars: BTreeMap::from([("FROM_CREATE".to_string(), "yes".to_string())]),
        ..common::small_spec(id)
    }
}

async fn start(cfg: &HostConfig, vm: &VmSettings) -> Arc<VmRuntime> {
    let rt = VmRuntime::start(cfg.clone(), vm.clone())
        .await
        .expect("start");
    rt.reattach(vec![]).await;
    rt.prepare_template("base")
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    rt
}

/// Where the runtime keeps this config's VM directories (on the data disk, not in `/run`).
fn vms_dir(cfg: &HostConfig) -> PathBuf {
    cfg.data_dir
        .join("vm/vms")
        .join(format!("{}-vm", cfg.cgroup_parent))
}

fn vm_dirs(cfg: &HostConfig) -> usize {
    std::fs::read_dir(vms_dir(cfg)).map_or(0, |d| d.count())
}

#[tokio::test(flavor = "multi_thread")]
async fn forks_run_commands_independently_and_clean_up() {
    let Some((cfg, vm)) = config("a", 0) else {
        return;
    };
    let rt = start(&cfg, &vm).await;
    // The warm pool holds one QEMU; the second create forks a fresh one.
    let a = rt
        .create(spec("forka"))
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    let b = rt
        .create(spec("forkb"))
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    assert_ne!(a.agent, b.agent);
    assert_eq!(
        run(a.agent, "echo $FROM_CREATE $E2B_SANDBOX_ID").await,
        (0, "yes forka\n".into())
    );
    assert_eq!(run(b.agent, "whoami").await, (0, "user\n".into()));
    assert_eq!(
        run(a.agent, "echo only-a > /home/user/f && cat /home/user/f").await,
        (0, "only-a\n".into())
    );
    assert_ne!(
        run(b.agent, "cat /home/user/f").await.0,
        0,
        "forks share no disk"
    );
    // The guest clock was set from the host's by /init.
    let (_, guest) = run(a.agent, "date +%s").await;
    let host = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let guest: i64 = guest.trim().parse().unwrap();
    assert!(
        (guest - host).abs() < 120,
        "guest clock {guest} vs host {host}"
    );
    assert!(rt.status("forka").await.unwrap().is_none());
    // QEMU runs as the VM's own unprivileged user, not root.
    let pid = a.record["pid"].as_u64().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid: u32 = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|u| u.parse().ok())
        .unwrap();
    assert!(uid >= 200_000, "QEMU runs as uid {uid}");

    let before = vm_dirs(&cfg);
    rt.kill("forka").await.expect("kill");
    assert_eq!(vm_dirs(&cfg), before - 1, "kill removes the VM's files");
    assert!(matches!(
        rt.kill("forka").await,
        Err(RuntimeError::NotFound(_))
    ));
    rt.kill("forkb").await.expect("kill");

    // A deleted template's warm QEMU goes with it.
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    while rt.warm_count("base").await < 1 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(rt.warm_count("base").await, 1, "the warm pool refilled");
    assert_eq!(vm_dirs(&cfg), 1, "the warm QEMU's directory");
    rt.forget_template("base").await;
    assert_eq!(rt.warm_count("base").await, 0);
    assert_eq!(vm_dirs(&cfg), 0, "forgetting removes the warm QEMU's files");

    rt.shutdown().await.expect("shutdown");
    assert!(!Path::new(&format!("/run/netns/{}-0", cfg.net.prefix)).exists());
    common::cleanup(&cfg);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crashed_vm_is_reported_failed_and_freed() {
    let Some((cfg, vm)) = config("c", 1) else {
        return;
    };
    let rt = start(&cfg, &vm).await;
    let s = rt
        .create(spec("crashy"))
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    let pid = s.record["pid"].as_u64().unwrap() as i32;
    let name = s.record["name"].as_str().unwrap().to_string();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let mut reason = None;
    for _ in 0..200 {
        if let Some(exit) = rt.status("crashy").await.unwrap() {
            reason = Some(exit.reason);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reason = reason.expect("the crash is reported");
    assert!(
        reason.contains("QEMU") && reason.contains("signal"),
        "{reason}"
    );
    // Its files go without a kill.
    for _ in 0..100 {
        if !vms_dir(&cfg).join(&name).exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!vms_dir(&cfg).join(&name).exists());
    rt.kill("crashy").await.expect("kill of a failed sandbox");
    rt.shutdown().await.expect("shutdown");
    common::cleanup(&cfg);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_manager_takes_back_running_vms() {
    let Some((cfg, vm)) = config("r", 2) else {
        return;
    };
    let first = start(&cfg, &vm).await;
    let kept = first
        .create(spec("keptvm"))
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    let doomed = first
        .create(spec("doomedvm"))
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    assert_eq!(
        run(kept.agent, "echo state > /home/user/f && echo ok").await,
        (0, "ok\n".into())
    );
    // The manager goes away without tearing anything down; one VM dies meanwhile.
    first.release().await.expect("release");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = doomed.record["pid"].as_u64().unwrap() as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let second = VmRuntime::start(cfg.clone(), vm.clone())
        .await
        .expect("restart");
    let results = second.reattach(vec![kept.clone(), doomed.clone()]).await;
    let back = results[0].1.as_ref().expect("the running VM is taken back");
    assert_eq!(back.agent, kept.agent);
    assert!(results[1].1.is_err(), "the dead VM is reported failed");
    assert_eq!(
        run(kept.agent, "cat /home/user/f").await,
        (0, "state\n".into())
    );
    second.kill("keptvm").await.expect("kill after restart");
    assert_eq!(vm_dirs(&cfg), 0, "stale and killed VMs are gone");
    second.shutdown().await.expect("shutdown");
    common::cleanup(&cfg);
}

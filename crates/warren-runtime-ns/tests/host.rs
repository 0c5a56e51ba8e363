//! The host manager end to end: real namespace sandboxes on real network slots, with the
//! isolation checked from inside the sandboxes. Needs root, nftables and the base image.

mod common;

use common::run;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use warren_host::HostConfig;
use warren_runtime::{CreateSpec, RuntimeSandbox, SandboxRuntime};
use warren_runtime_ns::NsRuntime;

fn config() -> Option<HostConfig> {
    common::HostTest {
        name: "host",
        tag: "",
        prefix: "wh",
        octet: 13,
        pool_size: 2,
        private_data: false,
    }
    .config()
}

fn spec(id: &str, internet: bool) -> CreateSpec {
    CreateSpec {
        resources: common::MEDIUM,
        allow_internet_access: internet,
        env_vars: BTreeMap::from([("FROM_CREATE".to_string(), "yes".to_string())]),
        ..common::small_spec(id)
    }
}

/// A TCP connect from inside the sandbox: prints `open` or the error.
fn probe(addr: &str, port: u16) -> String {
    format!(
        "python3 -c \"import socket\ns=socket.socket(); s.settimeout(2)\ntry:\n  s.connect(('{addr}', {port})); print('open')\nexcept Exception as e:\n  print('closed', type(e).__name__)\""
    )
}

fn host_ip(sbx: &RuntimeSandbox) -> String {
    sbx.agent.ip().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn sandboxes_are_isolated_from_each_other_and_the_host() {
    let Some(cfg) = config() else { return };
    let rt: Arc<NsRuntime> = NsRuntime::start(cfg.clone(), common::ns_settings())
        .await
        .expect("start");
    assert!(rt.reattach(vec![]).await.is_empty());
    let a = rt.create(spec("hosta", true)).await.expect("create a");
    let b = rt.create(spec("hostb", false)).await.expect("create b");
    assert_ne!(
        a.agent, b.agent,
        "each sandbox has its own host-side address"
    );

    // Environment from create and from the runtime.
    let (code, out) = run(
        a.agent,
        "echo $FROM_CREATE $E2B_SANDBOX_ID; id -un; hostname",
    )
    .await;
    assert_eq!((code, out.as_str()), (0, "yes hosta\nuser\nhosta\n"));
    // Both sandboxes see the same address inside.
    let (_, ip_a) = run(a.agent, "ip -4 -o addr show eth0 | awk '{print $4}'").await;
    let (_, ip_b) = run(b.agent, "ip -4 -o addr show eth0 | awk '{print $4}'").await;
    assert_eq!(ip_a, ip_b);

    // A cannot reach B's agent, nor a service on the host (standing in for the control plane).
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let _ = listener.accept().await;
        }
    });
    assert!(run(a.agent, &probe(&host_ip(&b), 49983))
        .await
        .1
        .starts_with("closed"));
    let gateway = run(a.agent, "ip route | awk '/default/ {print $3}'")
        .await
        .1
        .trim()
        .to_string();
    for target in [gateway.as_str(), &host_ip(&a), &host_ip(&b)] {
        let (_, out) = run(a.agent, &probe(target, port)).await;
        assert!(
            out.starts_with("closed"),
            "sandbox reached the host at {target}:{port}: {out}"
        );
    }
    // Without internet access the host still reaches the agent (we are talking to it).
    assert_eq!(
        run(b.agent, "echo reachable").await,
        (0, "reachable\n".into())
    );

    rt.kill("hosta").await.expect("kill a");
    assert!(matches!(
        rt.kill("hosta").await,
        Err(warren_runtime::RuntimeError::NotFound(_))
    ));
    assert!(reqwest::Client::new()
        .get(format!("http://{}/health", a.agent))
        .timeout(std::time::Duration::from_secs(2))
        .send()
        .await
        .is_err());
    rt.kill("hostb").await.expect("kill b");
    rt.shutdown().await.expect("shutdown");
    common::cleanup(&cfg);
    let cgroups = std::fs::read_dir("/sys/fs/cgroup/pids").unwrap();
    let prefix = cfg.cgroup_parent;
    for c in cgroups.flatten() {
        if c.file_name().to_string_lossy() == prefix {
            assert_eq!(
                std::fs::read_dir(c.path())
                    .unwrap()
                    .filter(|e| e.as_ref().unwrap().path().is_dir())
                    .count(),
                0
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_manager_takes_back_running_sandboxes() {
    let Some(mut cfg) = config() else { return };
    // Its own prefix, addresses and cgroups: the other test in this binary runs concurrently.
    cfg.net.prefix = format!("wr{}", std::process::id() % 100_000);
    let third = warren_testkit::net::free_third_octet(
        14,
        (0..250).map(|k| ((std::process::id() + k) % 250) as u8),
    );
    cfg.net.host_cidr = format!("10.14.{third}.0/24").parse().unwrap();
    cfg.cgroup_parent.push_str("-restart");
    cfg.run_dir = PathBuf::from(format!("{}-restart", cfg.run_dir.display()));
    cfg.net.run_dir = cfg.run_dir.join("net");
    // Not the other test's: a runtime sweeps its templates directory when it starts.
    cfg.templates_dir = cfg.run_dir.join("templates");

    let first = NsRuntime::start(cfg.clone(), common::ns_settings())
        .await
        .expect("start");
    first.reattach(vec![]).await;
    let kept = first.create(spec("keptalive", true)).await.expect("create");
    let doomed = first.create(spec("doomed", true)).await.expect("create");
    assert_eq!(
        run(kept.agent, "echo state > /home/user/f && echo ok").await,
        (0, "ok\n".into())
    );
    // The manager goes, as a server that exits: nothing is torn down. One sandbox dies while
    // it is away.
    first.release().await.expect("release");
    let (_, pid) = run(doomed.agent, "echo $PPID").await;
    let _ = pid;
    let record: serde_json::Value = doomed.record.clone();
    let pid1 = record["pid1"].as_u64().unwrap() as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid1),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;

    let second = NsRuntime::start(cfg.clone(), common::ns_settings())
        .await
        .expect("restart");
    let results = second.reattach(vec![kept.clone(), doomed.clone()]).await;
    assert_eq!(results.len(), 2);
    let back = results[0]
        .1
        .as_ref()
        .expect("the running sandbox is taken back");
    assert_eq!(back.agent, kept.agent);
    assert!(results[1].1.is_err(), "the dead sandbox is reported failed");
    assert_eq!(
        run(kept.agent, "cat /home/user/f").await,
        (0, "state\n".into())
    );
    second.kill("keptalive").await.expect("kill after restart");
    assert!(matches!(
        second.kill("doomed").await,
        Err(warren_runtime::RuntimeError::NotFound(_))
    ));
    second.shutdown().await.expect("shutdown");
    assert!(!std::path::Path::new(&format!("/run/netns/{}-0", cfg.net.prefix)).exists());
    common::cleanup(&cfg);
}

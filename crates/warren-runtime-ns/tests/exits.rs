//! A sandbox that dies on its own is reported at once, with its cause: the runtime signals
//! the exit and `status` names how PID 1 ended. Needs root, nftables and the base image.

mod common;

use std::time::Duration;

use warren_host::HostConfig;
use warren_runtime::SandboxRuntime;
use warren_runtime_ns::NsRuntime;

fn config() -> Option<HostConfig> {
    common::HostTest {
        name: "exits",
        tag: "",
        prefix: "wx",
        octet: 48,
        pool_size: 1,
        private_data: true,
    }
    .config()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_that_dies_is_reported_at_once_with_its_cause() {
    let Some(cfg) = config() else { return };
    let rt = NsRuntime::start(cfg.clone(), common::ns_settings())
        .await
        .expect("start");
    rt.reattach(vec![]).await;
    let s = rt.create(common::small_spec("dies")).await.expect("create");
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

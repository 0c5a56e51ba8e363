//! Volumes in the vm runtime: each VM's NFS helper (`warren-nfsd`) serves its volumes, lives
//! in the VM's cgroup, survives a restart of the manager (or is started again by the next
//! one if it ended), is up before a paused VM wakes up with its mount, and ends with the VM.
//! Needs root, nftables, QEMU and the base image; without root or QEMU the test prints
//! `SKIP:` and why.

mod common;

use common::{cleanup, run};

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use warren_host::cgroup::SandboxCgroup;
use warren_host::HostConfig;
use warren_runtime::{
    CreateSpec, PauseMode, ResumeKind, RuntimeSandbox, SandboxRuntime, VolumeMount,
};
use warren_runtime_vm::{VmRuntime, VmSettings};

fn config(tag: &str) -> Option<(HostConfig, VmSettings)> {
    if !common::have_vm_host() {
        return None;
    }
    common::VmTest {
        name: "vmv",
        prefix: "wn",
        octet: 23,
        pool_size: 3,
        warm_pool: 0,
    }
    .config(tag, 0, &common::private_data_dir(tag))
}

fn spec(id: &str, volume: &Path, subpath: Option<&str>) -> CreateSpec {
    CreateSpec {
        volumes: vec![VolumeMount {
            volume_id: "voltest".into(),
            source: volume.to_path_buf(),
            subpath: subpath.map(str::to_string),
            path: "/data".into(),
            read_only: false,
        }],
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

/// The `warren-nfsd` processes in the cgroup of VM `s`.
fn helpers(cfg: &HostConfig, s: &RuntimeSandbox) -> Vec<u32> {
    let name = s.record["name"].as_str().expect("the VM's name");
    SandboxCgroup::at(&format!("{}-vm", cfg.cgroup_parent), name)
        .pids()
        .into_iter()
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm"))
                .is_ok_and(|c| c.trim() == "warren-nfsd")
        })
        .collect()
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_vms_volume_is_served_by_its_own_helper_for_as_long_as_the_vm_lives() {
    let Some((cfg, vm)) = config("v") else {
        return;
    };
    let vol = tempfile::tempdir_in("/var/tmp").unwrap();
    let root: PathBuf = vol.path().to_path_buf();
    std::os::unix::fs::chown(&root, Some(1000), Some(1000)).unwrap();
    let rt = start(&cfg, &vm, vec![]).await;
    let s = rt
        .create(spec("volvm", &root, None))
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    let (code, out) = run(
        s.agent,
        "echo hi > /data/a && id -u && grep ' /data nfs ' /proc/mounts",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("nosuid") && out.contains("nodev"), "{out}");
    let uid = out.lines().next().unwrap().trim().parse::<u32>().unwrap();
    assert_eq!(std::fs::read_to_string(root.join("a")).unwrap(), "hi\n");
    assert_eq!(std::fs::metadata(root.join("a")).unwrap().uid(), uid);
    let first = helpers(&cfg, &s);
    assert_eq!(first.len(), 1, "one helper in the VM's cgroup");

    // The manager restarts: the VM and its helper keep running and are taken back.
    rt.release().await.expect("release");
    let rt = start(&cfg, &vm, vec![s.clone()]).await;
    assert!(alive(first[0]));
    assert_eq!(run(s.agent, "cat /data/a").await, (0, "hi\n".into()));

    // A helper that ended while the manager was down is started again when the VM is
    // taken back, and the guest's mount answers again.
    rt.release().await.expect("release");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first[0] as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    while helpers(&cfg, &s).contains(&first[0]) {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let rt = start(&cfg, &vm, vec![s.clone()]).await;
    let first = helpers(&cfg, &s);
    assert_eq!(first.len(), 1, "the helper was started again");
    assert_eq!(
        run(s.agent, "echo again > /data/c && cat /data/a").await,
        (0, "hi\n".into())
    );
    assert_eq!(std::fs::read_to_string(root.join("c")).unwrap(), "again\n");

    // A memory pause ends the VM and its helper; the resumed guest wakes up holding its
    // mount and finds a new helper serving it, with what was written meanwhile.
    let paused = rt.pause("volvm", PauseMode::Memory).await.unwrap();
    assert!(!alive(first[0]), "the helper ended with its VM");
    std::fs::write(root.join("b"), "while paused\n").unwrap();
    let (back, kind) = rt
        .resume(spec("volvm", &root, None))
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    assert_eq!(kind, ResumeKind::Memory);
    assert_eq!(
        run(back.agent, "cat /data/a /data/b").await,
        (0, "hi\nwhile paused\n".into())
    );
    let second = helpers(&cfg, &back);
    assert_eq!(second.len(), 1);
    drop(paused);

    // A subpath through a link fails the create and leaves nothing running.
    std::os::unix::fs::symlink("/etc", root.join("link")).unwrap();
    let e = rt
        .create(spec("linkvm", &root, Some("link")))
        .await
        .expect_err("a subpath through a link");
    assert!(
        warren_runtime::chain(&e).contains("subpath"),
        "{}",
        warren_runtime::chain(&e)
    );

    rt.kill("volvm").await.unwrap();
    assert!(!alive(second[0]), "the helper ended with its VM");
    rt.shutdown().await.unwrap();
    cleanup(&cfg);
}

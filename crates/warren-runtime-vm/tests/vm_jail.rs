//! The vm runtime's host-side confinement, observed from the host with real QEMUs (TCG here):
//! every QEMU (the template boot too) runs jailed as an unprivileged user with an empty
//! environment, its files are root's alone and off `/run`, its console is capped, checkpoints
//! are sealed 0400, a guest-rewritten overlay header never makes root copy a host file, and a
//! data directory of mode 0700 works. Needs root, nftables, QEMU and the base image; without
//! root or QEMU the tests print `SKIP:` and why (`WARREN_REQUIRE_ALL=1` makes that a failure).

mod common;

use common::run;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use warren_host::HostConfig;
use warren_runtime::{CreateSpec, PauseMode, SandboxRuntime};
use warren_runtime_vm::{VmRuntime, VmSettings};

/// A config of its own (prefix, addresses, cgroups, state) per test.
fn config(tag: &str, n: u32, data: &Path) -> Option<(HostConfig, VmSettings)> {
    common::VmTest {
        name: "vm",
        prefix: "wv",
        octet: 16,
        pool_size: 2,
        warm_pool: 0,
    }
    .config(tag, n, data)
}

fn spec(id: &str) -> CreateSpec {
    CreateSpec {
        allow_internet_access: true,
        ..common::small_spec(id)
    }
}

fn data_dir() -> PathBuf {
    PathBuf::from(common::SHARED_DATA)
}

/// `Uid:`/`Gid:` fields and the other lines of `/proc/<pid>/status`.
fn status(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap()
}

fn ids(status: &str, key: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|u| u.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Pids of QEMUs whose command line mentions `needle`.
fn qemus_with(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd);
        let program = cmd.split('\0').next().unwrap_or_default();
        if program.contains("qemu-system") && cmd.contains(needle) {
            out.push(pid);
        }
    }
    out
}

/// The writable disk QEMU `pid` opened (its VM directory is the disk's).
fn overlay_of(pid: u32) -> PathBuf {
    let cmdline = String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap())
        .into_owned();
    cmdline
        .split(['\0', ','])
        .find_map(|a| {
            a.strip_prefix("file=")
                .filter(|p| p.ends_with("disk.qcow2"))
        })
        .map(PathBuf::from)
        .expect("the overlay on QEMU's command line")
}

/// Size of the filesystem a VM's console lives on.
const LOG_CAP_BYTES: u64 = 2 << 20;

fn assert_root_only(path: &Path, mode: u32) {
    let m = std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        (m.uid(), m.gid(), m.mode() & 0o777),
        (0, 0, mode),
        "{} must be {mode:o} root",
        path.display()
    );
}

async fn wait_exit(rt: &VmRuntime, id: &str) -> String {
    for _ in 0..400 {
        if let Some(exit) = rt.status(id).await.unwrap() {
            return exit.reason;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{id} did not end");
}

/// The pid a process has in its innermost pid namespace (`NSpid:`'s last field), when that
/// is not the host's namespace.
fn nspid(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
    let pids: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|p| p.parse().ok())
        .collect();
    (pids.len() > 1).then(|| *pids.last().unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn qemu_is_jailed_unprivileged_and_keeps_off_run() {
    let Some((cfg, vm)) = config("j", 0, &data_dir()) else {
        return;
    };
    let rt = VmRuntime::start(cfg.clone(), vm.clone())
        .await
        .expect("start");
    rt.reattach(vec![]).await;
    // The template boot (its run directory is new: the snapshot is made now) is watched
    // from the host while it runs.
    let prepare = {
        let rt = rt.clone();
        tokio::spawn(async move { rt.prepare_template("base").await })
    };
    let mut boot_uids = Vec::new();
    let mut boot_inner_pids = Vec::new();
    let needle = cfg.run_dir.join("vm/snapshots").display().to_string();
    while !prepare.is_finished() {
        for pid in qemus_with(&needle) {
            let st = status(pid);
            boot_uids.extend(ids(&st, "Uid:"));
            if let Some(inner) = nspid(&st) {
                boot_inner_pids.push(inner);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    prepare
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    assert!(!boot_uids.is_empty(), "the template boot was seen");
    assert!(
        boot_uids.iter().all(|&u| u != 0),
        "the template boot's QEMU runs unprivileged: {boot_uids:?}"
    );
    assert!(
        !boot_inner_pids.is_empty() && boot_inner_pids.iter().all(|&p| p == 1),
        "the template boot's QEMU is the init of a pid namespace of its own: {boot_inner_pids:?}"
    );

    let s = rt
        .create(spec("jailed"))
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    let pid = s.record["pid"].as_u64().unwrap() as u32;
    let st = status(pid);
    let uids = ids(&st, "Uid:");
    assert!(
        uids.len() == 4 && uids.iter().all(|&u| u >= 200_000),
        "{st}"
    );
    assert!(ids(&st, "Gid:").iter().all(|&g| g >= 200_000), "{st}");
    assert!(
        ids(&st, "Groups:").is_empty(),
        "no supplementary groups under TCG: {st}"
    );
    assert!(st.contains("NoNewPrivs:\t1"), "{st}");
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    assert!(
        environ.is_empty(),
        "QEMU inherits no environment: {}",
        String::from_utf8_lossy(&environ)
    );
    // Its own mount, IPC, UTS and pid namespaces (it is the init of the last: it sees no
    // other process); its root is an empty tree, not the host's.
    assert_eq!(nspid(&st), Some(1), "{st}");
    for ns in ["mnt", "ipc", "uts", "pid"] {
        let theirs = std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).unwrap();
        let ours = std::fs::read_link(format!("/proc/self/ns/{ns}")).unwrap();
        assert_ne!(theirs, ours, "{ns} namespace");
    }
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    let inside = |p: &Path| root.join(p.strip_prefix("/").unwrap());
    assert!(
        !root.join("etc/shadow").exists(),
        "/etc/shadow is not in the jail"
    );
    assert!(!root.join("etc/passwd").exists());
    assert!(!root.join("proc/self").exists(), "no /proc in the jail");
    assert!(!inside(&cfg.data_dir.join("warren.db")).exists());
    assert!(!inside(&cfg.run_dir.join("host.lock")).exists());
    let disk = overlay_of(pid);
    let dir = disk.parent().unwrap().to_path_buf();
    let mut visible: Vec<String> = std::fs::read_dir(inside(&dir))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    visible.sort();
    assert_eq!(
        visible,
        ["disk.qcow2", "out"],
        "of its directory QEMU sees its disk and its checkpoint outbox only (no token, pid, \
         source.json, QMP socket)"
    );
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let limit = |name: &str| {
        limits
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} in {limits}"))
            .to_string()
    };
    assert!(limit("Max open files").contains("1024"), "{limits}");
    assert!(!limit("Max file size").contains("unlimited"), "{limits}");
    assert!(!limit("Max processes").contains("unlimited"), "{limits}");

    // Disks and logs on the data disk, root's alone; QEMU's QMP socket and console are
    // descriptors it inherited.
    let cmdline = String::from_utf8(std::fs::read(format!("/proc/{pid}/cmdline")).unwrap())
        .unwrap()
        .replace('\0', " ");
    assert!(
        cmdline.contains(&format!("file={},", disk.display())),
        "{cmdline}"
    );
    assert!(!disk.starts_with("/run") && !dir.starts_with("/run"));
    assert!(!cmdline.contains("unix:"), "{cmdline}");
    assert_root_only(&dir, 0o700);
    for f in ["disk.qcow2", "log/console.log", "log/qemu.log", "token"] {
        assert_root_only(&dir.join(f), 0o600);
    }
    // Nothing in it belongs to QEMU's user (it could replace or rewrite it).
    for f in ["qmp.sock", "pid", "source.json", "out", "log"] {
        assert_eq!(
            std::fs::symlink_metadata(dir.join(f)).unwrap().uid(),
            0,
            "{f}"
        );
    }

    // The guest's console text cannot forge lines of the exit reason (and so of logs).
    run(
        s.agent,
        "sudo sh -c \"printf '\\n2030-01-01T00:00:00Z ERROR warren: FAKE-LINE\\n' > /dev/ttyS0\"",
    )
    .await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let reason = wait_exit(&rt, "jailed").await;
    assert!(
        reason.contains("FAKE-LINE"),
        "{}",
        &reason[..reason.len().min(2000)]
    );
    assert!(
        !reason.chars().any(|c| c.is_control()),
        "the exit reason is one line: {reason:?}"
    );
    rt.kill("jailed").await.expect("kill");
    for _ in 0..100 {
        if !dir.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!dir.exists(), "the VM's directory is removed");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&dir.display().to_string()),
        "its log tmpfs is unmounted"
    );
    // The console lives on a 2 MiB tmpfs of its own: a guest flooding it fills that.
    let f = rt
        .create(spec("flood"))
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    let fdir = overlay_of(f.record["pid"].as_u64().unwrap() as u32)
        .parent()
        .unwrap()
        .to_path_buf();
    let (code, _) = run(
        f.agent,
        "sudo sh -c 'head -c 3000000 /dev/zero | tr \"\\0\" x > /dev/ttyS0'; echo done",
    )
    .await;
    assert_eq!(code, 0);
    let console = std::fs::metadata(fdir.join("log/console.log"))
        .unwrap()
        .len();
    assert!(
        (1 << 20..=LOG_CAP_BYTES).contains(&console),
        "the flood filled the console's filesystem and no more: {console} bytes"
    );
    assert_eq!(run(f.agent, "echo alive").await, (0, "alive\n".into()));

    rt.kill("flood").await.expect("kill");
    rt.shutdown().await.expect("shutdown");
    let _ = std::fs::remove_dir_all(&cfg.run_dir);
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

#[tokio::test(flavor = "multi_thread")]
async fn checkpoints_are_sealed_root_only_and_still_restore() {
    let Some((cfg, vm)) = config("s", 1, &data_dir()) else {
        return;
    };
    let rt = start(&cfg, &vm).await;
    let id = format!("seal{}", std::process::id());
    let s = rt
        .create(spec(&id))
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    assert_eq!(
        run(s.agent, "echo kept > /home/user/f && echo ok").await,
        (0, "ok\n".into())
    );
    let key = format!("sealkey{}", std::process::id());
    rt.snapshot(&id, &key, true)
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    let snap = cfg.data_dir.join("vm-checkpoints/snapshots").join(&key);
    assert_root_only(&snap, 0o700);
    for f in ["mem", "state", "disk.qcow2", "meta.json"] {
        assert_root_only(&snap.join(f), 0o400);
    }
    let child = rt
        .create(CreateSpec {
            volumes: Vec::new(),
            from_snapshot: Some(key.clone()),
            ..spec(&format!("{id}c"))
        })
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    assert_eq!(
        run(child.agent, "cat /home/user/f").await,
        (0, "kept\n".into())
    );
    rt.kill(&format!("{id}c")).await.unwrap();
    rt.pause(&id, PauseMode::Memory)
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    let paused = cfg.data_dir.join("vm-checkpoints/paused").join(&id);
    for f in ["ram", "disk.qcow2", "meta.json"] {
        assert_root_only(&paused.join(f), 0o400);
    }
    let (back, _) = rt
        .resume(spec(&id))
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    assert_eq!(
        run(back.agent, "cat /home/user/f").await,
        (0, "kept\n".into())
    );
    rt.kill(&id).await.unwrap();
    rt.delete_snapshot(&key).await.unwrap();
    rt.shutdown().await.expect("shutdown");
    let _ = std::fs::remove_dir_all(&cfg.run_dir);
}

/// Points the backing file name in the qcow2 header of `overlay` at `target` (as a QEMU
/// compromised by its guest could: it writes that file).
fn rewrite_backing(overlay: &Path, target: &Path) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(overlay)
        .unwrap();
    let mut head = [0u8; 20];
    f.read_exact_at(&mut head, 0).unwrap();
    let offset = u64::from_be_bytes(head[8..16].try_into().unwrap());
    assert!(offset > 0, "the overlay has a backing file");
    let name = target.as_os_str().as_encoded_bytes();
    f.write_all_at(name, offset).unwrap();
    f.write_all_at(&(name.len() as u32).to_be_bytes(), 16)
        .unwrap();
    f.sync_all().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rewritten_overlay_backing_never_reaches_a_checkpoint() {
    let Some((cfg, vm)) = config("m", 2, &data_dir()) else {
        return;
    };
    let rt = start(&cfg, &vm).await;
    let id = format!("mthree{}", std::process::id());
    let s = rt
        .create(spec(&id))
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    // A root-only host file holding a secret.
    let secret_path = PathBuf::from(format!("/root/warren-m3-secret-{}", std::process::id()));
    let marker = format!("M3-SECRET-{}-", std::process::id());
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&secret_path)
            .unwrap();
        std::io::Write::write_all(&mut f, marker.repeat(1 << 14).as_bytes()).unwrap();
    }
    // The overlay QEMU writes (found as QEMU opened it).
    let overlay = overlay_of(s.record["pid"].as_u64().unwrap() as u32);
    rewrite_backing(&overlay, &secret_path);

    let key = format!("mthreekey{}", std::process::id());
    let result = rt.snapshot(&id, &key, false).await;
    let snap_dir = cfg.data_dir.join("vm-checkpoints/snapshots").join(&key);
    let leaked = snap_dir.join("disk.qcow2").exists() && {
        let raw = std::env::temp_dir().join(format!("m3-{}.raw", std::process::id()));
        let ok = std::process::Command::new("qemu-img")
            .args(["convert", "-O", "raw"])
            .arg(snap_dir.join("disk.qcow2"))
            .arg(&raw)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        let found = ok
            && std::fs::read(&raw)
                .map(|b| b.windows(marker.len()).any(|w| w == marker.as_bytes()))
                .unwrap_or(false);
        let _ = std::fs::remove_file(&raw);
        found
    };
    let _ = std::fs::remove_file(&secret_path);
    assert!(!leaked, "the root-only file was copied into the checkpoint");
    let err = result.expect_err("a checkpoint of a rewritten overlay is refused");
    // The reason is the error's cause, under what failed ("checkpoint").
    let err = warren_runtime::chain(&err);
    assert!(err.contains("backing file was changed"), "{err}");
    assert!(!snap_dir.exists(), "no checkpoint is left");
    // The sandbox runs on (its processes were continued).
    assert_eq!(run(s.agent, "echo alive").await, (0, "alive\n".into()));
    rt.kill(&id).await.unwrap();
    rt.shutdown().await.expect("shutdown");
    let _ = std::fs::remove_dir_all(&cfg.run_dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_data_dir_of_mode_0700_works() {
    let data = PathBuf::from(format!(
        "/var/lib/warren-vm-test-0700-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&data);
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    // The built image and kernel are shared with the usual data directory (the directory
    // above them is what must not need to be traversable).
    std::fs::create_dir_all(data.join("vm")).unwrap();
    let shared = data_dir();
    std::fs::create_dir_all(shared.join("images")).unwrap();
    std::os::unix::fs::symlink(shared.join("images"), data.join("images")).unwrap();
    if shared.join("vm/kernel").exists() {
        std::os::unix::fs::symlink(shared.join("vm/kernel"), data.join("vm/kernel")).unwrap();
    }
    let Some((cfg, vm)) = config("d", 3, &data) else {
        let _ = std::fs::remove_dir_all(&data);
        return;
    };
    let rt = start(&cfg, &vm).await;
    let s = rt
        .create(spec("private"))
        .await
        .unwrap_or_else(|e| panic!("{}", warren_runtime::chain(&e)));
    assert_eq!(run(s.agent, "echo ok").await, (0, "ok\n".into()));
    rt.kill("private").await.unwrap();
    rt.shutdown().await.expect("shutdown");
    let _ = std::fs::remove_dir_all(&cfg.run_dir);
    let _ = std::fs::remove_dir_all(&data);
}

//! Real namespace sandboxes from the real base image, asserted from inside through the agent.
//!
//! Needs root, the base image (built on first use by `warren-template`: mmdebstrap, erofs-utils,
//! network access to Debian's archive) and the agent binary (`cargo build -p warren-agent`).

mod common;

use std::path::Path;

use common::*;
use warren_host::cgroup::Limits;
use warren_runtime_ns::launch;

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_is_an_isolated_debian_system() {
    if !common::have_root() {
        return;
    }
    let r = start("isolated", limits(), 256 * MIB).await;
    let id = r.sbx().id.clone();
    assert_eq!(r.run("hostname"), (0, format!("{id}\n")));
    assert_eq!(
        r.run_as("user", "id -un; echo $HOME; pwd"),
        (0, "user\n/home/user\n/home/user\n".into())
    );
    // Root inside is an unprivileged id outside.
    let uid_line = std::fs::read_to_string(format!("/proc/{}/status", r.sbx().pid1)).unwrap();
    let host_uid = uid_line
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_string();
    assert_eq!(host_uid, r.sbx().id_base.to_string());
    // passwordless sudo for user, and the tools of the base image.
    assert_eq!(r.run_as("user", "sudo -n id -u"), (0, "0\n".into()));
    let (code, out) = r.run("python3 -c 'print(6*7)' && node -e 'console.log(6*7)' && git --version >/dev/null && echo ok");
    assert_eq!((code, out.as_str()), (0, "42\n42\nok\n"));
    // Cannot see host processes: only the sandbox's own few.
    let (_, ps) = r.run("ls /proc | grep -c '^[0-9]'");
    let n: u32 = ps.trim().parse().unwrap();
    assert!(n < 10, "sandbox sees {n} processes");
    let (code, _) = r.run(&format!("test -e /proc/{}", std::process::id()));
    assert_ne!(code, 0, "the host test process must not be visible");
    // Denied system calls fail (seccomp), e.g. setting the clock or loading keys.
    let (code, out) = r.run("date -s '2001-01-01' 2>&1");
    assert_ne!(code, 0, "{out}");
    // A minimal /dev, and terminals work.
    let (code, out) = r.run("ls /dev | sort | tr '\\n' ' '");
    assert_eq!(code, 0);
    for d in [
        "full", "null", "ptmx", "pts", "random", "shm", "tty", "urandom", "zero",
    ] {
        assert!(out.split(' ').any(|x| x == d), "/dev/{d} missing: {out}");
    }
    assert_eq!(r.run("head -c 4 /dev/zero | wc -c"), (0, "4\n".into()));
    let (_, cleanup) = r.destroy().await;
    let _ = cleanup;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_image_stays_read_only_and_sandboxes_do_not_share_files() {
    if !common::have_root() {
        return;
    }
    let a = start("shared-a", limits(), 128 * MIB).await;
    let b = start("shared-b", limits(), 128 * MIB).await;
    assert_eq!(
        a.run("echo secret > /home/user/secret && echo x > /usr/bin/planted && echo ok")
            .0,
        0
    );
    assert_eq!(b.run("ls /home/user/secret /usr/bin/planted 2>&1 | wc -l; test -e /usr/bin/planted || echo absent"), (0, "2\nabsent\n".into()));
    // The template image itself is untouched on the host.
    assert!(!image_root().join("usr/bin/planted").exists());
    // And a sandbox cannot write it directly either (its lower layer is read-only).
    let (_, mounts) = b.run("grep -c ' / ' /proc/self/mounts");
    assert!(mounts.trim() != "0");
    a.destroy().await;
    b.destroy().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn limits_hold_and_the_agent_survives() {
    if !common::have_root() {
        return;
    }
    let r = start(
        "limits",
        Limits {
            cpu_millis: Some(1000),
            memory_bytes: Some(256 * MIB),
            pids: Some(64),
        },
        64 * MIB,
    )
    .await;
    // Fork bomb: stops at the pids limit.
    let (_, out) = r.run(
        "python3 -c '\nimport os,time\nn=0\ntry:\n  while True:\n    if os.fork()==0:\n      time.sleep(30); os._exit(0)\n    n+=1\nexcept OSError as e:\n  print(n)\n'; pkill -9 sleep; true",
    );
    let forks: u32 = out
        .trim()
        .lines()
        .last()
        .unwrap_or("")
        .trim()
        .parse()
        .expect(&out);
    assert!(forks < 64, "forked {forks} times past a 64-pid limit");
    // Memory hog: killed inside its cgroup; the sandbox keeps serving.
    let (code, _) = r.run("python3 -c 'x = bytearray(1024 << 20); print(len(x))'");
    assert_ne!(code, 0);
    assert!(
        r.sbx().cgroup.oom_kills() >= 1,
        "expected an OOM kill in the sandbox's cgroup"
    );
    // Disk fill: stops at the writable layer's size.
    let (code, out) = r
        .run("dd if=/dev/zero of=/home/user/fill bs=1M count=200 2>&1; stat -c %s /home/user/fill");
    assert_eq!(code, 0);
    assert!(out.contains("No space left on device"), "{out}");
    let size: u64 = out.trim().lines().last().unwrap().parse().unwrap();
    assert!(size <= 64 * MIB, "wrote {size} bytes into a 64 MiB layer");
    assert_eq!(
        r.run("rm /home/user/fill && echo alive"),
        (0, "alive\n".into())
    );
    r.destroy().await;
}

/// Files live on the sandbox's disk, not in its memory: a sandbox keeps more files than its
/// memory limit without an OOM kill, and a full disk is ENOSPC to a sandbox that lives on.
#[tokio::test(flavor = "multi_thread")]
async fn files_are_disk_not_memory() {
    if !common::have_root() {
        return;
    }
    let small = Limits {
        memory_bytes: Some(128 * MIB),
        ..limits()
    };
    let r = start("diskfiles", small, 512 * MIB).await;
    let image = r.sbx().disk.clone();
    assert!(image.is_file(), "the sandbox's disk {}", image.display());
    let (code, out) = r.run(
        "dd if=/dev/urandom of=/home/user/big bs=1M count=300 2>&1 >/dev/null | tail -n1; \
         sync; sha256sum /home/user/big | cut -c1-16",
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        r.sbx().cgroup.oom_kills(),
        0,
        "OOM-killed for keeping files"
    );
    let sum = out.trim().lines().last().unwrap().to_string();
    // Past the disk's size: ENOSPC, and the sandbox and its files are fine.
    let (_, out) = r.run("dd if=/dev/zero of=/home/user/more bs=1M count=400 2>&1 | head -n1");
    assert!(out.contains("No space left on device"), "{out}");
    let (code, out) = r.run("rm /home/user/more; sha256sum /home/user/big | cut -c1-16");
    assert_eq!((code, out.trim()), (0, sum.as_str()));
    assert_eq!(r.sbx().cgroup.oom_kills(), 0);
    let (_, cfg) = r.destroy().await;
    assert!(
        !image.exists(),
        "the disk {} outlived its sandbox",
        image.display()
    );
    launch::remove_empty_parents(&cfg).expect("nothing left under the test's parents");
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_leaves_the_host_clean_and_stale_sandboxes_are_swept() {
    if !common::have_root() {
        return;
    }
    let r = start("sweep", limits(), 64 * MIB).await;
    let id = r.sbx().id.clone();
    let dir = r.cfg.state_dir.join(&id);
    let pid1 = r.sbx().pid1;
    let (leftover, cfg) = r.destroy().await;
    assert!(!leftover.cgroup.exists(), "cgroup removed");
    assert!(!dir.exists(), "state removed");
    assert!(
        !Path::new(&format!("/proc/{pid1}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid1}/stat"))
                .map(|s| s.contains(") Z "))
                .unwrap_or(true)
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(dir.to_str().unwrap()), "no mounts left");

    // A manager that crashed leaves a running sandbox behind: cleanup_stale removes it.
    let mut crashed = start("sweep", limits(), 64 * MIB).await;
    let stale = crashed.sbx.take().unwrap();
    let stale_dir = stale.dir.clone();
    let stale_cg = stale.cgroup.clone();
    std::mem::forget(stale);
    let removed = launch::cleanup_stale(&cfg, &[]);
    assert!(removed.contains(
        &std::path::Path::new(&stale_dir)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned()
    ));
    assert!(!stale_cg.exists());
    assert!(!stale_dir.exists());
    launch::remove_empty_parents(&cfg).expect("nothing left under the test's parents");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rebuild_during_the_run_does_not_change_the_agent_later_sandboxes_start() {
    if !common::have_root() {
        return;
    }
    // A build output of our own (pins are hard links: the same filesystem as target/).
    let out = target_dir().join(format!("pin-test-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let built = out.join("warren-agent");
    std::fs::copy(agent_bin(), &built).unwrap();
    let mut cfg = config_for("rebuild");
    let pin = pinned(&built);
    cfg.agent_bin = pin.clone();
    let first = start_in(cfg.clone(), limits(), 64 * MIB, |_| {}).await;
    // A rebuild replaces the file, as cargo and the linker do: a new file takes the name.
    let next = out.join("warren-agent.new");
    std::fs::write(&next, "#!/bin/sh\nexit 127\n").unwrap();
    std::fs::set_permissions(&next, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::rename(&next, &built).unwrap();
    let second = start_in(cfg, limits(), 64 * MIB, |_| {}).await;
    assert_eq!(second.run("echo up"), (0, "up\n".into()));
    drop((first, second));
    let _ = std::fs::remove_dir_all(&out);
    // Only this test uses this build: its pin goes too.
    let _ = std::fs::remove_file(&pin);
}

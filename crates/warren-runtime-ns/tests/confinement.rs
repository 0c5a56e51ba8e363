//! Confinement of namespace sandboxes, asserted from inside real sandboxes and from the host:
//! the seccomp allow-list and reduced capabilities (no namespaces, mounts, io_uring, rare
//! socket families or x32 calls; sudo and the usual tools still work), `/sys` and `/proc`
//! without host information, per-sandbox host id ranges and kernel counters, the agent's
//! capped stderr, the recorded exit status and the access token from the first request on.
//!
//! Needs root, the base image and the agent binary, like `sandbox.rs`.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;
use warren_host::cgroup::Limits;
use warren_runtime_ns::caps::KEPT;
use warren_runtime_ns::config::ID_COUNT;
use warren_runtime_ns::launch;

fn limits() -> Limits {
    Limits {
        cpu_millis: Some(1000),
        memory_bytes: Some(512 * MIB),
        pids: Some(256),
    }
}

/// `errno` of a raw system call made with Python's ctypes inside the sandbox (0 on success).
fn errno_of(r: &Running, call: &str) -> i64 {
    let script = format!(
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\nrc = {call}\nprint(0 if rc >= 0 else ctypes.get_errno())"
    );
    let (code, out) = r.run(&format!("python3 - <<'EOF'\n{script}\nEOF"));
    assert_eq!(code, 0, "{call}: {out}");
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("{call}: {out}"))
}

const EPERM: i64 = 1;
const ENOSYS: i64 = 38;
const EAFNOSUPPORT: i64 = 97;

#[tokio::test(flavor = "multi_thread")]
async fn h1_namespaces_mounts_and_rare_kernel_interfaces_are_closed_but_tools_work() {
    if !common::have_root() {
        return;
    }
    let r = start("h1", limits(), 256 * MIB).await;
    // No new namespaces of any kind, for root (sudo) as for anyone.
    for flag in ["-n", "-U", "-m", "-p -f", "-i", "-u", "-C", "-T"] {
        let (code, out) = r.run(&format!("unshare {flag} true 2>&1"));
        assert_ne!(code, 0, "unshare {flag} succeeded: {out}");
    }
    let (code, out) = r.run_as("user", "sudo -n unshare -n true 2>&1");
    assert_ne!(code, 0, "sudo unshare -n succeeded: {out}");
    // No mounts.
    let (code, out) = r.run("mkdir -p /mnt/t && mount -t tmpfs none /mnt/t 2>&1");
    assert_ne!(code, 0, "mount succeeded: {out}");
    assert_eq!(
        errno_of(&r, "libc.syscall(430, b'tmpfs', 0)"),
        EPERM,
        "fsopen"
    );
    assert_eq!(
        errno_of(&r, "libc.syscall(428, -100, b'/', 1)"),
        EPERM,
        "open_tree"
    );
    assert_eq!(
        errno_of(&r, "libc.syscall(155, b'.', b'.')"),
        EPERM,
        "pivot_root"
    );
    assert_eq!(errno_of(&r, "libc.syscall(308, 3, 0)"), EPERM, "setns");
    // io_uring, userfaultfd, bpf, perf, keys, handles.
    let params = "ctypes.create_string_buffer(120)";
    assert_eq!(
        errno_of(&r, &format!("libc.syscall(425, 4, {params})")),
        EPERM,
        "io_uring_setup"
    );
    assert_eq!(errno_of(&r, "libc.syscall(323, 0)"), EPERM, "userfaultfd");
    assert_eq!(errno_of(&r, "libc.syscall(321, 0, 0, 0)"), EPERM, "bpf");
    assert_eq!(errno_of(&r, "libc.syscall(250, 0, 0)"), EPERM, "keyctl");
    assert_eq!(
        errno_of(&r, "libc.syscall(304, 0, 0, 0)"),
        EPERM,
        "open_by_handle_at"
    );
    // x32 numbers are refused (without the filter this kernel would answer ENOSYS).
    assert_eq!(
        errno_of(&r, "libc.syscall(0x40000000 | 39)"),
        EPERM,
        "x32 getpid"
    );
    // clone3 says ENOSYS so glibc falls back to clone, whose flags the filter sees.
    assert_eq!(errno_of(&r, "libc.syscall(435, 0, 0)"), ENOSYS, "clone3");
    // personality: standard values only.
    assert_eq!(
        errno_of(&r, "libc.syscall(135, ctypes.c_ulong(0xffffffff))"),
        0,
        "personality query"
    );
    assert_eq!(
        errno_of(&r, "libc.syscall(135, 0x0400000)"),
        EPERM,
        "READ_IMPLIES_EXEC"
    );
    // Socket families: the four allowed ones work, others (module autoload) do not.
    for (family, kind, proto, want) in [
        (1, 1, 0, 0),              // AF_UNIX
        (2, 2, 0, 0),              // AF_INET
        (10, 2, 0, 0),             // AF_INET6
        (16, 3, 0, 0),             // AF_NETLINK, NETLINK_ROUTE
        (16, 3, 9, EAFNOSUPPORT),  // NETLINK_AUDIT
        (16, 3, 15, EAFNOSUPPORT), // NETLINK_KOBJECT_UEVENT
        (17, 3, 0, EAFNOSUPPORT),  // AF_PACKET
        (21, 5, 0, EAFNOSUPPORT),  // AF_RDS
        (30, 5, 0, EAFNOSUPPORT),  // AF_TIPC
        (40, 1, 0, EAFNOSUPPORT),  // AF_VSOCK
        (29, 3, 1, EAFNOSUPPORT),  // AF_CAN
    ] {
        let got = errno_of(&r, &format!("libc.socket({family}, {kind}, {proto})"));
        assert_eq!(got, want, "socket({family}, {kind}, {proto})");
    }
    // The bounding set is the container-root default set, for root and through sudo.
    let mask: u64 = KEPT.iter().map(|c| 1u64 << c).sum();
    let want = format!("{mask:016x}");
    let (_, status) = r.run("grep -E '^Cap(Bnd|Eff|Inh|Amb)' /proc/self/status");
    assert!(status.contains(&format!("CapBnd:\t{want}")), "{status}");
    assert!(status.contains(&format!("CapEff:\t{want}")), "{status}");
    assert!(status.contains("CapInh:\t0000000000000000"), "{status}");
    assert!(status.contains("CapAmb:\t0000000000000000"), "{status}");
    assert_eq!(
        r.run_as("user", "sudo -n grep CapEff /proc/self/status"),
        (0, format!("CapEff:\t{want}\n"))
    );
    // Real software still runs: sudo, python, pip, apt, bash, curl to loopback, node.
    assert_eq!(r.run_as("user", "sudo -n id -u"), (0, "0\n".into()));
    assert_eq!(
        r.run_as("user", "sudo -n true && sudo -u user -n id -un"),
        (0, "user\n".into())
    );
    let (code, out) = r.run_as(
        "user",
        "python3 -m pip --version >/dev/null && apt-get --version >/dev/null && bash -c 'echo ok'",
    );
    assert_eq!((code, out.as_str()), (0, "ok\n"), "{out}");
    let (code, out) = r.run_as(
        "user",
        "cd /tmp && echo hello > index.html && (python3 -m http.server 8123 --bind 127.0.0.1 >/dev/null 2>&1 &) && \
         for i in $(seq 100); do curl -sf http://127.0.0.1:8123/index.html && break; sleep 0.1; done",
    );
    assert_eq!((code, out.as_str()), (0, "hello\n"), "{out}");
    let (code, out) = r.run("node -e 'require(\"fs\").writeFileSync(\"/tmp/n\", \"x\"); console.log(require(\"os\").cpus().length > 0)'");
    assert_eq!((code, out.as_str()), (0, "true\n"), "{out}");
    let (code, out) = r.run("python3 -c 'import os, threading, subprocess; t = threading.Thread(target=print, args=(\"thread\",)); t.start(); t.join(); print(subprocess.run([\"true\"]).returncode, os.cpu_count() > 0)'");
    assert_eq!((code, out.as_str()), (0, "thread\n0 True\n"), "{out}");
    r.destroy().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn m1_l11_sys_and_proc_show_nothing_of_the_host_or_other_sandboxes() {
    if !common::have_root() {
        return;
    }
    let a = start("m1a", limits(), 128 * MIB).await;
    let b = start("m1b", limits(), 128 * MIB).await;
    let (ida, idb) = (a.sbx().id.clone(), b.sbx().id.clone());
    let (code, tree) = a.run("find /sys 2>/dev/null; cat /proc/self/cgroup /proc/1/cgroup");
    assert_eq!(code, 0);
    for id in [&ida, &idb] {
        assert!(
            !tree.contains(id.as_str()),
            "/sys or cgroups name sandbox {id}: {tree}"
        );
    }
    assert!(!tree.contains("warren"), "{tree}");
    // No host links (the host netns has every slot's warren-N link).
    let (_, links) = a.run("ls /sys/class/net 2>&1; ls /sys/devices/virtual/net 2>&1");
    assert!(
        !links.contains("warren") && !links.contains("lo\n"),
        "{links}"
    );
    // The sandbox's own cgroup is readable, as its root, read-only.
    let (code, limit) = a.run(
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max",
    );
    assert_eq!((code, limit.trim()), (0, (512 * MIB).to_string().as_str()));
    let (code, out) = a.run("mkdir /sys/fs/cgroup/memory/x 2>&1 || mkdir /sys/fs/cgroup/x 2>&1");
    assert_ne!(code, 0, "{out}");
    // mountinfo names no host path: not the state directory, not where the agent was built.
    let (_, mountinfo) = a.run("cat /proc/self/mountinfo");
    let agent_dir = a
        .cfg
        .agent_bin
        .parent()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    for host_path in ["/run/warren", a.cfg.state_dir.to_str().unwrap(), &agent_dir] {
        assert!(
            !mountinfo.contains(host_path),
            "mountinfo shows {host_path}: {mountinfo}"
        );
    }
    assert_eq!(a.run("grep -c /run/ /proc/self/mountinfo").1.trim(), "0");
    // The usual /proc masks.
    assert_eq!(
        a.run("cat /proc/keys /proc/timer_list | wc -c"),
        (0, "0\n".into())
    );
    let (_, kcore) = a.run("test ! -e /proc/kcore || wc -c < /proc/kcore");
    assert!(kcore.trim().is_empty() || kcore.trim() == "0", "{kcore}");
    let (code, out) = a.run("echo h > /proc/sysrq-trigger 2>&1");
    assert_ne!(code, 0, "{out}");
    let (code, out) = a.run("echo 1 > /proc/sys/vm/drop_caches 2>&1");
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("Read-only"), "{out}");
    a.destroy().await;
    b.destroy().await;
}

/// Host id ranges as the kernel has them: `(first host id, count)` of a process.
fn uid_range(pid: u32) -> (u64, u64) {
    let map = std::fs::read_to_string(format!("/proc/{pid}/uid_map")).unwrap();
    let f: Vec<u64> = map.split_whitespace().map(|x| x.parse().unwrap()).collect();
    (f[1], f[2])
}

#[tokio::test(flavor = "multi_thread")]
async fn h4_m2_ranges_are_disjoint_and_kernel_counters_are_per_sandbox() {
    if !common::have_root() {
        return;
    }
    let a = start("m2a", limits(), 128 * MIB).await;
    let b = start("m2b", limits(), 128 * MIB).await;
    let (ra, rb) = (uid_range(a.sbx().pid1), uid_range(b.sbx().pid1));
    assert_eq!((ra.1, rb.1), (ID_COUNT as u64, ID_COUNT as u64));
    assert!(
        ra.0 + ra.1 <= rb.0 || rb.0 + rb.1 <= ra.0,
        "{ra:?} and {rb:?} overlap"
    );
    // Exhaust inotify instances in a, without sudo, and keep them open.
    let script = "import ctypes, time\nlibc = ctypes.CDLL(None)\nn = 0\nwhile n < 400 and libc.inotify_init() >= 0:\n    n += 1\nprint(n, flush=True)\ntime.sleep(3600)\n";
    let (code, out) = a.run_as(
        "user",
        &format!("cat > /tmp/hog.py <<'EOF'\n{script}EOF\n(python3 /tmp/hog.py > /tmp/hog.out 2>&1 &) ; true"),
    );
    assert_eq!(code, 0, "{out}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let opened = loop {
        let (_, out) = a.run("cat /tmp/hog.out");
        if let Ok(n) = out.trim().parse::<u32>() {
            break n;
        }
        assert!(Instant::now() < deadline, "the hog never reported: {out}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let max: u32 = std::fs::read_to_string("/proc/sys/fs/inotify/max_user_instances")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        opened < 400 && opened + 8 >= max.min(400),
        "opened {opened} of {max}"
    );
    // Another sandbox and host root are unaffected.
    let one = "import ctypes; print(ctypes.CDLL(None).inotify_init() >= 0)";
    assert_eq!(
        b.run_as("user", &format!("python3 -c '{one}'")),
        (0, "True\n".into())
    );
    // SAFETY: inotify_init1 takes flags only; the descriptor is closed right away.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
    assert!(
        fd >= 0,
        "host root cannot inotify_init: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: closing the descriptor we just opened.
    unsafe { libc::close(fd) };
    a.destroy().await;
    b.destroy().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn h4_saved_layers_restore_into_another_range_with_their_ownership() {
    if !common::have_root() {
        return;
    }
    let a = start("h4a", limits(), 128 * MIB).await;
    let (code, out) = a.run(
        "install -o user -g user -m 0640 /dev/null /home/user/mine && cp /bin/true /opt/suid && chown user:user /opt/suid && chmod 4755 /opt/suid && stat -c '%U:%G %a' /home/user/mine /opt/suid",
    );
    assert_eq!(
        (code, out.as_str()),
        (0, "user:user 640\nuser:user 4755\n"),
        "{out}"
    );
    // A copy of its disk, and (as saves made before sandboxes had disks) of its upper tree.
    let saved = PathBuf::from(format!("/var/tmp/warren-test-layer-{}", std::process::id()));
    let tree = PathBuf::from(format!("/var/tmp/warren-test-tree-{}", std::process::id()));
    let from = a.sbx().id_base;
    warren_runtime_ns::disk::sync(&a.sbx().disk_mount()).unwrap();
    warren_runtime_ns::layer::save_disk(&a.sbx().disk, &saved, from, false)
        .await
        .unwrap();
    warren_runtime_ns::layer::save(&a.sbx().upper_dir(), &tree, from)
        .await
        .unwrap();
    a.destroy().await;
    for (test, dir) in [("h4b", &saved), ("h4c", &tree)] {
        let b = start_with(test, limits(), 128 * MIB, |s| {
            s.seed = Some(launch::Seed {
                dir: dir.clone(),
                take: false,
            })
        })
        .await;
        assert_ne!(b.sbx().id_base, from);
        let (code, out) = b.run("stat -c '%U:%G %a' /home/user/mine /opt/suid");
        assert_eq!(
            (code, out.as_str()),
            (0, "user:user 640\nuser:user 4755\n"),
            "{test}: {out}"
        );
        // On the host the files belong to b's range now.
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(b.sbx().upper_dir().join("home/user/mine")).unwrap();
        assert_eq!(meta.uid(), b.sbx().id_base + 1000);
        b.destroy().await;
    }
    warren_runtime_ns::layer::remove(&saved).unwrap();
    warren_runtime_ns::layer::remove(&tree).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn m4_l10_agent_stderr_is_capped_and_the_exit_status_is_recorded() {
    if !common::have_root() {
        return;
    }
    let r = start("m4", limits(), 64 * MIB).await;
    let (_, target) = r.run("readlink /proc/1/fd/2");
    assert!(
        target.starts_with("pipe:"),
        "the agent's stderr is {target}"
    );
    // Sandbox root takes the agent's stderr descriptor itself (pidfd_getfd, no reopening
    // through /proc) and writes far more than the cap into it.
    let flood = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nfd = libc.syscall(438, os.pidfd_open(1), 2, 0)\nassert fd >= 0, ctypes.get_errno()\nfor _ in range(128):\n    os.write(fd, b'x' * 65536)\nprint('done')";
    let (code, out) = r.run(&format!("python3 - <<'EOF'\n{flood}\nEOF"));
    assert_eq!((code, out.as_str()), (0, "done\n"), "{out}");
    let log = r.sbx().dir.join("nsinit.log");
    // The copy is asynchronous: wait until the log stops growing at the cap.
    let deadline = Instant::now() + Duration::from_secs(30);
    let cap = warren_runtime_ns::nsinit::LOG_CAP as u64;
    while std::fs::metadata(&log).unwrap().len() < cap && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let size = std::fs::metadata(&log).unwrap().len();
    assert!(size <= cap + 4096, "nsinit.log grew to {size} bytes");
    // The agent still answers, and its end is recorded when PID 1 is killed from the host.
    assert_eq!(r.run("echo alive"), (0, "alive\n".into()));
    let pid1 = r.sbx().pid1;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid1 as i32),
        nix::sys::signal::SIGKILL,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while r.sbx().exit_status().is_none_or(|s| s.is_empty()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(r.sbx().exit_status().as_deref(), Some("signaled SIGKILL"));
    let mut r = r;
    r.sbx.take().unwrap().destroy().await.unwrap();
    let _ = launch::remove_empty_parents(&r.cfg);
}

/// Status line of a plain HTTP request to the agent.
fn status_of(r: &Running, path: &str, token: Option<&str>) -> String {
    let auth = token.map_or(String::new(), |t| format!("X-Access-Token: {t}\r\n"));
    let req = format!("GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n{auth}\r\n");
    let resp = r.http(req.into_bytes()).unwrap();
    String::from_utf8_lossy(&resp)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn m7_the_agent_requires_its_token_from_the_first_request_and_nesting_is_an_option() {
    if !common::have_root() {
        return;
    }
    let r = start_with("m7", limits(), 64 * MIB, |s| {
        s.access_token = Some("t0ken-before-listen".into());
        s.nested_namespaces = true;
    })
    .await;
    assert!(
        status_of(&r, "/metrics", None).contains("401"),
        "answered without a token"
    );
    assert!(status_of(&r, "/metrics", Some("wrong")).contains("401"));
    assert!(status_of(&r, "/metrics", Some("t0ken-before-listen")).contains("200"));
    // These requests come from the sandbox's own loopback: there, and only there, the
    // sandbox-wide variables are open (every process of the sandbox has them anyway).
    assert!(status_of(&r, "/envs", None).contains("200"));
    // The token is not in the environment of the agent's processes.
    let (_, env) = r.run("cat /proc/self/environ | tr '\\0' '\\n'");
    assert!(!env.contains("t0ken"), "{env}");
    // With the option, the sandbox may create namespaces (a user namespace here).
    assert_eq!(r.run_as("user", "unshare -U -r id -u"), (0, "0\n".into()));
    r.destroy().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ranges_overlapping_etc_subuid_are_refused() {
    if !common::have_root() {
        return;
    }
    let Some((start, _)) = warren_runtime_ns::idrange::delegated_ranges()
        .into_iter()
        .next()
    else {
        warren_testkit::skip("/etc/subuid and /etc/subgid list no range (scripts/setup.sh adds the `user` account's)");
        return;
    };
    let cfg = config_for("subuid");
    let net = NetNs::new();
    let spec = launch::LaunchSpec {
        volumes: Vec::new(),
        id: "tsubuid".into(),
        image_root: image_root().to_path_buf(),
        netns: net.path(),
        resolv_conf: String::new(),
        limits: limits(),
        writable_bytes: 64 * MIB,
        agent_args: vec![],
        seed: None,
        id_base: start as u32,
        access_token: None,
        nested_namespaces: false,
    };
    let err = launch::launch(&cfg, &spec).await.unwrap_err().to_string();
    assert!(err.contains("overlaps"), "{err}");
    let _ = launch::remove_empty_parents(&cfg);
}

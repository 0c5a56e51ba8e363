//! A sandbox sees its own resources (`warren_runtime_ns::lxcfs`): with the host's LXCFS daemon
//! bound in, its `/proc/meminfo`, `/proc/cpuinfo`, `/proc/stat`, `/proc/uptime`, `cpu/online`
//! and `nproc` show its limits, and the cgroups made for LXCFS go with the sandbox.
//!
//! Needs root and Debian's `lxcfs` with `/dev/fuse` (scripts/setup.sh installs it); the end to
//! end version is `tests/e2e/test_own_resources.py`.

mod common;

use std::path::Path;

use common::*;
use warren_host::cgroup::{self, Limits};
use warren_runtime_ns::lxcfs;

/// The daemon the runtime uses on this host (`HostConfig::lxcfs_dir`): shared, never stopped.
const LXCFS_DIR: &str = "/run/warren/lxcfs";

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_reads_its_own_limits_and_its_lxcfs_cgroups_go_with_it() {
    if !have_root() {
        return;
    }
    let installed = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("lxcfs").is_file()));
    if !warren_testkit::require(
        "lxcfs and /dev/fuse (scripts/setup.sh installs lxcfs)",
        installed && Path::new("/dev/fuse").exists(),
    ) {
        return;
    }
    if !warren_testkit::require("more than one CPU", num_cpus() > 1) {
        return;
    }
    lxcfs::ensure(Path::new(LXCFS_DIR)).expect("LXCFS answers");
    let mut cfg = config_for("own-resources");
    cfg.lxcfs = Some(LXCFS_DIR.into());
    let limits = Limits {
        cpu_millis: Some(1000),
        memory_bytes: Some(320 * MIB),
        pids: Some(256),
    };
    let r = start_in(cfg, limits, 128 * MIB, |_| {}).await;
    let out = |cmd: &str| {
        let (code, out) = r.run(cmd);
        assert_eq!(code, 0, "{cmd}: {out}");
        out.trim().to_string()
    };
    assert_eq!(out("awk '/^MemTotal:/ {print $2}' /proc/meminfo"), "327680");
    assert_eq!(out("nproc"), "1");
    assert_eq!(out("grep -c ^processor /proc/cpuinfo"), "1");
    assert_eq!(out("grep -c '^cpu[0-9]' /proc/stat"), "1");
    assert_eq!(out("cat /sys/devices/system/cpu/online"), "0");
    let uptime: f64 = out("cut -d' ' -f1 /proc/uptime").parse().unwrap();
    assert!(uptime < 60.0, "uptime {uptime}");
    // The files, and nothing else of the daemon (its cgroup tree least of all).
    assert_eq!(out("grep -c fuse.lxcfs /proc/self/mountinfo"), "8");
    assert_eq!(
        out("grep fuse.lxcfs /proc/self/mountinfo | grep -c cgroup || true"),
        "0"
    );

    let (_, cfg) = r.destroy().await;
    if cgroup::detect() == cgroup::Version::V1 {
        for c in ["cpuset", "cpuacct", "blkio"] {
            let parent = Path::new("/sys/fs/cgroup").join(c).join(&cfg.cgroup_parent);
            assert!(!parent.exists(), "{} is left", parent.display());
        }
    }
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

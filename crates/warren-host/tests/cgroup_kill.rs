//! A sandbox's cgroup kill finds every process, even one that joined only some of the v1
//! controllers' hierarchies (its start cut off by a killed server). Needs root and cgroup v1
//! or v2 (without root it is skipped with the reason).

use std::process::Command;

use warren_host::cgroup::{Limits, SandboxCgroup};

#[test]
fn a_process_in_one_controller_only_is_killed_and_the_cgroup_removed() {
    if !warren_testkit::require("root (cgroups)", warren_testkit::is_root()) {
        return;
    }
    let parent = format!("warren-host-test-{}", std::process::id());
    let cg = SandboxCgroup::create(&parent, "half", Limits::default()).expect("create");
    let mut child = Command::new("sleep").arg("60").spawn().unwrap();
    // Only the first hierarchy (v1: `cpu`), as a start cut off after its first write leaves it.
    let first = cg
        .dirs()
        .first()
        .expect("a cgroup dir")
        .join("cgroup.procs");
    assert!(first.exists(), "{}", first.display());
    std::fs::write(&first, child.id().to_string()).unwrap();
    cg.kill_all().expect("kill_all");
    let status = child.wait().unwrap();
    assert!(!status.success(), "the process was killed: {status}");
    cg.remove().expect("the cgroup is removed");
    assert!(!cg.exists());
    for root in [
        "/sys/fs/cgroup",
        "/sys/fs/cgroup/cpu",
        "/sys/fs/cgroup/pids",
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/freezer",
        "/sys/fs/cgroup/cpuacct",
    ] {
        let _ = std::fs::remove_dir(format!("{root}/{parent}"));
    }
}

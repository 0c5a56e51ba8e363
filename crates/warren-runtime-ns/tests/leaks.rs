//! A host is back where it started after sandboxes come and go: no zombie children of the
//! manager (it is the child subreaper of everything it starts), the same descriptors, mounts,
//! cgroups and network namespaces, and no state left. One test in this binary, so that nothing
//! else moves the counts. Needs root, nftables and the base image.

mod common;

use common::run;

use std::time::{Duration, Instant};

use warren_host::HostConfig;
use warren_runtime::SandboxRuntime;
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

async fn cycle(rt: &NsRuntime, id: &str) {
    let s = rt.create(common::small_spec(id)).await.expect("create");
    let (code, out) = run(s.agent, "sleep 60 & echo started").await;
    assert_eq!((code, out.as_str()), (0, "started\n"));
    rt.kill(id).await.expect("kill");
}

/// What a manager holds on the host, counted: its open descriptors, the mounts under its run
/// and data dirs, its sandboxes' cgroups, the network namespaces of its slots, the loop
/// devices backed by files in its data dir and the sandbox disks there.
#[derive(Debug, PartialEq)]
struct HostCounts {
    descriptors: usize,
    mounts: usize,
    cgroups: usize,
    netns: usize,
    loops: usize,
    disks: usize,
}

impl HostCounts {
    fn now(cfg: &HostConfig) -> HostCounts {
        let count = |dir: &str, keep: &dyn Fn(&str) -> bool| {
            std::fs::read_dir(dir)
                .map(|d| {
                    d.flatten()
                        .filter(|e| keep(&e.file_name().to_string_lossy()))
                        .count()
                })
                .unwrap_or(0)
        };
        let cgroups = [
            "/sys/fs/cgroup",
            "/sys/fs/cgroup/memory",
            "/sys/fs/cgroup/pids",
        ]
        .iter()
        .map(|root| {
            std::fs::read_dir(format!("{root}/{}", cfg.cgroup_parent))
                .map(|d| d.flatten().filter(|e| e.path().is_dir()).count())
                .unwrap_or(0)
        })
        .sum();
        let ours = [
            cfg.run_dir.display().to_string(),
            cfg.data_dir.display().to_string(),
        ];
        HostCounts {
            descriptors: count("/proc/self/fd", &|_| true),
            mounts: std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap()
                .lines()
                .filter(|l| {
                    let at = l.split(' ').nth(4).unwrap_or("");
                    ours.iter().any(|o| at.starts_with(o.as_str()))
                })
                .count(),
            cgroups,
            netns: count("/run/netns", &|n| n.starts_with(&cfg.net.prefix)),
            loops: loops_under(&ours[1]),
            disks: count(
                &format!("{}/disks/{}", ours[1], cfg.cgroup_parent.replace('/', "-")),
                &|n| n.ends_with(".img"),
            ),
        }
    }
}

/// Loop devices whose backing file is under `dir`.
fn loops_under(dir: &str) -> usize {
    std::fs::read_dir("/sys/block")
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    std::fs::read_to_string(e.path().join("loop/backing_file"))
                        .is_ok_and(|f| f.starts_with(dir))
                })
                .count()
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn sandboxes_that_come_and_go_leave_no_zombies_and_no_state() {
    let Some(cfg) = config("z", 47) else { return };
    let rt = NsRuntime::start(cfg.clone(), common::ns_settings())
        .await
        .expect("start");
    rt.reattach(vec![]).await;
    // One round first: what the first create sets up once (the agent's staging, LXCFS's
    // view, a template mount) is not a leak.
    cycle(&rt, "leakwarm").await;
    let before = zombies();
    let counts = HostCounts::now(&cfg);
    for round in 0..6 {
        cycle(&rt, &format!("leak{round}")).await;
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
    // Settled: the slot pool refills and a pooled connection closes in the background.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut now = HostCounts::now(&cfg);
    while now != counts && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        now = HostCounts::now(&cfg);
    }
    assert_eq!(now, counts, "what the host holds after 6 sandboxes");
    let state: Vec<_> = std::fs::read_dir(cfg.run_dir.join("sandboxes"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(state.is_empty(), "sandbox state left: {state:?}");
    rt.shutdown().await.expect("shutdown");
    common::cleanup(&cfg);
}

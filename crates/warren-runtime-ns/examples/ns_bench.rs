//! Benchmark of the namespace runtime. Prints numbers, asserts none.
//!
//! - create-to-agent-ready: `launch` until the agent answers `GET /health` inside the sandbox,
//!   beside a `bwrap` run of `/bin/true` on the same rootfs, measured in the same run;
//! - idle memory: PSS of every process of N idle sandboxes, per sandbox.
//!
//! Run as root: `cargo run --release -p warren-runtime-ns --example ns_bench -- [--samples 30]
//! [--idle 200] [--smoke]`. Needs the agent built in the same profile and `bwrap` (bubblewrap).

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use warren_host::cgroup::Limits;
use warren_runtime_ns::launch::{self, LaunchSpec, NsConfig, Sandbox};

struct Args {
    samples: usize,
    idle: usize,
}

fn args() -> Args {
    let mut a = Args {
        samples: 30,
        idle: 200,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--samples" => a.samples = it.next().and_then(|v| v.parse().ok()).expect("--samples N"),
            "--idle" => a.idle = it.next().and_then(|v| v.parse().ok()).expect("--idle N"),
            "--smoke" => {
                a = Args {
                    samples: 3,
                    idle: 3,
                }
            }
            other => panic!("unknown flag {other}"),
        }
    }
    a
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn summary(name: &str, mut ms: Vec<f64>) -> f64 {
    ms.sort_by(|a, b| a.total_cmp(b));
    let p50 = percentile(&ms, 0.5);
    println!(
        "{name:<34} n={:<4} p50={:>8.2} ms  p90={:>8.2} ms  p99={:>8.2} ms  max={:>8.2} ms",
        ms.len(),
        p50,
        percentile(&ms, 0.9),
        percentile(&ms, 0.99),
        ms.last().copied().unwrap_or(f64::NAN)
    );
    p50
}

fn image_root() -> PathBuf {
    let recipe = warren_template::Recipe::base();
    let image = warren_template::ensure_image(
        &recipe,
        Path::new("/var/lib/warren"),
        &mut warren_template::StderrProgress::new(),
    )
    .expect("base image");
    // Private to root, nosuid and nodev, as a server's template mounts are.
    let parent = Path::new("/run/warren-test-images");
    std::fs::create_dir_all(parent).unwrap();
    std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mnt = parent.join(recipe.cache_key());
    std::fs::create_dir_all(&mnt).unwrap();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    if !mounts.contains(&format!(" {} ", mnt.display())) {
        let ok = Command::new("mount")
            .args(["-t", "erofs", "-o", "ro,nosuid,nodev"])
            .arg(&image.image)
            .arg(&mnt)
            .status()
            .unwrap();
        assert!(ok.success(), "mount the image");
    }
    mnt
}

struct NetNs(String);

impl NetNs {
    fn new(i: usize) -> NetNs {
        let name = format!("wrb-{}-{i}", std::process::id());
        assert!(Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap()
            .success());
        assert!(Command::new("ip")
            .args(["-n", &name, "link", "set", "lo", "up"])
            .status()
            .unwrap()
            .success());
        NetNs(name)
    }
    fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.0))
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Polls the agent's health endpoint from inside `netns` until it answers 204.
fn wait_ready(netns: &Path) {
    let ns = std::fs::File::open(netns).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if let Ok(mut c) = std::net::TcpStream::connect("127.0.0.1:49983") {
                    let _ = c
                        .write_all(b"GET /health HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
                    let mut out = Vec::new();
                    let _ = c.read_to_end(&mut out);
                    if out.starts_with(b"HTTP/1.1 204") {
                        return;
                    }
                }
                assert!(Instant::now() < deadline, "agent not ready");
                std::thread::sleep(Duration::from_micros(500));
            }
        });
    });
}

fn pss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::main]
async fn main() {
    assert!(nix::unistd::geteuid().is_root(), "run as root");
    let a = args();
    let root = image_root();
    let exe = std::env::current_exe().unwrap();
    let bin_dir = exe.parent().unwrap().parent().unwrap();
    let cfg = NsConfig {
        state_dir: PathBuf::from(format!("/run/warren-bench-ns-{}", std::process::id())),
        disk_dir: PathBuf::from(format!("/var/tmp/warren-bench-ns-{}", std::process::id())),
        nsinit_bin: bin_dir.join("warren-nsinit"),
        agent_bin: bin_dir.join("warren-agent"),
        cgroup_parent: format!("warren-bench-{}", std::process::id()),
        // WARREN_NS_CONFINEMENT=baseline measures the earlier confinement.
        confinement: std::env::var("WARREN_NS_CONFINEMENT")
            .map_or(Ok(Default::default()), |v| v.parse())
            .expect("WARREN_NS_CONFINEMENT is full or baseline"),
        lxcfs: None,
    };
    for b in [&cfg.nsinit_bin, &cfg.agent_bin] {
        assert!(
            b.exists(),
            "{} missing: cargo build --release -p warren-agent -p warren-runtime-ns",
            b.display()
        );
    }
    let limits = Limits {
        cpu_millis: Some(1000),
        memory_bytes: Some(512 << 20),
        pids: Some(512),
    };
    let spec = |i: usize, net: &NetNs| LaunchSpec {
        volumes: Vec::new(),
        id: format!("b{}x{i}", std::process::id()),
        image_root: root.clone(),
        netns: net.path(),
        resolv_conf: "nameserver 127.0.0.1\n".into(),
        limits,
        writable_bytes: 256 << 20,
        agent_args: vec!["--listen".into(), warren_types::AGENT_LISTEN.into()],
        seed: None,
        // Ranges well above /etc/subuid's usual allocations, one per benchmark sandbox.
        id_base: (1 << 30) + (i as u32) * warren_runtime_ns::config::ID_COUNT,
        access_token: None,
        nested_namespaces: false,
    };
    println!(
        "# namespace runtime benchmark ({} samples, {} idle sandboxes)",
        a.samples, a.idle
    );

    // Baseline: bwrap running /bin/true on the same rootfs.
    let mut bwrap = Vec::new();
    for i in 0..a.samples + 2 {
        let t = Instant::now();
        let ok = Command::new("bwrap")
            .args(["--unshare-all", "--die-with-parent", "--ro-bind"])
            .arg(&root)
            .args(["/", "--proc", "/proc", "--dev", "/dev", "/bin/true"])
            .status()
            .expect("bwrap (apt-get install bubblewrap)");
        assert!(ok.success());
        if i >= 2 {
            bwrap.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }

    // Create to agent ready, one at a time (network namespaces come from a pool in production,
    // so they are made beforehand).
    let nets: Vec<NetNs> = (0..a.samples + 2).map(NetNs::new).collect();
    let mut ready = Vec::new();
    for (i, net) in nets.iter().enumerate() {
        let t = Instant::now();
        let sbx = launch::launch(&cfg, &spec(i, net)).await.expect("launch");
        wait_ready(&net.path());
        let ms = t.elapsed().as_secs_f64() * 1e3;
        if i >= 2 {
            ready.push(ms);
        }
        sbx.destroy().await.expect("destroy");
    }
    drop(nets);
    let base = summary("bwrap /bin/true (baseline)", bwrap);
    let ours = summary("create to agent ready", ready);
    println!("{:<34} {:.2}x the baseline", "ratio (p50)", ours / base);

    // Idle sandboxes and their memory.
    let nets: Vec<NetNs> = (0..a.idle).map(|i| NetNs::new(10_000 + i)).collect();
    let before = mem_available_kib();
    let mut idle: Vec<Sandbox> = Vec::new();
    let t = Instant::now();
    for (i, net) in nets.iter().enumerate() {
        let sbx = launch::launch(&cfg, &spec(10_000 + i, net))
            .await
            .expect("launch idle");
        wait_ready(&net.path());
        idle.push(sbx);
    }
    let started = t.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pss: u64 = idle.iter().flat_map(|s| s.cgroup.pids()).map(pss_kib).sum();
    let after = mem_available_kib();
    println!(
        "{:<34} {} sandboxes running, started in {:.1} s",
        "idle sandboxes",
        idle.len(),
        started.as_secs_f64()
    );
    println!(
        "{:<34} {:.2} MiB per sandbox (PSS of all its processes)",
        "idle memory",
        pss as f64 / 1024.0 / idle.len().max(1) as f64
    );
    println!(
        "{:<34} {:.2} MiB per sandbox (host MemAvailable drop, includes kernel memory)",
        "host memory",
        before.saturating_sub(after) as f64 / 1024.0 / idle.len().max(1) as f64
    );
    for s in idle {
        s.destroy().await.expect("destroy");
    }
    drop(nets);
    let _ = launch::remove_empty_parents(&cfg);
}

fn mem_available_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

//! Benchmark of the vm runtime (prints numbers, asserts none).
//!
//! Create-to-first-command latency (p50, p99) at concurrency 1 and 10 for
//! * `cold`: a VM cold-booted from the kernel until its agent runs a first command;
//! * `fork`: `VmRuntime::create` with no warm pool (QEMU start, snapshot load, `/init`);
//! * `warm`: `VmRuntime::create` served from the warm pool;
//! * `raw`: QEMU alone restoring the same snapshot (qcow2 overlay, `-incoming defer`, QMP
//!   `migrate-incoming`, `cont`) in a prepared network namespace, until the agent runs a first
//!   command: the VMM's floor, without slot, cgroup, `/init` or pool (our overhead is `fork`
//!   minus `raw`); QEMU runs as root and unjailed there;
//! * `raw-jailed`: the same, QEMU jailed as an unprivileged user as the runtime runs it (the
//!   jail's cost is `raw-jailed` minus `raw`);
//!
//! and the PSS and RSS per idle VM with 20 VMs running, and where the time of one create goes
//! (medians at concurrency 1, stage by stage: the runtime's own stage times for `fork` and
//! `warm`, the restore's for `raw`). Under TCG unless KVM is truly usable.
//!
//! ```text
//! sudo flock /tmp/warren-host-tests.lock target/release/examples/vm_bench [--smoke]
//! ```
//!
//! Own state directory, slot prefix and addresses; the base image comes from
//! `WARREN_DATA_DIR` (default /var/lib/warren).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;
use warren_host::HostConfig;
use warren_runtime::{CreateSpec, SandboxRuntime};
use warren_runtime_vm::snapshot::{self, ForkSpec, Pending, RestoreTimes, Snapshot};
use warren_runtime_vm::{VmRuntime, VmSettings, STAGES_TARGET};

/// The runtime's stage times of each create, by sandbox id (its `STAGES_TARGET` events).
static STAGES: Mutex<Option<HashMap<String, BTreeMap<String, f64>>>> = Mutex::new(None);
/// Concurrency-1 creates through the runtime: (path, sandbox id, create ms, total ms).
static CREATES: Mutex<Vec<(&'static str, String, f64, f64)>> = Mutex::new(Vec::new());
/// Concurrency-1 raw restores: (path, the restore's stages, total ms).
static RAWS: Mutex<Vec<(&'static str, RestoreTimes, f64)>> = Mutex::new(Vec::new());

/// Collects the runtime's stage events into [`STAGES`].
struct StageLog;

#[derive(Default)]
struct Fields {
    sandbox: String,
    ms: BTreeMap<String, f64>,
}

impl tracing::field::Visit for Fields {
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.ms.insert(field.name().to_string(), value);
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "sandbox" {
            self.sandbox = value.to_string();
        }
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "sandbox" {
            self.sandbox = format!("{value:?}").trim_matches('"').to_string();
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for StageLog {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != STAGES_TARGET {
            return;
        }
        let mut f = Fields::default();
        event.record(&mut f);
        if let Ok(mut all) = STAGES.lock() {
            all.get_or_insert_with(HashMap::new).insert(f.sandbox, f.ms);
        }
    }
}

/// A stage's time from the runtime's stages, the create's time and the total, in ms.
type RuntimeStage<'a> = &'a dyn Fn(&BTreeMap<String, f64>, f64, f64) -> f64;
/// A stage's time from a raw restore's stages and its total, in ms.
type RawStage<'a> = &'a dyn Fn(&RestoreTimes, f64) -> f64;

fn median(mut v: Vec<f64>) -> f64 {
    pct(&mut v, 50.0)
}

/// The stage table: medians at concurrency 1 of each path's stages, in ms.
fn report_stages() {
    let stages = STAGES
        .lock()
        .ok()
        .and_then(|s| s.clone())
        .unwrap_or_default();
    let creates = CREATES.lock().map(|c| c.clone()).unwrap_or_default();
    let raws = RAWS.lock().map(|r| r.clone()).unwrap_or_default();
    // (stage, fork, warm, raw, raw-jailed); NaN where a path has no such stage.
    let mut rows: Vec<(&str, [f64; 4])> = Vec::new();
    let runtime = |path: &str, f: RuntimeStage| {
        median(
            creates
                .iter()
                .filter(|(p, ..)| *p == path)
                .filter_map(|(_, id, create, total)| Some(f(stages.get(id)?, *create, *total)))
                .collect(),
        )
    };
    let raw = |path: &str, f: RawStage| {
        median(
            raws.iter()
                .filter(|(p, ..)| *p == path)
                .map(|(_, t, total)| f(t, *total))
                .collect(),
        )
    };
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let field = |m: &BTreeMap<String, f64>, k: &str| m.get(k).copied().unwrap_or(f64::NAN);
    let both = |name: &'static str, rt: RuntimeStage, rw: RawStage| {
        (
            name,
            [
                runtime("fork", rt),
                runtime("warm", rt),
                raw("raw", rw),
                raw("raw-jailed", rw),
            ],
        )
    };
    rows.push(both(
        "slot, cgroup and the rest before QEMU (ours)",
        &|m, _, _| field(m, "waiting_ms") - field(m, "prepare_ms") - field(m, "qemu_start_ms"),
        &|_, _| f64::NAN,
    ));
    rows.push(both(
        "fork directory and disk overlay",
        &|m, _, _| field(m, "prepare_ms"),
        &|t, _| ms(t.prepare),
    ));
    rows.push(both(
        "QEMU start (exec until QMP answers)",
        &|m, _, _| field(m, "qemu_start_ms"),
        &|t, _| ms(t.qemu_start),
    ));
    rows.push(both(
        "state load (migrate-incoming)",
        &|m, _, _| field(m, "load_ms"),
        &|t, _| ms(t.load),
    ));
    rows.push(both(
        "resume (cont until running)",
        &|m, _, _| field(m, "resume_ms"),
        &|t, _| ms(t.resume),
    ));
    rows.push(both(
        "first guest instructions until the agent answers",
        &|m, _, _| field(m, "agent_ms"),
        &|_, _| f64::NAN,
    ));
    rows.push(both(
        "agent /init (ours)",
        &|m, _, _| field(m, "init_ms"),
        &|_, _| f64::NAN,
    ));
    rows.push(both(
        "first command (/bin/true)",
        &|_, create, total| total - create,
        &|_, _| f64::NAN,
    ));
    rows.push(both(
        "agent answers and runs the first command",
        &|m, create, total| field(m, "agent_ms") + (total - create),
        &|t, total| total - ms(t.prepare + t.qemu_start + t.load + t.resume),
    ));
    rows.push(both("total", &|_, _, total| total, &|_, total| total));
    println!(
        "\nwhere the time goes, concurrency 1 (medians, ms; - where a path has no such stage):"
    );
    println!(
        "{:<50} {:>8} {:>8} {:>8} {:>10}",
        "stage", "fork", "warm", "raw", "raw-jailed"
    );
    for (name, v) in rows {
        let cell = |x: f64| {
            if x.is_nan() {
                "-".to_string()
            } else {
                format!("{x:.1}")
            }
        };
        println!(
            "{name:<50} {:>8} {:>8} {:>8} {:>10}",
            cell(v[0]),
            cell(v[1]),
            cell(v[2]),
            cell(v[3])
        );
    }
}

struct Counts {
    seq: usize,
    batches: usize,
    idle: usize,
}

fn config(tag: &str, n: u8, warm: usize) -> (HostConfig, VmSettings) {
    let data = std::env::var_os("WARREN_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/warren"));
    let exe = std::env::current_exe().expect("exe");
    let bin = exe
        .parent()
        .and_then(|p| p.parent())
        .expect("bin dir")
        .to_path_buf();
    let mut cfg = HostConfig::new(data);
    cfg.agent_bin = bin.join("warren-agent");
    cfg.run_dir = PathBuf::from(format!("/run/warren-vm-bench-{tag}"));
    cfg.cgroup_parent = format!("warren-vm-bench-{tag}");
    cfg.net.prefix = format!("wvb{tag}");
    cfg.net.host_cidr = format!("10.17.{}.0/24", n).parse().expect("cidr");
    cfg.net.run_dir = cfg.run_dir.join("net");
    cfg.net.pool_size = 4;
    let mut vm = VmSettings::new(&cfg);
    vm.memory_mb = 256;
    vm.disk_mb = 1024;
    vm.warm_pool = warm;
    vm.accel = forced_accel();
    (cfg, vm)
}

/// `WARREN_VM_ACCEL=kvm|tcg` forces the accelerator (as `warren serve --vm-accel` does), to
/// compare both on one host.
fn forced_accel() -> Option<warren_runtime_vm::Accel> {
    std::env::var("WARREN_VM_ACCEL")
        .ok()
        .map(|v| v.parse().expect("WARREN_VM_ACCEL is kvm or tcg"))
}

fn spec(id: String) -> CreateSpec {
    CreateSpec {
        volumes: Vec::new(),
        id: id.parse().expect("a valid sandbox id"),
        template: "base".into(),
        resources: warren_runtime::Resources {
            cpu_count: 1,
            memory_mb: 256,
            disk_mb: 1024,
        },
        allow_internet_access: true,
        egress: Default::default(),
        env_vars: BTreeMap::new(),
        access_token: None,
        from_snapshot: None,
        reservation: None,
    }
}

/// Runs `/bin/true` at `addr` through the typed agent client, retrying the connection until
/// the agent listens; blocking, with a runtime on the calling thread (which may have joined a
/// network namespace: the client's sockets are created where it is polled).
fn first_command(addr: SocketAddr, deadline: Instant) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let client = reqwest::Client::new();
    let argv = ["/bin/true".to_string()];
    rt.block_on(async {
        loop {
            match warren_host::agent::run(&client, addr, None, None, &argv, None, 0).await {
                Ok(ran) if ran.exit_code == 0 => return Ok(()),
                Ok(ran) => return Err(format!("/bin/true exited {}", ran.exit_code)),
                Err(warren_host::agent::RunError::Agent(e))
                    if not_listening(&e) && Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(2)).await
                }
                Err(e) => return Err(format!("{addr}: {}", warren_runtime::chain(&e))),
            }
        }
    })
}

/// Whether the call failed for want of a listening agent (the guest is still starting): its
/// transport error is a refused or failed connect.
fn not_listening(e: &(dyn std::error::Error + 'static)) -> bool {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<reqwest::Error>())
        .is_some_and(reqwest::Error::is_connect)
}

/// `first_command` from inside network namespace `ns`.
async fn first_command_in(ns: PathBuf) -> Result<(), String> {
    // Its own thread, not tokio's blocking pool: the thread stays in the namespace.
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let r = (|| {
            let f = std::fs::File::open(&ns).map_err(|e| e.to_string())?;
            nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| e.to_string())?;
            first_command(
                "169.254.0.21:49983".parse().expect("addr"),
                Instant::now() + Duration::from_secs(60),
            )
        })();
        let _ = tx.send(r);
    });
    rx.await.map_err(|e| e.to_string())?
}

/// A network namespace with `tap0` as the guest's gateway (for the cold and raw runs).
struct BenchNet(String);

impl BenchNet {
    fn new(i: usize) -> Self {
        let name = format!("wvbench-{i}");
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(std::process::Stdio::null())
            .status();
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .map(|s| s.success());
        assert!(matches!(ok, Ok(true)), "ip netns add {name}");
        for args in [
            vec!["link", "set", "lo", "up"],
            vec!["tuntap", "add", "dev", "tap0", "mode", "tap"],
            vec!["address", "add", "169.254.0.22/30", "dev", "tap0"],
            vec!["link", "set", "tap0", "up"],
        ] {
            let ok = Command::new("ip").args(["-n", &name]).args(&args).status();
            assert!(matches!(ok.map(|s| s.success()), Ok(true)), "ip {args:?}");
        }
        Self(name)
    }
    fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.0))
    }
}

impl Drop for BenchNet {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[i.min(v.len() - 1)]
}

fn report(name: &str, conc: usize, mut ms: Vec<f64>) {
    let n = ms.len();
    let (p50, p99) = (pct(&mut ms, 50.0), pct(&mut ms, 99.0));
    println!("{name:<6} concurrency {conc:>2}: n={n:<3} p50 {p50:>8.1} ms  p99 {p99:>8.1} ms");
}

/// Runs `batches` rounds of `conc` concurrent `one(i)`; returns every latency.
async fn measure<F, Fut>(conc: usize, rounds: usize, one: F) -> Vec<f64>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<f64, String>>,
{
    let mut out = Vec::new();
    for r in 0..rounds {
        let results = join_all((0..conc).map(|i| one(r * conc + i))).await;
        for res in results {
            match res {
                Ok(ms) => out.push(ms),
                Err(e) => eprintln!("sample failed: {e}"),
            }
        }
    }
    out
}

/// One create through `rt` until its first command; at concurrency 1 its times are kept
/// under `path` for the stage table.
async fn runtime_create(
    rt: &Arc<VmRuntime>,
    id: String,
    path: Option<&'static str>,
) -> Result<f64, String> {
    let t = Instant::now();
    let s = rt
        .create(spec(id.clone()))
        .await
        .map_err(|e| e.to_string())?;
    let created = t.elapsed().as_secs_f64() * 1000.0;
    let agent = s.agent;
    let r = tokio::task::spawn_blocking(move || {
        first_command(agent, Instant::now() + Duration::from_secs(60))
    })
    .await
    .map_err(|e| e.to_string())?;
    if let Err(e) = r {
        let slot = s.record["slot"].as_u64().unwrap_or(0);
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ip -br link | grep wvb; ip -n wvbw-{slot} -br addr; ip -n wvbw-{slot} route"
            ))
            .output();
        let _ = rt.kill(&id).await;
        return Err(format!(
            "{e}; {}",
            out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
        ));
    }
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    if let (Some(path), Ok(mut c)) = (path, CREATES.lock()) {
        c.push((path, id.clone(), created, ms));
    }
    rt.kill(&id).await.map_err(|e| e.to_string())?;
    Ok(ms)
}

async fn wait_warm(rt: &VmRuntime, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while rt.warm_count("base").await < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn raw_restore(
    snap: &Snapshot,
    net: &BenchNet,
    dir: PathBuf,
    run_as: Option<(u32, u32)>,
    path: Option<&'static str>,
) -> Result<f64, String> {
    let t = Instant::now();
    let spec = ForkSpec {
        qemu: "qemu-system-x86_64".into(),
        dir: dir.clone(),
        tap: Some("tap0".into()),
        netns: Some(net.path()),
        run_as,
        backing_link: None,
    };
    let pending = Pending::spawn(snap, &spec)
        .await
        .map_err(|e| e.to_string())?;
    let restored = pending.complete().await.map_err(|e| e.to_string())?;
    let (mut child, times) = (restored.child, restored.times);
    let running = t.elapsed().as_secs_f64() * 1000.0;
    let r = first_command_in(net.path()).await;
    eprintln!(
        "raw: running after {running:.1} ms, first command after {:.1} ms",
        t.elapsed().as_secs_f64() * 1000.0
    );
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    if let (Some(path), Ok(mut raws), true) = (path, RAWS.lock(), r.is_ok()) {
        raws.push((path, times, ms));
    }
    let _ = child.start_kill();
    let _ = child.wait().await;
    snapshot::remove_vm_dir(&dir);
    r.map(|_| ms)
}

async fn cold_boot(
    spec: &warren_runtime_vm::snapshot::TemplateSpec,
    net: &BenchNet,
    dir: PathBuf,
) -> Result<f64, String> {
    let t = Instant::now();
    let mut s = spec.clone();
    s.netns = Some(net.path());
    let mut booted = snapshot::boot(&s, &dir).await.map_err(|e| e.to_string())?;
    let r = first_command_in(net.path()).await;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    let _ = booted.child.start_kill();
    let _ = booted.child.wait().await;
    let _ = std::fs::remove_dir_all(&dir);
    r.map(|_| ms)
}

fn smaps(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let field = |k: &str| {
        text.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (field("Pss:"), field("Rss:"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let smoke = std::env::args().any(|a| a == "--smoke");
    // The runtime's stage events only (it logs nothing else here).
    tracing_subscriber::registry()
        .with(
            StageLog.with_filter(
                tracing_subscriber::filter::Targets::new()
                    .with_target(STAGES_TARGET, tracing::Level::DEBUG),
            ),
        )
        .init();
    let counts = if smoke {
        Counts {
            seq: 2,
            batches: 1,
            idle: 3,
        }
    } else {
        Counts {
            seq: 10,
            batches: 2,
            idle: 20,
        }
    };
    let conc = if smoke { 3 } else { 10 };
    let detection = warren_runtime_vm::accel::choose(forced_accel());
    println!(
        "vm_bench: accelerator {} ({}); {}",
        detection.accel.as_str(),
        detection.reason,
        if smoke { "smoke counts" } else { "full counts" }
    );

    let only_warm = std::env::args().any(|a| a == "--only-warm");
    let mut results: Vec<(String, usize, Vec<f64>)> = Vec::new();
    let (mut idle_n, mut pss, mut rss, mut mem_mb) = (0usize, 0u64, 0u64, 0u32);
    if !only_warm {
        // fork (no warm pool), raw restore, cold boot and idle memory share one runtime.
        let (cfg, vm) = config("f", 0, 0);
        let rt = VmRuntime::start(cfg.clone(), vm).await?;
        eprintln!("reattach");
        rt.reattach(vec![]).await;
        eprintln!("snapshot");
        let snap = rt.template_snapshot("base").await?;
        println!(
            "template snapshot: cold boot to agent {} ms",
            snap.meta.boot_ms
        );
        mem_mb = snap.meta.memory_mb;
        for c in [1, conc] {
            eprintln!("fork, concurrency {c}");
            let rounds = if c == 1 { counts.seq } else { counts.batches };
            let path = (c == 1).then_some("fork");
            let ms = measure(c, rounds, |i| {
                runtime_create(&rt, format!("bf{c}x{i}"), path)
            })
            .await;
            results.push(("fork".into(), c, ms));
        }

        eprintln!("raw restore");
        let nets: Vec<BenchNet> = (0..conc).map(BenchNet::new).collect();
        let work = PathBuf::from("/run/warren-vm-bench-raw");
        for c in [1, conc] {
            let rounds = if c == 1 { counts.seq } else { counts.batches };
            let ms = measure(c, rounds, |i| {
                let (snap, net, dir) = (&snap, &nets[i % c], work.join(format!("raw{i}")));
                let path = (c == 1).then_some("raw");
                async move { raw_restore(snap, net, dir, None, path).await }
            })
            .await;
            results.push(("raw".into(), c, ms));
            let ms = measure(c, rounds, |i| {
                let (snap, net, dir) = (&snap, &nets[i % c], work.join(format!("jail{i}")));
                let user = 300_200 + (i % c) as u32;
                let path = (c == 1).then_some("raw-jailed");
                async move { raw_restore(snap, net, dir, Some((user, user)), path).await }
            })
            .await;
            results.push(("raw-jailed".into(), c, ms));
        }
        let tspec = {
            let mut s = warren_runtime_vm::snapshot::TemplateSpec {
                qemu: "qemu-system-x86_64".into(),
                accel: snap.meta.accel,
                kernel: snap.meta.kernel.clone(),
                initrd: snap.meta.initrd.clone(),
                append: snap.meta.append.clone(),
                root_image: snap.meta.root_image.clone(),
                agent_bin: cfg.agent_bin.clone(),
                memory_mb: snap.meta.memory_mb,
                cpus: snap.meta.cpus,
                disk_mb: 1024,
                tap: Some("tap0".into()),
                netns: None,
                boot_timeout: Duration::from_secs(300),
                run_as: None,
            };
            s.append = s.append.clone();
            s
        };
        for c in [1, conc] {
            let rounds = if c == 1 { counts.seq.min(5) } else { 1 };
            let ms = measure(c, rounds, |i| {
                let (spec, net, dir) = (&tspec, &nets[i % c], work.join(format!("cold{i}")));
                async move { cold_boot(spec, net, dir).await }
            })
            .await;
            results.push(("cold".into(), c, ms));
        }
        drop(nets);
        let _ = std::fs::remove_dir_all(&work);

        eprintln!("idle memory");
        // Idle memory: n VMs, then PSS/RSS of each QEMU.
        let mut idle = Vec::new();
        for i in 0..counts.idle {
            match rt.create(spec(format!("idle{i}"))).await {
                Ok(s) => idle.push(s),
                Err(e) => eprintln!("idle VM {i} failed: {e}"),
            }
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        idle_n = idle.len();
        for s in &idle {
            let pid = s.record["pid"].as_u64().unwrap_or(0) as u32;
            let (p, r) = smaps(pid);
            pss += p;
            rss += r;
        }
        for s in &idle {
            let _ = rt.kill(&s.id).await;
        }
        rt.shutdown().await?;
        let _ = std::fs::remove_dir_all(&cfg.run_dir);
    }

    eprintln!("warm pool");
    // warm pool: a second runtime whose pool holds `conc` QEMUs.
    let (cfg2, vm2) = config("w", 1, conc);
    let rt2 = VmRuntime::start(cfg2.clone(), vm2).await?;
    rt2.reattach(vec![]).await;
    rt2.prepare_template("base").await?;
    for c in [1, conc] {
        let rounds = if c == 1 { counts.seq } else { counts.batches };
        let mut all = Vec::new();
        for r in 0..rounds {
            // A full pool: refills running beside the measured create would compete for CPU.
            wait_warm(&rt2, conc).await;
            let path = (c == 1).then_some("warm");
            let ms = measure(c, 1, |i| {
                runtime_create(&rt2, format!("bw{c}x{r}x{i}"), path)
            })
            .await;
            all.extend(ms);
        }
        results.push(("warm".into(), c, all));
    }
    rt2.shutdown().await?;
    let _ = std::fs::remove_dir_all(&cfg2.run_dir);

    println!("\ncreate to first command (agent ran /bin/true):");
    let empty: Vec<String> = results
        .iter()
        .filter(|(_, _, ms)| ms.is_empty())
        .map(|(n, c, _)| format!("{n} at concurrency {c}"))
        .collect();
    for (name, c, ms) in results {
        report(&name, c, ms);
    }
    report_stages();
    let n = idle_n.max(1) as f64;
    println!(
        "idle: {idle_n} VMs of {mem_mb} MiB: PSS {:.1} MiB per VM, RSS {:.1} MiB per VM",
        pss as f64 / n / 1024.0,
        rss as f64 / n / 1024.0
    );
    // Numbers are never judged, but a measurement that produced none is a failure.
    anyhow::ensure!(empty.is_empty(), "no numbers for: {}", empty.join(", "));
    anyhow::ensure!(only_warm || idle_n > 0, "no idle VM could be measured");
    Ok(())
}

//! Shared helpers of the namespace runtime tests: real sandboxes from the real base image,
//! driven through the agent.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use warren_host::cgroup::Limits;
use warren_host::HostConfig;
use warren_runtime_ns::config::{Confinement, ID_COUNT};
use warren_runtime_ns::launch::{self, LaunchSpec, NsConfig, Sandbox};

pub const DATA_DIR: &str = "/var/lib/warren";

/// Whether this host can run the sandbox tests: the one skip rule (`warren-testkit`: prints
/// `SKIP: <reason>`, or fails under `WARREN_REQUIRE_ALL=1`).
pub fn have_root() -> bool {
    warren_testkit::require(
        "root (namespaces, cgroups and network slots)",
        warren_testkit::is_root(),
    )
}

/// A host configuration of one test's own: its run dir, cgroups, slot prefix and addresses
/// (`warren-<name>-test-<pid>[-<tag>]`; short, the slot's paths live under it). With
/// `private_data`, paused and snapshot layers go to a data dir of its own that borrows the
/// shared image cache. `None` (with the reason printed) when the host cannot run it.
pub struct HostTest<'a> {
    pub name: &'a str,
    pub tag: &'a str,
    /// First letters of the slot names (interface names: keep it to two).
    pub prefix: &'a str,
    /// `10.<octet>.x.0/24` holds the slots' addresses.
    pub octet: u32,
    pub pool_size: usize,
    pub private_data: bool,
}

impl HostTest<'_> {
    pub fn config(&self) -> Option<HostConfig> {
        if !have_root() {
            return None;
        }
        let id = std::process::id();
        let suffix = if self.tag.is_empty() {
            format!("{id}")
        } else {
            format!("{id}-{}", self.tag)
        };
        let data = if self.private_data {
            let data = PathBuf::from(format!("/var/tmp/warren-{}-test-{suffix}", self.name));
            std::fs::create_dir_all(&data).unwrap();
            let images = data.join("images");
            if !images.exists() {
                std::os::unix::fs::symlink(Path::new(DATA_DIR).join("images"), &images).unwrap();
            }
            data
        } else {
            PathBuf::from(DATA_DIR)
        };
        let bin = target_dir();
        let mut cfg = HostConfig::new(data);
        cfg.run_dir = PathBuf::from(format!("/run/warren-{}-test-{suffix}", self.name));
        // Each runtime its own, as each server has: a runtime sweeps its directory when it
        // starts and unmounts what it mounted when it stops.
        cfg.templates_dir = cfg.run_dir.join("templates");
        cfg.agent_bin = agent_bin();
        cfg.nsinit_bin = pinned(&bin.join("warren-nsinit"));
        cfg.cgroup_parent = format!("warren-{}-test-{suffix}", self.name);
        cfg.net.prefix = format!("{}{}{}", self.prefix, self.tag, id % 10_000);
        // A range some earlier run left routed is passed over (each test its own octet).
        let third = warren_testkit::net::free_third_octet(
            self.octet as u8,
            (0..250).map(|k| ((id + k) % 250) as u8),
        );
        cfg.net.host_cidr = format!("10.{}.{third}.0/24", self.octet).parse().unwrap();
        cfg.net.run_dir = cfg.run_dir.join("net");
        cfg.net.pool_size = self.pool_size;
        Some(cfg)
    }
}

/// The runtime settings of the tests: no sandboxes prepared ahead (tests that count what a
/// runtime holds would see them; the pool's own tests, `tests/prepared.rs`, turn it on), and
/// the confinement [`confinement`] names.
pub fn ns_settings() -> warren_runtime_ns::NsSettings {
    warren_runtime_ns::NsSettings {
        prepared_max: 0,
        confinement: confinement(),
    }
}

/// Full confinement; `WARREN_NS_CONFINEMENT=baseline` in the test's environment runs the
/// suite against the earlier confinement, to see which assertions it fails.
pub fn confinement() -> Confinement {
    match std::env::var("WARREN_NS_CONFINEMENT") {
        Ok(v) => v.parse().expect("WARREN_NS_CONFINEMENT"),
        Err(_) => Confinement::Full,
    }
}

/// Removes what [`HostTest::config`] created (its run dir, and a private data dir).
pub fn cleanup(cfg: &HostConfig) {
    let _ = std::fs::remove_dir_all(&cfg.run_dir);
    if cfg.data_dir != Path::new(DATA_DIR) {
        let _ = std::fs::remove_file(cfg.data_dir.join("images"));
        let _ = std::fs::remove_dir_all(&cfg.data_dir);
    }
}

pub fn target_dir() -> PathBuf {
    // tests run from target/<profile>/deps/<name>-<hash>
    std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf()
}

pub fn agent_bin() -> PathBuf {
    pinned(&target_dir().join("warren-agent"))
}

pub fn nsinit_bin() -> PathBuf {
    pinned(Path::new(env!("CARGO_BIN_EXE_warren-nsinit")))
}

/// `bin` as it is now, for the whole test process: a hard link to its current file, so a
/// build that replaces it while the tests run (cargo's output is shared with every other
/// build of the workspace) cannot change the binary later sandboxes of this process start.
/// Without this, a launch after such a rebuild stages the new (possibly half-linked) agent,
/// and the sandbox dies before its agent answers.
pub fn pinned(bin: &Path) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    static PINS: std::sync::Mutex<Vec<(PathBuf, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut pins = PINS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, pin)) = pins.iter().find(|(b, _)| b == bin) {
        return pin.clone();
    }
    let dir = target_dir().join("test-pins");
    std::fs::create_dir_all(&dir).unwrap();
    let name = bin.file_name().unwrap().to_string_lossy().into_owned();
    // cargo swaps the file by unlinking and linking again: try again if we hit the gap.
    let mut tries = 0;
    let meta = loop {
        match std::fs::metadata(bin) {
            Ok(m) => break m,
            Err(e) if tries < 50 && e.kind() == std::io::ErrorKind::NotFound => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!(
                "{}: {e}; build it first (cargo build --release --workspace --bins)",
                bin.display()
            ),
        }
    };
    // Named by inode: every test process pinning the same build shares one link.
    let pin = dir.join(format!("{name}-{}", meta.ino()));
    match std::fs::hard_link(bin, &pin) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => panic!("pin {} at {}: {e}", bin.display(), pin.display()),
    }
    assert_eq!(
        std::fs::metadata(&pin).unwrap().ino(),
        meta.ino(),
        "{} is the build it names",
        pin.display()
    );
    remove_stale_pins(&dir, &name, &pin);
    pins.push((bin.to_path_buf(), pin.clone()));
    pin
}

/// Pins of older builds of `name` that nothing but the pin keeps and that no test process
/// pinned for a day (linking updates a file's ctime): their tests are long over.
fn remove_stale_pins(dir: &Path, name: &str, current: &Path) {
    use std::os::unix::fs::MetadataExt;
    let day_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .saturating_sub(24 * 3600);
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let ours = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix(name))
            .is_some_and(|rest| rest.starts_with('-'));
        let Ok(meta) = entry.metadata() else { continue };
        if ours && path != current && meta.nlink() == 1 && (meta.ctime() as u64) < day_ago {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// The base image, mounted read-only once per test process.
pub fn image_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let recipe = warren_template::Recipe::base();
        let image = warren_template::ensure_image(
            &recipe,
            Path::new(DATA_DIR),
            &mut warren_template::StderrProgress::new(),
        )
        .expect("build or find the base image");
        // One shared read-only mount, reused by later test runs; private to root, nosuid and
        // nodev, as a server's template mounts are.
        let parent = Path::new("/run/warren-test-images");
        std::fs::create_dir_all(parent).unwrap();
        std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o700)).unwrap();
        let mnt = parent.join(recipe.cache_key());
        std::fs::create_dir_all(&mnt).unwrap();
        if std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .contains(&format!(" {} ", mnt.display()))
        {
            return mnt;
        }
        let out = Command::new("mount")
            .args(["-t", "erofs", "-o", "ro,nosuid,nodev"])
            .arg(&image.image)
            .arg(&mnt)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mount image: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        mnt
    })
}

/// A network namespace of our own with loopback up (no links to anywhere).
pub struct NetNs(pub String);

impl NetNs {
    pub fn new() -> NetNs {
        let name = format!("wrt-{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
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
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.0))
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Each test has its own state dir and cgroup parent, so sweeping stale sandboxes in one test
/// never touches another test's.
pub fn config_for(test: &str) -> NsConfig {
    NsConfig {
        state_dir: PathBuf::from(format!("/run/warren-test-ns-{}-{test}", std::process::id())),
        // On a real disk, as the data dir is.
        disk_dir: PathBuf::from(format!(
            "/var/tmp/warren-test-ns-{}-{test}",
            std::process::id()
        )),
        nsinit_bin: nsinit_bin(),
        agent_bin: agent_bin(),
        cgroup_parent: format!("warren-test-{}-{test}", std::process::id()),
        confinement: confinement(),
        lxcfs: None,
    }
}

/// A host id range no other sandbox of any test process uses: above the usual `/etc/subuid`
/// allocations, 16 per test process.
pub fn fresh_id_base() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    assert!(n < 16, "a test process uses at most 16 id ranges");
    let slot = (std::process::id() % 1024) * 16 + n;
    (1 << 30) + slot * ID_COUNT
}

pub struct Running {
    pub sbx: Option<Sandbox>,
    pub net: NetNs,
    pub cfg: NsConfig,
    /// The agent's access token, sent with every process request.
    pub token: Option<String>,
}

pub async fn start(test: &str, limits: Limits, writable: u64) -> Running {
    start_with(test, limits, writable, |_| {}).await
}

/// Like [`start`], with `edit` applied to the launch spec first.
pub async fn start_with(
    test: &str,
    limits: Limits,
    writable: u64,
    edit: impl FnOnce(&mut LaunchSpec),
) -> Running {
    start_in(config_for(test), limits, writable, edit).await
}

/// Like [`start_with`], in configuration `cfg`.
pub async fn start_in(
    cfg: NsConfig,
    limits: Limits,
    writable: u64,
    edit: impl FnOnce(&mut LaunchSpec),
) -> Running {
    assert!(
        have_root(),
        "callers check common::have_root() first and return when it is false"
    );
    let net = NetNs::new();
    let id = format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let mut spec = LaunchSpec {
        volumes: Vec::new(),
        id,
        image_root: image_root().to_path_buf(),
        netns: net.path(),
        resolv_conf: "nameserver 127.0.0.1\n".into(),
        limits,
        writable_bytes: writable,
        agent_args: vec!["--listen".into(), warren_types::AGENT_LISTEN.into()],
        seed: None,
        id_base: fresh_id_base(),
        access_token: None,
        nested_namespaces: false,
    };
    edit(&mut spec);
    let sbx = launch::launch(&cfg, &spec).await.expect("launch");
    let r = Running {
        sbx: Some(sbx),
        net,
        cfg,
        token: spec.access_token.clone(),
    };
    r.wait_healthy();
    r
}

impl Running {
    pub fn sbx(&self) -> &Sandbox {
        self.sbx.as_ref().unwrap()
    }

    /// An HTTP/1.1 exchange with the agent, from inside the sandbox's network namespace.
    pub fn http(&self, request: Vec<u8>) -> std::io::Result<Vec<u8>> {
        let ns = std::fs::File::open(self.net.path())?;
        std::thread::spawn(move || {
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(std::io::Error::from)?;
            let mut s = std::net::TcpStream::connect("127.0.0.1:49983")?;
            s.set_read_timeout(Some(Duration::from_secs(120)))?;
            s.write_all(&request)?;
            let mut out = Vec::new();
            s.read_to_end(&mut out)?;
            let _ = ns.as_raw_fd();
            Ok(out)
        })
        .join()
        .unwrap()
    }

    /// Waits until the agent answers `GET /health`, or fails once the sandbox's PID 1 has
    /// ended (with how it ended). No deadline on a live sandbox: a loaded host only makes the
    /// agent slower, and only a guard against a hang bounds the wait.
    pub fn wait_healthy(&self) {
        let hang_guard = Instant::now() + Duration::from_secs(600);
        loop {
            let req = b"GET /health HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n".to_vec();
            if let Ok(resp) = self.http(req) {
                if resp.starts_with(b"HTTP/1.1 204") {
                    return;
                }
            }
            if let Some(status) = self.sbx().exit_status() {
                panic!("the sandbox ended before its agent answered: {status}");
            }
            assert!(
                Instant::now() < hang_guard,
                "the agent hangs: alive but silent"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Runs `cmd` with bash as `user` and returns (exit code, stdout+stderr), through the
    /// typed agent client, from inside the sandbox's network namespace.
    pub fn run_as(&self, user: &str, cmd: &str) -> (i64, String) {
        let ns = std::fs::File::open(self.net.path()).expect("open the network namespace");
        let (user, cmd, token) = (user.to_string(), cmd.to_string(), self.token.clone());
        // A thread of its own in the namespace, with a runtime on that thread only: the
        // client's sockets are created where it polls them.
        std::thread::spawn(move || {
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let argv = ["/bin/bash", "-l", "-c", &cmd].map(String::from);
            let ran = rt
                .block_on(warren_host::agent::run(
                    &reqwest::Client::new(),
                    "127.0.0.1:49983".parse().unwrap(),
                    token.as_deref(),
                    Some(&user),
                    &argv,
                    None,
                    usize::MAX,
                ))
                // Debug: the cause (the agent's error, the transport's) is in the chain.
                .unwrap_or_else(|e| panic!("{cmd}: {e:?}"));
            (
                ran.exit_code,
                String::from_utf8_lossy(&ran.output).into_owned(),
            )
        })
        .join()
        .unwrap()
    }

    pub fn run(&self, cmd: &str) -> (i64, String) {
        self.run_as("root", cmd)
    }

    pub async fn destroy(mut self) -> (Sandbox, NsConfig) {
        let sbx = self.sbx.take().unwrap();
        let leftover = Sandbox::reattach(&self.cfg, &sbx.id, sbx.pid1);
        sbx.destroy().await.expect("destroy");
        // Each test owns its parents; they are empty once its last sandbox is gone.
        let _ = launch::remove_empty_parents(&self.cfg);
        (
            leftover.expect("reattach finds a running sandbox"),
            self.cfg.clone(),
        )
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(s) = &self.sbx {
            // Processes, cgroup, the disk's mount and image, state.
            let _ = launch::remove_sandbox(&self.cfg, &s.id);
        }
        // The last sandbox of a test takes the test's parents (state dir, staged agent's
        // mount, cgroups) with it, also when the test failed; this refuses while another
        // sandbox of the same configuration lives.
        let _ = launch::remove_empty_parents(&self.cfg);
    }
}

pub const MIB: u64 = 1 << 20;

pub fn limits() -> Limits {
    Limits {
        cpu_millis: Some(1000),
        memory_bytes: Some(512 * MIB),
        pids: Some(256),
    }
}

/// Runs `cmd` in a login shell through the sandbox's agent (as the host reaches it, with the
/// tests' access token `tok`) and returns its exit code and output.
pub async fn run(agent: std::net::SocketAddr, cmd: &str) -> (i64, String) {
    run_as(agent, "tok", cmd).await
}

/// [`run`] with another access token ("" for none).
pub async fn run_as(agent: std::net::SocketAddr, token: &str, cmd: &str) -> (i64, String) {
    let argv = ["/bin/bash", "-l", "-c", cmd].map(String::from);
    let ran = warren_host::agent::run(
        &reqwest::Client::new(),
        agent,
        (!token.is_empty()).then_some(token),
        None,
        &argv,
        None,
        1 << 20,
    )
    .await
    // Debug: the cause (the agent's error, the transport's) is in the chain, not the message.
    .unwrap_or_else(|e| panic!("{cmd}: {e:?}"));
    (
        ran.exit_code,
        String::from_utf8_lossy(&ran.output).into_owned(),
    )
}

/// A server restart: the old manager lets go of the host as an exiting server does (nothing
/// torn down) and a new one starts on the same host state.
pub async fn restart(
    old: std::sync::Arc<warren_runtime_ns::NsRuntime>,
    cfg: &HostConfig,
    settings: warren_runtime_ns::NsSettings,
) -> std::sync::Arc<warren_runtime_ns::NsRuntime> {
    old.release().await.expect("release the old manager");
    warren_runtime_ns::NsRuntime::start(cfg.clone(), settings)
        .await
        .expect("restart")
}

/// 1 CPU, 512 MiB and a 256 MiB disk: for tests whose workload needs more than
/// [`small_spec`]'s.
pub const MEDIUM: warren_types::Resources = warren_types::Resources {
    cpu_count: 1,
    memory_mb: 512,
    disk_mb: 256,
};

/// A create of a small sandbox of `base` (1 CPU, 256 MiB, a 128 MiB disk, no internet, token
/// `tok`); tests change what they need with struct update syntax.
pub fn small_spec(id: &str) -> warren_runtime::CreateSpec {
    warren_runtime::CreateSpec {
        volumes: Vec::new(),
        id: id.parse().expect("a valid sandbox id"),
        template: "base".into(),
        resources: warren_types::Resources {
            cpu_count: 1,
            memory_mb: 256,
            disk_mb: 128,
        },
        allow_internet_access: false,
        egress: Default::default(),
        env_vars: Default::default(),
        access_token: Some("tok".into()),
        from_snapshot: None,
        reservation: None,
    }
}

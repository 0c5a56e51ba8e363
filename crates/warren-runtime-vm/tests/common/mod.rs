//! Shared fixtures of the VM pipeline tests: the kernel, initramfs and template image, and a
//! private network namespace with a tap device for the guest.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use warren_host::HostConfig;
use warren_runtime_vm::accel::Accel;
use warren_runtime_vm::snapshot::TemplateSpec;
use warren_runtime_vm::VmSettings;

/// Where the shared caches (images, kernels, initramfs) live.
pub const SHARED_DATA: &str = "/var/lib/warren";

/// Whether this host can run the runtime tests: root and QEMU (the one skip rule,
/// `warren-testkit`: `SKIP: <reason>`, or a failure under `WARREN_REQUIRE_ALL=1`).
pub fn have_vm_host() -> bool {
    warren_testkit::require("root", warren_testkit::is_root())
        && warren_testkit::require(
            "qemu-system-x86_64 (scripts/setup.sh installs it)",
            warren_testkit::on_path("qemu-system-x86_64").is_some(),
        )
}

/// The settings one test binary gives every test's own host configuration.
pub struct VmTest<'a> {
    /// `/run/warren-<name>-test-<tag>-<pid>` (short: QMP socket paths live below it and
    /// must fit in `sun_path`'s 108 bytes) and the cgroup of the same name.
    pub name: &'a str,
    /// First letters of the slot names (interface names: keep it to two).
    pub prefix: &'a str,
    /// `10.<octet>.x.0/26` holds the slots' addresses.
    pub octet: u32,
    pub pool_size: usize,
    pub warm_pool: usize,
}

impl VmTest<'_> {
    /// A config of its own (prefix, addresses, cgroups, state) for test `tag`, the `n`th of
    /// its binary, with its data in `data`; `None` (with the reason printed) when the host
    /// cannot run it.
    pub fn config(&self, tag: &str, n: u32, data: &Path) -> Option<(HostConfig, VmSettings)> {
        if !have_vm_host() {
            return None;
        }
        let exe = std::env::current_exe().unwrap();
        let bin = exe.parent().unwrap().parent().unwrap().to_path_buf();
        let id = std::process::id();
        let mut cfg = HostConfig::new(data.to_path_buf());
        cfg.run_dir = PathBuf::from(format!("/run/warren-{}-test-{tag}-{id}", self.name));
        cfg.agent_bin = bin.join("warren-agent");
        cfg.cgroup_parent = format!("warren-{}-test-{tag}-{id}", self.name);
        cfg.net.prefix = format!("{}{tag}{}", self.prefix, id % 10_000);
        // The n-th test of a binary keeps to third octets ≡ n (mod 4), so tests of one process
        // never pick the same range; a range some earlier run left routed is passed over.
        let third = warren_testkit::net::free_third_octet(
            self.octet as u8,
            (0..64).map(|k| (((id % 60 + k) % 64) * 4 + n % 4) as u8),
        );
        cfg.net.host_cidr = format!("10.{}.{third}.0/26", self.octet).parse().unwrap();
        cfg.net.run_dir = cfg.run_dir.join("net");
        cfg.net.pool_size = self.pool_size;
        let mut vm = VmSettings::new(&cfg);
        vm.memory_mb = 256;
        vm.disk_mb = 1024;
        vm.warm_pool = self.warm_pool;
        assert!(vm.vminit_bin.exists(), "build warren-vminit first");
        Some((cfg, vm))
    }
}

/// A data directory of test `tag`'s own (its checkpoints) that borrows the shared image and
/// kernel caches.
pub fn private_data_dir(tag: &str) -> PathBuf {
    let data = PathBuf::from(format!(
        "/var/tmp/warren-vm-persist-test-{}-{tag}",
        std::process::id()
    ));
    std::fs::create_dir_all(&data).unwrap();
    for shared in ["images", "vm"] {
        let link = data.join(shared);
        if !link.exists() {
            std::fs::create_dir_all(Path::new(SHARED_DATA).join(shared)).unwrap();
            std::os::unix::fs::symlink(Path::new(SHARED_DATA).join(shared), &link).unwrap();
        }
    }
    data
}

/// Removes a test's run dir and, if it had one, its private data dir.
pub fn cleanup(cfg: &HostConfig) {
    let _ = std::fs::remove_dir_all(&cfg.run_dir);
    if cfg.data_dir != Path::new(SHARED_DATA) {
        for shared in ["images", "vm"] {
            let _ = std::fs::remove_file(cfg.data_dir.join(shared));
        }
        let _ = std::fs::remove_dir_all(&cfg.data_dir);
    }
}

/// Prints why and returns `None` when this host cannot run the tests (the one skip rule,
/// `warren-testkit`: `SKIP: <reason>`, or a failure under `WARREN_REQUIRE_ALL=1`).
pub fn prerequisites() -> Option<(PathBuf, PathBuf, PathBuf)> {
    if !have_vm_host() {
        return None;
    }
    let bin_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/release");
    let (agent, vminit) = (bin_dir.join("warren-agent"), bin_dir.join("warren-vminit"));
    if !agent.exists() || !vminit.exists() {
        warren_testkit::skip("build first: cargo build --release");
        return None;
    }
    Some((agent, vminit, image()?))
}

/// The base template image, built on first use like the other runtime tests do.
fn image() -> Option<PathBuf> {
    let data = data_dir();
    match warren_template::ensure_image(
        &warren_template::Recipe::base(),
        &data,
        &mut warren_template::StderrProgress::new(),
    ) {
        Ok(i) => Some(i.image),
        Err(e) => panic!("base template image in {}: {e}", data.display()),
    }
}

pub fn data_dir() -> PathBuf {
    std::env::var_os("WARREN_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/warren"))
}

/// A network namespace with a tap device whose far end is the guest (169.254.0.21).
pub struct TestNet {
    pub name: String,
}

impl TestNet {
    pub fn new(tag: &str) -> Self {
        let name = format!("wvmt-{tag}-{}", std::process::id());
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(std::process::Stdio::null())
            .status();
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap()
            .success();
        assert!(ok, "ip netns add failed");
        let batch = "link set lo up\n\
             tuntap add dev tap0 mode tap\n\
             address add 169.254.0.22/30 dev tap0\n\
             link set tap0 up\n";
        let mut child = Command::new("ip")
            .args(["-n", &name, "-batch", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("ip");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(batch.as_bytes())
            .unwrap();
        assert!(child.wait().unwrap().success(), "ip -batch failed");
        Self { name }
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }

    /// One HTTP request to the guest at 169.254.0.21:49983, made from inside the netns.
    pub fn http(&self, request: &str) -> std::io::Result<String> {
        let ns = self.path();
        let request = request.to_string();
        std::thread::spawn(move || -> std::io::Result<String> {
            let f = std::fs::File::open(&ns)?;
            nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(std::io::Error::from)?;
            let addr: SocketAddr = "169.254.0.21:49983".parse().unwrap();
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(20))?;
            s.set_read_timeout(Some(Duration::from_secs(30)))?;
            s.write_all(request.as_bytes())?;
            let mut out = String::new();
            s.read_to_string(&mut out)?;
            Ok(out)
        })
        .join()
        .expect("http thread")
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

pub fn template_spec(
    dirs: (&Path, &Path),
    agent: &Path,
    image: &Path,
    net: &TestNet,
) -> TemplateSpec {
    let (data, cache) = dirs;
    let kernel = warren_runtime_vm::kernel::ensure(data, &Default::default()).expect("kernel");
    let vminit =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/release/warren-vminit");
    let initrd = warren_runtime_vm::initramfs::ensure(&kernel, &vminit, cache).expect("initramfs");
    TemplateSpec {
        qemu: PathBuf::from("qemu-system-x86_64"),
        accel: Accel::Tcg,
        kernel: kernel.vmlinuz,
        initrd,
        append: warren_runtime_vm::qemu::kernel_cmdline(
            warren_runtime_vm::accel::host_tsc_khz(),
            "test",
            &[],
        ),
        root_image: image.to_path_buf(),
        agent_bin: agent.to_path_buf(),
        memory_mb: 256,
        cpus: 1,
        disk_mb: 1024,
        tap: Some("tap0".into()),
        netns: Some(net.path()),
        boot_timeout: Duration::from_secs(180),
        // The template boot is jailed as an unprivileged user, as the vm runtime does it.
        run_as: Some((300_000, 300_000)),
    }
}

/// Runs `cmd` in a login shell through the sandbox's agent (as the host reaches it, with the
/// tests' access token `tok`) and returns its exit code and output.
pub async fn run(agent: std::net::SocketAddr, cmd: &str) -> (i64, String) {
    let argv = ["/bin/bash", "-l", "-c", cmd].map(String::from);
    let ran = warren_host::agent::run(
        &reqwest::Client::new(),
        agent,
        Some("tok"),
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

/// A small create of `base` (1 CPU, 256 MiB, a 256 MiB disk) whose agent requires the token
/// `tok`, with no internet access, env vars or volumes; each test changes what it needs.
pub fn small_spec(id: &str) -> warren_runtime::CreateSpec {
    warren_runtime::CreateSpec {
        volumes: Vec::new(),
        id: id.parse().expect("a valid sandbox id"),
        template: "base".into(),
        resources: warren_runtime::Resources {
            cpu_count: 1,
            memory_mb: 256,
            disk_mb: 256,
        },
        allow_internet_access: false,
        egress: Default::default(),
        env_vars: Default::default(),
        access_token: Some("tok".into()),
        from_snapshot: None,
        reservation: None,
    }
}

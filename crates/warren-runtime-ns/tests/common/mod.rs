//! Shared helpers of the namespace runtime tests: real sandboxes from the real base image,
//! driven through the agent.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use warren_host::cgroup::Limits;
use warren_runtime_ns::config::{Confinement, ID_COUNT};
use warren_runtime_ns::launch::{self, LaunchSpec, NsConfig, Sandbox};

pub const DATA_DIR: &str = "/var/lib/warren";

pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests need root (they create namespaces and cgroups)"
    );
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
    let p = target_dir().join("warren-agent");
    assert!(
        p.exists(),
        "{} is missing: build it first (cargo build -p warren-agent)",
        p.display()
    );
    p
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
        // One shared read-only mount, reused by later test runs (like a server's template mount).
        let mnt = PathBuf::from(format!("/run/warren-test-image-{}", recipe.cache_key()));
        std::fs::create_dir_all(&mnt).unwrap();
        if std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .contains(&format!(" {} ", mnt.display()))
        {
            return mnt;
        }
        let out = Command::new("mount")
            .args(["-t", "erofs", "-o", "ro"])
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
        nsinit_bin: PathBuf::from(env!("CARGO_BIN_EXE_warren-nsinit")),
        agent_bin: agent_bin(),
        cgroup_parent: format!("warren-test-{}-{test}", std::process::id()),
        // WARREN_NS_CONFINEMENT=baseline runs the suite against the earlier confinement, to see
        // which assertions it fails.
        confinement: Confinement::from_env(),
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
    let cfg = config_for(test);
    require_root();
    let net = NetNs::new();
    let id = format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let mut spec = LaunchSpec {
        id,
        image_root: image_root().to_path_buf(),
        netns: net.path(),
        resolv_conf: "nameserver 127.0.0.1\n".into(),
        limits,
        writable_bytes: writable,
        agent_args: vec!["--listen".into(), "0.0.0.0:49983".into()],
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

    pub fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let req = b"GET /health HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n".to_vec();
            if let Ok(resp) = self.http(req) {
                if resp.starts_with(b"HTTP/1.1 204") {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "agent never became healthy; exit: {:?}",
                self.sbx().exit_status()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Runs `cmd` with bash as `user` and returns (exit code, stdout+stderr).
    pub fn run_as(&self, user: &str, cmd: &str) -> (i64, String) {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        let msg = serde_json::json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", cmd]}, "stdin": false});
        let payload = serde_json::to_vec(&msg).unwrap();
        let mut body = vec![0u8];
        body.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        body.extend_from_slice(&payload);
        let auth = b64.encode(format!("{user}:"));
        let mut req = format!(
            "POST /process.Process/Start HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Type: application/connect+json\r\nAuthorization: Basic {auth}\r\n{token}Content-Length: {}\r\n\r\n",
            body.len(),
            token = self
                .token
                .as_ref()
                .map_or(String::new(), |t| format!("X-Access-Token: {t}\r\n")),
        )
        .into_bytes();
        req.extend(body);
        let resp = self.http(req).expect("agent answers");
        let text_end = resp.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let head = String::from_utf8_lossy(&resp[..text_end]).to_lowercase();
        let raw = if head.contains("transfer-encoding: chunked") {
            dechunk(&resp[text_end..])
        } else {
            resp[text_end..].to_vec()
        };
        let mut out = String::new();
        let mut code = i64::MIN;
        let mut rest = &raw[..];
        while rest.len() >= 5 {
            let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
            let v: serde_json::Value = serde_json::from_slice(&rest[5..5 + len]).unwrap();
            if rest[0] == 2 {
                assert!(v.get("error").is_none(), "stream error: {v}");
            } else if let Some(d) = v["event"].get("data") {
                for k in ["stdout", "stderr"] {
                    if let Some(s) = d.get(k) {
                        out.push_str(&String::from_utf8_lossy(
                            &b64.decode(s.as_str().unwrap()).unwrap(),
                        ));
                    }
                }
            } else if let Some(e) = v["event"].get("end") {
                code = e.get("exitCode").and_then(|c| c.as_i64()).unwrap_or(0);
            }
            rest = &rest[5 + len..];
        }
        assert!(
            code != i64::MIN,
            "no end event for {cmd:?}; response: {}",
            String::from_utf8_lossy(&resp)
        );
        (code, out)
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
            let _ = s.cgroup.kill_all();
            let _ = s.cgroup.remove();
        }
    }
}

pub fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let n =
            usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap().trim(), 16).unwrap_or(0);
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + n]);
        b = &b[eol + 4 + n..];
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

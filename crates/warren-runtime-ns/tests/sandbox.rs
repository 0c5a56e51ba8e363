//! Real namespace sandboxes from the real base image, asserted from inside through the agent.
//!
//! Needs root, the base image (built on first use by `warren-image`: mmdebstrap, erofs-utils,
//! network access to Debian's archive) and the agent binary (`cargo build -p warren-agent`).

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use warren_runtime_ns::cgroup::Limits;
use warren_runtime_ns::launch::{self, LaunchSpec, NsConfig, Sandbox};

const DATA_DIR: &str = "/var/lib/warren";

fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests need root (they create namespaces and cgroups)"
    );
}

fn target_dir() -> PathBuf {
    // tests run from target/<profile>/deps/<name>-<hash>
    std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf()
}

fn agent_bin() -> PathBuf {
    let p = target_dir().join("warren-agent");
    assert!(
        p.exists(),
        "{} is missing: build it first (cargo build -p warren-agent)",
        p.display()
    );
    p
}

/// The base image, mounted read-only once per test process.
fn image_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let recipe = warren_image::Recipe::base();
        let image = warren_image::ensure_image(
            &recipe,
            Path::new(DATA_DIR),
            &mut warren_image::StderrProgress::new(),
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
struct NetNs(String);

impl NetNs {
    fn new() -> NetNs {
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
    fn path(&self) -> PathBuf {
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
fn config_for(test: &str) -> NsConfig {
    NsConfig {
        state_dir: PathBuf::from(format!("/run/warren-test-ns-{}-{test}", std::process::id())),
        nsinit_bin: PathBuf::from(env!("CARGO_BIN_EXE_warren-nsinit")),
        agent_bin: agent_bin(),
        id_base: 100_000,
        cgroup_parent: format!("warren-test-{}-{test}", std::process::id()),
    }
}

struct Running {
    sbx: Option<Sandbox>,
    net: NetNs,
    cfg: NsConfig,
}

async fn start(test: &str, limits: Limits, writable: u64) -> Running {
    let cfg = config_for(test);
    require_root();
    let net = NetNs::new();
    let id = format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let spec = LaunchSpec {
        id,
        image_root: image_root().to_path_buf(),
        netns: net.path(),
        resolv_conf: "nameserver 127.0.0.1\n".into(),
        limits,
        writable_bytes: writable,
        agent_args: vec!["--listen".into(), "0.0.0.0:49983".into()],
        seed: None,
    };
    let sbx = launch::launch(&cfg, &spec).await.expect("launch");
    let r = Running {
        sbx: Some(sbx),
        net,
        cfg,
    };
    r.wait_healthy();
    r
}

impl Running {
    fn sbx(&self) -> &Sandbox {
        self.sbx.as_ref().unwrap()
    }

    /// An HTTP/1.1 exchange with the agent, from inside the sandbox's network namespace.
    fn http(&self, request: Vec<u8>) -> std::io::Result<Vec<u8>> {
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

    fn wait_healthy(&self) {
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
    fn run_as(&self, user: &str, cmd: &str) -> (i64, String) {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        let msg = serde_json::json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", cmd]}, "stdin": false});
        let payload = serde_json::to_vec(&msg).unwrap();
        let mut body = vec![0u8];
        body.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        body.extend_from_slice(&payload);
        let auth = b64.encode(format!("{user}:"));
        let mut req = format!(
            "POST /process.Process/Start HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Type: application/connect+json\r\nAuthorization: Basic {auth}\r\nContent-Length: {}\r\n\r\n",
            body.len()
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

    fn run(&self, cmd: &str) -> (i64, String) {
        self.run_as("root", cmd)
    }

    async fn destroy(mut self) -> (Sandbox, NsConfig) {
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

fn dechunk(mut b: &[u8]) -> Vec<u8> {
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

const MIB: u64 = 1 << 20;

fn limits() -> Limits {
    Limits {
        cpu_millis: Some(1000),
        memory_bytes: Some(512 * MIB),
        pids: Some(256),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_is_an_isolated_debian_system() {
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
    assert_eq!(host_uid, "100000");
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

#[tokio::test(flavor = "multi_thread")]
async fn kill_leaves_the_host_clean_and_stale_sandboxes_are_swept() {
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

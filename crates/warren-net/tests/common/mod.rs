//! Shared fixtures of the warren-net integration tests.
//!
//! Every test gets its own prefix `w<run><nn>` (run = 4 hex digits per test process, nn = test
//! number), its own /24 of slot addresses and its own "outside world": a network namespace
//! that plays the internet, reachable from the host through its own veth. Test traffic only
//! ever goes to loopback and to namespaces created here.
//!
//! Cleanup happens three times over: the library's own shutdown, a [`TestCtx`] guard whose
//! `Drop` removes everything with the test's prefix even after a failed assertion, and a sweep
//! at start-up that removes objects of earlier test processes that were killed (their run
//! lock is free).

#![allow(dead_code)] // Each test file uses a different subset.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use warren_net::{netns, DnsSource, NetConfig, NetPool, Slot, SlotPolicy};

pub mod dns;

const RUN_DIR: &str = "/run/warren-net-test";
/// Timeout for connections that must fail (dropped packets never answer).
pub const BLOCKED: Duration = Duration::from_millis(800);
/// Timeout for connections that must work.
pub const OPEN: Duration = Duration::from_secs(3);

struct Run {
    id: String,
    /// Held for the life of the process: tells sweeps of other test processes we are alive.
    _lock: Flock<File>,
    /// Selects this run's second octet / outside block, to keep concurrent runs apart.
    salt: u8,
}

static RUN: OnceLock<Run> = OnceLock::new();

thread_local! {
    /// The prefix of the test running on this thread, for failure diagnostics.
    static CURRENT_PREFIX: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}
static TEST_NO: AtomicU32 = AtomicU32::new(1);

/// Per-test context: names, addresses and the cleanup guard.
pub struct TestCtx {
    pub prefix: String,
    pub no: u8,
    salt: u8,
    outside: Option<Outside>,
}

/// The fake internet of one test.
pub struct Outside {
    pub name: String,
    /// The host's address on the outside link: what masquerade makes slots look like.
    pub host_addr: Ipv4Addr,
    /// The outside namespace's address ("a server on the internet").
    pub addr: Ipv4Addr,
    /// Extra private addresses routed to the outside namespace.
    pub private: Vec<Ipv4Addr>,
}

/// Returns the test context, or `None` when the host cannot run the tests: then the reason
/// is printed (`SKIP: ...`), or, under `WARREN_REQUIRE_ALL=1`, the test fails with it.
pub fn setup() -> Option<TestCtx> {
    let mut missing = Vec::new();
    if !warren_testkit::is_root() {
        missing.push("root".to_owned());
    }
    for (tool, package) in [("ip", "iproute2"), ("nft", "nftables")] {
        let found = Command::new(tool)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            missing.push(format!("`{tool}` (Debian package `{package}`)"));
        }
    }
    if !warren_testkit::require(missing.join(", "), missing.is_empty()) {
        return None;
    }
    let run = RUN.get_or_init(start_run);
    let no = TEST_NO.fetch_add(1, Ordering::Relaxed) as u8;
    let prefix = format!("w{}{no:02}", run.id);
    CURRENT_PREFIX.with(|p| *p.borrow_mut() = prefix.clone());
    Some(TestCtx {
        prefix,
        no,
        salt: run.salt,
        outside: None,
    })
}

fn start_run() -> Run {
    // The pool logs background failures (refill, recycling) through tracing; show them in
    // the output of failed tests.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warren_net=debug".into()),
        )
        .with_test_writer()
        .try_init();
    std::fs::create_dir_all(RUN_DIR).expect("create test run dir");
    sweep_dead_runs();
    let seed = std::process::id()
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
    let id = format!("{:04x}", seed & 0xffff);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(Path::new(RUN_DIR).join(format!("{id}.lock")))
        .expect("open run lock");
    let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock)
        .unwrap_or_else(|_| panic!("run id {id} is in use; retry"));
    Run {
        id,
        _lock: lock,
        salt: (seed >> 16) as u8,
    }
}

/// `w` + 4 hex digits (run) + 2 digits (test): the test-object naming scheme.
fn test_run_of(name: &str) -> Option<&str> {
    let b = name.as_bytes();
    let ok = b.len() >= 7
        && b[0] == b'w'
        && b[1..5]
            .iter()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        && b[5..7].iter().all(u8::is_ascii_digit);
    ok.then(|| &name[1..5])
}

/// Removes objects and lock files of test processes that died without cleaning up.
fn sweep_dead_runs() {
    let run_alive = |run: &str| {
        let path = Path::new(RUN_DIR).join(format!("{run}.lock"));
        OpenOptions::new()
            .write(true)
            .open(path)
            .ok()
            .map(|f| Flock::lock(f, FlockArg::LockExclusiveNonblock).is_err())
            .unwrap_or(false)
    };
    let mut runs: Vec<String> = all_object_names()
        .iter()
        .filter_map(|n| test_run_of(n).map(str::to_owned))
        .collect();
    if let Ok(dir) = std::fs::read_dir(RUN_DIR) {
        for entry in dir.flatten() {
            let file = entry.file_name().to_string_lossy().into_owned();
            if let Some(run) = file.strip_suffix(".lock").filter(|r| r.len() == 4) {
                runs.push(run.to_owned());
            }
        }
    }
    runs.sort();
    runs.dedup();
    for run in runs.into_iter().filter(|r| !run_alive(r)) {
        remove_matching(&|name: &str| test_run_of(name) == Some(run.as_str()));
        // The run lock and the pools' prefix locks (`w<run><nn>.lock`).
        if let Ok(dir) = std::fs::read_dir(RUN_DIR) {
            for entry in dir.flatten() {
                let file = entry.file_name().to_string_lossy().into_owned();
                if file == format!("{run}.lock") || file.starts_with(&format!("w{run}")) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
    }
}

fn all_object_names() -> Vec<String> {
    let mut names = netns_names();
    names.extend(link_names());
    names.extend(table_names().into_iter().map(|(_, n)| n));
    names
}

pub fn netns_names() -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

pub fn link_names() -> Vec<String> {
    std::fs::read_dir("/sys/class/net")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

pub fn table_names() -> Vec<(String, String)> {
    let out = sh("nft", &["list", "tables"], None).unwrap_or_default();
    out.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next()? == "table").then_some(())?;
            Some((w.next()?.to_owned(), w.next()?.to_owned()))
        })
        .collect()
}

/// Synchronous removal of every netns, link and table whose name matches.
fn remove_matching(matches: &dyn Fn(&str) -> bool) {
    let mut batch = String::new();
    for l in link_names().iter().filter(|n| matches(n)) {
        batch.push_str(&format!("link del dev {l}\n"));
    }
    for n in netns_names().iter().filter(|n| matches(n)) {
        batch.push_str(&format!("netns del {n}\n"));
    }
    if !batch.is_empty() {
        let _ = sh("ip", &["-force", "-batch", "-"], Some(&batch));
    }
    for (family, name) in table_names().iter().filter(|(_, n)| matches(n)) {
        let _ = sh("nft", &["delete", "table", family, name], None);
    }
}

/// Runs a command, returning stdout; `Err` carries stderr.
pub fn sh(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{program}: {e}"))?;
    if let Some(mut pipe) = child.stdin.take() {
        if let Some(input) = stdin {
            let _ = pipe.write_all(input.as_bytes());
        }
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

impl TestCtx {
    /// A pool configuration confined to this test: own prefix, /24 and lock directory. The
    /// outside world (if made first) is the pool's uplink: when the host has IPv4
    /// forwarding off, the pool turns it on for that link instead of the default route's.
    pub fn config(&self, pool_size: usize) -> NetConfig {
        NetConfig {
            prefix: self.prefix.clone(),
            host_cidr: format!("10.{}.{}.0/24", self.octet2(), self.no)
                .parse()
                .expect("valid test CIDR"),
            pool_size,
            run_dir: PathBuf::from(RUN_DIR),
            forward_uplinks: self.outside.iter().map(|o| o.name.clone()).collect(),
            ..NetConfig::default()
        }
    }

    /// [`TestCtx::config`] with [`TestCtx::private_addr`] as the slots' only DNS server (the
    /// tests serve names there from the outside world).
    pub fn dns_config(&self, pool_size: usize) -> NetConfig {
        NetConfig {
            dns: DnsSource::Servers(vec![self.private_addr()]),
            ..self.config(pool_size)
        }
    }

    fn octet2(&self) -> u8 {
        200 + self.salt % 50
    }

    /// A private address (inside 10/8, blocked for sandboxes by default) that the outside
    /// world will answer on.
    pub fn private_addr(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, self.octet2(), 200 + self.no, 53)
    }

    /// A second such address: a DNS server that is *not* the configured one.
    pub fn other_private_addr(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, self.octet2(), 200 + self.no, 54)
    }

    /// A second public-looking address of the fake internet (call after [`TestCtx::outside`]):
    /// routed by the host to the outside namespace only, like its main address.
    pub fn outside_second(&self) -> Ipv4Addr {
        let o = self.outside.as_ref().expect("outside() first");
        let extra = Ipv4Addr::new(198, 19, self.salt, self.no);
        sh(
            "ip",
            &[
                "route",
                "add",
                &format!("{extra}/32"),
                "via",
                &o.addr.to_string(),
                "dev",
                &o.name,
            ],
            None,
        )
        .expect("route the second outside address");
        sh(
            "ip",
            &[
                "-n",
                &o.name,
                "address",
                "add",
                &format!("{extra}/32"),
                "dev",
                "eth0",
            ],
            None,
        )
        .expect("add the second outside address");
        let route = sh("ip", &["route", "get", &extra.to_string()], None).expect("ip route get");
        assert!(
            route.contains(&format!("dev {} ", o.name)),
            "{extra} is not routed to the test namespace: {route}"
        );
        extra
    }

    /// Creates this test's fake internet (`<prefix>x`). The host routes the outside /30 and
    /// [`TestCtx::private_addr`] to it.
    pub fn outside(&mut self) -> &Outside {
        let name = format!("{}x", self.prefix);
        let base = u32::from(Ipv4Addr::new(198, 18, self.salt, 0)) + 4 * u32::from(self.no);
        let host_addr = Ipv4Addr::from(base + 1);
        let addr = Ipv4Addr::from(base + 2);
        let private = self.private_addr();
        let other = self.other_private_addr();
        // Registered before creation, so the guard removes a half-built world too.
        self.outside = Some(Outside {
            name: name.clone(),
            host_addr,
            addr,
            private: vec![private, other],
        });
        // Explicit MACs: udev's MACAddressPolicy would otherwise rewrite a random one shortly
        // after creation, invalidating the neighbour caches of the first packets.
        let host = format!(
            "netns add {name}\n\
             link add name {name} address 02:77:74:00:00:01 type veth peer name eth0 \
             address 02:77:74:00:00:02 netns {name}\n\
             address add {host_addr}/30 dev {name}\n\
             link set dev {name} up\n\
             route add {private}/32 via {addr} dev {name}\n\
             route add {other}/32 via {addr} dev {name}\n"
        );
        sh("ip", &["-batch", "-"], Some(&host)).expect("create outside world");
        let inner = format!(
            "link set dev lo up\n\
             address add {addr}/30 dev eth0\n\
             address add {private}/32 dev eth0\n\
             address add {other}/32 dev eth0\n\
             link set dev eth0 up\n"
        );
        sh("ip", &["-n", &name, "-batch", "-"], Some(&inner)).expect("configure outside");
        // The safety net of the whole suite: traffic to these addresses must end up in our
        // namespace, never on a real network.
        for target in [addr, private, other] {
            let route =
                sh("ip", &["route", "get", &target.to_string()], None).expect("ip route get");
            assert!(
                route.contains(&format!("dev {name} ")),
                "{target} is not routed to the test namespace: {route}"
            );
        }
        self.outside.as_ref().expect("just set")
    }

    /// Routes `pool_cidr` from the outside world back to the host: without the host table
    /// nothing masquerades, and whatever leaks from a slot must still get an answer.
    pub fn route_pool_back(&self, pool_cidr: &str) {
        let o = self.outside.as_ref().expect("outside() first");
        let via = o.host_addr.to_string();
        let args = ["-n", &o.name, "route", "add", pool_cidr, "via", &via];
        sh("ip", &args, None).expect("route back to the pool");
    }

    pub fn outside_netns(&self) -> PathBuf {
        netns::netns_path(&self.outside.as_ref().expect("outside world").name)
    }

    /// Creates the fake internet and returns what most tests use of it: its main address
    /// (a), a second public-looking one (b, [`TestCtx::outside_second`]), the private address
    /// it also answers on (the DNS server of [`TestCtx::dns_config`]) and its namespace.
    pub fn internet(&mut self) -> (Ipv4Addr, Ipv4Addr, Ipv4Addr, PathBuf) {
        let a = self.outside().addr;
        let b = self.outside_second();
        (a, b, self.private_addr(), self.outside_netns())
    }
}

impl Drop for TestCtx {
    fn drop(&mut self) {
        let prefix = self.prefix.clone();
        remove_matching(&|name: &str| name.starts_with(&prefix));
        let _ = std::fs::remove_file(Path::new(RUN_DIR).join(format!("{prefix}.lock")));
    }
}

/// Names with the test prefix that still exist (netns, links, tables).
pub fn leftovers(prefix: &str) -> Vec<String> {
    let mut out: Vec<String> = netns_names()
        .into_iter()
        .filter(|n| n.starts_with(prefix))
        .map(|n| format!("netns {n}"))
        .collect();
    out.extend(
        link_names()
            .into_iter()
            .filter(|n| n.starts_with(prefix))
            .map(|n| format!("link {n}")),
    );
    out.extend(
        table_names()
            .into_iter()
            .filter(|(_, n)| n.starts_with(prefix))
            .map(|(f, n)| format!("table {f} {n}")),
    );
    out
}

/// A TCP listener bound inside `ns` (or on the host with `None`).
pub fn listen(ns: Option<&Path>, addr: SocketAddr) -> TcpListener {
    let bind = move || TcpListener::bind(addr);
    let listener = match ns {
        Some(ns) => netns::run_in(ns, bind).expect("enter netns"),
        None => bind(),
    };
    let listener = listener.unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    listener.set_nonblocking(true).expect("nonblocking");
    listener
}

/// Connects to `target` from inside `ns` (or from the host with `None`).
pub fn connect(
    ns: Option<&Path>,
    target: SocketAddr,
    timeout: Duration,
) -> std::io::Result<TcpStream> {
    let go = move || TcpStream::connect_timeout(&target, timeout);
    match ns {
        Some(ns) => netns::run_in(ns, go).expect("enter netns"),
        None => go(),
    }
}

/// The peer of the next connection accepted within `timeout`.
pub fn accept(listener: &TcpListener, timeout: Duration) -> Option<(TcpStream, SocketAddr)> {
    let deadline = Instant::now() + timeout;
    loop {
        match listener.accept() {
            Ok(pair) => return Some(pair),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

/// Prints the state that explains a failed connectivity check: the test's nftables tables
/// (with counters), routes, and the conntrack table.
pub fn dump_diagnostics() {
    let prefix = CURRENT_PREFIX.with(|p| p.borrow().clone());
    eprintln!("--- diagnostics for {prefix} ---");
    for (family, name) in table_names()
        .into_iter()
        .filter(|(_, n)| n.starts_with(&prefix))
    {
        eprintln!(
            "{}",
            sh("nft", &["list", "table", &family, &name], None).unwrap_or_else(|e| e)
        );
    }
    eprintln!("{}", sh("ip", &["-4", "route"], None).unwrap_or_else(|e| e));
    eprintln!("{}", sh("conntrack", &["-L"], None).unwrap_or_else(|e| e));
    for ns in netns_names().into_iter().filter(|n| n.starts_with(&prefix)) {
        eprintln!(
            "[{ns}] {}",
            sh("ip", &["-n", &ns, "-4", "addr"], None).unwrap_or_else(|e| e)
        );
        eprintln!(
            "[{ns}] {}",
            sh("ip", &["-n", &ns, "neigh"], None).unwrap_or_else(|e| e)
        );
    }
}

/// Asserts a connection works and returns the address the listener saw it from.
pub fn assert_connects(
    ns: Option<&Path>,
    listener: &TcpListener,
    target: SocketAddr,
) -> SocketAddr {
    let stream = connect(ns, target, OPEN).unwrap_or_else(|e| {
        dump_diagnostics();
        panic!("connection to {target} from {ns:?} failed: {e}")
    });
    let Some((_, peer)) = accept(listener, OPEN) else {
        dump_diagnostics();
        panic!("the listener did not see the connection to {target}");
    };
    drop(stream);
    peer
}

/// Asserts a connection fails and that `listener` (if any) saw nothing.
pub fn assert_blocked(ns: Option<&Path>, target: SocketAddr, listener: Option<&TcpListener>) {
    if connect(ns, target, BLOCKED).is_ok() {
        dump_diagnostics();
        panic!("connection to {target} from {ns:?} should fail");
    }
    if let Some(l) = listener {
        assert!(
            accept(l, Duration::ZERO).is_none(),
            "{target} accepted a connection"
        );
    }
}

/// Reads whatever arrives within `timeout` (an empty vec on timeout or EOF).
pub fn read_some(stream: &mut TcpStream, timeout: Duration) -> Vec<u8> {
    stream.set_nonblocking(false).expect("blocking");
    stream.set_read_timeout(Some(timeout)).expect("timeout");
    let mut buf = [0u8; 64];
    match stream.read(&mut buf) {
        Ok(n) => buf[..n].to_vec(),
        Err(_) => Vec::new(),
    }
}

/// A UDP echo server inside a namespace (a stand-in DNS server), stopped on drop so that
/// its socket does not keep the namespace alive.
pub struct UdpEcho {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

pub fn udp_echo(ns: &Path, addr: SocketAddr) -> UdpEcho {
    let socket = netns::run_in(ns, move || UdpSocket::bind(addr))
        .expect("enter netns")
        .unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    socket
        .set_read_timeout(Some(Duration::from_millis(50)))
        .expect("timeout");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while !flag.load(Ordering::Relaxed) {
            if let Ok((n, peer)) = socket.recv_from(&mut buf) {
                let _ = socket.send_to(&buf[..n], peer);
            }
        }
    });
    UdpEcho {
        stop,
        thread: Some(thread),
    }
}

impl Drop for UdpEcho {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sends a datagram from inside `ns` and waits for the echo, resending every 500 ms like a
/// DNS client does (UDP may lose the first packet while neighbours are being resolved).
pub fn udp_roundtrip(ns: &Path, target: SocketAddr, timeout: Duration) -> bool {
    let socket = netns::run_in(ns, || UdpSocket::bind("0.0.0.0:0"))
        .expect("enter netns")
        .expect("bind udp");
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; 16];
    while Instant::now() < deadline {
        if socket.send_to(b"query", target).is_err() {
            // ICMP errors (e.g. a reject) surface on the next send or receive.
            return false;
        }
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(500));
        socket
            .set_read_timeout(Some(wait.max(Duration::from_millis(1))))
            .expect("timeout");
        match socket.recv_from(&mut buf) {
            Ok((5, _)) => return true,
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            _ => return false,
        }
    }
    false
}

/// `ip:port`, the way the tests name their targets.
pub fn sa(ip: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(ip, port))
}

/// A runtime to drive the pool's async API from the (synchronous) tests.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("tokio runtime")
}

/// A runtime and a pool started on `config`.
#[track_caller]
pub fn start_pool(config: NetConfig) -> (tokio::runtime::Runtime, NetPool) {
    let rt = rt();
    let pool = rt.block_on(NetPool::start(config)).expect("start pool");
    (rt, pool)
}

/// A slot from `pool` under `policy`.
#[track_caller]
pub fn acquire(rt: &tokio::runtime::Runtime, pool: &NetPool, policy: &SlotPolicy) -> Slot {
    rt.block_on(pool.acquire(policy)).expect("acquire")
}

/// How long the pool's background work (refill, recycling, removal) may take.
pub const SETTLE: Duration = Duration::from_secs(10);

/// Polls `cond` until it holds; fails the test after `within`.
pub fn wait_for(within: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Slot names (`<prefix>-<n>`) present as network namespaces.
pub fn slot_netns(prefix: &str) -> std::collections::HashSet<String> {
    let dash = format!("{prefix}-");
    netns_names()
        .into_iter()
        .filter(|n| n.starts_with(&dash))
        .collect()
}

/// Slot names present as host links.
pub fn slot_links(prefix: &str) -> std::collections::HashSet<String> {
    let dash = format!("{prefix}-");
    link_names()
        .into_iter()
        .filter(|n| n.starts_with(&dash))
        .collect()
}

/// The pool's no-egress set as `nft` lists it (the set must exist).
pub fn no_egress_set(prefix: &str) -> String {
    sh("nft", &["list", "set", "inet", prefix, "no_egress"], None).expect("list set")
}

/// Whether slot `name` is in the pool's no-egress set.
pub fn egress_blocked(prefix: &str, name: &str) -> bool {
    no_egress_set(prefix).contains(&format!("\"{name}\""))
}

/// Global IPv4 addresses of the host's own interfaces (not test objects): still local, so
/// connecting to them never leaves the machine.
pub fn host_primary_addrs() -> Vec<Ipv4Addr> {
    let out = sh("ip", &["-4", "-o", "addr", "show", "scope", "global"], None).unwrap_or_default();
    out.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let dev = w.nth(1)?;
            if dev.starts_with('w') {
                return None;
            }
            w.nth(1)?.split('/').next()?.parse().ok()
        })
        .collect()
}

/// A fresh directory (`<prefix>-bin` under the temp dir) holding links to `tools` only: a
/// PATH that lacks every other program. The caller removes it.
pub fn bin_with_only(prefix: &str, tools: &[&str]) -> PathBuf {
    let bin = std::env::temp_dir().join(format!("{prefix}-bin"));
    let _ = std::fs::remove_dir_all(&bin);
    std::fs::create_dir_all(&bin).expect("bin dir");
    for tool in tools {
        let path = sh("sh", &["-c", &format!("command -v {tool}")], None)
            .unwrap_or_else(|e| panic!("{tool} not found: {e}"));
        std::os::unix::fs::symlink(path.trim(), bin.join(tool)).expect("symlink");
    }
    bin
}

/// Releases `slots` in order, then shuts `pool` down: how every test ends its pool.
#[track_caller]
pub fn release_and_shut_down(
    rt: &tokio::runtime::Runtime,
    pool: NetPool,
    slots: impl IntoIterator<Item = Slot>,
) {
    for slot in slots {
        rt.block_on(pool.release(slot)).expect("release");
    }
    rt.block_on(pool.shutdown()).expect("shutdown");
}

/// A server crash and restart: `slot`'s sandbox keeps running, `pool` goes away without
/// tearing anything down, and a new pool on `config` adopts the slot from `record` (what the
/// server kept of it).
#[track_caller]
pub fn crash_and_adopt(
    rt: &tokio::runtime::Runtime,
    pool: NetPool,
    slot: Slot,
    record: warren_net::AdoptSlot,
    config: NetConfig,
) -> (NetPool, Slot) {
    std::mem::forget(slot);
    drop(pool);
    let (pool, mut slots) = rt
        .block_on(NetPool::start_adopting(config, vec![record]))
        .expect("restart the pool");
    let slot = slots.remove(0).expect("adopted");
    (pool, slot)
}

/// Removes the pool's host table, as `nft flush ruleset` would, touching no other table.
pub fn delete_host_table(prefix: &str) {
    sh("nft", &["delete", "table", "inet", prefix], None).expect("delete host table");
}

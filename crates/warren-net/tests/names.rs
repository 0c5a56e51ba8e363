//! Rules by name through the pool's resolver, for real: a slot whose policy allows one name
//! gets answers for that name only (REFUSED for others, which never reach the upstream
//! server), reaches the addresses it was given (any port) and nothing else, and cannot get
//! around it with another DNS server, DNS over TCP or an address it knows from elsewhere
//! (what an `/etc/hosts` entry gives). The upstream is a DNS server in the test's own
//! "internet" namespace. Run as root; see tests/common.

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::dns::{parse, query, resolve};
use common::{assert_connects, connect, listen, sa, udp_echo, udp_roundtrip, OPEN};
use hickory_proto::op::ResponseCode;
use warren_net::SlotPolicy;
use warren_runtime::egress::EgressPolicy;
use warren_runtime::flows::{FlowKind, FlowVerdict};

/// The same over TCP.
fn resolve_tcp(
    ns: &std::path::Path,
    server: SocketAddr,
    name: &str,
) -> (ResponseCode, Vec<Ipv4Addr>) {
    let mut s: TcpStream = connect(Some(ns), server, OPEN).expect("DNS over TCP connects");
    s.set_read_timeout(Some(OPEN)).unwrap();
    let q = query(name);
    let mut framed = (q.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&q);
    s.write_all(&framed).unwrap();
    let mut len = [0u8; 2];
    s.read_exact(&mut len).expect("an answer over TCP");
    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
    s.read_exact(&mut buf).unwrap();
    parse(&buf)
}

/// A policy that lets out `allowed.test` (at whatever address it resolves to) and nothing else.
fn only_allowed_test() -> SlotPolicy {
    let names =
        EgressPolicy::from_lists(&["allowed.test".into()], &["0.0.0.0/0".into()], None).unwrap();
    SlotPolicy {
        names: Some(names),
        ..SlotPolicy::deny_all()
    }
}

#[test]
fn only_allowed_names_resolve_and_only_their_answers_are_reachable() {
    let Some(mut ctx) = common::setup() else {
        return;
    };
    let (a, b, dns_ip, outside_ns) = ctx.internet();
    let dns = sa(dns_ip, 53);
    let up = common::dns::serve(
        &outside_ns,
        dns,
        vec![("allowed.test", b), ("other.test", a)],
    );
    let server_a = listen(Some(&outside_ns), sa(a, 8080));
    let server_b = listen(Some(&outside_ns), sa(b, 8080));
    let _echo_b = udp_echo(&outside_ns, sa(b, 5353));
    let config = ctx.dns_config(1);
    let (rt, pool) = common::start_pool(config);

    let policy = only_allowed_test();
    let slot = common::acquire(&rt, &pool, &policy);
    let ns = slot.netns_path();
    assert!(
        slot.internet_access(),
        "a policy with names lets something out"
    );

    // Nothing is reachable before a name was resolved.
    let refused = connect(Some(&ns), sa(b, 8080), OPEN).expect_err("b is not pinned yet");
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);

    // The allowed name resolves; its address is then reachable, on any port and protocol.
    assert_eq!(
        resolve(&ns, dns, "allowed.test"),
        (ResponseCode::NoError, vec![b])
    );
    assert_connects(Some(&ns), &server_b, sa(b, 8080));
    assert!(
        udp_roundtrip(&ns, sa(b, 5353), OPEN),
        "UDP to the pinned address"
    );

    // Another name is refused without the upstream ever hearing of it (no exfiltration by
    // query), and its address, known from elsewhere (/etc/hosts), stays unreachable.
    assert_eq!(resolve(&ns, dns, "other.test").0, ResponseCode::Refused);
    let err = connect(Some(&ns), sa(a, 8080), OPEN).expect_err("a is not pinned");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
    assert!(common::accept(&server_a, Duration::ZERO).is_none());

    // Another DNS server, and DNS over TCP: the same resolver answers, with the same rules.
    assert_eq!(
        resolve(&ns, sa(a, 53), "other.test").0,
        ResponseCode::Refused
    );
    assert_eq!(
        resolve(&ns, sa(a, 53), "allowed.test"),
        (ResponseCode::NoError, vec![b])
    );
    assert_eq!(resolve_tcp(&ns, dns, "other.test").0, ResponseCode::Refused);
    assert_eq!(resolve_tcp(&ns, dns, "allowed.test").1, vec![b]);

    let asked = up.asked.lock().unwrap().clone();
    assert!(
        asked.iter().all(|n| n == "allowed.test"),
        "upstream saw {asked:?}"
    );
    assert!(!asked.is_empty());

    // Released and reused with an open policy: no pins, no redirect.
    rt.block_on(pool.release(slot)).expect("release");
    let open = common::acquire(&rt, &pool, &SlotPolicy::open());
    let ns = open.netns_path();
    assert_eq!(
        resolve(&ns, dns, "other.test"),
        (ResponseCode::NoError, vec![a])
    );
    assert!(up.asked.lock().unwrap().contains(&"other.test".to_string()));
    common::release_and_shut_down(&rt, pool, [open]);
}

#[test]
fn pins_and_the_redirect_survive_a_restart_of_the_pool() {
    let Some(mut ctx) = common::setup() else {
        return;
    };
    let (a, b, dns_ip, outside_ns) = ctx.internet();
    let dns = sa(dns_ip, 53);
    let _up = common::dns::serve(&outside_ns, dns, vec![("allowed.test", b)]);
    let server_b = listen(Some(&outside_ns), sa(b, 8080));
    let config = ctx.dns_config(0);
    let (rt, pool) = common::start_pool(config.clone());
    let policy = only_allowed_test();
    let slot = common::acquire(&rt, &pool, &policy);
    let ns = slot.netns_path();
    assert_eq!(resolve(&ns, dns, "allowed.test").1, vec![b]);
    let mut open = connect(Some(&ns), sa(b, 8080), OPEN).expect("connect to b");
    let (mut peer, _) = common::accept(&server_b, OPEN).expect("accepted");
    let record = warren_net::AdoptSlot::from(&slot);
    let (pool, slot) = common::crash_and_adopt(&rt, pool, slot, record, config);
    // The pin is still there: the open connection carries data, new ones connect.
    open.write_all(b"after").unwrap();
    assert_eq!(common::read_some(&mut peer, OPEN), b"after");
    assert_connects(Some(&ns), &server_b, sa(b, 8080));
    // The redirect leads to the new resolver, which knows the slot's policy.
    assert_eq!(resolve(&ns, dns, "other.test").0, ResponseCode::Refused);
    assert_eq!(resolve(&ns, dns, "allowed.test").1, vec![b]);
    let err = connect(Some(&ns), sa(a, 8080), OPEN).expect_err("a was never pinned");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
    drop((open, peer));
    common::release_and_shut_down(&rt, pool, [slot]);
}

/// A server in the fake internet that answers each connection with `greeting` and records
/// the first bytes it receives.
struct Recorder {
    got: Arc<Mutex<Vec<Vec<u8>>>>,
    stop: Arc<AtomicBool>,
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Recorder {
    fn seen(&self) -> Vec<Vec<u8>> {
        self.got.lock().unwrap().clone()
    }
}

/// `speaks_first`: the greeting goes out on accept (SSH-like), else after the first read.
fn recorder(
    ns: &std::path::Path,
    addr: SocketAddr,
    greeting: &'static [u8],
    speaks_first: bool,
) -> Recorder {
    let listener = listen(Some(ns), addr);
    let got = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let (log, flag) = (got.clone(), stop.clone());
    std::thread::spawn(move || {
        while !flag.load(Ordering::Relaxed) {
            let Some((mut s, _)) = common::accept(&listener, Duration::from_millis(50)) else {
                continue;
            };
            let log = log.clone();
            std::thread::spawn(move || {
                s.set_nonblocking(false).unwrap();
                s.set_read_timeout(Some(OPEN)).unwrap();
                if speaks_first {
                    let _ = s.write_all(greeting);
                }
                let mut buf = [0u8; 4096];
                let n = s.read(&mut buf).unwrap_or(0);
                log.lock().unwrap().push(buf[..n].to_vec());
                if !speaks_first {
                    let _ = s.write_all(greeting);
                }
                // Echo the rest until the client is done.
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    Recorder { got, stop }
}

/// A ClientHello for `name`, as a real TLS client writes it.
fn client_hello(name: &str) -> Vec<u8> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let server = rustls::pki_types::ServerName::try_from(name.to_owned()).unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), server).unwrap();
    let mut out = Vec::new();
    conn.write_tls(&mut out).unwrap();
    out
}

/// Connects from the slot, sends `bytes` and returns what comes back, or the error.
fn exchange(ns: &std::path::Path, to: SocketAddr, bytes: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut s = connect(Some(ns), to, OPEN)?;
    s.set_read_timeout(Some(OPEN)).unwrap();
    s.write_all(bytes)?;
    let mut buf = [0u8; 256];
    let n = s.read(&mut buf)?;
    Ok(buf[..n].to_vec())
}

fn is_reset(r: &std::io::Result<Vec<u8>>) -> bool {
    matches!(r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset)
}

#[test]
fn tcp_by_name_is_decided_by_sni_and_host_and_redialled_by_name() {
    let Some(mut ctx) = common::setup() else {
        return;
    };
    let (a, b, dns_ip, outside_ns) = ctx.internet();
    let dns = sa(dns_ip, 53);
    // `evil.test` lives at a; `allowed.test` at b.
    let _up = common::dns::serve(
        &outside_ns,
        dns,
        vec![("allowed.test", b), ("evil.test", a)],
    );
    let web_a = recorder(
        &outside_ns,
        sa(a, 80),
        b"HTTP/1.1 200 OK\r\n\r\nfrom-a",
        false,
    );
    let web_b = recorder(
        &outside_ns,
        sa(b, 80),
        b"HTTP/1.1 200 OK\r\n\r\nfrom-b",
        false,
    );
    let tls_a = recorder(&outside_ns, sa(a, 443), b"tls-a", false);
    let tls_b = recorder(&outside_ns, sa(b, 443), b"tls-b", false);
    let banner_b = recorder(&outside_ns, sa(b, 2222), b"BANNER-b\r\n", true);
    let config = ctx.dns_config(1);
    let (rt, pool) = common::start_pool(config);
    let policy = only_allowed_test();
    let mut slot = common::acquire(&rt, &pool, &policy);
    pool.set_owner(&slot, "sbx-1");
    let ns = slot.netns_path();
    let get = |host: &str| format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n").into_bytes();

    // An allowed Host at the wrong address (an /etc/hosts entry, a stale cache): re-dialled by
    // name, it reaches the name's own server and nothing at the address it was sent to.
    let got = exchange(&ns, sa(a, 80), &get("allowed.test")).expect("proxied by name");
    assert!(
        got.ends_with(b"from-b"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    assert!(web_a.seen().is_empty(), "a heard {:?}", web_a.seen());
    assert!(web_b.seen()[0].starts_with(b"GET / HTTP/1.1\r\nHost: allowed.test"));

    // A denied Host at an allowed name's address: reset, and the server hears nothing.
    assert_eq!(resolve(&ns, dns, "allowed.test").1, vec![b]);
    let denied = exchange(&ns, sa(b, 80), &get("evil.test"));
    assert!(is_reset(&denied), "{denied:?}");
    assert_eq!(web_b.seen().len(), 1, "b heard the denied request");

    // TLS: the SNI decides in the same way, whatever the address.
    let denied = exchange(&ns, sa(b, 443), &client_hello("evil.test"));
    assert!(is_reset(&denied), "{denied:?}");
    let got = exchange(&ns, sa(a, 443), &client_hello("allowed.test")).expect("proxied");
    assert_eq!(got, b"tls-b");
    assert!(tls_a.seen().is_empty());
    assert_eq!(tls_b.seen().len(), 1);
    assert_eq!(tls_b.seen()[0].first(), Some(&0x16), "a TLS record went on");

    // A protocol whose server speaks first, to a pinned address: passes by address, and the
    // client's first words are still checked when they come.
    let mut ssh = connect(Some(&ns), sa(b, 2222), OPEN).expect("pinned address, other port");
    assert_eq!(common::read_some(&mut ssh, OPEN), b"BANNER-b\r\n");
    ssh.write_all(b"SSH-2.0-client\r\n").unwrap();
    let deadline = std::time::Instant::now() + OPEN;
    while banner_b.seen().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut late = connect(Some(&ns), sa(b, 2222), OPEN).expect("connects");
    assert_eq!(common::read_some(&mut late, OPEN), b"BANNER-b\r\n");
    late.write_all(&get("evil.test")).unwrap();
    let mut buf = [0u8; 16];
    let r = late.read(&mut buf);
    assert!(
        matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "{r:?}"
    );
    // The late connection's server saw nothing from its client (an empty entry, once the
    // server notices the reset: timing decides whether it already has), never the request.
    let seen: Vec<Vec<u8>> = banner_b
        .seen()
        .into_iter()
        .filter(|b| !b.is_empty())
        .collect();
    assert_eq!(seen, vec![b"SSH-2.0-client\r\n".to_vec()]);

    // Every decision is in the owner's flow log.
    let flows = pool.flows("sbx-1");
    let has = |kind: FlowKind, verdict: FlowVerdict, name: &str, via: &str| {
        flows.iter().any(|f| {
            f.kind == kind
                && f.verdict == verdict
                && f.name.as_deref() == Some(name)
                && f.via == via
        })
    };
    assert!(
        has(
            FlowKind::Tcp,
            FlowVerdict::Allowed,
            "allowed.test",
            "http-host"
        ),
        "{flows:#?}"
    );
    assert!(
        has(FlowKind::Tcp, FlowVerdict::Denied, "evil.test", "http-host"),
        "{flows:#?}"
    );
    assert!(
        has(FlowKind::Tcp, FlowVerdict::Denied, "evil.test", "tls-sni"),
        "{flows:#?}"
    );
    assert!(
        has(
            FlowKind::Tcp,
            FlowVerdict::Allowed,
            "allowed.test",
            "tls-sni"
        ),
        "{flows:#?}"
    );
    assert!(
        has(FlowKind::Dns, FlowVerdict::Allowed, "allowed.test", "dns"),
        "{flows:#?}"
    );
    let by_address = flows
        .iter()
        .find(|f| f.via == "address")
        .expect("the server-first connection");
    assert_eq!(
        by_address.destination.as_deref(),
        Some(&*sa(b, 2222).to_string())
    );
    assert!(pool.flows("someone-else").is_empty());

    // A new policy cuts proxied connections it no longer allows.
    let mut open = connect(Some(&ns), sa(b, 2222), OPEN).expect("connects");
    assert_eq!(common::read_some(&mut open, OPEN), b"BANNER-b\r\n");
    rt.block_on(pool.set_policy(&mut slot, &SlotPolicy::deny_all()))
        .expect("new policy");
    let _ = open.write_all(b"after");
    let r = open.read(&mut buf);
    assert!(matches!(&r, Ok(0) | Err(_)), "{r:?}");

    common::release_and_shut_down(&rt, pool, [slot]);
}

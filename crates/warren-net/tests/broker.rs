//! Secrets brokered at egress, for real: a slot whose policy has header rules (`network.rules`)
//! sends plain HTTP and HTTPS requests to servers in the test's "internet" namespace; the
//! servers record the heads they receive. The rule's host gets the secret's value on every
//! request (the value of the moment: a rotation applies to the next request), over TLS too
//! (the proxy verifies the host and shows the sandbox a leaf of the egress CA); other hosts,
//! an address the sandbox made up for the rule's name, and a host whose certificate does not
//! verify get nothing. Run as root; see tests/common.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{connect, listen, sa, OPEN};
use rustls::pki_types::CertificateDer;
use warren_net::{Broker, NetConfig, NetPool, SecretFuture, SecretSource, SlotPolicy};
use warren_runtime::egress::EgressPolicy;
use warren_runtime::transforms::{HeaderRules, HostRule};

/// Secrets by (sandbox, name), changeable while the test runs.
#[derive(Default)]
struct Secrets(Mutex<HashMap<(String, String), String>>);

impl Secrets {
    fn set(&self, sandbox: &str, name: &str, value: &str) {
        self.0
            .lock()
            .unwrap()
            .insert((sandbox.into(), name.into()), value.into());
    }
}

impl SecretSource for Secrets {
    fn secret<'a>(&'a self, sandbox: &'a str, name: &'a str) -> SecretFuture<'a> {
        let v = self
            .0
            .lock()
            .unwrap()
            .get(&(sandbox.to_owned(), name.to_owned()))
            .cloned();
        Box::pin(async move { v })
    }
}

/// An HTTP/1.1 server (plain, or TLS with `tls`) in the outside namespace that records every
/// request head and answers each with `body`, keeping the connection open.
struct Web {
    heads: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
}

impl Drop for Web {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Web {
    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

fn web(
    ns: &std::path::Path,
    addr: SocketAddr,
    body: &'static str,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> Web {
    let listener = listen(Some(ns), addr);
    let heads = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let (log, flag) = (heads.clone(), stop.clone());
    std::thread::spawn(move || {
        while !flag.load(Ordering::Relaxed) {
            let Some((s, _)) = common::accept(&listener, Duration::from_millis(50)) else {
                continue;
            };
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(OPEN)).unwrap();
            let (log, tls) = (log.clone(), tls.clone());
            std::thread::spawn(move || match tls {
                Some(config) => {
                    let Ok(conn) = rustls::ServerConnection::new(config) else {
                        return;
                    };
                    serve_http(rustls::StreamOwned::new(conn, s), &log, body);
                }
                None => serve_http(s, &log, body),
            });
        }
    });
    Web { heads, stop }
}

fn serve_http<S: Read + Write>(stream: S, log: &Mutex<Vec<String>>, body: &str) {
    let mut reader = BufReader::new(stream);
    loop {
        let mut head = String::new();
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            head.push_str(&line);
            if line == "\r\n" {
                break;
            }
        }
        log.lock().unwrap().push(head);
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if reader.get_mut().write_all(answer.as_bytes()).is_err() {
            return;
        }
        let _ = reader.get_mut().flush();
    }
}

/// Sends `requests` one after another on one connection and returns the answers' bodies
/// (each answer has a `content-length`) or the status line of a non-200 answer.
fn ask<S: Read + Write>(
    stream: S,
    host: &str,
    requests: usize,
    between: impl Fn(usize),
) -> Vec<String> {
    let heads = (0..requests)
        .map(|i| {
            format!(
                "GET /{i} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer ${{e2b.secrets.key}}\r\n\r\n"
            )
        })
        .collect();
    send(stream, heads, between)
}

/// Sends each of `heads` (whole requests without bodies) on one connection, reading the answer
/// of each before the next: its body, the status line of a non-200 answer, or `closed` (and
/// nothing more) when the connection ended instead.
fn send<S: Read + Write>(stream: S, heads: Vec<String>, between: impl Fn(usize)) -> Vec<String> {
    let mut reader = BufReader::new(stream);
    let mut out = Vec::new();
    for (i, req) in heads.iter().enumerate() {
        between(i);
        if reader.get_mut().write_all(req.as_bytes()).is_err() {
            out.push("write failed".into());
            break;
        }
        let mut status = String::new();
        if reader.read_line(&mut status).unwrap_or(0) == 0 {
            out.push("closed".into());
            break;
        }
        let mut len = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0u8; len];
        reader.read_exact(&mut body).unwrap();
        if status.contains(" 200 ") {
            out.push(String::from_utf8(body).unwrap());
        } else {
            out.push(status.trim().to_string());
        }
    }
    out
}

/// A connection from the slot to `to` whose reads give up after [`OPEN`].
fn dial(ns: &std::path::Path, to: SocketAddr) -> TcpStream {
    let tcp = connect(Some(ns), to, OPEN).expect("connects");
    tcp.set_read_timeout(Some(OPEN)).unwrap();
    tcp
}

fn tls_client(
    ca_pem: &str,
    name: &str,
    tcp: TcpStream,
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let server = rustls::pki_types::ServerName::try_from(name.to_owned()).unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), server).unwrap();
    rustls::StreamOwned::new(conn, tcp)
}

/// Rules setting `Authorization` to the value given, for plain HTTP too where the scheme given
/// is `http`.
fn rules(triples: &[(&str, &str, Option<&str>)]) -> HeaderRules {
    let raw: BTreeMap<String, Vec<HostRule>> = triples
        .iter()
        .map(|(host, value, scheme)| {
            let mut rule = serde_json::json!({"transform": {"headers": {"Authorization": value}}});
            if let Some(scheme) = scheme {
                rule["scheme"] = serde_json::json!(scheme);
            }
            (
                host.to_string(),
                vec![serde_json::from_value(rule).unwrap()],
            )
        })
        .collect();
    HeaderRules::parse(raw).unwrap()
}

fn auth_of(head: &str) -> Option<String> {
    head.lines()
        .find_map(|l| l.strip_prefix("Authorization: ").map(str::to_owned))
}

/// A CA created in `dir` (its root, which the proxy may be told to trust) and a server
/// configuration with a leaf of it for `names`: the certificates of hosts in the fake internet.
fn host_tls(
    dir: &std::path::Path,
    names: &[&str],
) -> (CertificateDer<'static>, Arc<rustls::ServerConfig>) {
    let (ca, _) = warren_tls::LocalCa::load_or_create(dir, "test").unwrap();
    let root = ca.cert_der().clone();
    let names = names.iter().map(|n| n.to_string()).collect();
    let certs = warren_tls::ServerCerts::issued(ca, names).unwrap();
    (root, warren_tls::server_config(Arc::new(certs)).unwrap())
}

/// A broker with its own egress CA (under `dir`) that trusts `upstream_root` and takes secret
/// values from `secrets`.
fn broker(
    dir: &std::path::Path,
    upstream_root: CertificateDer<'static>,
    secrets: Arc<Secrets>,
) -> Arc<Broker> {
    let (egress_ca, _) =
        warren_tls::LocalCa::load_or_create_unconstrained(&dir.join("egress")).unwrap();
    Arc::new(
        Broker::new(
            Arc::new(warren_tls::EgressCerts::new(egress_ca)),
            vec![upstream_root],
            secrets,
        )
        .unwrap(),
    )
}

/// A pool that resolves through the test's DNS server and brokers through `broker`, and a slot
/// of it owned by `owner` whose egress is open but for the header rules `rules`.
fn brokered_slot(
    ctx: &common::TestCtx,
    broker: Arc<Broker>,
    rules: &[(&str, &str, Option<&str>)],
    owner: &str,
) -> (tokio::runtime::Runtime, NetPool, warren_net::Slot) {
    let config = NetConfig {
        broker: Some(broker),
        ..ctx.dns_config(1)
    };
    let (rt, pool) = common::start_pool(config);
    let policy = SlotPolicy {
        names: Some(EgressPolicy::default().with_rules(self::rules(rules))),
        ..SlotPolicy::open()
    };
    let slot = common::acquire(&rt, &pool, &policy);
    pool.set_owner(&slot, owner);
    (rt, pool, slot)
}

#[test]
fn rule_hosts_get_the_secret_over_http_and_https_and_nobody_else_does() {
    let Some(mut ctx) = common::setup() else {
        return;
    };
    let (a, b, dns_ip, outside_ns) = ctx.internet();
    let _dns = common::dns::serve(
        &outside_ns,
        sa(dns_ip, 53),
        vec![
            ("api.test", b),
            ("other.test", a),
            ("untrusted.test", a),
            ("gone.test", b),
        ],
    );
    // The hosts' own certificates: api.test from a CA the proxy is told to trust,
    // untrusted.test from one it is not.
    let dir = tempfile::tempdir().unwrap();
    let (public_root, api_tls) = host_tls(&dir.path().join("public"), &["api.test"]);
    let (_, rogue_tls) = host_tls(&dir.path().join("rogue"), &["untrusted.test"]);
    let api_http = web(&outside_ns, sa(b, 80), "api", None);
    let api_https = web(&outside_ns, sa(b, 443), "api-tls", Some(api_tls));
    let other_http = web(&outside_ns, sa(a, 80), "other", None);
    let rogue_https = web(&outside_ns, sa(a, 443), "rogue", Some(rogue_tls));

    let secrets = Arc::new(Secrets::default());
    secrets.set("sbx-1", "key", "s3cret-1");
    let broker = broker(dir.path(), public_root, secrets.clone());
    let ca_pem = broker.ca_pem().to_owned();
    // Header rules only: egress stays open, the rules change requests and nothing else.
    let (rt, pool, slot) = brokered_slot(
        &ctx,
        broker,
        &[
            ("api.test", "Bearer ${e2b.secrets.key}", Some("http")),
            ("untrusted.test", "Bearer ${e2b.secrets.key}", None),
            ("gone.test", "Bearer ${e2b.secrets.nothing}", Some("http")),
        ],
        "sbx-1",
    );
    let ns = slot.netns_path();

    // Plain HTTP: every request on a kept-alive connection gets the value of the moment.
    let tcp = dial(&ns, sa(b, 80));
    let got = ask(tcp, "api.test", 3, |i| {
        if i == 2 {
            secrets.set("sbx-1", "key", "s3cret-2");
        }
    });
    assert_eq!(got, vec!["api", "api", "api"]);
    let auths: Vec<_> = api_http.heads().iter().map(|h| auth_of(h)).collect();
    assert_eq!(
        auths,
        vec![
            Some("Bearer s3cret-1".to_string()),
            Some("Bearer s3cret-1".to_string()),
            Some("Bearer s3cret-2".to_string())
        ]
    );

    // The rule's name at an address the sandbox chose: dialled by name, so only api.test's
    // own server hears it.
    let tcp = dial(&ns, sa(a, 80));
    assert_eq!(ask(tcp, "api.test", 1, |_| ()), vec!["api"]);
    assert_eq!(api_http.heads().len(), 4);

    // Another host gets the request as the sandbox wrote it: the placeholder, no secret.
    let tcp = dial(&ns, sa(a, 80));
    assert_eq!(ask(tcp, "other.test", 1, |_| ()), vec!["other"]);
    let heads = other_http.heads();
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert_eq!(
        auth_of(&heads[0]).as_deref(),
        Some("Bearer ${e2b.secrets.key}")
    );

    // HTTPS: the sandbox sees a leaf of the egress CA for api.test; the host gets the value.
    let tcp = dial(&ns, sa(b, 443));
    let got = ask(tls_client(&ca_pem, "api.test", tcp), "api.test", 2, |_| ());
    assert_eq!(got, vec!["api-tls", "api-tls"]);
    let auths: Vec<_> = api_https.heads().iter().map(|h| auth_of(h)).collect();
    assert_eq!(auths, vec![Some("Bearer s3cret-2".to_string()); 2]);

    // A host whose certificate does not verify: the sandbox's handshake fails and the
    // host never gets a request.
    let tcp = dial(&ns, sa(a, 443));
    let got = ask(
        tls_client(&ca_pem, "untrusted.test", tcp),
        "untrusted.test",
        1,
        |_| (),
    );
    assert!(
        got == vec!["write failed"] || got == vec!["closed"],
        "{got:?}"
    );
    assert!(rogue_https.heads().is_empty(), "{:?}", rogue_https.heads());

    // A secret that does not exist: 502, and nothing reaches the host.
    let before = api_http.heads().len();
    let tcp = dial(&ns, sa(b, 80));
    let got = ask(tcp, "gone.test", 1, |_| ());
    assert_eq!(got, vec!["HTTP/1.1 502 Bad Gateway"]);
    assert_eq!(api_http.heads().len(), before);

    // The flow log says which connections had headers set.
    let flows = pool.flows("sbx-1");
    assert!(
        flows.iter().any(|f| f.name.as_deref() == Some("api.test")
            && f.reason.as_deref() == Some("headers set by a rule")),
        "{flows:#?}"
    );
    assert!(
        flows
            .iter()
            .any(|f| f.name.as_deref() == Some("untrusted.test")
                && f.reason
                    .as_deref()
                    .is_some_and(|r| r.contains("upstream TLS"))),
        "{flows:#?}"
    );
    rt.block_on(pool.release(slot)).unwrap();
}

/// A slot brokering `api.test` (plain HTTP allowed: `"scheme": "http"`) and `tls.test` (the
/// default, TLS only), both at one address whose servers record what they get.
struct Scoped {
    http: Web,
    https: Web,
    ca_pem: String,
    b: Ipv4Addr,
    ns: std::path::PathBuf,
    slot: warren_net::Slot,
    pool: NetPool,
    rt: tokio::runtime::Runtime,
    _dns: common::dns::Upstream,
    _dir: tempfile::TempDir,
    _ctx: common::TestCtx,
}

const SECRET: &str = "Bearer s3cret";
const PLACEHOLDER: &str = "Bearer ${e2b.secrets.key}";

fn scoped() -> Option<Scoped> {
    let mut ctx = common::setup()?;
    let (_, b, dns_ip, outside_ns) = ctx.internet();
    let dns = common::dns::serve(
        &outside_ns,
        sa(dns_ip, 53),
        vec![("api.test", b), ("tls.test", b), ("evil.test", b)],
    );
    let dir = tempfile::tempdir().unwrap();
    let (public_root, server_tls) = host_tls(&dir.path().join("public"), &["api.test", "tls.test"]);
    let http = web(&outside_ns, sa(b, 80), "plain", None);
    let https = web(&outside_ns, sa(b, 443), "tls", Some(server_tls));
    let secrets = Arc::new(Secrets::default());
    secrets.set("sbx-2", "key", "s3cret");
    let broker = broker(dir.path(), public_root, secrets);
    let ca_pem = broker.ca_pem().to_owned();
    let (rt, pool, slot) = brokered_slot(
        &ctx,
        broker,
        &[
            ("api.test", PLACEHOLDER, Some("http")),
            ("tls.test", PLACEHOLDER, None),
        ],
        "sbx-2",
    );
    let ns = slot.netns_path();
    Some(Scoped {
        http,
        https,
        ca_pem,
        b,
        ns,
        slot,
        pool,
        rt,
        _dns: dns,
        _dir: dir,
        _ctx: ctx,
    })
}

impl Scoped {
    fn plain(&self) -> TcpStream {
        dial(&self.ns, sa(self.b, 80))
    }

    fn tls(&self, name: &str) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
        tls_client(&self.ca_pem, name, dial(&self.ns, sa(self.b, 443)))
    }

    /// Every recorded head that carries the value names the rule's host in its `Host`.
    fn finish(self) {
        for head in self.http.heads().iter().chain(self.https.heads().iter()) {
            if head.contains("s3cret") {
                let host = head
                    .lines()
                    .find_map(|l| l.strip_prefix("Host: "))
                    .map(|h| h.split(':').next().unwrap_or(h));
                assert!(matches!(host, Some("api.test" | "tls.test")), "{head}");
            }
        }
        self.rt.block_on(self.pool.release(self.slot)).unwrap();
    }
}

/// A GET with the placeholder as its `Authorization`, and `extra` header lines.
fn get(target: &str, host: &str, extra: &str) -> String {
    format!("GET {target} HTTP/1.1\r\nHost: {host}\r\n{extra}Authorization: {PLACEHOLDER}\r\n\r\n")
}

fn secret() -> Option<String> {
    Some(SECRET.to_string())
}

fn placeholder() -> Option<String> {
    Some(PLACEHOLDER.to_string())
}

#[test]
fn plain_http_a_second_request_for_another_host_ends_the_connection() {
    let Some(t) = scoped() else {
        return;
    };
    let requests = vec![get("/1", "api.test", ""), get("/2", "evil.test", "")];
    assert_eq!(send(t.plain(), requests, |_| ()), vec!["plain", "closed"]);
    let heads = t.http.heads();
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert_eq!(auth_of(&heads[0]), secret());
    // The flow is recorded once the proxy has reset both sides, so possibly after the client
    // saw its connection close.
    let refused = |flows: &[warren_runtime::flows::Flow]| {
        flows.iter().any(|f| {
            f.name.as_deref() == Some("api.test")
                && f.reason
                    .as_deref()
                    .is_some_and(|r| r.contains("another host"))
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut flows = t.pool.flows("sbx-2");
    while !refused(&flows) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
        flows = t.pool.flows("sbx-2");
    }
    assert!(refused(&flows), "{flows:#?}");
    t.finish();
}

#[test]
fn tls_a_second_request_for_another_host_ends_the_connection() {
    let Some(t) = scoped() else {
        return;
    };
    let requests = vec![get("/1", "api.test", ""), get("/2", "evil.test", "")];
    assert_eq!(
        send(t.tls("api.test"), requests, |_| ()),
        vec!["tls", "closed"]
    );
    let heads = t.https.heads();
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert_eq!(auth_of(&heads[0]), secret());
    t.finish();
}

#[test]
fn tls_a_request_naming_another_host_than_the_sni_is_refused() {
    let Some(t) = scoped() else {
        return;
    };
    for req in [
        get("/", "evil.test", ""),
        get("https://evil.test/", "api.test", ""),
        get("https://evil.test/", "evil.test", ""),
        get("/", "api.test:8443", ""),
    ] {
        assert_eq!(
            send(t.tls("api.test"), vec![req.clone()], |_| ()),
            vec!["closed"],
            "{req}"
        );
    }
    assert!(t.https.heads().is_empty(), "{:?}", t.https.heads());
    t.finish();
}

#[test]
fn plain_http_without_the_opt_in_passes_without_the_secret() {
    let Some(t) = scoped() else {
        return;
    };
    let got = send(t.plain(), vec![get("/", "tls.test", "")], |_| ());
    assert_eq!(got, vec!["plain"]);
    assert_eq!(auth_of(&t.http.heads()[0]), placeholder());
    // The same rule over TLS is brokered.
    let got = send(t.tls("tls.test"), vec![get("/", "tls.test", "")], |_| ());
    assert_eq!(got, vec!["tls"]);
    assert_eq!(auth_of(&t.https.heads()[0]), secret());
    t.finish();
}

#[test]
fn plain_http_with_the_opt_in_gets_the_secret() {
    let Some(t) = scoped() else {
        return;
    };
    let requests = vec![get("/1", "api.test", ""), get("/2", "api.test:80", "")];
    assert_eq!(send(t.plain(), requests, |_| ()), vec!["plain", "plain"]);
    let auths: Vec<_> = t.http.heads().iter().map(|h| auth_of(h)).collect();
    assert_eq!(auths, vec![secret(), secret()]);
    t.finish();
}

#[test]
fn connect_requests_never_get_the_secret() {
    let Some(t) = scoped() else {
        return;
    };
    let to_self = format!(
        "CONNECT api.test:80 HTTP/1.1\r\nHost: api.test:80\r\nAuthorization: {PLACEHOLDER}\r\n\r\n"
    );
    assert_eq!(send(t.plain(), vec![to_self], |_| ()), vec!["plain"]);
    let heads = t.http.heads();
    assert!(heads[0].starts_with("CONNECT "), "{heads:?}");
    assert_eq!(auth_of(&heads[0]), placeholder());
    // A CONNECT to another host on the rule host's connection is refused.
    let elsewhere = format!(
        "CONNECT evil.test:443 HTTP/1.1\r\nHost: api.test\r\nAuthorization: {PLACEHOLDER}\r\n\r\n"
    );
    assert_eq!(send(t.plain(), vec![elsewhere], |_| ()), vec!["closed"]);
    assert_eq!(t.http.heads().len(), 1, "{:?}", t.http.heads());
    t.finish();
}

#[test]
fn upgrade_requests_never_get_the_secret() {
    let Some(t) = scoped() else {
        return;
    };
    let upgrade = "Connection: Upgrade\r\nUpgrade: websocket\r\n";
    let got = send(t.plain(), vec![get("/ws", "api.test", upgrade)], |_| ());
    assert_eq!(got, vec!["plain"]);
    let got = send(
        t.tls("api.test"),
        vec![get("/ws", "api.test", upgrade)],
        |_| (),
    );
    assert_eq!(got, vec!["tls"]);
    assert_eq!(auth_of(&t.http.heads()[0]), placeholder());
    assert_eq!(auth_of(&t.https.heads()[0]), placeholder());
    t.finish();
}

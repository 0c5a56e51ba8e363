//! Where pulls may connect: registries, their redirects and token realms on addresses the
//! operator did not allow are refused with an error that names them, and are never contacted.
//! Everything runs on loopback: stand-in registries written here (plain HTTP or TLS with a
//! test certificate) and listeners that only count the connections they get.

use std::io::{BufRead as _, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};

use warren_oci::{Credentials, Mirror, PullError, PullOptions, Puller};

/// A loopback port that must never be contacted: counts connections without answering.
struct Untouched(TcpListener);

impl Untouched {
    fn new() -> Untouched {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        l.set_nonblocking(true).unwrap();
        Untouched(l)
    }

    fn port(&self) -> u16 {
        self.0.local_addr().unwrap().port()
    }

    /// Connections made so far (they sit in the backlog once the client's connect returned).
    fn connections(&self) -> usize {
        std::iter::from_fn(|| self.0.accept().ok()).count()
    }
}

/// A stand-in registry: answers each request with `answer(request line)` on its own
/// connection, over TLS when given a server config; keeps the request lines.
struct Fake {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Fake {
    fn start(
        tls: Option<Arc<rustls::ServerConfig>>,
        answer: impl Fn(&str) -> String + Send + Sync + 'static,
    ) -> Fake {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (log, answer) = (requests.clone(), Arc::new(answer));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (log, answer, tls) = (log.clone(), answer.clone(), tls.clone());
                std::thread::spawn(move || match tls {
                    Some(config) => {
                        let conn = rustls::ServerConnection::new(config).unwrap();
                        serve(rustls::StreamOwned::new(conn, stream), &log, &*answer);
                    }
                    None => serve(stream, &log, &*answer),
                });
            }
        });
        Fake { addr, requests }
    }

    fn host(&self) -> String {
        self.addr.to_string()
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

fn serve(mut stream: impl Read + Write, log: &Mutex<Vec<String>>, answer: &dyn Fn(&str) -> String) {
    let mut reader = BufReader::new(&mut stream);
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
            break;
        }
    }
    log.lock().unwrap().push(line.trim().to_string());
    let response = answer(line.trim());
    let _ = stream.write_all(response.as_bytes());
    let _ = stream.flush();
}

fn respond(status: &str, headers: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
}

/// `/v2/` says "no auth needed"; a manifest request is redirected to `to`.
fn redirecting(to: String) -> impl Fn(&str) -> String + Send + Sync + 'static {
    move |line: &str| {
        if line.starts_with("GET /v2/ ") {
            respond("200 OK", "", "{}")
        } else {
            respond("302 Found", &format!("Location: {to}\r\n"), "")
        }
    }
}

/// `/v2/` answers 200 and everything else "manifest unknown": reaching it gives NotFound.
fn empty_registry() -> impl Fn(&str) -> String + Send + Sync + 'static {
    |line: &str| {
        if line.starts_with("GET /v2/ ") {
            respond("200 OK", "", "{}")
        } else {
            respond(
                "404 Not Found",
                "",
                r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#,
            )
        }
    }
}

/// A TLS server config for 127.0.0.1 and the PEM file of its certificate (the client's CA).
fn tls(dir: &std::path::Path) -> (Arc<rustls::ServerConfig>, std::path::PathBuf) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
    let pem = dir.join("ca.pem");
    std::fs::write(&pem, cert.cert.pem()).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).unwrap();
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .unwrap();
    (Arc::new(config), pem)
}

async fn pull(opts: PullOptions, reference: &str) -> Result<warren_oci::PulledImage, PullError> {
    Puller::new(opts)
        .unwrap()
        .pull(reference, &Credentials::Anonymous, &|_| {})
        .await
}

/// The error a template author sees for a refused `host:port`, with the reason's words.
fn assert_not_allowed(err: &PullError, target: &str, why: &str) {
    let text = err.to_string();
    assert!(
        matches!(err, PullError::NotAllowed { address, .. } if address == target),
        "{err:?}"
    );
    assert!(
        text.starts_with(&format!("registry address {target} is not allowed: "))
            && text.contains(why),
        "{text}"
    );
}

#[tokio::test]
async fn a_loopback_registry_the_operator_did_not_name_is_refused_untouched() {
    let target = Untouched::new();
    let cache = tempfile::tempdir().unwrap();
    let opts = PullOptions::new(cache.path());
    let host = format!("127.0.0.1:{}", target.port());
    let err = pull(opts, &format!("{host}/x:1")).await.unwrap_err();
    assert_not_allowed(&err, &host, "127.0.0.1 is loopback (127.0.0.0/8)");
    assert!(err.to_string().contains("--registry-allow"), "{err}");
    assert_eq!(target.connections(), 0);
}

#[tokio::test]
async fn registries_the_operator_named_are_reached_at_any_address() {
    let reg = Fake::start(None, empty_registry());
    let cache = tempfile::tempdir().unwrap();
    // Named as plain HTTP.
    let mut opts = PullOptions::new(cache.path());
    opts.insecure = vec![reg.host()];
    let err = pull(opts, &format!("{}/x:1", reg.host()))
        .await
        .unwrap_err();
    assert!(matches!(err, PullError::NotFound { .. }), "{err:?}");
    // As a mirror.
    let mut opts = PullOptions::new(cache.path());
    opts.mirrors = vec![format!("docker.io=http://{}", reg.host())
        .parse::<Mirror>()
        .unwrap()];
    let err = pull(opts, "alpine:1").await.unwrap_err();
    assert!(matches!(err, PullError::NotFound { .. }), "{err:?}");
    assert!(reg
        .requests()
        .iter()
        .any(|r| r.contains("/v2/library/alpine/manifests/1")));

    // Over TLS, allowed by host:port or by range.
    let dir = tempfile::tempdir().unwrap();
    let (config, ca) = tls(dir.path());
    let secure = Fake::start(Some(config), empty_registry());
    for allow in [
        secure.host(),
        "127.0.0.0/8".to_string(),
        "::ffff:127.0.0.1/128".into(),
    ] {
        let mut opts = PullOptions::new(cache.path());
        opts.ca_files = vec![ca.clone()];
        opts.allow = vec![allow.parse().unwrap()];
        let err = pull(opts, &format!("{}/x:1", secure.host()))
            .await
            .unwrap_err();
        if allow.starts_with("::ffff") {
            // A range of IPv6 addresses does not hold the IPv4 registry itself.
            assert_not_allowed(&err, &secure.host(), "loopback");
        } else {
            assert!(
                matches!(err, PullError::NotFound { .. }),
                "{allow}: {err:?}"
            );
        }
    }
}

#[tokio::test]
async fn a_redirect_to_a_port_the_operator_did_not_name_is_refused_untouched() {
    let target = Untouched::new();
    let elsewhere = format!("127.0.0.1:{}", target.port());
    let cache = tempfile::tempdir().unwrap();
    for to in [
        format!("http://{elsewhere}/m"),
        format!("https://{elsewhere}/m"),
    ] {
        let reg = Fake::start(None, redirecting(to.clone()));
        let mut opts = PullOptions::new(cache.path());
        opts.insecure = vec![reg.host()];
        let err = pull(opts, &format!("{}/x:1", reg.host()))
            .await
            .unwrap_err();
        assert_not_allowed(&err, &elsewhere, "loopback");
        assert!(
            reg.requests().iter().any(|r| r.contains("/manifests/1")),
            "the registry itself was asked"
        );
    }
    assert_eq!(target.connections(), 0);
}

#[tokio::test]
async fn an_https_registry_redirecting_to_plain_http_is_refused() {
    let target = Untouched::new();
    let elsewhere = format!("127.0.0.1:{}", target.port());
    let dir = tempfile::tempdir().unwrap();
    let (config, ca) = tls(dir.path());
    let reg = Fake::start(Some(config), redirecting(format!("http://{elsewhere}/m")));
    let cache = tempfile::tempdir().unwrap();
    let mut opts = PullOptions::new(cache.path());
    opts.ca_files = vec![ca];
    // Every loopback address is allowed: what is refused is plain HTTP.
    opts.allow = vec!["127.0.0.0/8".parse().unwrap()];
    let err = pull(opts, &format!("{}/x:1", reg.host()))
        .await
        .unwrap_err();
    assert_not_allowed(&err, &elsewhere, "plain HTTP");
    assert!(reg.requests().iter().any(|r| r.contains("/manifests/1")));
    assert_eq!(target.connections(), 0);
}

#[tokio::test]
async fn a_token_realm_on_an_address_not_allowed_gets_no_request() {
    let target = Untouched::new();
    let realm_host = format!("127.0.0.1:{}", target.port());
    let cache = tempfile::tempdir().unwrap();
    for scheme in ["http", "https"] {
        let challenge = format!(
            "WWW-Authenticate: Bearer realm=\"{scheme}://{realm_host}/latest/meta-data/token\",\
             service=\"x\"\r\n"
        );
        let reg = Fake::start(None, move |_| {
            respond(
                "401 Unauthorized",
                &challenge,
                r#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#,
            )
        });
        let mut opts = PullOptions::new(cache.path());
        opts.insecure = vec![reg.host()];
        let creds = Credentials::Basic {
            username: "u".into(),
            password: "p".into(),
        };
        let err = Puller::new(opts)
            .unwrap()
            .pull(&format!("{}/x:1", reg.host()), &creds, &|_| {})
            .await
            .unwrap_err();
        assert_not_allowed(&err, &realm_host, "loopback");
    }
    assert_eq!(target.connections(), 0);
}

#[test]
fn allow_entries_that_are_not_ranges_or_hosts_are_refused() {
    let err = "http://reg:5000"
        .parse::<warren_oci::RegistryAllow>()
        .unwrap_err();
    assert!(err.contains("HOST[:PORT]"), "{err}");
}

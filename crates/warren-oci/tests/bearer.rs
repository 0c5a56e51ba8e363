//! Bearer-token auth, as Docker Hub, GHCR and most hosted registries do it: the real
//! `docker-registry` configured with `auth: token`, and a token service on loopback (written
//! here, since Debian ships none) that checks Basic credentials and issues ES256 JWTs the
//! registry verifies against the service's certificate.

mod common;

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use common::*;
use oci_client::secrets::RegistryAuth;
use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use warren_oci::{Credentials, PullError, PullOptions, Puller};

const USER: &str = "bob";
const PASSWORD: &str = "token-pass";
const SERVICE: &str = "warren-test-registry";
const ISSUER: &str = "warren-test-issuer";

/// The token service: a thread answering `GET /token?scope=...` on a loopback port.
fn token_service(key_der: Vec<u8>, cert_der: Vec<u8>) -> SocketAddr {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let rng = ring::rand::SystemRandom::new();
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &key_der, &rng)
            .expect("the certificate's P-256 key");
        let want = format!("basic {}", STANDARD.encode(format!("{USER}:{PASSWORD}")));
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            let _ = reader.read_line(&mut request_line);
            let mut authorized = false;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                let lower = line.trim().to_ascii_lowercase();
                if let Some(v) = lower.strip_prefix("authorization:") {
                    // Base64 is case-sensitive: compare the original text.
                    let original = line.trim()["authorization:".len()..].trim();
                    authorized = v.trim().starts_with("basic ") && original[6..] == want[6..];
                }
            }
            let (status, body) = if authorized {
                let scope = request_line
                    .split(['?', '&', ' '])
                    .find_map(|p| p.strip_prefix("scope="))
                    .map(|s| {
                        s.replace("%3A", ":")
                            .replace("%2F", "/")
                            .replace("%2C", ",")
                    })
                    .unwrap_or_default();
                let token = jwt(&key, &rng, &cert_der, &scope);
                (
                    "200 OK",
                    format!(r#"{{"token":"{token}","expires_in":300}}"#),
                )
            } else {
                (
                    "401 Unauthorized",
                    r#"{"details":"incorrect username or password"}"#.to_string(),
                )
            };
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

/// A JWT granting `scope` (`repository:NAME:ACTIONS`).
fn jwt(key: &EcdsaKeyPair, rng: &ring::rand::SystemRandom, cert: &[u8], scope: &str) -> String {
    let mut parts = scope.splitn(3, ':');
    let (kind, name, actions) = (
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let header = serde_json::json!({"typ": "JWT", "alg": "ES256", "x5c": [STANDARD.encode(cert)]});
    let claims = serde_json::json!({
        "iss": ISSUER, "sub": USER, "aud": SERVICE,
        "exp": now + 300, "nbf": now - 60, "iat": now - 60, "jti": format!("{now}-{name}"),
        "access": [{"type": kind, "name": name, "actions": actions.split(',').collect::<Vec<_>>()}]
    });
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let sig = key.sign(rng, input.as_bytes()).unwrap();
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
}

/// `docker-registry` with token auth; killed (by PID) on drop.
struct TokenRegistry {
    child: Child,
    addr: SocketAddr,
    tokens: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for TokenRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start() -> TokenRegistry {
    let dir = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["warren-test-token".into()]).unwrap();
    let bundle = dir.path().join("token.pem");
    std::fs::write(&bundle, cert.cert.pem()).unwrap();
    let tokens = token_service(cert.signing_key.serialize_der(), cert.cert.der().to_vec());
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let config = format!(
        "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
         http:\n  addr: {addr}\n  secret: test-only\nauth:\n  token:\n    realm: http://{tokens}/token\n\
         \x20   service: {SERVICE}\n    issuer: {ISSUER}\n    rootcertbundle: {}\n",
        dir.path().join("data").display(),
        bundle.display()
    );
    let config_path = dir.path().join("config.yml");
    std::fs::write(&config_path, config).unwrap();
    let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
    let mut child = Command::new(REGISTRY_BIN)
        .arg("serve")
        .arg(&config_path)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    for _ in 0..200 {
        if TcpStream::connect(addr).is_ok() {
            return TokenRegistry {
                child,
                addr,
                tokens,
                _dir: dir,
            };
        }
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(dir.path().join("registry.log")).unwrap();
            panic!("docker-registry exited with {status}: {log}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("docker-registry did not listen on {addr}");
}

#[tokio::test]
async fn a_token_registry_gives_pulls_to_the_right_credentials_only() {
    if !have_registry(false) {
        return;
    }
    let reg = start();
    let host = reg.addr.to_string();
    // Push through the same token dance, with push scope.
    let pusher = Pusher {
        host: host.clone(),
        auth: RegistryAuth::Basic(USER.into(), PASSWORD.into()),
        ca: None,
    };
    pusher
        .push("team/app", "1", &tiny_image("amd64", "bearer"))
        .await;

    let cache = tempfile::tempdir().unwrap();
    let mut opts = PullOptions::new(cache.path());
    // The token service is plain HTTP on loopback too: the operator names it as well.
    opts.insecure = vec![host.clone(), reg.tokens.to_string()];
    let puller = Puller::new(opts.clone()).unwrap();
    let reference = format!("{host}/team/app:1");
    let right = Credentials::Basic {
        username: USER.into(),
        password: PASSWORD.into(),
    };
    let image = puller.pull(&reference, &right, &|_| {}).await.unwrap();
    assert_eq!(image.layers.len(), 1);

    let wrong = Credentials::Basic {
        username: USER.into(),
        password: "nope".into(),
    };
    for creds in [wrong, Credentials::Anonymous] {
        let cache = tempfile::tempdir().unwrap();
        opts.cache_dir = cache.path().to_path_buf();
        let puller = Puller::new(opts.clone()).unwrap();
        let err = puller.pull(&reference, &creds, &|_| {}).await.unwrap_err();
        assert!(
            matches!(&err, PullError::Unauthorized { registry, .. } if *registry == host),
            "{creds:?}: {err:?}"
        );
    }
}

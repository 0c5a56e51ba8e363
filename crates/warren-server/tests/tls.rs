//! Domain mode over TLS: the API at `https://api.<domain>` and sandbox ports at
//! `https://<port>-<id>.<domain>`, with a certificate of the local CA, over HTTP/2 and
//! HTTP/1.1 (ALPN), WebSockets included, and handshakes bounded like request heads.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{AgentRuntime, TestServer, API_KEY};
use futures::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Empty};
use hyper::{Request, StatusCode, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;
use tokio_tungstenite::tungstenite::Message;
use warren_control::Config;
use warren_server::{ListenerLimits, ServerConfig, TlsListener};

const DOMAIN: &str = "warren.test";

struct TlsServer {
    server: TestServer,
    tls_addr: SocketAddr,
    ca: CertificateDer<'static>,
}

async fn start(limits: ListenerLimits) -> TlsServer {
    let dir = tempfile::tempdir().unwrap();
    let (ca, _) = warren_tls::LocalCa::load_or_create(&dir.path().join("tls"), DOMAIN).unwrap();
    let root = ca.cert_der().clone();
    let certs =
        warren_tls::ServerCerts::issued(ca, vec![DOMAIN.into(), format!("*.{DOMAIN}")]).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tls_addr = listener.local_addr().unwrap();
    let tls = TlsListener {
        listener,
        config: warren_tls::server_config(Arc::new(certs)).unwrap(),
    };
    let server = TestServer::start_with_tls(
        dir,
        Arc::new(AgentRuntime::default()),
        Config {
            domain: Some(DOMAIN.into()),
            ..Config::default()
        },
        ServerConfig {
            domain: Some(DOMAIN.into()),
            ..ServerConfig::default()
        },
        limits,
        Some(tls),
    )
    .await;
    TlsServer {
        server,
        tls_addr,
        ca: root,
    }
}

impl TlsServer {
    /// A TLS connection to the listener for `name`, offering `alpn`, trusting only the CA.
    async fn connect(
        &self,
        name: &str,
        alpn: &[&[u8]],
    ) -> tokio_rustls::client::TlsStream<TcpStream> {
        let mut roots = RootCertStore::empty();
        roots.add(self.ca.clone()).unwrap();
        let mut config =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let tcp = TcpStream::connect(self.tls_addr).await.unwrap();
        TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from(name.to_string()).unwrap(), tcp)
            .await
            .unwrap_or_else(|e| panic!("TLS handshake for {name}: {e}"))
    }

    /// `GET https://<name><path>` over HTTP/2 (`h2`) or HTTP/1.1: status, version, body.
    async fn get(&self, name: &str, path: &str, h2: bool) -> (StatusCode, Version, Bytes) {
        let alpn: &[&[u8]] = if h2 { &[b"h2"] } else { &[b"http/1.1"] };
        let tls = self.connect(name, alpn).await;
        let negotiated = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
        assert_eq!(negotiated.as_deref(), Some(alpn[0]), "ALPN for {name}");
        let io = TokioIo::new(tls);
        let req = Request::get(format!("https://{name}{path}"));
        let resp = if h2 {
            let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .unwrap();
            tokio::spawn(conn);
            send.send_request(req.body(Empty::<Bytes>::new()).unwrap())
                .await
                .unwrap()
        } else {
            let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            send.send_request(
                req.header("host", name)
                    .body(Empty::<Bytes>::new())
                    .unwrap(),
            )
            .await
            .unwrap()
        };
        let status = resp.status();
        let version = resp.version();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, version, body)
    }
}

/// An HTTP/1.1 server on loopback (where the test runtime's sandboxes live) that answers every
/// request with `hello from <port>`: a service a user runs in the sandbox.
async fn user_service() -> u16 {
    user_service_speaking("HTTP/1.1").await
}

/// The same, answering in `version` (Python's http.server speaks HTTP/1.0).
async fn user_service_speaking(version: &'static str) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                loop {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                    if head.windows(4).any(|w| w == b"\r\n\r\n") {
                        let body = format!("hello from {port}");
                        let resp = format!(
                            "{version} 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if tcp.write_all(resp.as_bytes()).await.is_err() {
                            return;
                        }
                        head.clear();
                    }
                }
            });
        }
    });
    port
}

#[tokio::test]
async fn the_api_and_sandbox_ports_are_served_over_h2_and_http1() {
    let s = start(ListenerLimits::default()).await;
    for h2 in [true, false] {
        let (status, version, _) = s.get(&format!("api.{DOMAIN}"), "/health", h2).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            version,
            if h2 {
                Version::HTTP_2
            } else {
                Version::HTTP_11
            }
        );
    }
    let created = s.server.create(json!({"templateID": "base"})).await;
    let id = created["sandboxID"].as_str().unwrap();
    // What the SDKs read to build `https://<port>-<id>.<domain>`.
    assert_eq!(created["domain"], DOMAIN);
    let port = user_service().await;
    for h2 in [true, false] {
        let (status, _, body) = s
            .get(&format!("{port}-{id}.{DOMAIN}"), "/anything?x=1", h2)
            .await;
        assert_eq!(status, StatusCode::OK, "h2={h2}: {body:?}");
        assert_eq!(body, format!("hello from {port}"));
        // The agent's own port, as the SDK reaches it.
        let (status, _, body) = s.get(&format!("49983-{id}.{DOMAIN}"), "/health", h2).await;
        assert!(status.is_success(), "h2={h2}: {status} {body:?}");
    }
    // An unknown sandbox answers as E2B's proxy does, over TLS too.
    let (status, _, _) = s
        .get(&format!("{port}-nosuchsandbox.{DOMAIN}"), "/", true)
        .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    // The plain listener keeps serving the API with the key.
    let r = s
        .server
        .client()
        .get(s.server.url(&format!("/sandboxes/{id}")))
        .header("X-API-KEY", API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn websockets_work_over_tls() {
    let s = start(ListenerLimits::default()).await;
    let created = s.server.create(json!({"templateID": "base"})).await;
    let id = created["sandboxID"].as_str().unwrap().to_string();
    let echo = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = echo.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (tcp, _) = echo.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        while let Some(Ok(m)) = ws.next().await {
            if m.is_text() || m.is_binary() {
                ws.send(m).await.unwrap();
            }
        }
    });
    let name = format!("{port}-{id}.{DOMAIN}");
    let tls = s.connect(&name, &[b"http/1.1"]).await;
    let (mut ws, resp) = tokio_tungstenite::client_async(format!("wss://{name}/socket"), tls)
        .await
        .unwrap();
    assert_eq!(resp.status(), 101);
    for i in 0..5 {
        ws.send(Message::text(format!("over tls {i}")))
            .await
            .unwrap();
        let got = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("echo within 10 s")
            .unwrap()
            .unwrap();
        assert_eq!(got, Message::text(format!("over tls {i}")));
    }
}

#[tokio::test]
async fn bad_and_stalled_handshakes_are_cut_and_others_go_on() {
    let s = start(ListenerLimits {
        header_timeout: Duration::from_secs(1),
        ..ListenerLimits::default()
    })
    .await;
    // Not TLS at all: the server closes the connection.
    let mut junk = TcpStream::connect(s.tls_addr).await.unwrap();
    junk.write_all(b"GET / HTTP/1.1\r\nHost: api.warren.test\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), junk.read_to_end(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(_)) | Ok(Err(_))),
        "a plain request to the TLS port is answered by a close"
    );
    // Silent after connecting: cut by the handshake timeout (1 s), long before the client's
    // own 60 s deadline.
    let mut silent = TcpStream::connect(s.tls_addr).await.unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(60), silent.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the silent connection was closed by the server: {read:?}"
    );
    // Meanwhile the listener serves everyone else.
    let (status, _, _) = s.get(&format!("api.{DOMAIN}"), "/health", true).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn names_outside_the_domain_are_refused() {
    let s = start(ListenerLimits::default()).await;
    // A client that skips verification (or a rebinding page) and names another host gets the
    // proxy's refusal, not some sandbox.
    let tls = s.connect(&format!("api.{DOMAIN}"), &[b"http/1.1"]).await;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let resp = send
        .send_request(
            Request::get("/health")
                .header("host", "8000-abc.evil.example")
                .body(Empty::<Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::MISDIRECTED_REQUEST);
}

#[tokio::test]
async fn client_connections_stay_open_whatever_http_version_the_sandbox_speaks() {
    let s = start(ListenerLimits::default()).await;
    let created = s.server.create(json!({"templateID": "base"})).await;
    let id = created["sandboxID"].as_str().unwrap();
    let port = user_service_speaking("HTTP/1.0").await;
    let name = format!("{port}-{id}.{DOMAIN}");
    let tls = s.connect(&name, &[b"http/1.1"]).await;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    // Three requests on one connection (one TLS handshake): each answered in HTTP/1.1.
    for _ in 0..3 {
        send.ready().await.expect("the connection is still open");
        let resp = send
            .send_request(
                Request::get("/")
                    .header("host", &name)
                    .body(Empty::<Bytes>::new())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.version(), Version::HTTP_11);
        assert!(resp
            .headers()
            .get("connection")
            .is_none_or(|c| c != "close"));
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, format!("hello from {port}"));
    }
}

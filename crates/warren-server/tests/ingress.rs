//! Who reaches a sandbox's ports through the proxy (threat model C1, M10, M11, L12), against
//! real agents and real HTTP servers standing in for a sandbox's own services.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{AgentRuntime, TestServer, API_KEY};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warren_control::Config;
use warren_server::{ListenerLimits, ServerConfig};

/// An HTTP server on loopback that answers every request with the request head it received
/// (so a test sees which headers reached "the sandbox").
async fn echo_server() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&buf).to_lowercase();
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{head}",
                    head.len()
                );
                let _ = sock.write_all(resp.as_bytes()).await;
            });
        }
    });
    port
}

struct Setup {
    server: TestServer,
    user_port: u16,
    service_port: u16,
}

async fn setup(server: ServerConfig, limits: ListenerLimits) -> Setup {
    let user_port = echo_server().await;
    let service_port = echo_server().await;
    let config = Config {
        // The echo server stands in for the code interpreter.
        service_ports: vec![service_port],
        ..Config::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_full(
        dir,
        Arc::new(AgentRuntime::default()),
        config,
        server,
        limits,
    )
    .await;
    Setup {
        server,
        user_port,
        service_port,
    }
}

async fn send(
    s: &TestServer,
    id: &str,
    port: u16,
    headers: &[(&str, &str)],
) -> (reqwest::StatusCode, String) {
    let mut req = s
        .client()
        .get(s.url("/execute"))
        .header("E2b-Sandbox-Id", id)
        .header("E2b-Sandbox-Port", port.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await.unwrap();
    (r.status(), r.text().await.unwrap())
}

fn tokens(created: &Value) -> (String, String, String) {
    (
        created["sandboxID"].as_str().unwrap().to_string(),
        created["envdAccessToken"].as_str().unwrap().to_string(),
        created["trafficAccessToken"].as_str().unwrap().to_string(),
    )
}

#[tokio::test]
async fn service_ports_need_a_token() {
    let t = setup(ServerConfig::default(), ListenerLimits::default()).await;
    let s = &t.server;
    let (id, envd, traffic) = tokens(&s.create(json!({"templateID": "base"})).await);

    // What the threat model's C1 did: routing headers only, no token, and the service ran.
    let (status, body) = send(s, &id, t.service_port, &[]).await;
    assert_eq!(status, 403, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["code"], 403);
    assert_eq!(v["sandboxId"], id.as_str());
    assert!(v["message"].as_str().unwrap().contains("service port"));

    let (status, _) = send(s, &id, t.service_port, &[("X-Access-Token", "ea_wrong")]).await;
    assert_eq!(status, 403);
    let (status, _) = send(
        s,
        &id,
        t.service_port,
        &[("E2B-Traffic-Access-Token", "nope")],
    )
    .await;
    assert_eq!(status, 403);
    // Another sandbox's token opens nothing here.
    let (_, other_envd, other_traffic) = tokens(&s.create(json!({"templateID": "base"})).await);
    for (h, v) in [
        ("X-Access-Token", other_envd.as_str()),
        ("E2B-Traffic-Access-Token", other_traffic.as_str()),
    ] {
        assert_eq!(send(s, &id, t.service_port, &[(h, v)]).await.0, 403);
    }

    // Either token the SDK sends is enough; the traffic token does not reach the sandbox, the
    // access token does (the interpreter calls the agent with it).
    let (status, head) = send(s, &id, t.service_port, &[("X-Access-Token", &envd)]).await;
    assert_eq!(status, 200);
    assert!(head.contains(&format!("x-access-token: {}", envd.to_lowercase())));
    let (status, head) = send(
        s,
        &id,
        t.service_port,
        &[("E2B-Traffic-Access-Token", &traffic)],
    )
    .await;
    assert_eq!(status, 200);
    assert!(!head.contains("e2b-traffic-access-token"), "{head}");
    assert!(!head.contains(&traffic.to_lowercase()));

    // User ports of a public sandbox stay public, as on E2B, and get no credentials.
    let (status, head) = send(
        s,
        &id,
        t.user_port,
        &[("X-Access-Token", &envd), ("X-API-KEY", API_KEY)],
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        !head.contains(&envd.to_lowercase()) && !head.contains(&API_KEY.to_lowercase()),
        "{head}"
    );
}

#[tokio::test]
async fn private_sandboxes_need_the_traffic_token_on_every_port() {
    let t = setup(ServerConfig::default(), ListenerLimits::default()).await;
    let s = &t.server;
    let created = s
        .create(json!({"templateID": "base", "network": {"allowPublicTraffic": false}}))
        .await;
    let (id, envd, traffic) = tokens(&created);
    let detail: Value = s
        .client()
        .get(s.url(&format!("/sandboxes/{id}")))
        .header("X-API-KEY", API_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(detail["network"]["allowPublicTraffic"], false);

    let (status, body) = send(s, &id, t.user_port, &[]).await;
    assert_eq!(status, 403);
    assert!(
        body.contains("'e2b-traffic-access-token' is missing"),
        "{body}"
    );
    let (status, body) = send(s, &id, t.user_port, &[("e2b-traffic-access-token", "ta_x")]).await;
    assert_eq!(status, 403);
    assert!(body.contains("is invalid"), "{body}");
    // The envd token is not a traffic token.
    assert_eq!(
        send(s, &id, t.user_port, &[("X-Access-Token", &envd)])
            .await
            .0,
        403
    );
    assert_eq!(
        send(
            s,
            &id,
            t.user_port,
            &[("e2b-traffic-access-token", &traffic)]
        )
        .await
        .0,
        200
    );

    // A page on another site cannot reach it without the token either.
    let cross = [
        ("Origin", "http://evil.test"),
        ("Sec-Fetch-Site", "cross-site"),
    ];
    assert_eq!(send(s, &id, t.user_port, &cross).await.0, 403);

    // The agent's port still answers its own health check (the agent checks its token).
    let (status, _) = {
        let r = s
            .client()
            .get(s.url("/health"))
            .header("E2b-Sandbox-Id", &id)
            .send()
            .await
            .unwrap();
        (r.status(), ())
    };
    assert_eq!(status, 204);
}

#[tokio::test]
async fn cross_site_requests_reach_only_public_user_ports() {
    let t = setup(ServerConfig::default(), ListenerLimits::default()).await;
    let s = &t.server;
    let (id, envd, _) = tokens(&s.create(json!({"templateID": "base"})).await);
    let cross = [
        ("Origin", "http://evil.test"),
        ("Sec-Fetch-Site", "cross-site"),
    ];
    // A public web app in the sandbox is a web app: other sites may link to it.
    assert_eq!(send(s, &id, t.user_port, &cross).await.0, 200);
    // The agent's port refuses a cross-site request that carries no token.
    let r = s
        .client()
        .post(s.url("/process.Process/Start"))
        .header("E2b-Sandbox-Id", &id)
        .header("Origin", "http://evil.test")
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    // A browser SDK holding the token is fine.
    let mut with_token = cross.to_vec();
    with_token.push(("X-Access-Token", &envd));
    assert_eq!(send(s, &id, t.service_port, &with_token).await.0, 200);
}

#[tokio::test]
async fn egress_fields_that_are_not_enforced_are_refused() {
    let t = setup(ServerConfig::default(), ListenerLimits::default()).await;
    let s = &t.server;
    for (network, says) in [
        // This runtime applies no header rules.
        (
            json!({"rules": {"example.test": [{"transform": {"headers": {"a": "b"}}}]}}),
            "are not applied by the test-agent runtime",
        ),
        (json!({"somethingNew": true}), "not supported"),
    ] {
        let r = s
            .client()
            .post(s.url("/v2/sandboxes"))
            .header("X-API-KEY", API_KEY)
            .json(&json!({"templateID": "base", "network": network}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{network}");
        let v: Value = r.json().await.unwrap();
        assert!(v["message"].as_str().unwrap().contains(says), "{v}");
    }
    // Empty lists and nulls ask for nothing, and are fine.
    s.create(json!({"templateID": "base", "network": {"allowOut": [], "denyOut": null}}))
        .await;
}

#[tokio::test]
async fn unknown_host_names_are_refused_when_a_domain_is_set() {
    let t = setup(
        ServerConfig {
            domain: Some("warren.test".into()),
            ..Default::default()
        },
        ListenerLimits::default(),
    )
    .await;
    let s = &t.server;
    let (id, envd, _) = tokens(&s.create(json!({"templateID": "base"})).await);
    let host = |h: String| {
        s.client()
            .get(s.url("/execute"))
            .header("Host", h)
            .header("X-Access-Token", envd.clone())
    };
    let port = s.addr.port();
    // DNS rebinding: another name pointed at this server.
    let r = host(format!("{}-{id}.evil.test:{port}", t.service_port))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 421);
    let r = host(format!("api.evil.test:{port}")).send().await.unwrap();
    assert_eq!(r.status(), 421);
    let r = host(format!("{}-{id}.warren.test:{port}", t.service_port))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = host(format!("127.0.0.1:{port}")).send().await.unwrap();
    assert_ne!(r.status(), 421);
}

#[tokio::test]
async fn oversized_bodies_from_strangers_are_not_read() {
    let t = setup(ServerConfig::default(), ListenerLimits::default()).await;
    let s = &t.server;
    // Declares 32 MiB, sends none of it: the stranger gets 401 at once, no 413 after a drain.
    let mut sock = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    sock.write_all(
        b"POST /v2/sandboxes HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 33554432\r\n\r\n",
    )
    .await
    .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(20), sock.read(&mut buf))
        .await
        .expect("the server answers without waiting for the body")
        .unwrap();
    let head = String::from_utf8_lossy(&buf[..n]);
    assert!(head.starts_with("HTTP/1.1 401"), "{head}");
    assert!(head.to_lowercase().contains("connection: close"), "{head}");
}

#[tokio::test]
async fn the_listener_caps_connections_and_drops_half_sent_requests() {
    let t = setup(
        ServerConfig::default(),
        ListenerLimits {
            max_connections: 64,
            max_per_client: 4,
            header_timeout: Duration::from_secs(2),
            ..Default::default()
        },
    )
    .await;
    let s = &t.server;
    // Slowloris: half a request line on each connection.
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        c.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        held.push(c);
    }
    // The client's fifth connection is closed at once.
    let mut fifth = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let _ = fifth
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(20), fifth.read(&mut buf))
        .await
        .expect("closed, not left hanging")
        .unwrap_or(0);
    assert_eq!(
        n,
        0,
        "over the per-client cap: {:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    // The half-sent requests are dropped once the header timeout passes...
    for mut c in held {
        let r = tokio::time::timeout(Duration::from_secs(30), async {
            let mut sink = Vec::new();
            c.read_to_end(&mut sink).await.map(|_| sink)
        })
        .await
        .expect("the server ends a connection whose headers never come");
        if let Ok(sink) = r {
            let text = String::from_utf8_lossy(&sink);
            assert!(!text.contains("200 OK"), "{text}");
        }
    }
    // ...which frees the client's slots.
    let r = s.client().get(s.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

/// A sandbox owns its agent's port: an answer to `/metrics` is hostile input (threat model
/// H5). One that never ends is cut at the size cap, not buffered.
#[tokio::test]
async fn a_hostile_metrics_answer_is_bounded() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = sent.clone();
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 4096];
        let _ = sock.read(&mut buf).await;
        let _ = sock
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1073741824\r\n\r\n")
            .await;
        let chunk = vec![b'x'; 64 * 1024];
        while sock.write_all(&chunk).await.is_ok() {
            counter.fetch_add(chunk.len() as u64, std::sync::atomic::Ordering::Relaxed);
        }
    });
    let proxy = warren_server::proxy::Proxy::new(None);
    let err = proxy.agent_metrics(addr, "ea_x").await.unwrap_err();
    assert_eq!(err.status, 502);
    // Reading stopped near the cap: the server wrote at most what socket buffers hold.
    let sent = sent.load(std::sync::atomic::Ordering::Relaxed);
    assert!(sent < 64 * 1024 * 1024, "{sent} bytes were taken in");
}

#[tokio::test]
async fn mask_request_host_is_the_host_user_ports_see() {
    let t = setup(ServerConfig::default(), ListenerLimits::default()).await;
    let s = &t.server;
    let created = s
        .create(json!({"templateID": "base",
                       "network": {"maskRequestHost": "app.example.test:${PORT}"}}))
        .await;
    let (id, envd, _) = tokens(&created);
    let (status, head) = send(s, &id, t.user_port, &[]).await;
    assert_eq!(status, 200, "{head}");
    assert!(
        head.contains(&format!("\r\nhost: app.example.test:{}\r\n", t.user_port)),
        "{head}"
    );
    // Service ports get it too (every port but the agent's, as E2B).
    let (_, head) = send(s, &id, t.service_port, &[("X-Access-Token", &envd)]).await;
    assert!(head.contains("host: app.example.test:"), "{head}");
    let detail: Value = s
        .client()
        .get(s.url(&format!("/sandboxes/{id}")))
        .header("X-API-KEY", API_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        detail["network"]["maskRequestHost"],
        "app.example.test:${PORT}"
    );

    // Without a mask: the sandbox's own address.
    let (plain, _, _) = tokens(&s.create(json!({"templateID": "base"})).await);
    let (_, head) = send(s, &plain, t.user_port, &[]).await;
    assert!(
        head.contains(&format!("host: 127.0.0.1:{}", t.user_port)),
        "{head}"
    );

    for bad in [
        "exa mple.test",
        "user@host",
        "host/path",
        "h\u{e9}te.test",
        "",
    ] {
        let r = s
            .client()
            .post(s.url("/v2/sandboxes"))
            .header("X-API-KEY", API_KEY)
            .json(&json!({"templateID": "base", "network": {"maskRequestHost": bad}}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{bad}");
        let v: Value = r.json().await.unwrap();
        assert!(
            v["message"].as_str().unwrap().contains("maskRequestHost"),
            "{v}"
        );
    }
}

//! What the proxy passes on to a sandbox's service: a plain TCP listener on loopback stands in
//! for a service inside the sandbox (the test runtime's sandboxes live at 127.0.0.1) and
//! records the request head it receives.

mod common;

use common::{TestServer, API_KEY};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn the_api_key_and_hop_headers_never_reach_the_sandbox() {
    let s = TestServer::start().await;
    let created = s.create(json!({"templateID": "base"})).await;
    let id = created["sandboxID"].as_str().unwrap().to_string();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = tcp.read(&mut buf).await.unwrap();
            assert!(n > 0, "connection closed before the request head ended");
            head.extend_from_slice(&buf[..n]);
        }
        tcp.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            .await
            .unwrap();
        String::from_utf8_lossy(&head).to_lowercase()
    });

    let resp = reqwest::Client::new()
        .get(s.url("/some/path?q=1"))
        .header("E2b-Sandbox-Id", &id)
        .header("E2b-Sandbox-Port", port.to_string())
        .header("X-API-KEY", API_KEY)
        .header("X-Custom", "kept")
        // W3C trace context goes on unchanged: the agent parents a command's span on it.
        .header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .header("tracestate", "vendor=opaque")
        .header("Connection", "x-hop")
        .header("X-Hop", "dropped")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), "ok");
    let head = seen.await.unwrap();
    assert!(
        head.starts_with("get /some/path?q=1 http/1.1\r\n"),
        "{head}"
    );
    assert!(head.contains("\r\nx-custom: kept\r\n"), "{head}");
    assert!(
        head.contains(
            "\r\ntraceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n"
        ),
        "{head}"
    );
    assert!(head.contains("\r\ntracestate: vendor=opaque\r\n"), "{head}");
    assert!(
        !head.contains("x-api-key"),
        "the API key reached the sandbox: {head}"
    );
    assert!(!head.contains(&API_KEY.to_lowercase()), "{head}");
    assert!(
        !head.contains("x-hop"),
        "a hop-by-hop header reached the sandbox: {head}"
    );
}

//! The sandbox proxy against real agents: routing by headers and by Host, HTTP/1.1 and h2c,
//! streaming, 502s, and streams cut when a sandbox is killed.

mod common;

use std::time::Duration;

use common::{envelope, envelopes, TestServer, API_KEY};
use futures::StreamExt;
use serde_json::{json, Value};

fn start_body(cmd: &str) -> Vec<u8> {
    envelope(
        0,
        &json!({"process": {"cmd": "/bin/sh", "args": ["-c", cmd]}, "stdin": false}),
    )
}

async fn sandbox(s: &TestServer) -> (String, String) {
    let v = s
        .create(json!({"templateID": "base", "envVars": {"GREETING": "hello"}}))
        .await;
    (
        v["sandboxID"].as_str().unwrap().into(),
        v["envdAccessToken"].as_str().unwrap().into(),
    )
}

fn stdout_of(body: &[u8]) -> String {
    use base64::Engine as _;
    let mut out = Vec::new();
    for (flags, v) in envelopes(body) {
        if flags & 2 == 0 {
            if let Some(d) = v["event"]["data"]["stdout"].as_str() {
                out.extend(base64::engine::general_purpose::STANDARD.decode(d).unwrap());
            }
        }
    }
    String::from_utf8(out).unwrap()
}

#[tokio::test]
async fn header_and_host_routing_over_http1_and_h2c() {
    let s = TestServer::start().await;
    let (id, token) = sandbox(&s).await;

    let r = s
        .client()
        .get(s.url("/health"))
        .header("E2b-Sandbox-Id", &id)
        .header("E2b-Sandbox-Port", "49983")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);

    // Without the access token the agent itself refuses. (Not `/envs`: these test agents
    // listen on the host's loopback, where the agent opens that one to the sandbox's own
    // processes.)
    let r = s
        .client()
        .get(s.url("/metrics"))
        .header("E2b-Sandbox-Id", &id)
        .send()
        .await
        .unwrap();
    let status = r.status();
    assert_eq!(
        status,
        401,
        "{:?} {:?}",
        r.headers().clone(),
        r.text().await
    );

    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    for (client, by_host) in [(s.client(), false), (s.client(), true), (h2, false)] {
        let mut req = client
            .post(s.url("/process.Process/Start"))
            .header("content-type", "application/connect+json")
            .header("connect-protocol-version", "1")
            .header("X-Access-Token", &token)
            .body(start_body("echo $GREETING world"));
        req = if by_host {
            req.header("Host", format!("49983-{id}.sandbox.test:{}", s.addr.port()))
        } else {
            req.header("E2b-Sandbox-Id", &id)
                .header("E2b-Sandbox-Port", "49983")
        };
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 200);
        let body = r.bytes().await.unwrap();
        assert_eq!(stdout_of(&body), "hello world\n");
        let last = envelopes(&body).pop().unwrap();
        assert_eq!(last.0 & 2, 2, "ends with the end-of-stream envelope");
    }
}

#[tokio::test]
async fn unknown_sandbox_and_closed_port_are_502() {
    let s = TestServer::start().await;
    let r = s
        .client()
        .get(s.url("/health"))
        .header("E2b-Sandbox-Id", "nosuchsandbox")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["code"], 502);
    assert_eq!(v["sandboxId"], "nosuchsandbox");
    assert!(v["message"].as_str().unwrap().contains("was not found"));

    let (id, _) = sandbox(&s).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let r = s
        .client()
        .get(s.url("/"))
        .header("E2b-Sandbox-Id", &id)
        .header("E2b-Sandbox-Port", port.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["message"].as_str().unwrap().contains("port is not open"),
        "{v}"
    );
}

#[tokio::test]
async fn kill_cuts_open_streams() {
    let s = TestServer::start().await;
    let (id, token) = sandbox(&s).await;
    let r = s
        .client()
        .post(s.url("/process.Process/Start"))
        .header("content-type", "application/connect+json")
        .header("connect-protocol-version", "1")
        .header("X-Access-Token", &token)
        .header("E2b-Sandbox-Id", &id)
        .body(start_body("echo started; sleep 60"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut stream = r.bytes_stream();
    let mut got = Vec::new();
    // Read until the command's first output arrives: the stream is live end to end.
    while !stdout_of(&got).contains("started") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        got.extend_from_slice(&chunk);
    }
    let r = s
        .client()
        .delete(s.url(&format!("/sandboxes/{id}")))
        .header("X-API-KEY", API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    // The stream must end with an error, not with a clean end-of-stream envelope.
    let mut aborted = false;
    loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .unwrap()
        {
            Some(Ok(chunk)) => got.extend_from_slice(&chunk),
            Some(Err(_)) => {
                aborted = true;
                break;
            }
            None => break,
        }
    }
    assert!(aborted, "stream ended cleanly after kill");
    assert!(
        envelopes(&got).iter().all(|(flags, _)| flags & 2 == 0),
        "no end-of-stream envelope"
    );
    let r = s
        .client()
        .get(s.url("/health"))
        .header("E2b-Sandbox-Id", &id)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
}

#[tokio::test]
async fn streams_request_bodies_through() {
    let s = TestServer::start().await;
    let (id, token) = sandbox(&s).await;
    // A 3 MiB upload in chunks (bigger than the API's body limit, which must not apply here).
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..48).map(|_| Ok(vec![b'x'; 64 * 1024])).collect();
    let body = reqwest::Body::wrap_stream(futures::stream::iter(chunks));
    let r = s
        .client()
        .post(s.url("/files?path=/tmp/warren-proxy-upload-test"))
        .header("content-type", "application/octet-stream")
        .header("X-Access-Token", &token)
        .header("E2b-Sandbox-Id", &id)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let r = s
        .client()
        .get(s.url("/files?path=/tmp/warren-proxy-upload-test"))
        .header("X-Access-Token", &token)
        .header("E2b-Sandbox-Id", &id)
        .send()
        .await
        .unwrap();
    assert_eq!(r.bytes().await.unwrap().len(), 48 * 64 * 1024);
    let _ = std::fs::remove_file("/tmp/warren-proxy-upload-test");
}

//! WebSocket traffic through the sandbox proxy: a real WebSocket echo server on a loopback
//! port stands in for a service a user runs inside the sandbox (the test runtime's sandboxes
//! live at 127.0.0.1, so `E2b-Sandbox-Port` / `{port}-{id}.{domain}` reach it), and a real
//! WebSocket client talks to it through the server's listener.

mod common;

use std::time::Duration;

use common::{TestServer, API_KEY};
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::{Bytes, Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Client = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// How one echo-server connection ended.
#[derive(Debug, PartialEq, Eq)]
enum ServerEnd {
    /// The peer sent a close frame.
    Closed,
    /// The connection dropped (EOF or error) without a close frame.
    Dropped,
}

/// A WebSocket echo server on 127.0.0.1: echoes text and binary messages, answers pings
/// (tungstenite does that itself), and reports how each connection ended.
struct EchoServer {
    port: u16,
    ends: mpsc::UnboundedReceiver<ServerEnd>,
    task: tokio::task::JoinHandle<()>,
}

impl EchoServer {
    async fn start() -> EchoServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, ends) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let tx = tx.clone();
                tokio::spawn(async move {
                    let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                        return;
                    };
                    let end = loop {
                        match ws.next().await {
                            Some(Ok(m @ (Message::Text(_) | Message::Binary(_)))) => {
                                if ws.send(m).await.is_err() {
                                    break ServerEnd::Dropped;
                                }
                            }
                            Some(Ok(Message::Close(_))) => {
                                // tungstenite queues the close reply; drain until it is out.
                                while let Some(Ok(_)) = ws.next().await {}
                                break ServerEnd::Closed;
                            }
                            Some(Ok(_)) => {}
                            Some(Err(_)) | None => break ServerEnd::Dropped,
                        }
                    };
                    let _ = tx.send(end);
                });
            }
        });
        EchoServer { port, ends, task }
    }

    /// The next connection end, within `secs`.
    async fn next_end(&mut self, secs: u64) -> ServerEnd {
        tokio::time::timeout(Duration::from_secs(secs), self.ends.recv())
            .await
            .expect("echo server connection did not end in time")
            .expect("echo server gone")
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn sandbox(s: &TestServer) -> String {
    let v = s.create(json!({"templateID": "base"})).await;
    v["sandboxID"].as_str().unwrap().into()
}

/// How the client names the sandbox.
#[derive(Clone, Copy, Debug)]
enum Routing {
    Headers,
    Host,
}

async fn connect(s: &TestServer, id: &str, port: u16, routing: Routing) -> Result<Client, WsError> {
    let mut req = format!("ws://{}/echo?x=1", s.addr)
        .into_client_request()
        .unwrap();
    let h = req.headers_mut();
    match routing {
        Routing::Headers => {
            h.insert("E2b-Sandbox-Id", HeaderValue::from_str(id).unwrap());
            h.insert(
                "E2b-Sandbox-Port",
                HeaderValue::from_str(&port.to_string()).unwrap(),
            );
        }
        Routing::Host => {
            // The test server accepts any domain; the TCP connection still goes to s.addr.
            let host = format!("{port}-{id}.warren.test:{}", s.addr.port());
            h.insert("Host", HeaderValue::from_str(&host).unwrap());
        }
    }
    let (ws, resp) = tokio::time::timeout(
        Duration::from_secs(10),
        tokio_tungstenite::connect_async(req),
    )
    .await
    .expect("websocket handshake timed out")?;
    assert_eq!(resp.status(), 101);
    Ok(ws)
}

/// The next data/control message (within 10 s); panics on end of stream or error.
async fn recv(ws: &mut Client) -> Message {
    tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("no message within 10s")
        .expect("stream ended")
        .expect("websocket error")
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(seed as u32) as u8 ^ (i >> 13) as u8)
        .collect()
}

/// Text and binary messages echo in order, a 1 MiB message round-trips, ping/pong works,
/// and a clean close handshake passes through.
async fn exercise(ws: &mut Client, seed: u8) {
    let mut sent = Vec::new();
    for i in 0..20u8 {
        let m = if i % 2 == 0 {
            Message::text(format!("hello {seed} #{i} ✓"))
        } else {
            Message::binary(pattern(1 + i as usize * 37, seed.wrapping_add(i)))
        };
        ws.send(m.clone()).await.unwrap();
        sent.push(m);
    }
    for want in &sent {
        assert_eq!(&recv(ws).await, want);
    }

    let big = pattern(1 << 20, seed);
    ws.send(Message::binary(big.clone())).await.unwrap();
    match recv(ws).await {
        Message::Binary(got) => {
            assert_eq!(got.len(), big.len());
            assert!(got[..] == big[..], "1 MiB message corrupted");
        }
        other => panic!("expected the 1 MiB binary echo, got {other:?}"),
    }

    let payload = Bytes::from(format!("ping-{seed}"));
    ws.send(Message::Ping(payload.clone())).await.unwrap();
    assert_eq!(recv(ws).await, Message::Pong(payload));

    // Still echoing after the ping.
    ws.send(Message::text("after ping")).await.unwrap();
    assert_eq!(recv(ws).await, Message::text("after ping"));
}

async fn close_cleanly(mut ws: Client) {
    ws.close(None).await.unwrap();
    let mut got_close = false;
    loop {
        match tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("close handshake timed out")
        {
            Some(Ok(Message::Close(_))) => got_close = true,
            Some(Ok(other)) => panic!("unexpected message while closing: {other:?}"),
            Some(Err(e)) => panic!("error while closing: {e}"),
            None => break,
        }
    }
    assert!(got_close, "the echo server's close frame came through");
}

#[tokio::test]
async fn websocket_echo_through_headers_and_host() {
    let s = TestServer::start().await;
    let mut echo = EchoServer::start().await;
    let id = sandbox(&s).await;

    for (seed, routing) in [(1u8, Routing::Headers), (2u8, Routing::Host)] {
        let mut ws = connect(&s, &id, echo.port, routing)
            .await
            .unwrap_or_else(|e| panic!("{routing:?}: {e}"));
        exercise(&mut ws, seed).await;
        close_cleanly(ws).await;
        assert_eq!(echo.next_end(10).await, ServerEnd::Closed, "{routing:?}");
    }

    // Two WebSockets open at once over the same route stay independent.
    let mut a = connect(&s, &id, echo.port, Routing::Headers).await.unwrap();
    let mut b = connect(&s, &id, echo.port, Routing::Host).await.unwrap();
    a.send(Message::text("to a")).await.unwrap();
    b.send(Message::text("to b")).await.unwrap();
    assert_eq!(recv(&mut b).await, Message::text("to b"));
    assert_eq!(recv(&mut a).await, Message::text("to a"));
    close_cleanly(a).await;
    close_cleanly(b).await;

    // The API still answers on the same listener.
    let r = s
        .client()
        .get(s.url(&format!("/sandboxes/{id}")))
        .header("X-API-KEY", API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

async fn kill(s: &TestServer, id: &str) {
    let r = s
        .client()
        .delete(s.url(&format!("/sandboxes/{id}")))
        .header("X-API-KEY", API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
}

#[tokio::test]
async fn kill_cuts_open_websockets() {
    let s = TestServer::start().await;
    let mut echo = EchoServer::start().await;
    let id = sandbox(&s).await;

    let mut by_headers = connect(&s, &id, echo.port, Routing::Headers).await.unwrap();
    let mut by_host = connect(&s, &id, echo.port, Routing::Host).await.unwrap();
    for ws in [&mut by_headers, &mut by_host] {
        ws.send(Message::text("live")).await.unwrap();
        assert_eq!(recv(ws).await, Message::text("live"));
    }

    kill(&s, &id).await;

    // Each client sees its connection end (EOF or error) within a few seconds, without a
    // close frame: the echo server never closed, the proxy cut it.
    for (name, ws) in [("headers", &mut by_headers), ("host", &mut by_host)] {
        let next = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .unwrap_or_else(|_| panic!("{name}: websocket still open 5s after kill"));
        match next {
            None | Some(Err(_)) => {}
            Some(Ok(Message::Close(f))) => {
                panic!("{name}: got a clean close frame after kill: {f:?}")
            }
            Some(Ok(other)) => panic!("{name}: unexpected message after kill: {other:?}"),
        }
        // Nothing more can be sent through it either.
        let _ = ws.send(Message::text("dead?")).await;
        assert!(
            !matches!(
                tokio::time::timeout(Duration::from_millis(500), ws.next()).await,
                Ok(Some(Ok(Message::Text(_))))
            ),
            "{name}: a message echoed after kill"
        );
    }

    // The upstream side was cut too: the echo server (still running) saw both connections
    // drop without a close frame.
    assert_eq!(echo.next_end(5).await, ServerEnd::Dropped);
    assert_eq!(echo.next_end(5).await, ServerEnd::Dropped);

    // A new WebSocket to the killed sandbox gets the 502 answer, not an upgrade.
    match connect(&s, &id, echo.port, Routing::Headers).await {
        Err(WsError::Http(resp)) => assert_eq!(resp.status(), 502),
        Err(e) => panic!("expected a 502 answer, got {e}"),
        Ok(_) => panic!("upgraded a WebSocket to a killed sandbox"),
    }
}

/// The raw 502 answer to an upgrade request, body read in full (tungstenite only keeps the
/// bytes that arrived with the headers).
async fn upgrade_answer(s: &TestServer, headers: &[(&str, String)]) -> (u16, Value) {
    let mut req = s
        .client()
        .get(s.url("/echo"))
        .header("Connection", "Upgrade")
        .header("Upgrade", "websocket")
        .header("Sec-WebSocket-Version", "13")
        .header("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==");
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

#[tokio::test]
async fn websocket_to_unknown_sandbox_is_502() {
    let s = TestServer::start().await;
    let echo = EchoServer::start().await;

    for routing in [Routing::Headers, Routing::Host] {
        match connect(&s, "nosuchsandbox", echo.port, routing).await {
            Err(WsError::Http(resp)) => {
                assert_eq!(resp.status(), 502, "{routing:?}");
                assert_eq!(
                    resp.headers().get("content-type").unwrap(),
                    "application/json",
                    "{routing:?}"
                );
                assert!(resp.headers().get("upgrade").is_none(), "{routing:?}");
                // Whatever part of the body arrived with the headers is the JSON answer.
                let tail = resp.body().as_deref().unwrap_or_default();
                if let Ok(v) = serde_json::from_slice::<Value>(tail) {
                    assert_eq!(v["code"], 502, "{v}");
                    assert_eq!(v["sandboxId"], "nosuchsandbox", "{v}");
                }
            }
            Err(e) => panic!("{routing:?}: expected a 502 answer, got {e}"),
            Ok(_) => panic!("{routing:?}: upgraded a WebSocket to an unknown sandbox"),
        }
    }

    // The same upgrade request, body read in full.
    let port = echo.port.to_string();
    for headers in [
        vec![
            ("E2b-Sandbox-Id", "nosuchsandbox".to_string()),
            ("E2b-Sandbox-Port", port.clone()),
        ],
        vec![(
            "Host",
            format!("{port}-nosuchsandbox.warren.test:{}", s.addr.port()),
        )],
    ] {
        let (status, v) = upgrade_answer(&s, &headers).await;
        assert_eq!(status, 502, "{v}");
        assert_eq!(v["code"], 502, "{v}");
        assert_eq!(v["sandboxId"], "nosuchsandbox", "{v}");
        assert!(
            v["message"].as_str().unwrap().contains("was not found"),
            "{v}"
        );
    }
}

#[tokio::test]
async fn websocket_to_closed_port_is_502() {
    let s = TestServer::start().await;
    let id = sandbox(&s).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    match connect(&s, &id, port, Routing::Headers).await {
        Err(WsError::Http(resp)) => assert_eq!(resp.status(), 502),
        Err(e) => panic!("expected a 502 answer, got {e}"),
        Ok(_) => panic!("upgraded a WebSocket to a closed port"),
    }
    let (status, v) = upgrade_answer(
        &s,
        &[
            ("E2b-Sandbox-Id", id.clone()),
            ("E2b-Sandbox-Port", port.to_string()),
        ],
    )
    .await;
    assert_eq!(status, 502, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("port is not open"),
        "{v}"
    );
}

//! The proxy's connection pool when a runtime hands a freed address to the next sandbox.
//!
//! The vm runtime reuses network slots: the next VM gets the killed VM's address. A killed
//! VM closes none of its TCP connections, so the proxy's idle connections to it stay open on
//! the host, and a segment sent on one reaches the next VM, whose kernel knows no such
//! connection and resets it. The runtime here is one such "slot": a real TCP server on one
//! loopback address that belongs to one sandbox at a time, and resets any connection accepted
//! while an earlier sandbox owned it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warren_control::{Config, Control};
use warren_runtime::{
    Capabilities, CreateSpec, Exit, RuntimeError, RuntimeSandbox, SandboxRuntime,
};
use warren_store::SqliteStore;

const API_KEY: &str = "test-api-key-0123456789";

/// One network slot: the address every sandbox of this runtime gets, one at a time.
struct SlotRuntime {
    addr: SocketAddr,
    owner: Arc<Mutex<Option<String>>>,
}

impl SlotRuntime {
    async fn start() -> SlotRuntime {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let owner: Arc<Mutex<Option<String>>> = Arc::default();
        let current = owner.clone();
        tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    return;
                };
                let accepted_for = current.lock().unwrap().clone();
                tokio::spawn(serve(conn, accepted_for, current.clone()));
            }
        });
        SlotRuntime { addr, owner }
    }
}

/// Answers each request with the id of the sandbox the connection was accepted for, while that
/// sandbox owns the slot; once another owns it, the next request is answered with a reset (as
/// the next VM's kernel answers a connection it never had).
async fn serve(
    mut conn: tokio::net::TcpStream,
    accepted_for: Option<String>,
    owner: Arc<Mutex<Option<String>>>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let Ok(n) = conn.read(&mut chunk).await else {
            return;
        };
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            buf.drain(..end + 4);
            let current = owner.lock().unwrap().clone();
            if current.is_none() || current != accepted_for {
                let _ = conn.set_zero_linger();
                return;
            }
            let body = accepted_for.clone().unwrap_or_default();
            let resp = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            if conn.write_all(resp.as_bytes()).await.is_err() {
                return;
            }
        }
    }
}

#[async_trait]
impl SandboxRuntime for SlotRuntime {
    fn name(&self) -> &'static str {
        "test-slot"
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }
    async fn create(&self, spec: CreateSpec) -> Result<RuntimeSandbox, RuntimeError> {
        let mut owner = self.owner.lock().unwrap();
        if owner.is_some() {
            return Err(RuntimeError::Exhausted("the one slot is taken".into()));
        }
        *owner = Some(spec.id.to_string());
        Ok(RuntimeSandbox {
            id: spec.id.to_string(),
            agent: self.addr,
            record: serde_json::json!({}),
        })
    }
    async fn kill(&self, id: &str) -> Result<(), RuntimeError> {
        let mut owner = self.owner.lock().unwrap();
        if owner.as_deref() != Some(id) {
            return Err(RuntimeError::NotFound(id.into()));
        }
        // Like a killed VM: the slot is free, the connections to it are left open.
        *owner = None;
        Ok(())
    }
    async fn status(&self, id: &str) -> Result<Option<Exit>, RuntimeError> {
        Ok(
            (self.owner.lock().unwrap().as_deref() != Some(id)).then(|| Exit {
                reason: "killed".into(),
            }),
        )
    }
    async fn reattach(
        &self,
        records: Vec<RuntimeSandbox>,
    ) -> Vec<(String, Result<RuntimeSandbox, RuntimeError>)> {
        records
            .into_iter()
            .map(|r| (r.id.clone(), Err(RuntimeError::NotFound(r.id))))
            .collect()
    }
}

async fn create(base: &str) -> String {
    let r = reqwest::Client::new()
        .post(format!("{base}/v2/sandboxes"))
        .header("X-API-KEY", API_KEY)
        .json(&serde_json::json!({"templateID": "base"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{:?}", r.text().await);
    let v: serde_json::Value = r.json().await.unwrap();
    v["sandboxID"].as_str().unwrap().to_string()
}

async fn through_proxy(base: &str, id: &str) -> (u16, String) {
    let r = reqwest::Client::new()
        .get(format!("{base}/whoami"))
        .header("E2b-Sandbox-Id", id)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test]
async fn a_sandbox_on_a_reused_address_gets_fresh_connections() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Arc::new(SlotRuntime::start().await);
    let store = Arc::new(SqliteStore::open(&dir.path().join("warren.db")).unwrap());
    let proxy = Arc::new(warren_server::proxy::Proxy::new(None));
    let control = Control::builder(store, runtime.clone(), Config::default())
        .guest_metrics(proxy.clone())
        .start()
        .await
        .unwrap();
    control.keys().seed_api_key("test", API_KEY).await.unwrap();
    let app = warren_server::app(
        control.clone(),
        proxy,
        warren_server::ServerConfig::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let limits = warren_server::ListenerLimits::default();
        let _ = warren_server::serve(listener, app, limits, std::future::pending()).await;
    });

    let first = create(&base).await;
    // Leaves an idle pooled connection to the slot's address behind.
    assert_eq!(through_proxy(&base, &first).await, (200, first.clone()));

    let r = reqwest::Client::new()
        .delete(format!("{base}/sandboxes/{first}"))
        .header("X-API-KEY", API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);

    let second = create(&base).await;
    assert_ne!(first, second);
    // The first request to the new sandbox must not ride the killed one's connection.
    assert_eq!(through_proxy(&base, &second).await, (200, second.clone()));
    assert_eq!(through_proxy(&base, &second).await, (200, second));

    control.shutdown();
    server.abort();
}

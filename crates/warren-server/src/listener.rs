//! The TCP listener: connections are bounded in number (overall and per client address) and
//! in how long a client may take to send a request's headers, so nobody can hold the server's
//! file descriptors with half-sent requests without authenticating (threat model M10).
//!
//! hyper's header-read timeout also ends keep-alive connections that stay idle that long
//! (the timer starts when the server waits for the next request's head); streams in progress
//! (command output, file transfers, WebSockets) are not affected.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Limits of the listener.
#[derive(Debug, Clone)]
pub struct ListenerLimits {
    /// Open connections at once; more are closed as soon as they are accepted.
    pub max_connections: usize,
    /// Open connections from one client address.
    pub max_per_client: usize,
    /// Time a client has to send a request's headers (and an idle keep-alive connection to
    /// start its next request).
    pub header_timeout: Duration,
    /// How long a shutdown waits for requests in progress before it cuts them.
    pub shutdown_grace: Duration,
}

impl Default for ListenerLimits {
    fn default() -> Self {
        ListenerLimits {
            max_connections: 4096,
            max_per_client: 1024,
            header_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

/// Open connections per client address; an entry goes when its last connection closes.
#[derive(Default)]
struct PerClient(Mutex<HashMap<IpAddr, usize>>);

struct ClientSlot {
    table: Arc<PerClient>,
    ip: IpAddr,
    _permit: OwnedSemaphorePermit,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut map = self.table.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

impl PerClient {
    fn take(
        self: &Arc<Self>,
        ip: IpAddr,
        max: usize,
        permit: OwnedSemaphorePermit,
    ) -> Option<ClientSlot> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(ClientSlot {
            table: self.clone(),
            ip,
            _permit: permit,
        })
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets requests in progress finish
/// for `limits.shutdown_grace` and returns.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ListenerLimits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(20));
    let builder = Arc::new(builder);
    let total = Arc::new(Semaphore::new(limits.max_connections));
    let clients = Arc::new(PerClient::default());
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning; the connections in
                    // progress free descriptors as they end.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Some(slot) = admit(&total, &clients, peer, &limits) else {
            tracing::debug!(peer = %peer, "connection refused: listener is at its limit");
            drop(stream);
            continue;
        };
        if let Err(e) = stream.set_nodelay(true) {
            // Proxied stream envelopes are small: without TCP_NODELAY each waits for the
            // client's delayed ACK (~40 ms per command round trip).
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        spawn_connection(&builder, &graceful, stream, app.clone(), slot);
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(limits.shutdown_grace) => {
            tracing::info!("requests still in progress were cut at shutdown");
        }
    }
    Ok(())
}

fn admit(
    total: &Arc<Semaphore>,
    clients: &Arc<PerClient>,
    peer: SocketAddr,
    limits: &ListenerLimits,
) -> Option<ClientSlot> {
    let permit = total.clone().try_acquire_owned().ok()?;
    clients.take(peer.ip(), limits.max_per_client, permit)
}

fn spawn_connection(
    builder: &Arc<Builder<TokioExecutor>>,
    graceful: &GracefulShutdown,
    stream: TcpStream,
    app: Router,
    slot: ClientSlot,
) {
    let builder = builder.clone();
    let service = TowerToHyperService::new(app);
    let watcher = graceful.watcher();
    tokio::spawn(async move {
        let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
        if let Err(e) = watcher.watch(conn.into_owned()).await {
            tracing::debug!(error = %e, "connection ended with an error");
        }
        drop(slot);
    });
}

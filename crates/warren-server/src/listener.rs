//! The TCP listener: connections are bounded in number (overall and per client address) and
//! in how long a client may take to send a request's headers, so nobody can hold the server's
//! file descriptors with half-sent requests without authenticating (threat model M10).
//!
//! hyper's header-read timeout also ends keep-alive connections that stay idle that long
//! (the timer starts when the server waits for the next request's head); streams in progress
//! (command output, file transfers, WebSockets) are not affected.
//!
//! A second, TLS listener (domain mode: `https://{port}-{id}.{domain}`) serves the same
//! application under the same limits; its handshake must end within the header timeout too.
//! ALPN offers `h2` and `http/1.1`, and hyper serves what the client speaks.

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
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

/// A listener whose connections speak TLS, and the settings they are served with.
pub struct TlsListener {
    pub listener: TcpListener,
    pub config: Arc<rustls::ServerConfig>,
}

/// The TCP socket under a connection, in the extensions of each HTTP/1 request it carries,
/// so that a proxied response cut short (its sandbox killed or gone) ends the connection with
/// a reset instead of a clean close. Clients tell the two apart: a clean close in the middle
/// of a body reads as the server breaking HTTP's framing, a reset as the connection breaking,
/// which is what happened (the E2B SDKs then ask the sandbox's health and say it was killed).
/// Never on HTTP/2 requests: their connection carries other streams, and hyper resets just the
/// stream.
///
/// It holds a duplicate of the socket's descriptor (socket options are the socket's, shared by
/// both): the socket closes, with the reset, once hyper's descriptor and every copy of this
/// are gone, that is when the connection ends.
#[derive(Clone, Debug)]
pub struct ConnectionSocket(Arc<std::os::fd::OwnedFd>);

impl ConnectionSocket {
    fn of(stream: &TcpStream) -> Option<ConnectionSocket> {
        use std::os::fd::AsFd;
        match stream.as_fd().try_clone_to_owned() {
            Ok(fd) => Some(ConnectionSocket(Arc::new(fd))),
            Err(e) => {
                tracing::debug!(error = %warren_runtime::chain(&e), "could not keep a handle on the connection's socket");
                None
            }
        }
    }

    /// Makes the connection's close a reset (`SO_LINGER` with a zero timeout).
    pub fn reset_on_close(&self) {
        if let Err(e) = socket2::SockRef::from(&*self.0).set_linger(Some(Duration::ZERO)) {
            tracing::debug!(error = %warren_runtime::chain(&e), "could not set SO_LINGER");
        }
    }
}

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
    serve_all(listener, None, app, limits, shutdown).await
}

/// [`serve`] on a plain listener and, if given, a TLS one: one set of limits (connections
/// overall and per client count across both) and one shutdown.
pub async fn serve_all(
    listener: TcpListener,
    tls: Option<TlsListener>,
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
    let (tls_listener, acceptor) = match tls {
        Some(t) => (Some(t.listener), Some(TlsAcceptor::from(t.config))),
        None => (None, None),
    };
    tokio::pin!(shutdown);
    loop {
        let (accepted, over_tls) = tokio::select! {
            accepted = listener.accept() => (accepted, false),
            accepted = accept_or_wait(tls_listener.as_ref()) => (accepted, true),
            _ = &mut shutdown => break,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning; the connections in
                // progress free descriptors as they end.
                tracing::warn!(error = %warren_runtime::chain(&e), "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(slot) = admit(&total, &clients, peer, &limits) else {
            tracing::debug!(peer = %peer, "connection refused: listener is at its limit");
            drop(stream);
            continue;
        };
        if let Err(e) = stream.set_nodelay(true) {
            // Proxied stream envelopes are small: without TCP_NODELAY each waits for the
            // client's delayed ACK (~40 ms per command round trip).
            tracing::debug!(error = %warren_runtime::chain(&e), "could not set TCP_NODELAY");
        }
        let tls = if over_tls { acceptor.clone() } else { None };
        spawn_connection(
            &builder,
            &graceful,
            stream,
            tls,
            limits.header_timeout,
            app.clone(),
            slot,
        );
    }
    drop(listener);
    drop(tls_listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(limits.shutdown_grace) => {
            tracing::info!("requests still in progress were cut at shutdown");
        }
    }
    Ok(())
}

/// The next connection of `listener`; never, without one.
async fn accept_or_wait(
    listener: Option<&TcpListener>,
) -> std::io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
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
    tls: Option<TlsAcceptor>,
    handshake_timeout: Duration,
    app: Router,
    slot: ClientSlot,
) {
    let builder = builder.clone();
    let watcher = graceful.watcher();
    let socket = ConnectionSocket::of(&stream);
    tokio::spawn(async move {
        match tls {
            None => serve_connection(&builder, watcher, stream, socket, app).await,
            Some(acceptor) => {
                // A client that never finishes its handshake holds a slot no longer than one
                // that never finishes its request head.
                match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => serve_connection(&builder, watcher, tls, socket, app).await,
                    Ok(Err(e)) => {
                        tracing::debug!(error = %warren_runtime::chain(&e), "TLS handshake failed")
                    }
                    Err(_) => tracing::debug!("TLS handshake timed out"),
                }
            }
        }
        drop(slot);
    });
}

async fn serve_connection<I>(
    builder: &Builder<TokioExecutor>,
    watcher: hyper_util::server::graceful::Watcher,
    io: I,
    socket: Option<ConnectionSocket>,
    app: Router,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let app = tower::ServiceBuilder::new()
        .map_request(move |mut req: hyper::Request<hyper::body::Incoming>| {
            if let Some(socket) = socket
                .as_ref()
                .filter(|_| req.version() < hyper::Version::HTTP_2)
            {
                req.extensions_mut().insert(socket.clone());
            }
            req
        })
        .service(app);
    let service = TowerToHyperService::new(app);
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    if let Err(e) = watcher.watch(conn.into_owned()).await {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

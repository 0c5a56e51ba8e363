//! The transparent TCP proxy for sandboxes whose egress policy has rules by name.
//!
//! Their slots redirect every new TCP connection (except to addresses `allowOut` names as
//! such) to a listener the proxy holds inside the slot's own netns, where `SO_ORIGINAL_DST`
//! tells it where the sandbox meant to go. The proxy reads what the client says first: the
//! server name of a TLS ClientHello (SNI) or the `Host` of an HTTP request. With a name, the
//! name decides (REFUSED names get a reset) and an allowed one is *re-dialled by name*: the
//! proxy resolves it itself, pins those addresses and connects to them, so an address the
//! sandbox made up (an `/etc/hosts` entry, a name that shares an address with another)
//! gets it nowhere else. Without a name (another protocol, a client that waits for the
//! server to speak), the connection goes to the original destination and the slot's address
//! rules decide, as for any packet; if the client later sends a name after all, the name is
//! checked then.
//!
//! Upstream connections are opened inside the slot too, carrying [`MARK`]: the redirect
//! skips them and the slot's filter (policy, operator ranges, connection cap) applies to
//! them exactly as to the sandbox's own. Only the first request of a plain HTTP connection
//! and the TLS handshake's outer name are read: a request that names another host inside an
//! allowed name's TLS session still reaches only the allowed name's servers. Connections that
//! carry a rule's headers ([`crate::broker`]) are read request by request, and one naming
//! another host than the connection's ends it.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::OwnedFd;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockProtocol, SockType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{oneshot, Semaphore};
use tokio::task::JoinHandle;
use warren_runtime::egress::EgressPolicy;

use crate::broker::{Broker, Brokered};
use crate::error::{Error, Result};
use crate::flows::{now_ms, FlowLog};
use crate::netns::netns_path;
use crate::pins::Pins;
use crate::resolver::lookup_a;
use crate::rewrite::Scope;
use warren_runtime::flows::{Flow, FlowKind, FlowVerdict};

/// The proxy's port inside every slot. Below 1024, so a namespace sandbox (which lives in
/// that netns without CAP_NET_BIND_SERVICE over it) can never bind it first.
pub(crate) const PROXY_PORT: u16 = 988;
/// The mark of the proxy's upstream sockets ("wr" + 1). The sandbox cannot set marks (no
/// CAP_NET_ADMIN over the slot; a VM's packets arrive without one).
pub(crate) const MARK: u32 = 0x5772_0001;
/// How long a new connection may stay silent before it is treated as one whose server speaks
/// first (SSH, SMTP, MySQL) and sent on by address.
const FIRST_BYTES_WAIT: Duration = Duration::from_millis(300);
/// How long the client gets to complete its ClientHello or request head once it started.
const HEAD_WAIT: Duration = Duration::from_secs(5);
/// The most the proxy reads looking for a name.
const HEAD_LIMIT: usize = 64 * 1024;
/// Request methods that mark a connection as HTTP/1.
const HTTP_METHODS: [&[u8]; 9] = [
    b"GET ",
    b"POST ",
    b"PUT ",
    b"HEAD ",
    b"DELETE ",
    b"OPTIONS ",
    b"PATCH ",
    b"CONNECT ",
    b"TRACE ",
];
/// Bytes read at a time each way: big enough that a bulk download is not a syscall per 8 KiB.
const RELAY_BUF: usize = 256 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections a slot may have through the proxy at once, when the filter sets no cap.
const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// How a connection named its destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Via {
    Sni,
    Host,
}

impl Via {
    fn as_str(self) -> &'static str {
        match self {
            Via::Sni => "tls-sni",
            Via::Host => "http-host",
        }
    }
}

/// What the first bytes of a connection say.
#[derive(Debug, PartialEq, Eq)]
enum Head {
    NeedMore,
    Named(String, Via),
    /// Not TLS or HTTP, or no name in it (or an address for a name).
    Unnamed,
    /// TLS or HTTP that cannot be read (malformed, cut short, too long, or HTTP/2 without
    /// TLS): refused, since the server might find a name in it that the proxy did not.
    Unreadable(&'static str),
}

/// One proxied slot: its policy, its listener and the thread that makes sockets in its netns.
struct SlotProxy {
    names: Arc<EgressPolicy>,
    listener: JoinHandle<()>,
    maker: mpsc::Sender<MakeSocket>,
}

type MakeSocket = oneshot::Sender<io::Result<OwnedFd>>;

struct Shared {
    upstreams: Vec<Ipv4Addr>,
    broker: Option<Arc<Broker>>,
    pins: Arc<Pins>,
    flows: Arc<FlowLog>,
    max_connections: usize,
    slots: Mutex<HashMap<String, SlotProxy>>,
}

/// The pool's egress proxy; stops every slot's listener when dropped.
pub(crate) struct Proxy {
    shared: Arc<Shared>,
}

impl Proxy {
    pub(crate) fn new(
        upstreams: Vec<Ipv4Addr>,
        pins: Arc<Pins>,
        flows: Arc<FlowLog>,
        max_connections: u32,
        broker: Option<Arc<Broker>>,
    ) -> Self {
        let max_connections = match max_connections {
            0 => DEFAULT_MAX_CONNECTIONS,
            n => n as usize,
        };
        Self {
            shared: Arc::new(Shared {
                upstreams,
                broker,
                pins,
                flows,
                max_connections,
                slots: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Connections of `slot` are decided by `names` from now on (its listener started if it
    /// had none); `None`: the slot has no name rules any more, and the listener stops. Call
    /// before the slot's redirect is installed, from within the runtime.
    pub(crate) fn register(&self, slot: &str, names: Option<&EgressPolicy>) -> Result<()> {
        let Some(names) = names else {
            if let Some(gone) = self.shared.lock().remove(slot) {
                gone.listener.abort();
            }
            return Ok(());
        };
        let names = Arc::new(names.clone());
        if let Some(existing) = self.shared.lock().get_mut(slot) {
            existing.names = names;
            return Ok(());
        }
        let (listener, maker) = start_slot_thread(slot)?;
        let listener = TcpListener::from_std(listener).map_err(|e| proxy_error(slot, e))?;
        let task = tokio::spawn(serve(listener, slot.to_owned(), self.shared.clone()));
        let previous = self.shared.lock().insert(
            slot.to_owned(),
            SlotProxy {
                names,
                listener: task,
                maker,
            },
        );
        if let Some(p) = previous {
            p.listener.abort();
        }
        Ok(())
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        for (_, p) in self.shared.lock().drain() {
            p.listener.abort();
        }
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, SlotProxy>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn names(&self, slot: &str) -> Option<Arc<EgressPolicy>> {
        self.lock().get(slot).map(|p| p.names.clone())
    }

    fn maker(&self, slot: &str) -> Option<mpsc::Sender<MakeSocket>> {
        self.lock().get(slot).map(|p| p.maker.clone())
    }
}

fn proxy_error(slot: &str, source: io::Error) -> Error {
    Error::Proxy {
        slot: slot.to_owned(),
        source,
    }
}

/// A thread that lives in the slot's netns: it binds the listener, then makes a marked
/// socket for every request until the slot's entry (the last sender) goes away.
fn start_slot_thread(slot: &str) -> Result<(std::net::TcpListener, mpsc::Sender<MakeSocket>)> {
    let path = netns_path(slot);
    let (tx, rx) = mpsc::channel::<MakeSocket>();
    let (ready_tx, ready_rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("warren-net-proxy".into())
        .spawn(move || {
            let bound = crate::netns::enter(&path)
                .map_err(|e| io::Error::other(e.to_string()))
                .and_then(|()| std::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, PROXY_PORT)))
                .and_then(|l| l.set_nonblocking(true).map(|()| l));
            let ok = bound.is_ok();
            let _ = ready_tx.send(bound);
            if !ok {
                return;
            }
            while let Ok(reply) = rx.recv() {
                let _ = reply.send(marked_socket());
            }
        })
        .map_err(|e| proxy_error(slot, e))?;
    let listener = ready_rx
        .recv()
        .map_err(|_| proxy_error(slot, io::Error::other("the slot thread ended")))?
        .map_err(|e| proxy_error(slot, e))?;
    Ok((listener, tx))
}

/// A non-blocking TCP socket carrying [`MARK`], in the calling thread's netns.
fn marked_socket() -> io::Result<OwnedFd> {
    let fd = socket::socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        SockProtocol::Tcp,
    )?;
    socket::setsockopt(&fd, sockopt::Mark, &MARK)?;
    Ok(fd)
}

async fn serve(listener: TcpListener, slot: String, shared: Arc<Shared>) {
    let permits = Arc::new(Semaphore::new(shared.max_connections));
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::info!(target: "warren_net::flow", slot = %slot, verdict = "denied",
                reason = "too many connections", "TCP connection");
            reset(client);
            continue;
        };
        let (slot, shared) = (slot.clone(), shared.clone());
        tokio::spawn(async move {
            handle(client, &slot, &shared).await;
            drop(permit);
        });
    }
}

/// Ends the connection with a reset: the client fails at once instead of reading an
/// orderly end it could mistake for an empty answer.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

async fn handle(mut client: TcpStream, slot: &str, shared: &Shared) {
    let Some(dest) = original_destination(&client) else {
        // Connected to the proxy's port itself, not redirected to it.
        reset(client);
        return;
    };
    let Some(names) = shared.names(slot) else {
        reset(client);
        return;
    };
    let mut head = Vec::new();
    let first = read_head(&mut client, &mut head).await;
    if let Some(Head::Unreadable(reason)) = &first {
        shared.flow(slot, dest, None, None, FlowVerdict::Denied, reason);
        reset(client);
        return;
    }
    // A rule's host is always dialled by name, so its headers go only to its own servers;
    // with no name rules (a policy that has only header rules), other names keep the
    // address the sandbox chose. Its headers go over TLS, and over plain HTTP only where the
    // rule asks (the value would cross the network in clear text): other plain HTTP to the
    // host passes as the sandbox wrote it, like any allowed connection's.
    let rule_host = match &first {
        Some(Head::Named(name, _)) => names.rules.for_name(name),
        _ => None,
    };
    let rule = match (&first, rule_host) {
        (Some(Head::Named(name, via)), Some(r)) if *via == Via::Sni || r.plain_http() => {
            Some(Brokered {
                headers: r.headers().clone(),
                sandbox: shared.flows.owner(slot),
                scope: Scope {
                    name: name.clone(),
                    port: dest.port(),
                },
            })
        }
        _ => None,
    };
    let upstream = match &first {
        Some(Head::Named(name, via)) => {
            if !names.answers_name(name) {
                shared.flow(
                    slot,
                    dest,
                    Some(name),
                    Some(*via),
                    FlowVerdict::Denied,
                    "name not allowed",
                );
                reset(client);
                return;
            }
            if rule_host.is_some() || names.has_names() {
                dial_name(slot, shared, name, dest.port()).await
            } else {
                dial(slot, shared, dest).await
            }
        }
        _ => dial(slot, shared, dest).await,
    };
    let (name, via) = match &first {
        Some(Head::Named(n, v)) => (Some(n.as_str()), Some(*v)),
        _ => (None, None),
    };
    let mut upstream = match upstream {
        Ok(u) => u,
        Err(e) => {
            let reason = e.to_string();
            shared.flow(slot, dest, name, via, FlowVerdict::Denied, &reason);
            reset(client);
            return;
        }
    };
    if let (Some(rule), Some(name), Some(via)) = (&rule, name, via) {
        let Some(broker) = shared.broker.clone() else {
            // Policies with rules are refused where there is no broker; never relay
            // a request that was meant to carry a secret without it, or with it.
            shared.flow(
                slot,
                dest,
                Some(name),
                Some(via),
                FlowVerdict::Denied,
                "no broker",
            );
            reset(client);
            return;
        };
        shared.flow(
            slot,
            dest,
            Some(name),
            Some(via),
            FlowVerdict::Allowed,
            "headers set by a rule",
        );
        let ended = match via {
            Via::Host => broker.http(client, upstream, head, rule).await,
            Via::Sni => broker.https(client, upstream, head, name, rule).await,
        };
        if let Err(e) = ended {
            shared.flow(
                slot,
                dest,
                Some(name),
                Some(via),
                FlowVerdict::Denied,
                &e.to_string(),
            );
        }
        return;
    }
    let reason = if rule_host.is_some() {
        "plain HTTP: the rule's headers are set over TLS only"
    } else {
        ""
    };
    shared.flow(slot, dest, name, via, FlowVerdict::Allowed, reason);
    if !head.is_empty() && upstream.write_all(&head).await.is_err() {
        reset(client);
        return;
    }
    if first.is_none() {
        // The client was silent: the server may speak first. Relay its words until the
        // client says something, and check that for a name before it goes anywhere.
        match late_head(&mut client, &mut upstream, &names).await {
            Ok(Some((named, reason))) => {
                let (name, via) = match &named {
                    Some((n, v)) => (Some(n.as_str()), Some(*v)),
                    None => (None, None),
                };
                shared.flow(slot, dest, name, via, FlowVerdict::Denied, reason);
                reset(client);
                let _ = upstream.set_zero_linger();
                return;
            }
            Ok(None) => {}
            Err(_) => {
                reset(client);
                return;
            }
        }
    }
    relay(client, upstream).await;
}

/// Copies both ways until both sides are done; a reset on one side (a new policy cut the
/// upstream connection) is passed on as a reset to the other.
async fn relay(mut client: TcpStream, mut upstream: TcpStream) {
    if tokio::io::copy_bidirectional_with_sizes(&mut client, &mut upstream, RELAY_BUF, RELAY_BUF)
        .await
        .is_err()
    {
        reset(client);
        let _ = upstream.set_zero_linger();
    }
}

impl Shared {
    /// Logs a decision about a connection and records it in the flow log.
    fn flow(
        &self,
        slot: &str,
        dest: SocketAddrV4,
        name: Option<&str>,
        via: Option<Via>,
        verdict: FlowVerdict,
        reason: &str,
    ) {
        let via = via.map(Via::as_str).unwrap_or("address");
        tracing::info!(target: "warren_net::flow", slot, %dest, name = name.unwrap_or(""),
            via, ?verdict, reason, "TCP connection");
        self.flows.record(
            slot,
            Flow {
                at_ms: now_ms(),
                kind: FlowKind::Tcp,
                verdict,
                name: name.map(str::to_owned),
                destination: Some(dest.to_string()),
                addresses: Vec::new(),
                via: via.into(),
                reason: (!reason.is_empty()).then(|| reason.to_owned()),
            },
        );
    }
}

/// Where the client meant to go, or `None` if it was not redirected here.
fn original_destination(client: &TcpStream) -> Option<SocketAddrV4> {
    let raw = socket::getsockopt(client, sockopt::OriginalDst).ok()?;
    let dest = SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(raw.sin_addr.s_addr)),
        u16::from_be(raw.sin_port),
    );
    match client.local_addr().ok()? {
        SocketAddr::V4(local) if local == dest => None,
        _ => Some(dest),
    }
}

/// Reads until the client's first bytes show a name or show there is none. `None`: the
/// client said nothing for [`FIRST_BYTES_WAIT`].
async fn read_head(client: &mut TcpStream, head: &mut Vec<u8>) -> Option<Head> {
    let mut buf = [0u8; 4096];
    match tokio::time::timeout(FIRST_BYTES_WAIT, client.read(&mut buf)).await {
        Ok(Ok(n)) if n > 0 => head.extend_from_slice(&buf[..n]),
        Ok(_) => return Some(Head::Unnamed),
        Err(_) => return None,
    }
    Some(complete_head(client, head).await)
}

/// Reads more of a head that has begun until it can be classified.
async fn complete_head(client: &mut TcpStream, head: &mut Vec<u8>) -> Head {
    let deadline = tokio::time::Instant::now() + HEAD_WAIT;
    let mut buf = [0u8; 4096];
    loop {
        match classify(head) {
            Head::NeedMore if head.len() < HEAD_LIMIT => {}
            Head::NeedMore => return Head::Unreadable("request head too large"),
            done => return done,
        }
        match tokio::time::timeout_at(deadline, client.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => head.extend_from_slice(&buf[..n]),
            _ => return Head::Unreadable("request head cut short"),
        }
    }
}

/// For a client that let the server speak first: relays the server's bytes to it until it
/// sends its own, then returns why those are refused (`Some`: a name the policy denies, or a
/// head that cannot be read), or forwards them (`None`).
async fn late_head(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    names: &EgressPolicy,
) -> io::Result<Option<(Option<(String, Via)>, &'static str)>> {
    let mut from_server = [0u8; 4096];
    let mut from_client = [0u8; 4096];
    loop {
        tokio::select! {
            n = upstream.read(&mut from_server) => {
                let n = n?;
                if n == 0 {
                    return Ok(None);
                }
                client.write_all(&from_server[..n]).await?;
            }
            n = client.read(&mut from_client) => {
                let n = n?;
                if n == 0 {
                    return Ok(None);
                }
                let mut head = from_client[..n].to_vec();
                match complete_head(client, &mut head).await {
                    Head::Named(name, via) if !names.answers_name(&name) => {
                        return Ok(Some((Some((name, via)), "name not allowed")));
                    }
                    Head::Unreadable(reason) => return Ok(Some((None, reason))),
                    _ => {}
                }
                upstream.write_all(&head).await?;
                return Ok(None);
            }
        }
    }
}

/// What the first bytes of a connection say about where it goes.
fn classify(head: &[u8]) -> Head {
    match head.first() {
        None => Head::NeedMore,
        // A TLS handshake record.
        Some(0x16) => tls_server_name(head),
        _ if head.starts_with(b"PRI * HTTP/2.0") => Head::Unreadable("HTTP/2 without TLS"),
        _ if HTTP_METHODS.iter().any(|m| head.starts_with(m)) => http_host(head),
        // A method cut short ("GE").
        _ if head.len() < 8 && HTTP_METHODS.iter().any(|m| m.starts_with(head)) => Head::NeedMore,
        _ if head.len() < 14 && b"PRI * HTTP/2.0".starts_with(head) => Head::NeedMore,
        _ => Head::Unnamed,
    }
}

fn tls_server_name(head: &[u8]) -> Head {
    let mut acceptor = rustls::server::Acceptor::default();
    let mut rest = head;
    loop {
        match acceptor.read_tls(&mut rest) {
            Ok(0) => return Head::NeedMore,
            Ok(_) => {}
            Err(_) => return Head::Unreadable("unreadable TLS handshake"),
        }
        match acceptor.accept() {
            Ok(Some(accepted)) => {
                return match accepted.client_hello().server_name() {
                    Some(name) => named(name, Via::Sni),
                    None => Head::Unnamed,
                }
            }
            Ok(None) if rest.is_empty() => return Head::NeedMore,
            Ok(None) => {}
            Err(_) => return Head::Unreadable("unreadable TLS handshake"),
        }
    }
}

fn http_host(head: &[u8]) -> Head {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Head::NeedMore,
        Err(_) => return Head::Unreadable("unreadable HTTP request"),
    }
    let host = request
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("host"))
        .and_then(|h| std::str::from_utf8(h.value).ok());
    match host {
        Some(h) => named(strip_port(h.trim()), Via::Host),
        None => Head::Unnamed,
    }
}

/// `name[:port]` without the port; bracketed IPv6 literals are returned whole.
fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host;
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// A name as policies match it, or `Unnamed` for an address (the address rules decide).
fn named(name: &str, via: Via) -> Head {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if name.is_empty() || name.parse::<Ipv4Addr>().is_ok() || name.starts_with('[') {
        return Head::Unnamed;
    }
    Head::Named(name, via)
}

/// Connects to `name`'s own addresses (as the upstream servers give them, pinned first so
/// the slot's filter lets them pass) on `port`.
async fn dial_name(slot: &str, shared: &Shared, name: &str, port: u16) -> io::Result<TcpStream> {
    let (ips, ttl) = lookup_a(&shared.upstreams, name).await;
    if ips.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "the name has no address",
        ));
    }
    shared
        .pins
        .ensure(slot, &ips, ttl)
        .await
        .map_err(|e| io::Error::other(e.to_string()))?;
    let mut last = None;
    for ip in ips {
        match dial(slot, shared, SocketAddrV4::new(ip, port)).await {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no address")))
}

/// Connects to `to` from inside the slot, as the sandbox would.
async fn dial(slot: &str, shared: &Shared, to: SocketAddrV4) -> io::Result<TcpStream> {
    let maker = shared
        .maker(slot)
        .ok_or_else(|| io::Error::other("the slot is no longer proxied"))?;
    let (tx, rx) = oneshot::channel();
    maker
        .send(tx)
        .map_err(|_| io::Error::other("the slot thread ended"))?;
    let fd = rx
        .await
        .map_err(|_| io::Error::other("the slot thread ended"))??;
    let socket = TcpSocket::from_std_stream(std::net::TcpStream::from(fd));
    match tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(SocketAddr::V4(to))).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_heads_name_their_host_without_the_port() {
        let req = b"GET / HTTP/1.1\r\nHost: Allowed.Test:8080\r\nAccept: */*\r\n\r\n";
        assert_eq!(classify(req), Head::Named("allowed.test".into(), Via::Host));
        assert_eq!(classify(&req[..20]), Head::NeedMore);
        assert_eq!(
            classify(b"GET / HTTP/1.1\r\nHost: 203.0.113.7\r\n\r\n"),
            Head::Unnamed
        );
        assert_eq!(classify(b"GET / HTTP/1.0\r\n\r\n"), Head::Unnamed);
        assert_eq!(classify(b"SSH-2.0-OpenSSH_9.2\r\n"), Head::Unnamed);
        assert_eq!(classify(b"\x00\x01binary"), Head::Unnamed);
        assert_eq!(classify(b"GE"), Head::NeedMore);
        assert_eq!(
            classify(b"GET / HTTP/1.1\r\nHost: a.test\r\nBad\x01: x\r\n\r\n"),
            Head::Unreadable("unreadable HTTP request")
        );
        assert_eq!(
            classify(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
            Head::Unreadable("HTTP/2 without TLS")
        );
        assert_eq!(strip_port("[::1]:80"), "[::1]:80");
        assert_eq!(strip_port("a.test"), "a.test");
    }

    /// A ClientHello as a real client writes it, made by rustls itself.
    fn client_hello(name: &str) -> Vec<u8> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let server = rustls::pki_types::ServerName::try_from(name.to_owned()).unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), server).unwrap();
        let mut out = Vec::new();
        conn.write_tls(&mut out).unwrap();
        out
    }

    #[test]
    fn tls_hellos_name_their_server() {
        let hello = client_hello("allowed.test");
        assert_eq!(
            classify(&hello),
            Head::Named("allowed.test".into(), Via::Sni)
        );
        assert_eq!(classify(&hello[..hello.len() / 2]), Head::NeedMore);
        // An address as the server name carries no SNI at all.
        assert_eq!(classify(&client_hello("192.0.2.1")), Head::Unnamed);
        assert_eq!(
            classify(b"\x16\x03\x01\x00\x05garbage"),
            Head::Unreadable("unreadable TLS handshake")
        );
    }
}

//! The pool's DNS resolver for sandboxes whose egress policy has rules by name.
//!
//! Their slots redirect every DNS query (port 53, UDP and TCP, to any address) here; the
//! slot's host-side address (what the slot's NAT makes the query come from) says whose policy
//! decides. A name the policy does not allow gets REFUSED without anything being sent
//! upstream, so a sandbox that may reach only some names learns nothing else and cannot
//! tunnel data out through queries. An allowed one is forwarded to the pool's upstream
//! servers, the IPv4 addresses of the answer are pinned in the slot (reachable on any port
//! until their TTL ends) and then the answer is returned. Queries from anyone else are
//! dropped. Every query is logged (target `warren_net::dns`).
//!
//! Slots with private-network peers are redirected here too: names under `.internal` are
//! answered from the slot's own table (`<id>.<network>.internal`, aliases), never forwarded;
//! other names are forwarded unless the sandbox's policy denies everything (or, with rules
//! by name, decided by them as above).

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::task::JoinHandle;
use warren_runtime::egress::EgressPolicy;

use crate::error::{Error, Result};
use crate::flows::{now_ms, FlowLog};
use crate::pins::Pins;
use warren_runtime::flows::{Flow, FlowKind, FlowVerdict};

/// How long an upstream server gets to answer before the next one is asked.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);
/// A TCP client gets this long to send its query.
const TCP_READ_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone)]
struct Client {
    slot: String,
    /// Rules by name, when the sandbox has them.
    names: Option<Arc<EgressPolicy>>,
    /// Without rules by name: whether other names are forwarded (not when the policy denies
    /// everything).
    forward: bool,
    /// Private-network names and their addresses.
    internal: Arc<BTreeMap<String, Ipv4Addr>>,
}

impl Client {
    fn is_empty(&self) -> bool {
        self.names.is_none() && self.internal.is_empty()
    }
}

struct Shared {
    pins: Arc<Pins>,
    flows: Arc<FlowLog>,
    upstreams: Vec<Ipv4Addr>,
    /// By the slot's host-side address.
    clients: Mutex<HashMap<Ipv4Addr, Client>>,
}

/// A running resolver (UDP and TCP on one port of every host address); stops when dropped.
pub(crate) struct Resolver {
    port: u16,
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

impl Resolver {
    /// Binds a free port (UDP and TCP) and starts answering; the addresses of allowed names
    /// go into `pins`.
    pub(crate) async fn start(
        pins: Arc<Pins>,
        flows: Arc<FlowLog>,
        upstreams: Vec<Ipv4Addr>,
    ) -> Result<Self> {
        let (udp, tcp) = bind_pair().await?;
        let port = udp
            .local_addr()
            .map_err(|e| Error::Resolver {
                what: "read the resolver's port",
                source: e,
            })?
            .port();
        let shared = Arc::new(Shared {
            pins,
            flows,
            upstreams,
            clients: Mutex::new(HashMap::new()),
        });
        let tasks = vec![
            tokio::spawn(serve_udp(Arc::new(udp), shared.clone())),
            tokio::spawn(serve_tcp(tcp, shared.clone())),
        ];
        Ok(Self {
            port,
            shared,
            tasks,
        })
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Queries from `host_side` (slot `slot`) are decided by `names` from now on (`None`:
    /// the slot has no name rules; then other names are forwarded unless `denies_all`).
    pub(crate) fn register(
        &self,
        host_side: Ipv4Addr,
        slot: &str,
        names: Option<&EgressPolicy>,
        denies_all: bool,
    ) {
        self.update(host_side, slot, |c| {
            c.names = names.map(|n| Arc::new(n.clone()));
            c.forward = !denies_all;
        });
    }

    /// The private-network names `host_side`'s sandbox resolves (empty: none).
    pub(crate) fn register_internal(
        &self,
        host_side: Ipv4Addr,
        slot: &str,
        internal: &BTreeMap<String, Ipv4Addr>,
    ) {
        self.update(host_side, slot, |c| c.internal = Arc::new(internal.clone()));
    }

    /// Forgets `host_side` (its slot is released).
    pub(crate) fn forget(&self, host_side: Ipv4Addr) {
        self.clients().remove(&host_side);
    }

    fn clients(&self) -> std::sync::MutexGuard<'_, HashMap<Ipv4Addr, Client>> {
        self.shared
            .clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn update(&self, host_side: Ipv4Addr, slot: &str, change: impl FnOnce(&mut Client)) {
        let mut clients = self.clients();
        let mut client = clients.remove(&host_side).unwrap_or_else(|| Client {
            slot: slot.to_owned(),
            names: None,
            forward: true,
            internal: Arc::default(),
        });
        client.slot = slot.to_owned();
        change(&mut client);
        // A slot with neither is not redirected here: its queries are dropped.
        if !client.is_empty() {
            clients.insert(host_side, client);
        }
    }
}

impl Drop for Resolver {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// A UDP and a TCP socket on the same free port.
async fn bind_pair() -> Result<(UdpSocket, TcpListener)> {
    let mut last = None;
    for _ in 0..16 {
        let udp = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
            .await
            .map_err(|e| Error::Resolver {
                what: "bind the resolver's UDP socket",
                source: e,
            })?;
        let port = udp
            .local_addr()
            .map_err(|e| Error::Resolver {
                what: "read the resolver's port",
                source: e,
            })?
            .port();
        match TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).await {
            Ok(tcp) => return Ok((udp, tcp)),
            // Someone holds that TCP port: another free UDP port, then.
            Err(e) => last = Some(e),
        }
    }
    Err(Error::Resolver {
        what: "bind the resolver's TCP socket",
        source: last.unwrap_or_else(|| std::io::Error::other("no free port")),
    })
}

fn client_of(shared: &Shared, peer: SocketAddr) -> Option<Client> {
    let SocketAddr::V4(peer) = peer else {
        return None;
    };
    shared
        .clients
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(peer.ip())
        .cloned()
}

async fn serve_udp(socket: Arc<UdpSocket>, shared: Arc<Shared>) {
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, peer)) = socket.recv_from(&mut buf).await else {
            continue;
        };
        let Some(client) = client_of(&shared, peer) else {
            continue;
        };
        let query = buf[..n].to_vec();
        let (socket, shared) = (socket.clone(), shared.clone());
        tokio::spawn(async move {
            if let Some(answer) = answer(&shared, &client, &query, Transport::Udp).await {
                let _ = socket.send_to(&answer, peer).await;
            }
        });
    }
}

async fn serve_tcp(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((mut stream, peer)) = listener.accept().await else {
            continue;
        };
        let Some(client) = client_of(&shared, peer) else {
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            // One query per connection is what stub resolvers send; more are answered in turn.
            while let Ok(Ok(query)) =
                tokio::time::timeout(TCP_READ_TIMEOUT, read_framed(&mut stream)).await
            {
                let Some(answer) = answer(&shared, &client, &query, Transport::Tcp).await else {
                    return;
                };
                if write_framed(&mut stream, &answer).await.is_err() {
                    return;
                }
            }
        });
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Transport {
    Udp,
    Tcp,
}

/// The answer to `query` from `client`, or `None` to stay silent (not a query, or no
/// upstream answered).
async fn answer(shared: &Shared, client: &Client, query: &[u8], via: Transport) -> Option<Vec<u8>> {
    let msg = Message::from_vec(query).ok()?;
    let q = msg.queries().first()?;
    let name = q
        .name()
        .to_ascii()
        .trim_end_matches('.')
        .to_ascii_lowercase();
    let kind = q.query_type();
    if warren_runtime::peers::is_internal_name(&name) {
        return Some(answer_internal(shared, client, &msg, &name));
    }
    let allowed = match &client.names {
        Some(names) => names.answers_name(&name),
        None => client.forward,
    };
    if !allowed {
        tracing::info!(target: "warren_net::dns", slot = %client.slot, %name, ?kind,
            verdict = "refused", "DNS query");
        shared
            .flows
            .record(&client.slot, dns_flow(&name, FlowVerdict::Denied, &[]));
        let mut refused = Message::error_msg(msg.id(), msg.op_code(), ResponseCode::Refused);
        refused.add_queries(msg.queries().to_vec());
        refused.set_recursion_desired(msg.recursion_desired());
        return refused.to_vec().ok();
    }
    let reply = forward(&shared.upstreams, query, via).await?;
    let parsed = Message::from_vec(&reply).ok()?;
    if parsed.id() != msg.id() {
        return None;
    }
    let (ips, ttl) = a_records(&parsed);
    tracing::info!(target: "warren_net::dns", slot = %client.slot, %name, ?kind,
        verdict = "answered", addresses = ?ips, "DNS query");
    shared
        .flows
        .record(&client.slot, dns_flow(&name, FlowVerdict::Allowed, &ips));
    // Pins matter only to rules by name (an open policy reaches every address anyway).
    if !ips.is_empty() && client.names.is_some() {
        // Before the answer goes out, so the sandbox's very next connect finds the pin.
        if let Err(e) = shared.pins.ensure(&client.slot, &ips, ttl).await {
            tracing::warn!(slot = %client.slot, %name, error = %e,
                "could not pin the addresses of an allowed name");
        }
    }
    Some(reply)
}

/// The answer to a question for a private-network name, from the slot's own table: its
/// address for A, an empty answer for other types of a known name, NXDOMAIN otherwise.
fn answer_internal(shared: &Shared, client: &Client, msg: &Message, name: &str) -> Vec<u8> {
    let found = client.internal.get(name).copied();
    let mut reply = Message::new();
    reply
        .set_id(msg.id())
        .set_message_type(MessageType::Response)
        .set_op_code(msg.op_code())
        .set_recursion_desired(msg.recursion_desired())
        .set_recursion_available(true)
        .set_authoritative(true)
        .add_queries(msg.queries().to_vec());
    match found {
        Some(ip) => {
            if let Some(q) = msg
                .queries()
                .first()
                .filter(|q| q.query_type() == RecordType::A)
            {
                // A short TTL: a peer's address is stable, but membership is not.
                reply.add_answer(hickory_proto::rr::Record::from_rdata(
                    q.name().clone(),
                    5,
                    RData::A(ip.into()),
                ));
            }
        }
        None => {
            reply.set_response_code(ResponseCode::NXDomain);
        }
    }
    let ips: Vec<Ipv4Addr> = found.into_iter().collect();
    let verdict = if found.is_some() {
        FlowVerdict::Allowed
    } else {
        FlowVerdict::Denied
    };
    tracing::info!(target: "warren_net::dns", slot = %client.slot, %name,
        verdict = if found.is_some() { "answered" } else { "unknown" }, addresses = ?ips,
        "DNS query (private network)");
    let mut flow = dns_flow(name, verdict, &ips);
    if found.is_none() {
        flow.reason = Some("no such private-network name".into());
    }
    shared.flows.record(&client.slot, flow);
    reply.to_vec().unwrap_or_default()
}

fn dns_flow(name: &str, verdict: FlowVerdict, ips: &[Ipv4Addr]) -> Flow {
    Flow {
        at_ms: now_ms(),
        kind: FlowKind::Dns,
        verdict,
        name: Some(name.to_owned()),
        destination: None,
        addresses: ips.iter().map(ToString::to_string).collect(),
        via: "dns".into(),
        reason: (verdict == FlowVerdict::Denied).then(|| "name not allowed".into()),
    }
}

/// The upstream answer to `query`: over UDP, and again over TCP when a TCP client's answer
/// was truncated (a UDP client gets the truncated one and retries over TCP itself).
async fn forward(upstreams: &[Ipv4Addr], query: &[u8], via: Transport) -> Option<Vec<u8>> {
    let reply = ask(upstreams, query, Transport::Udp).await?;
    if via == Transport::Tcp && Message::from_vec(&reply).is_ok_and(|m| m.truncated()) {
        return ask(upstreams, query, Transport::Tcp).await.or(Some(reply));
    }
    Some(reply)
}

/// The IPv4 addresses `name` has and the shortest TTL among them, asked of the upstream
/// servers directly (the egress proxy re-dials a name this way rather than trusting the
/// address the sandbox connected to). Empty when the name has none or nobody answered.
pub(crate) async fn lookup_a(upstreams: &[Ipv4Addr], name: &str) -> (Vec<Ipv4Addr>, u32) {
    let none = (Vec::new(), 0);
    let Ok(qname) = Name::from_ascii(format!("{}.", name.trim_end_matches('.'))) else {
        return none;
    };
    let mut msg = Message::new();
    msg.set_id(rand_id())
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true)
        .add_query(Query::query(qname, RecordType::A));
    let Ok(query) = msg.to_vec() else {
        return none;
    };
    let Some(reply) = forward(upstreams, &query, Transport::Udp).await else {
        return none;
    };
    match Message::from_vec(&reply) {
        Ok(m) if m.id() == msg.id() => a_records(&m),
        _ => none,
    }
}

/// The A records of an answer and their shortest TTL.
fn a_records(answer: &Message) -> (Vec<Ipv4Addr>, u32) {
    let mut ttl = u32::MAX;
    let ips = answer
        .answers()
        .iter()
        .filter_map(|r| match r.data() {
            RData::A(a) => {
                ttl = ttl.min(r.ttl());
                Some(a.0)
            }
            _ => None,
        })
        .collect();
    (ips, ttl)
}

/// A random query id, so an off-path sender cannot guess it and forge the answer.
fn rand_id() -> u16 {
    let mut b = [0u8; 2];
    // No entropy (never on Linux): a fixed id still gets an answer, only a guessable one.
    let _ = getrandom::fill(&mut b);
    u16::from_ne_bytes(b)
}

/// The first upstream answer to `query` over `via`.
async fn ask(upstreams: &[Ipv4Addr], query: &[u8], via: Transport) -> Option<Vec<u8>> {
    for server in upstreams {
        let to = SocketAddrV4::new(*server, 53);
        let attempt = async {
            match via {
                Transport::Udp => {
                    let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).await?;
                    s.connect(to).await?;
                    s.send(query).await?;
                    let mut buf = vec![0u8; 4096];
                    let n = s.recv(&mut buf).await?;
                    buf.truncate(n);
                    Ok::<_, std::io::Error>(buf)
                }
                Transport::Tcp => {
                    let mut s = TcpStream::connect(to).await?;
                    write_framed(&mut s, query).await?;
                    read_framed(&mut s).await
                }
            }
        };
        match tokio::time::timeout(UPSTREAM_TIMEOUT, attempt).await {
            Ok(Ok(reply)) => return Some(reply),
            Ok(Err(e)) => tracing::debug!(%server, error = %e, "DNS upstream failed"),
            Err(_) => tracing::debug!(%server, "DNS upstream timed out"),
        }
    }
    None
}

/// One DNS message over TCP: a two-byte length, then the message.
async fn read_framed(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let len = s.read_u16().await?;
    let mut buf = vec![0u8; usize::from(len)];
    s.read_exact(&mut buf).await?;
    Ok(buf)
}

async fn write_framed(s: &mut TcpStream, msg: &[u8]) -> std::io::Result<()> {
    let len = u16::try_from(msg.len()).map_err(|_| std::io::Error::other("message too long"))?;
    let mut out = Vec::with_capacity(msg.len() + 2);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(msg);
    s.write_all(&out).await
}

//! The sandbox proxy (`e2b-compat.md` §1.7, §3.8).
//!
//! A request is for a sandbox when it carries `E2b-Sandbox-Id` (+ `E2b-Sandbox-Port`, default
//! 49983) or its Host is `{port}-{id}.{domain}`. It is then streamed, both directions and
//! without buffering, to the sandbox's address on that port over a pooled HTTP/1.1 connection
//! (clients may speak HTTP/1.1 or h2c to us). WebSocket and other upgrades are spliced. When
//! the sandbox is killed its route's cancellation token fires and every open stream is cut
//! abruptly, so SDKs see an aborted stream and then `502 The sandbox was not found`. A pause
//! cuts streams the same way; a paused sandbox with `autoResume` is resumed by its next request.
//!
//! Connections are pooled per route, not per address: a runtime hands a freed address (a
//! network slot) to the next sandbox, and a killed VM closes none of its TCP connections, so a
//! pool keyed by address would send the next sandbox's first requests down a dead sandbox's
//! connections. A route's pool is dropped, closing its idle connections, when the route ends.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode, Uri, Version};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio_util::sync::CancellationToken;

use crate::error::ApiError;
use crate::ingress;
use crate::AppState;

use warren_types::SandboxId;
pub use warren_types::AGENT_PORT;

/// Largest `/metrics` answer read from an agent (a real one is a few hundred bytes).
const METRICS_BODY_LIMIT: usize = 64 * 1024;

const SANDBOX_ID: &str = "e2b-sandbox-id";
const SANDBOX_PORT: &str = "e2b-sandbox-port";

/// Headers that describe one hop, not the message (RFC 9110 §7.6.1), plus h2's `te`.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
];

pub struct Proxy {
    connector: HttpConnector,
    /// Unpooled: the metrics of a sandbox are read rarely, by address only.
    metrics_client: Client<HttpConnector, Body>,
    /// Per sandbox id, the pool of its current route.
    pools: Arc<Mutex<HashMap<String, RoutePool>>>,
    domain: Option<String>,
}

/// The connections of one route (one run of a sandbox: a resume gets a new route).
struct RoutePool {
    /// Identifies the route: the control plane makes a new `Access` for every route, and
    /// holding it here keeps the comparison sound (its address cannot be reused meanwhile).
    access: Arc<warren_control::Access>,
    client: Client<HttpConnector, Body>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Which sandbox and port a request is for.
#[derive(Debug, PartialEq, Eq)]
struct Target {
    id: String,
    port: u16,
}

/// `host[:port]` without the port.
fn strip_port(host: &str) -> &str {
    host.rsplit_once(':').map_or(host, |(h, p)| {
        if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) {
            h
        } else {
            host
        }
    })
}

impl Proxy {
    pub fn new(domain: Option<String>) -> Proxy {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        let metrics_client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build(connector.clone());
        Proxy {
            connector,
            metrics_client,
            pools: Arc::default(),
            domain,
        }
    }

    /// The client whose pool belongs to `route` of sandbox `id`; made on the route's first
    /// request, and dropped with its idle connections when the route is cancelled (or a newer
    /// route of the same sandbox replaces it).
    fn client_for(&self, id: &str, route: &warren_control::Route) -> Client<HttpConnector, Body> {
        let mut pools = lock(&self.pools);
        if let Some(p) = pools.get(id) {
            if Arc::ptr_eq(&p.access, &route.access) {
                return p.client.clone();
            }
        }
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(self.connector.clone());
        pools.insert(
            id.to_string(),
            RoutePool {
                access: route.access.clone(),
                client: client.clone(),
            },
        );
        let (pools, id, access, cancel) = (
            Arc::downgrade(&self.pools),
            id.to_string(),
            route.access.clone(),
            route.cancel.clone(),
        );
        tokio::spawn(async move {
            cancel.cancelled().await;
            let Some(pools) = pools.upgrade() else {
                return;
            };
            let mut pools = lock(&pools);
            if pools
                .get(&id)
                .is_some_and(|p| Arc::ptr_eq(&p.access, &access))
            {
                pools.remove(&id);
            }
        });
        client
    }

    /// Where a request with these headers and URI goes: `Ok(None)` to the API, else the
    /// sandbox id and port; `Err` when it names a host this server refuses or carries unusable
    /// routing headers. The proxy's routing as one call, for its fuzz target.
    pub fn route_target(
        &self,
        headers: &HeaderMap,
        uri: &Uri,
    ) -> Result<Option<(String, u16)>, ApiError> {
        if !self.known_host(headers, uri) {
            return Err(ApiError::new(
                StatusCode::MISDIRECTED_REQUEST,
                "unknown host",
            ));
        }
        Ok(self.target(headers, uri)?.map(|t| (t.id, t.port)))
    }

    /// `Err` = the routing headers are present but unusable (the caller gets 400).
    fn target(&self, headers: &HeaderMap, uri: &Uri) -> Result<Option<Target>, ApiError> {
        if let Some(id) = headers.get(SANDBOX_ID) {
            let id = id.to_str().ok().filter(|s| SandboxId::is_valid(s));
            let id = id.ok_or_else(|| ApiError::bad_request("invalid E2b-Sandbox-Id header"))?;
            let port = match headers.get(SANDBOX_PORT) {
                None => AGENT_PORT,
                Some(p) => p
                    .to_str()
                    .ok()
                    .and_then(|p| p.parse().ok())
                    .ok_or_else(|| ApiError::bad_request("invalid E2b-Sandbox-Port header"))?,
            };
            // Some SDK releases (e2b 2.x before the v2 connect) send the API's own connect call
            // with the routing headers of the sandbox it resumes; the agent has no such
            // paths, so these go to the API.
            if port == AGENT_PORT && is_api_sandbox_path(uri.path()) {
                return Ok(None);
            }
            return Ok(Some(Target {
                id: id.to_string(),
                port,
            }));
        }
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| uri.host())
            .unwrap_or_default();
        Ok(self.parse_host(host))
    }

    /// With `--domain` set, a request must name that domain, one of its subdomains, `localhost`
    /// or an IP address: a browser tricked into sending another name here (DNS rebinding)
    /// is turned away before anything is routed.
    fn known_host(&self, headers: &HeaderMap, uri: &Uri) -> bool {
        let Some(domain) = &self.domain else {
            return true;
        };
        let Some(host) = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| uri.host())
        else {
            // HTTP/1.0 without Host: nothing to rebind.
            return true;
        };
        let host = strip_port(host);
        let name = host.trim_end_matches('.');
        name.parse::<std::net::IpAddr>().is_ok()
            || (name.starts_with('[') && name.ends_with(']'))
            || name.eq_ignore_ascii_case("localhost")
            || name.eq_ignore_ascii_case(domain)
            || name.len().checked_sub(domain.len() + 1).is_some_and(|cut| {
                name.as_bytes()[cut] == b'.' && name[cut + 1..].eq_ignore_ascii_case(domain)
            })
    }

    /// `{port}-{id}.{domain}[:listen-port]`.
    fn parse_host(&self, host: &str) -> Option<Target> {
        let host = strip_port(host);
        let (label, rest) = host.split_once('.')?;
        if let Some(domain) = &self.domain {
            if !rest.eq_ignore_ascii_case(domain) {
                return None;
            }
        }
        let (port, id) = label.split_once('-')?;
        let port: u16 = port.parse().ok()?;
        SandboxId::is_valid(id).then(|| Target {
            id: id.to_string(),
            port,
        })
    }

    /// `GET path` on a sandbox's agent: the answer's body. The agent answers from inside the
    /// sandbox, so its answer is hostile input: the whole exchange, body included, is bounded
    /// in time and size.
    async fn agent_get(
        &self,
        agent: SocketAddr,
        token: &str,
        path: &str,
        limit: usize,
    ) -> Result<bytes::Bytes, ApiError> {
        let unavailable = |what: String| ApiError::new(StatusCode::BAD_GATEWAY, what);
        let req = Request::get(format!("http://{agent}{path}"))
            .header("x-access-token", token)
            .body(Body::empty())
            .map_err(|e| unavailable(format!("building the agent request: {e}")))?;
        let exchange = async {
            let resp = self
                .metrics_client
                .request(req)
                .await
                .map_err(|e| unavailable(format!("sandbox agent unreachable: {e}")))?;
            if !resp.status().is_success() {
                return Err(unavailable(format!(
                    "sandbox agent answered {}",
                    resp.status()
                )));
            }
            http_body_util::Limited::new(resp.into_body(), limit)
                .collect()
                .await
                .map(|b| b.to_bytes())
                .map_err(|e| unavailable(format!("reading the agent's answer: {e}")))
        };
        tokio::time::timeout(Duration::from_secs(10), exchange)
            .await
            .map_err(|_| unavailable("sandbox agent did not answer in time".into()))?
    }

    /// A sandbox agent's own view of its resources (`GET /metrics` on the agent).
    pub async fn agent_metrics(
        &self,
        agent: SocketAddr,
        token: &str,
    ) -> Result<warren_control::GuestView, ApiError> {
        let unavailable = |what: String| ApiError::new(StatusCode::BAD_GATEWAY, what);
        let body = self
            .agent_get(agent, token, "/metrics", METRICS_BODY_LIMIT)
            .await?;
        let m: AgentMetrics = serde_json::from_slice(&body)
            .map_err(|e| unavailable(format!("agent metrics are malformed: {e}")))?;
        Ok(warren_control::GuestView {
            cpu_used_pct: if m.cpu_used_pct.is_finite() {
                m.cpu_used_pct
            } else {
                0.0
            },
            mem_used: m.mem_used,
            mem_cache: m.mem_cache,
            disk_used: m.disk_used,
            disk_total: m.disk_total,
        })
    }
}

/// The control plane's sampler reads agents through the proxy's bounded client.
#[async_trait::async_trait]
impl warren_control::GuestMetrics for Proxy {
    async fn read(
        &self,
        sandbox: &warren_control::Sandbox,
    ) -> Result<warren_control::GuestView, String> {
        let rt = sandbox
            .runtime
            .as_ref()
            .ok_or_else(|| format!("sandbox {} is not running", sandbox.id))?;
        self.agent_metrics(rt.agent, &sandbox.envd_access_token)
            .await
            .map_err(|e| e.message)
    }

    async fn journal(
        &self,
        sandbox: &warren_control::Sandbox,
        after: u64,
        limit: usize,
    ) -> Result<warren_proto::journal::JournalPage, String> {
        let rt = sandbox
            .runtime
            .as_ref()
            .ok_or_else(|| format!("sandbox {} is not running", sandbox.id))?;
        let path = format!("/journal?after={after}&limit={limit}");
        let body = self
            .agent_get(
                rt.agent,
                &sandbox.envd_access_token,
                &path,
                JOURNAL_BODY_LIMIT,
            )
            .await
            .map_err(|e| e.message)?;
        serde_json::from_slice(&body).map_err(|e| format!("the agent's journal is malformed: {e}"))
    }
}

/// Most bytes of one journal page (1,000 entries of at most a few KiB each).
const JOURNAL_BODY_LIMIT: usize = 16 << 20;

/// The agent's `/metrics` body (envd's field names).
#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct AgentMetrics {
    cpu_used_pct: f64,
    mem_used: u64,
    mem_cache: u64,
    disk_used: u64,
    disk_total: u64,
}

fn sandbox_error(status: StatusCode, id: &str, message: &str) -> Response {
    let body = serde_json::json!({"sandboxId": id, "message": message, "code": status.as_u16()});
    (status, Json(body)).into_response()
}

fn not_found(id: &str) -> Response {
    sandbox_error(StatusCode::BAD_GATEWAY, id, "The sandbox was not found")
}

/// Middleware in front of the API: sandbox traffic is proxied, everything else goes on.
pub(crate) async fn route_or_api(State(st): State<AppState>, req: Request, next: Next) -> Response {
    if !st.proxy.known_host(req.headers(), req.uri()) {
        return ApiError::new(
            StatusCode::MISDIRECTED_REQUEST,
            "this server does not serve that host name",
        )
        .into_response();
    }
    match st.proxy.target(req.headers(), req.uri()) {
        Err(e) => e.into_response(),
        Ok(None) => next.run(req).await,
        Ok(Some(target)) => {
            // Traced requests only; the `traceparent` itself goes on to the sandbox unchanged
            // (the agent parents a command's span on the caller's).
            match crate::otel::request::proxy_span(req.headers(), &target.id, target.port) {
                Some(span) => {
                    use tracing::Instrument;
                    let resp = forward(&st, target, req).instrument(span.clone()).await;
                    span.record(
                        "http.response.status_code",
                        i64::from(resp.status().as_u16()),
                    );
                    resp
                }
                None => forward(&st, target, req).await,
            }
        }
    }
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Headers named in `Connection` are hop-by-hop too.
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
}

async fn forward(st: &AppState, target: Target, mut req: Request) -> Response {
    let query = req.uri().query().unwrap_or_default();
    let route = match admitted_route(st, &target, req.headers(), query).await {
        Ok(route) => route,
        Err(refused) => return refused,
    };
    // Port 49983 is "the agent", wherever the runtime put it; other ports are the sandbox's
    // own services at the agent's address.
    let addr = if target.port == AGENT_PORT {
        route.agent
    } else {
        SocketAddr::new(route.agent.ip(), target.port)
    };
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let Ok(uri) = format!("http://{addr}{path}").parse::<Uri>() else {
        return ApiError::bad_request("invalid request path").into_response();
    };
    // A command's start is timed to the agent's answer, which comes once the process runs.
    let exec = (target.port == AGENT_PORT && path.starts_with("/process.Process/Start"))
        .then(std::time::Instant::now);
    let upgrade = is_upgrade(req.headers());
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let socket = req
        .extensions()
        .get::<crate::listener::ConnectionSocket>()
        .cloned();
    let (req, sent) = crate::proxy_body::track_request(req);
    let outbound = outbound_request(req, &target, &route, addr, uri, upgrade);
    let resp = match send(st, &target, &route, outbound).await {
        Ok(resp) => resp,
        Err(failed) => {
            if let Some(started) = exec {
                st.control
                    .observe_exec(started, Some("the agent did not answer".into()));
            }
            return failed;
        }
    };
    if let Some(started) = exec {
        let failure =
            (!resp.status().is_success()).then(|| format!("the agent answered {}", resp.status()));
        st.control.observe_exec(started, failure);
    }
    if !resp.status().is_success() {
        // A refusal that came before the client finished sending (a full disk refusing an
        // upload): the sandbox reads the rest off; answer once it has, or the client, still
        // sending, would meet a closed connection instead of the answer.
        sent.wait(REQUEST_TAIL).await;
    }
    respond(resp, client_upgrade, &route.cancel, socket)
}

/// The route to the sandbox if this request may reach it: a paused sandbox whose lifecycle
/// says `autoResume` wakes here, on its first request (only on one that would be let through
/// once it runs); then the sandbox's ingress rules. Otherwise the response that refuses it.
///
/// Takes the request's parts, not the request: its body is not `Sync`, and a borrow of it
/// held across the resume would make the proxy's future not `Send`.
async fn admitted_route(
    st: &AppState,
    target: &Target,
    headers: &HeaderMap,
    query: &str,
) -> Result<warren_control::Route, Response> {
    let may_wake = |a: &warren_control::Access| ingress::may_wake(a, target.port, headers, query);
    let route = match st.control.route_or_resume(&target.id, may_wake).await {
        Ok(Some(route)) => route,
        Ok(None) => return Err(not_found(&target.id)),
        Err(warren_control::ControlError::PermissionDenied(_)) => {
            // The sandbox is paused; say what a running one would have said.
            return Err(sandbox_error(
                StatusCode::FORBIDDEN,
                &target.id,
                "The sandbox is paused; only an authorised request resumes it",
            ));
        }
        Err(e) => {
            tracing::warn!(sandbox_id = %target.id, error = %warren_runtime::chain(&e), "auto-resume failed");
            return Err(sandbox_error(
                StatusCode::BAD_GATEWAY,
                &target.id,
                "The sandbox is paused and could not be resumed",
            ));
        }
    };
    if let Err(denied) = ingress::authorize(&route.access, target.port, headers)
        .and_then(|()| ingress::check_site(&route.access, target.port, headers, query))
    {
        return Err(sandbox_error(
            StatusCode::FORBIDDEN,
            &target.id,
            &denied.message(),
        ));
    }
    Ok(route)
}

/// The client's request as the sandbox gets it: at `uri`, over HTTP/1.1, without hop-by-hop
/// headers or credentials that are not the receiver's, and still asking for the upgrade it
/// asked for.
fn outbound_request(
    req: Request,
    target: &Target,
    route: &warren_control::Route,
    addr: SocketAddr,
    uri: Uri,
    upgrade: bool,
) -> Request {
    let upgrade_header = req.headers().get(header::UPGRADE).cloned();
    let (mut parts, body) = req.into_parts();
    parts.uri = uri;
    // The pool speaks HTTP/1.1 to sandboxes whatever the client spoke to us.
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    // The control-plane credential never enters a sandbox, whatever a client sends along;
    // neither does the traffic token, nor the envd token where the agent and in-image
    // services (which call the agent with it) are not the receiver.
    parts.headers.remove("x-api-key");
    parts.headers.remove(ingress::TRAFFIC_TOKEN);
    if target.port != AGENT_PORT && !route.access.service_ports.contains(&target.port) {
        parts.headers.remove(ingress::ACCESS_TOKEN);
    }
    let host = match &route.access.mask_request_host {
        Some(mask) if target.port != AGENT_PORT => {
            mask.replace("${PORT}", &target.port.to_string())
        }
        _ => addr.to_string(),
    };
    if let Ok(host) = HeaderValue::from_str(&host) {
        parts.headers.insert(header::HOST, host);
    }
    if let Some(up) = upgrade_header.filter(|_| upgrade) {
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        parts.headers.insert(header::UPGRADE, up);
    }
    Request::from_parts(parts, body)
}

/// How long a refusal waits for the rest of the request it refused to reach the sandbox.
const REQUEST_TAIL: Duration = Duration::from_secs(30);

/// Sends `outbound` through the sandbox's pool; a sandbox killed meanwhile is not found,
/// an upstream failure a 502 that says whether the port was closed.
async fn send(
    st: &AppState,
    target: &Target,
    route: &warren_control::Route,
    outbound: Request,
) -> Result<hyper::Response<hyper::body::Incoming>, Response> {
    let client = st.proxy.client_for(&target.id, route);
    let result = tokio::select! {
        r = client.request(outbound) => r,
        _ = route.cancel.cancelled() => return Err(not_found(&target.id)),
    };
    result.map_err(|e| {
        tracing::debug!(sandbox_id = %target.id, port = target.port, error = ?e, "proxy upstream error");
        if route.cancel.is_cancelled() || st.control.route(&target.id).is_none() {
            return not_found(&target.id);
        }
        let message = if e.is_connect() {
            "The sandbox is running but port is not open"
        } else {
            "The sandbox is unreachable"
        };
        sandbox_error(StatusCode::BAD_GATEWAY, &target.id, message)
    })
}

/// The sandbox's response for the client: an accepted upgrade spliced to the client's
/// connection, anything else streamed without hop-by-hop headers; both cut when the sandbox
/// is killed.
fn respond(
    mut resp: hyper::Response<hyper::body::Incoming>,
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
    cancel: &CancellationToken,
    socket: Option<crate::listener::ConnectionSocket>,
) -> Response {
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_upgrade) = client_upgrade {
            let upstream = hyper::upgrade::on(&mut resp);
            tokio::spawn(splice(client_upgrade, upstream, cancel.clone()));
            let (parts, _) = resp.into_parts();
            return Response::from_parts(parts, Body::empty());
        }
    }
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    // Our own version to the client, not the sandbox's: a service answering HTTP/1.0
    // (Python's http.server) would otherwise close every client connection after one
    // response, a new TCP and TLS handshake per request.
    parts.version = Version::HTTP_11;
    Response::from_parts(
        parts,
        crate::proxy_body::cancellable(body, cancel.clone(), socket),
    )
}

async fn splice(
    client: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
    cancel: CancellationToken,
) {
    let (client, upstream) = match tokio::try_join!(client, upstream) {
        Ok(pair) => pair,
        Err(e) => {
            tracing::debug!(error = %warren_runtime::chain(&e), "upgrade failed");
            return;
        }
    };
    let mut client = TokioIo::new(client);
    let mut upstream = TokioIo::new(upstream);
    tokio::select! {
        r = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {
            if let Err(e) = r {
                tracing::debug!(error = %warren_runtime::chain(&e), "upgraded connection ended");
            }
        }
        // Dropping both ends closes the sockets.
        _ = cancel.cancelled() => {}
    }
}

/// The control plane's per-sandbox routes (`/sandboxes/{id}/...`, `/v2/sandboxes/{id}/...`),
/// which the agent's API never uses.
fn is_api_sandbox_path(path: &str) -> bool {
    path.starts_with("/sandboxes/") || path.starts_with("/v2/sandboxes/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_routing() {
        let p = Proxy::new(Some("warren.test".into()));
        assert_eq!(
            p.parse_host("49983-iabc123.warren.test:3000"),
            Some(Target {
                id: "iabc123".into(),
                port: 49983
            })
        );
        assert_eq!(p.parse_host("8080-iabc.other.test"), None);
        assert_eq!(p.parse_host("localhost:3000"), None);
        assert_eq!(p.parse_host("127.0.0.1:3000"), None);
        let any = Proxy::new(None);
        assert_eq!(
            any.parse_host("80-xyz.example.com"),
            Some(Target {
                id: "xyz".into(),
                port: 80
            })
        );
        assert_eq!(any.parse_host("80-XYZ.example.com"), None);
        assert_eq!(any.parse_host("api.example.com"), None);
    }

    #[test]
    fn unknown_hosts_are_refused_when_a_domain_is_set() {
        let p = Proxy::new(Some("warren.test".into()));
        let known = |host: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::HOST, HeaderValue::from_static(host));
            p.known_host(&h, &Uri::from_static("/"))
        };
        for ok in [
            "warren.test",
            "api.warren.test:3000",
            "49983-abc.WARREN.test",
            "localhost:3000",
            "127.0.0.1:3000",
            "[::1]:3000",
        ] {
            assert!(known(ok), "{ok}");
        }
        for bad in [
            "evil.test",
            "49999-abc.evil.test:3000",
            "xwarren.test",
            "warren.test.evil",
        ] {
            assert!(!known(bad), "{bad}");
        }
        let any = Proxy::new(None);
        let mut h = HeaderMap::new();
        h.insert(
            header::HOST,
            HeaderValue::from_static("49999-abc.evil.test"),
        );
        assert!(any.known_host(&h, &Uri::from_static("/")));
    }

    #[test]
    fn api_calls_carrying_routing_headers_go_to_the_api() {
        let p = Proxy::new(None);
        let mut h = HeaderMap::new();
        h.insert(SANDBOX_ID, HeaderValue::from_static("iabc"));
        let route = |h: &HeaderMap, uri: &'static str| p.route_target(h, &Uri::from_static(uri));
        assert_eq!(route(&h, "/sandboxes/iabc/connect").unwrap(), None);
        assert_eq!(route(&h, "/v2/sandboxes/iabc/connect").unwrap(), None);
        assert_eq!(
            route(&h, "/files?path=/sandboxes/x").unwrap(),
            Some(("iabc".into(), AGENT_PORT))
        );
        // A user port's own `/sandboxes/...` paths are the user's.
        h.insert(SANDBOX_PORT, HeaderValue::from_static("8080"));
        assert_eq!(
            route(&h, "/sandboxes/iabc/connect").unwrap(),
            Some(("iabc".into(), 8080))
        );
    }
}

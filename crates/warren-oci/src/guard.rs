//! The address guard of one pull: a small HTTP proxy on loopback that every request of the
//! pull's HTTP clients goes through (the registry, its redirects, token realms, the ECR API).
//!
//! `oci-client` builds its own `reqwest` client: it takes no redirect policy, resolver or
//! connector from outside, and follows a registry's redirects and `WWW-Authenticate` realms
//! on its own. What it does take is a proxy. So each pull gets one, and the proxy is where
//! destinations are judged ([`Policy`]): it resolves the host once, connects only to an
//! address it checked (so a name cannot resolve to something else between check and use),
//! and forwards plain HTTP only to hosts the operator named as plain HTTP. HTTPS goes through
//! `CONNECT` tunnels: TLS stays end to end between the client and the registry.
//!
//! Each pull has its own listener: every request that reaches it belongs to that pull, so a
//! refusal can be told to the template author as the cause of the pull's failure (the client
//! only sees a failed tunnel or a 403). Tunnels need the pull's random credential (the proxy
//! URL's user info), so other local users cannot use the listener to reach what the pull
//! may. Forwarded plain-HTTP requests need none: `reqwest` drops the proxy credential when it
//! follows a redirect to another host, and those requests only ever reach hosts the operator
//! named as plain HTTP, which any local user reaches directly anyway.
//!
//! Everything the guard runs stops when the [`Guard`] is dropped (the end of the pull).

use std::convert::Infallible;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, HOST, PROXY_AUTHORIZATION};
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::policy::{authority, Policy, Refused, Via};

/// How long connecting to one address of a destination may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The user name in the proxy URL (the password is the per-pull secret).
const USER: &str = "warren-pull";

/// Headers that belong to one hop (RFC 9110 section 7.6.1), not forwarded.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
];

type Body = BoxBody<Bytes, hyper::Error>;

/// What the guard saw go wrong during its pull.
#[derive(Default)]
struct Seen {
    /// The first destination refused by the policy.
    refused: Option<Refused>,
    /// The first destination none of whose checked addresses could be connected to.
    unreachable: Option<(String, io::Error)>,
}

struct Shared {
    policy: Arc<Policy>,
    /// `Basic <base64(user:secret)>`, as the client sends it.
    expected: String,
    seen: Mutex<Seen>,
}

/// A running guard; stops with everything it started when dropped.
pub(crate) struct Guard {
    url: String,
    shared: Arc<Shared>,
    _stop: watch::Sender<()>,
}

impl Guard {
    /// Listens on a fresh loopback port with a fresh secret.
    pub async fn start(policy: Arc<Policy>) -> io::Result<Guard> {
        let mut raw = [0u8; 24];
        getrandom::fill(&mut raw).map_err(|e| io::Error::other(e.to_string()))?;
        let secret: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let port = listener.local_addr()?.port();
        let expected = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{secret}"))
        );
        let shared = Arc::new(Shared {
            policy,
            expected,
            seen: Mutex::new(Seen::default()),
        });
        let (stop, stopped) = watch::channel(());
        tokio::spawn(accept_loop(listener, shared.clone(), stopped));
        Ok(Guard {
            url: format!("http://{USER}:{secret}@127.0.0.1:{port}"),
            shared,
            _stop: stop,
        })
    }

    /// The proxy URL for the pull's clients (it holds the secret).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The first refusal, if the policy refused anything.
    pub fn refused(&self) -> Option<Refused> {
        self.seen().refused.clone()
    }

    /// The first destination that could not be connected to, and why.
    pub fn take_unreachable(&self) -> Option<(String, io::Error)> {
        self.seen().unreachable.take()
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        // A panic while holding this lock leaves only plain data behind.
        self.shared
            .seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Resolves when the guard is dropped.
async fn stopped(mut rx: watch::Receiver<()>) {
    while rx.changed().await.is_ok() {}
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, stop: watch::Receiver<()>) {
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of descriptors and the like: the client's request fails, and it says so.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stopped(stop.clone()) => return,
        };
        let (shared, stop) = (shared.clone(), stop.clone());
        tokio::spawn(async move {
            let svc_stop = stop.clone();
            let service = hyper::service::service_fn(move |req| {
                handle(shared.clone(), svc_stop.clone(), req)
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            tokio::select! {
                _ = conn => {}
                () = stopped(stop) => {}
            }
        });
    }
}

fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(body)).map_err(|e| match e {}).boxed());
    *resp.status_mut() = status;
    resp
}

async fn handle(
    shared: Arc<Shared>,
    stop: watch::Receiver<()>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let via = if req.method() == Method::CONNECT {
        Via::Tunnel
    } else {
        Via::Plain
    };
    if via == Via::Tunnel && !authorized(&shared.expected, req.headers().get(PROXY_AUTHORIZATION)) {
        let mut resp = text(
            StatusCode::PROXY_AUTHENTICATION_REQUIRED,
            "this proxy serves one registry pull\n".into(),
        );
        resp.headers_mut().insert(
            "proxy-authenticate",
            HeaderValue::from_static("Basic realm=\"warren\""),
        );
        return Ok(resp);
    }
    let Some((host, port)) = target(req.uri(), via) else {
        return Ok(text(
            StatusCode::BAD_REQUEST,
            "expected CONNECT host:port or an absolute http:// URL\n".into(),
        ));
    };
    let stream = match connect(&shared, &host, port, via).await {
        Ok(stream) => stream,
        Err(Failed::Refused(refused)) => {
            let body = format!("{}: {}\n", refused.target, refused.reason);
            let mut seen = shared.seen.lock().unwrap_or_else(|p| p.into_inner());
            seen.refused.get_or_insert(refused);
            return Ok(text(StatusCode::FORBIDDEN, body));
        }
        Err(Failed::Unreachable(e)) => {
            let body = format!("{}: {e}\n", authority(&host, port));
            let mut seen = shared.seen.lock().unwrap_or_else(|p| p.into_inner());
            seen.unreachable.get_or_insert((authority(&host, port), e));
            return Ok(text(StatusCode::BAD_GATEWAY, body));
        }
    };
    match via {
        Via::Tunnel => {
            tokio::spawn(async move {
                let Ok(upgraded) = hyper::upgrade::on(req).await else {
                    return;
                };
                let (mut client, mut upstream) = (TokioIo::new(upgraded), stream);
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                    () = stopped(stop) => {}
                }
            });
            Ok(text(StatusCode::OK, String::new()))
        }
        Via::Plain => Ok(forward(req, stream, &host, port, stop).await),
    }
}

fn authorized(expected: &str, got: Option<&HeaderValue>) -> bool {
    let got = got.map(|v| v.as_bytes()).unwrap_or_default();
    // Constant time in the secret: a local user may time its guesses.
    got.len() == expected.len()
        && got
            .iter()
            .zip(expected.as_bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// The destination: `CONNECT host:port`, or an absolute `http://` URL.
fn target(uri: &Uri, via: Via) -> Option<(String, u16)> {
    let auth = uri.authority()?;
    let port = match via {
        Via::Tunnel => auth.port_u16()?,
        Via::Plain => {
            if uri.scheme_str() != Some("http") {
                return None;
            }
            auth.port_u16().unwrap_or(80)
        }
    };
    let host = auth.host().trim_matches(['[', ']']).to_ascii_lowercase();
    Some((host, port))
}

enum Failed {
    Refused(Refused),
    Unreachable(io::Error),
}

/// Judges `host:port`, resolves it and connects to the first checked address that answers.
async fn connect(shared: &Shared, host: &str, port: u16, via: Via) -> Result<TcpStream, Failed> {
    let policy = &shared.policy;
    let named = policy.operator_named(host, port);
    let addrs: Vec<SocketAddr> = match host.parse() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| {
                Failed::Unreachable(io::Error::new(e.kind(), format!("resolving {host}: {e}")))
            })?
            .collect(),
    };
    let mut allowed = Vec::new();
    let mut first_refusal = None;
    for addr in addrs {
        match named {
            true => allowed.push(addr),
            false => match policy.check_address(host, port, addr.ip()) {
                Ok(()) => allowed.push(addr),
                Err(r) => {
                    first_refusal.get_or_insert(r);
                }
            },
        }
    }
    if allowed.is_empty() {
        return Err(match first_refusal {
            Some(r) => Failed::Refused(r),
            None => Failed::Unreachable(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{host} has no address"),
            )),
        });
    }
    policy
        .check_transport(host, port, via)
        .map_err(Failed::Refused)?;
    let mut last = None;
    for addr in allowed {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(e)) => {
                last = Some(io::Error::new(
                    e.kind(),
                    format!("connecting to {addr}: {e}"),
                ))
            }
            Err(_) => {
                last = Some(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("connecting to {addr}: no answer in {CONNECT_TIMEOUT:?}"),
                ))
            }
        }
    }
    Err(Failed::Unreachable(last.unwrap_or_else(|| {
        io::Error::other(format!("{host} has no address"))
    })))
}

/// Sends a plain-HTTP request on `stream` (already connected to a checked address) in
/// origin form, and returns the answer as it streams in.
async fn forward(
    req: Request<Incoming>,
    stream: TcpStream,
    host: &str,
    port: u16,
    stop: watch::Receiver<()>,
) -> Response<Body> {
    let (mut parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let Ok(uri) = path.parse::<Uri>() else {
        return text(StatusCode::BAD_REQUEST, "bad request target\n".into());
    };
    parts.uri = uri;
    for name in HOP_BY_HOP {
        parts.headers.remove(*name);
    }
    if !parts.headers.contains_key(HOST) {
        let value = match port {
            80 => authority(host, port).trim_end_matches(":80").to_string(),
            _ => authority(host, port),
        };
        if let Ok(v) = HeaderValue::from_str(&value) {
            parts.headers.insert(HOST, v);
        }
    }
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(pair) => pair,
        Err(e) => return text(StatusCode::BAD_GATEWAY, format!("{e}\n")),
    };
    tokio::spawn(async move {
        tokio::select! {
            _ = conn => {}
            () = stopped(stop) => {}
        }
    });
    match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            for name in HOP_BY_HOP {
                parts.headers.remove(*name);
            }
            Response::from_parts(parts, body.boxed())
        }
        Err(e) => text(
            StatusCode::BAD_GATEWAY,
            format!("{}: {e}\n", authority(host, port)),
        ),
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;
    use crate::PullOptions;

    /// Sends `head` to the guard and returns the status line of its answer.
    async fn ask(guard: &Guard, head: String) -> String {
        let port = guard
            .url
            .rsplit(':')
            .next()
            .unwrap()
            .parse::<u16>()
            .unwrap();
        let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, port))
            .await
            .unwrap();
        s.write_all(head.as_bytes()).await.unwrap();
        let mut buf = vec![0; 512];
        let n = s.read(&mut buf).await.unwrap();
        String::from_utf8_lossy(&buf[..n])
            .lines()
            .next()
            .unwrap_or("")
            .to_string()
    }

    #[tokio::test]
    async fn tunnels_need_the_pulls_secret() {
        // A destination the policy allows (the operator named it), so only the secret decides.
        let target = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        target.set_nonblocking(true).unwrap();
        let dest = target.local_addr().unwrap();
        let mut opts = PullOptions::new("/nonexistent");
        opts.allow = vec![dest.to_string().parse().unwrap()];
        let guard = Guard::start(Arc::new(Policy::new(&opts).unwrap()))
            .await
            .unwrap();
        let head = format!("CONNECT {dest} HTTP/1.1\r\nHost: {dest}\r\n");
        for wrong in [
            "",
            "Proxy-Authorization: Basic d2FycmVuLXB1bGw6Z3Vlc3M=\r\n",
        ] {
            let status = ask(&guard, format!("{head}{wrong}\r\n")).await;
            assert!(status.contains(" 407 "), "{status}");
        }
        assert!(target.accept().is_err(), "no connection without the secret");
        let right = format!("Proxy-Authorization: {}\r\n", guard.shared.expected);
        let status = ask(&guard, format!("{head}{right}\r\n")).await;
        assert!(status.contains(" 200 "), "{status}");
        assert!(target.accept().is_ok());
    }
}

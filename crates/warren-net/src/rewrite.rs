//! HTTP/1.1 request rewriting for hosts whose requests get headers at egress (secrets brokered
//! by the egress proxy, `docs/secrets.md`): every request a client sends on a connection, not
//! only the first, has the rule's headers set (replacing any of the same name), and its body is
//! framed exactly (`Content-Length`, or `chunked` with trailers) so the next request's head is
//! found. Responses are not touched (the caller copies them raw).
//!
//! A connection is brokered for one host ([`Scope`]), and each request must say it is for that
//! host: its authority (an absolute-form or CONNECT target, else `Host`; both when it has both)
//! names the host, and a port only if it is the connection's. Anything else (another host, no
//! authority, several `Host` fields, credentials in the authority) ends the connection before a
//! byte of that request leaves: a front end that routes by `Host` (a CDN, shared hosting, a
//! reverse proxy) would hand the request, value included, to whoever that host is.
//!
//! Everything read goes to the one upstream the caller dialled for the rule's host, so a
//! request this code cannot frame can at worst go without its headers, never to another host;
//! ambiguous framing (both `Transfer-Encoding` and `Content-Length`, several lengths, a coding
//! other than a final `chunked`) is refused, as RFC 9112 asks of a proxy. A request asking to
//! switch protocols (`Upgrade`, `CONNECT`) gets no headers (what follows is another protocol,
//! a tunnel or a WebSocket, whose use of them this code cannot see) and ends the rewriting:
//! what follows it is copied as it is.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest request head accepted.
pub const MAX_HEAD: usize = 64 * 1024;
/// Most header fields in one request.
const MAX_HEADERS: usize = 128;

/// The host a brokered connection is for: every request on it must name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// Lower case, without a trailing dot: the TLS server name (SNI), or the `Host` of the
    /// connection's first plain HTTP request; the name the proxy dialled.
    pub name: String,
    /// The port the sandbox connected to (and the proxy dialled).
    pub port: u16,
}

/// Why a connection's rewriting stopped before the client closed it.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    #[error("malformed request: {0}")]
    Malformed(String),
    /// A header's value could not be made (a secret it names is gone).
    #[error("{0}")]
    Unavailable(String),
    /// A request the connection may not carry (it names another host than the one the
    /// connection was brokered for, or none): the connection must end, nothing forwarded.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// How a request's body is delimited.
#[derive(Debug, PartialEq, Eq)]
enum Body {
    None,
    Length(u64),
    Chunked,
}

fn malformed(m: impl Into<String>) -> RewriteError {
    RewriteError::Malformed(m.into())
}

/// Reads from `client` into `buf` until it holds a whole head; `Ok(false)` when the client
/// closed cleanly between requests.
async fn fill_head<R: AsyncRead + Unpin>(
    client: &mut R,
    buf: &mut Vec<u8>,
) -> Result<Option<usize>, RewriteError> {
    loop {
        if let Some(end) = find(buf, b"\r\n\r\n") {
            return Ok(Some(end + 4));
        }
        if buf.len() > MAX_HEAD {
            return Err(malformed("request head too large"));
        }
        let mut chunk = [0u8; 8192];
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return if buf.iter().all(|b| *b == b'\r' || *b == b'\n') {
                Ok(None)
            } else {
                Err(malformed("connection closed inside a request head"))
            };
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// One request head, parsed.
struct Request<'h> {
    method: &'h str,
    target: &'h str,
    version: u8,
    fields: Vec<(&'h str, &'h [u8])>,
}

fn parse(head: &[u8]) -> Result<Request<'_>, RewriteError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut fields);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(malformed("incomplete head")),
        Err(e) => return Err(malformed(e.to_string())),
    }
    Ok(Request {
        method: req.method.unwrap_or_default(),
        target: req.path.unwrap_or_default(),
        version: req.version.unwrap_or(1),
        fields: req.headers.iter().map(|h| (h.name, h.value)).collect(),
    })
}

/// How the request's body is delimited, and whether it switches protocols.
fn framing(req: &Request<'_>) -> Result<(Body, bool), RewriteError> {
    let (mut lengths, mut codings, mut upgrade) = (Vec::new(), Vec::new(), req.method == "CONNECT");
    for (name, value) in &req.fields {
        let value = std::str::from_utf8(value).unwrap_or("");
        if name.eq_ignore_ascii_case("content-length") {
            lengths.push(value.trim().to_string());
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            codings.extend(value.split(',').map(|c| c.trim().to_ascii_lowercase()));
        } else if name.eq_ignore_ascii_case("upgrade") {
            upgrade = true;
        }
    }
    let body = match (codings.is_empty(), lengths.len()) {
        (false, 0) if codings.last().map(String::as_str) == Some("chunked") => Body::Chunked,
        (false, 0) => return Err(malformed("a transfer coding other than a final chunked")),
        (false, _) => return Err(malformed("both Transfer-Encoding and Content-Length")),
        (true, 0) => Body::None,
        (true, _) => {
            let first = &lengths[0];
            if lengths.iter().any(|l| l != first) {
                return Err(malformed("differing Content-Length values"));
            }
            match first.parse::<u64>() {
                Ok(n) if first.bytes().all(|b| b.is_ascii_digit()) => Body::Length(n),
                _ => return Err(malformed("invalid Content-Length")),
            }
        }
    };
    Ok((body, upgrade))
}

fn refused(m: impl Into<String>) -> RewriteError {
    RewriteError::Refused(m.into())
}

/// Whether the request names the connection's host: its target's authority (absolute form,
/// or a CONNECT's) and its `Host`, each where present, at least one of them.
fn check_scope(req: &Request<'_>, scope: &Scope) -> Result<(), RewriteError> {
    let mut hosts = req
        .fields
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("host"))
        .map(|(_, v)| v);
    let host = match (hosts.next(), hosts.next()) {
        (Some(_), Some(_)) => return Err(refused("a request with several Host fields")),
        (Some(v), None) => Some(
            std::str::from_utf8(v)
                .map_err(|_| refused("a Host that is not text"))?
                .trim(),
        ),
        (None, _) => None,
    };
    let target = if req.method == "CONNECT" {
        Some(req.target)
    } else if req.target.starts_with('/') || req.target == "*" {
        None
    } else {
        Some(absolute_authority(req.target)?)
    };
    if host.is_none() && target.is_none() {
        return Err(refused("a request that names no host"));
    }
    for authority in [target, host].into_iter().flatten() {
        in_scope(authority, scope)?;
    }
    Ok(())
}

/// The authority of an absolute-form `http://` or `https://` target.
fn absolute_authority(target: &str) -> Result<&str, RewriteError> {
    let rest = target
        .split_once("://")
        .filter(|(scheme, _)| {
            scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")
        })
        .map(|(_, rest)| rest)
        .ok_or_else(|| refused("a request target that is not a path or an http(s) URL"))?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    Ok(&rest[..end])
}

/// Whether `authority` (`host[:port]`) is the connection's host, on its port if it names one.
/// A missing port is taken as the connection's: the bytes reach no other port.
fn in_scope(authority: &str, scope: &Scope) -> Result<(), RewriteError> {
    if authority.contains('@') {
        return Err(refused("credentials in a request's authority"));
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => {
            let port = port
                .parse::<u16>()
                .ok()
                .filter(|_| port.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| refused("an invalid port in a request's authority"))?;
            (host, Some(port))
        }
        _ => (authority, None),
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if host != scope.name {
        return Err(refused(format!(
            "a request for another host on a connection brokered for {}",
            scope.name
        )));
    }
    if port.is_some_and(|p| p != scope.port) {
        return Err(refused(format!(
            "a request for another port on a connection brokered for {}:{}",
            scope.name, scope.port
        )));
    }
    Ok(())
}

/// The request's head with the headers of `set` in place of any of the same name.
fn render(req: &Request<'_>, set: &[(String, String)]) -> Vec<u8> {
    let Request {
        method,
        target,
        version,
        ..
    } = req;
    let mut out = format!("{method} {target} HTTP/1.{version}\r\n").into_bytes();
    for (name, value) in &req.fields {
        if set.iter().any(|(n, _)| n.eq_ignore_ascii_case(name)) {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    for (n, v) in set {
        out.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Copies `n` bytes to `up`, from `buf` first, then from `client`.
async fn copy_exact<R, W>(
    client: &mut R,
    up: &mut W,
    buf: &mut Vec<u8>,
    mut n: u64,
) -> Result<(), RewriteError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let take = n.min(buf.len() as u64) as usize;
    up.write_all(&buf[..take]).await?;
    buf.drain(..take);
    n -= take as u64;
    let mut chunk = vec![0u8; 64 * 1024];
    while n > 0 {
        let want = n.min(chunk.len() as u64) as usize;
        let got = client.read(&mut chunk[..want]).await?;
        if got == 0 {
            return Err(malformed("connection closed inside a body"));
        }
        up.write_all(&chunk[..got]).await?;
        n -= got as u64;
    }
    Ok(())
}

/// Copies one line (through its CRLF) to `up` and returns it without the CRLF.
async fn copy_line<R, W>(
    client: &mut R,
    up: &mut W,
    buf: &mut Vec<u8>,
) -> Result<Vec<u8>, RewriteError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        if let Some(i) = find(buf, b"\r\n") {
            let line: Vec<u8> = buf.drain(..i + 2).collect();
            up.write_all(&line).await?;
            return Ok(line[..i].to_vec());
        }
        if buf.len() > 8192 {
            return Err(malformed("chunk line too long"));
        }
        let mut chunk = [0u8; 4096];
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Err(malformed("connection closed inside a chunked body"));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Copies a chunked body, trailers included.
async fn copy_chunked<R, W>(
    client: &mut R,
    up: &mut W,
    buf: &mut Vec<u8>,
) -> Result<(), RewriteError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        let line = copy_line(client, up, buf).await?;
        let size = std::str::from_utf8(&line)
            .ok()
            .and_then(|l| l.split(';').next())
            .map(str::trim)
            .and_then(|s| u64::from_str_radix(s, 16).ok())
            .ok_or_else(|| malformed("invalid chunk size"))?;
        if size == 0 {
            // Trailers, then the empty line.
            while !copy_line(client, up, buf).await?.is_empty() {}
            return Ok(());
        }
        copy_exact(client, up, buf, size).await?;
        if !copy_line(client, up, buf).await?.is_empty() {
            return Err(malformed("chunk data longer than its size"));
        }
    }
}

/// Forwards the requests `client` sends (starting with the bytes already read, `first`) to
/// `up`, each with the headers of `set` (resolved when each request comes: a rotated secret
/// applies on the next request). Returns when the client closes, or after a protocol switch
/// once the rest of the client's bytes are copied; [`RewriteError::Refused`], with nothing of
/// that request sent, at the first request not for `scope`.
pub async fn forward_requests<R, W, F, Fut>(
    client: &mut R,
    up: &mut W,
    first: Vec<u8>,
    scope: &Scope,
    mut set: F,
) -> Result<(), RewriteError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Vec<(String, String)>, RewriteError>>,
{
    let mut buf = first;
    while let Some(end) = fill_head(client, &mut buf).await? {
        // Tolerate the empty lines RFC 9112 lets a client send between requests.
        let start = buf
            .iter()
            .position(|b| *b != b'\r' && *b != b'\n')
            .unwrap_or(0);
        let req = parse(&buf[start..end])?;
        let (body, upgrade) = framing(&req)?;
        check_scope(&req, scope)?;
        let headers = if upgrade { Vec::new() } else { set().await? };
        let head = render(&req, &headers);
        buf.drain(..end);
        up.write_all(&head).await?;
        match body {
            Body::None => {}
            Body::Length(n) => copy_exact(client, up, &mut buf, n).await?,
            Body::Chunked => copy_chunked(client, up, &mut buf).await?,
        }
        if upgrade {
            up.write_all(&buf).await?;
            tokio::io::copy(client, up).await?;
            break;
        }
    }
    up.flush().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set() -> Vec<(String, String)> {
        vec![("Authorization".into(), "Bearer s3cret".into())]
    }

    /// What upstream receives when the client sends `sent` in pieces of `split` bytes.
    async fn through(sent: &[u8], split: usize) -> Result<Vec<u8>, RewriteError> {
        let (mut client_side, mut client) = tokio::io::duplex(1 << 20);
        let (mut up, mut upstream_side) = tokio::io::duplex(1 << 20);
        let data = sent.to_vec();
        let writer = tokio::spawn(async move {
            for piece in data.chunks(split.max(1)) {
                client_side.write_all(piece).await.unwrap();
            }
        });
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            upstream_side.read_to_end(&mut got).await.unwrap();
            got
        });
        let scope = Scope {
            name: "api.test".into(),
            port: 80,
        };
        let r = forward_requests(&mut client, &mut up, Vec::new(), &scope, || async {
            Ok(set())
        })
        .await;
        drop(up);
        writer.await.unwrap();
        let got = reader.await.unwrap();
        r.map(|()| got)
    }

    /// What upstream receives, and how forwarding ended, for a connection brokered for
    /// `name` on `port`.
    async fn scoped(sent: &[u8], name: &str, port: u16) -> (Result<(), RewriteError>, String) {
        let scope = Scope {
            name: name.into(),
            port,
        };
        let (mut client_side, mut client) = tokio::io::duplex(1 << 20);
        let (mut up, mut upstream_side) = tokio::io::duplex(1 << 20);
        client_side.write_all(sent).await.unwrap();
        drop(client_side);
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            upstream_side.read_to_end(&mut got).await.unwrap();
            got
        });
        let r = forward_requests(&mut client, &mut up, Vec::new(), &scope, || async {
            Ok(set())
        })
        .await;
        drop(up);
        (r, String::from_utf8(reader.await.unwrap()).unwrap())
    }

    #[tokio::test]
    async fn a_request_for_another_host_ends_the_connection_before_it_leaves() {
        let first = "GET /a HTTP/1.1\r\nHost: api.test\r\n\r\n";
        for second in [
            "GET /b HTTP/1.1\r\nHost: evil.test\r\n\r\n",
            "GET /b HTTP/1.1\r\nHost: Evil.Test.:443\r\n\r\n",
            "GET http://evil.test/b HTTP/1.1\r\nHost: api.test\r\n\r\n",
            "GET http://evil.test/b HTTP/1.1\r\nHost: evil.test\r\n\r\n",
            "GET http://api.test/b HTTP/1.1\r\nHost: evil.test\r\n\r\n",
            "GET http://user@api.test/b HTTP/1.1\r\nHost: api.test\r\n\r\n",
            "GET /b HTTP/1.1\r\nHost: api.test\r\nHost: evil.test\r\n\r\n",
            "GET /b HTTP/1.1\r\nHost: api.test:8443\r\n\r\n",
            "GET /b HTTP/1.1\r\nHost: \r\n\r\n",
            "GET /b HTTP/1.0\r\n\r\n",
            "GET b HTTP/1.1\r\nHost: api.test\r\n\r\n",
            "CONNECT evil.test:443 HTTP/1.1\r\nHost: api.test\r\n\r\n",
            "CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\n\r\n",
        ] {
            let (r, got) = scoped(format!("{first}{second}").as_bytes(), "api.test", 80).await;
            assert!(
                matches!(r, Err(RewriteError::Refused(_))),
                "{second}: {r:?}"
            );
            assert_eq!(
                got, "GET /a HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer s3cret\r\n\r\n",
                "{second}"
            );
        }
    }

    #[tokio::test]
    async fn requests_naming_the_connections_host_get_the_header() {
        for req in [
            "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: API.test.:80\r\n\r\n",
            "GET http://api.test/x HTTP/1.1\r\nHost: api.test\r\n\r\n",
            "GET HTTP://api.test:80 HTTP/1.1\r\nHost: api.test:80\r\n\r\n",
            "OPTIONS * HTTP/1.1\r\nHost: api.test\r\n\r\n",
        ] {
            let (r, got) = scoped(req.as_bytes(), "api.test", 80).await;
            assert!(r.is_ok(), "{req}: {r:?}");
            assert_eq!(got.matches("Bearer s3cret").count(), 1, "{req}: {got}");
        }
    }

    #[tokio::test]
    async fn connect_and_upgrade_requests_never_get_the_header() {
        for req in [
            "CONNECT api.test:80 HTTP/1.1\r\nHost: api.test:80\r\n\r\nrest",
            "CONNECT api.test:80 HTTP/1.1\r\n\r\nrest",
            "GET /ws HTTP/1.1\r\nHost: api.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nrest",
            "GET /ws HTTP/1.1\r\nHost: api.test\r\nUpgrade: h2c\r\n\r\nGET / HTTP/1.1\r\nHost: api.test\r\n\r\n",
        ] {
            let (r, got) = scoped(req.as_bytes(), "api.test", 80).await;
            assert!(r.is_ok(), "{req}: {r:?}");
            assert!(!got.contains("s3cret"), "{req}: {got}");
        }
    }

    #[tokio::test]
    async fn every_request_on_a_connection_gets_the_header_in_place_of_the_clients() {
        let sent = b"GET /a HTTP/1.1\r\nHost: api.test\r\nauthorization: ${e2b.secrets.k}\r\n\r\n\
POST /b HTTP/1.1\r\nHost: api.test\r\nContent-Length: 5\r\n\r\nhello\
PUT /c HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n3;x=1\r\nabc\r\n0\r\nT: 1\r\n\r\n";
        let want = b"GET /a HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer s3cret\r\n\r\n\
POST /b HTTP/1.1\r\nHost: api.test\r\nContent-Length: 5\r\nAuthorization: Bearer s3cret\r\n\r\nhello\
PUT /c HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\nAuthorization: Bearer s3cret\r\n\r\n3;x=1\r\nabc\r\n0\r\nT: 1\r\n\r\n";
        for split in [1, 7, 4096] {
            let got = through(sent, split).await.unwrap();
            assert_eq!(
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(want),
                "split {split}"
            );
        }
    }

    #[tokio::test]
    async fn a_body_that_looks_like_a_request_is_not_rewritten() {
        let body = b"GET /x HTTP/1.1\r\nAuthorization: mine\r\n\r\n";
        let mut sent = format!(
            "POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        sent.extend_from_slice(body);
        let got = through(&sent, 3).await.unwrap();
        assert!(got.ends_with(body), "{}", String::from_utf8_lossy(&got));
        assert_eq!(String::from_utf8_lossy(&got).matches("s3cret").count(), 1);
    }

    #[tokio::test]
    async fn ambiguous_framing_is_refused() {
        for bad in [
            &b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nabc"[..],
            b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\nabc",
            b"POST / HTTP/1.1\r\nContent-Length: +3\r\n\r\nabc",
            b"NOT A REQUEST\r\n\r\n",
        ] {
            assert!(
                matches!(through(bad, 64).await, Err(RewriteError::Malformed(_))),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[tokio::test]
    async fn after_an_upgrade_bytes_pass_as_they_are() {
        let sent = b"GET /ws HTTP/1.1\r\nHost: api.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nGET /not-http HTTP/1.1\r\n\r\n";
        let got = String::from_utf8(through(sent, 5).await.unwrap()).unwrap();
        assert!(got.starts_with("GET /ws HTTP/1.1\r\n"));
        assert!(
            got.ends_with("\r\n\r\nGET /not-http HTTP/1.1\r\n\r\n"),
            "{got}"
        );
        // The upgrade request itself goes without the rule's headers.
        assert_eq!(got.matches("s3cret").count(), 0);
    }

    #[tokio::test]
    async fn a_client_closing_mid_body_is_an_error_not_a_silent_end() {
        let sent = b"POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 10\r\n\r\nabc";
        assert!(matches!(
            through(sent, 64).await,
            Err(RewriteError::Malformed(_))
        ));
    }
}

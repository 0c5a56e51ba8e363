//! Secrets brokered at egress: the egress proxy's part of `network.rules`
//! (`docs/secrets.md`). A connection the proxy allowed, to a host a rule names, is not
//! relayed byte for byte but request by request, each request getting the rule's headers with
//! their `${e2b.secrets.NAME}` placeholders replaced by the secret's value at that moment
//! (a rotated secret applies on the next request). The sandbox never holds the value: not
//! in its environment, files or memory.
//!
//! - TLS: the proxy first completes its own handshake with the host, verifying its
//!   certificate against the host's trust store (and the operator's extra roots), then
//!   answers the sandbox's handshake with a leaf for the name it asked (SNI) from the
//!   server's egress CA, which sandboxes trust. HTTP/1.1 only (ALPN), both ways.
//! - Plain HTTP, only for a rule that asks for it (`"scheme": "http"`; the proxy relays other
//!   plain HTTP unchanged): the requests are rewritten as they pass.
//!
//! The proxy dials a rule's host by name itself (never the address the sandbox chose), so
//! a value goes only to that host's servers; on TLS, only to a server that proves the name.
//! Each request must name that host too ([`crate::rewrite`]): the first that does not ends
//! the connection with a reset, before any of it leaves, so a front end routing by `Host`
//! never sees the value in a request for someone else. A secret that is gone answers the
//! request with 502 instead of sending the placeholder.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use warren_runtime::transforms;
use warren_tls::EgressCerts;

use crate::rewrite::{forward_requests, RewriteError, Scope};

/// A secret's value, looked up when a request leaves.
pub type SecretFuture<'a> = Pin<Box<dyn Future<Output = Option<String>> + Send + 'a>>;

/// Where the proxy gets the values of secrets.
pub trait SecretSource: Send + Sync {
    /// The current value of the secret `name` (lower case) of the team that owns the sandbox
    /// `sandbox`, or `None`.
    fn secret<'a>(&'a self, sandbox: &'a str, name: &'a str) -> SecretFuture<'a>;
}

/// What the pool's egress proxy needs to broker secrets: the egress CA's leaves, the trust
/// for upstream servers and the secrets.
pub struct Broker {
    certs: Arc<EgressCerts>,
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
    secrets: Arc<dyn SecretSource>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("certs", &self.certs)
            .finish_non_exhaustive()
    }
}

/// Why a broker cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("egress TLS settings: {0}")]
    Tls(String),
    #[error("no trusted root certificates: the host's store is empty and none were given")]
    NoRoots,
}

impl Broker {
    /// A broker issuing leaves from `certs`, trusting upstream servers whose chain ends at
    /// the host's trust store or at one of `extra_roots`.
    pub fn new(
        certs: Arc<EgressCerts>,
        extra_roots: Vec<CertificateDer<'static>>,
        secrets: Arc<dyn SecretSource>,
    ) -> Result<Self, BrokerError> {
        let mut roots = rustls::RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(native.certs);
        roots.add_parsable_certificates(extra_roots);
        if roots.is_empty() {
            return Err(BrokerError::NoRoots);
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| BrokerError::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.alpn_protocols = vec![b"http/1.1".to_vec()];
        let server = warren_tls::egress_server_config(certs.clone())
            .map_err(|e| BrokerError::Tls(e.to_string()))?;
        Ok(Self {
            certs,
            server,
            client: Arc::new(client),
            secrets,
        })
    }

    /// The egress CA's certificate (PEM), which sandboxes are told to trust.
    pub fn ca_pem(&self) -> &str {
        self.certs.ca_pem()
    }
}

/// One brokered connection's rule: the headers to set (with placeholders) and whose secrets
/// fill them.
pub(crate) struct Brokered {
    pub headers: BTreeMap<String, String>,
    pub sandbox: Option<String>,
    /// The host the connection is for, which every request on it must name.
    pub scope: Scope,
}

/// Why a brokered connection ended early.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BrokerFailure {
    #[error("upstream TLS: {0}")]
    Upstream(io::Error),
    #[error("sandbox TLS: {0}")]
    Client(io::Error),
    /// A request not for the connection's host (the connection was reset).
    #[error("{0}")]
    Refused(String),
}

impl Broker {
    /// Carries a plain HTTP connection whose first bytes are `head`.
    pub(crate) async fn http(
        &self,
        mut client: TcpStream,
        mut upstream: TcpStream,
        head: Vec<u8>,
        rule: &Brokered,
    ) -> Result<(), BrokerFailure> {
        no_delay(&client, &upstream);
        let ended = exchange(&mut client, &mut upstream, head, &rule.scope, || {
            self.headers(rule)
        })
        .await;
        if let Err(why) = ended {
            reset(&client, &upstream);
            return Err(BrokerFailure::Refused(why));
        }
        Ok(())
    }

    /// Carries a TLS connection whose first bytes (`head`) hold the ClientHello for `name`:
    /// the upstream handshake first, verified, then the sandbox's.
    pub(crate) async fn https(
        &self,
        client: TcpStream,
        upstream: TcpStream,
        head: Vec<u8>,
        name: &str,
        rule: &Brokered,
    ) -> Result<(), BrokerFailure> {
        no_delay(&client, &upstream);
        let server_name = ServerName::try_from(name.to_owned())
            .map_err(|e| BrokerFailure::Upstream(io::Error::other(e)))?;
        let upstream = tokio_rustls::TlsConnector::from(self.client.clone())
            .connect(server_name, upstream)
            .await
            .map_err(BrokerFailure::Upstream)?;
        let mut upstream = upstream;
        let mut client = tokio_rustls::TlsAcceptor::from(self.server.clone())
            .accept(Replay::new(head, client))
            .await
            .map_err(BrokerFailure::Client)?;
        let ended = exchange(&mut client, &mut upstream, Vec::new(), &rule.scope, || {
            self.headers(rule)
        })
        .await;
        if let Err(why) = ended {
            reset(&client.get_ref().0.inner, upstream.get_ref().0);
            return Err(BrokerFailure::Refused(why));
        }
        Ok(())
    }

    /// The rule's headers with their placeholders filled, now.
    async fn headers(&self, rule: &Brokered) -> Result<Vec<(String, String)>, RewriteError> {
        let mut values = HashMap::new();
        if let Some(sandbox) = rule.sandbox.as_deref() {
            for template in rule.headers.values() {
                for name in transforms::secret_names_in(template) {
                    if let std::collections::hash_map::Entry::Vacant(e) = values.entry(name) {
                        let value = self.secrets.secret(sandbox, e.key()).await;
                        e.insert(value);
                    }
                }
            }
        }
        rule.headers
            .iter()
            .map(|(name, template)| {
                let value =
                    transforms::resolve(template, |secret| values.get(secret).cloned().flatten())
                        .map_err(|e| RewriteError::Unavailable(e.to_string()))?;
                Ok((name.clone(), value))
            })
            .collect()
    }
}

/// A rewritten request leaves as several writes (head, then body): without this the second
/// waits for the peer's delayed acknowledgement of the first.
fn no_delay(client: &TcpStream, upstream: &TcpStream) {
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
}

/// Makes the coming close of both connections a reset: the client fails at once instead of
/// reading an orderly end it could take for an empty answer.
fn reset(client: &TcpStream, upstream: &TcpStream) {
    let _ = client.set_zero_linger();
    let _ = upstream.set_zero_linger();
}

/// Requests from `client` to `upstream` through the rewriter, responses back as they come.
/// A header that cannot be made answers 502 and ends the connection; a request that is not
/// for `scope` ends it with nothing sent (`Err`: why; the caller resets both connections).
async fn exchange<C, U, F, Fut>(
    client: &mut C,
    upstream: &mut U,
    first: Vec<u8>,
    scope: &Scope,
    set: F,
) -> Result<(), String>
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Vec<(String, String)>, RewriteError>>,
{
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut up_read, mut up_write) = tokio::io::split(upstream);
    let failed = {
        let requests = async {
            let r = forward_requests(&mut client_read, &mut up_write, first, scope, set).await;
            if r.is_ok() {
                let _ = up_write.shutdown().await;
            }
            r
        };
        let responses = async {
            let _ = tokio::io::copy(&mut up_read, &mut client_write).await;
            let _ = client_write.shutdown().await;
        };
        tokio::pin!(requests, responses);
        let mut requests_done = false;
        loop {
            tokio::select! {
                r = &mut requests, if !requests_done => match r {
                    Err(RewriteError::Unavailable(why)) => break Some(why),
                    Err(RewriteError::Refused(why)) => return Err(why),
                    Err(e) => {
                        tracing::debug!(target: "warren_net::flow", error = %e,
                            "brokered connection ended");
                        break None;
                    }
                    Ok(()) => requests_done = true,
                },
                () = &mut responses => break None,
            }
        }
    };
    if let Some(why) = failed {
        tracing::info!(target: "warren_net::flow", reason = %why,
            "brokered request refused");
        let body = format!("{why}\n");
        let answer = format!(
            "HTTP/1.1 502 Bad Gateway\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = client_write.write_all(answer.as_bytes()).await;
        let _ = client_write.shutdown().await;
    }
    Ok(())
}

/// A stream that first yields bytes already read from it (the ClientHello the proxy looked
/// at), then the stream itself.
struct Replay<S> {
    head: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S> Replay<S> {
    fn new(head: Vec<u8>, inner: S) -> Self {
        Self { head, at: 0, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Replay<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.at < self.head.len() {
            let n = buf.remaining().min(self.head.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.head[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Replay<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn replay_gives_the_head_first() {
        let (a, mut b) = tokio::io::duplex(64);
        b.write_all(b" world").await.unwrap();
        drop(b);
        let mut r = Replay::new(b"hello".to_vec(), a);
        let mut out = String::new();
        r.read_to_string(&mut out).await.unwrap();
        assert_eq!(out, "hello world");
    }
}

//! TLS certificates for Warren's listeners.
//!
//! In domain mode (`warren serve --domain sbx.example.com`) the server answers
//! `https://{port}-{id}.sbx.example.com` and `https://api.sbx.example.com`, as E2B does. The
//! certificate for those names is either one the operator gives (PEM chain and key, e.g. from
//! an ACME client) or a wildcard leaf issued by a **local certificate authority** that Warren
//! creates on its first start in the data dir ([`LocalCa`]): clients trust its certificate
//! (`SSL_CERT_FILE`, `NODE_EXTRA_CA_CERTS`, the system store) and nothing else changes.
//!
//! The local CA may only sign names under its domain (an X.509 name constraint that
//! OpenSSL, BoringSSL and webpki enforce), so a client told to trust it trusts nothing more
//! than this server's names, even if the CA key leaked. Its key never leaves the data dir
//! (0600); a leaf's key lives only in memory, and a leaf is re-issued before it expires
//! ([`ServerCerts`]).

#![forbid(unsafe_code)]

mod ca;
mod certs;
mod egress;
mod roots;

use std::path::PathBuf;
use std::sync::Arc;

pub use ca::LocalCa;
pub use certs::{dns_names, ServerCerts};
pub use egress::{egress_server_config, EgressCerts};
pub use roots::host_roots;
pub use rustls;

/// What went wrong with a certificate, a key or their files.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("making a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("TLS: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("{0:?} is not a domain name a certificate can name")]
    BadName(String),
}

/// The rustls server settings of a TLS listener that serves `certs`: TLS 1.3 (the workspace
/// builds rustls without 1.2), ALPN `h2` then `http/1.1` (hyper's server then speaks what the
/// client chose).
pub fn server_config(
    certs: Arc<dyn rustls::server::ResolvesServerCert>,
) -> Result<Arc<rustls::ServerConfig>, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(certs);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Whether `name` is a DNS name (letters, digits, hyphens, dots; no empty label), the form a
/// `--domain` must have.
pub fn valid_domain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

#[cfg(test)]
mod tests;

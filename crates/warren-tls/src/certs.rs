//! The certificate a TLS listener serves: the operator's, or a leaf of the local CA that is
//! re-issued before it expires.

use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::ca::{Issued, LocalCa};
use crate::Error;

/// How long a leaf of the local CA is valid. Short, because it is re-issued for free.
const LEAF_LIFETIME: Duration = Duration::from_secs(90 * 24 * 3600);
/// A leaf this close to its end is replaced by the next handshake.
const RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 3600);

/// The certificate of a TLS listener, for every name the client asks for (one certificate
/// names them all: the domain's wildcard).
pub struct ServerCerts {
    source: Source,
}

enum Source {
    /// Given by the operator; served as it is until the server restarts.
    Fixed(Arc<CertifiedKey>),
    /// Issued by the local CA for `names`, replaced when near its end.
    Issued(Box<Renewing>),
}

struct Renewing {
    ca: LocalCa,
    names: Vec<String>,
    current: Mutex<Issued>,
}

impl fmt::Debug for ServerCerts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Source::Fixed(_) => f.write_str("ServerCerts::Fixed"),
            Source::Issued(r) => f
                .debug_struct("ServerCerts::Issued")
                .field("ca", &r.ca)
                .field("names", &r.names)
                .finish(),
        }
    }
}

impl ServerCerts {
    /// The operator's certificate chain (PEM, leaf first) and its private key (PEM: PKCS#8,
    /// PKCS#1 or SEC1).
    pub fn from_files(cert: &Path, key: &Path) -> Result<ServerCerts, Error> {
        let invalid = |path: &Path, reason: String| Error::Invalid {
            path: path.to_path_buf(),
            reason,
        };
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .map_err(|e| invalid(cert, e.to_string()))?
            .collect::<Result<_, _>>()
            .map_err(|e| invalid(cert, e.to_string()))?;
        if chain.is_empty() {
            return Err(invalid(cert, "no certificate in the file".into()));
        }
        let der = PrivateKeyDer::from_pem_file(key).map_err(|e| invalid(key, e.to_string()))?;
        let signer = rustls::crypto::ring::sign::any_supported_type(&der)
            .map_err(|e| invalid(key, e.to_string()))?;
        let certified = CertifiedKey::new(chain, signer);
        certified.keys_match().map_err(|e| {
            invalid(
                key,
                format!(
                    "not the key of the first certificate in {}: {e}",
                    cert.display()
                ),
            )
        })?;
        Ok(ServerCerts {
            source: Source::Fixed(Arc::new(certified)),
        })
    }

    /// Leaves of `ca` for `names`; the first is issued now.
    pub fn issued(ca: LocalCa, names: Vec<String>) -> Result<ServerCerts, Error> {
        let first = ca.issue(&names, LEAF_LIFETIME)?;
        Ok(ServerCerts {
            source: Source::Issued(Box::new(Renewing {
                ca,
                names,
                current: Mutex::new(first),
            })),
        })
    }

    /// The DNS names of the certificate served now (its subject alternative names).
    pub fn names(&self) -> Vec<String> {
        self.current()
            .and_then(|k| k.end_entity_cert().ok().map(|c| dns_names(c)))
            .unwrap_or_default()
    }

    fn current(&self) -> Option<Arc<CertifiedKey>> {
        match &self.source {
            Source::Fixed(key) => Some(key.clone()),
            Source::Issued(r) => {
                let mut current = r.current.lock().unwrap_or_else(|p| p.into_inner());
                if SystemTime::now() + RENEW_BEFORE >= current.not_after {
                    match r.ca.issue(&r.names, LEAF_LIFETIME) {
                        Ok(next) => *current = next,
                        // The old leaf still serves until it expires; say why it was kept.
                        Err(e) => tracing::error!(error = %e, "re-issuing the TLS certificate"),
                    }
                }
                Some(current.key.clone())
            }
        }
    }

    /// Whether this certificate is valid for `name` (exact, or one label under a `*.`
    /// wildcard, as TLS clients match).
    pub fn covers(&self, name: &str) -> bool {
        self.names().iter().any(|n| name_matches(n, name))
    }
}

impl ResolvesServerCert for ServerCerts {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current()
    }
}

/// The DNS subject alternative names of a certificate (empty if it cannot be read).
pub fn dns_names(cert: &CertificateDer<'_>) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert) else {
        return Vec::new();
    };
    let Ok(Some(san)) = parsed.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::DNSName(d) => Some(d.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

fn name_matches(pattern: &str, name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    match pattern.strip_prefix("*.") {
        Some(parent) => name
            .split_once('.')
            .is_some_and(|(label, rest)| !label.is_empty() && rest == parent),
        None => pattern == name,
    }
}

//! Certificates the egress proxy shows sandboxes when it terminates TLS to a host whose
//! requests get headers (secrets brokered at egress, `docs/secrets.md`): a leaf per host name
//! (the client's SNI), issued on first use by the server's unconstrained egress CA
//! ([`LocalCa::load_or_create_unconstrained`]), kept in memory and re-issued before it expires.
//! Sandboxes trust the CA; nothing else is ever told to. Used by `warren-net`'s broker.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::ca::{Issued, LocalCa};
use crate::{valid_domain, Error};

/// How long a leaf is valid, and how long before its end a new one is issued.
const LEAF_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);
const RENEW_BEFORE: Duration = Duration::from_secs(24 * 3600);
/// Leaves kept at most (a new one past this empties the cache: leaves are cheap to remake).
const MAX_LEAVES: usize = 4096;

/// Leaves of the egress CA by host name.
pub struct EgressCerts {
    ca: LocalCa,
    leaves: Mutex<HashMap<String, Issued>>,
}

impl std::fmt::Debug for EgressCerts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressCerts")
            .field("ca", &self.ca)
            .finish_non_exhaustive()
    }
}

impl EgressCerts {
    pub fn new(ca: LocalCa) -> EgressCerts {
        EgressCerts {
            ca,
            leaves: Mutex::new(HashMap::new()),
        }
    }

    /// The CA's certificate, PEM: what sandboxes are given to trust.
    pub fn ca_pem(&self) -> &str {
        self.ca.cert_pem()
    }

    /// The leaf for `host` (a DNS name), issued now if there is none or it is about to end.
    pub fn leaf(&self, host: &str) -> Result<Arc<CertifiedKey>, Error> {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        if !valid_domain(&host) {
            return Err(Error::BadName(host));
        }
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = leaves.get(&host) {
            if SystemTime::now() + RENEW_BEFORE < l.not_after {
                return Ok(l.key.clone());
            }
        }
        let issued = self.ca.issue(std::slice::from_ref(&host), LEAF_LIFETIME)?;
        let key = issued.key.clone();
        if leaves.len() >= MAX_LEAVES {
            leaves.clear();
        }
        leaves.insert(host, issued);
        Ok(key)
    }
}

impl ResolvesServerCert for EgressCerts {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = hello.server_name()?;
        match self.leaf(name) {
            Ok(k) => Some(k),
            Err(e) => {
                tracing::warn!(host = %name, error = %e, "no egress certificate for this name");
                None
            }
        }
    }
}

/// The rustls settings of the egress proxy's TLS side: TLS 1.3, ALPN `http/1.1` only (the
/// request rewriter speaks HTTP/1.1), leaves from `certs`.
pub fn egress_server_config(certs: Arc<EgressCerts>) -> Result<Arc<rustls::ServerConfig>, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(certs);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

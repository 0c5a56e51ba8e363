//! Secrets brokered at egress, wired for `warren serve`: the egress CA in the data dir, the
//! roots upstream servers are checked against, and the control plane as the source of
//! secrets (bound once it has started: sandboxes taken back before that get 502 for a
//! request that needs a secret, never the placeholder's host without it).

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use anyhow::Context;
use warren_control::Control;
use warren_net::{Broker, SecretSource};

/// The control plane, once it exists.
#[derive(Default)]
pub struct ControlSecrets(OnceLock<Control>);

impl ControlSecrets {
    pub fn bind(&self, control: Control) {
        let _ = self.0.set(control);
    }
}

impl SecretSource for ControlSecrets {
    fn secret<'a>(&'a self, sandbox: &'a str, name: &'a str) -> warren_net::SecretFuture<'a> {
        Box::pin(async move {
            let control = self.0.get()?;
            control.brokered_secret(sandbox, name).await
        })
    }
}

/// The broker of this server: the egress CA at `<data>/egress-ca` (made on first start),
/// the host's trust store plus `extra_roots` (PEM files) for upstream servers.
pub fn broker(
    data_dir: &Path,
    extra_roots: &[PathBuf],
    secrets: Arc<ControlSecrets>,
) -> anyhow::Result<Arc<Broker>> {
    let dir = data_dir.join("egress-ca");
    let (ca, created) = warren_tls::LocalCa::load_or_create_unconstrained(&dir)
        .context("the egress certificate authority")?;
    if created {
        tracing::info!(dir = %dir.display(), "created the egress CA (sandboxes trust it)");
    }
    let mut roots = Vec::new();
    for file in extra_roots {
        let pem = std::fs::read(file)
            .with_context(|| format!("reading --egress-ca {}", file.display()))?;
        let certs: Vec<_> = pem_certs(&pem)
            .with_context(|| format!("--egress-ca {}: not PEM certificates", file.display()))?;
        roots.extend(certs);
    }
    let certs = Arc::new(warren_tls::EgressCerts::new(ca));
    Ok(Arc::new(
        Broker::new(certs, roots, secrets).context("the egress proxy's TLS settings")?,
    ))
}

fn pem_certs(pem: &[u8]) -> anyhow::Result<Vec<rustls::pki_types::CertificateDer<'static>>> {
    use rustls::pki_types::pem::PemObject;
    let certs =
        rustls::pki_types::CertificateDer::pem_slice_iter(pem).collect::<Result<Vec<_>, _>>()?;
    anyhow::ensure!(!certs.is_empty(), "no certificate in it");
    Ok(certs)
}

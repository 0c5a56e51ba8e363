//! The host's trust store, which the server's own HTTPS clients (webhook deliveries, OTLP
//! export) verify the far end against.

use rustls::pki_types::CertificateDer;

/// The host's trusted root certificates, read once; what cannot be read is logged and left
/// out.
pub fn host_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: std::sync::OnceLock<Vec<CertificateDer<'static>>> = std::sync::OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            // Its message already carries its cause.
            tracing::warn!(error = %e, "reading the host's trust store");
        }
        found.certs
    })
}

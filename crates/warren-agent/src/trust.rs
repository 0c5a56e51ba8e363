//! Certificates the control plane tells the sandbox to trust (`caBundle` of `/init`): the
//! egress CA whose leaves the egress proxy shows when it brokers secrets to a host. They are
//! appended to the image's system bundles (Debian, RHEL and Alpine paths) and kept in a file
//! of their own, and the usual variables point at them where the sandbox's creator did not set
//! them, so OpenSSL, curl, Python `requests` (certifi otherwise) and Node.js trust them.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// System bundles, in the order tried; every one that exists gets the certificates.
const BUNDLES: [&str; 4] = [
    "etc/ssl/certs/ca-certificates.crt",
    "etc/pki/tls/certs/ca-bundle.crt",
    "etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "etc/ssl/cert.pem",
];
/// The certificates alone (where `update-ca-certificates` would also find them).
const OWN: &str = "usr/local/share/ca-certificates/warren-egress.crt";

/// Whether `pem` holds at least one certificate and nothing but PEM text.
pub fn valid(pem: &str) -> bool {
    pem.contains("-----BEGIN CERTIFICATE-----")
        && pem.contains("-----END CERTIFICATE-----")
        && pem
            .bytes()
            .all(|b| b.is_ascii_graphic() || b.is_ascii_whitespace())
}

/// Installs `pem` under `root` (`/` in a sandbox) and returns the variables to set where
/// unset. Idempotent: a bundle that already holds it is left alone (a restored or resumed
/// sandbox is initialised again).
pub fn install(root: &Path, pem: &str) -> io::Result<BTreeMap<String, String>> {
    let pem = format!("{}\n", pem.trim_end());
    let own = root.join(OWN);
    if let Some(dir) = own.parent() {
        std::fs::create_dir_all(dir)?;
    }
    write_atomic(&own, pem.as_bytes())?;
    let mut done: Vec<PathBuf> = Vec::new();
    let mut first = None;
    for rel in BUNDLES {
        let path = root.join(rel);
        // Bundles are often links to one another (Alpine's cert.pem): append once.
        let Ok(real) = std::fs::canonicalize(&path) else {
            continue;
        };
        if done.contains(&real) {
            first.get_or_insert(path);
            continue;
        }
        let text = std::fs::read_to_string(&real)?;
        if !text.contains(pem.trim_end()) {
            let mut f = std::fs::OpenOptions::new().append(true).open(&real)?;
            if !text.is_empty() && !text.ends_with('\n') {
                f.write_all(b"\n")?;
            }
            f.write_all(pem.as_bytes())?;
            f.sync_all()?;
        }
        done.push(real);
        first.get_or_insert(path);
    }
    let bundle = match first {
        Some(b) => b,
        None => {
            // An image without a store (a distroless or scratch-based one): make the usual one.
            let b = root.join(BUNDLES[0]);
            if let Some(dir) = b.parent() {
                std::fs::create_dir_all(dir)?;
            }
            write_atomic(&b, pem.as_bytes())?;
            b
        }
    };
    let in_sandbox = |p: &Path| {
        Path::new("/")
            .join(p.strip_prefix(root).unwrap_or(p))
            .display()
            .to_string()
    };
    let bundle = in_sandbox(&bundle);
    Ok(BTreeMap::from([
        ("SSL_CERT_FILE".to_string(), bundle.clone()),
        ("REQUESTS_CA_BUNDLE".to_string(), bundle.clone()),
        ("CURL_CA_BUNDLE".to_string(), bundle),
        ("NODE_EXTRA_CA_CERTS".to_string(), in_sandbox(&own)),
    ]))
}

fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("warren-tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    #[test]
    fn appends_once_to_every_bundle_and_points_the_variables_at_them() {
        let root = tempfile::tempdir().unwrap();
        let debian = root.path().join(BUNDLES[0]);
        std::fs::create_dir_all(debian.parent().unwrap()).unwrap();
        std::fs::write(&debian, "existing").unwrap();
        std::os::unix::fs::symlink(&debian, root.path().join(BUNDLES[3])).unwrap();
        let vars = install(root.path(), PEM).unwrap();
        install(root.path(), PEM).unwrap();
        let text = std::fs::read_to_string(&debian).unwrap();
        assert_eq!(text, format!("existing\n{PEM}"));
        assert_eq!(vars["SSL_CERT_FILE"], "/etc/ssl/certs/ca-certificates.crt");
        assert_eq!(
            vars["NODE_EXTRA_CA_CERTS"],
            "/usr/local/share/ca-certificates/warren-egress.crt"
        );
        assert_eq!(std::fs::read_to_string(root.path().join(OWN)).unwrap(), PEM);
    }

    #[test]
    fn an_image_without_a_store_gets_one() {
        let root = tempfile::tempdir().unwrap();
        let vars = install(root.path(), PEM).unwrap();
        assert_eq!(
            std::fs::read_to_string(root.path().join(BUNDLES[0])).unwrap(),
            PEM
        );
        assert_eq!(vars["CURL_CA_BUNDLE"], "/etc/ssl/certs/ca-certificates.crt");
        assert!(valid(PEM) && !valid("junk") && !valid(&format!("{PEM}\u{0}")));
    }
}

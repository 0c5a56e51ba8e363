//! The local certificate authorities: made once, kept in the data dir; the domain mode's is
//! constrained to one domain, the egress proxy's to nothing (rule hosts are arbitrary).

use std::fmt;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, GeneralSubtree, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, NameConstraints, PublicKeyData,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;

use crate::{valid_domain, Error};

/// File names inside the CA's directory.
const CERT_FILE: &str = "ca.crt";
const KEY_FILE: &str = "ca.key";

/// How long the CA itself is valid: clients install it once.
const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// A certificate authority whose certificate clients trust and whose key stays in its directory.
pub struct LocalCa {
    /// Names this CA may sign: those under this domain, or (`None`) any.
    domain: Option<String>,
    issuer: Issuer<'static, KeyPair>,
    cert_der: CertificateDer<'static>,
    cert_pem: String,
    cert_path: PathBuf,
}

impl fmt::Debug for LocalCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalCa")
            .field("domain", &self.domain)
            .field("cert_path", &self.cert_path)
            .finish_non_exhaustive()
    }
}

/// A leaf certificate with its key, ready to serve, and when it stops being valid.
pub(crate) struct Issued {
    pub(crate) key: Arc<CertifiedKey>,
    pub(crate) not_after: SystemTime,
}

impl LocalCa {
    /// The CA for names under `domain` kept in `dir` (`ca.crt`, readable by all; `ca.key`,
    /// 0600), made there on the first call. The bool says whether it was just made.
    ///
    /// The key is written (and synced) before the certificate, and a certificate is only ever
    /// published beside its key, so a crash in between leaves a key without a certificate,
    /// which the next call replaces. A certificate without its key is an error: clients may
    /// trust that certificate, and a new CA would silently break them.
    pub fn load_or_create(dir: &Path, domain: &str) -> Result<(LocalCa, bool), Error> {
        if !valid_domain(domain) {
            return Err(Error::BadName(domain.to_string()));
        }
        Self::load_or_create_scoped(dir, Some(domain.to_ascii_lowercase()))
    }

    /// A CA without a name constraint, kept in `dir` like [`LocalCa::load_or_create`]'s: the
    /// egress proxy's, which signs leaves for whatever hosts sandboxes' rules name. Only
    /// sandboxes are told to trust it, never a user's machine.
    pub fn load_or_create_unconstrained(dir: &Path) -> Result<(LocalCa, bool), Error> {
        Self::load_or_create_scoped(dir, None)
    }

    fn load_or_create_scoped(dir: &Path, domain: Option<String>) -> Result<(LocalCa, bool), Error> {
        let cert_path = dir.join(CERT_FILE);
        let key_path = dir.join(KEY_FILE);
        if cert_path.exists() {
            let key_pem = fs::read_to_string(&key_path).map_err(|source| Error::Io {
                path: key_path.clone(),
                source,
            })?;
            let cert_pem = fs::read_to_string(&cert_path).map_err(|source| Error::Io {
                path: cert_path.clone(),
                source,
            })?;
            return Ok((
                Self::from_pem(domain, cert_path, cert_pem, &key_pem)?,
                false,
            ));
        }
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| Error::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        let key = KeyPair::generate()?;
        let params = ca_params(domain.as_deref())?;
        let cert = params.self_signed(&key)?;
        write_new(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
        write_new(&cert_path, cert.pem().as_bytes(), 0o644)?;
        let cert_pem = cert.pem();
        Ok((
            LocalCa {
                domain,
                cert_der: cert.der().clone(),
                issuer: Issuer::new(params, key),
                cert_pem,
                cert_path,
            },
            true,
        ))
    }

    fn from_pem(
        domain: Option<String>,
        cert_path: PathBuf,
        cert_pem: String,
        key_pem: &str,
    ) -> Result<LocalCa, Error> {
        let invalid = |path: &Path, reason: String| Error::Invalid {
            path: path.to_path_buf(),
            reason,
        };
        let key_path = cert_path.with_file_name(KEY_FILE);
        let key = KeyPair::from_pem(key_pem).map_err(|e| invalid(&key_path, e.to_string()))?;
        let cert_der = CertificateDer::from(
            rcgen_pem_der(&cert_pem).map_err(|reason| invalid(&cert_path, reason))?,
        );
        let (_, parsed) = x509_parser::parse_x509_certificate(&cert_der)
            .map_err(|e| invalid(&cert_path, format!("not an X.509 certificate: {e}")))?;
        if parsed.public_key().raw != key.subject_public_key_info().as_slice() {
            return Err(invalid(
                &cert_path,
                format!("its key is not the one in {}", key_path.display()),
            ));
        }
        let names = permitted_dns_names(&parsed);
        let want: Vec<&str> = domain.iter().map(String::as_str).collect();
        if names != want {
            return Err(invalid(
                &cert_path,
                format!(
                    "this CA signs names under {names:?}, not under {want:?}; a CA of another \
                     domain (or the unconstrained egress CA) belongs in another directory"
                ),
            ));
        }
        let issuer = Issuer::from_ca_cert_der(&cert_der, key)
            .map_err(|e| invalid(&cert_path, e.to_string()))?;
        Ok(LocalCa {
            domain,
            issuer,
            cert_der,
            cert_pem,
            cert_path,
        })
    }

    /// The domain whose names this CA signs (`None`: any name).
    pub fn domain(&self) -> Option<&str> {
        self.domain.as_deref()
    }

    /// Where the CA's certificate is: the file clients are told to trust.
    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    /// The CA's certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's certificate, DER.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// A server certificate for `names` (each the domain or under it; `*.` wildcards allowed)
    /// with a fresh key, valid from an hour ago for `lifetime`, chained to this CA.
    pub(crate) fn issue(&self, names: &[String], lifetime: Duration) -> Result<Issued, Error> {
        for name in names {
            let bare = name.strip_prefix("*.").unwrap_or(name);
            let under = match &self.domain {
                None => true,
                Some(d) => {
                    bare.eq_ignore_ascii_case(d)
                        || bare.to_ascii_lowercase().ends_with(&format!(".{d}"))
                }
            };
            if !valid_domain(bare) || !under {
                return Err(Error::BadName(name.clone()));
            }
        }
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names.to_vec())?;
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().cloned().unwrap_or_default(),
        );
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let now = SystemTime::now();
        let not_after = now + lifetime;
        params.not_before = (now - Duration::from_secs(3600)).into();
        params.not_after = not_after.into();
        let cert = params.signed_by(&key, &self.issuer)?;
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signer = rustls::crypto::ring::sign::any_supported_type(&der)?;
        Ok(Issued {
            key: Arc::new(CertifiedKey::new(
                vec![cert.der().clone(), self.cert_der.clone()],
                signer,
            )),
            not_after,
        })
    }
}

fn ca_params(domain: Option<&str>) -> Result<CertificateParams, Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let name = match domain {
        Some(d) => format!("Warren local CA for {d}"),
        None => "Warren egress CA".to_string(),
    };
    params.distinguished_name.push(DnType::CommonName, name);
    params
        .distinguished_name
        .push(DnType::OrganizationName, "Warren");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    // Trusting the domain mode's CA trusts names under the domain, and nothing else.
    params.name_constraints = domain.map(|d| NameConstraints {
        permitted_subtrees: vec![GeneralSubtree::DnsName(d.to_string())],
        excluded_subtrees: vec![],
    });
    let now = SystemTime::now();
    params.not_before = (now - Duration::from_secs(3600)).into();
    params.not_after = (now + CA_LIFETIME).into();
    Ok(params)
}

/// The DNS names a CA certificate's name constraints permit.
fn permitted_dns_names(cert: &x509_parser::certificate::X509Certificate<'_>) -> Vec<String> {
    use x509_parser::extensions::{GeneralName, ParsedExtension};
    let mut names = Vec::new();
    for ext in cert.extensions() {
        if let ParsedExtension::NameConstraints(nc) = ext.parsed_extension() {
            for subtree in nc.permitted_subtrees.iter().flatten() {
                if let GeneralName::DNSName(n) = subtree.base {
                    names.push(n.to_ascii_lowercase());
                }
            }
        }
    }
    names
}

/// The DER inside the first PEM block of `pem`.
fn rcgen_pem_der(pem: &str) -> Result<Vec<u8>, String> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(pem.as_bytes())
        .map(|c| c.to_vec())
        .map_err(|e| format!("not a PEM certificate: {e}"))
}

/// Writes a file that did not exist (or was left by a crash before its certificate was
/// published), synced, through a temporary name so that it appears whole or not at all.
fn write_new(path: &Path, data: &[u8], mode: u32) -> Result<(), Error> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io)?;
    f.write_all(data).map_err(io)?;
    f.sync_all().map_err(io)?;
    drop(f);
    fs::rename(&tmp, path).map_err(io)?;
    if let Some(dir) = path.parent() {
        fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
    }
    Ok(())
}

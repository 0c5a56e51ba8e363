use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConnection};

use super::*;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A whole TLS handshake in memory: a client trusting only `root` asks `server` for `name`.
fn handshake(
    server: Arc<rustls::ServerConfig>,
    root: &CertificateDer<'static>,
    name: &str,
) -> Result<Option<Vec<u8>>, rustls::Error> {
    let mut roots = RootCertStore::empty();
    roots.add(root.clone())?;
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let name = ServerName::try_from(name.to_string()).expect("server name");
    let mut client = ClientConnection::new(Arc::new(config), name)?;
    let mut server = ServerConnection::new(server)?;
    for _ in 0..20 {
        let mut buf = Vec::new();
        client.write_tls(&mut buf).unwrap();
        server.read_tls(&mut buf.as_slice()).unwrap();
        server.process_new_packets()?;
        let mut buf = Vec::new();
        server.write_tls(&mut buf).unwrap();
        client.read_tls(&mut buf.as_slice()).unwrap();
        client.process_new_packets()?;
        if !client.is_handshaking() && !server.is_handshaking() {
            return Ok(client.alpn_protocol().map(<[u8]>::to_vec));
        }
    }
    panic!("the handshake did not finish");
}

#[test]
fn a_new_ca_is_private_and_loads_again() {
    let dir = tempfile::tempdir().unwrap();
    let ca_dir = dir.path().join("tls");
    let (ca, created) = LocalCa::load_or_create(&ca_dir, "Warren.Test").unwrap();
    assert!(created);
    assert_eq!(ca.domain(), Some("warren.test"));
    let mode = |f: &str| {
        std::fs::metadata(ca_dir.join(f))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("ca.key"), 0o600);
    assert_eq!(mode("ca.crt"), 0o644);
    assert_eq!(mode(""), 0o700);
    let (again, created) = LocalCa::load_or_create(&ca_dir, "warren.test").unwrap();
    assert!(!created);
    assert_eq!(again.cert_pem(), ca.cert_pem());
    assert_eq!(
        std::fs::read_to_string(ca.cert_path()).unwrap(),
        ca.cert_pem()
    );
}

#[test]
fn leaves_serve_every_name_under_the_domain_over_h2() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, _) = LocalCa::load_or_create(dir.path(), "warren.test").unwrap();
    let root = ca.cert_der().clone();
    let certs =
        ServerCerts::issued(ca, vec!["warren.test".into(), "*.warren.test".into()]).unwrap();
    assert!(certs.covers("49983-abc123.warren.test"));
    assert!(certs.covers("api.warren.test"));
    assert!(certs.covers("warren.test"));
    assert!(!certs.covers("a.b.warren.test"));
    assert!(!certs.covers("warren.test.evil"));
    let config = server_config(Arc::new(certs)).unwrap();
    for name in ["49983-abc123.warren.test", "api.warren.test", "warren.test"] {
        let alpn = handshake(config.clone(), &root, name).unwrap();
        assert_eq!(alpn.as_deref(), Some(&b"h2"[..]), "{name}");
    }
    // A name the leaf does not carry fails verification.
    let err = handshake(config, &root, "other.test").unwrap_err();
    assert!(
        matches!(err, rustls::Error::InvalidCertificate(_)),
        "{err:?}"
    );
}

#[test]
fn the_ca_cannot_vouch_for_names_outside_its_domain() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, _) = LocalCa::load_or_create(dir.path(), "warren.test").unwrap();
    // Through the API: refused.
    assert!(matches!(
        ServerCerts::issued(LoadedAgain::ca(dir.path()), vec!["bank.example".into()]),
        Err(Error::BadName(_))
    ));
    // With the key itself (what a thief of ca.key could do): clients refuse the leaf, because
    // the CA's name constraint does not permit the name.
    let key =
        rcgen::KeyPair::from_pem(&std::fs::read_to_string(dir.path().join("ca.key")).unwrap())
            .unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_pem(ca.cert_pem(), key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["bank.example".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let der = rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
    let signer = rustls::crypto::ring::sign::any_supported_type(&der).unwrap();
    let forged =
        rustls::sign::CertifiedKey::new(vec![leaf.der().clone(), ca.cert_der().clone()], signer);
    #[derive(Debug)]
    struct Fixed(Arc<rustls::sign::CertifiedKey>);
    impl rustls::server::ResolvesServerCert for Fixed {
        fn resolve(
            &self,
            _: rustls::server::ClientHello<'_>,
        ) -> Option<Arc<rustls::sign::CertifiedKey>> {
            Some(self.0.clone())
        }
    }
    let config = server_config(Arc::new(Fixed(Arc::new(forged)))).unwrap();
    let err = handshake(config, ca.cert_der(), "bank.example").unwrap_err();
    assert!(
        matches!(err, rustls::Error::InvalidCertificate(_)),
        "{err:?}"
    );
}

/// The CA of a directory, loaded again (each `LocalCa` owns its key).
struct LoadedAgain;
impl LoadedAgain {
    fn ca(dir: &std::path::Path) -> LocalCa {
        LocalCa::load_or_create(dir, "warren.test").unwrap().0
    }
}

#[test]
fn a_ca_of_another_domain_or_with_another_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    LocalCa::load_or_create(dir.path(), "warren.test").unwrap();
    let err = LocalCa::load_or_create(dir.path(), "other.test").unwrap_err();
    assert!(err.to_string().contains("another domain"), "{err}");
    // Someone replaced the key: the certificate clients trust no longer matches it.
    let other = tempfile::tempdir().unwrap();
    LocalCa::load_or_create(other.path(), "warren.test").unwrap();
    std::fs::copy(other.path().join("ca.key"), dir.path().join("ca.key")).unwrap();
    let err = LocalCa::load_or_create(dir.path(), "warren.test").unwrap_err();
    assert!(err.to_string().contains("its key is not"), "{err}");
    // A certificate without its key: an error, never a silent new CA.
    std::fs::remove_file(dir.path().join("ca.key")).unwrap();
    assert!(matches!(
        LocalCa::load_or_create(dir.path(), "warren.test"),
        Err(Error::Io { .. })
    ));
}

#[test]
fn a_key_left_without_its_certificate_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.key"), "left by a crash").unwrap();
    let (_, created) = LocalCa::load_or_create(dir.path(), "warren.test").unwrap();
    assert!(created);
    assert!(LocalCa::load_or_create(dir.path(), "warren.test").is_ok());
}

#[test]
fn operator_certificates_load_and_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["*.sbx.example.test".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let cert_path = dir.path().join("cert.pem");
    let key_path = dir.path().join("key.pem");
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    let certs = ServerCerts::from_files(&cert_path, &key_path).unwrap();
    assert_eq!(certs.names(), vec!["*.sbx.example.test".to_string()]);
    assert!(certs.covers("49983-x.sbx.example.test"));
    let config = server_config(Arc::new(certs)).unwrap();
    assert!(handshake(config, cert.der(), "8000-abc.sbx.example.test").is_ok());

    // Another key: refused with the reason.
    let other = rcgen::KeyPair::generate().unwrap();
    std::fs::write(&key_path, other.serialize_pem()).unwrap();
    let err = ServerCerts::from_files(&cert_path, &key_path).unwrap_err();
    assert!(err.to_string().contains("not the key"), "{err}");
    // Not PEM at all.
    std::fs::write(&cert_path, "hello").unwrap();
    assert!(ServerCerts::from_files(&cert_path, &key_path).is_err());
}

#[test]
fn domains_are_checked() {
    assert!(valid_domain("sbx.example.com"));
    assert!(valid_domain("localhost"));
    assert!(!valid_domain(""));
    assert!(!valid_domain("a..b"));
    assert!(!valid_domain("-a.b"));
    assert!(!valid_domain("a_b.c"));
    assert!(!valid_domain("a.b:443"));
    assert!(matches!(
        LocalCa::load_or_create(std::path::Path::new("/nonexistent"), "a b"),
        Err(Error::BadName(_))
    ));
}

#[test]
fn the_egress_ca_signs_any_host_and_reuses_its_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, made) = LocalCa::load_or_create_unconstrained(&dir.path().join("egress")).unwrap();
    assert!(made && ca.domain().is_none());
    let root = ca.cert_der().clone();
    let certs = Arc::new(EgressCerts::new(ca));
    let config = egress_server_config(certs.clone()).unwrap();
    for host in ["api.example.com", "other.test", "API.Example.COM"] {
        let alpn = handshake(config.clone(), &root, host).unwrap();
        assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]), "{host}");
    }
    let a = certs.leaf("api.example.com").unwrap();
    let b = certs.leaf("API.example.com.").unwrap();
    assert!(Arc::ptr_eq(&a, &b), "one leaf per host, reused");
    assert!(certs.leaf("not a host").is_err());
    // A client that does not trust the egress CA gets nowhere.
    let (other, _) = LocalCa::load_or_create_unconstrained(&dir.path().join("other")).unwrap();
    assert!(handshake(config, other.cert_der(), "api.example.com").is_err());
    // It loads again as an unconstrained CA, and not as a domain's.
    let (again, made) = LocalCa::load_or_create_unconstrained(&dir.path().join("egress")).unwrap();
    assert!(!made && again.cert_der() == &root);
    assert!(LocalCa::load_or_create(&dir.path().join("egress"), "warren.test").is_err());
}

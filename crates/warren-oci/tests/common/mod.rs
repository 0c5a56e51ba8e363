//! A real registry on loopback (Debian's `docker-registry`), and images this test suite makes
//! and pushes itself. Nothing here reaches a public registry.

#![allow(dead_code)]

use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use oci_client::client::ImageLayer;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol, Config};
use oci_client::manifest::{OciImageIndex, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";
pub const HTPASSWD_BIN: &str = "/usr/bin/htpasswd";

/// Whether the registry (and, for `auth`, htpasswd) can run here; prints `SKIP:` or, under
/// `WARREN_REQUIRE_ALL=1`, fails.
pub fn have_registry(auth: bool) -> bool {
    if !warren_testkit::require(
        "Debian's docker-registry (apt-get install docker-registry)",
        Path::new(REGISTRY_BIN).exists(),
    ) {
        return false;
    }
    !auth
        || warren_testkit::require(
            "htpasswd (apt-get install apache2-utils)",
            Path::new(HTPASSWD_BIN).exists(),
        )
}

/// A `docker-registry serve` child on 127.0.0.1, killed (by its PID) on drop.
pub struct Registry {
    child: Child,
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    /// The registry's combined output: its access log counts blob fetches.
    pub log: PathBuf,
    /// The CA (the self-signed certificate) when it serves HTTPS.
    pub ca: Option<PathBuf>,
    pub auth: RegistryAuth,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

impl Registry {
    /// A plain-HTTP registry without auth.
    pub fn start() -> Registry {
        Registry::start_with(None)
    }

    /// With `Some((user, password))`: HTTPS with a self-signed certificate for 127.0.0.1, and
    /// htpasswd auth.
    pub fn start_with(user: Option<(&str, &str)>) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
        let mut config = format!(
            "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: {addr}\n  secret: test-only\n",
            dir.path().join("data").display()
        );
        let mut ca = None;
        let mut auth = RegistryAuth::Anonymous;
        if let Some((name, password)) = user {
            let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
            let cert_path = dir.path().join("cert.pem");
            let key_path = dir.path().join("key.pem");
            std::fs::write(&cert_path, cert.cert.pem()).unwrap();
            std::fs::write(&key_path, cert.signing_key.serialize_pem()).unwrap();
            let htpasswd = dir.path().join("htpasswd");
            let st = Command::new(HTPASSWD_BIN)
                .arg("-Bbc")
                .arg(&htpasswd)
                .arg(name)
                .arg(password)
                .stderr(Stdio::null())
                .status()
                .unwrap();
            assert!(st.success(), "htpasswd failed");
            config.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\nauth:\n  htpasswd:\n    realm: test\n    path: {}\n",
                cert_path.display(),
                key_path.display(),
                htpasswd.display()
            ));
            ca = Some(cert_path);
            auth = RegistryAuth::Basic(name.into(), password.into());
        }
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        let log = dir.path().join("registry.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("starting docker-registry");
        let mut reg = Registry {
            child,
            addr,
            dir,
            log,
            ca,
            auth,
        };
        // Bounded wait for the listener (a readiness check, not a timing assertion).
        for _ in 0..200 {
            if TcpStream::connect(addr).is_ok() {
                return reg;
            }
            if let Ok(Some(status)) = reg.child.try_wait() {
                panic!(
                    "docker-registry exited with {status}: {}",
                    std::fs::read_to_string(&reg.log).unwrap_or_default()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("docker-registry did not listen on {addr}");
    }

    /// `127.0.0.1:<port>`.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// Pushes to this registry with its own credentials.
    pub fn pusher(&self) -> Pusher {
        Pusher {
            host: self.host(),
            auth: self.auth.clone(),
            ca: self.ca.clone(),
        }
    }

    /// How many times the access log shows a GET of a blob.
    pub fn blob_gets(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("\"GET /v2/") && l.contains("/blobs/sha256:"))
            .count()
    }

    pub async fn push(&self, repo: &str, tag: &str, image: &TestImage) -> String {
        self.pusher().push(repo, tag, image).await
    }

    pub async fn push_index(&self, repo: &str, tag: &str, entries: &[(String, i64, &str)]) {
        self.pusher().push_index(repo, tag, entries).await
    }

    pub async fn manifest_size(&self, repo: &str, digest: &str) -> i64 {
        self.pusher().manifest_size(repo, digest).await
    }
}

/// Pushes test images to a registry at `host` (plain HTTP unless `ca` is given).
pub struct Pusher {
    pub host: String,
    pub auth: RegistryAuth,
    pub ca: Option<PathBuf>,
}

impl Pusher {
    /// A client that pushes to this registry.
    pub fn client(&self) -> Client {
        let mut config = ClientConfig::default();
        if let Some(ca) = &self.ca {
            config.extra_root_certificates = vec![Certificate {
                encoding: CertificateEncoding::Pem,
                data: std::fs::read(ca).unwrap(),
            }];
        } else {
            config.protocol = ClientProtocol::HttpsExcept(vec![self.host.clone()]);
        }
        let _ = rustls::crypto::ring::default_provider().install_default();
        Client::try_from(config).unwrap()
    }

    /// Pushes `image` as `repo:tag`; returns the manifest digest.
    pub async fn push(&self, repo: &str, tag: &str, image: &TestImage) -> String {
        let reference: Reference = format!("{}/{repo}:{tag}", self.host.clone())
            .parse()
            .unwrap();
        let client = self.client();
        let layers: Vec<ImageLayer> = image
            .layers
            .iter()
            .map(|(data, media_type)| ImageLayer::new(data.clone(), media_type.clone(), None))
            .collect();
        let config = Config::new(
            image.config.clone(),
            "application/vnd.oci.image.config.v1+json".into(),
            None,
        );
        let manifest = OciImageManifest::build(&layers, &config, None);
        client
            .push(&reference, &layers, config, &self.auth, Some(manifest))
            .await
            .expect("push");
        client
            .fetch_manifest_digest(&reference, &self.auth)
            .await
            .expect("pushed manifest digest")
    }

    /// Pushes an image index `repo:tag` listing `entries` (digest, size, arch).
    pub async fn push_index(&self, repo: &str, tag: &str, entries: &[(String, i64, &str)]) {
        let reference: Reference = format!("{}/{repo}:{tag}", self.host.clone())
            .parse()
            .unwrap();
        let manifests: Vec<_> = entries
            .iter()
            .map(|(digest, size, arch)| {
                serde_json::json!({
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": digest, "size": size,
                    "platform": {"architecture": arch, "os": "linux"}
                })
            })
            .collect();
        let index: OciImageIndex = serde_json::from_value(serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": manifests
        }))
        .unwrap();
        self.client()
            .push_manifest_list(&reference, &self.auth, index)
            .await
            .expect("push index");
    }

    /// The size of the manifest `repo@digest`.
    pub async fn manifest_size(&self, repo: &str, digest: &str) -> i64 {
        let reference: Reference = format!("{}/{repo}@{digest}", self.host.clone())
            .parse()
            .unwrap();
        let (raw, _) = self
            .client()
            .pull_manifest_raw(
                &reference,
                &self.auth,
                &["application/vnd.oci.image.manifest.v1+json"],
            )
            .await
            .unwrap();
        raw.len() as i64
    }
}

/// A stand-in HTTP endpoint on a loopback port for what tests cannot reach (ECR's API, a
/// throttling registry): answers `count` requests with `status` and `body`, and sends each
/// request's head (lower-cased) and body back on the channel. Returns `http://addr/`.
pub fn http_endpoint(
    status: &'static str,
    body: String,
    count: usize,
) -> (String, std::sync::mpsc::Receiver<String>) {
    use std::io::{BufRead as _, BufReader, Read as _};
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for _ in 0..count {
            let Ok((mut stream, _)) = listener.accept() else {
                return;
            };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            let mut length = 0;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                let lower = line.to_ascii_lowercase();
                if let Some(v) = lower.strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
                head.push_str(&lower);
            }
            let mut req_body = vec![0; length];
            let _ = reader.read_exact(&mut req_body);
            head.push_str(&String::from_utf8_lossy(&req_body));
            let _ = tx.send(head);
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Retry-After: 30\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (url, rx)
}

/// An image to push: layers (bytes, media type) and a config.
pub struct TestImage {
    pub layers: Vec<(Vec<u8>, String)>,
    pub config: Vec<u8>,
}

pub const TAR: &str = "application/vnd.oci.image.layer.v1.tar";
pub const TAR_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const TAR_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";

/// Builds a tar from `(path, kind)` entries.
pub enum Entry<'a> {
    Dir(&'a str, u32),
    File(&'a str, &'a [u8], u32, u32, u32),
    Symlink(&'a str, &'a str),
    Hardlink(&'a str, &'a str),
}

pub fn tar(entries: &[Entry<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(1_600_000_000);
        match *e {
            Entry::Dir(path, mode) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(mode);
                h.set_size(0);
                b.append_data(&mut h, path, &[][..]).unwrap();
            }
            Entry::File(path, data, mode, uid, gid) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(mode);
                h.set_uid(uid.into());
                h.set_gid(gid.into());
                h.set_size(data.len() as u64);
                b.append_data(&mut h, path, data).unwrap();
            }
            Entry::Symlink(path, target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                b.append_link(&mut h, path, target).unwrap();
            }
            Entry::Hardlink(path, target) => {
                h.set_entry_type(tar::EntryType::Link);
                h.set_mode(0o644);
                h.set_size(0);
                b.append_link(&mut h, path, target).unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

/// A tar entry with a raw (unchecked) path, as a hostile layer would have: the tar crate's
/// builder refuses `..`, so the name is written into the header by hand.
pub fn raw_entry(out: &mut Vec<u8>, path: &str, kind: tar::EntryType, link: &str, data: &[u8]) {
    let mut h = tar::Header::new_old();
    {
        let bytes = h.as_old_mut();
        bytes.name[..path.len()].copy_from_slice(path.as_bytes());
        bytes.linkname[..link.len()].copy_from_slice(link.as_bytes());
    }
    h.set_entry_type(kind);
    h.set_mode(0o644);
    h.set_size(data.len() as u64);
    h.set_mtime(1_600_000_000);
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    let pad = (512 - data.len() % 512) % 512;
    out.extend(std::iter::repeat_n(0u8, pad));
}

pub fn end_tar(out: &mut Vec<u8>) {
    out.extend(std::iter::repeat_n(0u8, 1024));
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

pub fn zstd(data: &[u8]) -> Vec<u8> {
    ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
}

/// The three-layer image most tests pull: a gzip base, a zstd layer with whiteouts and an
/// opaque directory, and a plain tar on top.
pub fn sample_image() -> TestImage {
    let base = tar(&[
        Entry::Dir("etc/", 0o755),
        Entry::File("etc/os-release", b"ID=warren-test\n", 0o644, 0, 0),
        Entry::File("etc/gone", b"deleted above\n", 0o644, 0, 0),
        Entry::Dir("opaque/", 0o755),
        Entry::File("opaque/old", b"hidden by the opaque dir\n", 0o644, 0, 0),
        Entry::Dir("home/", 0o755),
        Entry::Dir("home/app/", 0o750),
        Entry::File(
            "home/app/run.sh",
            b"#!/bin/sh\necho hi\n",
            0o4755,
            1000,
            1001,
        ),
        Entry::Symlink("bin", "usr/bin"),
        Entry::Dir("usr/", 0o755),
        Entry::Dir("usr/bin/", 0o755),
    ]);
    let middle = tar(&[
        Entry::File("etc/.wh.gone", b"", 0o644, 0, 0),
        Entry::Dir("opaque/", 0o700),
        Entry::File("opaque/.wh..wh..opq", b"", 0o644, 0, 0),
        Entry::File("opaque/new", b"from layer two\n", 0o600, 0, 0),
        Entry::File("bin/tool", b"through the bin symlink\n", 0o755, 0, 0),
    ]);
    let top = tar(&[
        Entry::Hardlink("etc/os-release.link", "etc/os-release"),
        Entry::File("etc/motd", b"top layer\n", 0o644, 0, 0),
    ]);
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {
            "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "GREETING=hello world"],
            "WorkingDir": "/home/app", "User": "1000:1001",
            "Entrypoint": ["/bin/sh", "-c"], "Cmd": ["/home/app/run.sh"],
            "ExposedPorts": {"8080/tcp": {}}
        },
        "rootfs": {"type": "layers", "diff_ids": ["sha256:0", "sha256:1", "sha256:2"]}
    });
    TestImage {
        layers: vec![
            (gzip(&base), TAR_GZIP.into()),
            (zstd(&middle), TAR_ZSTD.into()),
            (top, TAR.into()),
        ],
        config: serde_json::to_vec(&config).unwrap(),
    }
}

/// A one-layer image whose config has the given architecture.
pub fn tiny_image(arch: &str, marker: &str) -> TestImage {
    let layer = tar(&[Entry::File("marker", marker.as_bytes(), 0o644, 0, 0)]);
    let config = serde_json::json!({"architecture": arch, "os": "linux", "config": {}});
    TestImage {
        layers: vec![(gzip(&layer), TAR_GZIP.into())],
        config: serde_json::to_vec(&config).unwrap(),
    }
}

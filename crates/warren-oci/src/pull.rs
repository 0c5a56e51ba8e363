//! Resolving a reference and fetching its blobs into the digest-addressed cache.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::{StreamExt as _, TryStreamExt as _};
use oci_client::client::{
    linux_amd64_resolver, Certificate, CertificateEncoding, ClientConfig, ClientProtocol,
};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt as _;

use crate::error::Ctx;
use crate::guard::Guard;
use crate::policy::Policy;
use crate::{canonical_registry, config, ecr, Credentials, Layer, PullError, PullOptions};
use crate::{Mirror, PulledImage};

/// Layer media types that are filesystem changesets (compression is told by magic bytes).
const LAYER_TYPES: &[&str] = &[
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.oci.image.layer.nondistributable.v1.tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
];

/// Layers fetched at once (Docker's default `max-concurrent-downloads` is 3).
const PARALLEL_LAYERS: usize = 3;

/// A config larger than this is not an image config.
const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// Pulls images; cheap to share (`&self`), and pulls may run at once.
pub struct Puller {
    opts: PullOptions,
    roots: Vec<Vec<u8>>,
    /// The same roots, for the ECR token call's client.
    ecr_roots: Vec<reqwest_oci::Certificate>,
    /// Where a pull's requests may go (see [`crate::guard`]).
    policy: Arc<Policy>,
}

impl std::fmt::Debug for Puller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Puller").field("opts", &self.opts).finish()
    }
}

impl Puller {
    /// Checks the options: creates the cache directory and reads the CA files.
    pub fn new(opts: PullOptions) -> Result<Self, PullError> {
        // reqwest is built without a bundled crypto provider; ring is the one this workspace
        // already links. An error only means another part of the process installed one first.
        let _ = rustls::crypto::ring::default_provider().install_default();
        for dir in [blob_dir(&opts.cache_dir), tmp_dir(&opts.cache_dir)] {
            std::fs::create_dir_all(&dir).map_err(|e| {
                PullError::io(format!("creating the layer cache {}", dir.display()), e)
            })?;
        }
        let policy = Arc::new(Policy::new(&opts)?);
        let mut roots = Vec::new();
        let mut ecr_roots = Vec::new();
        for file in &opts.ca_files {
            let pem = std::fs::read(file)
                .map_err(|e| PullError::io(format!("reading the CA file {}", file.display()), e))?;
            let certs = reqwest_oci::Certificate::from_pem_bundle(&pem).map_err(|e| {
                PullError::io(
                    format!("reading the CA file {}", file.display()),
                    std::io::Error::new(std::io::ErrorKind::InvalidData, e),
                )
            })?;
            if certs.is_empty() {
                return Err(PullError::io(
                    format!("reading the CA file {}", file.display()),
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "it holds no PEM certificate",
                    ),
                ));
            }
            ecr_roots.extend(certs);
            roots.push(pem);
        }
        Ok(Puller {
            opts,
            roots,
            ecr_roots,
            policy,
        })
    }

    fn mirror_for(&self, registry: &str) -> Option<&Mirror> {
        let registry = canonical_registry(registry);
        self.opts.mirrors.iter().find(|m| m.registry == registry)
    }

    /// One OCI client per pull: the client keeps the first credentials it sees per registry,
    /// and pulls with other credentials must not inherit them. All its requests go through
    /// the pull's guard at `proxy`.
    fn client(&self, proxy: &str) -> Result<Client, PullError> {
        // `host:port`, also when written as a URL.
        let mut http_hosts: Vec<String> = self
            .opts
            .insecure
            .iter()
            .map(|h| {
                let h = h.trim();
                let h = h.strip_prefix("http://").unwrap_or(h);
                h.trim_end_matches('/').to_string()
            })
            .collect();
        http_hosts.extend(self.opts.mirrors.iter().filter_map(|m| {
            let (host, http) = m.host();
            http.then(|| host.to_string())
        }));
        let config = ClientConfig {
            protocol: ClientProtocol::HttpsExcept(http_hosts),
            extra_root_certificates: self
                .roots
                .iter()
                .map(|pem| Certificate {
                    encoding: CertificateEncoding::Pem,
                    data: pem.clone(),
                })
                .collect(),
            platform_resolver: Some(Box::new(linux_amd64_resolver)),
            connect_timeout: Some(std::time::Duration::from_secs(30)),
            read_timeout: Some(std::time::Duration::from_secs(120)),
            https_proxy: Some(proxy.to_string()),
            http_proxy: Some(proxy.to_string()),
            ..ClientConfig::default()
        };
        Client::try_from(config).map_err(|e| {
            PullError::io(
                "setting up the registry client",
                std::io::Error::other(e.to_string()),
            )
        })
    }

    /// The ECR token call's client, through the pull's guard at `proxy`.
    fn ecr_client(&self, proxy: &str) -> Result<reqwest_oci::Client, PullError> {
        let setup = |e: reqwest_oci::Error| {
            PullError::io(
                "setting up the HTTPS client",
                std::io::Error::other(Box::new(e)),
            )
        };
        reqwest_oci::Client::builder()
            .tls_certs_merge(self.ecr_roots.iter().cloned())
            .proxy(reqwest_oci::Proxy::all(proxy).map_err(setup)?)
            .build()
            .map_err(setup)
    }

    async fn registry_auth(
        &self,
        creds: &Credentials,
        registry: &str,
        proxy: &str,
    ) -> Result<RegistryAuth, PullError> {
        Ok(match creds {
            Credentials::Anonymous => RegistryAuth::Anonymous,
            Credentials::Basic { username, password } => {
                RegistryAuth::Basic(username.clone(), password.clone())
            }
            Credentials::Gcp {
                service_account_json,
            } => RegistryAuth::Basic("_json_key".into(), service_account_json.clone()),
            Credentials::Aws {
                access_key_id,
                secret_access_key,
                region,
            } => {
                let (user, password) = ecr::basic_auth(
                    &self.ecr_client(proxy)?,
                    self.opts.ecr_endpoint.as_deref(),
                    registry,
                    access_key_id,
                    secret_access_key,
                    region,
                )
                .await?;
                RegistryAuth::Basic(user, password)
            }
        })
    }

    /// Pulls `reference` into the cache: manifest (linux/amd64 from an index), config, and
    /// each layer not already cached. `progress` gets one line per layer.
    ///
    /// Every request goes through a guard that refuses destinations the options do not
    /// allow; a pull that failed after such a refusal fails with [`PullError::NotAllowed`].
    pub async fn pull(
        &self,
        reference: &str,
        creds: &Credentials,
        progress: &(dyn Fn(String) + Send + Sync),
    ) -> Result<PulledImage, PullError> {
        let guard = Guard::start(self.policy.clone())
            .await
            .map_err(|e| PullError::io("starting the pull's address guard", e))?;
        let result = self.pull_via(guard.url(), reference, creds, progress).await;
        result.map_err(|e| explain(&guard, e))
    }

    async fn pull_via(
        &self,
        proxy: &str,
        reference: &str,
        creds: &Credentials,
        progress: &(dyn Fn(String) + Send + Sync),
    ) -> Result<PulledImage, PullError> {
        let mut image = parse_reference(reference)?;
        let normalised = image.whole();
        if let Some(mirror) = self.mirror_for(image.registry()) {
            image.set_mirror_registry(mirror.host().0.to_string());
        }
        let contacted = image.resolve_registry().to_string();
        let ctx = Ctx {
            reference: &normalised,
            registry: &contacted,
            had_credentials: !matches!(creds, Credentials::Anonymous),
            docker_hub: contacted == "index.docker.io",
        };
        let auth = self.registry_auth(creds, &contacted, proxy).await?;
        let client = self.client(proxy)?;
        // An explicit handshake: the pull calls below swallow token-service errors and retry
        // anonymously, which would hide "wrong password" behind a bare 401.
        client
            .auth(&image, &auth, RegistryOperation::Pull)
            .await
            .map_err(|e| ctx.map(e))?;
        let (manifest, manifest_digest, index_digest) = client
            .pull_image_manifest_and_list_digest(&image, &auth)
            .await
            .map_err(|e| ctx.map(e))?;

        if !config::CONFIG_TYPES.contains(&manifest.config.media_type.as_str()) {
            return Err(PullError::Unsupported {
                detail: format!(
                    "{normalised} is not a container image (its config is {})",
                    manifest.config.media_type
                ),
            });
        }
        let mut total: u64 = 0;
        for layer in &manifest.layers {
            check_layer_type(&layer.media_type)?;
            total = total.saturating_add(descriptor_size(layer)?);
        }
        if total > self.opts.max_bytes {
            return Err(PullError::TooLarge {
                limit: self.opts.max_bytes,
            });
        }
        self.check_room(total)?;
        let config_size = descriptor_size(&manifest.config)?;
        if config_size > MAX_CONFIG_BYTES {
            return Err(PullError::bad(format!(
                "the image config is {config_size} bytes, more than any image config needs"
            )));
        }
        let config_path = self
            .fetch(&client, &image, &manifest.config, &ctx, None)
            .await?;
        let config_bytes = std::fs::read(&config_path).map_err(|e| {
            PullError::io(format!("reading the cached {}", config_path.display()), e)
        })?;
        let config = config::parse(&config_bytes, manifest.layers.len())?;

        // A few layers at a time, as Docker does; results stay in manifest order.
        // Owned descriptors: a closure over borrowed ones makes a future that is not `Send`
        // for every lifetime, and callers run pulls on a multi-threaded runtime.
        let layers: Vec<Layer> = futures::stream::iter(manifest.layers.iter().cloned())
            .map(|desc| {
                let (client, image, ctx) = (&client, &image, &ctx);
                async move {
                    let desc = &desc;
                    let path = self.fetch(client, image, desc, ctx, Some(progress)).await?;
                    Ok::<_, PullError>(Layer {
                        digest: desc.digest.clone(),
                        media_type: desc.media_type.clone(),
                        path,
                        size: descriptor_size(desc)?,
                    })
                }
            })
            .buffered(PARALLEL_LAYERS)
            .try_collect()
            .await?;
        Ok(PulledImage {
            reference: normalised,
            manifest_digest,
            index_digest,
            layers,
            config,
        })
    }

    /// Refuses a pull whose layers (`needed` bytes, compressed: what the cache keeps) would
    /// leave less than the reserve free on the cache's disk. Layers already cached count as
    /// needed too: a little strict, never lenient. A disk that cannot be asked is not held
    /// against the pull (its writes say if the disk is full).
    fn check_room(&self, needed: u64) -> Result<(), PullError> {
        let Ok(st) = nix::sys::statvfs::statvfs(&self.opts.cache_dir) else {
            return Ok(());
        };
        let free = st.blocks_available().saturating_mul(st.fragment_size());
        let reserve = self.opts.min_free_bytes;
        if free < needed.saturating_add(reserve) {
            return Err(PullError::NoRoom {
                needed,
                free,
                reserve,
            });
        }
        Ok(())
    }

    /// The blob in the cache, fetched and checked first if it is not there; says which on
    /// `progress`.
    async fn fetch(
        &self,
        client: &Client,
        image: &Reference,
        desc: &OciDescriptor,
        ctx: &Ctx<'_>,
        progress: Option<&(dyn Fn(String) + Send + Sync)>,
    ) -> Result<PathBuf, PullError> {
        let hex = sha256_hex(&desc.digest)?;
        let size = descriptor_size(desc)?;
        let say = |verb: &str| {
            if let Some(progress) = progress {
                progress(format!("{verb} {} {}", short(&desc.digest), human(size)));
            }
        };
        let path = blob_dir(&self.opts.cache_dir).join(hex);
        // Only whole, verified blobs are ever renamed into place, so the size is check enough.
        if let Ok(meta) = std::fs::metadata(&path) {
            if meta.is_file() && meta.len() == size {
                say("cached");
                return Ok(path);
            }
        }
        say("pulling");
        let tmp = tempfile::NamedTempFile::new_in(tmp_dir(&self.opts.cache_dir))
            .map_err(|e| PullError::io("creating a file in the layer cache", e))?;
        let mut file = tokio::fs::File::from_std(
            tmp.as_file()
                .try_clone()
                .map_err(|e| PullError::io("opening a file in the layer cache", e))?,
        );
        let mut stream = client
            .pull_blob_stream(image, desc)
            .await
            .map_err(|e| ctx.map(e))?;
        let mut hasher = Sha256::new();
        let mut got: u64 = 0;
        while let Some(chunk) = stream.try_next().await.map_err(|e| stream_error(ctx, e))? {
            got += chunk.len() as u64;
            if got > size {
                return Err(PullError::bad(format!(
                    "blob {} is longer than the {size} bytes its manifest says",
                    desc.digest
                )));
            }
            hasher.update(&chunk);
            file.write_all(&chunk)
                .await
                .map_err(|e| PullError::io("writing to the layer cache", e))?;
        }
        let actual = format!("sha256:{:x}", hasher.finalize());
        if got != size || actual != desc.digest {
            return Err(PullError::bad(format!(
                "blob {} arrived as {got} bytes with digest {actual} (want {size} bytes)",
                desc.digest
            )));
        }
        file.sync_all()
            .await
            .map_err(|e| PullError::io("writing to the layer cache", e))?;
        tmp.persist(&path).map_err(|e| {
            PullError::io(
                format!("storing {} in the layer cache", desc.digest),
                e.error,
            )
        })?;
        Ok(path)
    }
}

/// The cause of a failed pull as the guard saw it: a refused destination is the reason
/// (the client saw only a failed tunnel or a 403), and an unreachable one is told by what
/// connecting to it said (the client saw the guard's 502).
fn explain(guard: &Guard, err: PullError) -> PullError {
    if let Some(refused) = guard.refused() {
        return refused.into();
    }
    match err {
        PullError::Unreachable { registry, source } => PullError::Unreachable {
            registry,
            source: match guard.take_unreachable() {
                Some((_, cause)) => Box::new(cause),
                None => source,
            },
        },
        other => other,
    }
}

/// A failure while a blob streams in: the client's own digest check, or the connection.
fn stream_error(ctx: &Ctx<'_>, e: std::io::Error) -> PullError {
    if e.get_ref()
        .is_some_and(|inner| inner.is::<oci_client::errors::DigestError>())
    {
        return PullError::bad(format!("a blob does not match its digest: {e}"));
    }
    PullError::Unreachable {
        registry: ctx.registry.to_string(),
        source: Box::new(e),
    }
}

fn parse_reference(reference: &str) -> Result<Reference, PullError> {
    let bad = |detail: String| PullError::BadReference {
        reference: reference.to_string(),
        detail,
    };
    let parsed: Reference = reference
        .trim()
        .parse()
        .map_err(|e: oci_client::ParseError| bad(e.to_string()))?;
    if parsed.repository().chars().any(|c| c.is_ascii_uppercase()) {
        return Err(bad("repository names must be lowercase".into()));
    }
    Ok(parsed)
}

/// The full name a reference stands for, as Docker spells it: `alpine` is
/// `docker.io/library/alpine:latest`, `user/app:1` is `docker.io/user/app:1`.
pub fn normalise(reference: &str) -> Result<String, PullError> {
    parse_reference(reference).map(|r| r.whole())
}

fn blob_dir(cache: &Path) -> PathBuf {
    cache.join("blobs").join("sha256")
}

fn tmp_dir(cache: &Path) -> PathBuf {
    cache.join("tmp")
}

fn check_layer_type(media_type: &str) -> Result<(), PullError> {
    if media_type.contains("+encrypted") {
        return Err(PullError::Unsupported {
            detail: format!("encrypted layers ({media_type})"),
        });
    }
    if !LAYER_TYPES.contains(&media_type) {
        return Err(PullError::Unsupported {
            detail: format!("layer media type {media_type} is not a filesystem layer"),
        });
    }
    Ok(())
}

fn descriptor_size(desc: &OciDescriptor) -> Result<u64, PullError> {
    u64::try_from(desc.size)
        .map_err(|_| PullError::bad(format!("blob {} has size {}", desc.digest, desc.size)))
}

/// The hex of a `sha256:` digest, checked, since it becomes a file name.
fn sha256_hex(digest: &str) -> Result<&str, PullError> {
    match digest.strip_prefix("sha256:") {
        Some(hex)
            if hex.len() == 64
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
        {
            Ok(hex)
        }
        _ if digest.contains(':') && !digest.starts_with("sha256:") => {
            Err(PullError::Unsupported {
                detail: format!("digest algorithm of {digest}"),
            })
        }
        _ => Err(PullError::bad(format!("{digest:?} is not a sha256 digest"))),
    }
}

/// `sha256:0123456789ab…` for progress lines.
fn short(digest: &str) -> String {
    let end = digest.len().min("sha256:".len() + 12);
    format!("{}…", &digest[..end])
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_that_would_be_odd_file_names_are_refused() {
        let good = format!("sha256:{}", "a".repeat(64));
        assert!(sha256_hex(&good).is_ok());
        assert!(sha256_hex(&format!("sha256:../{}", "a".repeat(61))).is_err());
        assert!(sha256_hex("sha256:ABC").is_err());
        assert!(matches!(
            sha256_hex("sha512:00"),
            Err(PullError::Unsupported { .. })
        ));
    }

    #[test]
    fn names_are_normalised_as_docker_does() {
        let hex = "0123456789abcdef".repeat(4);
        for (short, full) in [
            ("alpine", "docker.io/library/alpine:latest".to_string()),
            ("alpine:3", "docker.io/library/alpine:3".to_string()),
            ("user/app:1", "docker.io/user/app:1".to_string()),
            ("ghcr.io/o/r:v", "ghcr.io/o/r:v".to_string()),
            ("localhost:5000/x", "localhost:5000/x:latest".to_string()),
            (
                &format!("alpine@sha256:{hex}"),
                format!("docker.io/library/alpine@sha256:{hex}"),
            ),
        ] {
            assert_eq!(normalise(short).unwrap(), full, "{short}");
        }
        assert!(matches!(
            normalise("UPPER/case"),
            Err(PullError::BadReference { .. })
        ));
        assert!(normalise("alpine@sha256:00").is_err());
    }

    #[test]
    fn progress_texts() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(12_900_000), "12.3 MiB");
        let d = format!("sha256:{}", "0123456789abcdef".repeat(4));
        assert_eq!(short(&d), "sha256:0123456789ab…");
    }
}

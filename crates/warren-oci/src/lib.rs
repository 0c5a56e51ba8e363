//! OCI images from a registry, for template builds.
//!
//! Used by the template builder:
//!
//! 1. [`Puller::pull`] speaks the OCI distribution protocol (through the `oci-client` crate) to
//!    one registry: it resolves the reference's manifest (an image index picks its linux/amd64
//!    entry), then fetches the image config and every layer blob that the shared cache does not
//!    already hold. Blobs are stored by digest under [`PullOptions::cache_dir`]
//!    (`blobs/sha256/<hex>`), written to a temporary file, checked against their digest and
//!    declared size, and only then renamed into place, so a blob in the cache is always whole
//!    and right, and every template that uses a layer shares one copy. The pull returns the
//!    layers (paths into the cache) and the parts of the image config a sandbox starts from
//!    (Env, WorkingDir, User, Entrypoint/Cmd, exposed ports).
//! 2. [`unpack`] (blocking) applies those layers in order to an empty directory, as root:
//!    gzip, zstd or plain tar, found by the layer's magic bytes (and checked against its media
//!    type), with whiteouts (`.wh.<name>` removes a lower entry, `.wh..wh..opq` empties a
//!    directory of lower entries), hard links, symlinks, fifos, numeric uid/gid, modes,
//!    mtimes and extended attributes (where the filesystem takes them). Every path is resolved
//!    with `openat2(RESOLVE_IN_ROOT)`, as if the directory were `/`: a `..` component is
//!    refused, an absolute path is taken as relative to the root, and a symlink that an earlier
//!    entry or layer made (even one to `/`) resolves inside the directory, so no entry lands
//!    outside it. The last component is never followed: it is replaced. A whiteout of `.` or
//!    `..` is refused. [`unpack_limited`] also caps the bytes the layers may expand to.
//!    Device nodes are left out: the sandbox's own `/dev` provides them, and an image's copy
//!    would be live wherever the tree is reachable on the host.
//! 3. [`ImageTree`] makes later changes to an unpacked tree (the runtimes' mount points,
//!    `/etc` files) with the same in-root resolution, so the image's own symlinks never lead
//!    a root process on the host out of the tree.
//!
//! Limits: [`PullOptions::max_bytes`] caps an image's compressed layers, checked from the
//! manifest before any layer is fetched; each blob is cut off once it exceeds the size its
//! descriptor declares. A temporary file left by a crashed pull (`tmp/` in the cache) is never
//! used, since only verified blobs are renamed into `blobs/`.
//!
//! Names are normalised as Docker does: `alpine` is `docker.io/library/alpine:latest`,
//! `user/app:1` is `docker.io/user/app:1`, and `name@sha256:<hex>` pins a digest.
//!
//! Credentials ([`Credentials`]) are those of the template API's `fromImageRegistry`: HTTP
//! Basic (the client also does the bearer-token dance when the registry's challenge asks for
//! it: the user name and password go to the token service, as `docker login` does); GCP, as
//! Basic with the user `_json_key` and the service-account JSON as password (what Artifact and
//! Container Registry accept); AWS, by asking ECR for an authorisation token
//! (`GetAuthorizationToken`, SigV4-signed) and using it as Basic `AWS:<token>`.
//!
//! Registry mirrors ([`Mirror`], `--registry-mirror docker.io=https://mirror:5000`) work like
//! Docker's `registry-mirrors`: the mirror serves the origin registry's repositories under the
//! same paths (it also gets `?ns=<origin>`, which pull-through caches use and plain registries
//! ignore). A mirrored registry is *replaced* by its mirror: there is no fallback to the origin,
//! so a host that may only reach its mirror never talks to the origin, and a missing image is
//! reported as not found. Credentials given for the pull go to the mirror.
//!
//! Transport: HTTPS (rustls, the system's roots plus [`PullOptions::ca_files`]) except for
//! the `host:port`s in [`PullOptions::insecure`] and `http://` mirrors, which get plain HTTP.
//! Nothing falls back from HTTPS to HTTP on its own (loopback registries included).
//!
//! Errors ([`PullError`]) separate not found, unauthorised, rate-limited and unreachable, in
//! words a template author can act on. `RateLimited::retry_after` is `None` for registry
//! answers: the OCI client does not pass the `Retry-After` header on.

mod config;
mod decompress;
mod ecr;
mod error;
mod guard;
mod policy;
mod pull;
mod tree;
mod unpack;

use std::path::PathBuf;

pub use error::{BoxError, PullError};
pub use policy::RegistryAllow;
pub use pull::{normalise, Puller};
pub use tree::ImageTree;
pub use unpack::{unpack, unpack_limited};

/// How pulls are made; shared by every pull of one [`Puller`].
#[derive(Debug, Clone)]
pub struct PullOptions {
    /// Where blobs are kept by digest (`blobs/sha256/<hex>`), shared by all pulls.
    pub cache_dir: PathBuf,
    /// Registries served by a mirror instead of themselves.
    pub mirrors: Vec<Mirror>,
    /// Registries (`host:port`) reached over plain HTTP instead of HTTPS. The operator named
    /// them, so they may be at any address (loopback and private ones included), and they are
    /// the only hosts plain HTTP goes to (with `http://` mirrors and ECR endpoint).
    pub insecure: Vec<String>,
    /// Extra PEM files of trusted root certificates, added to the system's.
    pub ca_files: Vec<PathBuf>,
    /// The most compressed layer bytes one image may have: a larger image is refused before
    /// any layer is fetched.
    pub max_bytes: u64,
    /// The ECR API endpoint used for AWS credentials, instead of
    /// `https://api.ecr.<region>.amazonaws.com/` (for tests and private endpoints).
    pub ecr_endpoint: Option<String>,
    /// Destinations pulls may reach although the default refuses them (loopback, private,
    /// link-local and metadata, CGNAT and the rest of `warren_runtime::blocked`): ranges, and
    /// `host:port`s at whatever address they have. Mirrors, `insecure` registries and the ECR
    /// endpoint are allowed without being listed.
    pub allow: Vec<RegistryAllow>,
    /// Bytes of the cache's disk a pull leaves free (the server's reserve): an image whose
    /// layers would eat into it is refused before any layer is fetched.
    pub min_free_bytes: u64,
}

impl PullOptions {
    /// Options with a cache at `cache_dir`, no mirrors, HTTPS everywhere, the system's roots
    /// and a 16 GiB limit.
    pub fn new(cache_dir: impl Into<PathBuf>) -> Self {
        PullOptions {
            cache_dir: cache_dir.into(),
            mirrors: Vec::new(),
            insecure: Vec::new(),
            ca_files: Vec::new(),
            max_bytes: 16 << 30,
            ecr_endpoint: None,
            allow: Vec::new(),
            min_free_bytes: 0,
        }
    }
}

/// A registry mirror: `registry`'s repositories are pulled from `endpoint` instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    /// The registry mirrored, as in image names: `docker.io`, `ghcr.io`, `quay.io:443`.
    pub registry: String,
    /// `https://host[:port]` or `http://host[:port]`, without a path.
    pub endpoint: String,
}

impl Mirror {
    /// The mirror's `host[:port]` and whether it is reached over plain HTTP.
    pub(crate) fn host(&self) -> (&str, bool) {
        match self.endpoint.strip_prefix("http://") {
            Some(host) => (host.trim_end_matches('/'), true),
            None => (
                self.endpoint
                    .strip_prefix("https://")
                    .unwrap_or(&self.endpoint)
                    .trim_end_matches('/'),
                false,
            ),
        }
    }
}

/// Docker Hub goes by several names; image references use `docker.io`.
pub(crate) fn canonical_registry(registry: &str) -> String {
    let r = registry.trim().to_ascii_lowercase();
    match r.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => {
            "docker.io".to_string()
        }
        _ => r,
    }
}

impl std::str::FromStr for Mirror {
    type Err = String;

    /// Parses `REGISTRY=ENDPOINT`, e.g. `docker.io=https://mirror.internal:5000`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let form = "expected REGISTRY=URL, e.g. docker.io=https://mirror.example:5000";
        let (registry, endpoint) = s
            .split_once('=')
            .ok_or_else(|| format!("registry mirror {s:?}: no '=' ({form})"))?;
        let registry = registry.trim();
        let endpoint = endpoint.trim();
        if registry.is_empty()
            || registry.contains('/')
            || registry.contains("://")
            || registry.chars().any(char::is_whitespace)
        {
            return Err(format!(
                "registry mirror {s:?}: {registry:?} is not a registry name such as docker.io ({form})"
            ));
        }
        let host = endpoint
            .strip_prefix("https://")
            .or_else(|| endpoint.strip_prefix("http://"))
            .ok_or_else(|| {
                format!("registry mirror {s:?}: the URL must start with https:// or http://")
            })?
            .trim_end_matches('/');
        if host.is_empty() || host.contains(['/', '?', '#', '@']) {
            return Err(format!(
                "registry mirror {s:?}: the URL must be scheme://host[:port] without a path \
                 (a mirror serves the registry's repositories at its root)"
            ));
        }
        Ok(Mirror {
            registry: canonical_registry(registry),
            endpoint: endpoint.trim_end_matches('/').to_string(),
        })
    }
}

/// Credentials for one pull: the template API's `fromImageRegistry`.
#[derive(Clone, Default)]
pub enum Credentials {
    /// No credentials (public images).
    #[default]
    Anonymous,
    /// A user name and a password or access token (`{"type":"registry"}`).
    Basic { username: String, password: String },
    /// AWS keys for ECR (`{"type":"aws"}`): exchanged for an ECR authorisation token.
    Aws {
        access_key_id: String,
        secret_access_key: String,
        region: String,
    },
    /// A GCP service-account key (`{"type":"gcp"}`), sent as Basic `_json_key:<json>`.
    Gcp { service_account_json: String },
}

impl std::fmt::Debug for Credentials {
    /// Never shows a secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Anonymous => f.write_str("Anonymous"),
            Credentials::Basic { username, .. } => write!(f, "Basic({username}, ***)"),
            Credentials::Aws {
                access_key_id,
                region,
                ..
            } => write!(f, "Aws({access_key_id}, ***, {region})"),
            Credentials::Gcp { .. } => f.write_str("Gcp(***)"),
        }
    }
}

/// A pulled image: its layers are in the cache, ready for [`unpack`].
#[derive(Debug, Clone)]
pub struct PulledImage {
    /// The normalised reference, e.g. `docker.io/library/alpine:latest`.
    pub reference: String,
    /// The digest of the linux/amd64 image manifest that was pulled.
    pub manifest_digest: String,
    /// The digest of the image index the manifest was picked from, when there was one.
    pub index_digest: Option<String>,
    /// The layers, lowest first.
    pub layers: Vec<Layer>,
    /// What the image says a container starts with.
    pub config: ImageConfig,
}

/// One layer blob in the cache.
#[derive(Debug, Clone)]
pub struct Layer {
    pub digest: String,
    pub media_type: String,
    /// The cached blob (compressed as served).
    pub path: PathBuf,
    /// Compressed size in bytes.
    pub size: u64,
}

/// The parts of the image config a sandbox takes its defaults from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageConfig {
    /// `Env`, in order, split at the first `=`.
    pub env: Vec<(String, String)>,
    pub working_dir: Option<String>,
    /// `User` as written (`name`, `uid`, `uid:gid`, ...).
    pub user: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// `ExposedPorts` keys, e.g. `80/tcp`, sorted.
    pub exposed_ports: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirror_parses_and_rejects_with_reasons() {
        let m: Mirror = "docker.io=https://mirror:5000/".parse().unwrap();
        assert_eq!(m.registry, "docker.io");
        assert_eq!(m.endpoint, "https://mirror:5000");
        assert_eq!(m.host(), ("mirror:5000", false));
        let m: Mirror = "index.docker.io=http://127.0.0.1:5000".parse().unwrap();
        assert_eq!(m.registry, "docker.io");
        assert_eq!(m.host(), ("127.0.0.1:5000", true));
        for (bad, why) in [
            ("docker.io", "no '='"),
            ("docker.io=mirror:5000", "must start with https://"),
            ("=https://m", "not a registry name"),
            ("docker.io=https://m/prefix", "without a path"),
            ("https://docker.io=https://m", "not a registry name"),
        ] {
            let err = bad.parse::<Mirror>().unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn credentials_debug_hides_secrets() {
        let c = Credentials::Basic {
            username: "u".into(),
            password: "hunter2".into(),
        };
        assert!(!format!("{c:?}").contains("hunter2"));
    }
}

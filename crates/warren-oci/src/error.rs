//! What can go wrong with a pull or an unpack, in words a template author understands, and the
//! one place where the OCI client's errors are sorted into those kinds.

use oci_client::errors::{OciDistributionError, OciErrorCode};

/// The cause of an unreachable registry (a connection, TLS or protocol failure).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a pull or an unpack failed. The texts are sentence-like and never repeat the `source`.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// The repository, tag or digest does not exist on the registry.
    #[error("image {reference} not found")]
    NotFound { reference: String },
    /// The registry wants credentials, or refused the ones given.
    #[error("registry {registry} refused the credentials: {detail}")]
    Unauthorized { registry: String, detail: String },
    /// The registry (Docker Hub, typically) throttles this client.
    #[error("registry {registry} is rate-limiting pulls{}", retry_text(*.retry_after))]
    RateLimited {
        registry: String,
        /// Seconds to wait, when the registry said.
        retry_after: Option<u64>,
    },
    /// No answer, a TLS failure, or an answer that is not HTTP.
    #[error("registry {registry} could not be reached")]
    Unreachable {
        registry: String,
        #[source]
        source: BoxError,
    },
    /// The image name cannot be parsed.
    #[error("{reference:?} is not a valid image reference: {detail}")]
    BadReference { reference: String, detail: String },
    /// The registry served something that is not a well-formed image (bad digest, bad
    /// manifest or config, a layer that is not a tar, a hostile path in a layer).
    #[error("bad image: {detail}")]
    BadImage { detail: String },
    /// The image is larger than the operator allows: its compressed layers (a pull) or the
    /// files they unpack to ([`crate::unpack_limited`]).
    #[error("the image is larger than the limit of {limit} bytes")]
    TooLarge { limit: u64 },
    /// The cache's disk has no room for the image's layers without eating into the server's
    /// reserve.
    #[error(
        "the host's disk has no room for the image: its layers take {needed} bytes, {free} \
         are free and {reserve} of those stay free for the server; free space (prune \
         templates) and try again"
    )]
    NoRoom {
        needed: u64,
        free: u64,
        reserve: u64,
    },
    /// A valid image this puller cannot handle (encrypted layers, another platform only, ...).
    #[error("unsupported image: {detail}")]
    Unsupported { detail: String },
    /// A request of the pull (to the registry, a redirect, a token realm) was headed for an
    /// address or transport the server's policy refuses: `address` is the `host:port` asked
    /// for, `reason` says why and what an operator can do about it.
    #[error("registry address {address} is not allowed: {reason}")]
    NotAllowed { address: String, reason: String },
    /// The pull options cannot be used (an insecure registry or endpoint that is not a host).
    #[error("registry settings: {detail}")]
    BadConfig { detail: String },
    /// A local file operation failed.
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

fn retry_text(retry_after: Option<u64>) -> String {
    match retry_after {
        Some(secs) => format!("; retry in {secs} s"),
        None => "; retry later or give credentials".to_string(),
    }
}

impl PullError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        PullError::Io {
            what: what.into(),
            source,
        }
    }

    pub(crate) fn bad(detail: impl Into<String>) -> Self {
        PullError::BadImage {
            detail: detail.into(),
        }
    }
}

/// The context an OCI client error is judged in.
pub(crate) struct Ctx<'a> {
    /// The normalised reference, for "not found".
    pub reference: &'a str,
    /// The host actually contacted (the mirror when one is configured).
    pub registry: &'a str,
    /// Whether any credentials were sent: decides the "refused" wording.
    pub had_credentials: bool,
    /// Docker Hub answers "unauthorized" for a repository that does not exist, too.
    pub docker_hub: bool,
}

impl Ctx<'_> {
    fn unauthorized(&self, extra: Option<String>) -> PullError {
        let mut detail = if self.had_credentials {
            "the username, password or token is wrong, or lacks pull access".to_string()
        } else {
            "none were given, and it does not allow anonymous pulls of this repository".to_string()
        };
        if let Some(extra) = extra.filter(|e| !e.trim().is_empty()) {
            detail.push_str(&format!(" ({})", extra.trim()));
        }
        if self.docker_hub {
            detail.push_str("; Docker Hub also says this of a repository that does not exist");
        }
        PullError::Unauthorized {
            registry: self.registry.to_string(),
            detail,
        }
    }

    fn rate_limited(&self) -> PullError {
        PullError::RateLimited {
            registry: self.registry.to_string(),
            retry_after: None,
        }
    }

    fn not_found(&self) -> PullError {
        PullError::NotFound {
            reference: self.reference.to_string(),
        }
    }

    /// Sorts an OCI client error into a [`PullError`].
    pub fn map(&self, err: OciDistributionError) -> PullError {
        use OciDistributionError as E;
        match err {
            E::UnauthorizedError { .. } => self.unauthorized(None),
            E::AuthenticationFailure(reason) => self.unauthorized(Some(reason)),
            E::RegistryError { envelope, url } => {
                let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
                if codes.iter().any(|c| {
                    matches!(
                        c,
                        OciErrorCode::ManifestUnknown
                            | OciErrorCode::NameUnknown
                            | OciErrorCode::BlobUnknown
                            | OciErrorCode::NotFound
                    )
                }) {
                    self.not_found()
                } else if codes
                    .iter()
                    .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
                {
                    let msg = envelope.errors.first().map(|e| e.message.clone());
                    self.unauthorized(msg)
                } else if codes
                    .iter()
                    .any(|c| matches!(c, OciErrorCode::Toomanyrequests))
                {
                    self.rate_limited()
                } else {
                    let text: Vec<String> = envelope
                        .errors
                        .iter()
                        .map(|e| format!("{:?}: {}", e.code, e.message))
                        .collect();
                    PullError::bad(format!("registry answered {url} with {}", text.join("; ")))
                }
            }
            E::ServerError { code, url, message } => match code {
                404 => self.not_found(),
                401 | 403 => self.unauthorized(Some(message)),
                429 => self.rate_limited(),
                _ => PullError::Unreachable {
                    registry: self.registry.to_string(),
                    source: format!("HTTP {code} from {url}: {}", message.trim()).into(),
                },
            },
            E::ImageManifestNotFoundError(detail) => PullError::Unsupported {
                detail: format!("{} has no linux/amd64 image ({detail})", self.reference),
            },
            E::RequestError(e) => PullError::Unreachable {
                registry: self.registry.to_string(),
                source: Box::new(e),
            },
            E::IoError(e) => PullError::io("writing a downloaded blob", e),
            E::DigestError(e) => PullError::bad(format!("content does not match its digest: {e}")),
            E::UnsupportedMediaTypeError(t) | E::IncompatibleLayerMediaTypeError(t) => {
                PullError::Unsupported {
                    detail: format!("media type {t}"),
                }
            }
            E::UnsupportedSchemaVersionError(v) => PullError::Unsupported {
                detail: format!("manifest schema version {v}"),
            },
            other => PullError::bad(other.to_string()),
        }
    }
}

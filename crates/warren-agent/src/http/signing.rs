//! Signed file URLs.
//!
//! `GET /files` and `POST /files` are not behind the token middleware: the SDKs hand out
//! presigned URLs (`download_url()`, `upload_url()`) that carry a signature instead of the
//! `X-Access-Token` header. A signature is
//! `"v1_" + base64_nopad(SHA-256("<path>:<op>:<user>:<token>[:<expiration>]"))`, where `<path>`
//! is the `path` query value exactly as sent (before resolution), `<op>` is `read` or `write`,
//! and `<user>` is the `username` query value or `""`.

use axum::http::HeaderMap;
use base64::Engine;
use sha2::{Digest, Sha256};

use crate::auth::secrets_equal;

/// Which file operation a signature grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// `GET /files`.
    Read,
    /// `POST /files`.
    Write,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Read => "read",
            Operation::Write => "write",
        }
    }
}

/// The signature-related parts of a `/files` request, as the client sent them.
#[derive(Debug, Clone, Copy, Default)]
pub struct SignedRequest<'a> {
    /// Raw `path` query value, `""` when absent.
    pub path: &'a str,
    /// Raw `username` query value, `""` when absent.
    pub username: &'a str,
    pub signature: Option<&'a str>,
    /// `signature_expiration` (unix seconds) when present.
    pub expiration: Option<i64>,
}

/// Why a request was refused. The `Display` text is the `message` of the 401 body; the SDK
/// tests compare the expiry message verbatim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SigningError {
    TokenMismatch,
    MissingSignature,
    InvalidSignature,
    Expired,
    /// The policy caps a signature's lifetime and this one has no expiration.
    ExpirationRequired,
    /// The policy caps a signature's lifetime and this one expires later than that.
    ExpirationTooFar,
}

impl std::fmt::Display for SigningError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SigningError::TokenMismatch => "access token present in header but does not match",
            SigningError::MissingSignature => "missing signature query parameter",
            SigningError::InvalidSignature => "invalid signature",
            SigningError::Expired => "signature is already expired",
            SigningError::ExpirationRequired => {
                "signature has no expiration, and this sandbox requires signed URLs to expire"
            }
            SigningError::ExpirationTooFar => {
                "signature expires later than this sandbox allows for signed URLs"
            }
        })
    }
}

impl std::error::Error for SigningError {}

/// The signature the SDKs compute for these inputs.
pub fn signature(
    path: &str,
    op: Operation,
    username: &str,
    token: &str,
    expiration: Option<i64>,
) -> String {
    let mut hasher = Sha256::new();
    hasher.update(path.as_bytes());
    hasher.update(b":");
    hasher.update(op.as_str().as_bytes());
    hasher.update(b":");
    hasher.update(username.as_bytes());
    hasher.update(b":");
    hasher.update(token.as_bytes());
    if let Some(exp) = expiration {
        // The expiration is signed in its canonical decimal form, as the SDKs format it.
        hasher.update(b":");
        hasher.update(exp.to_string().as_bytes());
    }
    let digest = hasher.finalize();
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

/// Limits the host may put on signed URLs. The default is none, as upstream: a URL signed
/// without `signature_expiration` stays valid as long as the token, which never changes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SigningPolicy {
    /// When set, a signature must carry an expiration, at most this many seconds after the
    /// time of the request. The URL carries no issue time, so this bounds how long any URL
    /// handed out is usable from any moment on rather than its age since signing.
    pub max_age_secs: Option<u64>,
}

/// [`authorize_with`] without limits on signatures.
pub fn authorize(
    token: Option<&str>,
    headers: &HeaderMap,
    req: &SignedRequest<'_>,
    op: Operation,
    now: i64,
) -> Result<(), SigningError> {
    authorize_with(token, headers, req, op, SigningPolicy::default(), now)
}

/// Decides whether a `/files` request may proceed.
///
/// Without a configured token nothing is checked. Otherwise a non-empty `X-Access-Token`
/// header must match the token; without one, the URL signature must match (constant time) and,
/// when it carries an expiration, must not have expired by `now` (unix seconds). `policy`
/// applies to signatures only: the token itself grants everything anyway.
pub fn authorize_with(
    token: Option<&str>,
    headers: &HeaderMap,
    req: &SignedRequest<'_>,
    op: Operation,
    policy: SigningPolicy,
    now: i64,
) -> Result<(), SigningError> {
    let Some(token) = token else {
        return Ok(());
    };
    // An empty header counts as absent, as upstream envd treats it.
    if let Some(header) = headers.get("x-access-token").filter(|v| !v.is_empty()) {
        return if secrets_equal(header.as_bytes(), token.as_bytes()) {
            Ok(())
        } else {
            Err(SigningError::TokenMismatch)
        };
    }
    let given = req.signature.ok_or(SigningError::MissingSignature)?;
    let expected = signature(req.path, op, req.username, token, req.expiration);
    if !secrets_equal(expected.as_bytes(), given.as_bytes()) {
        return Err(SigningError::InvalidSignature);
    }
    // Checked only after the signature matched, so the expiry itself is authenticated.
    match (req.expiration, policy.max_age_secs) {
        (Some(exp), _) if exp < now => Err(SigningError::Expired),
        (None, Some(_)) => Err(SigningError::ExpirationRequired),
        (Some(exp), Some(max)) => {
            let latest = now.saturating_add(i64::try_from(max).unwrap_or(i64::MAX));
            if exp > latest {
                Err(SigningError::ExpirationTooFar)
            } else {
                Ok(())
            }
        }
        _ => Ok(()),
    }
}

/// Current unix time in seconds (0 if the clock is before the epoch).
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const TOKEN: &str = "secret-token";

    /// The reference construction, spelled out independently of `signature()`.
    fn by_hand(input: &str) -> String {
        let digest = Sha256::digest(input.as_bytes());
        let b64 = base64::engine::general_purpose::STANDARD.encode(digest);
        format!("v1_{}", b64.trim_end_matches('='))
    }

    #[test]
    fn signatures_match_known_vectors() {
        // Vectors computed with Python's hashlib/base64, the way the Python SDK does it.
        assert_eq!(
            signature("/home/user/a.txt", Operation::Read, "user", TOKEN, None),
            "v1_powbkN3fI7yRlWaB5Ui2dRUwVP8UZprfSGludREq8sk"
        );
        assert_eq!(
            signature("test.txt", Operation::Write, "", TOKEN, None),
            "v1_6SA1Gg2itozMBxWKsHSS2O/zsWYpfHG1zlxSpBFIOL0"
        );
        assert_eq!(
            signature("test.txt", Operation::Read, "", TOKEN, Some(1_700_000_000)),
            "v1_0KeffMzOx+yqgMhzfpjMk1+ZiM5MtgwDameZFn2mwFg"
        );
        assert_eq!(
            signature("a b/ü", Operation::Write, "root", TOKEN, Some(42)),
            by_hand(&format!("a b/ü:write:root:{TOKEN}:42"))
        );
    }

    fn req<'a>(sig: Option<&'a str>, exp: Option<i64>) -> SignedRequest<'a> {
        SignedRequest {
            path: "test.txt",
            username: "",
            signature: sig,
            expiration: exp,
        }
    }

    #[test]
    fn no_token_means_no_check() {
        let h = HeaderMap::new();
        assert_eq!(
            authorize(None, &h, &req(None, None), Operation::Read, 0),
            Ok(())
        );
        assert_eq!(
            authorize(None, &h, &req(Some("junk"), Some(1)), Operation::Write, 99),
            Ok(())
        );
    }

    #[test]
    fn header_token_wins_over_signature() {
        let mut h = HeaderMap::new();
        h.insert("x-access-token", HeaderValue::from_static(TOKEN));
        assert_eq!(
            authorize(
                Some(TOKEN),
                &h,
                &req(Some("junk"), None),
                Operation::Read,
                0
            ),
            Ok(())
        );
        h.insert("x-access-token", HeaderValue::from_static("wrong"));
        let good = by_hand(&format!("test.txt:read::{TOKEN}"));
        assert_eq!(
            authorize(Some(TOKEN), &h, &req(Some(&good), None), Operation::Read, 0),
            Err(SigningError::TokenMismatch)
        );
        // An empty header falls through to the signature.
        h.insert("x-access-token", HeaderValue::from_static(""));
        assert_eq!(
            authorize(Some(TOKEN), &h, &req(Some(&good), None), Operation::Read, 0),
            Ok(())
        );
    }

    #[test]
    fn signatures_are_checked() {
        let h = HeaderMap::new();
        let read = by_hand(&format!("test.txt:read::{TOKEN}"));
        assert_eq!(
            authorize(Some(TOKEN), &h, &req(None, None), Operation::Read, 0),
            Err(SigningError::MissingSignature)
        );
        assert_eq!(
            authorize(Some(TOKEN), &h, &req(Some(&read), None), Operation::Read, 0),
            Ok(())
        );
        // A read signature does not grant writes.
        assert_eq!(
            authorize(
                Some(TOKEN),
                &h,
                &req(Some(&read), None),
                Operation::Write,
                0
            ),
            Err(SigningError::InvalidSignature)
        );
        assert_eq!(
            authorize(
                Some(TOKEN),
                &h,
                &req(Some("v1_x"), None),
                Operation::Read,
                0
            ),
            Err(SigningError::InvalidSignature)
        );
    }

    #[test]
    fn expiry_is_enforced() {
        let h = HeaderMap::new();
        let sig = by_hand(&format!("test.txt:read::{TOKEN}:1000"));
        let r = req(Some(&sig), Some(1000));
        assert_eq!(authorize(Some(TOKEN), &h, &r, Operation::Read, 999), Ok(()));
        assert_eq!(
            authorize(Some(TOKEN), &h, &r, Operation::Read, 1000),
            Ok(())
        );
        assert_eq!(
            authorize(Some(TOKEN), &h, &r, Operation::Read, 1001),
            Err(SigningError::Expired)
        );
        assert_eq!(
            SigningError::Expired.to_string(),
            "signature is already expired"
        );
        // The expiration is part of the signed text: changing it breaks the signature.
        let tampered = req(Some(&sig), Some(2000));
        assert_eq!(
            authorize(Some(TOKEN), &h, &tampered, Operation::Read, 1001),
            Err(SigningError::InvalidSignature)
        );
    }

    #[test]
    fn a_maximum_age_requires_a_near_expiration() {
        let h = HeaderMap::new();
        let policy = SigningPolicy {
            max_age_secs: Some(300),
        };
        let check = |exp: Option<i64>, now: i64| {
            let sig = signature("/f", Operation::Read, "", TOKEN, exp);
            let r = SignedRequest {
                path: "/f",
                username: "",
                signature: Some(&sig),
                expiration: exp,
            };
            authorize_with(Some(TOKEN), &h, &r, Operation::Read, policy, now)
        };
        assert_eq!(check(None, 1000), Err(SigningError::ExpirationRequired));
        assert_eq!(check(Some(1300), 1000), Ok(()));
        assert_eq!(check(Some(1301), 1000), Err(SigningError::ExpirationTooFar));
        assert_eq!(check(Some(999), 1000), Err(SigningError::Expired));
        assert_eq!(check(Some(i64::MAX), i64::MAX - 1), Ok(()));
        // Without a policy, a URL without expiration is valid (upstream behaviour).
        let sig = signature("/f", Operation::Read, "", TOKEN, None);
        let r = SignedRequest {
            path: "/f",
            username: "",
            signature: Some(&sig),
            expiration: None,
        };
        assert_eq!(
            authorize(Some(TOKEN), &h, &r, Operation::Read, 1000),
            Ok(())
        );
        // The token header is not subject to the policy.
        let mut with_token = HeaderMap::new();
        with_token.insert("x-access-token", HeaderValue::from_static(TOKEN));
        let bare = SignedRequest::default();
        assert_eq!(
            authorize_with(Some(TOKEN), &with_token, &bare, Operation::Read, policy, 0),
            Ok(())
        );
    }
}

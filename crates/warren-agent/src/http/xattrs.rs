//! Metadata of uploads as `X-Metadata-<key>: <value>` request headers; stored by
//! `crate::fs::metadata`.

use axum::http::HeaderMap;

pub use crate::fs::metadata::{Metadata, XATTR_PREFIX};

/// Request-header prefix (header names arrive lowercased).
const HEADER_PREFIX: &str = "x-metadata-";
/// Linux caps attribute names at 255 bytes; minus the namespace prefix.
pub const MAX_KEY_BYTES: usize = 255 - XATTR_PREFIX.len();
/// Upper bound on the sum of key and value lengths, so everything fits one inode's xattr
/// space on ext4.
pub const MAX_TOTAL_BYTES: usize = 4096;

/// The metadata a request carries, validated. When a header repeats, its first value counts.
pub fn from_headers(headers: &HeaderMap) -> Result<Metadata, String> {
    let mut out = Metadata::new();
    for name in headers.keys() {
        let Some(key) = name.as_str().strip_prefix(HEADER_PREFIX) else {
            continue;
        };
        // `X-Metadata-` alone names no key; upstream skips it too.
        if key.is_empty() || out.contains_key(key) {
            continue;
        }
        let Some(value) = headers.get(name) else {
            continue;
        };
        let value = value.as_bytes();
        if !value.iter().all(|b| (0x20..=0x7e).contains(b)) {
            return Err(format!(
                "value of key '{key}' must be printable ASCII characters"
            ));
        }
        // Printable ASCII is valid UTF-8, so this never loses data.
        let value = String::from_utf8_lossy(value).into_owned();
        out.insert(key.to_ascii_lowercase(), value);
    }
    validate(&out)?;
    Ok(out)
}

/// Checks the size limits (header names are already restricted to token characters).
pub fn validate(metadata: &Metadata) -> Result<(), String> {
    let mut total = 0usize;
    for (key, value) in metadata {
        if key.is_empty() {
            return Err("metadata keys must not be empty".into());
        }
        if key.len() > MAX_KEY_BYTES {
            return Err(format!(
                "metadata key '{key}' is longer than {MAX_KEY_BYTES} bytes"
            ));
        }
        total = total.saturating_add(key.len()).saturating_add(value.len());
    }
    if total > MAX_TOTAL_BYTES {
        return Err(format!(
            "metadata is {total} bytes, more than the limit of {MAX_TOTAL_BYTES} bytes"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn headers_become_lowercase_keys() {
        let mut h = HeaderMap::new();
        h.insert("X-Metadata-Author", HeaderValue::from_static("mish"));
        h.append("x-metadata-author", HeaderValue::from_static("second"));
        h.insert("x-metadata-purpose", HeaderValue::from_static("up load"));
        h.insert("x-metadata-", HeaderValue::from_static("ignored"));
        h.insert("content-type", HeaderValue::from_static("x"));
        let m = from_headers(&h).expect("valid");
        assert_eq!(m.len(), 2);
        assert_eq!(m["author"], "mish");
        assert_eq!(m["purpose"], "up load");
        assert!(from_headers(&HeaderMap::new()).expect("valid").is_empty());
    }

    #[test]
    fn limits_are_enforced() {
        let mut h = HeaderMap::new();
        h.insert(
            "x-metadata-k",
            HeaderValue::from_bytes(b"caf\xc3\xa9").expect("opaque bytes are allowed"),
        );
        assert!(from_headers(&h).is_err());
        let mut m = Metadata::new();
        m.insert("k".repeat(MAX_KEY_BYTES), "v".into());
        assert!(validate(&m).is_ok());
        m.insert("k".repeat(MAX_KEY_BYTES + 1), "v".into());
        assert!(validate(&m).is_err());
        let mut m = Metadata::new();
        m.insert("a".into(), "v".repeat(MAX_TOTAL_BYTES - 1));
        assert!(validate(&m).is_ok());
        m.insert("b".into(), String::new());
        assert!(validate(&m).is_err());
    }
}

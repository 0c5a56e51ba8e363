//! User metadata of uploaded files: `X-Metadata-<key>: <value>` request headers, stored as
//! `user.e2b.<key>` extended attributes.
//!
//! Kept private to the `/files` endpoint for now; `fs::entry` has the same logic for
//! `EntryInfo.metadata`, and the two are meant to be merged.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use axum::http::HeaderMap;

/// Namespace of the metadata attributes.
pub const XATTR_PREFIX: &str = "user.e2b.";
/// Request-header prefix (header names arrive lowercased).
const HEADER_PREFIX: &str = "x-metadata-";
/// Linux caps attribute names at 255 bytes; minus the namespace prefix.
pub const MAX_KEY_BYTES: usize = 255 - XATTR_PREFIX.len();
/// Upper bound on the sum of key and value lengths, so everything fits one inode's xattr
/// space on ext4.
pub const MAX_TOTAL_BYTES: usize = 4096;

/// File metadata, ordered so responses are deterministic.
pub type Metadata = BTreeMap<String, String>;

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

/// Whether an xattr error means the filesystem has no (user) xattrs at all.
pub fn unsupported(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EOPNOTSUPP) || e.raw_os_error() == Some(libc::ENOTSUP)
}

/// The metadata stored on `path` (following symlinks). Empty when the filesystem has no xattrs.
pub fn read(path: &Path) -> io::Result<Metadata> {
    let mut out = Metadata::new();
    let names = match xattr::list_deref(path) {
        Ok(n) => n,
        Err(e) if unsupported(&e) => return Ok(out),
        Err(e) => return Err(e),
    };
    for name in names {
        let Some(key) = metadata_key(&name) else {
            continue;
        };
        // An attribute removed between list and get simply is not reported.
        if let Some(value) = xattr::get_deref(path, &name)? {
            out.insert(key, String::from_utf8_lossy(&value).into_owned());
        }
    }
    Ok(out)
}

/// Makes `metadata` the complete metadata of `path`: other `user.e2b.*` attributes are removed
/// (an overwritten file keeps its xattrs across `O_TRUNC`), other namespaces are untouched.
pub fn replace(path: &Path, metadata: &Metadata) -> io::Result<()> {
    let names = xattr::list_deref(path)?;
    for name in names {
        let Some(key) = metadata_key(&name) else {
            continue;
        };
        if !metadata.contains_key(&key) {
            match xattr::remove_deref(path, &name) {
                Ok(()) => {}
                // Already gone (a concurrent writer): that is the state we want.
                Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
                Err(e) => return Err(e),
            }
        }
    }
    for (key, value) in metadata {
        xattr::set_deref(path, format!("{XATTR_PREFIX}{key}"), value.as_bytes())?;
    }
    Ok(())
}

/// The metadata key of an attribute name, if it is in our namespace.
fn metadata_key(name: &OsStr) -> Option<String> {
    let rest = name.as_bytes().strip_prefix(XATTR_PREFIX.as_bytes())?;
    (!rest.is_empty()).then(|| String::from_utf8_lossy(rest).into_owned())
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

//! Encryption at rest for the store's secrets: access tokens and environment variables (which
//! callers use for API keys and passwords). A copy of `warren.db` (a backup, a stray
//! `-wal` file) reveals none of them without the key file beside it.
//!
//! XChaCha20-Poly1305 with a random 192-bit nonce per value (random nonces of that size never
//! collide in practice), authenticated with the column's name so a value moved to another
//! column fails to open. The key is 32 random bytes in a 0600 file created on first open.
//! Values are stored as `enc1:` + base64(nonce ‖ ciphertext); values without the prefix are
//! rows from before encryption and are sealed when the store opens.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use base64::engine::general_purpose::STANDARD_NO_PAD as B64;
use base64::Engine;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use warren_control::StoreError;

const PREFIX: &str = "enc1:";
const KEY_LEN: usize = 32;
const NONCE_LEN: usize = 24;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("reading store key {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("writing store key {path}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("store key {path} is {len} bytes, not {KEY_LEN}: it is not a Warren store key")]
    Length { path: String, len: usize },
    #[error("the system random source failed: {0}")]
    Random(String),
}

pub(crate) struct Sealer {
    cipher: XChaCha20Poly1305,
}

fn random<const N: usize>() -> Result<[u8; N], KeyError> {
    let mut buf = [0u8; N];
    getrandom::fill(&mut buf).map_err(|e| KeyError::Random(e.to_string()))?;
    Ok(buf)
}

impl Sealer {
    /// The key at `path`, created (0600, fsynced) if there is none yet.
    pub(crate) fn load_or_create(path: &Path) -> Result<Sealer, KeyError> {
        let shown = || path.display().to_string();
        let key = match std::fs::read(path) {
            Ok(bytes) => {
                // An existing key file stays readable by root only, whatever made it.
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(
                    |source| KeyError::Write {
                        path: shown(),
                        source,
                    },
                )?;
                bytes
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = random::<KEY_LEN>()?;
                let write = |source| KeyError::Write {
                    path: shown(),
                    source,
                };
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(path)
                    .map_err(write)?;
                f.write_all(&key).map_err(write)?;
                f.sync_all().map_err(write)?;
                if let Some(dir) = path.parent() {
                    std::fs::File::open(dir)
                        .and_then(|d| d.sync_all())
                        .map_err(write)?;
                }
                key.to_vec()
            }
            Err(source) => {
                return Err(KeyError::Read {
                    path: shown(),
                    source,
                })
            }
        };
        if key.len() != KEY_LEN {
            return Err(KeyError::Length {
                path: shown(),
                len: key.len(),
            });
        }
        Ok(Sealer::from_key(&key))
    }

    /// A throwaway key (in-memory stores).
    pub(crate) fn ephemeral() -> Result<Sealer, KeyError> {
        Ok(Sealer::from_key(&random::<KEY_LEN>()?))
    }

    fn from_key(key: &[u8]) -> Sealer {
        Sealer {
            cipher: XChaCha20Poly1305::new(key.into()),
        }
    }

    /// `plain` encrypted for column `column`.
    pub(crate) fn seal(&self, column: &str, plain: &str) -> Result<String, StoreError> {
        let nonce =
            random::<NONCE_LEN>().map_err(StoreError::backend_cause("no randomness available"))?;
        let ct = self
            .cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: plain.as_bytes(),
                    aad: column.as_bytes(),
                },
            )
            .map_err(|_| StoreError::backend(format!("encrypting {column}")))?;
        let mut raw = Vec::with_capacity(NONCE_LEN + ct.len());
        raw.extend_from_slice(&nonce);
        raw.extend_from_slice(&ct);
        Ok(format!("{PREFIX}{}", B64.encode(raw)))
    }

    /// The plaintext of a stored value of column `column` (values from before encryption are
    /// returned as they are).
    pub(crate) fn open(&self, column: &str, stored: &str) -> Result<String, StoreError> {
        let Some(encoded) = stored.strip_prefix(PREFIX) else {
            return Ok(stored.to_string());
        };
        let corrupt = || {
            StoreError::Corrupt(format!(
                "{column} does not decrypt with this data dir's store key"
            ))
        };
        let raw = B64.decode(encoded).map_err(|_| corrupt())?;
        if raw.len() < NONCE_LEN {
            return Err(corrupt());
        }
        let (nonce, ct) = raw.split_at(NONCE_LEN);
        let plain = self
            .cipher
            .decrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: ct,
                    aad: column.as_bytes(),
                },
            )
            .map_err(|_| corrupt())?;
        String::from_utf8(plain).map_err(|_| corrupt())
    }
}

/// Whether a stored value is still plaintext.
pub(crate) fn is_plain(stored: &str) -> bool {
    !stored.starts_with(PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_binding() {
        let s = Sealer::ephemeral().unwrap();
        let plain = r#"{"KEY":"a-secret-value"}"#;
        let sealed = s.seal("env_vars", plain).unwrap();
        assert!(sealed.starts_with(PREFIX) && !sealed.contains("a-secret-value"));
        assert_eq!(s.open("env_vars", &sealed).unwrap(), plain);
        // Bound to its column, and to its key.
        assert!(s.open("envd_access_token", &sealed).is_err());
        assert!(Sealer::ephemeral()
            .unwrap()
            .open("env_vars", &sealed)
            .is_err());
        // Two seals of one value differ (random nonces).
        assert_ne!(sealed, s.seal("env_vars", plain).unwrap());
        // Legacy plaintext passes through.
        assert_eq!(s.open("env_vars", "{}").unwrap(), "{}");
    }

    #[test]
    fn key_file_is_private_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let a = Sealer::load_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let sealed = a.seal("c", "x").unwrap();
        let b = Sealer::load_or_create(&path).unwrap();
        assert_eq!(b.open("c", &sealed).unwrap(), "x");
        std::fs::write(&path, b"short").unwrap();
        assert!(matches!(
            Sealer::load_or_create(&path),
            Err(KeyError::Length { .. })
        ));
    }
}

//! Random identifiers and secrets from the operating system's CSPRNG.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

use crate::error::ControlError;

const ID_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

pub(crate) fn random_bytes<const N: usize>() -> Result<[u8; N], ControlError> {
    let mut buf = [0u8; N];
    getrandom::fill(&mut buf)
        .map_err(|e| ControlError::internal(format!("no randomness available: {e}")))?;
    Ok(buf)
}

/// `prefix` followed by `len` lowercase letters and digits: a valid DNS label without `-` or
/// `.`, as the `{port}-{id}.{domain}` host scheme needs (upstream ids look like `i` + 20).
pub(crate) fn random_id(prefix: &str, len: usize) -> Result<String, ControlError> {
    let mut out = String::with_capacity(prefix.len() + len);
    out.push_str(prefix);
    while out.len() < prefix.len() + len {
        for b in random_bytes::<32>()? {
            // Rejection sampling keeps the distribution uniform: 252 = 7 * 36.
            if b < 252 && out.len() < prefix.len() + len {
                out.push(char::from(ID_ALPHABET[usize::from(b) % ID_ALPHABET.len()]));
            }
        }
    }
    Ok(out)
}

/// A 256-bit secret, URL-safe base64 without padding, with a readable prefix so leaked
/// secrets are recognisable.
pub(crate) fn random_secret(prefix: &str) -> Result<String, ControlError> {
    let bytes = random_bytes::<32>()?;
    Ok(format!("{prefix}{}", URL_SAFE_NO_PAD.encode(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_dns_labels() {
        for _ in 0..100 {
            let id = random_id("i", 20).unwrap();
            assert_eq!(id.len(), 21);
            assert!(id
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
        }
    }

    #[test]
    fn secrets_differ() {
        assert_ne!(random_secret("x_").unwrap(), random_secret("x_").unwrap());
    }
}

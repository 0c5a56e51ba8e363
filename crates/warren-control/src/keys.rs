//! API keys: random secrets shown once, stored only as SHA-256 hashes.
//!
//! A plain SHA-256 (no salt, no slow KDF) is enough here because keys are 256-bit random
//! values, not passwords: nothing is gained by slowing down a brute force of 2^256.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use crate::error::ControlError;
use crate::random::random_id;
use crate::store::KeyStore;

/// A stored API key. There is deliberately no field for the key itself.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiKey {
    pub id: String,
    pub name: String,
    /// Hex SHA-256 of the key.
    pub hash: String,
    /// The first characters of the key, to tell keys apart in listings.
    pub prefix: String,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
    /// Sandboxes and snapshots belong to the team of the key that made them.
    pub team: String,
    /// Sees and acts on every team's sandboxes (the operator's keys).
    pub admin: bool,
}

/// The team of keys that name none (and of everything made before teams existed).
pub const DEFAULT_TEAM: &str = "default";

/// Which sandboxes and snapshots a caller may see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    All,
    Team(String),
}

impl Scope {
    pub fn of(key: &ApiKey) -> Scope {
        if key.admin {
            Scope::All
        } else {
            Scope::Team(key.team.clone())
        }
    }

    pub fn allows(&self, team: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Team(t) => t == team,
        }
    }
}

/// A freshly created key: the only moment the secret exists outside its owner's hands.
#[derive(Clone)]
pub struct NewApiKey {
    pub key: ApiKey,
    pub secret: String,
}

impl std::fmt::Debug for NewApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret, even in debug output.
        f.debug_struct("NewApiKey")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

pub fn hash_api_key(secret: &str) -> String {
    let digest = Sha256::digest(secret.as_bytes());
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

const PREFIX_LEN: usize = 10;

pub(crate) fn record_for(name: &str, secret: &str) -> Result<ApiKey, ControlError> {
    Ok(ApiKey {
        team: DEFAULT_TEAM.to_string(),
        admin: false,
        id: random_id("k", 12)?,
        name: name.to_string(),
        hash: hash_api_key(secret),
        prefix: secret.chars().take(PREFIX_LEN).collect(),
        created_at: Utc::now(),
        revoked_at: None,
    })
}

/// A new key of `team`; `admin` keys act on every team's sandboxes.
pub fn generate(name: &str, team: &str, admin: bool) -> Result<NewApiKey, ControlError> {
    if !valid_team(team) {
        return Err(ControlError::InvalidArgument(format!(
            "invalid team {team:?}: use 1-64 lowercase letters, digits, '-' or '_'"
        )));
    }
    let secret = e2b_format_secret()?;
    let mut key = record_for(name, &secret)?;
    key.team = team.to_string();
    key.admin = admin;
    Ok(NewApiKey { key, secret })
}

/// A key in E2B's format, `e2b_` and 40 lowercase hex digits (160 random bits): newer SDKs
/// check keys against `^e2b_[0-9a-f]+$` before sending them.
fn e2b_format_secret() -> Result<String, ControlError> {
    let bytes = crate::random::random_bytes::<20>()?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("e2b_{hex}"))
}

/// Whether E2B's SDKs accept `secret` as an API key (they reject other keys client-side).
pub fn sdk_accepts_key(secret: &str) -> bool {
    secret
        .strip_prefix("e2b_")
        .is_some_and(|h| !h.is_empty() && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

fn valid_team(team: &str) -> bool {
    !team.is_empty()
        && team.len() <= 64
        && team
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// The keys service: checks, makes and revokes API keys. Depends on no other service.
pub struct Keys {
    store: Arc<dyn KeyStore>,
}

impl Keys {
    pub(crate) fn new(store: Arc<dyn KeyStore>) -> Self {
        Self { store }
    }

    /// Checks an `X-API-KEY` value.
    pub async fn authenticate(&self, secret: &str) -> Result<ApiKey, ControlError> {
        if secret.is_empty() {
            return Err(ControlError::Unauthenticated);
        }
        self.store
            .api_key_by_hash(&hash_api_key(secret))
            .await?
            .ok_or(ControlError::Unauthenticated)
    }

    /// Creates an operator (admin) key; the secret is in the result and nowhere else.
    pub async fn create_api_key(&self, name: &str) -> Result<NewApiKey, ControlError> {
        let new = generate(name, DEFAULT_TEAM, true)?;
        self.store.insert_api_key(&new.key).await?;
        Ok(new)
    }

    /// Creates a key of `team` (`admin`: it sees every team); the secret is in the result
    /// and nowhere else.
    pub async fn create_team_key(
        &self,
        name: &str,
        team: &str,
        admin: bool,
    ) -> Result<NewApiKey, ControlError> {
        let new = generate(name, team, admin)?;
        self.store.insert_api_key(&new.key).await?;
        Ok(new)
    }

    /// Makes sure `secret` (e.g. from `WARREN_API_KEY`) is a valid key, recording its hash.
    pub async fn seed_api_key(&self, name: &str, secret: &str) -> Result<ApiKey, ControlError> {
        if secret.len() < 16 {
            return Err(ControlError::InvalidArgument(
                "API keys must be at least 16 characters".into(),
            ));
        }
        if let Some(k) = self.store.api_key_by_hash(&hash_api_key(secret)).await? {
            return Ok(k);
        }
        // The operator's own key (`WARREN_API_KEY`): it sees every team.
        let mut key = record_for(name, secret)?;
        key.admin = true;
        self.store.insert_api_key(&key).await?;
        Ok(key)
    }

    pub async fn api_keys(&self) -> Result<Vec<ApiKey>, ControlError> {
        Ok(self.store.api_keys().await?)
    }

    pub async fn revoke_api_key(&self, id: &str) -> Result<(), ControlError> {
        if self.store.revoke_api_key(id).await? {
            Ok(())
        } else {
            Err(ControlError::NotFound(format!("API key {id} not found")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_keys_have_e2bs_format() {
        let a = generate("k", DEFAULT_TEAM, false).unwrap().secret;
        let b = generate("k", DEFAULT_TEAM, false).unwrap().secret;
        assert_ne!(a, b);
        assert_eq!(a.len(), 44, "{a}");
        assert!(sdk_accepts_key(&a), "{a}");
        for bad in ["e2b_", "e2b_ABCD", "e2b_x1", "key", "e2b_Zm9v-_"] {
            assert!(!sdk_accepts_key(bad), "{bad}");
        }
    }

    #[test]
    fn hash_is_sha256_hex() {
        assert_eq!(
            hash_api_key("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn generated_key_matches_its_hash() {
        let k = generate("test", DEFAULT_TEAM, false).unwrap();
        assert!(generate("x", "Bad Team", false).is_err());
        assert_eq!(k.key.hash, hash_api_key(&k.secret));
        assert!(k.secret.starts_with(&k.key.prefix));
        assert!(!format!("{k:?}").contains(&k.secret));
    }
}

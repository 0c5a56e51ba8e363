//! The secrets service: secrets a team keeps on the server (E2B's `/secrets`): a name, a write-only value and
//! metadata. Values are sealed by the store, never returned by any read, never logged, and
//! never written into a sandbox; the egress proxy is where they will be used (placeholders
//! `${e2b.secrets.<name>}` in `network.rules` headers).
//!
//! Names follow E2B's rule: 1 to 128 bytes of `[A-Za-z0-9_-]`, kept lower-cased (so `API_KEY`
//! and `api_key` are one secret), and not starting with `sec_` (ids do). A secret is named in
//! paths by its id or its name.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::error::ControlError;
use crate::random::random_id;
use crate::store::SecretStore;

/// Longest name, value and metadata a secret may have.
pub const MAX_NAME_LEN: usize = 128;
pub const MAX_VALUE_LEN: usize = 64 * 1024;
pub const MAX_METADATA: usize = 32;
/// Most secrets one page of a listing holds.
pub const MAX_PAGE: usize = 100;

/// A secret as recorded: everything but the value, which only the store and the egress
/// proxy see.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretInfo {
    pub id: String,
    /// Canonical (lower-case) name.
    pub name: String,
    pub team: String,
    /// 1 at create, one more at every update of the value.
    pub version: u32,
    pub metadata: BTreeMap<String, String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A secret with its value, for the store and for the egress proxy only.
#[derive(Clone, PartialEq, Eq)]
pub struct SealedSecret {
    pub info: SecretInfo,
    pub value: String,
}

impl std::fmt::Debug for SealedSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The value never reaches a log, even through a debug print.
        f.debug_struct("SealedSecret")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

/// One page of a listing and the token of the next, if there is one.
#[derive(Debug, Clone)]
pub struct SecretPage {
    pub secrets: Vec<SecretInfo>,
    pub next_token: Option<String>,
}

/// The canonical form of a secret name, or why it is not one.
pub fn canonical_name(name: &str) -> Result<String, ControlError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    let lower = name.to_ascii_lowercase();
    if !ok || lower.starts_with("sec_") {
        return Err(ControlError::InvalidArgument(format!(
            "invalid secret name {name:?}: 1 to {MAX_NAME_LEN} letters, digits, '_' or '-', \
             not starting with 'sec_'"
        )));
    }
    Ok(lower)
}

fn check_value(value: &str) -> Result<(), ControlError> {
    if value.is_empty() || value.len() > MAX_VALUE_LEN {
        return Err(ControlError::InvalidArgument(format!(
            "a secret's value must be 1 to {MAX_VALUE_LEN} bytes"
        )));
    }
    Ok(())
}

fn check_metadata(m: &BTreeMap<String, String>) -> Result<(), ControlError> {
    if m.len() > MAX_METADATA
        || m.iter()
            .any(|(k, v)| k.is_empty() || k.len() > 256 || v.len() > 1024)
    {
        return Err(ControlError::InvalidArgument(format!(
            "secret metadata: at most {MAX_METADATA} keys of 1 to 256 bytes, values up to 1024"
        )));
    }
    Ok(())
}

fn not_found(r: &str) -> ControlError {
    ControlError::NotFound(format!("secret {r} not found"))
}

/// Team secrets: created, read (never their values, but for the egress broker), updated,
/// deleted and listed. Depends on no other service.
pub(crate) struct Secrets {
    store: Arc<dyn SecretStore>,
    /// Most secrets a team keeps.
    max: usize,
    /// Serialises the name and count checks of creates and updates.
    lock: Mutex<()>,
}

impl Secrets {
    pub(crate) fn new(store: Arc<dyn SecretStore>, max: usize) -> Self {
        Self {
            store,
            max,
            lock: Mutex::new(()),
        }
    }

    /// Stores a new secret for `team`.
    pub(crate) async fn create(
        &self,
        team: &str,
        name: &str,
        value: String,
        metadata: BTreeMap<String, String>,
    ) -> Result<SecretInfo, ControlError> {
        let name = canonical_name(name)?;
        check_value(&value)?;
        check_metadata(&metadata)?;
        let _g = self.lock.lock().await;
        if self.store.secret_by_name(team, &name).await?.is_some() {
            return Err(ControlError::FailedPrecondition(format!(
                "secret {name} already exists"
            )));
        }
        let max = self.max;
        if self.store.secrets(Some(team)).await?.len() >= max {
            return Err(ControlError::QuotaExceeded(format!(
                "a team keeps at most {max} secrets; delete one first"
            )));
        }
        let now = Utc::now();
        let info = SecretInfo {
            id: random_id("sec_", 20)?,
            name,
            team: team.to_string(),
            version: 1,
            metadata,
            created_at: now,
            updated_at: now,
        };
        self.store
            .put_secret(&SealedSecret {
                info: info.clone(),
                value,
            })
            .await?;
        tracing::info!(secret_id = %info.id, name = %info.name, %team, "secret created");
        Ok(info)
    }

    /// The secret `r` (id or name) with its value, if `team` may see it (`None`: any).
    pub(crate) async fn sealed(
        &self,
        team: Option<&str>,
        r: &str,
    ) -> Result<SealedSecret, ControlError> {
        let store = &self.store;
        let found = match store.get_secret(r).await? {
            Some(s) if team.is_none_or(|t| s.info.team == t) => Some(s),
            _ => match (team, canonical_name(r)) {
                (Some(t), Ok(name)) => store.secret_by_name(t, &name).await?,
                (None, Ok(name)) => {
                    let mut all: Vec<SecretInfo> = store
                        .secrets(None)
                        .await?
                        .into_iter()
                        .filter(|s| s.name == name)
                        .collect();
                    if all.len() > 1 {
                        return Err(ControlError::InvalidArgument(format!(
                            "several teams have a secret named {name}; use its id"
                        )));
                    }
                    match all.pop() {
                        Some(s) => store.get_secret(&s.id).await?,
                        None => None,
                    }
                }
                (_, Err(_)) => None,
            },
        };
        found.ok_or_else(|| not_found(r))
    }

    /// The value of `team`'s secret `name`, for the egress proxy brokering a request of one
    /// of the team's sandboxes (`None`: no such secret). Read from the store each time, so an
    /// update applies to the next request.
    pub(crate) async fn brokered(
        &self,
        sandbox_id: &str,
        team: &str,
        name: &str,
    ) -> Option<String> {
        let name = canonical_name(name).ok()?;
        match self.store.secret_by_name(team, &name).await {
            Ok(found) => {
                tracing::debug!(sandbox_id, secret = %name, found = found.is_some(),
                    "secret brokered");
                found.map(|s| s.value)
            }
            Err(e) => {
                tracing::warn!(sandbox_id, secret = %name, error = %warren_runtime::chain(&e), "cannot read a secret");
                None
            }
        }
    }

    /// What a secret is, without its value.
    pub(crate) async fn get(
        &self,
        team: Option<&str>,
        r: &str,
    ) -> Result<SecretInfo, ControlError> {
        Ok(self.sealed(team, r).await?.info)
    }

    /// Replaces a secret's value (its version goes up) and, when given, its metadata.
    pub(crate) async fn update(
        &self,
        team: Option<&str>,
        r: &str,
        value: String,
        metadata: Option<BTreeMap<String, String>>,
    ) -> Result<SecretInfo, ControlError> {
        check_value(&value)?;
        if let Some(m) = &metadata {
            check_metadata(m)?;
        }
        let _g = self.lock.lock().await;
        let mut s = self.sealed(team, r).await?;
        s.value = value;
        s.info.version += 1;
        s.info.updated_at = Utc::now();
        if let Some(m) = metadata {
            s.info.metadata = m;
        }
        self.store.put_secret(&s).await?;
        tracing::info!(secret_id = %s.info.id, version = s.info.version, "secret updated");
        Ok(s.info)
    }

    pub(crate) async fn delete(&self, team: Option<&str>, r: &str) -> Result<(), ControlError> {
        let s = self.get(team, r).await?;
        self.store.delete_secret(&s.id).await?;
        tracing::info!(secret_id = %s.id, "secret deleted");
        Ok(())
    }

    /// A page of `team`'s secrets (`None`: all), oldest first; `next_token` is the previous
    /// page's.
    pub(crate) async fn list(
        &self,
        team: Option<&str>,
        limit: Option<u32>,
        next_token: Option<&str>,
    ) -> Result<SecretPage, ControlError> {
        let limit = match limit {
            None => MAX_PAGE,
            Some(n) if n >= 1 && n as usize <= MAX_PAGE => n as usize,
            Some(n) => {
                return Err(ControlError::InvalidArgument(format!(
                    "limit must be 1 to {MAX_PAGE}, not {n}"
                )))
            }
        };
        let mut all = self.store.secrets(team).await?;
        all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        let start = match next_token {
            None | Some("") => 0,
            Some(t) => all
                .iter()
                .position(|s| s.id == t)
                .ok_or_else(|| ControlError::InvalidArgument("invalid nextToken".into()))?,
        };
        let rest = &all[start..];
        let next_token = rest.get(limit).map(|s| s.id.clone());
        Ok(SecretPage {
            secrets: rest.iter().take(limit).cloned().collect(),
            next_token,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(canonical_name("OpenAI_Key-1").unwrap(), "openai_key-1");
        for bad in ["", "a b", "sec_x", "SEC_x", "a/b", "ä"] {
            assert!(canonical_name(bad).is_err(), "{bad}");
        }
        assert!(canonical_name(&"a".repeat(129)).is_err());
    }

    #[test]
    fn values_never_print() {
        let s = SealedSecret {
            info: SecretInfo {
                id: "sec_1".into(),
                name: "k".into(),
                team: "t".into(),
                version: 1,
                metadata: BTreeMap::new(),
                created_at: Utc::now(),
                updated_at: Utc::now(),
            },
            value: "hunter2".into(),
        };
        assert!(!format!("{s:?}").contains("hunter2"));
    }
}

//! A sandbox's id. It becomes a host name, a DNS label in `{port}-{id}.{domain}`, a cgroup, a
//! directory and a network-slot owner, so one rule holds everywhere: 1 to 63 lowercase ASCII
//! letters and digits (no `-`, which the host scheme splits on; no `.`, `/` or upper case).

use std::fmt;
use std::str::FromStr;

/// A checked sandbox id. Made only by parsing ([`FromStr`], [`TryFrom<String>`], serde) or by
/// [`SandboxId::generate`], so holding one means the rule holds.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub struct SandboxId(String);

/// A string that breaks the sandbox-id rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid sandbox id {0:?}: 1 to 63 lowercase letters and digits")]
pub struct InvalidSandboxId(pub String);

/// Longest id: a DNS label.
const MAX_LEN: usize = 63;
/// Length of a generated id: `i` and 20 random characters (E2B's ids look the same).
const GENERATED_LEN: usize = 21;
const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

impl SandboxId {
    /// Whether `s` follows the rule (for callers that only filter, e.g. directory sweeps).
    pub fn is_valid(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= MAX_LEN
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    }

    /// A new random id: `i` and 20 lowercase letters and digits, uniformly drawn. Runtimes
    /// that prepare sandboxes ahead name them with it, so a prepared one needs no renaming.
    pub fn generate() -> Result<SandboxId, getrandom::Error> {
        let mut out = String::with_capacity(GENERATED_LEN);
        out.push('i');
        while out.len() < GENERATED_LEN {
            let mut buf = [0u8; 32];
            getrandom::fill(&mut buf)?;
            for b in buf {
                // Rejection sampling keeps the distribution uniform: 252 = 7 * 36.
                if b < 252 && out.len() < GENERATED_LEN {
                    out.push(char::from(ALPHABET[usize::from(b) % ALPHABET.len()]));
                }
            }
        }
        Ok(SandboxId(out))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for SandboxId {
    type Err = InvalidSandboxId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if SandboxId::is_valid(s) {
            Ok(SandboxId(s.to_string()))
        } else {
            Err(InvalidSandboxId(s.to_string()))
        }
    }
}

impl TryFrom<String> for SandboxId {
    type Error = InvalidSandboxId;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        if SandboxId::is_valid(&s) {
            Ok(SandboxId(s))
        } else {
            Err(InvalidSandboxId(s))
        }
    }
}

impl From<SandboxId> for String {
    fn from(id: SandboxId) -> String {
        id.0
    }
}

impl std::ops::Deref for SandboxId {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for SandboxId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl AsRef<std::path::Path> for SandboxId {
    fn as_ref(&self) -> &std::path::Path {
        self.0.as_ref()
    }
}

impl std::borrow::Borrow<str> for SandboxId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<str> for SandboxId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<String> for SandboxId {
    fn eq(&self, other: &String) -> bool {
        self.0 == *other
    }
}

impl PartialEq<&str> for SandboxId {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rule_for_every_id() {
        for good in ["a", "i0123456789abcdefghij", &"z".repeat(63)] {
            assert!(good.parse::<SandboxId>().is_ok(), "{good}");
        }
        for bad in [
            "",
            &"z".repeat(64),
            "with-dash",
            "Upper",
            "dot.ted",
            "sl/ash",
            "..",
            "spa ce",
            "ünï",
        ] {
            assert_eq!(
                bad.parse::<SandboxId>(),
                Err(InvalidSandboxId(bad.to_string())),
                "{bad}"
            );
        }
    }

    #[test]
    fn generated_ids_follow_the_rule_and_differ() {
        let (a, b) = (
            SandboxId::generate().unwrap(),
            SandboxId::generate().unwrap(),
        );
        assert_ne!(a, b);
        for id in [a, b] {
            assert_eq!(id.len(), GENERATED_LEN, "{id}");
            assert!(id.starts_with('i'), "{id}");
            assert!(SandboxId::is_valid(&id), "{id}");
        }
    }

    #[test]
    fn serde_checks_the_rule() {
        let id: SandboxId = serde_json::from_str("\"abc123\"").unwrap();
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"abc123\"");
        assert!(serde_json::from_str::<SandboxId>("\"a-b\"").is_err());
    }
}

//! Templates built here: their names, tags and builds, and how a `templateID` in a create
//! resolves to what the runtime starts from.
//!
//! A template has an id (20 lowercase letters and digits), at most one alias (its name,
//! unique on the host), and tags, each pointing at one of its ready builds (`default` is the
//! newest). Every ready build is an immutable image the runtime knows by its key; a sandbox
//! pins the build it was created from, so a rebuild never changes a running sandbox.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::ControlError;

/// The tag a name without `:tag` means.
pub const DEFAULT_TAG: &str = "default";

/// A template as the store keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Template {
    pub id: String,
    pub team: String,
    /// Its name (without namespace or tag), unique on the host.
    pub alias: Option<String>,
    pub public: bool,
    #[serde(flatten)]
    pub resources: warren_types::Resources,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub build_count: u32,
    pub spawn_count: u64,
    pub last_spawned_at: Option<DateTime<Utc>>,
    /// Tag → the ready build it names.
    pub tags: BTreeMap<String, TagRef>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TagRef {
    pub build_id: String,
    pub created_at: DateTime<Utc>,
}

/// Where a build is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BuildStatus {
    /// Registered; files may be uploaded; not triggered yet.
    Waiting,
    Building,
    Ready,
    Error,
}

impl BuildStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            BuildStatus::Waiting => "waiting",
            BuildStatus::Building => "building",
            BuildStatus::Ready => "ready",
            BuildStatus::Error => "error",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "waiting" => BuildStatus::Waiting,
            "building" => BuildStatus::Building,
            "ready" => BuildStatus::Ready,
            "error" => BuildStatus::Error,
            _ => return None,
        })
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, BuildStatus::Ready | BuildStatus::Error)
    }
}

/// Why a build failed, and which step (`base`, `1`…`N`, `finalize`) it was in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildReason {
    pub message: String,
    pub step: Option<String>,
}

/// One build of a template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Build {
    /// A UUID, as the SDKs expect.
    pub id: String,
    pub template_id: String,
    pub status: BuildStatus,
    /// Tags that point at this build once it is ready.
    pub tags: Vec<String>,
    pub reason: Option<BuildReason>,
    /// The runtime's key of the finished image.
    pub image: Option<String>,
    #[serde(flatten)]
    pub resources: warren_types::Resources,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

impl LogLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "debug" => LogLevel::Debug,
            "info" => LogLevel::Info,
            "warn" => LogLevel::Warn,
            "error" => LogLevel::Error,
            _ => return None,
        })
    }
}

/// One line of a build's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    pub timestamp: DateTime<Utc>,
    pub level: LogLevel,
    pub message: String,
    pub step: Option<String>,
}

/// A template name as the SDKs send it: `[namespace/]alias[:tag]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateName {
    pub namespace: Option<String>,
    pub alias: String,
    /// `None` for no tag or `:default`.
    pub tag: Option<String>,
}

fn alias_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_'))
}

/// Whether `tag` is a valid tag (letters, digits, `-`, `_`, `.`; not a UUID).
pub fn tag_ok(tag: &str) -> bool {
    !tag.is_empty()
        && tag.len() <= 128
        && tag
            .bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.'))
        && !looks_like_uuid(tag)
}

fn looks_like_uuid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

impl TemplateName {
    /// Parses a name as upstream does: trimmed, lower-cased, `:default` meaning no tag.
    pub fn parse(raw: &str) -> Result<TemplateName, ControlError> {
        let name = raw.trim().to_ascii_lowercase();
        let bad =
            |why: &str| ControlError::InvalidArgument(format!("Invalid name: {raw:?}: {why}"));
        if name.is_empty() {
            return Err(ControlError::InvalidArgument("Name is required".into()));
        }
        let (rest, tag) = match name.split_once(':') {
            Some((r, t)) => (r, Some(t)),
            None => (name.as_str(), None),
        };
        let (namespace, alias) = match rest.split_once('/') {
            Some((ns, a)) => (Some(ns), a),
            None => (None, rest),
        };
        if let Some(ns) = namespace {
            if !alias_ok(ns) {
                return Err(bad(
                    "namespace must be lowercase letters, digits, '-' or '_'",
                ));
            }
        }
        if !alias_ok(alias) {
            return Err(bad("alias must be lowercase letters, digits, '-' or '_'"));
        }
        let tag = match tag {
            None => None,
            Some(t) if !tag_ok(t) => {
                return Err(bad(
                    "tag must be lowercase letters, digits, '-', '_' or '.'",
                ))
            }
            Some(DEFAULT_TAG) => None,
            Some(t) => Some(t.to_string()),
        };
        Ok(TemplateName {
            namespace: namespace.map(str::to_string),
            alias: alias.to_string(),
            tag,
        })
    }
}

/// Tags a build gets: the name's, the request's, and `default`, de-duplicated.
pub fn build_tags(name: &TemplateName, extra: &[String]) -> Result<Vec<String>, ControlError> {
    let mut tags = vec![DEFAULT_TAG.to_string()];
    for t in name.tag.iter().chain(extra) {
        let t = t.trim().to_ascii_lowercase();
        if !tag_ok(&t) {
            return Err(ControlError::InvalidArgument(format!("invalid tag {t:?}")));
        }
        if !tags.contains(&t) {
            tags.push(t);
        }
    }
    Ok(tags)
}

/// Checks `cpuCount` / `memoryMB` as upstream does (1 or even CPUs up to 32; at least 128 MiB
/// of memory, even), against the host's own ceilings.
pub fn check_resources(
    cpu: u32,
    memory_mb: u32,
    max_cpu: u32,
    max_mb: u32,
) -> Result<(), ControlError> {
    if cpu == 0 || cpu > 32 || (cpu != 1 && !cpu.is_multiple_of(2)) || cpu > max_cpu {
        return Err(ControlError::InvalidArgument(format!(
            "cpuCount must be 1 or an even number up to {}, got {cpu}",
            max_cpu.min(32)
        )));
    }
    if memory_mb < 128 || !memory_mb.is_multiple_of(2) || memory_mb > max_mb {
        return Err(ControlError::InvalidArgument(format!(
            "memoryMB must be an even number from 128 to {max_mb}, got {memory_mb}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_like_upstream() {
        let n = TemplateName::parse("  Team/My-App:V1.2 ").unwrap();
        assert_eq!(n.namespace.as_deref(), Some("team"));
        assert_eq!(n.alias, "my-app");
        assert_eq!(n.tag.as_deref(), Some("v1.2"));
        assert_eq!(TemplateName::parse("x:default").unwrap().tag, None);
        for bad in [
            "",
            "a b",
            "a/b/c",
            "x:",
            "x:123e4567-e89b-12d3-a456-426614174000",
            "é",
        ] {
            assert!(TemplateName::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn tags_are_deduplicated_with_default_first() {
        let n = TemplateName::parse("app:v1").unwrap();
        let tags = build_tags(&n, &["v1".into(), "prod".into()]).unwrap();
        assert_eq!(tags, ["default", "v1", "prod"]);
        assert!(build_tags(&n, &["Bad Tag".into()]).is_err());
    }

    #[test]
    fn resources_follow_upstream_rules() {
        assert!(check_resources(1, 1024, 8, 8192).is_ok());
        assert!(check_resources(2, 128, 8, 8192).is_ok());
        assert!(check_resources(3, 1024, 8, 8192).is_err());
        assert!(check_resources(0, 1024, 8, 8192).is_err());
        assert!(check_resources(2, 127, 8, 8192).is_err());
        assert!(check_resources(2, 1025, 8, 8192).is_err());
        assert!(check_resources(16, 1024, 8, 8192).is_err());
    }
}

//! Listing: filters, ordering and opaque cursors (`e2b-compat.md` §2.4).

use std::collections::BTreeMap;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use chrono::{DateTime, Utc};
use percent_encoding::percent_decode_str;

use crate::error::ControlError;
use crate::model::{Sandbox, SandboxState};

pub const DEFAULT_LIMIT: u32 = 100;
pub const MAX_LIMIT: u32 = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    Asc,
    /// Newest first, the upstream default.
    #[default]
    Desc,
}

impl Order {
    pub fn parse(s: &str) -> Result<Order, ControlError> {
        match s {
            "asc" => Ok(Order::Asc),
            "desc" => Ok(Order::Desc),
            other => Err(ControlError::InvalidArgument(format!(
                "order must be 'asc' or 'desc', not {other:?}"
            ))),
        }
    }
}

/// Which API states to show. Absent filter = both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListStates {
    pub running: bool,
    pub paused: bool,
}

impl Default for ListStates {
    fn default() -> Self {
        ListStates {
            running: true,
            paused: true,
        }
    }
}

impl ListStates {
    /// Parses the comma-joined `state` parameter (`running,paused`).
    pub fn parse(s: &str) -> Result<ListStates, ControlError> {
        let mut out = ListStates {
            running: false,
            paused: false,
        };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "running" => out.running = true,
                "paused" => out.paused = true,
                other => {
                    return Err(ControlError::InvalidArgument(format!(
                        "unknown sandbox state {other:?} (expected running or paused)"
                    )))
                }
            }
        }
        Ok(out)
    }

    /// The stored states these API states cover. Pending and Stopping sandboxes show as
    /// running: they hold resources and a caller that just created one expects to see it.
    pub fn stored_states(self) -> Vec<SandboxState> {
        let mut v = Vec::new();
        if self.running {
            v.extend([
                SandboxState::Pending,
                SandboxState::Running,
                SandboxState::Stopping,
            ]);
        }
        if self.paused {
            v.push(SandboxState::Paused);
        }
        v
    }
}

#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    pub states: ListStates,
    pub metadata: BTreeMap<String, String>,
    pub order: Order,
    pub started_after: Option<DateTime<Utc>>,
    pub template: Option<String>,
    /// Only this team's sandboxes (`None`: every team's).
    pub team: Option<String>,
    pub limit: Option<u32>,
    pub next_token: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Page {
    pub items: Vec<Sandbox>,
    /// Present (non-empty) exactly when more items follow.
    pub next_token: Option<String>,
}

/// Parses the `metadata` filter the way upstream does: unescape the whole value, split on
/// `&`, split each pair on `=` (exactly two parts), unescape key and value.
pub fn parse_metadata_query(raw: &str) -> Result<BTreeMap<String, String>, ControlError> {
    let bad =
        |what: &str| ControlError::InvalidArgument(format!("invalid metadata filter: {what}"));
    let whole = percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| bad("not UTF-8"))?;
    let mut out = BTreeMap::new();
    for pair in whole.split('&').filter(|p| !p.is_empty()) {
        let parts: Vec<&str> = pair.split('=').collect();
        let [k, v] = parts.as_slice() else {
            return Err(bad("expected key=value pairs"));
        };
        let k = percent_decode_str(k)
            .decode_utf8()
            .map_err(|_| bad("not UTF-8"))?;
        let v = percent_decode_str(v)
            .decode_utf8()
            .map_err(|_| bad("not UTF-8"))?;
        out.insert(k.into_owned(), v.into_owned());
    }
    Ok(out)
}

/// Cursor = position of the last item returned: (start time in µs, id), a total order.
fn encode_cursor(s: &Sandbox) -> String {
    encode_position(s.started_at.timestamp_micros(), &s.id)
}

/// The opaque `nextToken` of a position (time in µs, id); snapshot listings use it too, so
/// both kinds of token look alike on the wire.
pub(crate) fn encode_position(micros: i64, id: &str) -> String {
    URL_SAFE_NO_PAD.encode(format!("{micros}:{id}"))
}

fn decode_cursor(token: &str) -> Result<(i64, String), ControlError> {
    decode_position(token)
}

/// The position a `nextToken` holds; a token that is not one is a 400.
pub(crate) fn decode_position(token: &str) -> Result<(i64, String), ControlError> {
    let bad = || ControlError::InvalidArgument("invalid nextToken".into());
    let raw = URL_SAFE_NO_PAD.decode(token).map_err(|_| bad())?;
    let raw = String::from_utf8(raw).map_err(|_| bad())?;
    let (ts, id) = raw.split_once(':').ok_or_else(bad)?;
    Ok((ts.parse().map_err(|_| bad())?, id.to_string()))
}

/// Filters, orders and pages `candidates` (already restricted to the wanted stored states).
pub fn apply(query: &ListQuery, mut candidates: Vec<Sandbox>) -> Result<Page, ControlError> {
    let limit = match query.limit {
        None => DEFAULT_LIMIT,
        Some(l) if (1..=MAX_LIMIT).contains(&l) => l,
        Some(l) => {
            return Err(ControlError::InvalidArgument(format!(
                "limit must be between 1 and {MAX_LIMIT}, not {l}"
            )))
        }
    } as usize;
    let cursor = query.next_token.as_deref().map(decode_cursor).transpose()?;

    candidates.retain(|s| {
        query
            .metadata
            .iter()
            .all(|(k, v)| s.metadata.get(k) == Some(v))
            && query.started_after.is_none_or(|t| s.started_at >= t)
            && query.template.as_ref().is_none_or(|t| &s.template == t)
            && query.team.as_ref().is_none_or(|t| &s.team == t)
    });
    let key = |s: &Sandbox| (s.started_at.timestamp_micros(), s.id.to_string());
    candidates.sort_by_key(key);
    if query.order == Order::Desc {
        candidates.reverse();
    }
    if let Some(c) = cursor {
        candidates.retain(|s| match query.order {
            Order::Asc => key(s) > c,
            Order::Desc => key(s) < c,
        });
    }
    let more = candidates.len() > limit;
    candidates.truncate(limit);
    let next_token = if more {
        candidates.last().map(encode_cursor)
    } else {
        None
    };
    Ok(Page {
        items: candidates,
        next_token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn sb(id: &str, secs: i64, meta: &[(&str, &str)]) -> Sandbox {
        let t = Utc.timestamp_opt(secs, 0).unwrap();
        Sandbox {
            volume_mounts: Vec::new(),
            id: id.parse().expect("a valid sandbox id"),
            template: "base".into(),
            state: SandboxState::Running,
            failure: None,
            resources: warren_types::Resources {
                cpu_count: 1,
                memory_mb: 512,
                disk_mb: 1024,
            },
            allow_internet_access: true,
            metadata: meta
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            started_at: t,
            end_at: t,
            envd_access_token: String::new(),
            traffic_access_token: String::new(),
            runtime: None,
            env_vars: BTreeMap::new(),
            lifecycle: Default::default(),
            pause_mode: None,
            network: Default::default(),
            team: "default".into(),
        }
    }

    #[test]
    fn metadata_query_is_decoded_like_upstream() {
        let m = parse_metadata_query("a%3D1%26b%3Dx%2520y").unwrap();
        assert_eq!(m.get("a").map(String::as_str), Some("1"));
        assert_eq!(m.get("b").map(String::as_str), Some("x y"));
        assert!(parse_metadata_query("a=1=2").is_err());
        assert!(parse_metadata_query("novalue").is_err());
    }

    #[test]
    fn pages_cover_everything_once() {
        let all: Vec<Sandbox> = (0..7).map(|i| sb(&format!("s{i}"), i, &[])).collect();
        for order in [Order::Asc, Order::Desc] {
            let mut q = ListQuery {
                order,
                limit: Some(3),
                ..Default::default()
            };
            let mut seen = Vec::new();
            loop {
                let page = apply(&q, all.clone()).unwrap();
                seen.extend(page.items.iter().map(|s| s.id.clone()));
                match page.next_token {
                    Some(t) => q.next_token = Some(t),
                    None => break,
                }
            }
            let mut expected: Vec<String> = (0..7).map(|i| format!("s{i}")).collect();
            if order == Order::Desc {
                expected.reverse();
            }
            assert_eq!(seen, expected);
        }
    }

    #[test]
    fn filters() {
        let all = vec![
            sb("a", 1, &[("k", "v")]),
            sb("b", 2, &[("k", "w")]),
            sb("c", 3, &[]),
        ];
        let q = ListQuery {
            metadata: [("k".to_string(), "v".to_string())].into(),
            ..Default::default()
        };
        let page = apply(&q, all.clone()).unwrap();
        assert_eq!(page.items.len(), 1);
        assert_eq!(page.items[0].id, "a");
        let q = ListQuery {
            started_after: Some(Utc.timestamp_opt(2, 0).unwrap()),
            ..Default::default()
        };
        assert_eq!(apply(&q, all.clone()).unwrap().items.len(), 2);
        assert!(apply(
            &ListQuery {
                limit: Some(0),
                ..Default::default()
            },
            all.clone()
        )
        .is_err());
        assert!(apply(
            &ListQuery {
                next_token: Some("!!".into()),
                ..Default::default()
            },
            all
        )
        .is_err());
        assert!(ListStates::parse("running,bogus").is_err());
    }
}

//! The agent's journal: a bounded ring of what happened in the sandbox, read by the control
//! plane through `GET /journal` (see [`warren_proto::journal`]).
//!
//! Recording must never slow or fail the thing recorded: an entry is a lock, a push and, when
//! the ring is full, a pop. The ring holds at most [`MAX_ENTRIES`] entries and
//! [`MAX_BYTES`] of text; the reader polls every few seconds, so the bound is only reached
//! by a burst (a process printing fast), and what falls out is counted, never silently lost.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use axum::extract::{Query, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use warren_proto::journal::{JournalEntry, JournalPage, Level};

use crate::state::AppState;

/// Most entries kept.
pub const MAX_ENTRIES: usize = 16_384;
/// Most bytes of messages and fields kept.
pub const MAX_BYTES: usize = 8 << 20;
/// Longest message or field value kept; longer ones are cut (and say so).
pub const MAX_TEXT: usize = 2048;
/// Most entries one read returns.
pub const MAX_PAGE: usize = 1000;

#[derive(Default)]
struct Ring {
    entries: VecDeque<(JournalEntry, usize)>,
    bytes: usize,
    /// The last `seq` handed out.
    seq: u64,
}

/// The journal of this run of the agent.
pub struct Journal {
    boot: String,
    enabled: bool,
    ring: Mutex<Ring>,
}

impl Default for Journal {
    fn default() -> Self {
        Self::new(true)
    }
}

impl Journal {
    /// A journal that records (`enabled`) or drops everything (the server's audit is off).
    pub fn new(enabled: bool) -> Self {
        Self {
            boot: boot_id(),
            enabled,
            ring: Mutex::new(Ring::default()),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Records one entry now.
    pub fn record(
        &self,
        kind: &'static str,
        level: Level,
        message: impl Into<String>,
        fields: BTreeMap<String, String>,
    ) {
        if !self.enabled {
            return;
        }
        let message = cut(message.into());
        let fields: BTreeMap<String, String> =
            fields.into_iter().map(|(k, v)| (k, cut(v))).collect();
        let size = message.len()
            + kind.len()
            + fields.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
            + 64;
        let at_ms = chrono::Utc::now().timestamp_millis();
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        ring.seq += 1;
        let entry = JournalEntry {
            seq: ring.seq,
            at_ms,
            kind: kind.to_string(),
            level,
            message,
            fields,
        };
        ring.bytes += size;
        ring.entries.push_back((entry, size));
        while ring.entries.len() > MAX_ENTRIES || ring.bytes > MAX_BYTES {
            match ring.entries.pop_front() {
                Some((_, n)) => ring.bytes -= n,
                None => break,
            }
        }
    }

    /// Entries after `after`, at most `limit` (and [`MAX_PAGE`]).
    pub fn page(&self, after: u64, limit: usize) -> JournalPage {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let oldest = ring.entries.front().map(|(e, _)| e.seq);
        let dropped = match oldest {
            Some(first) if first > after + 1 => first - after - 1,
            None if ring.seq > after => ring.seq - after,
            _ => 0,
        };
        let entries: Vec<JournalEntry> = ring
            .entries
            .iter()
            .map(|(e, _)| e)
            .filter(|e| e.seq > after)
            .take(limit.clamp(1, MAX_PAGE))
            .cloned()
            .collect();
        let next = entries.last().map(|e| e.seq).unwrap_or(after);
        JournalPage {
            boot: self.boot.clone(),
            next,
            dropped,
            entries,
        }
    }
}

/// Names this run of the agent: its start time and pid. Not random on purpose: the agent
/// starts before a microVM's kernel has entropy, and asking for random bytes then blocks.
fn boot_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{nanos:x}-{:x}", std::process::id())
}

/// Cuts `s` to [`MAX_TEXT`] bytes on a character boundary, saying so.
fn cut(mut s: String) -> String {
    if s.len() <= MAX_TEXT {
        return s;
    }
    let mut end = MAX_TEXT;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push_str("…[cut]");
    s
}

/// Fields from `(name, value)` pairs.
pub fn fields<const N: usize>(pairs: [(&str, String); N]) -> BTreeMap<String, String> {
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

#[derive(Deserialize)]
pub struct PageQuery {
    #[serde(default)]
    after: u64,
    #[serde(default = "default_limit")]
    limit: usize,
}

fn default_limit() -> usize {
    MAX_PAGE
}

/// `GET /journal?after=&limit=`: the entries after a cursor (token required).
pub async fn read(State(state): State<AppState>, Query(q): Query<PageQuery>) -> Response {
    let mut resp = Json(state.journal.page(q.after, q.limit)).into_response();
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(j: &Journal, msg: &str) {
        j.record(
            warren_proto::journal::AGENT,
            Level::Info,
            msg,
            BTreeMap::new(),
        );
    }

    #[test]
    fn pages_follow_the_cursor() {
        let j = Journal::default();
        for i in 0..5 {
            one(&j, &format!("m{i}"));
        }
        let p = j.page(0, 2);
        assert_eq!(
            p.entries.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert_eq!((p.next, p.dropped), (2, 0));
        let p = j.page(p.next, 100);
        assert_eq!(p.entries.len(), 3);
        assert_eq!(p.next, 5);
        let p = j.page(5, 100);
        assert!(p.entries.is_empty());
        assert_eq!(p.next, 5);
    }

    #[test]
    fn the_bound_drops_the_oldest_and_counts_them() {
        let j = Journal::default();
        for i in 0..(MAX_ENTRIES + 10) {
            one(&j, &format!("m{i}"));
        }
        let p = j.page(0, 1);
        assert_eq!(p.dropped, 10);
        assert_eq!(p.entries[0].seq, 11);
    }

    #[test]
    fn long_text_is_cut() {
        let j = Journal::default();
        one(&j, &"é".repeat(MAX_TEXT));
        let e = &j.page(0, 1).entries[0];
        assert!(e.message.len() <= MAX_TEXT + 10);
        assert!(e.message.ends_with("[cut]"));
    }

    #[test]
    fn a_disabled_journal_keeps_nothing() {
        let j = Journal::new(false);
        one(&j, "x");
        assert!(j.page(0, 10).entries.is_empty());
    }
}

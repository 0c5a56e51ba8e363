//! What one sandbox may put into the audit trail (threat model W3-M2), and the summary of
//! what it was not allowed to.
//!
//! Every sandbox has a token bucket of entries ([`AuditBudget::entries_per_second`], as deep as
//! [`AuditBudget::burst`]) and a byte budget over the retention window
//! ([`AuditBudget::sandbox_bytes`]); no entry is written while the data disk is below
//! [`AuditBudget::min_free_bytes`]. An entry past a bound is not stored: it is counted, with
//! its kind, bytes and reason, and the counts become one `audit.dropped` entry per sandbox and
//! [`AuditBudget::summary_every`] (or when the sandbox pauses or ends), so a flood shows up in
//! the trail as what it was and how big, at a bounded cost.

use std::collections::BTreeMap;
use std::time::Instant;

use chrono::{DateTime, Utc};
use warren_proto::journal::Level;

use crate::audit::{AuditEntry, StoredAudit, KIND_DROPPED, SOURCE_BUDGET};
use crate::config::AuditBudget;

/// Bytes a row costs beyond its text (its integers, the record header and the index entries'
/// own keys): part of the estimate only, the same in the store's count.
pub const ROW_OVERHEAD: u64 = 64;
/// Longest kind kept (kinds are short words; a hostile agent may send anything).
const MAX_KIND: usize = 64;
/// Longest field name kept.
const MAX_FIELD_NAME: usize = 64;
/// Distinct kinds a summary names; the rest are counted under `other`.
const SUMMARY_KINDS: usize = 16;

/// Why an entry was left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Reason {
    /// Past the sandbox's rate of entries.
    Rate,
    /// Past the sandbox's bytes in the retention window.
    Size,
    /// The data disk was below its floor.
    Disk,
}

impl Reason {
    fn as_str(self) -> &'static str {
        match self {
            Reason::Rate => "rate",
            Reason::Size => "size",
            Reason::Disk => "disk",
        }
    }
}

/// The bytes an entry takes in the store, estimated the same way as the store's own count
/// (`Store::audit_usage`): its texts, its fields as JSON (as the store keeps them), and a
/// row's fixed cost.
pub fn stored_bytes(s: &StoredAudit) -> u64 {
    let e = &s.entry;
    let fields = serde_json::to_string(&e.fields).map_or(0, |j| j.len());
    (e.sandbox_id.len() + e.team.len() + s.source.len() + e.kind.len() + e.message.len() + fields)
        as u64
        + ROW_OVERHEAD
}

/// Cuts `s` to at most `max` bytes (on a character boundary); returns how many it removed.
fn clip(s: &mut String, max: usize) -> usize {
    if s.len() <= max {
        return 0;
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    let removed = s.len() - cut;
    s.truncate(cut);
    removed
}

/// Makes an entry fit in `max` bytes: half for the message, the rest for the fields (each
/// value at most an eighth), the kind and field names short. What was cut is counted in the
/// entry's `clipped_bytes` field.
pub(crate) fn clip_entry(e: &mut AuditEntry, max: usize) {
    let size = e.kind.len()
        + e.message.len()
        + e.fields
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>();
    if size <= max && e.kind.len() <= MAX_KIND {
        return;
    }
    let mut removed = clip(&mut e.kind, MAX_KIND) + clip(&mut e.message, max / 2);
    let mut room = max - max / 2;
    let mut kept = BTreeMap::new();
    for (mut k, mut v) in std::mem::take(&mut e.fields) {
        removed += clip(&mut k, MAX_FIELD_NAME) + clip(&mut v, max / 8);
        let need = k.len() + v.len();
        if need > room || kept.contains_key(&k) {
            removed += need;
            continue;
        }
        room -= need;
        kept.insert(k, v);
    }
    kept.insert("clipped_bytes".into(), removed.to_string());
    e.fields = kept;
}

/// What was left out since the last summary.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    /// When the first of them was left out (the summary waits `summary_every` from here).
    since: Instant,
    first_at: DateTime<Utc>,
    last_at: DateTime<Utc>,
    entries: u64,
    bytes: u64,
    kinds: BTreeMap<String, u64>,
    reasons: BTreeMap<Reason, u64>,
    /// Entries the source's own ring lost before they were read (no kind or size known).
    lost: u64,
}

impl Pending {
    fn new(now: Instant) -> Self {
        let at = Utc::now();
        Pending {
            since: now,
            first_at: at,
            last_at: at,
            entries: 0,
            bytes: 0,
            kinds: BTreeMap::new(),
            reasons: BTreeMap::new(),
            lost: 0,
        }
    }

    fn count(&mut self, s: &StoredAudit, bytes: u64, reason: Reason) {
        if self.entries == 0 {
            self.first_at = s.entry.at;
            self.last_at = s.entry.at;
        }
        self.first_at = self.first_at.min(s.entry.at);
        self.last_at = self.last_at.max(s.entry.at);
        self.entries += 1;
        self.bytes += bytes;
        *self.reasons.entry(reason).or_default() += 1;
        let kind = if self.kinds.len() < SUMMARY_KINDS || self.kinds.contains_key(&s.entry.kind) {
            s.entry.kind.clone()
        } else {
            "other".to_string()
        };
        *self.kinds.entry(kind).or_default() += 1;
    }

    /// Adds what `other` counted (a summary that could not be written, back in the tally).
    pub(crate) fn merge(&mut self, other: Pending) {
        if other.entries > 0 {
            if self.entries == 0 {
                (self.first_at, self.last_at) = (other.first_at, other.last_at);
            }
            self.first_at = self.first_at.min(other.first_at);
            self.last_at = self.last_at.max(other.last_at);
        }
        self.since = self.since.min(other.since);
        self.entries += other.entries;
        self.bytes += other.bytes;
        self.lost += other.lost;
        for (k, n) in other.kinds {
            *self.kinds.entry(k).or_default() += n;
        }
        for (r, n) in other.reasons {
            *self.reasons.entry(r).or_default() += n;
        }
    }

    /// The summary as an entry of `sandbox`'s trail, at `position` of the budget's source.
    pub(crate) fn entry(&self, sandbox_id: &str, team: &str, position: u64) -> StoredAudit {
        let join = |m: &mut dyn Iterator<Item = (String, u64)>| {
            m.map(|(k, n)| format!("{k}:{n}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut fields = BTreeMap::from([
            ("entries".to_string(), self.entries.to_string()),
            ("bytes".to_string(), self.bytes.to_string()),
        ]);
        if self.entries > 0 {
            fields.insert(
                "kinds".into(),
                join(&mut self.kinds.iter().map(|(k, n)| (k.clone(), *n))),
            );
            fields.insert(
                "reasons".into(),
                join(
                    &mut self
                        .reasons
                        .iter()
                        .map(|(r, n)| (r.as_str().to_string(), *n)),
                ),
            );
            fields.insert("first_at".into(), self.first_at.to_rfc3339());
            fields.insert("last_at".into(), self.last_at.to_rfc3339());
        }
        if self.lost > 0 {
            fields.insert("lost_before_read".into(), self.lost.to_string());
        }
        let mut message = format!(
            "{} audit entries ({} bytes) not kept: over the sandbox's audit budget or the \
             disk's floor ({})",
            self.entries,
            self.bytes,
            fields.get("reasons").map(String::as_str).unwrap_or("-"),
        );
        if self.lost > 0 {
            message.push_str(&format!(
                "; {} more lost in the sandbox's journal before they were read",
                self.lost
            ));
        }
        StoredAudit {
            source: SOURCE_BUDGET.into(),
            position,
            entry: AuditEntry {
                sandbox_id: sandbox_id.to_string(),
                team: team.to_string(),
                at: if self.entries > 0 {
                    self.last_at
                } else {
                    Utc::now()
                },
                kind: KIND_DROPPED.into(),
                level: Level::Warn,
                message,
                fields,
            },
        }
    }

    pub(crate) fn entries(&self) -> u64 {
        self.entries
    }
    pub(crate) fn lost(&self) -> u64 {
        self.lost
    }
}

/// One sandbox's budget.
#[derive(Debug)]
pub(crate) struct Budget {
    tokens: f64,
    refilled: Instant,
    /// Bytes of this sandbox's entries in the store (counted there, then added to).
    pub(crate) kept_bytes: u64,
    /// When `kept_bytes` was last counted in the store.
    pub(crate) counted: Instant,
    pending: Option<Pending>,
    last_position: u64,
}

impl Budget {
    pub(crate) fn new(cfg: &AuditBudget, kept_bytes: u64, now: Instant) -> Self {
        Budget {
            tokens: f64::from(cfg.burst),
            refilled: now,
            kept_bytes,
            counted: now,
            pending: None,
            last_position: 0,
        }
    }

    fn pending(&mut self, now: Instant) -> &mut Pending {
        self.pending.get_or_insert_with(|| Pending::new(now))
    }

    /// Keeps what the budget allows of `entries` (in order) and counts the rest; with
    /// `disk_full` nothing is kept.
    pub(crate) fn admit(
        &mut self,
        cfg: &AuditBudget,
        entries: Vec<StoredAudit>,
        disk_full: bool,
        now: Instant,
    ) -> Vec<StoredAudit> {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens =
            (self.tokens + elapsed * f64::from(cfg.entries_per_second)).min(f64::from(cfg.burst));
        self.refilled = now;
        let mut kept = Vec::with_capacity(entries.len());
        for s in entries {
            let bytes = stored_bytes(&s);
            let reason = if disk_full {
                Some(Reason::Disk)
            } else if self.kept_bytes + bytes > cfg.sandbox_bytes {
                Some(Reason::Size)
            } else if self.tokens < 1.0 {
                Some(Reason::Rate)
            } else {
                None
            };
            match reason {
                Some(r) => self.pending(now).count(&s, bytes, r),
                None => {
                    self.tokens -= 1.0;
                    self.kept_bytes += bytes;
                    kept.push(s);
                }
            }
        }
        kept
    }

    /// Counts entries a source's ring lost before they were read.
    pub(crate) fn count_lost(&mut self, n: u64, now: Instant) {
        if n > 0 {
            self.pending(now).lost += n;
        }
    }

    /// Whether the byte budget is used up (then the store's count is worth taking again:
    /// pruning frees room).
    pub(crate) fn full(&self, cfg: &AuditBudget) -> bool {
        self.kept_bytes + ROW_OVERHEAD >= cfg.sandbox_bytes
    }

    /// The tally to summarise, taken, once `summary_every` has passed since its first entry
    /// (or now, with `force`), with the position its summary takes.
    pub(crate) fn take_due(
        &mut self,
        cfg: &AuditBudget,
        force: bool,
        now: Instant,
    ) -> Option<(Pending, u64)> {
        let due = self
            .pending
            .as_ref()
            .is_some_and(|p| force || now.saturating_duration_since(p.since) >= cfg.summary_every);
        if !due {
            return None;
        }
        // Positions of the budget's source are microseconds, strictly increasing per sandbox.
        let at = u64::try_from(Utc::now().timestamp_micros()).unwrap_or(0);
        self.last_position = at.max(self.last_position + 1);
        self.pending.take().map(|p| (p, self.last_position))
    }

    /// Puts back a tally whose summary could not be written.
    pub(crate) fn restore(&mut self, p: Pending) {
        match &mut self.pending {
            Some(mine) => mine.merge(p),
            None => self.pending = Some(p),
        }
    }

    /// What is counted and not yet summarised.
    pub(crate) fn unsummarised(&self) -> Option<&Pending> {
        self.pending.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn exec(n: u64, message: &str) -> StoredAudit {
        StoredAudit {
            source: "host:b".into(),
            position: n,
            entry: AuditEntry {
                sandbox_id: "s".into(),
                team: "t".into(),
                at: DateTime::from_timestamp_millis(1_700_000_000_000 + n as i64).unwrap(),
                kind: "process.exec".into(),
                level: Level::Info,
                message: message.into(),
                fields: BTreeMap::from([("argv".into(), "[\"/bin/true\"]".into())]),
            },
        }
    }

    fn cfg() -> AuditBudget {
        AuditBudget {
            entries_per_second: 10,
            burst: 100,
            ..AuditBudget::default()
        }
    }

    #[test]
    fn the_rate_keeps_the_burst_then_the_rate_and_counts_the_rest() {
        let cfg = cfg();
        let t0 = Instant::now();
        let mut b = Budget::new(&cfg, 0, t0);
        let kept = b.admit(
            &cfg,
            (1..=500).map(|n| exec(n, "true")).collect(),
            false,
            t0,
        );
        assert_eq!(kept.len(), 100);
        assert_eq!(
            kept.last().unwrap().position,
            100,
            "the first ones are kept"
        );
        // Two seconds later: 20 more tokens.
        let t2 = t0 + Duration::from_secs(2);
        let kept = b.admit(
            &cfg,
            (501..=600).map(|n| exec(n, "true")).collect(),
            false,
            t2,
        );
        assert_eq!(kept.len(), 20);
        assert!(b.take_due(&cfg, false, t2).is_none(), "not due yet");
        let (p, position) = b.take_due(&cfg, true, t2).unwrap();
        assert_eq!(p.entries(), 480);
        let e = p.entry("s", "t", position);
        assert_eq!(e.entry.kind, KIND_DROPPED);
        assert_eq!(e.entry.fields["entries"], "480");
        assert_eq!(e.entry.fields["kinds"], "process.exec:480");
        assert_eq!(e.entry.fields["reasons"], "rate:480");
        assert!(
            e.entry.message.starts_with("480 audit entries"),
            "{}",
            e.entry.message
        );
        assert!(b.unsummarised().is_none());
    }

    #[test]
    fn the_byte_budget_and_the_disk_floor_leave_out_and_count() {
        let cfg = AuditBudget {
            sandbox_bytes: 10 * stored_bytes(&exec(1, "true")),
            ..cfg()
        };
        let t0 = Instant::now();
        let mut b = Budget::new(&cfg, 0, t0);
        assert_eq!(
            b.admit(&cfg, (1..=30).map(|n| exec(n, "true")).collect(), false, t0)
                .len(),
            10
        );
        assert!(b.full(&cfg));
        let mut b = Budget::new(&cfg, 0, t0);
        assert!(b.admit(&cfg, vec![exec(1, "true")], true, t0).is_empty());
        b.count_lost(7, t0);
        let (p, _) = b.take_due(&cfg, true, t0).unwrap();
        let e = p.entry("s", "t", 1).entry;
        assert_eq!(e.fields["reasons"], "disk:1");
        assert_eq!(e.fields["lost_before_read"], "7");
        // A summary that could not be written goes back into the tally.
        b.restore(p);
        assert_eq!(b.unsummarised().unwrap().entries(), 1);
    }

    #[test]
    fn summaries_wait_for_their_interval_and_take_increasing_positions() {
        let cfg = cfg();
        let t0 = Instant::now();
        let mut b = Budget::new(&cfg, 0, t0);
        b.count_lost(1, t0);
        assert!(b
            .take_due(&cfg, false, t0 + Duration::from_secs(59))
            .is_none());
        let (_, p1) = b
            .take_due(&cfg, false, t0 + Duration::from_secs(60))
            .unwrap();
        b.count_lost(1, t0);
        let (_, p2) = b.take_due(&cfg, true, t0).unwrap();
        assert!(p2 > p1);
    }

    #[test]
    fn big_entries_are_clipped_and_say_by_how_much() {
        let mut s = exec(1, &"é".repeat(40_000));
        for i in 0..100 {
            s.entry.fields.insert(format!("f{i}"), "x".repeat(10_000));
        }
        s.entry.kind = "k".repeat(1000);
        clip_entry(&mut s.entry, 16 * 1024);
        assert!(
            stored_bytes(&s) < 17 * 1024 + ROW_OVERHEAD,
            "{}",
            stored_bytes(&s)
        );
        assert_eq!(s.entry.kind.len(), MAX_KIND);
        assert!(s.entry.fields["clipped_bytes"].parse::<usize>().unwrap() > 1_000_000);
        let mut small = exec(2, "true");
        clip_entry(&mut small.entry, 16 * 1024);
        assert_eq!(small, exec(2, "true"));
    }

    #[test]
    fn a_summary_names_a_bounded_number_of_kinds() {
        let cfg = AuditBudget { burst: 0, ..cfg() };
        let t0 = Instant::now();
        let mut b = Budget::new(&cfg, 0, t0);
        let many = (0..100)
            .map(|n| {
                let mut s = exec(n, "x");
                s.entry.kind = format!("kind.{n}");
                s
            })
            .collect();
        assert!(b.admit(&cfg, many, false, t0).is_empty());
        let (p, _) = b.take_due(&cfg, true, t0).unwrap();
        let kinds = p.entry("s", "t", 1).entry.fields["kinds"].clone();
        assert_eq!(kinds.split(',').count(), SUMMARY_KINDS + 1, "{kinds}");
        assert!(kinds.contains("other:84"), "{kinds}");
    }
}

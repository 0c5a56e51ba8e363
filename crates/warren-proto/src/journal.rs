//! The agent's journal: what happened inside a sandbox, in order, for the control plane.
//!
//! The agent keeps a bounded ring of [`JournalEntry`]s (processes started and ended through
//! the API and inside the sandbox, their output lines, files changed through the API, its own
//! messages) and serves it at `GET /journal?after=SEQ&limit=N` (token required). The control
//! plane reads it every few seconds and keeps what it reads (the audit trail and the sandbox
//! logs). `boot` changes when the agent starts again, so a reader knows its cursor is void.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A process started through the API (`process.Start`).
pub const PROCESS_START: &str = "process.start";
/// A process started through the API ended.
pub const PROCESS_END: &str = "process.end";
/// A program executed inside the sandbox (by anything: a shell in a terminal, a script).
pub const PROCESS_EXEC: &str = "process.exec";
/// A process seen by [`PROCESS_EXEC`] ended.
pub const PROCESS_EXIT: &str = "process.exit";
/// A line a process started through the API wrote (`fields.stream`: stdout or stderr).
pub const PROCESS_OUTPUT: &str = "process.output";
/// A file written through the API (upload or filesystem call).
pub const FILE_WRITE: &str = "file.write";
/// A file or directory removed through the API.
pub const FILE_REMOVE: &str = "file.remove";
/// A file or directory moved through the API.
pub const FILE_RENAME: &str = "file.rename";
/// A directory made through the API.
pub const FILE_MKDIR: &str = "file.mkdir";
/// The agent's own messages (initialised, mounts, warnings).
pub const AGENT: &str = "agent";

/// Every kind an entry may have.
pub const KINDS: [&str; 10] = [
    PROCESS_START,
    PROCESS_END,
    PROCESS_EXEC,
    PROCESS_EXIT,
    PROCESS_OUTPUT,
    FILE_WRITE,
    FILE_REMOVE,
    FILE_RENAME,
    FILE_MKDIR,
    AGENT,
];

/// Severity, as E2B's sandbox logs name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }

    pub fn parse(s: &str) -> Option<Level> {
        match s.to_ascii_lowercase().as_str() {
            "debug" => Some(Level::Debug),
            "info" => Some(Level::Info),
            "warn" | "warning" => Some(Level::Warn),
            "error" => Some(Level::Error),
            _ => None,
        }
    }
}

/// One thing that happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// Position in this boot's journal, from 1, without gaps (a reader that finds one lost
    /// entries to the ring's bound).
    pub seq: u64,
    /// Unix time in milliseconds.
    pub at_ms: i64,
    /// One of [`KINDS`].
    pub kind: String,
    pub level: Level,
    /// A line a person reads.
    pub message: String,
    /// The details, by name (`pid`, `argv`, `cwd`, `user`, `exit_code`, `path`, ...).
    #[serde(default)]
    pub fields: BTreeMap<String, String>,
}

/// The answer of `GET /journal`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalPage {
    /// Names this run of the agent.
    pub boot: String,
    /// The cursor for the next read (the last entry's `seq`, or the one given).
    pub next: u64,
    /// Entries older than the oldest kept that the reader has not seen (lost to the bound).
    pub dropped: u64,
    pub entries: Vec<JournalEntry>,
}

/// Values shorter than this are not masked: a short value (`1`, `true`, a port) would blank
/// out ordinary text everywhere, and is no secret worth the noise.
pub const MIN_MASKED_LEN: usize = 6;

/// Masks secret values (environment variables' values, tokens) in journal text before it is
/// kept: a command that prints `$DB_PASSWORD` must not put the password into the audit trail
/// or the logs, which are stored in the clear and exported.
///
/// A best effort, not a guarantee: besides the value itself (in any ASCII case) it catches
/// the few encodings a command commonly prints a value in (hex in either case, base64 and
/// base64url at any alignment within a longer encoding, the value escaped in a JSON string).
/// It does not catch values shorter than [`MIN_MASKED_LEN`], a value split across entries
/// or lines (base64 wrapped at 76 columns included), nor any other transformation
/// (`rev`, URL encoding, compression, a substring, non-ASCII case changes).
#[derive(Debug, Clone, Default)]
pub struct Masker {
    /// The forms to find, the longest value's first: where matches overlap, the earliest
    /// form's name is the one shown, so a value that contains another is masked as itself.
    forms: Vec<Form>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Form {
    /// What is looked for; ASCII lower case when `any_case`.
    needle: String,
    /// Matched against the text folded to ASCII lower case (the value itself, hex); base64
    /// is matched exactly, its case carries the bits.
    any_case: bool,
    /// What replaces it.
    with: String,
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// The base64 characters that depend on `value`'s bits alone when it starts `skip` (0, 1 or 2)
/// bytes into a 3-byte group of a longer encoded input: every alignment it may appear at in
/// `base64 < file` or `echo $V | base64` (whose newline changes only the last character).
fn base64_core(value: &[u8], skip: usize) -> String {
    let bits = 8 * (skip + value.len());
    let first = (8 * skip).div_ceil(6);
    let last = bits / 6;
    let byte = |i: usize| {
        i.checked_sub(skip)
            .and_then(|i| value.get(i))
            .copied()
            .unwrap_or(0)
    };
    (first..last)
        .map(|c| {
            // Character `c` is the bits 6c..6c+6 of the input, read big-endian.
            let bit = 6 * c;
            let pair = (u16::from(byte(bit / 8)) << 8) | u16::from(byte(bit / 8 + 1));
            let index = (pair >> (10 - bit % 8)) & 0x3f;
            char::from(BASE64[usize::from(index)])
        })
        .collect()
}

/// The forms of one value a command is likely to print it in.
fn forms_of(value: &str) -> Vec<(String, bool)> {
    let mut forms = vec![(value.to_ascii_lowercase(), true)];
    let hex: String = value.bytes().map(|b| format!("{b:02x}")).collect();
    forms.push((hex, true));
    // In a JSON document (an argv field, a program's JSON output) quotes, backslashes and
    // control characters are escaped.
    if let Ok(json) = serde_json::to_string(value) {
        let inner = &json[1..json.len() - 1];
        if inner != value {
            forms.push((inner.to_ascii_lowercase(), true));
        }
    }
    for skip in 0..3 {
        let core = base64_core(value.as_bytes(), skip);
        let url: String = core
            .chars()
            .map(|c| match c {
                '+' => '-',
                '/' => '_',
                c => c,
            })
            .collect();
        if url != core {
            forms.push((url, false));
        }
        forms.push((core, false));
    }
    forms
}

impl Masker {
    /// Masks each value (of at least [`MIN_MASKED_LEN`] bytes) and its encodings as
    /// `[masked:NAME]`. At most 9 forms per value, each a linear search of the text.
    pub fn new<'a>(named: impl IntoIterator<Item = (&'a str, &'a str)>) -> Masker {
        let mut values: Vec<(&str, &str)> = named
            .into_iter()
            .filter(|(_, v)| v.len() >= MIN_MASKED_LEN)
            .map(|(name, v)| (v, name))
            .collect();
        values.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(b.0)));
        values.dedup_by(|a, b| a.0 == b.0);
        let mut forms: Vec<Form> = Vec::new();
        for (value, name) in values {
            let with = format!("[masked:{name}]");
            for (needle, any_case) in forms_of(value) {
                let form = Form {
                    needle,
                    any_case,
                    with: with.clone(),
                };
                // Two values equal but for case, or a value that is another's encoding.
                if !forms
                    .iter()
                    .any(|f| f.needle == form.needle && f.any_case == form.any_case)
                {
                    forms.push(form);
                }
            }
        }
        Masker { forms }
    }

    pub fn is_empty(&self) -> bool {
        self.forms.is_empty()
    }

    /// `text` with every value masked. Every byte of every occurrence of a form (overlapping
    /// ones included) is replaced; overlapping occurrences become one mask.
    pub fn mask(&self, text: &str) -> String {
        if self.forms.is_empty() {
            return text.to_string();
        }
        // ASCII folding keeps every byte where it is, so offsets in it are offsets in `text`.
        let folded = text.to_ascii_lowercase();
        let mut hits: Vec<(usize, usize, usize)> = Vec::new();
        for (i, form) in self.forms.iter().enumerate() {
            let hay = if form.any_case { &folded } else { text };
            let mut from = 0;
            while let Some(at) = hay[from..].find(form.needle.as_str()) {
                let at = from + at;
                hits.push((at, at + form.needle.len(), i));
                // On by one character, not past the match: `aaaaaaa` holds `aaaaaa` twice.
                from = at + hay[at..].chars().next().map_or(1, char::len_utf8);
            }
        }
        if hits.is_empty() {
            return text.to_string();
        }
        hits.sort_unstable();
        let mut out = String::with_capacity(text.len());
        let mut done = 0;
        let mut hits = hits.into_iter().peekable();
        while let Some((start, mut end, mut form)) = hits.next() {
            while let Some(&(s, e, f)) = hits.peek() {
                if s >= end {
                    break;
                }
                end = end.max(e);
                form = form.min(f);
                hits.next();
            }
            out.push_str(&text[done..start]);
            out.push_str(&self.forms[form].with);
            done = end;
        }
        out.push_str(&text[done..]);
        out
    }

    /// Masks an entry's message and every field's value.
    pub fn mask_entry(&self, e: &mut JournalEntry) {
        if self.is_empty() {
            return;
        }
        e.message = self.mask(&e.message);
        for v in e.fields.values_mut() {
            *v = self.mask(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_long_values_whole_and_leaves_short_ones() {
        let m = Masker::new([
            ("DB_PASSWORD", "hunter2-horse"),
            ("PREFIX", "hunter2"),
            ("PORT", "8080"),
        ]);
        assert_eq!(
            m.mask("pw=hunter2-horse p=hunter2 port 8080"),
            "pw=[masked:DB_PASSWORD] p=[masked:PREFIX] port 8080"
        );
        let mut e = JournalEntry {
            seq: 1,
            at_ms: 0,
            kind: PROCESS_START.into(),
            level: Level::Info,
            message: "echo hunter2-horse".into(),
            fields: BTreeMap::from([("argv".into(), "[\"echo\",\"hunter2-horse\"]".into())]),
        };
        m.mask_entry(&mut e);
        assert!(!e.message.contains("hunter2") && !e.fields["argv"].contains("hunter2"));
        assert!(Masker::new([("A", "1")]).is_empty());
    }

    #[test]
    fn masks_values_in_any_ascii_case_and_in_hex() {
        let m = Masker::new([("DB_PASSWORD", "hunter2-horse")]);
        assert_eq!(
            m.mask("HUNTER2-HORSE Hunter2-Horse"),
            "[masked:DB_PASSWORD] [masked:DB_PASSWORD]"
        );
        // `xxd -p`, `od`-free hex dumps, `printf %X`.
        assert_eq!(
            m.mask("68756e746572322d686f727365 68756E746572322D686F727365"),
            "[masked:DB_PASSWORD] [masked:DB_PASSWORD]"
        );
    }

    #[test]
    fn masks_base64_at_every_alignment() {
        let m = Masker::new([("DB_PASSWORD", "hunter2-horse")]);
        // Only the characters that mix in bits of other bytes stay.
        for (encoded, masked) in [
            // `echo $DB_PASSWORD | base64`: the newline changes only the last group.
            ("aHVudGVyMi1ob3JzZQo=", "[masked:DB_PASSWORD]Qo="),
            // `PW=hunter2-horse`, `xhunter2-horse`, `xyhunter2-horse!`: the value at the start
            // of a group, one and two bytes into one.
            ("UFc9aHVudGVyMi1ob3JzZQ==", "UFc9[masked:DB_PASSWORD]Q=="),
            ("eGh1bnRlcjItaG9yc2U=", "eG[masked:DB_PASSWORD]U="),
            ("eHlodW50ZXIyLWhvcnNlIQ==", "eHl[masked:DB_PASSWORD]IQ=="),
        ] {
            assert_eq!(m.mask(encoded), masked);
        }
        // base64url of a value whose standard encoding has `+` and `/`.
        let m = Masker::new([("TOKEN", "s3cr3t?>~~~")]);
        assert!(m.mask("czNjcjN0Pz5+fn4=").starts_with("[masked:TOKEN]"));
        assert!(m
            .mask("dG9rOiBzM2NyM3Q_Pn5-fg==")
            .contains("[masked:TOKEN]"));
    }

    #[test]
    fn masks_a_value_escaped_in_json() {
        let m = Masker::new([("PW", "pa\"ss\\word")]);
        assert_eq!(
            m.mask(r#"["echo","pa\"ss\\word"]"#),
            r#"["echo","[masked:PW]"]"#
        );
    }

    #[test]
    fn overlapping_occurrences_are_masked_whole() {
        let m = Masker::new([("A", "aaaaaa")]);
        assert_eq!(m.mask("xaaaaaaay"), "x[masked:A]y");
        // Two values overlapping: every byte of both goes, under the longer's name.
        let m = Masker::new([("LONG", "secret-one"), ("OTHER", "one-more")]);
        assert_eq!(m.mask("secret-one-more!"), "[masked:LONG]!");
        // Offsets stay on character boundaries around non-ASCII text.
        assert_eq!(
            Masker::new([("K", "clé-secrète")]).mask("é CLé-SECRèTE ü"),
            "é [masked:K] ü"
        );
    }

    #[test]
    fn what_masking_does_not_catch() {
        // Documented limits (docs/security.md): short values, a value split across lines or
        // entries, other transformations. These stay in the clear.
        let m = Masker::new([("PIN", "1234"), ("DB_PASSWORD", "hunter2-horse")]);
        assert_eq!(m.mask("pin 1234"), "pin 1234");
        assert_eq!(m.mask("hunter2-\nhorse"), "hunter2-\nhorse");
        assert_eq!(m.mask("esroh-2retnuh"), "esroh-2retnuh");
        assert_eq!(m.mask("hunter2%2Dhorse"), "hunter2%2Dhorse");
    }
}

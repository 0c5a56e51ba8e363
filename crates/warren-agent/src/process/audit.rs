//! What the journal says about a process started through the API: its start (who, argv, cwd,
//! trace context), its output lines (bounded), and its end (status, duration).
//!
//! A caller's W3C `traceparent` makes the process an **exec span** of the caller's trace: the
//! agent picks the span's id, gives the process `TRACEPARENT` naming it (so what the process
//! traces is a child of the exec), and journals the ids; the control plane exports the span.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::http::HeaderMap;
use warren_proto::journal::{Level, Masker, PROCESS_END, PROCESS_OUTPUT, PROCESS_START};
use warren_proto::process::process_event::EndEvent;

use crate::journal::{fields, Journal};

/// Most bytes of one process's output that reach the journal (the rest is counted).
pub const MAX_OUTPUT_LOGGED: usize = 64 * 1024;
/// A line longer than this is journaled in pieces.
const MAX_LINE: usize = 1024;

/// A caller's trace context and the exec span made under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    pub trace_id: String,
    pub parent_span_id: String,
    pub span_id: String,
    pub flags: String,
}

impl Trace {
    /// The exec span under the caller's `traceparent` header (W3C version 00), if it has a
    /// valid one.
    pub fn from_headers(headers: &HeaderMap) -> Option<Trace> {
        let value = headers.get("traceparent")?.to_str().ok()?.trim();
        let parts: Vec<&str> = value.split('-').collect();
        let [version, trace, parent, flags] = parts.as_slice() else {
            return None;
        };
        let hex = |s: &str, n: usize| {
            s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        };
        let zero = |s: &str| s.bytes().all(|b| b == b'0');
        if !hex(version, 2) || *version == "ff" || !hex(trace, 32) || !hex(parent, 16) {
            return None;
        }
        if !hex(flags, 2) || zero(trace) || zero(parent) {
            return None;
        }
        Some(Trace {
            trace_id: trace.to_string(),
            parent_span_id: parent.to_string(),
            span_id: new_span_id(),
            flags: flags.to_string(),
        })
    }

    /// `TRACEPARENT` for the process: the caller's trace, the exec span as parent.
    pub fn traceparent(&self) -> String {
        format!("00-{}-{}-{}", self.trace_id, self.span_id, self.flags)
    }
}

fn new_span_id() -> String {
    loop {
        let bytes = uuid::Uuid::new_v4().into_bytes();
        let id: String = bytes[..8].iter().map(|b| format!("{b:02x}")).collect();
        if id != "0000000000000000" {
            return id;
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

#[derive(Default)]
struct OutLog {
    partial: [Vec<u8>; 2],
    logged: usize,
    unlogged: usize,
}

/// The journal's view of one process.
pub struct ProcAudit {
    journal: Arc<Journal>,
    pid: u32,
    argv: String,
    trace: Option<Trace>,
    started: Instant,
    started_ms: i64,
    out: Mutex<OutLog>,
    masker: Masker,
}

/// What a start is journaled with.
pub struct StartInfo<'a> {
    pub pid: u32,
    pub cmd: &'a str,
    pub args: &'a [String],
    pub cwd: &'a str,
    pub user: &'a str,
    pub tag: Option<&'a str>,
    pub pty: bool,
    pub trace: Option<Trace>,
    /// The values its output and argv must not carry into the journal (its environment's).
    pub masker: Masker,
}

impl ProcAudit {
    /// Journals the start; `None` when the journal is off.
    pub fn started(journal: &Arc<Journal>, info: StartInfo<'_>) -> Option<Arc<ProcAudit>> {
        if !journal.enabled() {
            return None;
        }
        let argv_list: Vec<&str> = std::iter::once(info.cmd)
            .chain(info.args.iter().map(String::as_str))
            .collect();
        let argv = info
            .masker
            .mask(&serde_json::to_string(&argv_list).unwrap_or_default());
        let mut f = fields([
            ("pid", info.pid.to_string()),
            ("argv", argv.clone()),
            ("cwd", info.cwd.to_string()),
            ("user", info.user.to_string()),
            ("via", "api".to_string()),
        ]);
        if let Some(tag) = info.tag {
            f.insert("tag".into(), tag.into());
        }
        if info.pty {
            f.insert("pty".into(), "true".into());
        }
        add_trace(&mut f, info.trace.as_ref());
        journal.record(
            PROCESS_START,
            Level::Info,
            info.masker.mask(&format!(
                "process {} started: {}",
                info.pid,
                argv_list.join(" ")
            )),
            f,
        );
        Some(Arc::new(ProcAudit {
            journal: journal.clone(),
            pid: info.pid,
            argv,
            trace: info.trace,
            started: Instant::now(),
            started_ms: chrono::Utc::now().timestamp_millis(),
            out: Mutex::new(OutLog::default()),
            masker: info.masker,
        }))
    }

    /// Journals the complete lines in `data` (what is left waits for the rest of its line).
    pub fn output(&self, stream: Stream, data: &[u8]) {
        let mut lines = Vec::new();
        {
            let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
            let room = MAX_OUTPUT_LOGGED.saturating_sub(out.logged);
            if room == 0 {
                out.unlogged += data.len();
                return;
            }
            let take = data.len().min(room);
            out.unlogged += data.len() - take;
            out.logged += take;
            let buf = &mut out.partial[stream as usize];
            for &b in &data[..take] {
                if b == b'\n' || buf.len() >= MAX_LINE {
                    lines.push(std::mem::take(buf));
                    if b == b'\n' {
                        continue;
                    }
                }
                buf.push(b);
            }
        }
        for line in lines {
            self.line(stream, &line);
        }
    }

    fn line(&self, stream: Stream, line: &[u8]) {
        let text = String::from_utf8_lossy(line);
        let text = text.strip_suffix('\r').unwrap_or(&text);
        let (name, level) = match stream {
            Stream::Stdout => ("stdout", Level::Info),
            Stream::Stderr => ("stderr", Level::Warn),
        };
        self.journal.record(
            PROCESS_OUTPUT,
            level,
            self.masker.mask(text),
            fields([("pid", self.pid.to_string()), ("stream", name.to_string())]),
        );
    }

    /// Journals the end (and what was left of the last lines).
    pub fn ended(&self, end: &EndEvent) {
        let (partial, unlogged) = {
            let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
            (std::mem::take(&mut out.partial), out.unlogged)
        };
        for (i, rest) in partial.iter().enumerate() {
            if !rest.is_empty() {
                let stream = if i == 0 {
                    Stream::Stdout
                } else {
                    Stream::Stderr
                };
                self.line(stream, rest);
            }
        }
        let duration_ms = self.started.elapsed().as_millis();
        let mut f = fields([
            ("pid", self.pid.to_string()),
            ("argv", self.argv.clone()),
            ("exit_code", end.exit_code.to_string()),
            ("status", end.status.clone()),
            ("duration_ms", duration_ms.to_string()),
            ("started_at_ms", self.started_ms.to_string()),
        ]);
        if unlogged > 0 {
            f.insert("output_not_journaled_bytes".into(), unlogged.to_string());
        }
        add_trace(&mut f, self.trace.as_ref());
        let level = if end.exited && end.exit_code == 0 {
            Level::Info
        } else {
            Level::Warn
        };
        self.journal.record(
            PROCESS_END,
            level,
            format!(
                "process {} ended: {} after {duration_ms} ms",
                self.pid, end.status
            ),
            f,
        );
    }
}

fn add_trace(f: &mut BTreeMap<String, String>, trace: Option<&Trace>) {
    if let Some(t) = trace {
        f.insert("trace_id".into(), t.trace_id.clone());
        f.insert("span_id".into(), t.span_id.clone());
        f.insert("parent_span_id".into(), t.parent_span_id.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(tp: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("traceparent", HeaderValue::from_str(tp).unwrap());
        h
    }

    #[test]
    fn a_valid_traceparent_makes_a_child_span() {
        let t = Trace::from_headers(&headers(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ))
        .unwrap();
        assert_eq!(t.trace_id, "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(t.parent_span_id, "b7ad6b7169203331");
        assert_eq!(t.span_id.len(), 16);
        assert_ne!(t.span_id, t.parent_span_id);
        assert_eq!(
            t.traceparent(),
            format!("00-0af7651916cd43dd8448eb211c80319c-{}-01", t.span_id)
        );
    }

    #[test]
    fn bad_traceparents_are_ignored() {
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01; rm",
        ] {
            assert!(Trace::from_headers(&headers(bad)).is_none(), "{bad}");
        }
    }

    fn audit(j: &Arc<Journal>) -> Arc<ProcAudit> {
        ProcAudit::started(
            j,
            StartInfo {
                pid: 7,
                cmd: "/bin/bash",
                args: &["-l".into(), "-c".into(), "echo hi".into()],
                cwd: "/home/user",
                user: "user",
                tag: None,
                pty: false,
                trace: None,
                masker: Masker::default(),
            },
        )
        .unwrap()
    }

    #[test]
    fn a_commands_env_values_are_masked_in_argv_and_output() {
        let j = Arc::new(Journal::default());
        let a = ProcAudit::started(
            &j,
            StartInfo {
                pid: 8,
                cmd: "/bin/echo",
                args: &["tok-12345678".into()],
                cwd: "/",
                user: "user",
                tag: None,
                pty: false,
                trace: None,
                masker: Masker::new([("API_TOKEN", "tok-12345678")]),
            },
        )
        .unwrap();
        a.output(Stream::Stdout, b"tok-12345678\n");
        let page = j.page(0, 100);
        let text = serde_json::to_string(&page.entries).unwrap();
        assert!(!text.contains("tok-12345678"), "{text}");
        assert!(text.contains("[masked:API_TOKEN]"), "{text}");
    }

    #[test]
    fn output_is_journaled_by_line_and_bounded() {
        let j = Arc::new(Journal::default());
        let a = audit(&j);
        a.output(Stream::Stdout, b"one\ntw");
        a.output(Stream::Stderr, b"err\n");
        a.output(Stream::Stdout, b"o\n");
        a.output(Stream::Stdout, &vec![b'x'; MAX_OUTPUT_LOGGED]);
        a.ended(&EndEvent {
            exit_code: 0,
            exited: true,
            status: "exit status 0".into(),
            error: None,
        });
        let page = j.page(0, 1000);
        let lines: Vec<(&str, &str)> = page
            .entries
            .iter()
            .filter(|e| e.kind == PROCESS_OUTPUT)
            .map(|e| (e.fields["stream"].as_str(), e.message.as_str()))
            .take(3)
            .collect();
        assert_eq!(
            lines,
            vec![("stdout", "one"), ("stderr", "err"), ("stdout", "two")]
        );
        let end = page.entries.last().unwrap();
        assert_eq!(end.kind, PROCESS_END);
        assert_eq!(end.fields["exit_code"], "0");
        assert!(
            end.fields["output_not_journaled_bytes"]
                .parse::<usize>()
                .unwrap()
                > 0
        );
        let logged: usize = page
            .entries
            .iter()
            .filter(|e| e.kind == PROCESS_OUTPUT)
            .map(|e| e.message.len())
            .sum();
        assert!(logged <= MAX_OUTPUT_LOGGED);
    }
}

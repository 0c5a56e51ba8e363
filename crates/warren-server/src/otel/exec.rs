//! What sandboxes did, from the control plane's audit trail: a command started with a
//! `traceparent` becomes a `sandbox.exec` span with the ids the agent chose (the span id in
//! the process's `TRACEPARENT`, the caller's span as parent), and every entry becomes an
//! OTLP log record.
//!
//! The agent picks the exec span's id, because the process must have it in its environment
//! before the span ends. The SDK's tracer always draws a span's id from its id generator, so
//! the generator here hands out a chosen id once, on the thread that asked for it, and random
//! ids otherwise.

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::logs::{AnyValue, LogRecord, Logger, LoggerProvider, Severity};
use opentelemetry::trace::{
    Span as _, SpanBuilder, SpanContext, SpanId, SpanKind, TraceContextExt, TraceFlags, TraceId,
    TraceState,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::logs::{SdkLogger, SdkLoggerProvider};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SdkTracer};
use warren_control::{AuditEntry, AuditLevel, AuditObserver, Sandbox};

/// The audit kind of a process started through the API ending.
const PROCESS_END: &str = "process.end";
/// Most attributes a log record takes from an entry's fields, and the longest value kept
/// (entries hold what processes print: their size is theirs to choose).
const MAX_FIELDS: usize = 32;
const MAX_VALUE: usize = 1024;
const MAX_BODY: usize = 8 * 1024;

thread_local! {
    static CHOSEN: Cell<Option<SpanId>> = const { Cell::new(None) };
}

/// Random ids, except for a span started under [`with_span_id`].
#[derive(Debug, Default)]
pub(crate) struct ExecIds(RandomIdGenerator);

impl IdGenerator for ExecIds {
    fn new_trace_id(&self) -> TraceId {
        self.0.new_trace_id()
    }

    fn new_span_id(&self) -> SpanId {
        CHOSEN
            .with(Cell::take)
            .unwrap_or_else(|| self.0.new_span_id())
    }
}

/// Runs `f` (which starts one span) with `id` as the next span id drawn on this thread.
fn with_span_id<T>(id: SpanId, f: impl FnOnce() -> T) -> T {
    CHOSEN.with(|c| c.set(Some(id)));
    let out = f();
    // Unused (a tracer that was shut down draws none): never leak into another span.
    CHOSEN.with(|c| c.set(None));
    out
}

/// A finished command, as a span to export.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ExecSpan {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub parent: SpanId,
    pub start: SystemTime,
    pub end: SystemTime,
    pub attributes: Vec<KeyValue>,
}

fn hex_id<const N: usize>(s: Option<&String>) -> Option<[u8; N]> {
    let s = s?;
    if s.len() != N * 2 {
        return None;
    }
    let mut out = [0u8; N];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    out.iter().any(|b| *b != 0).then_some(out)
}

fn number(e: &AuditEntry, key: &str) -> Option<i64> {
    e.fields.get(key)?.trim().parse().ok()
}

/// The span of a traced command's end; `None` for every other entry (and for ids that are
/// not valid W3C ids: the journal is written inside the sandbox).
pub(crate) fn exec_span(sandbox: &Sandbox, e: &AuditEntry) -> Option<ExecSpan> {
    if e.kind != PROCESS_END {
        return None;
    }
    let trace_id = TraceId::from_bytes(hex_id::<16>(e.fields.get("trace_id"))?);
    let span_id = SpanId::from_bytes(hex_id::<8>(e.fields.get("span_id"))?);
    let parent = SpanId::from_bytes(hex_id::<8>(e.fields.get("parent_span_id"))?);
    let took = Duration::from_millis(
        number(e, "duration_ms")
            .and_then(|d| u64::try_from(d).ok())
            .unwrap_or(0),
    );
    let ended: SystemTime = e.at.into();
    let start = match number(e, "started_at_ms").and_then(|ms| u64::try_from(ms).ok()) {
        Some(ms) => UNIX_EPOCH + Duration::from_millis(ms),
        None => ended.checked_sub(took).unwrap_or(ended),
    };
    let end = start + took;
    let mut attributes = vec![
        KeyValue::new("warren.sandbox.id", sandbox.id.to_string()),
        KeyValue::new("warren.sandbox.template", sandbox.template.clone()),
    ];
    if let Some(argv) = e.fields.get("argv") {
        // The agent writes argv as a JSON array; anything else is kept as the command line.
        match serde_json::from_str::<Vec<String>>(argv) {
            Ok(args) => attributes.push(KeyValue::new(
                "process.command_args",
                opentelemetry::Value::Array(
                    args.into_iter()
                        .map(|a| clip(&a, MAX_VALUE).into())
                        .collect::<Vec<opentelemetry::StringValue>>()
                        .into(),
                ),
            )),
            Err(_) => attributes.push(KeyValue::new("process.command_line", clip(argv, MAX_VALUE))),
        }
    }
    if let Some(pid) = number(e, "pid") {
        attributes.push(KeyValue::new("process.pid", pid));
    }
    if let Some(code) = number(e, "exit_code") {
        attributes.push(KeyValue::new("process.exit.code", code));
    }
    Some(ExecSpan {
        trace_id,
        span_id,
        parent,
        start,
        end,
        attributes,
    })
}

fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Starts and ends `s` on `tracer`, with the ids it carries.
pub(crate) fn export_exec(tracer: &SdkTracer, s: ExecSpan) {
    let caller = SpanContext::new(
        s.trace_id,
        s.parent,
        // The agent marks the command's context sampled whatever the caller's flags said.
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    let parent = Context::new().with_remote_span_context(caller);
    let span = with_span_id(s.span_id, || {
        SpanBuilder::from_name("sandbox.exec")
            .with_kind(SpanKind::Internal)
            .with_start_time(s.start)
            .with_attributes(s.attributes)
            .start_with_context(tracer, &parent)
    });
    let mut span = span;
    if span.span_context().span_id() != s.span_id {
        tracing::debug!("an exec span did not get its id; not exported");
        return;
    }
    span.end_with_timestamp(s.end);
}

fn severity(level: AuditLevel) -> (Severity, &'static str) {
    match level {
        AuditLevel::Debug => (Severity::Debug, "DEBUG"),
        AuditLevel::Info => (Severity::Info, "INFO"),
        AuditLevel::Warn => (Severity::Warn, "WARN"),
        AuditLevel::Error => (Severity::Error, "ERROR"),
    }
}

/// Hands audit entries to the exporters. The SDK's batch processors queue them (bounded:
/// 2048 spans and 2048 records; more are dropped, and counted by the SDK) and send them from
/// threads of their own, so [`AuditObserver::observe`] never waits for a collector.
pub(crate) struct AuditExport {
    tracer: SdkTracer,
    logger: SdkLogger,
}

impl AuditExport {
    pub(crate) fn new(tracer: SdkTracer, logs: &SdkLoggerProvider) -> Arc<Self> {
        Arc::new(AuditExport {
            tracer,
            logger: logs.logger("warren.audit"),
        })
    }

    fn log(&self, sandbox: &Sandbox, e: &AuditEntry) {
        let mut rec = self.logger.create_log_record();
        rec.set_timestamp(e.at.into());
        rec.set_observed_timestamp(SystemTime::now());
        let (number, text) = severity(e.level);
        rec.set_severity_number(number);
        rec.set_severity_text(text);
        rec.set_body(AnyValue::from(clip(&e.message, MAX_BODY)));
        rec.add_attribute("event.name", e.kind.clone());
        rec.add_attribute("warren.sandbox.id", sandbox.id.to_string());
        for (k, v) in e.fields.iter().take(MAX_FIELDS) {
            rec.add_attribute(format!("warren.audit.{k}"), clip(v, MAX_VALUE));
        }
        let trace = hex_id::<16>(e.fields.get("trace_id")).map(TraceId::from_bytes);
        let span = hex_id::<8>(e.fields.get("span_id")).map(SpanId::from_bytes);
        if let (Some(t), Some(s)) = (trace, span) {
            rec.set_trace_context(t, s, Some(TraceFlags::SAMPLED));
        }
        self.logger.emit(rec);
    }
}

impl AuditObserver for AuditExport {
    fn observe(&self, sandbox: &Sandbox, entries: &[AuditEntry]) {
        for e in entries {
            if let Some(s) = exec_span(sandbox, e) {
                export_exec(&self.tracer, s);
            }
            self.log(sandbox, e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{Tracer as _, TracerProvider as _};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};

    fn sandbox() -> Sandbox {
        let now = chrono::Utc::now();
        Sandbox {
            id: "isbx".parse().expect("a valid sandbox id"),
            template: "base".into(),
            state: warren_control::SandboxState::Running,
            failure: None,
            resources: warren_types::Resources {
                cpu_count: 1,
                memory_mb: 256,
                disk_mb: 512,
            },
            allow_internet_access: true,
            metadata: Default::default(),
            started_at: now,
            end_at: now,
            envd_access_token: String::new(),
            traffic_access_token: String::new(),
            runtime: None,
            env_vars: Default::default(),
            lifecycle: Default::default(),
            pause_mode: None,
            network: Default::default(),
            team: String::new(),
            volume_mounts: Vec::new(),
        }
    }

    fn end_entry() -> AuditEntry {
        let fields = [
            ("trace_id", "4bf92f3577b34da6a3ce929d0e0e4736"),
            ("span_id", "a1a2a3a4a5a6a7a8"),
            ("parent_span_id", "00f067aa0ba902b7"),
            ("started_at_ms", "1700000000000"),
            ("duration_ms", "250"),
            ("exit_code", "3"),
            ("argv", r#"["/bin/bash","-l","-c","echo $TRACEPARENT"]"#),
            ("pid", "42"),
        ];
        AuditEntry {
            sandbox_id: "isbx".into(),
            team: String::new(),
            at: chrono::Utc::now(),
            kind: PROCESS_END.into(),
            level: AuditLevel::Info,
            message: "process 42 ended".into(),
            fields: fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn a_traced_end_is_a_span_with_the_agents_ids() {
        let s = exec_span(&sandbox(), &end_entry()).expect("a span");
        assert_eq!(s.trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(s.span_id.to_string(), "a1a2a3a4a5a6a7a8");
        assert_eq!(s.parent.to_string(), "00f067aa0ba902b7");
        assert_eq!(
            s.start,
            UNIX_EPOCH + Duration::from_millis(1_700_000_000_000)
        );
        assert_eq!(s.end, s.start + Duration::from_millis(250));
        let attr = |k: &str| {
            s.attributes
                .iter()
                .find(|kv| kv.key.as_str() == k)
                .map(|kv| kv.value.to_string())
        };
        assert_eq!(attr("process.pid").as_deref(), Some("42"));
        assert_eq!(attr("process.exit.code").as_deref(), Some("3"));
        assert_eq!(attr("warren.sandbox.id").as_deref(), Some("isbx"));
        assert!(attr("process.command_args")
            .unwrap()
            .contains("TRACEPARENT"));
    }

    #[test]
    fn untraced_or_malformed_entries_are_no_span() {
        let mut e = end_entry();
        e.kind = "process.start".into();
        assert!(exec_span(&sandbox(), &e).is_none());
        for (k, bad) in [
            ("trace_id", "00000000000000000000000000000000"),
            ("trace_id", "4bf92f3577b34da6a3ce929d0e0e47"),
            ("span_id", "zzzzzzzzzzzzzzzz"),
            ("parent_span_id", ""),
        ] {
            let mut e = end_entry();
            e.fields.insert(k.into(), bad.into());
            assert!(exec_span(&sandbox(), &e).is_none(), "{k}={bad}");
        }
        let mut e = end_entry();
        e.fields.remove("trace_id");
        assert!(exec_span(&sandbox(), &e).is_none());
    }

    #[test]
    fn the_exported_span_keeps_the_ids() {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .with_id_generator(ExecIds::default())
            .build();
        let tracer = provider.tracer("test");
        export_exec(&tracer, exec_span(&sandbox(), &end_entry()).unwrap());
        // The next span is random again.
        tracer.in_span("other", |_| {});
        let spans = exporter.get_finished_spans().unwrap();
        assert_eq!(spans.len(), 2);
        let exec = &spans[0];
        assert_eq!(exec.name, "sandbox.exec");
        assert_eq!(exec.span_context.span_id().to_string(), "a1a2a3a4a5a6a7a8");
        assert_eq!(
            exec.span_context.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(exec.parent_span_id.to_string(), "00f067aa0ba902b7");
        assert!(exec.parent_span_is_remote);
        assert_eq!(
            exec.end_time.duration_since(exec.start_time).unwrap(),
            Duration::from_millis(250)
        );
        assert_ne!(
            spans[1].span_context.span_id().to_string(),
            "a1a2a3a4a5a6a7a8"
        );
    }

    #[test]
    fn long_values_are_clipped_on_a_char_boundary() {
        let s = "é".repeat(10);
        let c = clip(&s, 5);
        assert!(c.starts_with("éé") && c.ends_with('…'));
        assert_eq!(clip("short", 10), "short");
    }
}

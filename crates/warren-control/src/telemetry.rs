//! The server's own numbers for Prometheus (`GET /metrics` on the API, OpenMetrics text):
//!
//! - `warren_sandboxes{state,template,runtime}`: sandboxes by state, counted at the scrape;
//! - `warren_operation_duration_seconds{operation}`: how long create, connect (with its
//!   resume), pause, fork, snapshot and kill took, and exec (a command's start through the
//!   proxy until the agent answered with the running process), as histograms;
//! - `warren_operation_errors{operation,kind}`: failures by operation and error kind;
//! - `warren_sandbox_limit`, `warren_concurrent_sandboxes`: the live-sandbox limit and use;
//! - `warren_network_slots{state}`, `warren_network_slot_target`: the host's network slots;
//! - `warren_prepared_sandboxes{state}`, `warren_prepared_sandbox_target`,
//!   `warren_prepared_sandbox_memory_bytes`: sandboxes started ahead of creates (the ns
//!   runtime), how many demand asks for, and what the waiting ones cost in memory;
//! - opt-in ([`Config::per_sandbox_metrics`](crate::Config)), one series per running
//!   sandbox: `warren_sandbox_cpu_seconds`, `warren_sandbox_memory_bytes` (the host's view,
//!   from its cgroup) and its latest disk use.
//!
//! Built on `prometheus-client`, the Prometheus project's Rust client: its registry encodes
//! the text format, so nothing here formats metrics by hand.
//!
//! Operations are also `tracing` spans (`sandbox.<op>`, with their runtime stages below), and
//! an [`OperationObserver`] hears of each as it ends: the OpenTelemetry exporter in
//! `warren-server` turns those into spans and a latency histogram.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use tracing::Instrument;

use crate::sandboxes::{lock, Sandboxes};
use crate::{ControlError, SandboxState};

/// Told of every timed operation as it ends (OpenTelemetry's latency histograms). Called on
/// the operation's task: it must not block.
pub trait OperationObserver: Send + Sync + 'static {
    /// `error`: the failure's kind (`not_found`, `internal`, ...), as Prometheus labels it.
    fn ended(&self, operation: &'static str, took: Duration, error: Option<&'static str>);
}

/// Sandboxes of one state, template and runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxCount {
    pub state: &'static str,
    pub template: String,
    pub runtime: &'static str,
    pub count: u64,
}

/// What the gauges say: sandboxes by state, the live ones, and the limit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxCounts {
    pub by_state: Vec<SandboxCount>,
    pub live: u64,
    pub limit: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SlotLabels {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    operation: &'static str,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
    template: String,
    runtime: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SandboxLabels {
    sandbox_id: String,
    template: String,
}

fn latency_histogram() -> Histogram {
    // 1 ms to about 65 s: a pooled create is milliseconds, a TCG fork or a cold build step
    // tens of seconds.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.001, 2.0, 17,
    ))
}

/// The registry and the metrics that operations update as they happen.
pub(crate) struct Telemetry {
    registry: Registry,
    op_seconds: Family<OpLabels, Histogram, fn() -> Histogram>,
    op_errors: Family<ErrorLabels, Counter>,
    sandboxes: Family<StateLabels, Gauge>,
    limit: Gauge,
    concurrent: Gauge,
    slots: Family<SlotLabels, Gauge>,
    slot_target: Gauge,
    prepared: Family<SlotLabels, Gauge>,
    prepared_target: Gauge,
    prepared_memory: Gauge,
    cpu_seconds: Family<SandboxLabels, Gauge<f64, AtomicU64>>,
    memory_bytes: Family<SandboxLabels, Gauge>,
    disk_bytes: Family<SandboxLabels, Gauge>,
    /// One scrape at a time: a scrape clears and refills the gauges it computes.
    scrape: std::sync::Mutex<()>,
    observer: std::sync::RwLock<Option<std::sync::Arc<dyn OperationObserver>>>,
}

impl Telemetry {
    pub(crate) fn new(per_sandbox: bool) -> Self {
        let mut registry = Registry::with_prefix("warren");
        let op_seconds: Family<OpLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_histogram);
        let op_errors: Family<ErrorLabels, Counter> = Family::default();
        let sandboxes: Family<StateLabels, Gauge> = Family::default();
        let (limit, concurrent) = (Gauge::default(), Gauge::default());
        let slots: Family<SlotLabels, Gauge> = Family::default();
        let slot_target = Gauge::default();
        let prepared: Family<SlotLabels, Gauge> = Family::default();
        let (prepared_target, prepared_memory) = (Gauge::default(), Gauge::default());
        let cpu_seconds: Family<SandboxLabels, Gauge<f64, AtomicU64>> = Family::default();
        let memory_bytes: Family<SandboxLabels, Gauge> = Family::default();
        let disk_bytes: Family<SandboxLabels, Gauge> = Family::default();
        registry.register(
            "operation_duration_seconds",
            "How long control-plane operations took, successful or not",
            op_seconds.clone(),
        );
        registry.register(
            "operation_errors",
            "Operations that failed, by the kind of error",
            op_errors.clone(),
        );
        registry.register(
            "sandboxes",
            "Sandboxes this server knows, by state, template and runtime",
            sandboxes.clone(),
        );
        registry.register(
            "sandbox_limit",
            "Live sandboxes allowed at once",
            limit.clone(),
        );
        registry.register(
            "concurrent_sandboxes",
            "Live sandboxes now (running, paused in memory, starting)",
            concurrent.clone(),
        );
        registry.register(
            "network_slots",
            "The host's network slots by state: ready (made ahead), in_use, creating, broken",
            slots.clone(),
        );
        registry.register(
            "network_slot_target",
            "Network slots the pool keeps ready",
            slot_target.clone(),
        );
        registry.register(
            "prepared_sandboxes",
            "Sandboxes started ahead of creates: ready (waiting), reserved (handed to a create)",
            prepared.clone(),
        );
        registry.register(
            "prepared_sandbox_target",
            "Sandboxes the runtime keeps prepared now (recent demand, within its cap)",
            prepared_target.clone(),
        );
        registry.register(
            "prepared_sandbox_memory_bytes",
            "Memory the waiting prepared sandboxes use: the pool's idle cost",
            prepared_memory.clone(),
        );
        if per_sandbox {
            registry.register(
                "sandbox_cpu_seconds",
                "CPU time a running sandbox has used (its cgroup, on the host)",
                cpu_seconds.clone(),
            );
            registry.register(
                "sandbox_memory_bytes",
                "Memory a running sandbox uses now (its cgroup, without inactive page cache)",
                memory_bytes.clone(),
            );
            registry.register(
                "sandbox_disk_bytes",
                "Disk a running sandbox uses, at its latest sample",
                disk_bytes.clone(),
            );
        }
        Telemetry {
            registry,
            op_seconds,
            op_errors,
            sandboxes,
            limit,
            concurrent,
            slots,
            slot_target,
            prepared,
            prepared_target,
            prepared_memory,
            cpu_seconds,
            memory_bytes,
            disk_bytes,
            scrape: std::sync::Mutex::new(()),
            observer: std::sync::RwLock::new(None),
        }
    }
}

/// The kind label of an error (its category, not its message: labels stay few).
pub(crate) fn error_kind(e: &ControlError) -> &'static str {
    match e {
        ControlError::NotFound(_) => "not_found",
        ControlError::InvalidArgument(_) => "invalid_argument",
        ControlError::Unauthenticated => "unauthenticated",
        ControlError::PermissionDenied(_) => "permission_denied",
        ControlError::ResourceExhausted { .. } => "resource_exhausted",
        ControlError::QuotaExceeded(_) => "quota_exceeded",
        ControlError::FailedPrecondition(_) => "failed_precondition",
        ControlError::Unavailable(_) => "unavailable",
        ControlError::Internal { .. } => "internal",
        ControlError::Store(_) => "store",
    }
}

impl Sandboxes {
    /// [`Sandboxes::detached`], timed and counted as operation `op` for Prometheus (the whole
    /// operation, also when the caller has gone), in a span `sandbox.<op>` whose parent is the
    /// caller's (the API request's) and whose children are the operation's stages.
    pub(crate) async fn timed<T, F>(
        &self,
        op: &'static str,
        f: impl FnOnce(Sandboxes) -> F,
    ) -> Result<T, ControlError>
    where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T, ControlError>> + Send + 'static,
    {
        let started = std::time::Instant::now();
        let span = tracing::info_span!(
            "sandbox.operation",
            otel.name = operation_span(op),
            warren.operation = op,
            warren.sandbox.id = tracing::field::Empty,
            error.type = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        let work = f(self.clone());
        self.detached(move |c| {
            async move {
                let r = work.await;
                if let Err(e) = &r {
                    let span = tracing::Span::current();
                    span.record("error.type", crate::telemetry::error_kind(e));
                    span.record("otel.status_code", "ERROR");
                }
                c.observe(op, started, &r);
                r
            }
            .instrument(span)
        })
        .await
    }

    /// Records how operation `op` went: its duration, and its error kind if it failed.
    pub(crate) fn observe<T>(
        &self,
        op: &'static str,
        started: Instant,
        result: &Result<T, ControlError>,
    ) {
        let t = &self.inner.telemetry;
        let took = started.elapsed();
        t.op_seconds
            .get_or_create(&OpLabels { operation: op })
            .observe(took.as_secs_f64());
        let kind = result.as_ref().err().map(error_kind);
        if let Some(kind) = kind {
            t.op_errors
                .get_or_create(&ErrorLabels {
                    operation: op,
                    kind,
                })
                .inc();
        }
        let observer = t.observer.read().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(o) = observer {
            o.ended(op, took, kind);
        }
    }

    /// Records a command start through the proxy (`process.Start` until the agent answers
    /// with the started process): operation `exec`, failed when the agent refused or did not
    /// answer.
    pub fn observe_exec(&self, started: Instant, failure: Option<String>) {
        let result = match failure {
            None => Ok(()),
            Some(why) => Err(ControlError::Unavailable(why)),
        };
        self.observe("exec", started, &result);
    }

    /// Has `observer` told of every operation from now on (replacing any earlier one).
    pub fn observe_operations_with(&self, observer: std::sync::Arc<dyn OperationObserver>) {
        *self
            .inner
            .telemetry
            .observer
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Some(observer);
    }

    /// Sandboxes by state, template and runtime (running and paused, from the store), the
    /// live ones and the limit: what `warren_sandboxes` and the limit gauges say.
    pub async fn sandbox_counts(&self) -> Result<SandboxCounts, ControlError> {
        let stored = self
            .inner
            .store
            .sandboxes_in(&[SandboxState::Running, SandboxState::Paused])
            .await?;
        let runtime = self.inner.runtime.name();
        let mut by: std::collections::BTreeMap<(&'static str, String), u64> = Default::default();
        for sb in &stored {
            *by.entry((sb.state.as_str(), sb.template.clone()))
                .or_default() += 1;
        }
        Ok(SandboxCounts {
            by_state: by
                .into_iter()
                .map(|((state, template), count)| SandboxCount {
                    state,
                    template,
                    runtime,
                    count,
                })
                .collect(),
            live: u64::try_from(lock(&self.inner.live).len()).unwrap_or(u64::MAX),
            limit: u64::try_from(self.inner.config.max_concurrent).unwrap_or(u64::MAX),
        })
    }

    /// The OpenMetrics text of every metric, gauges computed now.
    pub async fn prometheus_text(&self) -> Result<String, ControlError> {
        let stored = self
            .inner
            .store
            .sandboxes_in(&[SandboxState::Running, SandboxState::Paused])
            .await?;
        let runtime = self.inner.runtime.name().to_string();
        let per_sandbox = self.inner.config.per_sandbox_metrics;
        let mut usage = HashMap::new();
        if per_sandbox {
            for sb in stored.iter().filter(|s| s.state == SandboxState::Running) {
                if let Some(u) = self.inner.runtime.usage(&sb.id).await {
                    usage.insert(sb.id.clone(), u);
                }
            }
        }
        let latest_disk: HashMap<String, u64> = self
            .latest_metrics(&stored.iter().map(|s| s.id.to_string()).collect::<Vec<_>>())
            .into_iter()
            .map(|(id, p)| (id, p.disk_used))
            .collect();
        let live = lock(&self.inner.live).len();
        let t = &self.inner.telemetry;
        let _one = lock(&t.scrape);
        t.sandboxes.clear();
        for sb in &stored {
            t.sandboxes
                .get_or_create(&StateLabels {
                    state: sb.state.as_str().to_string(),
                    template: sb.template.clone(),
                    runtime: runtime.clone(),
                })
                .inc();
        }
        t.limit
            .set(i64::try_from(self.inner.config.max_concurrent).unwrap_or(i64::MAX));
        t.concurrent.set(i64::try_from(live).unwrap_or(i64::MAX));
        if let Some(slots) = self.inner.runtime.slots() {
            let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
            for (state, n) in [
                ("ready", slots.ready),
                ("in_use", slots.in_use),
                ("creating", slots.creating),
                ("broken", slots.broken),
            ] {
                t.slots.get_or_create(&SlotLabels { state }).set(gauge(n));
            }
            t.slot_target.set(gauge(slots.target));
        }
        if let Some(p) = self.inner.runtime.prepared() {
            let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
            for (state, n) in [("ready", p.ready), ("reserved", p.reserved)] {
                t.prepared
                    .get_or_create(&SlotLabels { state })
                    .set(gauge(n));
            }
            t.prepared_target.set(gauge(p.target));
            t.prepared_memory
                .set(i64::try_from(p.memory_bytes).unwrap_or(i64::MAX));
        }
        if per_sandbox {
            t.cpu_seconds.clear();
            t.memory_bytes.clear();
            t.disk_bytes.clear();
            for sb in stored.iter().filter(|s| s.state == SandboxState::Running) {
                let labels = SandboxLabels {
                    sandbox_id: sb.id.to_string(),
                    template: sb.template.clone(),
                };
                if let Some(u) = usage.get(&sb.id) {
                    if let Some(us) = u.cpu_usec {
                        t.cpu_seconds
                            .get_or_create(&labels)
                            .set(Duration::from_micros(us).as_secs_f64());
                    }
                    if let Some(m) = u.memory_bytes {
                        t.memory_bytes
                            .get_or_create(&labels)
                            .set(i64::try_from(m).unwrap_or(i64::MAX));
                    }
                }
                if let Some(d) = latest_disk.get(sb.id.as_str()) {
                    t.disk_bytes
                        .get_or_create(&labels)
                        .set(i64::try_from(*d).unwrap_or(i64::MAX));
                }
            }
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &t.registry)
            .map_err(ControlError::internal_cause("encoding metrics"))?;
        Ok(out)
    }
}

/// The span name of a timed operation (span names are static; `otel.name` sets the exported
/// one).
fn operation_span(op: &'static str) -> &'static str {
    match op {
        "create" => "sandbox.create",
        "connect" => "sandbox.connect",
        "kill" => "sandbox.kill",
        "pause" => "sandbox.pause",
        "fork" => "sandbox.fork",
        "snapshot" => "sandbox.snapshot",
        _ => "sandbox.operation",
    }
}

/// Names the sandbox on the current span (the operation's, or a fork child's); a no-op
/// outside one.
pub(crate) fn trace_sandbox(id: &str) {
    tracing::Span::current().record("warren.sandbox.id", id);
}

impl Sandboxes {
    /// A stage of an operation that the runtime carries out (`runtime.create`, ...), a child
    /// of the current span.
    pub(crate) fn stage(&self, name: &'static str) -> tracing::Span {
        tracing::info_span!(
            "runtime.stage",
            otel.name = name,
            warren.runtime = self.inner.runtime.name()
        )
    }
}

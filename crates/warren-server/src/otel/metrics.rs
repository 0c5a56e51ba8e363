//! The server's numbers over OTLP: what `GET /metrics` tells Prometheus, under OpenTelemetry
//! names.
//!
//! | instrument | kind | unit | attributes |
//! |---|---|---|---|
//! | `warren.sandboxes` | gauge | `{sandbox}` | `warren.sandbox.state`, `warren.sandbox.template`, `warren.runtime` |
//! | `warren.sandboxes.live` | gauge | `{sandbox}` | |
//! | `warren.sandboxes.limit` | gauge | `{sandbox}` | |
//! | `warren.operation.duration` | histogram | `s` | `warren.operation`, `error.type` (failures) |
//!
//! The gauges are read from a copy the server refreshes on its runtime once per export
//! period: the SDK asks for them on its own thread, where the store (async) cannot be read.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::metrics::{Histogram, Meter};
use opentelemetry::KeyValue;
use warren_control::{Control, OperationObserver, SandboxCounts};

/// The histogram's bucket bounds, in seconds: those of Prometheus's
/// `warren_operation_duration_seconds` (1 ms doubling to about 65 s).
pub(crate) fn duration_bounds() -> Vec<f64> {
    (0..17).map(|i| 0.001 * f64::from(1u32 << i)).collect()
}

struct Durations(Histogram<f64>);

impl OperationObserver for Durations {
    fn ended(&self, operation: &'static str, took: Duration, error: Option<&'static str>) {
        let mut attrs = vec![KeyValue::new("warren.operation", operation)];
        if let Some(kind) = error {
            attrs.push(KeyValue::new("error.type", kind));
        }
        self.0.record(took.as_secs_f64(), &attrs);
    }
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Registers the instruments on `meter` and starts refreshing the gauges' copy every
/// `period`; the task ends when the returned handle is aborted.
pub(crate) fn start(
    meter: &Meter,
    control: &Control,
    runtime: &tokio::runtime::Handle,
    period: Duration,
) -> tokio::task::JoinHandle<()> {
    let durations = meter
        .f64_histogram("warren.operation.duration")
        .with_unit("s")
        .with_description(
            "How long control-plane operations took (create, connect, pause, fork, snapshot, \
             kill), successful or not",
        )
        .with_boundaries(duration_bounds())
        .build();
    control.observe_operations_with(Arc::new(Durations(durations)));

    let counts: Arc<Mutex<SandboxCounts>> = Arc::default();
    let read = |c: &Arc<Mutex<SandboxCounts>>| c.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let c = counts.clone();
    meter
        .i64_observable_gauge("warren.sandboxes")
        .with_unit("{sandbox}")
        .with_description("Sandboxes this server knows, by state, template and runtime")
        .with_callback(move |g| {
            for s in read(&c).by_state {
                g.observe(
                    to_i64(s.count),
                    &[
                        KeyValue::new("warren.sandbox.state", s.state),
                        KeyValue::new("warren.sandbox.template", s.template),
                        KeyValue::new("warren.runtime", s.runtime),
                    ],
                );
            }
        })
        .build();
    let c = counts.clone();
    meter
        .i64_observable_gauge("warren.sandboxes.live")
        .with_unit("{sandbox}")
        .with_description("Live sandboxes now (running, paused in memory, starting)")
        .with_callback(move |g| g.observe(to_i64(read(&c).live), &[]))
        .build();
    let c = counts.clone();
    meter
        .i64_observable_gauge("warren.sandboxes.limit")
        .with_unit("{sandbox}")
        .with_description("Live sandboxes allowed at once")
        .with_callback(move |g| g.observe(to_i64(read(&c).limit), &[]))
        .build();

    let control = control.clone();
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match control.sandbox_counts().await {
                Ok(now) => *counts.lock().unwrap_or_else(|e| e.into_inner()) = now,
                Err(e) => tracing::debug!(error = %warren_runtime::chain(&e), "counting sandboxes for OTLP metrics"),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_match_prometheus() {
        let b = duration_bounds();
        assert_eq!(b.len(), 17);
        assert!((b[0] - 0.001).abs() < 1e-12);
        assert!((b[16] - 65.536).abs() < 1e-9);
        assert!(b.windows(2).all(|w| w[0] < w[1]));
    }
}

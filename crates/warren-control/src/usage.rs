//! Resource use of sandboxes over time: the series behind `GET /sandboxes/{id}/metrics`.
//!
//! Every [`SAMPLE_EVERY`] the control plane samples each running sandbox, and a read finds a
//! sample no older than that (taking one if there is none). A sample joins two views:
//! - **the host's** ([`SandboxRuntime::usage`](warren_runtime::SandboxRuntime::usage), the
//!   sandbox's cgroup): CPU time, which nothing inside the sandbox can change, so the CPU
//!   share comes from it wherever the runtime measures it;
//! - **the guest's** ([`GuestMetrics`], the agent's `/metrics`): memory and page cache as the
//!   sandbox's kernel sees them (a VM's QEMU holds guest RAM the guest has freed), and its disk.
//!
//! The CPU count and memory total are the sandbox's own limits as recorded here, not what
//! anything inside says, and every used figure is clamped to its total. Points are kept in
//! memory for [`RETAINED`] (per sandbox, while it exists): they are a view of the present, not
//! acknowledged state, so a server restart starts the series again.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

pub use crate::guest::{GuestMetrics, GuestView};
use crate::sandboxes::{lock, Sandboxes};
use crate::{ControlError, Sandbox, SandboxState};

/// How often running sandboxes are sampled (E2B's finest bucket).
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// How long points are kept: one hour of 5 s samples.
pub const RETAINED: usize = 720;
/// Sandboxes sampled at once (each sample is a request to an agent).
const CONCURRENT_SAMPLES: usize = 16;

/// One sample of a sandbox's resources.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MetricPoint {
    pub at: DateTime<Utc>,
    pub cpu_count: u32,
    pub cpu_used_pct: f64,
    pub mem_used: u64,
    pub mem_total: u64,
    pub mem_cache: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

#[derive(Default)]
struct SandboxSeries {
    points: VecDeque<MetricPoint>,
    /// The host's CPU time at the previous sample, for the share between two samples.
    last_cpu: Option<(Instant, u64)>,
}

/// Every sandbox's series.
#[derive(Default)]
pub(crate) struct Series {
    by_sandbox: HashMap<String, SandboxSeries>,
}

/// The share of `cpus` CPUs that `used_usec` of CPU time over `wall` is, in percent with two
/// decimals (as envd reports it), at most 100.
fn cpu_share(used_usec: u64, wall: Duration, cpus: u32) -> f64 {
    let capacity = wall.as_micros() as f64 * f64::from(cpus.max(1));
    if capacity <= 0.0 {
        return 0.0;
    }
    let pct = (used_usec as f64 * 100.0 / capacity).min(100.0);
    (pct * 100.0).round() / 100.0
}

/// A time window; either end may be open.
pub type Window = (Option<DateTime<Utc>>, Option<DateTime<Utc>>);

/// Parses the E2B query's `start`/`end` (unix seconds) into a window; `start > end` is the
/// caller's mistake.
pub fn window(start: Option<i64>, end: Option<i64>) -> Result<Window, ControlError> {
    if let (Some(s), Some(e)) = (start, end) {
        if s > e {
            return Err(ControlError::InvalidArgument(
                "Invalid time range for metrics: start is after end".into(),
            ));
        }
    }
    let at = |secs: i64, what: &str| {
        DateTime::<Utc>::from_timestamp(secs, 0).ok_or_else(|| {
            ControlError::InvalidArgument(format!("metrics {what} {secs} is not a time"))
        })
    };
    Ok((
        start.map(|s| at(s, "start")).transpose()?,
        end.map(|e| at(e, "end")).transpose()?,
    ))
}

impl Sandboxes {
    /// Starts sampling every running sandbox, when the control plane reads guests.
    pub(crate) fn start_sampling(&self) {
        if self.inner.guest_metrics.is_none() {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let control = self.clone();
        handle.spawn(async move {
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = control.inner.shutdown.cancelled() => return,
                    _ = tick.tick() => control.sample_all().await,
                }
            }
        });
    }

    /// Samples every running sandbox whose record is not busy (one being paused or killed is
    /// skipped this round), and forgets the series of sandboxes that are gone.
    async fn sample_all(&self) {
        let entries: Vec<_> = lock(&self.inner.live).values().cloned().collect();
        let running: Vec<Sandbox> = entries
            .iter()
            .filter_map(|e| e.try_lock().ok().map(|s| s.clone()))
            .filter(|s| s.state == SandboxState::Running && s.runtime.is_some())
            .collect();
        {
            let live = lock(&self.inner.live);
            lock(&self.inner.series)
                .by_sandbox
                .retain(|id, _| live.contains_key(id));
            self.inner.audit.forget_gone(|id| live.contains_key(id));
        }
        let gate = Arc::new(tokio::sync::Semaphore::new(CONCURRENT_SAMPLES));
        let mut tasks = tokio::task::JoinSet::new();
        for sandbox in running {
            let control = self.clone();
            let gate = gate.clone();
            tasks.spawn(async move {
                let _turn = gate.acquire().await;
                if let Err(e) = control.sample(&sandbox).await {
                    tracing::debug!(sandbox = %sandbox.id, error = %e, "sampling metrics");
                }
                if let Err(e) = control.inner.audit.read_journals(&sandbox).await {
                    tracing::debug!(sandbox = %sandbox.id, error = %e, "reading journals");
                }
            });
        }
        while tasks.join_next().await.is_some() {}
    }

    /// Takes one sample of a running sandbox and keeps it.
    async fn sample(&self, sandbox: &Sandbox) -> Result<MetricPoint, String> {
        let guest = match &self.inner.guest_metrics {
            Some(g) => g.read(sandbox).await?,
            None => GuestView::default(),
        };
        let host = self.inner.runtime.usage(&sandbox.id).await;
        let now = Instant::now();
        let mem_total = u64::from(sandbox.resources.memory_mb) * 1024 * 1024;
        let disk_total = if guest.disk_total > 0 {
            guest.disk_total
        } else {
            u64::from(sandbox.resources.disk_mb) * 1024 * 1024
        };
        let mut series = lock(&self.inner.series);
        let entry = series.by_sandbox.entry(sandbox.id.to_string()).or_default();
        let cpu_used_pct = match host.and_then(|u| u.cpu_usec) {
            Some(usec) => {
                let share = match entry.last_cpu {
                    Some((at, before)) if now > at => cpu_share(
                        usec.saturating_sub(before),
                        now - at,
                        sandbox.resources.cpu_count,
                    ),
                    // No earlier reading: the guest's figure for this first point.
                    _ => guest.cpu_used_pct.clamp(0.0, 100.0),
                };
                entry.last_cpu = Some((now, usec));
                share
            }
            None => guest.cpu_used_pct.clamp(0.0, 100.0),
        };
        let point = MetricPoint {
            at: Utc::now(),
            cpu_count: sandbox.resources.cpu_count,
            cpu_used_pct,
            mem_used: guest.mem_used.min(mem_total),
            mem_total,
            mem_cache: guest.mem_cache.min(mem_total),
            disk_used: guest.disk_used.min(disk_total),
            disk_total,
        };
        if entry.points.len() == RETAINED {
            entry.points.pop_front();
        }
        entry.points.push_back(point);
        Ok(point)
    }

    /// Sandbox `id`'s samples inside `[start, end]` (unix seconds, either open), oldest first.
    /// A running sandbox is sampled now if its newest point is older than [`SAMPLE_EVERY`].
    pub(crate) async fn metrics_of(
        &self,
        sandbox: &Sandbox,
        start: Option<i64>,
        end: Option<i64>,
    ) -> Result<Vec<MetricPoint>, ControlError> {
        let (from, to) = window(start, end)?;
        if sandbox.state == SandboxState::Running && sandbox.runtime.is_some() {
            let fresh = lock(&self.inner.series)
                .by_sandbox
                .get(sandbox.id.as_str())
                .and_then(|s| s.points.back().copied())
                .is_some_and(|p| {
                    Utc::now()
                        .signed_duration_since(p.at)
                        .to_std()
                        .unwrap_or_default()
                        < SAMPLE_EVERY
                });
            if !fresh {
                if let Err(e) = self.sample(sandbox).await {
                    // The history still answers; only this point is missing.
                    tracing::debug!(sandbox = %sandbox.id, error = %e, "sampling metrics");
                }
            }
        }
        let series = lock(&self.inner.series);
        Ok(series
            .by_sandbox
            .get(sandbox.id.as_str())
            .map(|s| {
                s.points
                    .iter()
                    .filter(|p| from.is_none_or(|f| p.at >= f) && to.is_none_or(|t| p.at <= t))
                    .copied()
                    .collect()
            })
            .unwrap_or_default())
    }

    /// The newest sample of each of `ids` that has one.
    pub(crate) fn latest_metrics(&self, ids: &[String]) -> Vec<(String, MetricPoint)> {
        let series = lock(&self.inner.series);
        ids.iter()
            .filter_map(|id| {
                let p = series.by_sandbox.get(id)?.points.back()?;
                Some((id.clone(), *p))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_share_is_of_the_sandboxes_own_cpus() {
        // One CPU busy for a second of a 2-CPU sandbox is half of it.
        assert_eq!(cpu_share(1_000_000, Duration::from_secs(1), 2), 50.0);
        assert_eq!(cpu_share(1_000_000, Duration::from_secs(1), 1), 100.0);
        // Accounting that runs ahead of the clock never reports more than everything.
        assert_eq!(cpu_share(3_000_000, Duration::from_secs(1), 2), 100.0);
        assert_eq!(cpu_share(123_456, Duration::from_secs(1), 1), 12.35);
        assert_eq!(cpu_share(5, Duration::ZERO, 1), 0.0);
    }

    #[test]
    fn a_window_that_ends_before_it_starts_is_refused() {
        assert!(
            matches!(window(Some(10), Some(5)), Err(ControlError::InvalidArgument(m)) if m.contains("Invalid time range"))
        );
        assert!(window(Some(5), Some(5)).is_ok());
        assert!(window(None, None).unwrap() == (None, None));
        assert!(window(Some(i64::MAX), None).is_err());
    }
}

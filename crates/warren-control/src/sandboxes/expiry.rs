//! Background watchers: kill (or pause, per lifecycle) sandboxes at `end_at`, notice
//! sandboxes that ended on their own.

use std::time::Duration;

use chrono::Utc;

use crate::sandboxes::Sandboxes;

/// Longest sleep between expiry checks even when nothing is due (clock changes, missed wakes).
const MAX_SLEEP: Duration = Duration::from_secs(30);

pub(crate) fn spawn(control: Sandboxes) {
    tokio::spawn(reaper(control.clone()));
    tokio::spawn(pruner(control.clone()));
    tokio::spawn(exit_watcher(control));
}

/// How often records of ended sandboxes past their retention are deleted.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// Deletes the store's records of sandboxes that ended longer ago than the retention (their
/// metadata and env vars would otherwise stay forever).
async fn pruner(control: Sandboxes) {
    let inner = &control.inner;
    let mut tick = tokio::time::interval(PRUNE_EVERY);
    loop {
        tokio::select! {
            _ = inner.shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let Ok(keep) = chrono::Duration::from_std(inner.config.ended_retention) else {
            continue;
        };
        match inner.store.prune_ended(Utc::now() - keep).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                records = n,
                "forgot sandboxes that ended past the retention"
            ),
            Err(e) => tracing::warn!(error = %warren_runtime::chain(&e), "pruning ended sandboxes"),
        }
        if let Err(e) = inner
            .store
            .prune_events(Utc::now() - crate::events::EVENT_RETENTION)
            .await
        {
            tracing::warn!(error = %warren_runtime::chain(&e), "pruning lifecycle events");
        }
        if let Err(e) = inner
            .store
            .prune_audit(Utc::now() - crate::audit::AUDIT_RETENTION)
            .await
        {
            tracing::warn!(error = %warren_runtime::chain(&e), "pruning the audit trail");
        }
    }
}

async fn reaper(control: Sandboxes) {
    let inner = &control.inner;
    loop {
        let now = Utc::now();
        let (due, next) = {
            let expiries = inner.expiries.lock().unwrap_or_else(|p| p.into_inner());
            let due: Vec<String> = expiries
                .iter()
                .filter(|(_, end)| **end <= now)
                .map(|(id, _)| id.clone())
                .collect();
            (
                due,
                expiries.values().filter(|end| **end > now).min().copied(),
            )
        };
        for id in due {
            // Drop it from the schedule first: a failed kill must not spin this loop (a failed
            // pause reschedules itself).
            inner
                .expiries
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
            let c = control.clone();
            tokio::spawn(async move {
                tracing::info!(sandbox_id = %id, "sandbox reached its end time");
                if let Err(e) = c.end_time_reached(&id).await {
                    tracing::warn!(sandbox_id = %id, error = %warren_runtime::chain(&e), "ending expired sandbox");
                }
            });
        }
        let sleep = next
            .and_then(|n| (n - Utc::now()).to_std().ok())
            .map_or(MAX_SLEEP, |d| d.min(MAX_SLEEP));
        tokio::select! {
            _ = inner.shutdown.cancelled() => return,
            _ = inner.wake_reaper.notified() => {}
            _ = tokio::time::sleep(sleep) => {}
        }
    }
}

/// How long the exit watcher lets a burst of exit signals settle before it looks.
const EXIT_SIGNAL_SETTLE: std::time::Duration = std::time::Duration::from_millis(200);

async fn exit_watcher(control: Sandboxes) {
    let inner = &control.inner;
    let mut tick = tokio::time::interval(inner.config.exit_poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A back end that says when something ended is heard at once; the poll stays for what it
    // cannot see (sandboxes taken back after a restart are not its children).
    let signal = inner.runtime.exit_signal();
    loop {
        tokio::select! {
            _ = inner.shutdown.cancelled() => return,
            _ = tick.tick() => {}
            _ = async {
                match &signal {
                    Some(s) => s.notified().await,
                    None => std::future::pending().await,
                }
            } => {
                // Signals come in bursts (every helper process a create runs ends too): one
                // look per burst, at most five a second, keeps the scan off the create path.
                tokio::time::sleep(EXIT_SIGNAL_SETTLE).await;
            }
        }
        for id in control.running_ids() {
            match inner.runtime.status(&id).await {
                Ok(None) => {}
                Ok(Some(exit)) => {
                    if let Err(e) = control.mark_exited(&id, exit.reason).await {
                        tracing::warn!(sandbox_id = %id, error = %warren_runtime::chain(&e), "recording sandbox exit");
                    }
                }
                Err(warren_runtime::RuntimeError::NotFound(_)) => {
                    if let Err(e) = control
                        .mark_exited(&id, "the runtime no longer knows it".into())
                        .await
                    {
                        tracing::warn!(sandbox_id = %id, error = %warren_runtime::chain(&e), "recording sandbox exit");
                    }
                }
                Err(e) => {
                    tracing::debug!(sandbox_id = %id, error = %warren_runtime::chain(&e), "status check failed")
                }
            }
        }
    }
}

//! Polling watchers (`CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`): a [`DirWatch`]
//! on a task of its own filling a bounded buffer that each poll drains, after making the watch
//! catch up with the kernel's queue so a poll sees every change made before it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::task::JoinHandle;
use warren_proto::connect::ConnectError;
use warren_proto::filesystem::FilesystemEvent;
use warren_proto::server::RpcResult;

use super::watch::{DirWatch, Flusher, Item, WatchOptions, MAX_BUFFERED_EVENTS};

/// How long `GetWatcherEvents` waits for its watch to catch up with the kernel's queue.
const FLUSH_WAIT: Duration = Duration::from_secs(2);

/// Buffered events of a polling watcher.
#[derive(Default)]
struct Buffer {
    events: VecDeque<FilesystemEvent>,
    /// Events dropped since the last drain because the buffer was full.
    dropped: u64,
    /// Why the watch stopped, reported once the buffered events are drained.
    error: Option<ConnectError>,
    /// Flush reports seen (see [`Flusher`]).
    flushed: u64,
}

struct Polling {
    buffer: Arc<Mutex<Buffer>>,
    /// Told when the task reports a flush or stops.
    changed: Arc<tokio::sync::Notify>,
    /// `None` if the sentinel could not be set up (no /proc): drains then return what the
    /// task has so far.
    flusher: Option<Arc<Flusher>>,
    /// One drain at a time, so each waits for its own flush.
    draining: Arc<tokio::sync::Mutex<()>>,
    task: JoinHandle<()>,
}

impl Drop for Polling {
    fn drop(&mut self) {
        // Ends the watch task, which drops the watch and closes its inotify fd.
        self.task.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Polling watchers created by `CreateWatcher`, by id.
#[derive(Default)]
pub struct Watchers {
    by_id: Mutex<HashMap<String, Polling>>,
}

impl Watchers {
    /// Starts a polling watcher; its id is a UUID.
    pub async fn create(&self, opts: WatchOptions) -> RpcResult<String> {
        let mut watch = DirWatch::start(opts).await?;
        let flusher = match watch.flusher() {
            Ok(f) => Some(Arc::new(f)),
            Err(e) => {
                tracing::debug!(error = %e, "no flush sentinel; watcher events arrive as read");
                None
            }
        };
        let id = uuid::Uuid::new_v4().to_string();
        let buffer = Arc::new(Mutex::new(Buffer::default()));
        let changed = Arc::new(tokio::sync::Notify::new());
        let (sink, told) = (buffer.clone(), changed.clone());
        let watcher_id = id.clone();
        let task = tokio::spawn(async move {
            loop {
                match watch.next_item().await {
                    Ok(Item::Event(ev)) => {
                        let mut b = lock(&sink);
                        if b.events.len() >= MAX_BUFFERED_EVENTS {
                            b.events.pop_front();
                            if b.dropped == 0 {
                                tracing::warn!(watcher = %watcher_id, "watcher buffer full; dropping oldest events until drained");
                            }
                            b.dropped += 1;
                        }
                        b.events.push_back(ev);
                    }
                    Ok(Item::Flushed(n)) => {
                        lock(&sink).flushed = n;
                        told.notify_waiters();
                    }
                    Err(e) => {
                        tracing::warn!(watcher = %watcher_id, error = %e, "watcher stopped");
                        lock(&sink).error = Some(e);
                        told.notify_waiters();
                        return;
                    }
                }
            }
        });
        let polling = Polling {
            buffer,
            changed,
            flusher,
            draining: Arc::new(tokio::sync::Mutex::new(())),
            task,
        };
        lock(&self.by_id).insert(id.clone(), polling);
        Ok(id)
    }

    /// Everything that happened before the call and was not handed out yet (as envd: a
    /// change made just before, such as a file the same client wrote, is included). Once the
    /// watch has failed and its remaining events were handed out, every call returns the
    /// failure.
    pub async fn drain(&self, id: &str) -> RpcResult<Vec<FilesystemEvent>> {
        let (buffer, changed, flusher, draining) = {
            let map = lock(&self.by_id);
            let p = map.get(id).ok_or_else(|| unknown_watcher(id))?;
            (
                p.buffer.clone(),
                p.changed.clone(),
                p.flusher.clone(),
                p.draining.clone(),
            )
        };
        let _one_at_a_time = draining.lock().await;
        if let Some(flusher) = flusher {
            Self::catch_up(&buffer, &changed, &flusher).await;
        }
        let mut b = lock(&buffer);
        if b.dropped > 0 {
            tracing::warn!(watcher = %id, dropped = b.dropped, "watcher events were dropped before this drain");
            b.dropped = 0;
        }
        if b.events.is_empty() {
            if let Some(e) = &b.error {
                return Err(e.clone());
            }
        }
        Ok(b.events.drain(..).collect())
    }

    /// Waits (bounded) until the watch reports a flush requested now, or stops.
    async fn catch_up(buffer: &Mutex<Buffer>, changed: &tokio::sync::Notify, flusher: &Flusher) {
        let before = {
            let b = lock(buffer);
            if b.error.is_some() {
                return;
            }
            b.flushed
        };
        if let Err(e) = flusher.request() {
            tracing::debug!(error = %e, "watcher flush request failed");
            return;
        }
        let wait = async {
            loop {
                let notified = changed.notified();
                {
                    let b = lock(buffer);
                    if b.flushed > before || b.error.is_some() {
                        return;
                    }
                }
                notified.await;
            }
        };
        if tokio::time::timeout(FLUSH_WAIT, wait).await.is_err() {
            tracing::warn!("watcher did not catch up within {FLUSH_WAIT:?}; returning what it has");
        }
    }

    /// Stops and forgets a polling watcher. Returns once its watch is gone, so its inotify
    /// instance and its place among [`MAX_WATCHERS`](super::watch::MAX_WATCHERS) are free for the next `CreateWatcher`.
    pub async fn remove(&self, id: &str) -> RpcResult<()> {
        let removed = lock(&self.by_id).remove(id);
        let mut polling = removed.ok_or_else(|| unknown_watcher(id))?;
        polling.task.abort();
        // Resolves (as cancelled) once the task, and the watch it owns, have been dropped.
        let _ = (&mut polling.task).await;
        Ok(())
    }
}

fn unknown_watcher(id: &str) -> ConnectError {
    ConnectError::not_found(format!("watcher with id {id} not found"))
}

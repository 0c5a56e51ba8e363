//! The warm pool: QEMUs of a template already waiting for their incoming snapshot, in their
//! slots, so that a create pays only for the state load and the agent's `/init`.

use std::sync::atomic::Ordering;

use super::{Size, VmRuntime, Warm};

impl VmRuntime {
    /// How many warm QEMUs `template` should have.
    pub(super) fn warm_target(&self, template: &str) -> usize {
        self.warm_targets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(template)
            .copied()
            .unwrap_or(self.settings.warm_pool)
    }

    /// The size `template`'s warm QEMUs have: that of its last create (the catalog size
    /// before the first).
    pub(super) fn warm_size(&self, template: &str) -> Size {
        self.warm_sizes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(template)
            .copied()
            .unwrap_or_else(|| self.default_size())
    }

    /// Records that `template` was last created at `size`.
    pub(super) fn set_warm_size(&self, template: &str, size: Size) {
        self.warm_sizes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(template.to_string(), size);
    }

    pub(super) async fn refill(&self, template: &str) {
        if self.warm_target(template) == 0 {
            return;
        }
        let _guard = self.refilling.lock().await;
        let Ok(snap) = self.snapshot(template, self.warm_size(template)).await else {
            return;
        };
        loop {
            let have = self.warm.lock().await.get(template).map_or(0, |q| q.len());
            if have >= self.warm_target(template) || Size::of(&snap) != self.warm_size(template) {
                return;
            }
            if self.stopping.load(Ordering::SeqCst) {
                return;
            }
            match self.start_pending(&snap, &Default::default()).await {
                Ok(w) if self.stopping.load(Ordering::SeqCst) => {
                    self.discard_warm(w).await;
                    return;
                }
                Ok(w) => self
                    .warm
                    .lock()
                    .await
                    .entry(template.to_string())
                    .or_default()
                    .push_back(w),
                Err(e) => {
                    tracing::warn!(template, error = %e, "could not start a warm VM");
                    return;
                }
            }
        }
    }

    pub(super) fn spawn_refill(&self, template: &str) {
        if let Some(rt) = self.this.upgrade() {
            let t = template.to_string();
            tokio::spawn(async move { rt.refill(&t).await });
        }
    }

    /// Discards warm QEMUs of `template` beyond `size`.
    pub(super) async fn shrink_warm(&self, template: &str, size: usize) {
        let extra: Vec<Warm> = {
            let mut warm = self.warm.lock().await;
            match warm.get_mut(template) {
                Some(q) if q.len() > size => q.drain(size..).collect(),
                _ => Vec::new(),
            }
        };
        for w in extra {
            self.discard_warm(w).await;
        }
    }

    /// A warm QEMU of `template` at `size` whose process still waits, if any. Warm QEMUs
    /// of another size (the template's sandboxes were created at another size before) are
    /// discarded: the pool follows the latest size.
    pub(super) async fn take_warm(&self, template: &str, size: Size) -> Option<Warm> {
        loop {
            let mut w = self.warm.lock().await.get_mut(template)?.pop_front()?;
            if Size::of(w.pending.snapshot()) != size {
                self.discard_warm(w).await;
                continue;
            }
            if matches!(w.pending.child.try_wait(), Ok(None)) {
                return Some(w);
            }
            tracing::warn!(vm = %w.name, "a warm VM died while waiting; discarding it");
            self.discard_warm(w).await;
        }
    }

    /// Drops what the warm pool keeps of `template` (its template was deleted): its waiting
    /// QEMUs, its target and its size.
    pub(super) async fn forget_warm(&self, template: &str) {
        // After a refill under way, which would otherwise add one more.
        let _refill = self.refilling.lock().await;
        self.warm_targets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(template);
        self.warm_sizes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(template);
        let gone = self.warm.lock().await.remove(template).unwrap_or_default();
        for w in gone {
            self.discard_warm(w).await;
        }
    }

    pub(super) async fn discard_warm(&self, mut w: Warm) {
        let _ = w.pending.child.start_kill();
        let _ = w.pending.child.wait().await;
        let cg = w.cgroup.clone();
        let _ = tokio::task::spawn_blocking(move || {
            let _ = cg.kill_all();
            cg.remove()
        })
        .await;
        crate::snapshot::remove_vm_dir(&self.vms_dir().join(&w.name));
        self.remove_links(&w.name);
        self.release_slot(w.slot).await;
    }
}

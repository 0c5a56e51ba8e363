//! Pause, resume, auto-resume and what happens at the end time.
//!
//! A pause cuts the sandbox's proxied streams first (clients see them aborted, as on a kill),
//! then has the runtime pause it; only once the runtime says everything is durable is the new
//! runtime record stored and the pause acknowledged. A resume that fails leaves the sandbox
//! paused: its saved state is never given up because one attempt did not work.

use crate::events::EventKind;
use chrono::Utc;
use tokio::sync::OwnedMutexGuard;
use tracing::Instrument;
use warren_runtime::{PauseMode, ResumeKind, RuntimeError};

use crate::error::ControlError;
use crate::model::{Lifecycle, OnTimeout, Sandbox, SandboxState};
use crate::sandboxes::create::spec_of;
use crate::sandboxes::{Access, Route, Sandboxes};

impl Sandboxes {
    /// Maps a runtime failure to the caller's error category (decided by the runtime:
    /// [`RuntimeError::category`]), saying what was being done and why, causes included.
    pub(crate) fn runtime_error(&self, e: RuntimeError, doing: &str) -> ControlError {
        use warren_runtime::Category;
        let category = e.category();
        if category == Category::Internal {
            // A bug below: the client is told only that; the log gets `doing` and the
            // runtime's error kept whole as the source.
            return ControlError::internal_cause(doing)(e);
        }
        let message = match &e {
            RuntimeError::UnknownTemplate(t) => format!("{doing}: template '{t}' not found"),
            RuntimeError::NotFound(m) => format!("{doing}: {m} not found"),
            RuntimeError::Exhausted(m) => format!("{doing}: host capacity exhausted: {m}"),
            other => format!("{doing}: {}", warren_runtime::chain(other)),
        };
        match category {
            Category::NotFound => ControlError::NotFound(message),
            Category::BadRequest => ControlError::InvalidArgument(message),
            Category::Conflict => ControlError::FailedPrecondition(message),
            Category::Unavailable => ControlError::Unavailable(message),
            Category::Exhausted => ControlError::ResourceExhausted {
                message,
                retry_after: self.inner.config.retry_after,
            },
            Category::StorageFull => {
                ControlError::QuotaExceeded(format!("{message} (the host's disk is full)"))
            }
            // Not reached: handled above, with its source.
            Category::Internal => ControlError::internal(message),
        }
    }

    /// [`Self::runtime_error`] for an operation that left the sandbox unharmed (a failed pause
    /// or resume): a retry may work, so even an internal failure is `Unavailable`, not a bug
    /// report.
    fn retryable(&self, e: RuntimeError, doing: &str) -> ControlError {
        if e.category() == warren_runtime::Category::Internal {
            ControlError::Unavailable(format!("{doing}: {}", warren_runtime::chain(&e)))
        } else {
            self.runtime_error(e, doing)
        }
    }

    /// The pause mode for a request's `memory` flag: what was asked if the runtime has it,
    /// else the best it has when nothing was asked.
    pub(crate) fn pause_mode(&self, memory: Option<bool>) -> Result<PauseMode, ControlError> {
        let caps = self.inner.runtime.capabilities();
        let name = self.inner.runtime.name();
        match memory {
            Some(true) if caps.pause_memory => Ok(PauseMode::Memory),
            Some(true) => Err(ControlError::InvalidArgument(format!(
                "the {name} runtime cannot pause with memory{}",
                if caps.pause_filesystem {
                    "; a filesystem-only pause (memory: false, mode=\"filesystem\") works"
                } else {
                    ""
                }
            ))),
            Some(false) if caps.pause_filesystem => Ok(PauseMode::Filesystem),
            Some(false) => Err(ControlError::InvalidArgument(format!(
                "the {name} runtime cannot pause keeping only the filesystem"
            ))),
            None if caps.pause_memory => Ok(PauseMode::Memory),
            None if caps.pause_filesystem => Ok(PauseMode::Filesystem),
            None => Err(ControlError::InvalidArgument(format!(
                "the {name} runtime cannot pause sandboxes"
            ))),
        }
    }

    /// Refuses a lifecycle this runtime cannot honour, at create time rather than at the end.
    pub(crate) fn check_lifecycle(&self, lifecycle: &Lifecycle) -> Result<(), ControlError> {
        match lifecycle.on_timeout {
            OnTimeout::Kill if lifecycle.auto_resume => Err(ControlError::InvalidArgument(
                "autoResume needs autoPause: a killed sandbox cannot be resumed".into(),
            )),
            OnTimeout::Kill => Ok(()),
            OnTimeout::Pause => self.pause_mode(lifecycle.pause_memory).map(|_| ()),
        }
    }

    /// Pauses a running sandbox. `memory`: keep memory and processes (`true`), only the
    /// filesystem (`false`), or the best the runtime has (`None`). Pausing a paused sandbox is
    /// `FailedPrecondition` (409).
    pub(crate) async fn pause(&self, id: &str, memory: Option<bool>) -> Result<(), ControlError> {
        let id = id.to_string();
        self.timed("pause", |c| async move {
            crate::telemetry::trace_sandbox(&id);
            let mode = c.pause_mode(memory)?;
            let mut sb = c.locked(&id).await?;
            c.pause_locked(&mut sb, mode).await
        })
        .await
    }

    pub(crate) async fn pause_locked(
        &self,
        sb: &mut OwnedMutexGuard<Sandbox>,
        mode: PauseMode,
    ) -> Result<(), ControlError> {
        let id = sb.id.clone();
        match sb.state {
            SandboxState::Running => {}
            SandboxState::Paused => {
                return Err(ControlError::FailedPrecondition(format!(
                    "sandbox {id} is already paused"
                )))
            }
            other => {
                return Err(ControlError::FailedPrecondition(format!(
                    "sandbox {id} is {}",
                    other.as_str()
                )))
            }
        }
        self.check_headroom()?;
        let max = self.inner.config.max_paused;
        let paused = self
            .inner
            .store
            .sandboxes_in(&[SandboxState::Paused])
            .await?
            .len();
        if paused >= max {
            return Err(ControlError::QuotaExceeded(format!(
                "{paused} sandboxes are paused, the most this server keeps ({max}); kill one \
                 first"
            )));
        }
        // What its journals hold that was not read yet (a filesystem pause ends the agent).
        self.inner
            .audit
            .final_read(sb)
            .instrument(tracing::info_span!("sandbox.audit.read"))
            .await;
        // Streams are cut before the runtime freezes the sandbox, so no client waits on a
        // connection to a sandbox that no longer answers. Traffic for an auto-resuming sandbox
        // that arrives meanwhile waits for the pause and then resumes it.
        self.set_wakeable(sb, sb.lifecycle.auto_resume);
        self.unroute(&id);
        self.unschedule(&id);
        let paused = self
            .inner
            .runtime
            .pause(&id, mode)
            .instrument(self.stage("runtime.pause"))
            .await;
        let rt = match paused {
            Ok(rt) => rt,
            Err(e) => {
                // The runtime refused or failed; the sandbox is still the running one it was.
                self.set_wakeable(sb, false);
                self.route_running(sb);
                tracing::warn!(sandbox_id = %id, error = %warren_runtime::chain(&e), "pause failed");
                return Err(self.retryable(
                    e,
                    &format!("pausing sandbox {id} failed (it keeps running)"),
                ));
            }
        };
        let mut next = (**sb).clone();
        next.runtime = Some(rt);
        next.transition(SandboxState::Paused)
            .map_err(ControlError::internal_cause("sandbox state"))?;
        next.pause_mode = Some(mode);
        // It is paused whether or not the store takes the record: keep the truth in memory so
        // a connect resumes it, and report the store failure.
        **sb = next;
        self.inner.store.update_sandbox(sb).await?;
        let memory = mode == PauseMode::Memory;
        self.inner
            .events
            .record(
                sb,
                EventKind::Paused,
                Some(serde_json::json!({"memory": memory})),
            )
            .await;
        tracing::info!(sandbox_id = %id, mode = ?mode, "sandbox paused");
        Ok(())
    }

    /// Resumes a paused sandbox (connect holds its lock): the runtime brings it back with the
    /// current access token and env vars, then it is routed again until now + `timeout`.
    pub(crate) async fn resume_locked(
        &self,
        sb: &mut OwnedMutexGuard<Sandbox>,
        timeout: std::time::Duration,
    ) -> Result<(), ControlError> {
        let id = sb.id.clone();
        let mut spec = spec_of(sb)?;
        // The volumes again (after a host restart they are mounted on the host first).
        spec.volumes = self.inner.volumes.mount_sources(&sb.volume_mounts).await?;
        let resumed = self
            .inner
            .runtime
            .resume(spec)
            .instrument(self.stage("runtime.resume"))
            .await;
        let (rt, kind) = match resumed {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(sandbox_id = %id, error = %warren_runtime::chain(&e), "resume failed; sandbox stays paused");
                return Err(self.retryable(
                    e,
                    &format!("resuming sandbox {id} failed (it stays paused; retry)"),
                ));
            }
        };
        let mut next = (**sb).clone();
        next.runtime = Some(rt);
        next.transition(SandboxState::Running)
            .map_err(ControlError::internal_cause("sandbox state"))?;
        let paused_mode = next.pause_mode.take();
        next.end_at = Utc::now() + timeout;
        if let Err(e) = self.inner.store.update_sandbox(&next).await {
            // Not acknowledged: put it back to sleep so record and reality agree again.
            let mode = paused_mode.unwrap_or(PauseMode::Filesystem);
            match self.inner.runtime.pause(&id, mode).await {
                Ok(rt) => {
                    let mut back = (**sb).clone();
                    back.runtime = Some(rt);
                    **sb = back;
                    let _ = self.inner.store.update_sandbox(sb).await;
                }
                Err(pe) => {
                    tracing::error!(sandbox_id = %id, error = %pe, "re-pausing after store failure");
                    **sb = next;
                    self.route_running(sb);
                }
            }
            return Err(e.into());
        }
        **sb = next;
        self.set_wakeable(sb, false);
        self.route_running(sb);
        if paused_mode == Some(PauseMode::Memory) && kind == ResumeKind::Filesystem {
            // E.g. the host rebooted while it was paused: its files are back, its processes
            // started afresh.
            tracing::warn!(sandbox_id = %id, "memory of the paused sandbox was lost; resumed from its files");
        }
        let from_memory = kind != ResumeKind::Filesystem;
        self.inner
            .events
            .record(
                sb,
                EventKind::Resumed,
                Some(serde_json::json!({"memory": from_memory})),
            )
            .await;
        tracing::info!(sandbox_id = %id, kind = ?kind, "sandbox resumed");
        Ok(())
    }

    /// The proxy's lookup: the route of a running sandbox, or, for a paused one whose
    /// lifecycle says `autoResume`, resumes it (default timeout) and returns its new route.
    /// A paused sandbox is woken only by a request `may_wake` lets through (one that would be
    /// authorised once it runs), so strangers cannot make a paused sandbox cost memory again.
    pub async fn route_or_resume(
        &self,
        id: &str,
        may_wake: impl FnOnce(&Access) -> bool,
    ) -> Result<Option<Route>, ControlError> {
        if let Some(route) = self.route(id) {
            return Ok(Some(route));
        }
        match self.wake_access(id) {
            None => return Ok(None),
            Some(access) if !may_wake(&access) => {
                return Err(ControlError::PermissionDenied(format!(
                    "sandbox {id} is paused; only an authorised request resumes it"
                )))
            }
            Some(_) => {}
        }
        let id = id.to_string();
        self.detached(|c| async move {
            let mut sb = match c.locked(&id).await {
                Ok(sb) => sb,
                // Killed while this request waited: the plain "not found" answer.
                Err(ControlError::NotFound(_)) => return Ok(None),
                Err(e) => return Err(e),
            };
            // Another request may have resumed it while this one waited for the lock.
            if sb.state == SandboxState::Paused && sb.lifecycle.auto_resume {
                let timeout = c.inner.config.default_timeout;
                c.resume_locked(&mut sb, timeout).await?;
                tracing::info!(sandbox_id = %id, "sandbox resumed by traffic");
            }
            Ok(c.route(&id))
        })
        .await
    }

    /// What the end time does: pause (`onTimeout = pause`) or kill.
    pub(crate) async fn end_time_reached(&self, id: &str) -> Result<(), ControlError> {
        let id = id.to_string();
        self.detached(|c| async move {
            let mut sb = c.locked(&id).await?;
            if sb.state != SandboxState::Running {
                return Ok(());
            }
            // The end time may have moved (connect, set_timeout) after it was found due.
            if sb.end_at > Utc::now() {
                c.schedule_end(&id, sb.end_at);
                return Ok(());
            }
            if sb.lifecycle.on_timeout == OnTimeout::Pause {
                let mode = c.pause_mode(sb.lifecycle.pause_memory)?;
                match c.pause_locked(&mut sb, mode).await {
                    Ok(()) => {
                        c.forget_eol_failures(&id);
                        return Ok(());
                    }
                    Err(e) => {
                        // Killing would lose what the caller asked to keep, so try again
                        // later; but the sandbox can make its own save fail, and its end
                        // time must hold: after a few attempts it ends.
                        let cfg = &c.inner.config;
                        let failures = c.count_eol_failure(&id);
                        if failures < cfg.end_of_life_pause_attempts {
                            let retry = Utc::now()
                                + chrono::Duration::from_std(cfg.end_of_life_pause_retry)
                                    .unwrap_or(chrono::Duration::seconds(60));
                            c.schedule_end(&id, retry);
                            return Err(e);
                        }
                        tracing::warn!(
                            sandbox_id = %id, attempts = failures, error = %warren_runtime::chain(&e),
                            "pausing at the end time kept failing; the sandbox is killed"
                        );
                    }
                }
            }
            drop(sb);
            c.forget_eol_failures(&id);
            c.kill_now(&id).await
        })
        .await
    }
}

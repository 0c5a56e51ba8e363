//! Creating a sandbox, top to bottom: the request checked against the template, the team's
//! limits and the caller's networks and volumes (`create_now`), then recorded, started by the
//! runtime (a prepared one claimed where the runtime has one), routed and scheduled to end
//! (`create_planned`, which forks share).

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::Utc;
use tracing::Instrument;
use warren_runtime::{CreateSpec, RuntimeError};

use std::sync::Arc;

use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::error::ControlError;
use crate::model::{Lifecycle, Network, Sandbox, SandboxState};
use crate::random::random_secret;
use crate::sandboxes::{lock, team_of, Entry, Sandboxes};
use crate::telemetry::trace_sandbox;

/// What a caller asks for when creating a sandbox.
#[derive(Debug, Clone, Default)]
pub struct CreateRequest {
    pub template: String,
    /// Seconds; `None` = the configured default. Signed so negative input gets a clear error.
    pub timeout: Option<i64>,
    pub metadata: BTreeMap<String, String>,
    pub env_vars: BTreeMap<String, String>,
    pub allow_internet_access: Option<bool>,
    pub lifecycle: Lifecycle,
    pub network: Network,
    /// Private networks to join (Warren's create extension; the metadata key
    /// `warren.networks` asks for more).
    pub networks: Vec<crate::networks::Join>,
    /// Volumes to mount (E2B's `volumeMounts`).
    pub volume_mounts: Vec<crate::volumes::MountRequest>,
    /// The creating key's team; empty means the default team.
    pub team: String,
}

/// A create with everything resolved (from a template, a snapshot or a fork's parent).
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub template: String,
    pub resources: warren_types::Resources,
    pub allow_internet_access: bool,
    pub env_vars: BTreeMap<String, String>,
    pub metadata: BTreeMap<String, String>,
    pub lifecycle: Lifecycle,
    pub network: Network,
    pub team: String,
    pub timeout: Duration,
    /// Runtime snapshot key to start from.
    pub from_snapshot: Option<String>,
    pub volume_mounts: Vec<crate::volumes::VolumeMountRecord>,
}

impl Sandboxes {
    pub(crate) async fn create(&self, req: CreateRequest) -> Result<Sandbox, ControlError> {
        self.timed("create", |c| async move { c.create_now(req).await })
            .await
    }

    async fn create_now(&self, req: CreateRequest) -> Result<Sandbox, ControlError> {
        let template = req.template.trim().to_string();
        if template.is_empty() {
            return Err(ControlError::InvalidArgument(
                "templateID must not be empty".into(),
            ));
        }
        let timeout = self.timeout(req.timeout)?;
        if let Some(k) = req
            .env_vars
            .keys()
            .find(|k| k.is_empty() || k.contains(['=', '\0']))
        {
            return Err(ControlError::InvalidArgument(format!(
                "invalid environment variable name {k:?}"
            )));
        }
        self.check_lifecycle(&req.lifecycle)?;
        self.check_egress(&req.network.egress)?;
        // A sandbox's disk is on the data disk and fills as it writes.
        self.check_headroom()?;
        let mut joins = req.networks.clone();
        joins.extend(crate::networks::joins_from_metadata(&req.metadata)?);
        self.inner
            .networks
            .check_joins(&team_of(&req.team), &joins)?;
        let mounts = self
            .inner
            .volumes
            .resolve_mounts(&team_of(&req.team), &req.volume_mounts)
            .await?;
        let cfg = &self.inner.config;
        // A snapshot id or name is a valid `templateID` (SDKs create from snapshots that way).
        // The template built here that this create spawns from, to count it.
        let mut spawned_from = None;
        let plan = match self.find_snapshot(&template).await? {
            Some(snap) => {
                let mut env_vars = snap.env_vars;
                env_vars.extend(req.env_vars);
                Plan {
                    template: snap.template,
                    resources: snap.resources,
                    allow_internet_access: req
                        .allow_internet_access
                        .unwrap_or(snap.allow_internet_access),
                    env_vars,
                    metadata: req.metadata,
                    lifecycle: req.lifecycle,
                    network: req.network,
                    team: team_of(&req.team),
                    timeout,
                    from_snapshot: Some(snap.key),
                    // A snapshot's sandboxes mount its volumes unless the create names others.
                    volume_mounts: if req.volume_mounts.is_empty() {
                        snap.volume_mounts
                    } else {
                        mounts
                    },
                }
            }
            None => {
                // A template built here runs on the image of the build its tag names; its
                // resources are the template's.
                let (image, built) = self
                    .inner
                    .templates
                    .resolve_template(&template, Some(&team_of(&req.team)))
                    .await?;
                let resources = match &built {
                    Some(t) => t.resources,
                    None => cfg.default_resources(),
                };
                spawned_from = built.map(|t| t.id);
                Plan {
                    template: image,
                    resources,
                    allow_internet_access: req.allow_internet_access.unwrap_or(true),
                    env_vars: req.env_vars,
                    metadata: req.metadata,
                    lifecycle: req.lifecycle,
                    network: req.network,
                    team: team_of(&req.team),
                    timeout,
                    from_snapshot: None,
                    volume_mounts: mounts,
                }
            }
        };
        let sandbox = self.create_planned(plan).await?;
        if let Some(id) = spawned_from {
            self.inner.templates.count_spawn(&id).await;
        }
        if let Err(e) = self
            .inner
            .networks
            .join_all(self, &sandbox.team, &sandbox.id, &joins)
            .await
        {
            // Not acknowledged: a sandbox outside the networks it asked for is not what the
            // caller wanted.
            if let Err(k) = self.kill_now(&sandbox.id).await {
                tracing::warn!(sandbox_id = %sandbox.id, error = %k, "killing a sandbox whose networks failed");
            }
            return Err(e);
        }
        Ok(sandbox)
    }

    /// Records, creates and registers one sandbox as `plan` says.
    pub(crate) async fn create_planned(&self, plan: Plan) -> Result<Sandbox, ControlError> {
        let cfg = &self.inner.config;
        let timeout = plan.timeout;
        let volumes = self
            .inner
            .volumes
            .mount_sources(&plan.volume_mounts)
            .await?;
        // A sandbox the runtime started ahead, where it has one: the create only claims it.
        let reservation = if plan.from_snapshot.is_none() && volumes.is_empty() {
            self.inner.runtime.reserve_prepared(&plan.template).await
        } else {
            None
        };
        let id = match &reservation {
            Some(r) => r.id().clone(),
            None => warren_types::SandboxId::generate()
                .map_err(|e| ControlError::internal(format!("no randomness available: {e}")))?,
        };
        let now = Utc::now();
        let sandbox = Sandbox {
            id,
            template: plan.template,
            state: SandboxState::Pending,
            failure: None,
            resources: plan.resources,
            allow_internet_access: plan.allow_internet_access,
            metadata: plan.metadata,
            started_at: now,
            end_at: now + timeout,
            envd_access_token: random_secret("ea_")?,
            traffic_access_token: random_secret("ta_")?,
            runtime: None,
            env_vars: plan.env_vars,
            lifecycle: plan.lifecycle,
            pause_mode: None,
            network: plan.network,
            team: plan.team,
            volume_mounts: plan.volume_mounts,
        };

        // Reserve a slot and hold the sandbox's lock for the whole creation, so a concurrent
        // kill/get of this id waits for the outcome instead of seeing a half-made sandbox.
        let entry: Entry = Arc::new(Mutex::new(sandbox.clone()));
        let mut guard: OwnedMutexGuard<Sandbox> = entry
            .clone()
            .try_lock_owned()
            .map_err(|_| ControlError::internal("fresh sandbox lock was taken"))?;
        {
            let mut live = lock(&self.inner.live);
            if live.len() >= cfg.max_concurrent {
                return Err(ControlError::ResourceExhausted {
                    message: format!(
                        "concurrent sandbox limit of {} reached; retry later",
                        cfg.max_concurrent
                    ),
                    retry_after: cfg.retry_after,
                });
            }
            live.insert(sandbox.id.to_string(), entry.clone());
        }
        let release = |c: &Sandboxes| {
            lock(&c.inner.live).remove(sandbox.id.as_str());
        };

        if let Err(e) = self.inner.store.insert_sandbox(&sandbox).await {
            release(self);
            return Err(e.into());
        }

        let mut spec = spec_of(&sandbox)?;
        spec.from_snapshot = plan.from_snapshot;
        spec.volumes = volumes;
        spec.reservation = reservation;
        trace_sandbox(&sandbox.id);
        let created = self
            .inner
            .runtime
            .create(spec)
            .instrument(self.stage("runtime.create"))
            .await;
        let sb = &mut *guard;
        match created {
            Ok(rt) => {
                sb.runtime = Some(rt);
                sb.transition(SandboxState::Running)
                    .map_err(ControlError::internal_cause("sandbox state"))?;
                // The timeout counts from when the sandbox is usable, not from the request.
                let now = Utc::now();
                sb.started_at = now;
                sb.end_at = now + timeout;
                if let Err(e) = self.inner.store.update_sandbox(sb).await {
                    // Not acknowledged, so it must not keep running unrecorded.
                    if let Err(k) = self.inner.runtime.kill(&sb.id).await {
                        tracing::error!(sandbox_id = %sb.id, error = %k, "kill after store failure");
                    }
                    release(self);
                    return Err(e.into());
                }
                tracing::info!(sandbox_id = %sb.id, template = %sb.template, "sandbox running");
                let out = sb.clone();
                self.inner
                    .events
                    .record(&out, crate::events::EventKind::Created, None)
                    .await;
                self.register(&out, Some(entry.clone()));
                Ok(out)
            }
            Err(e) => {
                sb.fail(format!("creation failed: {e}"));
                if let Err(se) = self.inner.store.update_sandbox(sb).await {
                    tracing::error!(sandbox_id = %sb.id, error = %se, "recording failed creation");
                }
                release(self);
                tracing::warn!(sandbox_id = %sb.id, error = %warren_runtime::chain(&e), "sandbox creation failed");
                Err(match e {
                    RuntimeError::UnknownTemplate(t) => {
                        ControlError::NotFound(format!("template '{t}' not found"))
                    }
                    other => self.runtime_error(other, "sandbox creation failed"),
                })
            }
        }
    }
}

/// The runtime create spec of a recorded sandbox, with its current access token (create,
/// resume; a fork's children change `from_snapshot`). Fails only for a record whose id breaks
/// the sandbox-id rule (every id is generated by it: a damaged store).
pub(crate) fn spec_of(sb: &Sandbox) -> Result<CreateSpec, ControlError> {
    let id = sb
        .id
        .parse()
        .map_err(|e| ControlError::internal(format!("recorded sandbox: {e}")))?;
    Ok(CreateSpec {
        volumes: Vec::new(),
        id,
        template: sb.template.clone(),
        resources: sb.resources,
        allow_internet_access: sb.allow_internet_access,
        egress: sb.network.egress.clone(),
        env_vars: sb.env_vars.clone(),
        access_token: Some(sb.envd_access_token.clone()),
        from_snapshot: None,
        reservation: None,
    })
}

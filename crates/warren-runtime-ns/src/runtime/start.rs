//! Starting a sandbox's processes, and handing a started sandbox to its tenant: the two
//! halves of a create, which a prepared sandbox (see `prepared`) does at different times.

use std::net::SocketAddr;

use tracing::Instrument;
use warren_host::cgroup::Limits;
use warren_host::{agent, TemplateRoot};
use warren_net::Slot;
use warren_runtime::{CreateSpec, RuntimeError, RuntimeSandbox, VolumeMount};

use super::{tagged, Live, NsRuntime, Record};
use crate::launch::{self, LaunchSpec, Sandbox, Seed};

/// What one sandbox is started with.
pub(super) struct Start<'a> {
    pub id: &'a str,
    pub template: &'a str,
    pub limits: Limits,
    pub writable_bytes: u64,
    pub slot: &'a Slot,
    /// Held by the sandbox for its life, so the template stays mounted for the next create.
    pub image_root: TemplateRoot,
    /// A saved writable layer to start from (resume, snapshot); `None`: empty.
    pub seed: Option<Seed>,
    pub id_base: u32,
    /// The token the agent requires from its first request on.
    pub token: Option<&'a str>,
    pub volumes: &'a [VolumeMount],
}

/// The cgroup limits `spec` asks for.
pub(super) fn limits_of(spec: &CreateSpec) -> Limits {
    Limits {
        cpu_millis: Some(spec.resources.cpu_count.max(1) * 1000),
        memory_bytes: Some(u64::from(spec.resources.memory_mb.max(64)) << 20),
        pids: Some(4096),
    }
}

/// The size of the writable layer `spec` asks for.
pub(super) fn writable_of(spec: &CreateSpec) -> u64 {
    u64::from(spec.resources.disk_mb.max(64)) << 20
}

impl NsRuntime {
    /// Starts the sandbox's processes; returns once its PID 1 is about to exec the agent.
    pub(super) async fn launch_one(&self, s: Start<'_>) -> Result<Sandbox, RuntimeError> {
        let template_launch = warren_template::launch(s.template, &self.cfg.data_dir)
            .map_err(|e| warren_host::image_error(s.template, e))?;
        let launch_spec = LaunchSpec {
            id: s.id.to_string(),
            image_root: s.image_root.path().to_path_buf(),
            netns: s.slot.netns_path(),
            resolv_conf: s.slot.resolv_conf().to_string(),
            limits: s.limits,
            writable_bytes: s.writable_bytes,
            agent_args: vec![
                "--listen".into(),
                warren_types::AGENT_LISTEN.into(),
                "--default-user".into(),
                template_launch.default_user.clone(),
            ],
            seed: s.seed,
            id_base: s.id_base,
            access_token: s.token.map(str::to_string),
            nested_namespaces: false,
            volumes: s.volumes.to_vec(),
        };
        let mut sandbox = launch::launch(&self.ns, &launch_spec)
            .instrument(tracing::info_span!("sandbox.launch"))
            .await
            .map_err(|e| RuntimeError::unavailable(format!("start sandbox {}", s.id), e))?;
        sandbox.hold_image(s.image_root);
        // From before the template's start command: what it runs is the sandbox's too.
        self.procs.watch(s.id, s.id_base, sandbox.cgroup.pids());
        Ok(sandbox)
    }

    /// Hands a started sandbox to `spec`'s tenant: initialises its agent (env vars, the
    /// tenant's token in place of `current_token`) once it answers, then runs the template's
    /// start command (the code interpreter's service), which create waits for.
    pub(super) async fn hand_over(
        &self,
        spec: &CreateSpec,
        sandbox: &Sandbox,
        slot: &Slot,
        current_token: Option<&str>,
    ) -> Result<(), RuntimeError> {
        let template_launch = warren_template::launch(&spec.template, &self.cfg.data_dir)
            .map_err(|e| warren_host::image_error(&spec.template, e))?;
        let env = warren_host::agent::sandbox_env(spec);
        let agent = SocketAddr::V4(slot.agent_endpoint());
        let init = agent::InitArgs {
            env_vars: &env,
            // An empty token lifts the requirement (a sandbox created without `secure`).
            access_token: Some(spec.access_token.as_deref().unwrap_or("")),
            current_token,
            signed_url_max_age: self.cfg.signed_url_max_age,
            timeout: self.cfg.ready_timeout,
            launch: &template_launch,
            ca_bundle: self.cfg.ca_bundle(),
            volume_mounts: &[],
        };
        if let Err(e) = agent::wait_and_init(&self.client, agent, &init).await {
            let what = match sandbox.exit_status() {
                Some(w) => format!("sandbox {} did not get ready ({w})", spec.id),
                None => format!("sandbox {} did not get ready", spec.id),
            };
            return Err(RuntimeError::unavailable(what, e));
        }
        if let Some(cmd) = &template_launch.start {
            agent::run_start_command(&self.client, agent, spec.access_token.as_deref(), cmd)
                .await?;
        }
        Ok(())
    }

    /// Starts `spec`'s sandbox on `slot` and hands it over; nothing of it is left on failure.
    pub(super) async fn start_sandbox(
        &self,
        spec: &CreateSpec,
        slot: &Slot,
        image_root: TemplateRoot,
        seed: Option<Seed>,
        id_base: u32,
    ) -> Result<Sandbox, RuntimeError> {
        let sandbox = self
            .launch_one(Start {
                id: &spec.id,
                template: &spec.template,
                limits: limits_of(spec),
                writable_bytes: writable_of(spec),
                slot,
                image_root,
                seed,
                id_base,
                token: spec.access_token.as_deref(),
                volumes: &spec.volumes,
            })
            .await?;
        // The agent has required the token since it started (nsinit handed it over).
        match self
            .hand_over(spec, &sandbox, slot, spec.access_token.as_deref())
            .await
        {
            Ok(()) => Ok(sandbox),
            Err(e) => {
                let _ = sandbox.destroy().await;
                Err(e)
            }
        }
    }

    /// Records a sandbox that now runs for its tenant as live; returns what the control plane
    /// keeps of it.
    pub(super) async fn register_running(
        &self,
        id: String,
        template: &str,
        sandbox: Sandbox,
        slot: Slot,
    ) -> Result<RuntimeSandbox, RuntimeError> {
        let record = Record::running(sandbox.pid1, &slot, Some(template.to_string()));
        let out = RuntimeSandbox {
            id: id.clone(),
            agent: SocketAddr::V4(slot.agent_endpoint()),
            record: tagged(&record)?,
        };
        let template = Some(template.to_string());
        self.live.lock().await.insert(
            id,
            Live {
                sandbox,
                slot,
                template,
            },
        );
        Ok(out)
    }
}

//! [`Control`]: the control plane as the server holds it, a thin façade over the services.
//!
//! Each aggregate is a service that owns its state and is handed its collaborators when it is
//! built; the order below is the dependency order (leaves first), so there is no circle:
//! secrets, webhooks → events, keys, volumes, networks, templates, audit → sandboxes. Handlers
//! never hold a service: they reach the domain through [`Control::tenant`], the caller's
//! scope. What is left here is what the server needs outside any one key's scope: the
//! proxy's route lookup, metrics, signed upload and volume-content URLs, and the brokered
//! secrets of the egress proxy.

use std::sync::Arc;
use std::time::Instant;

use warren_runtime::SandboxRuntime;

use crate::audit::Audit;
use crate::config::Config;
use crate::error::ControlError;
use crate::events::Events;
use crate::keys::Keys;
use crate::networks::Networks;
use crate::sandboxes::{Access, Parts, Route, Sandboxes};
use crate::secrets::Secrets;
use crate::store::Store;
use crate::telemetry::{OperationObserver, SandboxCounts};
use crate::templates::Templates;
use crate::volumes::Volumes;
use crate::webhooks::Webhooks;

/// The services, built once in dependency order.
pub(crate) struct Services {
    pub(crate) secrets: Secrets,
    pub(crate) webhooks: Arc<Webhooks>,
    pub(crate) events: Arc<Events>,
    pub(crate) keys: Keys,
    pub(crate) volumes: Arc<Volumes>,
    pub(crate) networks: Arc<Networks>,
    pub(crate) templates: Arc<Templates>,
    pub(crate) audit: Arc<Audit>,
    pub(crate) sandboxes: Sandboxes,
}

/// The control plane. Cheap to clone.
#[derive(Clone)]
pub struct Control {
    services: Arc<Services>,
}

impl Control {
    /// A control plane over `store` and `runtime`, to be given its other ports before it
    /// starts ([`crate::ControlBuilder::start`]).
    pub fn builder(
        store: Arc<dyn Store>,
        runtime: Arc<dyn SandboxRuntime>,
        config: Config,
    ) -> crate::builder::ControlBuilder {
        crate::builder::ControlBuilder::new(store, runtime, config)
    }

    /// Starts a control plane with no other port: no template builds, no volumes, no guest
    /// metrics, no webhooks, no audit export (what tests of the rest need).
    pub async fn start(
        store: Arc<dyn Store>,
        runtime: Arc<dyn SandboxRuntime>,
        config: Config,
    ) -> Result<Control, ControlError> {
        Self::builder(store, runtime, config).start().await
    }

    pub(crate) async fn start_built(
        built: crate::builder::ControlBuilder,
    ) -> Result<Control, ControlError> {
        let crate::builder::ControlBuilder {
            store,
            runtime,
            config,
            templates,
            volumes,
            guest_metrics,
            audit_observer,
            webhooks,
        } = built;
        let secrets = Secrets::new(store.clone(), config.max_secrets);
        let webhooks = Arc::new(Webhooks::new(store.clone(), webhooks));
        let events = Arc::new(Events::new(store.clone(), vec![webhooks.clone()]));
        let keys = Keys::new(store.clone());
        let volumes = Arc::new(Volumes::new(
            store.clone(),
            volumes,
            runtime.clone(),
            crate::volumes::VolumeLimits::of(&config),
        ));
        let networks = Arc::new(Networks::new(
            store.clone(),
            runtime.clone(),
            config.network_range,
        ));
        let templates = Arc::new(Templates::new(
            store.clone(),
            runtime.clone(),
            templates,
            &config,
        )?);
        let audit = Arc::new(Audit::new(
            store.clone(),
            store.clone(),
            runtime.clone(),
            guest_metrics.clone(),
            audit_observer,
            crate::audit::AuditSettings {
                enabled: config.audit,
                budget: config.audit_budget.clone(),
                min_free_inodes: config.min_free_inodes,
            },
        ));
        let sandboxes = Sandboxes::recovered(Parts {
            store,
            runtime,
            config,
            guest_metrics,
            templates: templates.clone(),
            volumes: volumes.clone(),
            networks: networks.clone(),
            events: events.clone(),
            audit: audit.clone(),
        })
        .await?;
        sandboxes.start_tasks();
        webhooks.start(sandboxes.shutdown_token().clone());
        Ok(Control {
            services: Arc::new(Services {
                secrets,
                webhooks,
                events,
                keys,
                volumes,
                networks,
                templates,
                audit,
                sandboxes,
            }),
        })
    }

    pub fn config(&self) -> &Config {
        self.sandboxes().config()
    }

    /// Stops the background tasks (sandboxes keep running; a restart reattaches them).
    pub fn shutdown(&self) {
        self.sandboxes().shutdown();
    }

    /// The runtime's name and what it can keep, for API callers.
    pub fn runtime_info(&self) -> (&'static str, warren_runtime::Capabilities) {
        self.sandboxes().runtime_info()
    }

    /// Where the proxy should send traffic for `id`, if it is running.
    pub fn route(&self, id: &str) -> Option<Route> {
        self.sandboxes().route(id)
    }

    /// The proxy's lookup: the route of a running sandbox, or, for a paused one whose
    /// lifecycle says `autoResume`, resumes it (default timeout) and returns its new route.
    /// A paused sandbox is woken only by a request `may_wake` lets through.
    pub async fn route_or_resume(
        &self,
        id: &str,
        may_wake: impl FnOnce(&Access) -> bool,
    ) -> Result<Option<Route>, ControlError> {
        self.sandboxes().route_or_resume(id, may_wake).await
    }

    /// API keys: checked on every request, made and revoked by the operator.
    pub fn keys(&self) -> &Keys {
        &self.services.keys
    }

    /// Accepts an upload made to a URL the templates service signed (no API key: the URL is
    /// the credential).
    pub async fn accept_upload(
        &self,
        template_id: &str,
        hash: &str,
        team: &str,
        expires: i64,
        token: &str,
        body: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    ) -> Result<(), ControlError> {
        self.services
            .templates
            .accept_upload(template_id, hash, team, expires, token, body)
            .await
    }

    /// Removes the volumes and snapshots on the host that no record names: what a crash
    /// between a disk's creation and its record (or a record's removal and its disk's) left.
    /// Call it before serving (nothing may be created meanwhile). Returns how many went.
    pub async fn sweep_volumes(&self) -> Result<usize, ControlError> {
        self.services.volumes.sweep().await
    }

    /// The volume whose content-API token is `token` (`id` is the path's volume id).
    /// Wrong tokens and unknown ids look the same.
    pub async fn volume_by_token(
        &self,
        id: &str,
        token: &str,
    ) -> Result<crate::volumes::Volume, ControlError> {
        self.services.volumes.by_token(id, token).await
    }

    /// The value of the secret `name` of the team that owns `sandbox_id`, for the egress
    /// proxy brokering one of that sandbox's requests (`None`: no such sandbox or secret).
    pub async fn brokered_secret(&self, sandbox_id: &str, name: &str) -> Option<String> {
        let team = self.sandboxes().team_of_sandbox(sandbox_id).await?;
        self.services
            .secrets
            .brokered(sandbox_id, &team, name)
            .await
    }

    /// Counts one command run through the proxy for Prometheus.
    pub fn observe_exec(&self, started: Instant, failure: Option<String>) {
        self.sandboxes().observe_exec(started, failure);
    }

    /// Hands every finished operation to `observer` too (OpenTelemetry).
    pub fn observe_operations_with(&self, observer: Arc<dyn OperationObserver>) {
        self.sandboxes().observe_operations_with(observer);
    }

    /// How many sandboxes are in each state, per team.
    pub async fn sandbox_counts(&self) -> Result<SandboxCounts, ControlError> {
        self.sandboxes().sandbox_counts().await
    }

    /// `GET /metrics` for Prometheus.
    pub async fn prometheus_text(&self) -> Result<String, ControlError> {
        self.sandboxes().prometheus_text().await
    }
}

/// The services, for this crate's scoped entry points ([`crate::Tenant`]).
impl Control {
    pub(crate) fn sandboxes(&self) -> &Sandboxes {
        &self.services.sandboxes
    }

    pub(crate) fn secrets(&self) -> &Secrets {
        &self.services.secrets
    }

    pub(crate) fn webhooks(&self) -> &Webhooks {
        &self.services.webhooks
    }

    pub(crate) fn events(&self) -> &Events {
        &self.services.events
    }

    pub(crate) fn volumes(&self) -> &Volumes {
        &self.services.volumes
    }

    pub(crate) fn networks(&self) -> &Networks {
        &self.services.networks
    }

    pub(crate) fn templates(&self) -> &Arc<Templates> {
        &self.services.templates
    }

    pub(crate) fn audit(&self) -> &Audit {
        &self.services.audit
    }
}

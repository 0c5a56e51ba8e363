//! [`ControlBuilder`]: the control plane is given every port it uses before it starts, once.
//!
//! A port left out is a feature this server does not offer (no builder: template builds are
//! refused with 503; no volume disks: volume operations are; no guest metrics: samples carry
//! only what the runtime sees; no webhook sender: nothing is queued; no audit observer: the
//! trail is kept but not exported). Nothing is bound later, so nothing can run half-wired.

use std::sync::Arc;

use warren_runtime::SandboxRuntime;

use crate::audit::AuditObserver;
use crate::config::Config;
use crate::control::Control;
use crate::error::ControlError;
use crate::store::Store;
use crate::templates::port::TemplateBuilder;
use crate::usage::GuestMetrics;
use crate::volumes::VolumeDisks;
use crate::webhooks::WebhookSender;

/// The ports of a control plane about to start. Made by [`Control::builder`].
pub struct ControlBuilder {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) runtime: Arc<dyn SandboxRuntime>,
    pub(crate) config: Config,
    pub(crate) templates: Option<Arc<dyn TemplateBuilder>>,
    pub(crate) volumes: Option<Arc<dyn VolumeDisks>>,
    pub(crate) guest_metrics: Option<Arc<dyn GuestMetrics>>,
    pub(crate) audit_observer: Option<Arc<dyn AuditObserver>>,
    pub(crate) webhooks: Option<Arc<dyn WebhookSender>>,
}

impl ControlBuilder {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        runtime: Arc<dyn SandboxRuntime>,
        config: Config,
    ) -> Self {
        Self {
            store,
            runtime,
            config,
            templates: None,
            volumes: None,
            guest_metrics: None,
            audit_observer: None,
            webhooks: None,
        }
    }

    /// What runs template builds.
    pub fn templates(mut self, builder: Arc<dyn TemplateBuilder>) -> Self {
        self.templates = Some(builder);
        self
    }

    /// The host's volume storage.
    pub fn volumes(mut self, disks: Arc<dyn VolumeDisks>) -> Self {
        self.volumes = Some(disks);
        self
    }

    /// Reads the agents' own view of their sandboxes (metrics, journals); with it, running
    /// sandboxes are sampled from the start.
    pub fn guest_metrics(mut self, guest: Arc<dyn GuestMetrics>) -> Self {
        self.guest_metrics = Some(guest);
        self
    }

    /// Is handed every audit entry first kept from the start on.
    pub fn audit_observer(mut self, observer: Arc<dyn AuditObserver>) -> Self {
        self.audit_observer = Some(observer);
        self
    }

    /// Posts webhook deliveries; with it, deliveries run from the start.
    pub fn webhooks(mut self, sender: Arc<dyn WebhookSender>) -> Self {
        self.webhooks = Some(sender);
        self
    }

    /// Starts the control plane: reattaches to the sandboxes the store says are running
    /// (marking the others failed with the reason), then starts the background work: the
    /// expiry and exit watchers, sampling and webhook deliveries where their ports are given.
    pub async fn start(self) -> Result<Control, ControlError> {
        Control::start_built(self).await
    }
}

//! The templates service: templates built here, their builds, tags and disk, and the one place
//! a `templateID` is resolved to the image a sandbox runs on.
//!
//! - `records.rs`: what a template, a build and a log entry are, and the name rules.
//! - `builds.rs`: register, upload, trigger, run and report builds; find, resolve, list,
//!   publish and delete templates.
//! - `tags.rs`: tags beyond `default`, and the spawn counters.
//! - `disk.rs`: what builds keep on disk, and pruning.
//! - `port.rs`: the [`TemplateBuilder`] port that does the building.
//!
//! Templates depend on no other service. Whether sandboxes or snapshots still use an image
//! (which refuses a delete and keeps an image from a prune) is asked through [`ImageUsers`],
//! which the sandboxes' side implements.

pub(crate) mod builds;
pub(crate) mod disk;
pub(crate) mod port;
mod records;
pub(crate) mod tags;

pub use records::*;

use std::sync::Arc;

use async_trait::async_trait;
use warren_runtime::SandboxRuntime;

use crate::config::Config;
use crate::error::ControlError;
use crate::store::TemplateStore;
use builds::BuildState;
use port::TemplateBuilder;

/// What templates need to know of sandboxes and snapshots.
#[async_trait]
pub(crate) trait ImageUsers: Send + Sync {
    /// Ids of live sandboxes running on one of `images` (runtime template keys).
    async fn sandboxes_on(&self, images: &[String]) -> Vec<String>;
    /// A snapshot whose base is one of `images`, if any.
    async fn snapshot_on(&self, images: &[String]) -> Result<Option<String>, ControlError>;
    /// Every image a sandbox that is not gone or a snapshot uses.
    async fn images_used(&self) -> Result<Vec<String>, ControlError>;
}

/// Sizes builds keep to, from the server's configuration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TemplateLimits {
    pub max_template_cpu: u32,
    pub max_template_memory_mb: u32,
    /// A template's disk, and the least a build asks for.
    pub disk_mb: u32,
}

/// Templates, builds and tags. Made once at start; cheap to share (`Arc`).
pub(crate) struct Templates {
    store: Arc<dyn TemplateStore>,
    runtime: Arc<dyn SandboxRuntime>,
    /// The runtime's own templates (`base`, ...): never built here, never shadowed.
    catalog: Vec<String>,
    limits: TemplateLimits,
    builds: BuildState,
    /// Held while a template's record is read, changed and written back (tags, counters), so
    /// two such updates never lose one another's change.
    docs: tokio::sync::Mutex<()>,
}

impl Templates {
    pub(crate) fn new(
        store: Arc<dyn TemplateStore>,
        runtime: Arc<dyn SandboxRuntime>,
        builder: Option<Arc<dyn TemplateBuilder>>,
        config: &Config,
    ) -> Result<Self, ControlError> {
        Ok(Self {
            store,
            runtime,
            catalog: config.template_names.clone(),
            limits: TemplateLimits {
                max_template_cpu: config.max_template_cpu,
                max_template_memory_mb: config.max_template_memory_mb,
                disk_mb: config.disk_mb,
            },
            builds: BuildState::new(builder)?,
            docs: tokio::sync::Mutex::new(()),
        })
    }
}

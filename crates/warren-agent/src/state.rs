//! Shared agent state: configuration set by `/init`, the process table and the watchers.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use crate::fs::watch::Watchers;
use crate::journal::Journal;
use crate::process::table::ProcessTable;

/// Settings the control plane may change at run time through `POST /init`.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// When set, every request (but the health check and signed file URLs) must carry it.
    pub access_token: Option<String>,
    /// User for requests that name none.
    pub default_user: String,
    /// Directory for requests whose path or cwd is empty.
    pub default_workdir: Option<PathBuf>,
    /// Sandbox-wide environment variables given to every process.
    pub env_vars: BTreeMap<String, String>,
    /// When set, a signed file URL must carry an expiration at most this many seconds from
    /// the time of the request (see `http::signing::SigningPolicy`). `None`: no limit, as
    /// upstream.
    pub signed_url_max_age_secs: Option<u64>,
}

/// Everything the handlers share. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub settings: Arc<RwLock<Settings>>,
    pub processes: Arc<ProcessTable>,
    pub watchers: Arc<Watchers>,
    /// What happened, for the control plane's audit trail and logs.
    pub journal: Arc<Journal>,
    /// Whether `/init` may set the wall clock (true only inside a sandbox, never on a dev host).
    pub sync_clock: bool,
}

impl AppState {
    pub fn new(settings: Settings, sync_clock: bool) -> Self {
        Self {
            settings: Arc::new(RwLock::new(settings)),
            processes: Arc::new(ProcessTable::default()),
            watchers: Arc::new(Watchers::default()),
            journal: Arc::new(Journal::default()),
            sync_clock,
        }
    }

    pub fn settings(&self) -> Settings {
        self.settings
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

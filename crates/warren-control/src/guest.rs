//! The port through which the control plane reads what a sandbox's agent says of itself: its
//! resources (for usage samples) and its journal (for the audit trail). The server implements
//! it through its proxy.

use async_trait::async_trait;

use crate::Sandbox;

/// What a sandbox's agent says about its own resources (envd's `/metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GuestView {
    pub cpu_used_pct: f64,
    pub mem_used: u64,
    pub mem_cache: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

/// Reads a running sandbox's [`GuestView`] (the server does it through its proxy, bounded in
/// time and size: the answer comes from inside the sandbox).
#[async_trait]
pub trait GuestMetrics: Send + Sync {
    async fn read(&self, sandbox: &Sandbox) -> Result<GuestView, String>;

    /// The agent's journal after position `after` (see `crate::audit`).
    async fn journal(
        &self,
        sandbox: &Sandbox,
        after: u64,
        limit: usize,
    ) -> Result<warren_proto::journal::JournalPage, String> {
        let _ = (sandbox, after, limit);
        Err("this server does not read agents' journals".into())
    }
}

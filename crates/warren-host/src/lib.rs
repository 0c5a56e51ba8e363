//! Host facilities both sandbox runtimes share: the host's settings ([`HostConfig`]), cgroups,
//! durable directories, the one-manager-per-host lock, the registry of mounted template
//! images, the client of the guest agent, and the host prerequisites checked at start.
//!
//! The runtimes themselves live in `warren-runtime-ns` (namespace containers) and
//! `warren-runtime-vm` (QEMU microVMs); both implement `warren_runtime::SandboxRuntime`.

pub mod agent;
pub mod cgroup;
mod config;
pub mod durable;
pub mod egress;
pub mod hardening;
mod lock;
mod templates;

pub use config::{default_agent, is_static_elf, HostConfig};
pub use lock::HostLock;
pub use templates::{image_error, image_of, TemplateRoot, Templates};

/// Sandbox ids become host names, cgroup and directory names: lowercase letters and digits.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 63
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Records handed to `reattach`, each with its runtime's own record parsed (`None` when it
/// cannot be: a damaged store, or a record of another release).
pub fn parse_records<R: serde::de::DeserializeOwned>(
    records: Vec<warren_runtime::RuntimeSandbox>,
) -> Vec<(warren_runtime::RuntimeSandbox, Option<R>)> {
    records
        .into_iter()
        .map(|r| {
            let rec = serde_json::from_value::<R>(r.record.clone()).ok();
            (r, rec)
        })
        .collect()
}

/// Free bytes and inodes of the filesystem holding `dir` (both runtimes save there).
pub fn headroom(dir: &std::path::Path) -> Option<warren_runtime::Headroom> {
    match nix::sys::statvfs::statvfs(dir) {
        Ok(s) => Some(warren_runtime::Headroom {
            free_bytes: s.blocks_available().saturating_mul(s.fragment_size()),
            free_inodes: s.files_available(),
        }),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "statvfs of the data dir failed");
            None
        }
    }
}

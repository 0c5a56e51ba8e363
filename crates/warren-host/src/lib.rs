//! Host facilities both sandbox runtimes share: the host's settings ([`HostConfig`]), cgroups,
//! durable directories, the one-manager-per-host lock, the registry of mounted template
//! images, the client of the guest agent, the records sandboxes are taken back from after a
//! restart, detached (id-mapped) bind mounts, and the host prerequisites checked at start.
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
pub mod mount;
mod records;
mod templates;

pub use config::{default_agent, is_static_elf, HostConfig};
pub use lock::HostLock;
pub use records::{
    adopt_slots, parse_records, split_records, start_adopting, Outcomes, Parsed, SlotRecord,
};
pub use templates::{image_error, image_of, TemplateRoot, Templates};

/// A create's network slot could not be had. Every slot in use is exhaustion (429: retry
/// later); anything else (an `ip` or `nft` that failed, the host's table gone, a tool missing)
/// is the host being unable to serve, 503 with its cause, which a retry soon will not fix.
pub fn slot_error(e: warren_net::Error) -> warren_runtime::RuntimeError {
    match e {
        warren_net::Error::Exhausted { .. } => {
            warren_runtime::RuntimeError::Exhausted(format!("no network slot: {e}"))
        }
        e => warren_runtime::RuntimeError::unavailable("get a network slot", e),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use warren_runtime::Category;

    #[test]
    fn only_a_full_pool_is_exhaustion_and_other_slot_failures_keep_their_cause() {
        let full = slot_error(warren_net::Error::Exhausted { max: 16 });
        assert_eq!(full.category(), Category::Exhausted);
        assert!(
            full.to_string().contains("All 16 network slots are in use"),
            "{full}"
        );

        let broken = slot_error(warren_net::Error::PrefixInUse {
            prefix: "warren".into(),
            path: "/run/warren/net/warren.lock".into(),
        });
        assert_eq!(broken.category(), Category::Unavailable);
        let cause = std::error::Error::source(&broken).expect("the cause is kept");
        assert!(
            cause.to_string().contains("in use by another pool"),
            "{cause}"
        );
    }
}

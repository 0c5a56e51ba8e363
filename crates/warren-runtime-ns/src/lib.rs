//! The namespace runtime: sandboxes as Linux namespace containers, for hosts with or without
//! hardware virtualisation.
//!
//! A sandbox is the guest agent as PID 1 of new user, pid, mount, net, uts, ipc and cgroup
//! namespaces; its root is the template image (read-only, id-mapped) under a bounded writable
//! layer; cgroups bound its CPU, memory and pids; a seccomp allow-list and a reduced capability
//! bounding set confine it; each sandbox has a host id range of its own (`idrange`).
//! [`NsRuntime`] implements the runtime trait on top; `launch` is the manager's side of one
//! sandbox, `nsinit` runs in the helper binary `warren-nsinit`.

pub mod caps;
pub mod config;
pub mod disk;
pub mod idrange;
pub mod launch;
pub mod layer;
pub mod lxcfs;
pub mod nsinit;
mod reap;
mod rootfs;
mod runtime;
pub mod seccomp;
mod stage;
mod sys;

pub use runtime::{ns_config, NsRuntime, NsSettings};

//! The `filesystem.Filesystem` service.

pub mod entry;
pub mod identity;
pub mod metadata;
pub mod ops;
pub mod service;
pub mod watch;
pub mod watchers;

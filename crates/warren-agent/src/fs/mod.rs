//! The `filesystem.Filesystem` service.

pub mod service;
pub mod watch;

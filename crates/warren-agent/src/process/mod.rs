//! The `process.Process` service: commands and terminals run as sandbox users.
//!
//! `spawn` starts programs (pipes or a pseudo-terminal, own process group, run-as user),
//! `table` tracks them and fans their output out to every attached stream, `service` speaks
//! the RPCs.

pub mod audit;
pub mod pty;
pub mod service;
pub mod spawn;
pub mod table;

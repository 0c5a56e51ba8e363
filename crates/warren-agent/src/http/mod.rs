//! The agent's plain HTTP endpoints (everything that is not Connect-RPC).

pub mod files;
pub mod manage;
pub mod metrics;
pub mod signing;

//! The agent's plain HTTP endpoints (everything that is not Connect-RPC).

mod compressible;
pub mod files;
mod headers;
pub mod manage;
pub mod metrics;
pub mod signing;
mod xattrs;

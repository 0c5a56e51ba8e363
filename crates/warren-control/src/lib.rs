//! Warren's control-plane domain.
//!
//! This crate decides and records: it owns the sandbox lifecycle state machine, expiry at
//! `end_at`, API keys, access tokens, listing and the concurrency limit. It reaches the outside
//! world only through two traits: [`Store`] (durable records; SQLite today, PostgreSQL later)
//! and [`warren_runtime::SandboxRuntime`] (makes sandboxes exist). It has no HTTP and no SQL in
//! it; `tests/layering.rs` checks that with `cargo tree`.

#![forbid(unsafe_code)]

mod control;
mod error;
mod expiry;
mod keys;
mod list;
mod model;
mod recover;
mod secrets;
mod store;

pub use control::{Config, Control, CreateRequest, Route};
pub use error::{ControlError, StoreError};
pub use keys::{generate as new_api_key, hash_api_key, ApiKey, NewApiKey};
pub use list::{parse_metadata_query, ListQuery, ListStates, Order, Page};
pub use model::{Sandbox, SandboxState, TransitionError};
pub use store::Store;

//! The guest agent's wire types, generated at build time from `proto/envd`.
//!
//! Every message implements `serde::Serialize`/`Deserialize` with proto3-JSON rules (lowerCamelCase
//! names, enums as strings, 64-bit integers as strings, bytes as base64, defaults omitted,
//! unknown fields ignored), which is what E2B's SDKs send and expect.
//!
//! [`connect`] frames those messages for the wire (Connect protocol, JSON codec). With the
//! `client` feature, [`client`] is the typed client of the agent built on both; with the
//! `server` feature, [`server`] carries the same framing through axum for the agent.

#![forbid(unsafe_code)]

// Generated code: its style is prost's and pbjson's, not ours.
#[allow(clippy::all, missing_docs)]
pub mod process {
    include!(concat!(env!("OUT_DIR"), "/process.rs"));
    include!(concat!(env!("OUT_DIR"), "/process.serde.rs"));
}

#[allow(clippy::all, missing_docs)]
pub mod filesystem {
    include!(concat!(env!("OUT_DIR"), "/filesystem.rs"));
    include!(concat!(env!("OUT_DIR"), "/filesystem.serde.rs"));
}

pub mod connect;
pub mod journal;

#[cfg(feature = "client")]
pub mod client;

#[cfg(feature = "server")]
pub mod server;

mod timestamp;

pub use timestamp::Timestamp;

//! The guest agent's wire types, generated at build time from `proto/envd`.
//!
//! Every message implements `serde::Serialize`/`Deserialize` with proto3-JSON rules (lowerCamelCase
//! names, enums as strings, 64-bit integers as strings, bytes as base64, defaults omitted,
//! unknown fields ignored), which is what E2B's SDKs send and expect.

#![forbid(unsafe_code)]
#![allow(clippy::all, missing_docs)]

pub mod process {
    include!(concat!(env!("OUT_DIR"), "/process.rs"));
    include!(concat!(env!("OUT_DIR"), "/process.serde.rs"));
}

pub mod filesystem {
    include!(concat!(env!("OUT_DIR"), "/filesystem.rs"));
    include!(concat!(env!("OUT_DIR"), "/filesystem.serde.rs"));
}

mod timestamp;

pub use timestamp::Timestamp;

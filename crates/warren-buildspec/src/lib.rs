//! What a template build asks for, validated before anything runs: its source, its steps and,
//! for a Dockerfile, its stages ([`BuildSpec`]). Two ways in: the E2B SDKs' builder steps
//! ([`RawStep::parse`]) and a Dockerfile the server parses itself ([`dockerfile::parse`],
//! [`dockerfile_build`]).
//!
//! Pure: no I/O, no async, no other Warren crate. The control plane runs what this crate
//! describes; the CLI lints a Dockerfile with it before uploading anything.

pub mod dockerfile;
mod spec;

pub use dockerfile::dockerfile_build;
pub use spec::{
    is_files_hash, valid_account, BuildSource, BuildSpec, CopyOrigin, RawStep, RegistryAuth,
    StageSpec, Step, StepKind, E2B_BASE_IMAGE,
};

/// A build request the caller got wrong (the server answers 400 with this message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SpecError(pub String);

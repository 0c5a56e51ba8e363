//! Error categories at the domain edge. `warren-server` maps each category to exactly one HTTP
//! status; nothing below this edge knows about HTTP.

use std::time::Duration;

/// What went wrong, as a caller of the control plane needs to know it.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    InvalidArgument(String),
    /// Missing, unknown or revoked API key. The message never contains the key.
    #[error("invalid or missing API key")]
    Unauthenticated,
    /// Authenticated (or not needing to be) but not allowed to do this.
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{message}")]
    ResourceExhausted {
        message: String,
        retry_after: Duration,
    },
    /// A quota (snapshots, pauses) is used up; freeing something is the way out.
    #[error("{0}")]
    QuotaExceeded(String),
    /// The sandbox exists but its state does not allow the operation.
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

/// Failure of the durable store. Implementations keep driver details in the message only.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("record is corrupt: {0}")]
    Corrupt(String),
    #[error("{0}")]
    Backend(String),
}

impl From<warren_buildspec::SpecError> for ControlError {
    fn from(e: warren_buildspec::SpecError) -> Self {
        ControlError::InvalidArgument(e.0)
    }
}

/// A build request's Dockerfile as a [`warren_buildspec::BuildSpec`]; an error is the
/// caller's (400), with the line.
pub fn dockerfile_build(
    text: &str,
    context_hash: Option<&str>,
    build_args: &std::collections::HashMap<String, String>,
    force: bool,
) -> Result<warren_buildspec::BuildSpec, ControlError> {
    Ok(warren_buildspec::dockerfile_build(
        text,
        context_hash,
        build_args,
        force,
    )?)
}

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
    /// A bug or a broken invariant. The client is told only "internal error"; the server logs
    /// the whole chain ([`warren_runtime::chain`]): `what`, then the cause it keeps.
    #[error("internal error: {what}")]
    Internal {
        what: String,
        #[source]
        source: Option<Cause>,
    },
    #[error("store")]
    Store(#[from] StoreError),
}

/// The error an internal failure wraps, kept whole for the log's chain.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

impl ControlError {
    /// A broken invariant with no underlying error.
    pub fn internal(what: impl Into<String>) -> ControlError {
        ControlError::Internal {
            what: what.into(),
            source: None,
        }
    }

    /// An internal failure while doing `what`, its cause kept as the source.
    pub fn internal_cause<E>(what: impl Into<String>) -> impl FnOnce(E) -> ControlError
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        let what = what.into();
        move |e| ControlError::Internal {
            what,
            source: Some(Box::new(e)),
        }
    }
}

/// Failure of the durable store: the category decided here, the driver's error kept as the
/// source (never in the message: it may quote stored values).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("record is corrupt: {0}")]
    Corrupt(String),
    #[error("{what}")]
    Backend {
        what: String,
        #[source]
        source: Option<Cause>,
    },
}

impl StoreError {
    /// The store cannot do `what` at all (no underlying error).
    pub fn backend(what: impl Into<String>) -> StoreError {
        StoreError::Backend {
            what: what.into(),
            source: None,
        }
    }

    /// The back end failed while doing `what`; its error is the source.
    pub fn backend_cause<E>(what: impl Into<String>) -> impl FnOnce(E) -> StoreError
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        let what = what.into();
        move |e| StoreError::Backend {
            what,
            source: Some(Box::new(e)),
        }
    }
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

/// A sandbox that does not exist, or that the caller may not see (the same answer).
pub(crate) fn sandbox_not_found(id: &str) -> ControlError {
    ControlError::NotFound(format!("sandbox {id} not found"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    /// Each error says what failed once: its `Display` never repeats the cause, which stays
    /// reachable as its source, so the chain a log prints has every part exactly once.
    #[test]
    fn causes_are_sources_not_messages() {
        let io = || std::io::Error::other("disk on fire");
        let e = ControlError::internal_cause("writing the record")(io());
        assert_eq!(e.to_string(), "internal error: writing the record");
        assert_eq!(
            warren_runtime::chain(&e),
            "internal error: writing the record: disk on fire"
        );
        let store = StoreError::backend_cause("insert sandbox")(io());
        assert_eq!(store.to_string(), "insert sandbox");
        let e = ControlError::from(store);
        assert_eq!(e.to_string(), "store");
        assert_eq!(
            warren_runtime::chain(&e),
            "store: insert sandbox: disk on fire"
        );
        assert!(ControlError::internal("no cause").source().is_none());
    }
}

//! Errors of the microVM building blocks. Messages are sentence fragments without the
//! source's text (printers show the chain).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed: {stderr}")]
    Command { command: String, stderr: String },
    #[error("QMP {command}: {message}")]
    Qmp { command: String, message: String },
    #[error("QMP connection: {0}")]
    QmpConnection(#[source] std::io::Error),
    #[error("QMP {0} timed out")]
    QmpTimeout(String),
    #[error("kernel module {0} not found in the kernel package")]
    ModuleMissing(String),
    #[error("the VM stopped: {reason}\n--- guest console (last lines) ---\n{console}")]
    VmDied { reason: String, console: String },
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// This error as the runtime's, for a failure while doing `what`: host I/O keeps its
    /// `io::Error` (a full disk is storage, not a bug); anything else (a QEMU that would not
    /// start, a VM that died, a tool or QMP command that failed) means the VM cannot be had
    /// now, with this error as the cause.
    pub(crate) fn runtime(
        what: impl Into<String>,
    ) -> impl FnOnce(Error) -> warren_runtime::RuntimeError {
        let what = what.into();
        move |e| match e {
            Error::Io { op, path, source } => warren_runtime::RuntimeError::Io {
                what: format!("{what}: {op} {}", path.display()),
                source,
            },
            e => warren_runtime::RuntimeError::unavailable(what, e),
        }
    }

    pub(crate) fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Error::Io { op, path, source }
    }
}

/// Runs a command to completion; a non-zero exit becomes [`Error::Command`] with its stderr.
pub(crate) fn run(cmd: &mut std::process::Command) -> Result<std::process::Output> {
    let command = format!("{cmd:?}");
    checked(command, cmd.output())
}

/// [`run`] for async callers: the command runs under `tokio::process`, so waiting for it
/// never holds an async worker.
pub(crate) async fn run_async(cmd: &mut tokio::process::Command) -> Result<std::process::Output> {
    let command = format!("{cmd:?}");
    checked(command, cmd.output().await)
}

/// A finished command's output, or why it did not succeed.
fn checked(
    command: String,
    out: std::io::Result<std::process::Output>,
) -> Result<std::process::Output> {
    let out = out.map_err(|e| Error::Command {
        command: command.clone(),
        stderr: e.to_string(),
    })?;
    if !out.status.success() {
        return Err(Error::Command {
            command,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(out)
}

/// Work run on the blocking pool ([`warren_host::durable::blocking`]) that panicked.
impl From<tokio::task::JoinError> for Error {
    fn from(e: tokio::task::JoinError) -> Self {
        Error::Invalid(format!("blocking task failed: {e}"))
    }
}

/// Deletes the tree at `path` (if any) on the blocking pool; errors are ignored, as every
/// caller removes leftovers.
pub(crate) async fn remove_tree(path: &std::path::Path) {
    let _ = warren_host::durable::remove_tree_async(path).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_runtime::Category;

    #[test]
    fn a_full_disk_is_storage_and_a_dead_qemu_is_unavailable() {
        let full = Error::io("write", "/data/vm/disk.qcow2")(std::io::Error::from_raw_os_error(
            libc::ENOSPC,
        ));
        let e = Error::runtime("checkpoint")(full);
        assert_eq!(e.category(), Category::StorageFull, "{e:?}");
        assert!(warren_runtime::chain(&e).starts_with("checkpoint: write /data/vm/disk.qcow2: "));

        let died = Error::VmDied {
            reason: "exit status: 1".into(),
            console: String::new(),
        };
        let e = Error::runtime("start QEMU")(died);
        assert_eq!(e.category(), Category::Unavailable, "{e:?}");
        assert!(warren_runtime::chain(&e).contains("the VM stopped: exit status: 1"));
    }
}

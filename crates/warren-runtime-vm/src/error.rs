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
    let out = cmd.output().map_err(|e| Error::Command {
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

//! Running the external build tools: locating them, streaming their output line by line to
//! the progress callback while they run, and turning a failure into an error that carries the
//! exact command line and the tail of what it printed.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;

use crate::error::{ImageError, Result};
use crate::progress::BuildProgress;

/// How many lines of output an error message keeps.
const TAIL_LINES: usize = 25;

/// A host tool the build needs, with the Debian package that provides it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tool {
    pub name: &'static str,
    pub package: &'static str,
}

pub(crate) const MMDEBSTRAP: Tool = Tool {
    name: "mmdebstrap",
    package: "mmdebstrap",
};
pub(crate) const MKFS_EROFS: Tool = Tool {
    name: "mkfs.erofs",
    package: "erofs-utils",
};
pub(crate) const USERADD: Tool = Tool {
    name: "useradd",
    package: "passwd",
};
pub(crate) const GROUPADD: Tool = Tool {
    name: "groupadd",
    package: "passwd",
};
pub(crate) const UNSHARE: Tool = Tool {
    name: "unshare",
    package: "util-linux",
};

/// Finds `tool` in PATH, then in the sbin directories: useradd and groupadd live in /usr/sbin,
/// which is often missing from the PATH of a non-login shell or a test harness.
pub(crate) fn locate(tool: Tool) -> Result<PathBuf> {
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    let extra = [
        PathBuf::from("/usr/sbin"),
        PathBuf::from("/sbin"),
        PathBuf::from("/usr/bin"),
    ];
    std::env::split_paths(&path_var)
        .chain(extra)
        .map(|dir| dir.join(tool.name))
        .find(|candidate| is_executable(candidate))
        .ok_or(ImageError::ToolMissing {
            tool: tool.name,
            package: tool.package,
        })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Renders a command as a shell line for error messages, quoting what needs quoting, so a
/// failed build can be reproduced by pasting it.
pub(crate) fn display(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(shell_quote)
        .collect::<Vec<_>>()
        .join(" ")
}

fn shell_quote(arg: &OsStr) -> String {
    let s = arg.to_string_lossy();
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        s.into_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Runs `cmd` to completion, forwarding every output line to `progress.log` as it arrives.
/// Stdin is closed so nothing can ever wait for an answer.
pub(crate) fn run_streaming(cmd: &mut Command, progress: &mut dyn BuildProgress) -> Result<()> {
    let command = display(cmd);
    progress.log(&format!("$ {command}"));
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| ImageError::Spawn {
            command: command.clone(),
            source,
        })?;

    // Two reader threads, because reading one pipe to the end while the other fills up would
    // deadlock the child. The callback itself stays on this thread (it need not be Send).
    let (tx, rx) = mpsc::channel::<(bool, String)>();
    let mut readers = Vec::new();
    if let Some(out) = child.stdout.take() {
        readers.push(spawn_reader(out, false, tx.clone()));
    }
    if let Some(err) = child.stderr.take() {
        readers.push(spawn_reader(err, true, tx.clone()));
    }
    drop(tx);

    let mut err_tail = VecDeque::with_capacity(TAIL_LINES);
    let mut out_tail = VecDeque::with_capacity(TAIL_LINES);
    for (is_stderr, line) in rx {
        progress.log(&line);
        let tail = if is_stderr {
            &mut err_tail
        } else {
            &mut out_tail
        };
        if tail.len() == TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line);
    }
    for reader in readers {
        // A reader only ends when its pipe closes; a panic there would be a bug in this file.
        let _ = reader.join();
    }
    let status = child.wait().map_err(|source| ImageError::Spawn {
        command: command.clone(),
        source,
    })?;
    if status.success() {
        return Ok(());
    }
    let tail = if err_tail.is_empty() {
        out_tail
    } else {
        err_tail
    };
    Err(ImageError::CommandFailed {
        command,
        status: status.to_string(),
        tail: if tail.is_empty() {
            "(no output)".to_owned()
        } else {
            tail.into_iter().collect::<Vec<_>>().join("\n")
        },
    })
}

fn spawn_reader(
    pipe: impl Read + Send + 'static,
    is_stderr: bool,
    tx: mpsc::Sender<(bool, String)>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut line = Vec::new();
        let mut chunk = [0u8; 8192];
        loop {
            let n = match reader.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            for &byte in &chunk[..n] {
                // Progress meters redraw one line with '\r' and never print '\n'; treating
                // '\r' as a line end keeps them from piling up into one enormous line.
                if byte == b'\n' || byte == b'\r' {
                    if !line.is_empty() && !send_line(&tx, is_stderr, &line) {
                        return;
                    }
                    line.clear();
                } else if line.len() < MAX_LINE {
                    line.push(byte);
                }
            }
        }
        if !line.is_empty() {
            send_line(&tx, is_stderr, &line);
        }
    })
}

/// Longest line kept (bytes); the rest of an overlong line is dropped.
const MAX_LINE: usize = 4096;

fn send_line(tx: &mpsc::Sender<(bool, String)>, is_stderr: bool, line: &[u8]) -> bool {
    // Tools print in whatever encoding; lossy decoding keeps every line visible.
    let text = String::from_utf8_lossy(line).trim_end().to_owned();
    text.is_empty() || tx.send((is_stderr, text)).is_ok()
}

/// Runs a short command and returns its trimmed stdout (for version strings).
pub(crate) fn capture(cmd: &mut Command) -> Result<String> {
    let command = display(cmd);
    let output = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| ImageError::Spawn {
            command: command.clone(),
            source,
        })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(TAIL_LINES).collect();
        return Err(ImageError::CommandFailed {
            command,
            status: output.status.to_string(),
            tail: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::{BuildPhase, BuildProgress};

    #[derive(Default)]
    struct Lines(Vec<String>);
    impl BuildProgress for Lines {
        fn phase(&mut self, _: BuildPhase, _: &str) {}
        fn log(&mut self, line: &str) {
            self.0.push(line.to_owned());
        }
    }

    #[test]
    fn failure_carries_command_and_stderr_tail() {
        let mut lines = Lines::default();
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo out; echo 'it broke' >&2; exit 3"]);
        let err = run_streaming(&mut cmd, &mut lines).expect_err("command fails");
        let msg = err.to_string();
        assert!(
            msg.contains("sh -c 'echo out; echo '\\''it broke'\\'' >&2; exit 3'"),
            "{msg}"
        );
        assert!(msg.contains("exit status: 3"), "{msg}");
        assert!(msg.contains("it broke"), "{msg}");
        assert!(lines.0.iter().any(|l| l == "out"), "{:?}", lines.0);
    }

    #[test]
    fn carriage_returns_split_lines_and_long_lines_are_capped() {
        let mut lines = Lines::default();
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "printf 'a\\rb\\r\\nc\\n'; head -c 10000 /dev/zero | tr '\\0' x",
        ]);
        run_streaming(&mut cmd, &mut lines).expect("command succeeds");
        assert_eq!(&lines.0[1..4], ["a", "b", "c"]);
        assert_eq!(lines.0[4].len(), MAX_LINE);
    }

    #[test]
    fn missing_program_is_a_spawn_error() {
        let mut cmd = Command::new("/nonexistent/warren-tool");
        let err = run_streaming(&mut cmd, &mut Lines::default()).expect_err("cannot start");
        assert!(matches!(err, ImageError::Spawn { .. }), "{err}");
    }
}

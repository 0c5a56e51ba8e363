//! Running `ip`, `nft` and `conntrack`, on the host or inside a slot's network namespace.
//!
//! We shell out rather than speak netlink ourselves: the iproute2 and nftables text formats
//! are stable, readable in logs and copy-pasteable for debugging, and batching (`ip -batch`,
//! `nft -f`) keeps the number of processes per slot at three.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};

use crate::error::{Error, Result};
use crate::netns;

/// A program and the Debian package that ships it (named in "not installed" errors).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tool {
    pub program: &'static str,
    pub package: &'static str,
}

pub(crate) const IP: Tool = Tool {
    program: "ip",
    package: "iproute2",
};
pub(crate) const NFT: Tool = Tool {
    program: "nft",
    package: "nftables",
};
pub(crate) const CONNTRACK: Tool = Tool {
    program: "conntrack",
    package: "conntrack",
};

/// Generous: these tools normally finish in milliseconds; a hang means a kernel or lock
/// problem that must surface as an error instead of a stuck pool.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(20);

/// How much of stderr ends up in an error message.
const MAX_STDERR: usize = 2000;

/// One invocation of a tool. Build with [`Invocation::new`], then [`Invocation::run`].
pub(crate) struct Invocation {
    tool: Tool,
    args: Vec<String>,
    stdin: Option<String>,
    netns: Option<PathBuf>,
    /// Exit codes that count as success besides 0 (e.g. `conntrack -D` exits 1 when it
    /// deleted nothing).
    ok_codes: &'static [i32],
}

impl Invocation {
    pub fn new(tool: Tool) -> Self {
        Self {
            tool,
            args: Vec::new(),
            stdin: None,
            netns: None,
            ok_codes: &[],
        }
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Feed `input` on stdin (for `ip -batch -` and `nft -f -`).
    pub fn stdin(mut self, input: String) -> Self {
        self.stdin = Some(input);
        self
    }

    /// Run inside the network namespace bound at `path` (e.g. `/run/netns/warren-3`).
    pub fn in_netns(mut self, path: &Path) -> Self {
        self.netns = Some(path.to_owned());
        self
    }

    pub fn ok_codes(mut self, codes: &'static [i32]) -> Self {
        self.ok_codes = codes;
        self
    }

    fn display(&self) -> String {
        let mut s = String::new();
        if let Some(ns) = &self.netns {
            s.push_str(&format!("[netns {}] ", ns.display()));
        }
        s.push_str(self.tool.program);
        for a in &self.args {
            s.push(' ');
            s.push_str(a);
        }
        s
    }

    /// Run to completion; returns stdout. Fails with the tool's stderr on a non-zero exit.
    pub async fn run(self) -> Result<String> {
        let command = self.display();
        let mut cmd = Command::new(self.tool.program);
        cmd.args(&self.args)
            .stdin(if self.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);

        let spawned = match &self.netns {
            None => cmd.spawn(),
            Some(path) => spawn_in_netns(cmd, path).await?,
        };
        let mut child: Child = spawned.map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                Error::ToolMissing {
                    program: self.tool.program,
                    package: self.tool.package,
                    source,
                }
            } else {
                Error::Spawn {
                    command: command.clone(),
                    source,
                }
            }
        })?;

        // Batch tools report "Command failed -:3"; the input makes that line findable.
        let input_for_errors = self
            .stdin
            .as_ref()
            .filter(|i| i.len() <= MAX_STDERR)
            .cloned();
        let stdin_input = self.stdin;
        let work = async {
            if let (Some(input), Some(mut pipe)) = (stdin_input, child.stdin.take()) {
                // A tool that exits early closes the pipe; its exit status and stderr then
                // explain why, so a write error here is not the interesting error.
                let _ = pipe.write_all(input.as_bytes()).await;
                drop(pipe);
            }
            child.wait_with_output().await
        };
        let output = match tokio::time::timeout(DEFAULT_TIMEOUT, work).await {
            Ok(out) => out.map_err(|source| Error::Spawn {
                command: command.clone(),
                source,
            })?,
            Err(_) => {
                return Err(Error::CommandTimeout {
                    command,
                    timeout_ms: DEFAULT_TIMEOUT.as_millis() as u64,
                })
            }
        };

        let ok = output.status.success()
            || output
                .status
                .code()
                .is_some_and(|c| self.ok_codes.contains(&c));
        if !ok {
            let mut stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
            if stderr.is_empty() {
                stderr = String::from_utf8_lossy(&output.stdout).trim().to_owned();
            }
            if stderr.len() > MAX_STDERR {
                let mut cut = MAX_STDERR;
                while !stderr.is_char_boundary(cut) {
                    cut -= 1;
                }
                stderr.truncate(cut);
                stderr.push_str(" [...]");
            }
            if let Some(input) = input_for_errors {
                stderr.push_str("\n--- input ---\n");
                stderr.push_str(input.trim_end());
            }
            return Err(Error::CommandFailed {
                command,
                status: output.status.to_string(),
                stderr,
            });
        }
        String::from_utf8(output.stdout).map_err(|_| Error::BadOutput {
            command,
            detail: "stdout is not UTF-8".into(),
        })
    }
}

/// Spawns `cmd` from a short-lived thread that first enters the network namespace at `path`.
///
/// The network namespace is a per-thread attribute and a child process inherits the one of
/// the thread that forks it, so the child runs inside the slot while no runtime worker
/// thread ever changes namespace. Only the spawn happens on that thread; waiting for the
/// child is ordinary async code.
async fn spawn_in_netns(mut cmd: Command, path: &Path) -> Result<std::io::Result<Child>> {
    let handle = tokio::runtime::Handle::current();
    let path_owned = path.to_owned();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("warren-net-ns".into())
        .spawn(move || {
            let result = netns::enter(&path_owned).map(|()| {
                // The child is registered with the runtime's process driver, which needs
                // the runtime context on this (non-runtime) thread.
                let _guard = handle.enter();
                cmd.spawn()
            });
            // The receiver only disappears when the caller was cancelled; nothing to report.
            let _ = tx.send(result);
        })
        .map_err(|source| Error::Spawn {
            command: format!("thread for netns {}", path.display()),
            source,
        })?;
    match rx.await {
        Ok(result) => result,
        Err(_) => Err(Error::Spawn {
            command: format!("thread for netns {}", path.display()),
            source: std::io::Error::other("namespace thread exited without a result"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn failures_carry_stderr_and_input() {
        let err = Invocation::new(IP)
            .args(["-batch", "-"])
            .stdin("link show dev warren-no-such-link0\n".into())
            .run()
            .await
            .expect_err("no such link");
        let msg = err.to_string();
        assert!(
            msg.starts_with("`ip -batch -` failed (exit status: 1)"),
            "{msg}"
        );
        assert!(msg.contains("warren-no-such-link0"), "{msg}");
        assert!(msg.contains("--- input ---"), "{msg}");
    }

    #[tokio::test]
    async fn missing_tool_names_its_package() {
        let tool = Tool {
            program: "warren-net-no-such-tool",
            package: "some-package",
        };
        let err = Invocation::new(tool).run().await.expect_err("missing");
        assert!(matches!(err, Error::ToolMissing { .. }));
        assert!(err.to_string().contains("some-package"), "{err}");
    }

    #[tokio::test]
    async fn accepted_exit_codes() {
        let sh = Tool {
            program: "sh",
            package: "dash",
        };
        let out = Invocation::new(sh)
            .args(["-c", "echo hi; exit 1"])
            .ok_codes(&[1])
            .run()
            .await
            .expect("exit 1 accepted");
        assert_eq!(out, "hi\n");
    }
}

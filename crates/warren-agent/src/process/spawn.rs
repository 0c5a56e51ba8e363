//! Starting a program as a sandbox user, in its own process group (or session, with a PTY).

use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::Stdio;

use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};

use super::pty::PtyMaster;
use crate::users::User;

/// Default `PATH` of sandbox processes.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What to run and how.
pub struct SpawnSpec {
    pub cmd: String,
    pub args: Vec<String>,
    /// The complete environment (nothing is inherited from the agent).
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub user: User,
    /// Open a stdin pipe (otherwise stdin is /dev/null). Ignored with a PTY.
    pub stdin: bool,
    /// Terminal size (cols, rows) when the program gets a PTY.
    pub pty: Option<(u16, u16)>,
}

/// A started program and its ends of the stdio.
pub struct Spawned {
    pub child: Child,
    pub pid: u32,
    pub stdin: Option<ChildStdin>,
    pub stdout: Option<ChildStdout>,
    pub stderr: Option<ChildStderr>,
    pub pty: Option<PtyMaster>,
}

pub fn spawn(spec: SpawnSpec) -> io::Result<Spawned> {
    let mut cmd = Command::new(&spec.cmd);
    cmd.args(&spec.args)
        .env_clear()
        .envs(spec.env.iter().cloned())
        .current_dir(&spec.cwd);
    cmd.kill_on_drop(false);

    let mut pty_master = None;
    let mut slave_fd: Option<OwnedFd> = None;
    if let Some((cols, rows)) = spec.pty {
        let (master, slave) = PtyMaster::open(cols, rows)?;
        cmd.stdin(Stdio::from(slave.try_clone()?));
        cmd.stdout(Stdio::from(slave.try_clone()?));
        cmd.stderr(Stdio::from(slave.try_clone()?));
        pty_master = Some(master);
        slave_fd = Some(slave);
    } else {
        cmd.stdin(if spec.stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        cmd.stdout(Stdio::piped());
        cmd.stderr(Stdio::piped());
    }

    let with_pty = spec.pty.is_some();
    let (uid, gid) = (spec.user.uid, spec.user.gid);
    let groups: Vec<libc::gid_t> = spec.user.groups.clone();
    let drop_privileges =
        nix::unistd::geteuid().is_root() || uid != nix::unistd::geteuid().as_raw();
    // SAFETY: the closure runs in the forked child before exec and only makes raw system calls
    // (signal, sigprocmask, setsid, ioctl, setpgid, setgroups, setgid, setuid) on values
    // captured by copy or owned by the closure, or on a zeroed `sigset_t` on its own stack; it
    // allocates nothing and takes no locks, so it is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            // Programs start with default signal handling, whatever the agent inherited (a
            // shell that started it in the background ignores SIGINT and SIGQUIT, and ignored
            // signals survive exec): Ctrl-C in a terminal must interrupt.
            for sig in 1..libc::SIGRTMIN() {
                if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                    libc::signal(sig, libc::SIG_DFL);
                }
            }
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            if with_pty {
                // New session so the PTY becomes the controlling terminal and the program is a
                // process-group leader (signals reach its whole group).
                if libc::setsid() < 0 {
                    return Err(io::Error::last_os_error());
                }
                if libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
            } else if libc::setpgid(0, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            if drop_privileges {
                if libc::setgroups(groups.len(), groups.as_ptr()) < 0 {
                    return Err(io::Error::last_os_error());
                }
                if libc::setgid(gid) < 0 || libc::setuid(uid) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }

    let mut child = cmd.spawn()?;
    // The child holds its copies of the slave; ours (and the Command's, dropped on return)
    // would keep the terminal open after the program exits.
    drop(slave_fd);
    let pid = child
        .id()
        .ok_or_else(|| io::Error::other("child exited before it was tracked"))?;
    Ok(Spawned {
        stdin: child.stdin.take(),
        stdout: child.stdout.take(),
        stderr: child.stderr.take(),
        pid,
        child,
        pty: pty_master,
    })
}

//! `warren-nsinit`: turns a freshly spawned process into a sandbox.
//!
//! The manager starts it as host root, already inside the sandbox's network namespace. nsinit
//! opens what it must write later (the exit status file), becomes the sandbox's own host uid
//! (so the kernel charges the sandbox's per-user counters, such as inotify instances and
//! namespaces, to that uid and not to host root), and creates its user namespace (it must be
//! the creator, not an exec'd child of one, to hold capabilities there). It waits until the
//! manager has written the id maps and placed it in the sandbox's cgroups, reads the agent's
//! access token from the manager, becomes root of the user namespace, creates the remaining
//! namespaces (mount, uts, ipc, cgroup, pid) and forks PID 1. PID 1 builds the root filesystem
//! (see `rootfs`), drops capabilities from its bounding set (see `caps`), installs the seccomp
//! allow-list and becomes the guest agent. nsinit itself stays as PID 1's parent: it copies the
//! agent's stderr to its log up to a cap, reaps PID 1 and records how it ended.
//!
//! nsinit is single-threaded, so forking here is safe.

use std::ffi::CString;
use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use nix::fcntl::OFlag;
use nix::sched::{unshare, CloneFlags};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{execve, fork, ForkResult, Gid, Pid, Uid};

use crate::config::{Confinement, InitConfig, CONFIG_ENV, STATUS_FD, SYNC_FD};
use crate::{caps, rootfs, seccomp};

/// Bytes of the agent's stderr kept in the host log; the rest is read and dropped, so a
/// sandbox cannot fill the host's `/run` through it.
pub const LOG_CAP: usize = 1 << 20;

/// Entry point of the `warren-nsinit` binary. Never returns.
pub fn main() -> ! {
    // Neither descriptor may leak into the agent.
    for fd in [STATUS_FD, SYNC_FD] {
        // SAFETY: F_SETFD on a descriptor number only changes its flags; an invalid number
        // just makes the call fail.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    // SAFETY: the manager passes these two descriptors (dup2'ed to fixed numbers before exec)
    // and nothing else in this process uses them.
    let mut status = unsafe { fs::File::from_raw_fd(STATUS_FD) };
    // SAFETY: as above, the sync descriptor belongs to this process alone.
    let mut sync = unsafe { fs::File::from_raw_fd(SYNC_FD) };
    let code = match run(&mut status, &mut sync) {
        Ok(code) => code,
        Err(e) => {
            let _ = report(&mut status, &format!("error {}", e.replace('\n', " ")));
            1
        }
    };
    std::process::exit(code)
}

fn run(status: &mut fs::File, sync: &mut fs::File) -> Result<i32, String> {
    let raw = std::env::var(CONFIG_ENV).map_err(|_| format!("{CONFIG_ENV} is not set"))?;
    let cfg: InitConfig = serde_json::from_str(&raw).map_err(|e| format!("bad config: {e}"))?;

    // Opened while still host root: the sandbox's directory belongs to the manager.
    let exit_file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(cfg.sandbox_dir.join("exit-status"))
        .map_err(|e| format!("create exit-status: {e}"))?;
    become_host_uid(cfg.id_base)?;
    unshare(CloneFlags::CLONE_NEWUSER).map_err(|e| format!("unshare user namespace: {e}"))?;
    report(status, "userns").map_err(|e| format!("report: {e}"))?;
    let mut go = [0u8; 1];
    sync.read_exact(&mut go)
        .map_err(|e| format!("waiting for the manager: {e}"))?;
    if go[0] != b'1' {
        return Err("manager aborted the start".into());
    }
    let mut token = String::new();
    sync.read_to_string(&mut token)
        .map_err(|e| format!("reading the access token: {e}"))?;
    drop(std::mem::replace(sync, tempfile_null()?));

    become_root()?;
    unshare(
        CloneFlags::CLONE_NEWNS
            | CloneFlags::CLONE_NEWUTS
            | CloneFlags::CLONE_NEWIPC
            | CloneFlags::CLONE_NEWCGROUP
            | CloneFlags::CLONE_NEWPID,
    )
    .map_err(|e| format!("unshare: {e}"))?;
    let (log_r, log_w) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("stderr pipe: {e}"))?;

    // SAFETY: this process is single-threaded (a plain std program that started no threads),
    // so the child is a complete copy and may run arbitrary code.
    match unsafe { fork() }.map_err(|e| format!("fork: {e}"))? {
        ForkResult::Child => {
            drop(log_r);
            let err = match become_sandbox(&cfg, status, &token, log_w) {
                Ok(never) => match never {},
                Err(e) => e,
            };
            let _ = report(status, &format!("error {}", err.replace('\n', " ")));
            std::process::exit(127);
        }
        ForkResult::Parent { child } => {
            drop(log_w);
            report(status, &format!("pid {child}")).map_err(|e| format!("report pid: {e}"))?;
            drop(std::mem::replace(status, tempfile_null()?));
            Ok(supervise(child, log_r, exit_file))
        }
    }
}

/// Gives up host root for the sandbox's own host uid and gid. Dumpable again afterwards, so
/// the user namespace it creates next can see its own `/proc` entries.
fn become_host_uid(id: u32) -> Result<(), String> {
    let (uid, gid) = (Uid::from_raw(id), Gid::from_raw(id));
    nix::unistd::setgroups(&[]).map_err(|e| format!("setgroups: {e}"))?;
    nix::unistd::setresgid(gid, gid, gid).map_err(|e| format!("setresgid {id}: {e}"))?;
    nix::unistd::setresuid(uid, uid, uid).map_err(|e| format!("setresuid {id}: {e}"))?;
    // SAFETY: PR_SET_DUMPABLE takes an integer argument and touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1 as libc::c_ulong, 0, 0, 0) };
    if rc < 0 {
        return Err(format!("set dumpable: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Writes one report line in a single `write`: nsinit and PID 1 report on the same pipe, and
/// only single writes of less than PIPE_BUF bytes are atomic (`writeln!` may split a line into
/// several writes, which the other writer could interleave with).
fn report(status: &mut fs::File, line: &str) -> std::io::Result<()> {
    let mut end = line.len().min(4000);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    let mut buf = String::with_capacity(end + 1);
    buf.push_str(&line[..end]);
    buf.push('\n');
    status.write_all(buf.as_bytes())
}

/// A harmless placeholder used to close a descriptor held in a `&mut File`.
fn tempfile_null() -> Result<fs::File, String> {
    fs::File::open("/dev/null").map_err(|e| format!("open /dev/null: {e}"))
}

fn become_root() -> Result<(), String> {
    let root = nix::unistd::Uid::from_raw(0);
    let group = nix::unistd::Gid::from_raw(0);
    nix::unistd::setresgid(group, group, group).map_err(|e| format!("setresgid: {e}"))?;
    nix::unistd::setresuid(root, root, root).map_err(|e| format!("setresuid: {e}"))?;
    nix::unistd::setgroups(&[]).map_err(|e| format!("setgroups: {e}"))
}

/// Copies PID 1's stderr to our own (the host log) up to [`LOG_CAP`] bytes until PID 1 ends,
/// then records how it ended in `exit_file` (`<sandbox_dir>/exit-status`) for the manager.
fn supervise(child: Pid, log: OwnedFd, mut exit_file: fs::File) -> i32 {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, child.as_raw(), 0) };
    let mut copier = LogCopier::default();
    let mut log = Some(fs::File::from(log));
    if pidfd >= 0 {
        // SAFETY: pidfd_open just returned this descriptor to us and nothing else owns it.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
        loop {
            let mut fds = [
                libc::pollfd {
                    fd: pidfd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: log.as_ref().map_or(-1, |f| f.as_raw_fd()),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: `fds` is a valid array of two pollfd structs for the whole call; a
            // negative fd is ignored by the kernel.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if n < 0 {
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                break;
            }
            if fds[1].revents != 0 {
                if let Some(f) = log.as_mut() {
                    if !copier.copy_once(f) {
                        log = None;
                    }
                }
            }
            if fds[0].revents != 0 {
                break;
            }
        }
    } else {
        // Kernels without pidfds: nobody drains the pipe, so the agent's stderr goes nowhere.
        log = None;
    }
    drop(log);
    let (line, code) = loop {
        match waitpid(child, Some(WaitPidFlag::__WALL)) {
            Ok(WaitStatus::Exited(_, code)) => break (format!("exited {code}\n"), code),
            Ok(WaitStatus::Signaled(_, sig, _)) => {
                break (format!("signaled {sig}\n"), 128 + sig as i32)
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => break (format!("unknown ({e})\n"), 1),
        }
    };
    let _ = exit_file.write_all(line.as_bytes());
    code
}

/// Copies from the stderr pipe to our stderr, up to [`LOG_CAP`] bytes in all.
#[derive(Default)]
struct LogCopier {
    written: usize,
    truncated: bool,
}

impl LogCopier {
    /// One read and (within the cap) write; false once the pipe is closed or broken.
    fn copy_once(&mut self, pipe: &mut fs::File) -> bool {
        let mut buf = [0u8; 16 << 10];
        let n = match pipe.read(&mut buf) {
            Ok(0) | Err(_) => return false,
            Ok(n) => n,
        };
        let keep = n.min(LOG_CAP - self.written);
        let mut err = std::io::stderr();
        if keep > 0 {
            let _ = err.write_all(&buf[..keep]);
            self.written += keep;
        }
        if keep < n && !self.truncated {
            self.truncated = true;
            let _ = err.write_all(b"\n[warren-nsinit: log limit reached; the rest is dropped]\n");
        }
        true
    }
}

/// PID 1: build the root filesystem, pivot into it, confine, exec the agent.
fn become_sandbox(
    cfg: &InitConfig,
    status: &mut fs::File,
    token: &str,
    stderr: OwnedFd,
) -> Result<std::convert::Infallible, String> {
    // The agent's stderr is the pipe nsinit drains, never a host file the sandbox could grow.
    // SAFETY: dup2 onto descriptor 2 of this (single-threaded) process; `stderr` stays open
    // for the call and is closed on exec (it has FD_CLOEXEC, the new descriptor 2 does not).
    if unsafe { libc::dup2(stderr.as_raw_fd(), 2) } < 0 {
        return Err(format!("stderr pipe: {}", std::io::Error::last_os_error()));
    }
    drop(stderr);
    let full = cfg.confinement == Confinement::Full;
    rootfs::build(cfg, full)?;
    if full {
        // The bounding set first: installing seccomp without no_new_privs still needs
        // CAP_SYS_ADMIN in the effective set, which dropping from the bounding set keeps.
        caps::drop_bounding_set()?;
        for prog in seccomp::programs(cfg.nested_namespaces)? {
            seccomp::install(&prog)?;
        }
    } else {
        seccomp::install(&seccomp::baseline_program()?)?;
    }
    report(status, "ready").map_err(|e| format!("report ready: {e}"))?;

    let prog = CString::new("/usr/local/bin/warren-agent").map_err(|e| e.to_string())?;
    let mut argv = vec![prog.clone()];
    for a in &cfg.agent_args {
        argv.push(CString::new(a.as_str()).map_err(|e| e.to_string())?);
    }
    let mut env: Vec<CString> = [
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME=/root",
        "LANG=C.UTF-8",
    ]
    .iter()
    .map(|e| CString::new(*e).expect("static strings have no NUL"))
    .collect();
    if !token.is_empty() {
        // The agent requires it from its first request on and removes it from its environment.
        env.push(
            CString::new(format!("WARREN_AGENT_ACCESS_TOKEN={token}"))
                .map_err(|_| "the access token contains a NUL byte".to_string())?,
        );
    }
    execve(&prog, &argv, &env).map_err(|e| format!("exec the agent: {e}"))?;
    unreachable!("execve returned without an error")
}

//! `warren-nsinit`: turns a freshly spawned process into a sandbox.
//!
//! The manager starts it already inside the sandbox's network namespace. nsinit creates its
//! user namespace (it must be the creator, not an exec'd child of one, to hold capabilities
//! there), waits until the manager has written the id maps and placed it in the sandbox's
//! cgroups, becomes root of the user namespace, creates the remaining
//! namespaces (mount, uts, ipc, cgroup, pid) and forks PID 1. PID 1 builds the root filesystem
//! (overlay of the template image and a bounded tmpfs), a minimal `/dev`, `/proc`,
//! pivots into it, installs the seccomp filter and becomes the guest agent. nsinit itself stays
//! as PID 1's parent: it reaps it and records how it ended.
//!
//! nsinit is single-threaded, so forking here is safe.

use std::ffi::CString;
use std::fs;
use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{chdir, execve, fork, pivot_root, sethostname, ForkResult};

use crate::config::{InitConfig, CONFIG_ENV, STATUS_FD, SYNC_FD};
use crate::seccomp;

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

    unshare(CloneFlags::CLONE_NEWUSER).map_err(|e| format!("unshare user namespace: {e}"))?;
    report(status, "userns").map_err(|e| format!("report: {e}"))?;
    let mut go = [0u8; 1];
    sync.read_exact(&mut go)
        .map_err(|e| format!("waiting for the manager: {e}"))?;
    if go[0] != b'1' {
        return Err("manager aborted the start".into());
    }
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

    // SAFETY: this process is single-threaded (a plain std program that started no threads),
    // so the child is a complete copy and may run arbitrary code.
    match unsafe { fork() }.map_err(|e| format!("fork: {e}"))? {
        ForkResult::Child => {
            let err = match become_sandbox(&cfg, status) {
                Ok(never) => match never {},
                Err(e) => e,
            };
            let _ = report(status, &format!("error {}", err.replace('\n', " ")));
            std::process::exit(127);
        }
        ForkResult::Parent { child } => {
            report(status, &format!("pid {child}")).map_err(|e| format!("report pid: {e}"))?;
            drop(std::mem::replace(status, tempfile_null()?));
            Ok(wait_for(child, &cfg))
        }
    }
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

/// Waits for PID 1 and records its end in `<sandbox_dir>/exit-status` for the manager.
fn wait_for(child: nix::unistd::Pid, cfg: &InitConfig) -> i32 {
    loop {
        match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, code)) => {
                let _ = fs::write(
                    cfg.sandbox_dir.join("exit-status"),
                    format!("exited {code}\n"),
                );
                return code;
            }
            Ok(WaitStatus::Signaled(_, sig, _)) => {
                let _ = fs::write(
                    cfg.sandbox_dir.join("exit-status"),
                    format!("signaled {sig}\n"),
                );
                return 128 + sig as i32;
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return 1,
        }
    }
}

fn mnt(
    src: Option<&str>,
    target: &Path,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<(), String> {
    mount(src, target, fstype, flags, data).map_err(|e| {
        format!(
            "mount {} on {}: {e}",
            fstype.or(src).unwrap_or("?"),
            target.display()
        )
    })
}

fn mkdir(p: &Path, mode: u32) -> Result<(), String> {
    fs::create_dir_all(p).map_err(|e| format!("mkdir {}: {e}", p.display()))?;
    fs::set_permissions(p, fs::Permissions::from_mode(mode))
        .map_err(|e| format!("chmod {}: {e}", p.display()))
}

fn touch(p: &Path) -> Result<(), String> {
    if let Some(parent) = p.parent() {
        fs::create_dir_all(parent).map_err(|e| format!("mkdir {}: {e}", parent.display()))?;
    }
    fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(p)
        .map(drop)
        .map_err(|e| format!("create {}: {e}", p.display()))
}

/// PID 1: build the root filesystem, pivot into it, confine, exec the agent.
fn become_sandbox(
    cfg: &InitConfig,
    status: &mut fs::File,
) -> Result<std::convert::Infallible, String> {
    // Nothing we mount may leak back to the host, and host mount events stay out.
    mnt(
        None,
        Path::new("/"),
        None,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None,
    )?;

    let lower = cfg.sandbox_dir.join("lower");
    let rw = cfg.sandbox_dir.join("rw");
    let root = cfg.sandbox_dir.join("root");
    // The writable layer (a bounded tmpfs, so a full disk stops at the quota) was mounted by
    // the manager, which keeps it reachable for pauses and snapshots; `upper` may hold a
    // restored filesystem.
    mkdir(&rw.join("work"), 0o755)?;
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        rw.join("upper").display(),
        rw.join("work").display()
    );
    mnt(
        Some("overlay"),
        &root,
        Some("overlay"),
        MsFlags::empty(),
        Some(&format!("{opts},userxattr")),
    )
    .or_else(|_| {
        mnt(
            Some("overlay"),
            &root,
            Some("overlay"),
            MsFlags::empty(),
            Some(&opts),
        )
    })?;

    // The agent comes from the host, read-only, so images never need rebuilding for it.
    let agent = root.join("usr/local/bin/warren-agent");
    touch(&agent)?;
    let agent_src = cfg.agent_bin.to_string_lossy().into_owned();
    mnt(Some(&agent_src), &agent, None, MsFlags::MS_BIND, None)?;
    mnt(
        None,
        &agent,
        None,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None,
    )?;

    mkdir(&root.join("proc"), 0o555)?;
    mnt(
        Some("proc"),
        &root.join("proc"),
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None,
    )?;
    mkdir(&root.join("sys"), 0o555)?;
    mnt(
        Some("/sys"),
        &root.join("sys"),
        None,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None,
    )?;
    mnt(
        None,
        &root.join("sys"),
        None,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None,
    )?;
    // /tmp is part of the writable layer (not a tmpfs of its own), so what a sandbox keeps
    // there is saved by pauses and snapshots like any other file, and counts against its disk.
    mkdir(&root.join("tmp"), 0o1777)?;
    build_dev(&root)?;

    let etc = root.join("etc");
    let write = |name: &str, content: &str| {
        let p = etc.join(name);
        // Replace rather than write through: the image may have a symlink there.
        let _ = fs::remove_file(&p);
        fs::write(&p, content).map_err(|e| format!("write {}: {e}", p.display()))
    };
    write("resolv.conf", &cfg.resolv_conf)?;
    write("hostname", &format!("{}\n", cfg.sandbox_id))?;
    write(
        "hosts",
        &format!(
            "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{}\n",
            cfg.sandbox_id
        ),
    )?;
    sethostname(&cfg.sandbox_id).map_err(|e| format!("sethostname: {e}"))?;

    chdir(&root).map_err(|e| format!("chdir {}: {e}", root.display()))?;
    pivot_root(".", ".").map_err(|e| format!("pivot_root: {e}"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(|e| format!("detach old root: {e}"))?;
    chdir("/").map_err(|e| format!("chdir /: {e}"))?;

    seccomp::install()?;
    report(status, "ready").map_err(|e| format!("report ready: {e}"))?;

    let prog = CString::new("/usr/local/bin/warren-agent").map_err(|e| e.to_string())?;
    let mut argv = vec![prog.clone()];
    for a in &cfg.agent_args {
        argv.push(CString::new(a.as_str()).map_err(|e| e.to_string())?);
    }
    let env = [
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME=/root",
        "LANG=C.UTF-8",
    ]
    .map(|e| CString::new(e).expect("static strings have no NUL"));
    execve(&prog, &argv, &env).map_err(|e| format!("exec the agent: {e}"))?;
    unreachable!("execve returned without an error")
}

/// A minimal `/dev`: tmpfs with the host's harmless character devices bound in, a private
/// devpts instance for terminals, and `/dev/shm`.
fn build_dev(root: &Path) -> Result<(), String> {
    let dev = root.join("dev");
    mkdir(&dev, 0o755)?;
    mnt(
        Some("tmpfs"),
        &dev,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("mode=0755,size=65536k"),
    )?;
    for name in ["null", "zero", "full", "random", "urandom", "tty"] {
        let target = dev.join(name);
        touch(&target)?;
        let src = format!("/dev/{name}");
        mnt(Some(&src), &target, None, MsFlags::MS_BIND, None)?;
    }
    mkdir(&dev.join("pts"), 0o755)?;
    mnt(
        Some("devpts"),
        &dev.join("pts"),
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620,gid=5"),
    )
    .or_else(|_| {
        mnt(
            Some("devpts"),
            &dev.join("pts"),
            Some("devpts"),
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            Some("newinstance,ptmxmode=0666,mode=0620"),
        )
    })?;
    let link = |target: &str, name: &str| {
        symlink(target, dev.join(name)).map_err(|e| format!("symlink /dev/{name}: {e}"))
    };
    link("pts/ptmx", "ptmx")?;
    link("/proc/self/fd", "fd")?;
    link("/proc/self/fd/0", "stdin")?;
    link("/proc/self/fd/1", "stdout")?;
    link("/proc/self/fd/2", "stderr")?;
    mkdir(&dev.join("shm"), 0o1777)?;
    mnt(
        Some("tmpfs"),
        &dev.join("shm"),
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=1777"),
    )?;
    Ok(())
}

//! Each sandbox's own resources in its `/proc` and `/sys`, the way a VM shows them: `free`,
//! `top`, `/proc/meminfo`, `/proc/cpuinfo`, `/proc/stat`, `/proc/uptime`, `/proc/loadavg`
//! and `/sys/devices/system/cpu/online` describe the sandbox's cgroup limits and use, not the
//! host's.
//!
//! The files come from LXCFS (Debian's `lxcfs`), a FUSE filesystem that answers every read
//! from the cgroups and pid namespace of the process that reads. One daemon serves every
//! sandbox: [`ensure`] starts it on a host-wide mount point (or finds the one already there),
//! the manager binds that mount into each new sandbox's directory before nsinit builds the
//! mount namespace ([`STAGED`]), and PID 1 binds the files over its fresh `/proc` ([`PROC_FILES`]).
//!
//! The daemon must outlive `warren serve`: running sandboxes hold binds of its files, which
//! fail with ENOTCONN in every one of them once it is gone. So it runs in a session of its
//! own, and a restarted server takes the one it finds.
//!
//! LXCFS reads a sandbox's CPU quota (`--enable-cfs`), CPU time and disk I/O through the
//! cgroup the sandbox has in the `cpuset`, `cpuacct` and `blkio` controllers. On cgroup v1 the
//! sandbox has no cgroup of its own there by default, so [`join_v1_accounting`] gives it one of
//! the same name.
//! `nproc` counts the CPUs a process may run on (`sched_getaffinity`), which no file changes:
//! [`limit_affinity`] gives the sandbox as many CPUs as its quota.

use std::fs;
use std::io::{self, ErrorKind};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::mount::{umount2, MntFlags};
use warren_host::cgroup::{self, Version};

/// Files of the LXCFS mount's `proc/` that replace the sandbox's own procfs files of the same
/// name. (`slabinfo` is left out: the host's is readable by host root only.)
pub const PROC_FILES: &[&str] = &[
    "cpuinfo",
    "diskstats",
    "loadavg",
    "meminfo",
    "stat",
    "swaps",
    "uptime",
];

/// The file under the LXCFS mount that replaces `/sys/devices/system/cpu/online` (glibc's
/// `sysconf(_SC_NPROCESSORS_ONLN)`, Python's `os.cpu_count()`).
pub const SYS_CPU_ONLINE: &str = "sys/devices/system/cpu/online";

/// Where, in a sandbox's directory, the manager binds the LXCFS mount for nsinit (like the
/// image at `lower`): nsinit runs as the sandbox's unprivileged host uid and can reach its own
/// directory, not the daemon's mount point.
pub const STAGED: &str = "lxcfs";

/// The v1 controllers LXCFS looks a sandbox up in besides those `warren_host::cgroup` uses:
/// `cpuset` (whose path also names where it reads the CPU quota), `cpuacct` (CPU time) and
/// `blkio` (`/proc/diskstats`). None of them limits anything here.
const V1_ACCOUNTING: &[&str] = &["cpuset", "cpuacct", "blkio"];

/// How long a freshly started daemon may take to answer.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The LXCFS mount sandboxes get their own `/proc/meminfo` and the like from, started or found
/// at `dir`; `None` (with one warning) where this host cannot run it: sandboxes then see the
/// host's figures, as before.
pub async fn start(dir: Option<PathBuf>) -> Option<PathBuf> {
    let dir = dir?;
    let d = dir.clone();
    match tokio::task::spawn_blocking(move || ensure(&d)).await {
        Ok(Ok(())) => Some(dir),
        Ok(Err(why)) => {
            tracing::warn!("sandboxes will see the host's memory, CPUs and uptime in /proc: {why}");
            None
        }
        Err(e) => {
            tracing::warn!("sandboxes will see the host's memory, CPUs and uptime: {e}");
            None
        }
    }
}

/// Makes sure an LXCFS daemon answers at `dir`: reuses the one mounted there, replaces a dead
/// one (its mount answers ENOTCONN) or starts one. Errors say why sandboxes will see the
/// host's figures instead (no `lxcfs`, no `/dev/fuse`, ...).
pub fn ensure(dir: &Path) -> Result<(), String> {
    // Runtimes of one process (tests start several) take turns; another process that starts
    // one at the same time loses the daemon's pid-file lock, and its daemon exits.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if answers(dir) {
        return Ok(());
    }
    if mounted_at(dir) {
        // The daemon died: sandboxes started since its death would get ENOTCONN files.
        // Sandboxes that still hold binds of the dead mount keep failing; new ones are fine.
        tracing::warn!(dir = %dir.display(), "the LXCFS daemon is gone; starting a new one");
        umount2(dir, MntFlags::MNT_DETACH)
            .map_err(|e| format!("unmount the dead LXCFS mount {}: {e}", dir.display()))?;
    }
    if !Path::new("/dev/fuse").exists() {
        return Err("/dev/fuse is missing (no FUSE on this host)".into());
    }
    fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let log_path = sibling(dir, "log");
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("open {}: {e}", log_path.display()))?;
    let err_log = log
        .try_clone()
        .map_err(|e| format!("open {}: {e}", log_path.display()))?;
    let mut cmd = Command::new("lxcfs");
    cmd.args([
        // CPU quota (cpu.max / cpu.cfs_quota_us) in cpuinfo, stat and cpu/online.
        "--enable-cfs",
        // Per-sandbox load averages (a thread of the daemon samples every cgroup).
        "--enable-loadavg",
        "--enable-pidfd",
        // Sandboxes never swap (memory.swap.max 0, swappiness 0): show no swap, as a VM.
        "--disable-swap",
        "-p",
    ])
    .arg(sibling(dir, "pid"))
    .arg(dir)
    .stdin(Stdio::null())
    .stdout(log)
    .stderr(err_log);
    // SAFETY: runs in the forked child before exec; setsid is async-signal-safe. A session of
    // its own keeps the daemon out of the server's process group, so a terminal's Ctrl-C or a
    // supervisor signalling the group does not take every sandbox's files down with it.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(io::Error::from)?;
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| match e.kind() {
        ErrorKind::NotFound => "lxcfs is not installed (apt-get install lxcfs)".to_string(),
        _ => format!("start lxcfs: {e}"),
    })?;
    let deadline = Instant::now() + START_TIMEOUT;
    while !answers(dir) {
        if let Ok(Some(status)) = child.try_wait() {
            // Another process's daemon may have won the race to the mount point (this one
            // then exits at once): use that one if it answers soon.
            let grace = Instant::now() + Duration::from_secs(1);
            while Instant::now() < grace {
                if answers(dir) {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            return Err(format!(
                "lxcfs exited at start ({status}); see {}",
                log_path.display()
            ));
        }
        if Instant::now() > deadline {
            // Ours, started just now: stop it rather than leave a daemon that never answered.
            let _ = child.kill();
            let _ = child.wait();
            let _ = umount2(dir, MntFlags::MNT_DETACH);
            return Err(format!(
                "lxcfs did not answer at {} within {START_TIMEOUT:?}; see {}",
                dir.display(),
                log_path.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // The kernel's OOM killer must not pick it: every sandbox's files depend on it.
    let _ = fs::write(format!("/proc/{}/oom_score_adj", child.id()), "-1000");
    tracing::info!(dir = %dir.display(), pid = child.id(), "started LXCFS for sandboxes' own /proc files");
    // It is our child while this server runs (and a child of the subreaper we are even after
    // a double fork): reap it, and say loudly when it ends.
    std::thread::spawn(move || {
        if let Ok(status) = child.wait() {
            tracing::error!(%status, "the LXCFS daemon ended: sandboxes' /proc/meminfo and the like now fail until they restart");
        }
    });
    Ok(())
}

/// `<dir>.<ext>` next to the mount point (the daemon's pid file and log).
fn sibling(dir: &Path, ext: &str) -> PathBuf {
    let mut s = dir.as_os_str().to_owned();
    s.push(".");
    s.push(ext);
    PathBuf::from(s)
}

/// Whether an LXCFS mount at `dir` answers reads.
pub fn answers(dir: &Path) -> bool {
    mounted_at(dir) && fs::read(dir.join("proc/uptime")).is_ok_and(|b| !b.is_empty())
}

/// Whether `/proc/self/mountinfo` lists an LXCFS mount at `dir`.
fn mounted_at(dir: &Path) -> bool {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = dir.to_string_lossy();
    info.lines().any(|l| {
        let mut f = l.split(' ');
        let point = f.nth(4);
        // After the optional fields, " - " then the filesystem type.
        let fstype = l.split(" - ").nth(1).and_then(|r| r.split(' ').next());
        point == Some(want.as_ref()) && fstype == Some("fuse.lxcfs")
    })
}

/// On cgroup v1, puts `pid` into cgroups `<parent>/<id>` of the `cpuset`, `cpuacct` and
/// `blkio` hierarchies, where LXCFS reads the sandbox's CPU quota, CPU time and disk I/O. Best effort: without them
/// the sandbox sees the host's CPU count and times. No limit is set there: the `cpuset` cgroup
/// gets its parent's CPUs and memory nodes (the kernel refuses tasks into an empty one).
pub fn join_v1_accounting(parent: &str, id: &str, pid: u32) {
    if cgroup::detect() != Version::V1 {
        return;
    }
    for c in V1_ACCOUNTING {
        let root = Path::new("/sys/fs/cgroup").join(c);
        if let Err(e) = join_one(&root, c, parent, id, pid) {
            tracing::debug!(controller = c, error = %e, "sandbox not in this v1 controller");
        }
    }
}

fn join_one(root: &Path, controller: &str, parent: &str, id: &str, pid: u32) -> io::Result<()> {
    let mut dir = root.to_path_buf();
    for part in Path::new(parent).join(id).components() {
        let up = dir.clone();
        dir.push(part);
        match fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
        if controller == "cpuset" {
            for f in ["cpuset.cpus", "cpuset.mems"] {
                fs::write(dir.join(f), fs::read_to_string(up.join(f))?.trim())?;
            }
        }
    }
    fs::write(dir.join("cgroup.procs"), pid.to_string())
}

/// Removes the sandbox's (empty) v1 accounting cgroups; with `id` empty, the parent's.
pub fn remove_v1_accounting(parent: &str, id: &str) {
    if cgroup::detect() != Version::V1 {
        return;
    }
    for c in V1_ACCOUNTING {
        let dir = Path::new("/sys/fs/cgroup").join(c).join(parent).join(id);
        // Its processes are gone (the sandbox's main cgroups emptied first); rmdir of a cgroup
        // whose last task is still exiting can fail briefly.
        for _ in 0..50 {
            match fs::remove_dir(&dir) {
                Err(e) if e.kind() == ErrorKind::ResourceBusy => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => break,
            }
        }
    }
}

/// Limits the CPUs `pid` (nsinit, before it forks PID 1) may run on to as many as the sandbox's
/// CPU quota allows, rounded up, so that `nproc` (and everything that sizes thread pools by
/// `sched_getaffinity`) counts the sandbox's CPUs as in a VM. The quota is what limits CPU
/// time; this only spreads sandboxes over the host's CPUs in turn. A sandbox may widen its own
/// mask again (`taskset`), which gains it no CPU time.
pub fn limit_affinity(pid: u32, cpu_millis: Option<u32>) -> Result<(), String> {
    use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
    use nix::unistd::Pid;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let Some(millis) = cpu_millis else {
        return Ok(());
    };
    let want = (millis as usize).div_ceil(1000).max(1);
    // The CPUs this server may use (its own affinity, e.g. a cpuset it was started in).
    let ours =
        sched_getaffinity(Pid::from_raw(0)).map_err(|e| format!("sched_getaffinity: {e}"))?;
    let usable: Vec<usize> = (0..CpuSet::count())
        .filter(|&c| ours.is_set(c).unwrap_or(false))
        .collect();
    if want >= usable.len() {
        return Ok(());
    }
    let start = NEXT.fetch_add(want, Ordering::Relaxed);
    let mut set = CpuSet::new();
    for k in 0..want {
        set.set(usable[(start + k) % usable.len()])
            .map_err(|e| format!("cpu set: {e}"))?;
    }
    sched_setaffinity(Pid::from_raw(pid as i32), &set)
        .map_err(|e| format!("sched_setaffinity: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sibling_files_sit_next_to_the_mount_point() {
        let d = Path::new("/run/warren/lxcfs");
        assert_eq!(sibling(d, "pid"), Path::new("/run/warren/lxcfs.pid"));
        assert_eq!(sibling(d, "log"), Path::new("/run/warren/lxcfs.log"));
    }

    #[test]
    fn a_directory_without_lxcfs_does_not_answer() {
        assert!(!answers(Path::new("/proc")));
        assert!(!mounted_at(Path::new("/")));
    }
}

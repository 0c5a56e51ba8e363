//! Per-sandbox cgroups with CPU, memory and pids limits, on cgroup v2 or v1.
//!
//! Hosts differ: most run the unified hierarchy (v2); some (these development hosts among them)
//! are hybrid, with the resource controllers on v1 hierarchies. We use v2 when its root offers
//! the memory controller, else the v1 hierarchies.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use warren_runtime::Usage;

const ROOT: &str = "/sys/fs/cgroup";
/// The v1 hierarchies a sandbox gets a directory in. `cpuacct` only accounts (CPU time used);
/// where a host mounts it together with `cpu`, both names lead to one directory.
pub const V1_CONTROLLERS: &[&str] = &["cpu", "memory", "pids", "freezer", "cpuacct"];

/// Resource limits of one sandbox; `None` leaves a resource unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// CPU bandwidth in thousandths of a CPU (1000 = one full CPU).
    pub cpu_millis: Option<u32>,
    pub memory_bytes: Option<u64>,
    pub pids: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// Which cgroup version this host gives us.
pub fn detect() -> Version {
    let controllers =
        fs::read_to_string(Path::new(ROOT).join("cgroup.controllers")).unwrap_or_default();
    if controllers.split_whitespace().any(|c| c == "memory") {
        Version::V2
    } else {
        Version::V1
    }
}

/// The cgroup (one directory per hierarchy) of one sandbox.
#[derive(Debug, Clone)]
pub struct SandboxCgroup {
    pub version: Version,
    dirs: Vec<PathBuf>,
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, value).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("write {value:?} to {}: {e}", path.display()),
        )
    })
}

impl SandboxCgroup {
    /// The cgroup `<parent>/<name>` without creating it (for cleanup and reattaching).
    pub fn at(parent: &str, name: &str) -> Self {
        let version = detect();
        let dirs = match version {
            Version::V2 => vec![Path::new(ROOT).join(parent).join(name)],
            Version::V1 => V1_CONTROLLERS
                .iter()
                .map(|c| Path::new(ROOT).join(c).join(parent).join(name))
                .collect(),
        };
        Self { version, dirs }
    }

    /// Creates `<parent>/<name>` and applies `limits`.
    pub fn create(parent: &str, name: &str, limits: Limits) -> io::Result<Self> {
        let cg = Self::at(parent, name);
        if cg.version == Version::V2 {
            // Controllers must be delegated down the path to our directory.
            let _ = write(
                &Path::new(ROOT).join("cgroup.subtree_control"),
                "+cpu +memory +pids",
            );
            fs::create_dir_all(Path::new(ROOT).join(parent))?;
            write(
                &Path::new(ROOT).join(parent).join("cgroup.subtree_control"),
                "+cpu +memory +pids",
            )?;
        }
        for d in &cg.dirs {
            fs::create_dir_all(d)
                .map_err(|e| io::Error::new(e.kind(), format!("create {}: {e}", d.display())))?;
        }
        cg.apply(limits)?;
        Ok(cg)
    }

    fn dir(&self, controller: &str) -> &Path {
        match self.version {
            Version::V2 => &self.dirs[0],
            Version::V1 => {
                let i = V1_CONTROLLERS
                    .iter()
                    .position(|c| *c == controller)
                    .unwrap_or(0);
                &self.dirs[i]
            }
        }
    }

    pub fn apply(&self, limits: Limits) -> io::Result<()> {
        const PERIOD: u64 = 100_000;
        match self.version {
            Version::V2 => {
                let d = &self.dirs[0];
                if let Some(m) = limits.cpu_millis {
                    write(
                        &d.join("cpu.max"),
                        &format!("{} {PERIOD}", PERIOD * m as u64 / 1000),
                    )?;
                }
                if let Some(b) = limits.memory_bytes {
                    write(&d.join("memory.max"), &b.to_string())?;
                    // No swapping around the limit: a hog is stopped, not slowed to a crawl.
                    let _ = write(&d.join("memory.swap.max"), "0");
                }
                if let Some(p) = limits.pids {
                    write(&d.join("pids.max"), &p.to_string())?;
                }
            }
            Version::V1 => {
                if let Some(m) = limits.cpu_millis {
                    write(
                        &self.dir("cpu").join("cpu.cfs_period_us"),
                        &PERIOD.to_string(),
                    )?;
                    write(
                        &self.dir("cpu").join("cpu.cfs_quota_us"),
                        &(PERIOD * m as u64 / 1000).to_string(),
                    )?;
                }
                if let Some(b) = limits.memory_bytes {
                    write(
                        &self.dir("memory").join("memory.limit_in_bytes"),
                        &b.to_string(),
                    )?;
                    let _ = write(&self.dir("memory").join("memory.swappiness"), "0");
                }
                if let Some(p) = limits.pids {
                    write(&self.dir("pids").join("pids.max"), &p.to_string())?;
                }
            }
        }
        Ok(())
    }

    /// Moves process `pid` (and so its future children) into the sandbox's cgroup.
    pub fn add(&self, pid: u32) -> io::Result<()> {
        for d in &self.dirs {
            write(&d.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// The sandbox's cgroup directories: one on v2, one per controller on v1.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Pids in the cgroup.
    pub fn pids(&self) -> Vec<u32> {
        let d = self.dir("pids");
        fs::read_to_string(d.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Processes in any of the sandbox's cgroups. On v1 a process joins the controllers'
    /// hierarchies one by one, so one whose start was cut off (its server killed meanwhile)
    /// may be in some of them only (seen: a QEMU in `cpu` alone, which a kill that read `pids`
    /// never found, and whose `cpu` cgroup could then never be removed).
    fn pids_in_any(&self) -> Vec<u32> {
        let mut all: Vec<u32> = self
            .dirs
            .iter()
            .flat_map(|d| {
                fs::read_to_string(d.join("cgroup.procs"))
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect::<Vec<u32>>()
            })
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// What the sandbox's processes have used so far, read from the host's side (so nothing
    /// inside can change it): CPU time since the cgroup was made and memory in use now, without
    /// inactive page cache (what `docker stats` reports). `None` where this kernel does not
    /// account a resource here.
    pub fn usage(&self) -> Usage {
        let read =
            |controller: &str, file: &str| fs::read_to_string(self.dir(controller).join(file)).ok();
        let number = |text: Option<String>| text.and_then(|t| t.trim().parse::<u64>().ok());
        let stat = |text: &Option<String>, key: &str| {
            text.as_deref().and_then(|t| {
                t.lines().find_map(|l| {
                    let (k, v) = l.split_once(' ')?;
                    (k == key).then(|| v.trim().parse::<u64>().ok())?
                })
            })
        };
        match self.version {
            Version::V2 => {
                let cpu = read("cpu", "cpu.stat");
                let mem = number(read("memory", "memory.current"));
                let mstat = read("memory", "memory.stat");
                Usage {
                    cpu_usec: stat(&cpu, "usage_usec"),
                    memory_bytes: mem
                        .map(|m| m.saturating_sub(stat(&mstat, "inactive_file").unwrap_or(0))),
                }
            }
            Version::V1 => {
                let mem = number(read("memory", "memory.usage_in_bytes"));
                let mstat = read("memory", "memory.stat");
                Usage {
                    cpu_usec: number(read("cpuacct", "cpuacct.usage")).map(|ns| ns / 1000),
                    memory_bytes: mem.map(|m| {
                        m.saturating_sub(stat(&mstat, "total_inactive_file").unwrap_or(0))
                    }),
                }
            }
        }
    }

    pub fn exists(&self) -> bool {
        self.dirs.iter().any(|d| d.exists())
    }

    /// How many times the memory limit made the kernel kill a process here.
    pub fn oom_kills(&self) -> u64 {
        let (file, key) = match self.version {
            Version::V2 => ("memory.events", "oom_kill"),
            Version::V1 => ("memory.oom_control", "oom_kill"),
        };
        fs::read_to_string(self.dir("memory").join(file))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix(key).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0)
    }

    /// Kills every process in the cgroup and waits until it is empty.
    pub fn kill_all(&self) -> io::Result<()> {
        if !self.exists() {
            return Ok(());
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        match self.version {
            Version::V2 if self.dirs[0].join("cgroup.kill").exists() => {
                write(&self.dirs[0].join("cgroup.kill"), "1")?;
            }
            _ => {
                // Freeze first so nothing forks between reading the list and killing it.
                let freezer = self.dir("freezer").join("freezer.state");
                let frozen = self.version == Version::V1 && write(&freezer, "FROZEN").is_ok();
                for pid in self.pids_in_any() {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                if frozen {
                    let _ = write(&freezer, "THAWED");
                }
            }
        }
        while !self.pids_in_any().is_empty() {
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "cgroup {} did not empty",
                    self.dir("pids").display()
                )));
            }
            for pid in self.pids_in_any() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// Freezes every process of the sandbox and returns once all are frozen: nothing in it runs
    /// or changes its files until [`SandboxCgroup::thaw`]. Idempotent.
    pub fn freeze(&self) -> io::Result<()> {
        self.set_frozen(true)
    }

    /// Lets a frozen sandbox run again. Idempotent.
    pub fn thaw(&self) -> io::Result<()> {
        self.set_frozen(false)
    }

    /// Whether the sandbox is frozen (or freezing).
    pub fn is_frozen(&self) -> bool {
        match self.version {
            Version::V2 => fs::read_to_string(self.dirs[0].join("cgroup.freeze"))
                .map(|s| s.trim() == "1")
                .unwrap_or(false),
            Version::V1 => fs::read_to_string(self.dir("freezer").join("freezer.state"))
                .map(|s| s.trim() != "THAWED")
                .unwrap_or(false),
        }
    }

    fn set_frozen(&self, frozen: bool) -> io::Result<()> {
        // A task in an uninterruptible sleep (e.g. waiting on disk) delays freezing; anything
        // still not frozen after this long is stuck and the caller gets an error.
        let deadline = Instant::now() + Duration::from_secs(10);
        match self.version {
            Version::V2 => {
                write(
                    &self.dirs[0].join("cgroup.freeze"),
                    if frozen { "1" } else { "0" },
                )?;
                let want = if frozen { "frozen 1" } else { "frozen 0" };
                if wait_for_line(&self.dirs[0].join("cgroup.events"), want, deadline)? {
                    return Ok(());
                }
            }
            Version::V1 => {
                let state = self.dir("freezer").join("freezer.state");
                let want = if frozen { "FROZEN" } else { "THAWED" };
                // The v1 freezer notifies nobody: retry with a backoff (most freezes finish
                // at the first or second look).
                let mut pause = Duration::from_millis(1);
                loop {
                    // v1 reports FREEZING until every task stopped; writing again retries the
                    // tasks that were busy.
                    write(&state, want)?;
                    if fs::read_to_string(&state)?.trim() == want {
                        return Ok(());
                    }
                    if Instant::now() > deadline {
                        break;
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
            }
        }
        if frozen {
            let _ = self.set_frozen(false);
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "cgroup {} did not {} in time",
                self.dir("freezer").display(),
                if frozen { "freeze" } else { "thaw" }
            ),
        ))
    }

    /// Removes the (empty) cgroup directories.
    pub fn remove(&self) -> io::Result<()> {
        for d in &self.dirs {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match fs::remove_dir(d) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    // Busy for a moment after the last process died.
                    Err(e)
                        if Instant::now() < deadline && e.raw_os_error() == Some(libc::EBUSY) =>
                    {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    Err(e) => {
                        return Err(io::Error::new(
                            e.kind(),
                            format!("remove {}: {e}", d.display()),
                        ))
                    }
                }
            }
        }
        Ok(())
    }
}

/// Waits until the cgroup v2 file at `path` (`cgroup.events`) has the line `want`; `false` at
/// `deadline`. The kernel reports a change of that file to poll(2) as `POLLPRI`, so this
/// sleeps until the file changes rather than re-reading it on a timer. A change between a
/// read and the poll is not lost: the poll then returns at once.
pub fn wait_for_line(path: &Path, want: &str, deadline: Instant) -> io::Result<bool> {
    use std::io::{Read, Seek};
    use std::os::fd::AsRawFd;
    let mut f = fs::File::open(path)?;
    loop {
        let mut text = String::new();
        f.seek(io::SeekFrom::Start(0))?;
        f.read_to_string(&mut text)?;
        if text.lines().any(|l| l.trim() == want) {
            return Ok(true);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let mut pfd = libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLPRI,
            revents: 0,
        };
        let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX).max(1);
        // SAFETY: `pfd` is one valid pollfd that outlives the call, and its descriptor stays
        // open (owned by `f`) until after it returns.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// Names of the sandbox cgroups under `parent` (for crash cleanup).
pub fn children(parent: &str) -> Vec<String> {
    let base = match detect() {
        Version::V2 => Path::new(ROOT).join(parent),
        Version::V1 => Path::new(ROOT).join("pids").join(parent),
    };
    fs::read_dir(base)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Removes the (empty) parent cgroup from every hierarchy.
pub fn remove_parent(parent: &str) -> io::Result<()> {
    let dirs: Vec<PathBuf> = match detect() {
        Version::V2 => vec![Path::new(ROOT).join(parent)],
        Version::V1 => V1_CONTROLLERS
            .iter()
            .map(|c| Path::new(ROOT).join(c).join(parent))
            .collect(),
    };
    for d in dirs {
        match fs::remove_dir(&d) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("remove {}: {e}", d.display()),
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

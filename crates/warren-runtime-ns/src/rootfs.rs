//! The sandbox's root filesystem, built by PID 1 in its new mount namespace.
//!
//! - `/`: overlay of the template image (id-mapped, read-only) and the writable layer. Its
//!   options name the layers by paths relative to the sandbox's host directory, so
//!   `/proc/self/mountinfo` shows no host path.
//! - The agent: bound read-only from the host's staged copy, which sits alone on a tmpfs of
//!   its own, so the bind's root is `/warren-agent` rather than a host path.
//! - `/proc`: a fresh procfs with the usual masks (kernel memory, keys, timers and sysrq
//!   hidden; `/proc/sys`, `/proc/bus`, `/proc/fs`, `/proc/irq` read-only).
//! - `/sys`: not the host's (which lists every sandbox's cgroup and the host's links) but a
//!   read-only tmpfs with the CPU topology and the sandbox's own cgroups (its cgroup namespace
//!   makes its cgroup the root), read-only.
//! - The sandbox's own resources: LXCFS's `meminfo`, `cpuinfo`, `stat`, `uptime` and the like
//!   over procfs's, and its `cpu/online` over the host's (see [`crate::lxcfs`]).
//! - `/dev`: tmpfs with the harmless character devices, a private devpts and `/dev/shm`.

use std::fs;
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::unistd::{chdir, pivot_root, sethostname};

use crate::config::InitConfig;
use warren_host::cgroup;
use warren_template::ImageTree;

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

/// Binds `src` on `target` and makes the bind read-only (and nosuid, and nodev unless it is
/// a device node).
fn bind_ro(src: &Path, target: &Path) -> Result<(), String> {
    let s = src.to_string_lossy();
    mnt(Some(&s), target, None, MsFlags::MS_BIND, None)?;
    let device = fs::metadata(src).is_ok_and(|m| {
        use std::os::unix::fs::FileTypeExt;
        m.file_type().is_char_device()
    });
    let mut flags =
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID;
    if !device {
        flags |= MsFlags::MS_NODEV;
    }
    mnt(None, target, None, flags, None)
}

/// Builds the root filesystem and pivots into it; the caller's working directory is `/`.
/// `full`: the hardened `/sys` and `/proc`; without it, the earlier host `/sys` bind (for
/// benchmarks of the baseline only).
pub fn build(cfg: &InitConfig, full: bool) -> Result<(), String> {
    // Nothing we mount may leak back to the host, and host mount events stay out.
    mnt(
        None,
        Path::new("/"),
        None,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None,
    )?;

    let root = cfg.sandbox_dir.join("root");
    // The writable layer (a bounded tmpfs, so a full disk stops at the quota) was mounted by
    // the manager, which keeps it reachable for pauses and snapshots; `upper` may hold a
    // restored filesystem. Relative layer paths keep host paths out of the sandbox's
    // mountinfo (overlayfs shows the options as given).
    chdir(&cfg.sandbox_dir).map_err(|e| format!("chdir {}: {e}", cfg.sandbox_dir.display()))?;
    mkdir(Path::new("rw/work"), 0o755)?;
    let opts = "lowerdir=lower,upperdir=rw/upper,workdir=rw/work";
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
            Some(opts),
        )
    })?;

    // The image and the writable layer are the sandbox's: a symlink at a mount point, on the
    // way to the agent or at `/etc`'s files would lead these steps to host paths (nothing is
    // pivoted yet), so the root is changed only through in-root resolution, and the mount
    // points are made real directories.
    let tree = ImageTree::open(&root).map_err(|e| format!("open {}: {e}", root.display()))?;
    let in_root = |what: &str| {
        let what = what.to_string();
        move |e: std::io::Error| format!("{what} in the sandbox's root: {e}")
    };
    for (dir, mode) in [
        ("proc", 0o555),
        ("sys", 0o555),
        ("dev", 0o755),
        ("tmp", 0o1777),
    ] {
        tree.real_dir(Path::new(dir), Some(mode))
            .map_err(in_root(&format!("make /{dir}")))?;
    }

    // The agent comes from the host, read-only, so images never need rebuilding for it.
    let bin = Path::new("usr/local/bin");
    tree.ensure_file(&bin.join("warren-agent"), b"", 0o755)
        .map_err(in_root("create /usr/local/bin/warren-agent"))?;
    let bin_fd = tree
        .dir(bin, false)
        .map_err(in_root("open /usr/local/bin"))?;
    // Named through the descriptor: the directory may be a symlink's target inside the image.
    let agent = Path::new("/proc/self/fd")
        .join(bin_fd.as_raw_fd().to_string())
        .join("warren-agent");
    bind_ro(&cfg.agent_bin, &agent)?;
    drop(bin_fd);

    for (i, v) in cfg.volumes.iter().enumerate() {
        let staged = cfg.sandbox_dir.join("vol").join(i.to_string());
        let target = mount_point_in(&root, &v.path)?;
        mnt(
            Some(&staged.to_string_lossy()),
            &target,
            None,
            MsFlags::MS_BIND,
            None,
        )?;
    }

    mnt(
        Some("proc"),
        &root.join("proc"),
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None,
    )?;
    if full {
        build_sys(&root.join("sys"))?;
    } else {
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
    }
    // /tmp (made above) is part of the writable layer (not a tmpfs of its own), so what a
    // sandbox keeps there is saved by pauses and snapshots like any other file, and counts
    // against its disk.
    build_dev(&root)?;
    if full {
        mask_proc(&root)?;
    }
    if cfg.lxcfs {
        bind_lxcfs(&cfg.sandbox_dir.join(crate::lxcfs::STAGED), &root);
    }
    bind_boot_id(&cfg.sandbox_dir, &root);

    let write = |name: &str, content: &str| {
        // Replaced rather than written through: the image may have a symlink there.
        tree.write_file(&Path::new("etc").join(name), content.as_bytes(), 0o644)
            .map_err(in_root(&format!("write /etc/{name}")))
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
    chdir("/").map_err(|e| format!("chdir /: {e}"))
}

/// The directory `path` (absolute, clean) names under `root`, made where missing. The image
/// is the template author's: a symlink on the way could point anywhere on the host (nothing
/// is pivoted yet), so the walk never follows one.
fn mount_point_in(root: &Path, path: &str) -> Result<std::path::PathBuf, String> {
    let mut cur = root.to_path_buf();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        if part == "." || part == ".." {
            return Err(format!("volume mount path {path} is not clean"));
        }
        cur.push(part);
        match fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(format!(
                    "volume mount path {path} crosses a symbolic link in the image"
                ))
            }
            Ok(m) if !m.is_dir() => {
                return Err(format!(
                    "volume mount path {path}: a file of the image is in the way"
                ))
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                fs::create_dir(&cur).map_err(|e| format!("mkdir {}: {e}", cur.display()))?;
                fs::set_permissions(&cur, fs::Permissions::from_mode(0o755))
                    .map_err(|e| format!("chmod {}: {e}", cur.display()))?;
            }
            Err(e) => return Err(format!("stat {}: {e}", cur.display())),
        }
    }
    Ok(cur)
}

/// `/sys` without the host's: a tmpfs holding the CPU topology (glibc, Python and Node read
/// `devices/system/cpu`) and the sandbox's own cgroups, all read-only.
fn build_sys(sys: &Path) -> Result<(), String> {
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mnt(
        Some("sysfs-warren"),
        sys,
        Some("tmpfs"),
        flags,
        Some("mode=0755,size=64k"),
    )?;
    let cpu = sys.join("devices/system/cpu");
    mkdir(&cpu, 0o755)?;
    bind_ro(Path::new("/sys/devices/system/cpu"), &cpu)?;

    let cg = sys.join("fs/cgroup");
    mkdir(&cg, 0o755)?;
    // The cgroup namespace was created after the manager placed us in the sandbox's cgroups,
    // so these mounts show the sandbox's cgroup as their root and nothing above or beside it.
    match cgroup::detect() {
        cgroup::Version::V2 => mnt(
            Some("cgroup2"),
            &cg,
            Some("cgroup2"),
            flags | MsFlags::MS_RDONLY,
            None,
        )?,
        cgroup::Version::V1 => {
            mnt(
                Some("cgroup-warren"),
                &cg,
                Some("tmpfs"),
                flags,
                Some("mode=0755,size=64k"),
            )?;
            for c in cgroup::V1_CONTROLLERS {
                let dir = cg.join(c);
                mkdir(&dir, 0o755)?;
                mnt(
                    Some("cgroup"),
                    &dir,
                    Some("cgroup"),
                    flags | MsFlags::MS_RDONLY,
                    Some(c),
                )?;
            }
            mnt(
                None,
                &cg,
                None,
                MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | flags,
                Some("mode=0755,size=64k"),
            )?;
        }
    }
    mnt(
        None,
        sys,
        None,
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | flags,
        Some("mode=0755,size=64k"),
    )
}

/// The sandbox's own resources (see [`crate::lxcfs`]): the daemon's files, bound read-only over
/// procfs's and over `/sys/devices/system/cpu/online`. A daemon that stopped answering (it
/// died after the manager checked) leaves the sandbox with the kernel's files rather than
/// without a start; nsinit.log says so.
fn bind_lxcfs(lxcfs: &Path, root: &Path) {
    if let Err(e) = fs::metadata(lxcfs.join("proc/meminfo")) {
        eprintln!("nsinit: LXCFS does not answer ({e}); the sandbox sees the host's /proc/meminfo and the like");
        return;
    }
    let mut binds: Vec<(std::path::PathBuf, std::path::PathBuf)> = crate::lxcfs::PROC_FILES
        .iter()
        .map(|f| (lxcfs.join("proc").join(f), root.join("proc").join(f)))
        .collect();
    binds.push((
        lxcfs.join(crate::lxcfs::SYS_CPU_ONLINE),
        root.join("sys/devices/system/cpu/online"),
    ));
    for (src, target) in binds {
        if src.exists() && target.exists() {
            if let Err(e) = bind_ro(&src, &target) {
                eprintln!("nsinit: {e}");
            }
        }
    }
}

/// The file in the sandbox's directory holding this start's boot id (written by the launcher).
pub const BOOT_ID: &str = "boot_id";
/// An empty directory beside it where nsinit mounts the small tmpfs the id is bound from.
pub const BOOT_ID_STAGE: &str = "boot-id-fs";

/// This start's boot id, read-only over the kernel's (the host's) in the sandbox's procfs. It
/// is bound from a tmpfs of its own, not from the sandbox's directory, so the sandbox's
/// mountinfo names no host path. A launcher that wrote none leaves the kernel's; nsinit.log
/// says why when the bind fails.
fn bind_boot_id(dir: &Path, root: &Path) {
    let target = root.join("proc/sys/kernel/random/boot_id");
    let (Ok(id), true) = (fs::read_to_string(dir.join(BOOT_ID)), target.exists()) else {
        return;
    };
    let stage = dir.join(BOOT_ID_STAGE);
    let staged = stage.join(BOOT_ID);
    let result = mnt(
        Some("boot-id"),
        &stage,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("size=4k,mode=0755"),
    )
    .and_then(|()| {
        fs::write(&staged, id).map_err(|e| format!("write {}: {e}", staged.display()))?;
        fs::set_permissions(&staged, fs::Permissions::from_mode(0o444))
            .map_err(|e| format!("chmod {}: {e}", staged.display()))
    })
    .and_then(|()| bind_ro(&staged, &target));
    // The bind keeps the tmpfs alive; its staging mount is not needed any more.
    let _ = umount2(&stage, MntFlags::MNT_DETACH);
    if let Err(e) = result {
        eprintln!("nsinit: boot id: {e}");
    }
}

/// Files of `/proc` that disclose kernel memory or host-wide state, or act on the host.
const PROC_HIDDEN_FILES: &[&str] = &[
    "kcore",
    "keys",
    "key-users",
    "timer_list",
    "sched_debug",
    "latency_stats",
    "sysrq-trigger",
    "kallsyms",
];
const PROC_HIDDEN_DIRS: &[&str] = &["acpi", "scsi"];
const PROC_READ_ONLY: &[&str] = &["bus", "fs", "irq", "sys"];

/// The masks container runtimes put on `/proc`: `/dev/null` over files, an empty read-only
/// tmpfs over directories, read-only binds for the writable tunables.
fn mask_proc(root: &Path) -> Result<(), String> {
    let proc = root.join("proc");
    let null = root.join("dev/null");
    for name in PROC_HIDDEN_FILES {
        let p = proc.join(name);
        if p.exists() {
            bind_ro(&null, &p)?;
        }
    }
    for name in PROC_HIDDEN_DIRS {
        let p = proc.join(name);
        if p.is_dir() {
            mnt(
                Some("proc-masked"),
                &p,
                Some("tmpfs"),
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                Some("size=4k"),
            )?;
        }
    }
    for name in PROC_READ_ONLY {
        let p = proc.join(name);
        if p.is_dir() {
            bind_ro(&p, &p)?;
        }
    }
    Ok(())
}

/// A minimal `/dev`: tmpfs with the host's harmless character devices bound in, a private
/// devpts instance for terminals, and `/dev/shm`.
fn build_dev(root: &Path) -> Result<(), String> {
    // A real directory (see `build`): everything below is on the tmpfs mounted here.
    let dev = root.join("dev");
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

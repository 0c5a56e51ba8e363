//! `warren-vminit`: PID 1 of a Warren microVM until the guest agent takes over.
//!
//! The kernel runs it from the initramfs that `warren-runtime-vm` builds. It loads the kernel modules
//! listed in `/modules/order` (virtio transport, disks, network, erofs, overlayfs: the Debian
//! cloud kernel has them as modules), mounts the template image (`/dev/vda`, erofs, read-only)
//! under an overlay whose upper layer lives on the sandbox's writable disk (`/dev/vdb`, ext4),
//! gives `eth0` the fixed sandbox address, moves the new root to `/` and execs the agent.
//!
//! Any failure is printed to the console (the host keeps it in a log) and ends PID 1, which
//! panics the kernel; with `panic=-1` and QEMU's `-no-reboot` the VM then exits, so the host
//! sees a dead VM together with the reason.
//!
//! Settings come from the kernel command line (`warren.hostname=`, `warren.dns=a,b`).

mod net;
mod sys;

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

const AGENT: &str = "/usr/local/bin/warren-agent";
const ROOT_DISK: &str = "/dev/vda";
const RW_DISK: &str = "/dev/vdb";

fn main() {
    if let Err(e) = run() {
        eprintln!("warren-vminit: {e}");
        // PID 1 exiting panics the kernel; the host sees the VM stop and this message.
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    for d in ["/dev", "/proc", "/sys", "/lower", "/rw", "/newroot"] {
        let _ = fs::create_dir_all(d);
    }
    sys::mount("devtmpfs", "/dev", "devtmpfs", 0, "mode=0755")?;
    sys::mount("proc", "/proc", "proc", 0, "")?;
    sys::mount("sysfs", "/sys", "sysfs", 0, "")?;
    let cmdline = fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let param = |key: &str| {
        cmdline
            .split_whitespace()
            .find_map(|w| w.strip_prefix(key).map(str::to_string))
    };

    load_modules()?;
    wait_for(ROOT_DISK)?;
    wait_for(RW_DISK)?;
    sys::mount(ROOT_DISK, "/lower", "erofs", libc::MS_RDONLY, "")?;
    sys::mount(RW_DISK, "/rw", "ext4", 0, "")?;
    for d in ["/rw/upper", "/rw/work"] {
        fs::create_dir_all(d).map_err(|e| format!("create {d}: {e}"))?;
    }
    sys::mount(
        "overlay",
        "/newroot",
        "overlay",
        0,
        "lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work",
    )?;
    if !Path::new("/newroot").join(&AGENT[1..]).exists() {
        return Err(format!("{AGENT} is missing from the writable disk"));
    }

    let hostname = param("warren.hostname=").unwrap_or_else(|| "sandbox".into());
    sys::sethostname(&hostname)?;
    write_etc(&hostname, param("warren.dns=").as_deref())?;
    net::configure()?;

    for (from, to) in [
        ("/dev", "/newroot/dev"),
        ("/proc", "/newroot/proc"),
        ("/sys", "/newroot/sys"),
    ] {
        fs::create_dir_all(to).map_err(|e| format!("create {to}: {e}"))?;
        sys::mount(from, to, "", libc::MS_MOVE, "")?;
    }
    for d in ["/newroot/dev/pts", "/newroot/dev/shm", "/newroot/run"] {
        fs::create_dir_all(d).map_err(|e| format!("create {d}: {e}"))?;
    }
    sys::mount(
        "devpts",
        "/newroot/dev/pts",
        "devpts",
        libc::MS_NOSUID | libc::MS_NOEXEC,
        "gid=5,mode=620,ptmxmode=666",
    )?;
    sys::mount(
        "shm",
        "/newroot/dev/shm",
        "tmpfs",
        libc::MS_NOSUID | libc::MS_NODEV,
        "mode=1777",
    )?;
    sys::mount(
        "run",
        "/newroot/run",
        "tmpfs",
        libc::MS_NOSUID | libc::MS_NODEV,
        "mode=0755",
    )?;
    // The modules stay loaded; their files only take guest memory now.
    let _ = fs::remove_dir_all("/modules");

    sys::switch_root("/newroot")?;
    sys::exec(
        AGENT,
        &[
            AGENT,
            "--listen",
            warren_types::AGENT_LISTEN,
            "--default-user",
            "user",
            "--sync-clock",
        ],
    )
}

/// Loads `/modules/<name>.ko` for every name in `/modules/order`, in that order (a module's
/// dependencies come before it; the kernel cannot look them up without modprobe).
fn load_modules() -> Result<(), String> {
    let order = fs::read_to_string("/modules/order").map_err(|e| format!("/modules/order: {e}"))?;
    for name in order.split_whitespace() {
        sys::load_module(&format!("/modules/{name}.ko"))?;
    }
    Ok(())
}

/// Waits for a block device node: virtio devices are probed asynchronously after the module
/// loads.
fn wait_for(dev: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !Path::new(dev).exists() {
        if Instant::now() > deadline {
            return Err(format!("{dev} did not appear"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

fn write_etc(hostname: &str, dns: Option<&str>) -> Result<(), String> {
    let w = |path: &str, text: String| {
        let _ = fs::remove_file(path);
        fs::write(path, text).map_err(|e| format!("write {path}: {e}"))
    };
    w("/newroot/etc/hostname", format!("{hostname}\n"))?;
    w(
        "/newroot/etc/hosts",
        format!("127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.1.1\t{hostname}\n"),
    )?;
    let servers: String = dns
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| format!("nameserver {s}\n"))
        .collect();
    w("/newroot/etc/resolv.conf", servers)
}

//! One QEMU `-M microvm` process: its command line and how it is started.
//!
//! The command line of a template's boot and of its forks is the same apart from the memory
//! backend's `share` flag, the writable disk's format and `-incoming defer`: migration needs
//! the devices to match exactly.

use std::ffi::OsString;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::accel::Accel;
use crate::error::{Error, Result};
use crate::jail::Jail;

/// Descriptor numbers QEMU inherits: the tap device (jailed QEMU only), the QMP socket
/// (listening, bound by the manager) and the console file (opened by the manager).
const TAP_FD: i32 = 100;
const QMP_FD: i32 = 101;
const CONSOLE_FD: i32 = 102;
/// The file descriptor set `-add-fd` puts the console in (`/dev/fdset/1`).
const CONSOLE_FDSET: u32 = 1;

/// The guest's MAC address: fixed, like its IP address, so that snapshots fit every slot.
pub const GUEST_MAC: &str = "02:77:72:00:00:15";

/// Everything that shapes a VM's command line.
#[derive(Debug, Clone)]
pub struct VmConfig {
    pub qemu: PathBuf,
    pub accel: Accel,
    pub memory_mb: u32,
    pub cpus: u32,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub append: String,
    /// Guest RAM: a file (on tmpfs) that holds the snapshot's memory; `None`: anonymous
    /// memory of its own (a VM that boots, or reads its saved pages back).
    pub mem_file: Option<PathBuf>,
    /// `true` for the template boot (writes go to the file, which becomes the snapshot);
    /// `false` for forks (private copy-on-write mapping of the frozen file).
    pub mem_shared: bool,
    /// The template image (erofs), attached read-only as `/dev/vda`.
    pub root_image: PathBuf,
    /// The writable disk (`/dev/vdb`) and its format (`raw` or `qcow2`).
    pub rw_disk: PathBuf,
    pub rw_format: &'static str,
    /// Name of the tap device (in the netns QEMU starts in); none: no network.
    pub tap: Option<String>,
    pub qmp_socket: PathBuf,
    pub console_log: PathBuf,
    /// Wait for an incoming migration (`-incoming defer`).
    pub incoming: bool,
    /// Run QEMU jailed as an unprivileged user from the start (no root at all; see
    /// [`crate::jail`]). The tap device is opened before the switch and handed over as a
    /// descriptor; every file QEMU opens must be in the jail.
    pub jail: Option<Jail>,
    /// Appended as they are (e.g. a baseline's `-incoming file:...`).
    pub extra: Vec<String>,
}

impl VmConfig {
    pub fn args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut push = |s: String| a.push(s.into());
        push("-M".into());
        push("microvm,memory-backend=mem".into());
        push("-accel".into());
        push(self.accel.as_str().into());
        push("-cpu".into());
        push(self.accel.cpu_model().into());
        push("-m".into());
        push(format!("{}M", self.memory_mb));
        push("-smp".into());
        push(self.cpus.max(1).to_string());
        for flag in ["-nodefaults", "-no-user-config", "-nographic", "-no-reboot"] {
            push(flag.into());
        }
        push("-sandbox".into());
        push("on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny".into());
        push("-object".into());
        // A fork maps the frozen memory file private and opens it read-only (`rom=off` keeps
        // the guest's RAM writable: writes go to its copy-on-write pages).
        // The backend's id names the RAM block in the migration stream: the same for all.
        push(match &self.mem_file {
            Some(file) => format!(
                "memory-backend-file,id=mem,size={}M,mem-path={},{}",
                self.memory_mb,
                file.display(),
                if self.mem_shared {
                    "share=on"
                } else {
                    "share=off,readonly=on,rom=off"
                }
            ),
            None => format!("memory-backend-ram,id=mem,size={}M", self.memory_mb),
        });
        // The console is a file the manager opened (root's, in a directory QEMU cannot write).
        push("-add-fd".into());
        push(format!("fd={CONSOLE_FD},set={CONSOLE_FDSET}"));
        push("-chardev".into());
        push(format!(
            "file,id=console,path=/dev/fdset/{CONSOLE_FDSET},append=on"
        ));
        push("-serial".into());
        push("chardev:console".into());
        push("-kernel".into());
        push(self.kernel.display().to_string());
        push("-initrd".into());
        push(self.initrd.display().to_string());
        push("-append".into());
        push(self.append.clone());
        push("-drive".into());
        push(format!(
            "file={},format=raw,if=none,id=root,readonly=on",
            self.root_image.display()
        ));
        push("-device".into());
        push("virtio-blk-device,drive=root".into());
        // Errors (a full host disk) reach the guest as I/O errors instead of pausing the VM.
        push("-drive".into());
        push(format!(
            "file={},format={},if=none,id=rw,werror=report,rerror=report",
            self.rw_disk.display(),
            self.rw_format
        ));
        push("-device".into());
        push("virtio-blk-device,drive=rw".into());
        if let Some(tap) = &self.tap {
            push("-netdev".into());
            if self.jail.is_some() {
                push(format!("tap,id=net0,fd={TAP_FD}"));
            } else {
                push(format!("tap,id=net0,ifname={tap},script=no,downscript=no"));
            }
            push("-device".into());
            push(format!("virtio-net-device,netdev=net0,mac={GUEST_MAC}"));
        }
        // QMP listens on a socket the manager bound (at `qmp_socket`, in a directory of
        // root's): QEMU cannot replace it, and needs no writable directory for it.
        push("-chardev".into());
        push(format!("socket,id=qmp,fd={QMP_FD},server=on,wait=off"));
        push("-mon".into());
        push("chardev=qmp,mode=control".into());
        if self.incoming {
            push("-incoming".into());
            push("defer".into());
        }
        for e in &self.extra {
            push(e.clone());
        }
        a
    }
}

/// The kernel command line: serial console, no reboot on panic (the VM exits instead),
/// the host's TSC frequency, quiet, and vminit's settings.
pub fn kernel_cmdline(tsc_khz: u64, hostname: &str, dns: &[std::net::Ipv4Addr]) -> String {
    let dns: Vec<String> = dns.iter().map(|a| a.to_string()).collect();
    format!(
        "console=ttyS0 panic=-1 reboot=t tsc_early_khz={tsc_khz} quiet loglevel=4 \
         i8042.noaux i8042.nokbd warren.hostname={hostname} warren.dns={}",
        dns.join(",")
    )
}

/// How long a QEMU lives relative to the manager that starts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// A sandbox's VM: it outlives a server restart, which reattaches to it.
    Detached,
    /// A helper (a template's first boot, a checkpoint's memory share): killed when its
    /// handle is dropped, as when the server stops mid-way, so nothing runs on that no one
    /// waits for. A crash of the server leaves it running; the next start's sweep kills it.
    Transient,
}

/// Starts QEMU in a session of its own (a Ctrl-C to the server's terminal must not reach it),
/// inside network namespace `netns` when given, with an empty environment and, with
/// [`VmConfig::jail`], jailed; `lifetime` says whether dropping the returned handle kills it.
/// stdout and stderr go to `log`; the manager creates the console file and binds the QMP
/// socket, and QEMU inherits both as descriptors.
pub fn spawn(
    cfg: &VmConfig,
    netns: Option<&Path>,
    log: &Path,
    lifetime: Lifetime,
) -> Result<tokio::process::Child> {
    let Handed {
        out,
        err,
        console,
        qmp,
        ns,
    } = Handed::open(cfg, netns, log)?;
    let ns_fd = ns.as_ref().map(|f| f.as_raw_fd());
    let (qmp_fd, console_fd) = (qmp.as_raw_fd(), console.as_raw_fd());
    // Everything the child needs after fork is prepared here: no allocation happens there.
    let tap = match (&cfg.tap, &cfg.jail) {
        (Some(name), Some(_)) => Some(tap_name(name)?),
        _ => None,
    };
    let jail = match &cfg.jail {
        Some(j) => Some(j.prepare(&cfg.qemu)?),
        None => None,
    };
    let tun_path = c"/dev/net/tun";
    let mut cmd = tokio::process::Command::new(match &cfg.jail {
        // The jail holds the binary at its real path.
        Some(_) => {
            std::fs::canonicalize(resolve(&cfg.qemu)?).map_err(Error::io("resolve", &cfg.qemu))?
        }
        None => cfg.qemu.clone(),
    });
    cmd.args(cfg.args())
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(lifetime == Lifetime::Transient);
    // SAFETY: the closure runs in the child between fork and exec and only makes
    // async-signal-safe system calls (setsid, setns, open, ioctl, dup2, close_range via
    // `cloexec_all_but_handed`, and the jail's: see `Prepared::enter`) on descriptors and buffers that stay valid in the parent
    // until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(fd) = ns_fd {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if let Some(name) = tap {
                let mut req = tap_request(name);
                let tun = libc::open(tun_path.as_ptr(), libc::O_RDWR);
                if tun < 0 || libc::ioctl(tun, TUNSETIFF, &mut req) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // QEMU inherits the tap as `fd=TAP_FD`. `open` takes the lowest free
                // number, which can be TAP_FD itself.
                move_fd(tun, TAP_FD)?;
            }
            if libc::dup2(qmp_fd, QMP_FD) < 0 || libc::dup2(console_fd, CONSOLE_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            cloexec_all_but_handed();
            if let Some(j) = &jail {
                j.enter()?;
            }
            Ok(())
        });
    }
    let child = match &cfg.jail {
        Some(_) => crate::jail::spawn_in_own_pid_ns(&mut cmd),
        None => cmd.spawn(),
    }
    .map_err(Error::io("start", &cfg.qemu))?;
    drop((ns, qmp, console));
    Ok(child)
}

/// What a QEMU is handed as descriptors: its log (stdout and stderr), the console file, the
/// bound QMP socket and the network namespace to enter (when given).
struct Handed {
    out: std::fs::File,
    err: std::fs::File,
    console: std::os::fd::OwnedFd,
    qmp: std::os::fd::OwnedFd,
    ns: Option<std::os::fd::OwnedFd>,
}

impl Handed {
    fn open(cfg: &VmConfig, netns: Option<&Path>, log: &Path) -> Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(log)
            .map_err(Error::io("open", log))?;
        let err = out.try_clone().map_err(Error::io("open", log))?;
        // Every descriptor the child reads sits above the numbers it dup2s onto (see
        // `jail::FD_FLOOR`): with many VMs the manager's descriptors pass 100.
        let high = |fd: std::os::fd::OwnedFd, what: &Path| {
            crate::jail::above_floor(fd).map_err(Error::io("move the descriptor of", what))
        };
        let console = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&cfg.console_log)
            .map_err(Error::io("open", &cfg.console_log))?;
        let console = high(console.into(), &cfg.console_log)?;
        let _ = std::fs::remove_file(&cfg.qmp_socket);
        let qmp = std::os::unix::net::UnixListener::bind(&cfg.qmp_socket)
            .map_err(Error::io("bind", &cfg.qmp_socket))?;
        let qmp = high(qmp.into(), &cfg.qmp_socket)?;
        let ns = match netns {
            Some(p) => Some(high(
                std::fs::File::open(p).map_err(Error::io("open", p))?.into(),
                p,
            )?),
            None => None,
        };
        Ok(Self {
            out,
            err,
            console,
            qmp,
            ns,
        })
    }
}

/// Descriptors the manager inherited without close-on-exec (a lock held by whoever started
/// it, ...) must not live on in a QEMU that outlives it: marks all but stdio and the three
/// handed over close-on-exec. Async-signal-safe, for use between fork and exec.
fn cloexec_all_but_handed() {
    let flags = libc::CLOSE_RANGE_CLOEXEC as libc::c_long;
    let last = libc::c_long::from(u32::MAX);
    // SAFETY: close_range takes numbers only and touches no memory; marking descriptors
    // close-on-exec cannot invalidate anything the child uses before exec.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_long,
            TAP_FD as libc::c_long - 1,
            flags,
        );
        libc::syscall(
            libc::SYS_close_range,
            CONSOLE_FD as libc::c_long + 1,
            last,
            flags,
        );
    }
}

/// Moves descriptor `fd` to number `target`, inheritable across exec, closing `fd`. When `fd`
/// already is `target` (open took that number) it stays: a dup2 onto itself does nothing, and
/// closing it afterwards would lose it. Async-signal-safe, for use between fork and exec.
fn move_fd(fd: libc::c_int, target: libc::c_int) -> std::io::Result<()> {
    // SAFETY: plain descriptor calls with no pointers; `fd` is ours to close.
    unsafe {
        if fd == target {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            return Ok(());
        }
        // dup2 clears close-on-exec on the copy.
        if libc::dup2(fd, target) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        libc::close(fd);
    }
    Ok(())
}

/// `program` as a path: a bare name is looked up in `PATH`.
pub fn resolve(program: &Path) -> Result<PathBuf> {
    if program.components().count() > 1 {
        return Ok(program.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .ok_or_else(|| Error::Invalid(format!("{} is not in PATH", program.display())))
}

/// `_IOW('T', 202, int)`: attach to (or create) the tun/tap device named in the request.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;

/// A tap device's name as `ifreq` wants it (NUL-padded).
fn tap_name(name: &str) -> Result<[libc::c_char; libc::IFNAMSIZ]> {
    let mut out = [0 as libc::c_char; libc::IFNAMSIZ];
    if name.len() >= out.len() {
        return Err(Error::Invalid(format!("tap name {name} too long")));
    }
    for (d, b) in out.iter_mut().zip(name.bytes()) {
        *d = b as libc::c_char;
    }
    Ok(out)
}

/// The `ifreq` that opens tap device `name` (no packet-info header, vnet header for virtio);
/// allocation-free, for use between fork and exec.
fn tap_request(name: [libc::c_char; libc::IFNAMSIZ]) -> libc::ifreq {
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    req.ifr_name = name;
    req.ifr_ifru.ifru_flags =
        (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short;
    req
}

/// The last `lines` lines of a console log (for error messages), read from at most its last
/// 64 KiB: the guest writes it.
pub fn console_tail(path: &Path, lines: usize) -> String {
    use std::io::{Read, Seek, SeekFrom};
    const TAIL: u64 = 64 << 10;
    let mut text = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if f.seek(SeekFrom::Start(len.saturating_sub(TAIL))).is_ok() {
            let _ = f.take(TAIL).read_to_end(&mut text);
        }
    }
    let text = String::from_utf8_lossy(&text);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// File in a VM's directory (or a checkpoint helper's) naming its QEMU's host pid, for the
/// sweep after a server that died left it running.
pub const PID_FILE: &str = "pid";

/// Whether `pid` is alive and runs the QEMU of the VM directory `dir` (its writable disk is
/// `dir/disk.qcow2`; a recycled pid does not count).
pub fn is_our_qemu(pid: u32, dir: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let needle = format!("file={},", dir.join("disk.qcow2").display());
    String::from_utf8_lossy(&cmdline).contains(&needle)
        && std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                !s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(false)
}

/// `text` (from the guest or QEMU) on one line: control characters, newlines included, and
/// backslashes escaped, so that it cannot forge log lines or terminal sequences where it is
/// copied (exit reasons, server logs, stored failures).
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() || c == '\u{2028}' || c == '\u{2029}' => {
                out.extend(c.escape_unicode())
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(fd: libc::c_int) -> libc::c_int {
        // SAFETY: F_GETFD takes no pointer.
        unsafe { libc::fcntl(fd, libc::F_GETFD) }
    }

    #[test]
    fn a_descriptor_already_at_its_number_stays_open_and_inheritable() {
        use std::os::fd::IntoRawFd;
        // What a tun device opened as TAP_FD itself looks like: close-on-exec, at the target.
        let fd = std::fs::File::open("/dev/null").unwrap().into_raw_fd();
        assert_ne!(flags(fd) & libc::FD_CLOEXEC, 0);
        move_fd(fd, fd).unwrap();
        assert!(flags(fd) >= 0, "the descriptor was closed");
        assert_eq!(flags(fd) & libc::FD_CLOEXEC, 0, "exec would close it");
        // SAFETY: fd is this test's.
        unsafe { libc::close(fd) };
    }

    #[test]
    fn a_descriptor_elsewhere_is_moved_and_the_original_closed() {
        use std::os::fd::IntoRawFd;
        let fd = std::fs::File::open("/dev/null").unwrap().into_raw_fd();
        // A number nothing else in this process uses.
        // SAFETY: F_DUPFD takes no pointer; the probe is closed at once.
        let target = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 900) };
        assert!(target >= 900);
        // SAFETY: target is this test's.
        unsafe { libc::close(target) };
        move_fd(fd, target).unwrap();
        assert!(flags(fd) < 0, "the original is closed");
        assert_eq!(flags(target) & libc::FD_CLOEXEC, 0);
        // SAFETY: target is this test's.
        unsafe { libc::close(target) };
    }

    #[test]
    fn escape_keeps_guest_text_on_one_line() {
        let forged = "ok\n2030-01-01T00:00:00Z ERROR warren: FAKE-LINE\r\x1b[2J\\n";
        let e = escape(forged);
        assert!(!e.chars().any(|c| c.is_control()), "{e:?}");
        assert_eq!(
            e,
            "ok\\n2030-01-01T00:00:00Z ERROR warren: FAKE-LINE\\r\\u{1b}[2J\\\\n"
        );
    }

    #[test]
    fn console_tail_reads_only_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("console.log");
        let mut text = "x".repeat(1 << 20);
        text.push_str("\nlast line\n");
        std::fs::write(&p, text).unwrap();
        assert_eq!(console_tail(&p, 1), "last line");
    }
}

//! The capabilities root keeps inside a sandbox.
//!
//! PID 1 holds every capability in the sandbox's user namespace while it builds the root
//! filesystem. Before it becomes the agent it removes everything outside [`KEPT`] from the
//! bounding set (and clears its inheritable and ambient sets), so no process of the sandbox,
//! setuid programs such as `sudo` included, can regain them. [`KEPT`] is the set container
//! runtimes give container root by default, without CAP_MKNOD: enough to switch users, own and
//! chmod files, bind low ports, chroot and signal processes. Gone are CAP_SYS_ADMIN (mounts,
//! namespaces' admin side), CAP_NET_ADMIN, CAP_SYS_MODULE, CAP_SYS_RAWIO, CAP_SYS_PTRACE,
//! CAP_SYS_BOOT, CAP_SYS_TIME, CAP_SYS_RESOURCE (which would let sandbox root raise its
//! namespace's `max_*` counters), CAP_AUDIT_CONTROL/READ, CAP_MAC_*, CAP_SYSLOG, CAP_BPF,
//! CAP_PERFMON, CAP_CHECKPOINT_RESTORE and every capability a newer kernel adds.
//!
//! `SECBIT_NOROOT` is not set: it would stop `sudo` from working (uid 0 would no longer gain
//! capabilities on exec). Raising ambient capabilities is forbidden and locked instead.

/// Capabilities root keeps (numbers from `linux/capability.h`).
pub const KEPT: &[u32] = &[
    0,  // CAP_CHOWN
    1,  // CAP_DAC_OVERRIDE
    3,  // CAP_FOWNER
    4,  // CAP_FSETID
    5,  // CAP_KILL
    6,  // CAP_SETGID
    7,  // CAP_SETUID
    8,  // CAP_SETPCAP
    10, // CAP_NET_BIND_SERVICE
    13, // CAP_NET_RAW
    18, // CAP_SYS_CHROOT
    29, // CAP_AUDIT_WRITE
    31, // CAP_SETFCAP
];

const SECBIT_NO_CAP_AMBIENT_RAISE: libc::c_ulong = 1 << 6;
const SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED: libc::c_ulong = 1 << 7;

fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        // Drop up to the largest number any kernel could have; unknown ones fail with EINVAL.
        .unwrap_or(63)
}

fn prctl(op: libc::c_int, arg: libc::c_ulong) -> std::io::Result<()> {
    // SAFETY: these prctl operations take integer arguments only and touch no memory of ours.
    let rc = unsafe { libc::prctl(op, arg, 0 as libc::c_ulong, 0 as libc::c_ulong, 0) };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Reduces the bounding set to [`KEPT`], empties the inheritable and ambient sets and locks
/// ambient raising off. Must run before `execve` (the effective set of the caller is kept, so
/// the rest of PID 1's setup, such as installing seccomp, still works).
pub fn drop_bounding_set() -> Result<(), String> {
    let last = last_cap();
    for cap in 0..=last {
        if KEPT.contains(&cap) {
            continue;
        }
        match prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(format!("drop capability {cap} from the bounding set: {e}")),
        }
    }
    prctl(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
    )
    .map_err(|e| format!("clear ambient capabilities: {e}"))?;
    clear_inheritable()?;
    prctl(
        libc::PR_SET_SECUREBITS,
        SECBIT_NO_CAP_AMBIENT_RAISE | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED,
    )
    .map_err(|e| format!("set securebits: {e}"))
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Empties the inheritable set (root gains `inheritable | bounding` on exec, so a stray
/// inheritable capability would survive the bounding set).
fn clear_inheritable() -> Result<(), String> {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: header and a two-element data array (the layout version 3 needs) are valid for
    // the kernel to read and write during the call.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    if rc < 0 {
        return Err(format!("capget: {}", std::io::Error::last_os_error()));
    }
    for d in &mut data {
        d.inheritable = 0;
    }
    // SAFETY: as above; capset only reads them.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    if rc < 0 {
        return Err(format!("capset: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

//! The sandbox's seccomp deny-list: system calls a sandbox never needs and that widen the
//! host kernel's attack surface or touch host-global state. Everything else is allowed; denied
//! calls fail with EPERM (programs handle that better than a kill).
//!
//! The filter is installed without `no_new_privs`, so setuid programs (`sudo`) keep working;
//! that is allowed because PID 1 holds CAP_SYS_ADMIN in the sandbox's user namespace.

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

/// Denied system calls, by name (x86_64 numbers from libc).
pub const DENIED: &[(&str, i64)] = &[
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("reboot", libc::SYS_reboot),
    ("settimeofday", libc::SYS_settimeofday),
    ("clock_settime", libc::SYS_clock_settime),
    ("clock_adjtime", libc::SYS_clock_adjtime),
    ("adjtimex", libc::SYS_adjtimex),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("acct", libc::SYS_acct),
    ("quotactl", libc::SYS_quotactl),
    ("iopl", libc::SYS_iopl),
    ("ioperm", libc::SYS_ioperm),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("lookup_dcookie", libc::SYS_lookup_dcookie),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("syslog", libc::SYS_syslog),
    ("vhangup", libc::SYS_vhangup),
    ("fanotify_init", libc::SYS_fanotify_init),
];

/// Compiles the deny-list into a BPF program.
pub fn program() -> Result<BpfProgram, String> {
    let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> =
        DENIED.iter().map(|(_, nr)| (*nr, Vec::new())).collect();
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        TargetArch::x86_64,
    )
    .map_err(|e| format!("seccomp filter: {e}"))?;
    BpfProgram::try_from(filter).map_err(|e| format!("seccomp compile: {e}"))
}

/// Installs the filter on the calling thread (and so on everything it execs or forks).
pub fn install() -> Result<(), String> {
    let prog = program()?;
    let fprog = libc::sock_fprog {
        len: u16::try_from(prog.len()).map_err(|_| "seccomp program too long".to_string())?,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `fprog` points at `prog`, a valid BPF program that outlives the call; the kernel
    // copies the program during the call and keeps no pointer to our memory.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0u64,
            &fprog as *const libc::sock_fprog,
        )
    };
    if rc != 0 {
        return Err(format!(
            "install seccomp filter: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_deny_list_compiles() {
        let prog = super::program().unwrap();
        assert!(prog.len() > super::DENIED.len());
    }
}

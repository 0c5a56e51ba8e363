//! The sandbox's seccomp profile: an allow-list.
//!
//! Only the system calls ordinary Linux software uses are allowed (the list follows what
//! container runtimes' default profiles allow); everything else, including every call a newer
//! kernel adds and every x32 call (`nr | 0x40000000`, which carries the x86_64 arch value),
//! fails with EPERM. Calls of another architecture (i386 through `int 0x80`) kill the process.
//! Some calls are allowed with conditions on their arguments:
//!
//! - `clone` and `unshare` without any `CLONE_NEW*` flag: a new user namespace would hand its
//!   creator every capability again, a new network namespace the nf_tables/tc/xfrm surface.
//!   `clone3`, whose flags live in memory seccomp cannot read, fails with ENOSYS so that glibc
//!   falls back to `clone`.
//! - `socket` of the families AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK (NETLINK_ROUTE only),
//!   so no rare protocol module is loaded on a sandbox's request; other families fail with
//!   EAFNOSUPPORT, which programs (sudo's audit code among them) take as "not available".
//! - `personality` with the standard values only.
//!
//! Not allowed at all: the mount family (`mount`, `umount2`, `pivot_root`, `fsopen`,
//! `fsconfig`, `fsmount`, `fspick`, `move_mount`, `open_tree`, `mount_setattr`), `setns`,
//! `io_uring_*`, `userfaultfd`, `bpf`, `perf_event_open`, the key calls, `open_by_handle_at`,
//! module, kexec, clock, swap, quota and NUMA-migration calls.
//!
//! The filter is installed without `no_new_privs`, so setuid programs (`sudo`) keep working;
//! that is allowed because PID 1 holds CAP_SYS_ADMIN in the sandbox's user namespace when it
//! installs it (it drops it from the bounding set just before, see `caps`).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};

// Numbers libc does not name yet (x86_64).
const SYS_IO_PGETEVENTS: i64 = 333;
const SYS_CACHESTAT: i64 = 451;
const SYS_MAP_SHADOW_STACK: i64 = 453;
const SYS_FUTEX_WAKE: i64 = 454;
const SYS_FUTEX_WAIT: i64 = 455;
const SYS_FUTEX_REQUEUE: i64 = 456;

/// Allowed without conditions.
pub const ALLOWED: &[i64] = &[
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_access,
    libc::SYS_alarm,
    libc::SYS_arch_prctl,
    libc::SYS_bind,
    libc::SYS_brk,
    SYS_CACHESTAT,
    libc::SYS_capget,
    libc::SYS_capset,
    libc::SYS_chdir,
    libc::SYS_chmod,
    libc::SYS_chown,
    libc::SYS_chroot,
    libc::SYS_clock_getres,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_close,
    libc::SYS_close_range,
    libc::SYS_connect,
    libc::SYS_copy_file_range,
    libc::SYS_creat,
    libc::SYS_dup,
    libc::SYS_dup2,
    libc::SYS_dup3,
    libc::SYS_epoll_create,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_ctl_old,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_wait_old,
    libc::SYS_eventfd,
    libc::SYS_eventfd2,
    libc::SYS_execve,
    libc::SYS_execveat,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_fadvise64,
    libc::SYS_fallocate,
    libc::SYS_fanotify_mark,
    libc::SYS_fchdir,
    libc::SYS_fchmod,
    libc::SYS_fchmodat,
    libc::SYS_fchmodat2,
    libc::SYS_fchown,
    libc::SYS_fchownat,
    libc::SYS_fcntl,
    libc::SYS_fdatasync,
    libc::SYS_fgetxattr,
    libc::SYS_flistxattr,
    libc::SYS_flock,
    libc::SYS_fork,
    libc::SYS_fremovexattr,
    libc::SYS_fsetxattr,
    libc::SYS_fstat,
    libc::SYS_fstatfs,
    libc::SYS_fsync,
    libc::SYS_ftruncate,
    libc::SYS_futex,
    SYS_FUTEX_REQUEUE,
    SYS_FUTEX_WAIT,
    libc::SYS_futex_waitv,
    SYS_FUTEX_WAKE,
    libc::SYS_futimesat,
    libc::SYS_get_mempolicy,
    libc::SYS_get_robust_list,
    libc::SYS_get_thread_area,
    libc::SYS_getcpu,
    libc::SYS_getcwd,
    libc::SYS_getdents,
    libc::SYS_getdents64,
    libc::SYS_getegid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getgroups,
    libc::SYS_getitimer,
    libc::SYS_getpeername,
    libc::SYS_getpgid,
    libc::SYS_getpgrp,
    libc::SYS_getpid,
    libc::SYS_getppid,
    libc::SYS_getpriority,
    libc::SYS_getrandom,
    libc::SYS_getresgid,
    libc::SYS_getresuid,
    libc::SYS_getrlimit,
    libc::SYS_getrusage,
    libc::SYS_getsid,
    libc::SYS_getsockname,
    libc::SYS_getsockopt,
    libc::SYS_gettid,
    libc::SYS_gettimeofday,
    libc::SYS_getuid,
    libc::SYS_getxattr,
    libc::SYS_inotify_add_watch,
    libc::SYS_inotify_init,
    libc::SYS_inotify_init1,
    libc::SYS_inotify_rm_watch,
    libc::SYS_io_cancel,
    libc::SYS_io_destroy,
    libc::SYS_io_getevents,
    SYS_IO_PGETEVENTS,
    libc::SYS_io_setup,
    libc::SYS_io_submit,
    libc::SYS_ioctl,
    libc::SYS_ioprio_get,
    libc::SYS_ioprio_set,
    libc::SYS_kill,
    libc::SYS_landlock_add_rule,
    libc::SYS_landlock_create_ruleset,
    libc::SYS_landlock_restrict_self,
    libc::SYS_lchown,
    libc::SYS_lgetxattr,
    libc::SYS_link,
    libc::SYS_linkat,
    libc::SYS_listen,
    libc::SYS_listxattr,
    libc::SYS_llistxattr,
    libc::SYS_lremovexattr,
    libc::SYS_lseek,
    libc::SYS_lsetxattr,
    libc::SYS_lstat,
    libc::SYS_madvise,
    SYS_MAP_SHADOW_STACK,
    libc::SYS_membarrier,
    libc::SYS_memfd_create,
    libc::SYS_mincore,
    libc::SYS_mkdir,
    libc::SYS_mkdirat,
    libc::SYS_mknod,
    libc::SYS_mknodat,
    libc::SYS_mlock,
    libc::SYS_mlock2,
    libc::SYS_mlockall,
    libc::SYS_mmap,
    libc::SYS_mprotect,
    libc::SYS_mq_getsetattr,
    libc::SYS_mq_notify,
    libc::SYS_mq_open,
    libc::SYS_mq_timedreceive,
    libc::SYS_mq_timedsend,
    libc::SYS_mq_unlink,
    libc::SYS_mremap,
    libc::SYS_mseal,
    libc::SYS_msgctl,
    libc::SYS_msgget,
    libc::SYS_msgrcv,
    libc::SYS_msgsnd,
    libc::SYS_msync,
    libc::SYS_munlock,
    libc::SYS_munlockall,
    libc::SYS_munmap,
    libc::SYS_nanosleep,
    libc::SYS_newfstatat,
    libc::SYS_open,
    libc::SYS_openat,
    libc::SYS_openat2,
    libc::SYS_pause,
    libc::SYS_pidfd_getfd,
    libc::SYS_pidfd_open,
    libc::SYS_pidfd_send_signal,
    libc::SYS_pipe,
    libc::SYS_pipe2,
    libc::SYS_pkey_alloc,
    libc::SYS_pkey_free,
    libc::SYS_pkey_mprotect,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_prctl,
    libc::SYS_pread64,
    libc::SYS_preadv,
    libc::SYS_preadv2,
    libc::SYS_prlimit64,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pselect6,
    libc::SYS_ptrace,
    libc::SYS_pwrite64,
    libc::SYS_pwritev,
    libc::SYS_pwritev2,
    libc::SYS_read,
    libc::SYS_readahead,
    libc::SYS_readlink,
    libc::SYS_readlinkat,
    libc::SYS_readv,
    libc::SYS_recvfrom,
    libc::SYS_recvmmsg,
    libc::SYS_recvmsg,
    libc::SYS_remap_file_pages,
    libc::SYS_removexattr,
    libc::SYS_rename,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_restart_syscall,
    libc::SYS_rmdir,
    libc::SYS_rseq,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigpending,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigqueueinfo,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigsuspend,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_rt_tgsigqueueinfo,
    libc::SYS_sched_get_priority_max,
    libc::SYS_sched_get_priority_min,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_getattr,
    libc::SYS_sched_getparam,
    libc::SYS_sched_getscheduler,
    libc::SYS_sched_rr_get_interval,
    libc::SYS_sched_setaffinity,
    libc::SYS_sched_setattr,
    libc::SYS_sched_setparam,
    libc::SYS_sched_setscheduler,
    libc::SYS_sched_yield,
    libc::SYS_seccomp,
    libc::SYS_select,
    libc::SYS_semctl,
    libc::SYS_semget,
    libc::SYS_semop,
    libc::SYS_semtimedop,
    libc::SYS_sendfile,
    libc::SYS_sendmmsg,
    libc::SYS_sendmsg,
    libc::SYS_sendto,
    libc::SYS_set_robust_list,
    libc::SYS_set_thread_area,
    libc::SYS_set_tid_address,
    libc::SYS_setfsgid,
    libc::SYS_setfsuid,
    libc::SYS_setgid,
    libc::SYS_setgroups,
    libc::SYS_setitimer,
    libc::SYS_setpgid,
    libc::SYS_setpriority,
    libc::SYS_setregid,
    libc::SYS_setresgid,
    libc::SYS_setresuid,
    libc::SYS_setreuid,
    libc::SYS_setrlimit,
    libc::SYS_setsid,
    libc::SYS_setsockopt,
    libc::SYS_setuid,
    libc::SYS_setxattr,
    libc::SYS_shmat,
    libc::SYS_shmctl,
    libc::SYS_shmdt,
    libc::SYS_shmget,
    libc::SYS_shutdown,
    libc::SYS_sigaltstack,
    libc::SYS_signalfd,
    libc::SYS_signalfd4,
    libc::SYS_splice,
    libc::SYS_stat,
    libc::SYS_statfs,
    libc::SYS_statx,
    libc::SYS_symlink,
    libc::SYS_symlinkat,
    libc::SYS_sync,
    libc::SYS_sync_file_range,
    libc::SYS_syncfs,
    libc::SYS_sysinfo,
    libc::SYS_tee,
    libc::SYS_tgkill,
    libc::SYS_time,
    libc::SYS_timer_create,
    libc::SYS_timer_delete,
    libc::SYS_timer_getoverrun,
    libc::SYS_timer_gettime,
    libc::SYS_timer_settime,
    libc::SYS_timerfd_create,
    libc::SYS_timerfd_gettime,
    libc::SYS_timerfd_settime,
    libc::SYS_times,
    libc::SYS_tkill,
    libc::SYS_truncate,
    libc::SYS_umask,
    libc::SYS_uname,
    libc::SYS_unlink,
    libc::SYS_unlinkat,
    libc::SYS_utime,
    libc::SYS_utimensat,
    libc::SYS_utimes,
    libc::SYS_vfork,
    libc::SYS_vmsplice,
    libc::SYS_wait4,
    libc::SYS_waitid,
    libc::SYS_write,
    libc::SYS_writev,
];

/// Every `CLONE_NEW*` flag `clone` takes (CLONE_NEWTIME shares its bit with the exit signal
/// there and is valid only for `unshare` and `clone3`).
const CLONE_NEW_ANY: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u64;
const CLONE_NEWTIME: u64 = 0x80;

/// `personality` values programs use: PER_LINUX, UNAME26, ADDR_NO_RANDOMIZE (setarch -R,
/// debuggers), both, and the query 0xffffffff.
const PERSONALITIES: &[u64] = &[0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

/// Socket families a sandbox may create.
const FAMILIES: &[u64] = &[
    libc::AF_UNIX as u64,
    libc::AF_INET as u64,
    libc::AF_INET6 as u64,
    libc::AF_NETLINK as u64,
];

fn cond(arg: u8, len: Len, op: Op, value: u64) -> Result<SeccompCondition, String> {
    SeccompCondition::new(arg, len, op, value).map_err(|e| format!("seccomp condition: {e}"))
}

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule, String> {
    SeccompRule::new(conds).map_err(|e| format!("seccomp rule: {e}"))
}

fn compile(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    mismatch: SeccompAction,
    matched: SeccompAction,
) -> Result<BpfProgram, String> {
    let filter = SeccompFilter::new(rules, mismatch, matched, TargetArch::x86_64)
        .map_err(|e| format!("seccomp filter: {e}"))?;
    BpfProgram::try_from(filter).map_err(|e| format!("seccomp compile: {e}"))
}

/// The allow-list: allowed calls pass, everything else fails with EPERM.
fn allow_list(nested_namespaces: bool) -> Result<BpfProgram, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        ALLOWED.iter().map(|nr| (*nr, Vec::new())).collect();
    // socket and socketpair pass here; the family filter below refines them.
    rules.insert(libc::SYS_socket, Vec::new());
    rules.insert(libc::SYS_socketpair, Vec::new());
    rules.insert(libc::SYS_clone3, Vec::new());
    if nested_namespaces {
        rules.insert(libc::SYS_clone, Vec::new());
        rules.insert(libc::SYS_unshare, Vec::new());
    } else {
        rules.insert(
            libc::SYS_clone,
            vec![rule(vec![cond(
                0,
                Len::Qword,
                Op::MaskedEq(CLONE_NEW_ANY),
                0,
            )?])?],
        );
        rules.insert(
            libc::SYS_unshare,
            vec![rule(vec![cond(
                0,
                Len::Qword,
                Op::MaskedEq(CLONE_NEW_ANY | CLONE_NEWTIME),
                0,
            )?])?],
        );
    }
    let personalities = PERSONALITIES
        .iter()
        .map(|p| rule(vec![cond(0, Len::Dword, Op::Eq, *p)?]))
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_personality, personalities);
    compile(
        rules,
        SeccompAction::Errno(libc::EPERM as u32),
        SeccompAction::Allow,
    )
}

/// `clone3` fails with ENOSYS (glibc then uses `clone`, whose flags the allow-list checks).
fn no_clone3() -> Result<BpfProgram, String> {
    compile(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
    )
}

/// Sockets of other families (and netlink other than NETLINK_ROUTE) fail with EAFNOSUPPORT.
fn socket_families() -> Result<BpfProgram, String> {
    let other_family = FAMILIES
        .iter()
        .map(|f| cond(0, Len::Dword, Op::Ne, *f))
        .collect::<Result<Vec<_>, _>>()?;
    let other_netlink = vec![
        cond(0, Len::Dword, Op::Eq, libc::AF_NETLINK as u64)?,
        cond(2, Len::Dword, Op::Ne, libc::NETLINK_ROUTE as u64)?,
    ];
    let not_unix = vec![cond(0, Len::Dword, Op::Ne, libc::AF_UNIX as u64)?];
    compile(
        BTreeMap::from([
            (
                libc::SYS_socket,
                vec![rule(other_family)?, rule(other_netlink)?],
            ),
            (libc::SYS_socketpair, vec![rule(not_unix)?]),
        ]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EAFNOSUPPORT as u32),
    )
}

/// The programs to install, in order. The kernel runs every installed filter on each call and
/// takes the strictest answer, so the two small refinements only ever narrow the allow-list.
pub fn programs(nested_namespaces: bool) -> Result<Vec<BpfProgram>, String> {
    Ok(vec![
        allow_list(nested_namespaces)?,
        no_clone3()?,
        socket_families()?,
    ])
}

/// The earlier deny-list (default allow), kept only so benchmarks can measure what the
/// allow-list costs ([`crate::config::Confinement::Baseline`]).
pub const BASELINE_DENIED: &[i64] = &[
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_reboot,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_lookup_dcookie,
    libc::SYS_userfaultfd,
    libc::SYS_syslog,
    libc::SYS_vhangup,
    libc::SYS_fanotify_init,
];

/// The baseline deny-list program.
pub fn baseline_program() -> Result<BpfProgram, String> {
    compile(
        BASELINE_DENIED.iter().map(|nr| (*nr, Vec::new())).collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
    )
}

/// Installs `prog` on the calling thread (and so on everything it execs or forks).
pub fn install(prog: &BpfProgram) -> Result<(), String> {
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
    fn the_profiles_compile() {
        for nested in [false, true] {
            let progs = super::programs(nested).unwrap();
            assert_eq!(progs.len(), 3);
            assert!(progs[0].len() > super::ALLOWED.len());
        }
        assert!(super::baseline_program().unwrap().len() > super::BASELINE_DENIED.len());
    }

    #[test]
    fn dangerous_calls_are_not_on_the_allow_list() {
        for nr in [
            libc::SYS_mount,
            libc::SYS_umount2,
            libc::SYS_pivot_root,
            libc::SYS_fsopen,
            libc::SYS_fsconfig,
            libc::SYS_fsmount,
            libc::SYS_fspick,
            libc::SYS_move_mount,
            libc::SYS_open_tree,
            libc::SYS_mount_setattr,
            libc::SYS_setns,
            libc::SYS_io_uring_setup,
            libc::SYS_io_uring_enter,
            libc::SYS_io_uring_register,
            libc::SYS_userfaultfd,
            libc::SYS_bpf,
            libc::SYS_perf_event_open,
            libc::SYS_keyctl,
            libc::SYS_add_key,
            libc::SYS_request_key,
            libc::SYS_open_by_handle_at,
            libc::SYS_init_module,
            libc::SYS_finit_module,
            libc::SYS_kexec_load,
            libc::SYS_mbind,
            libc::SYS_migrate_pages,
            libc::SYS_move_pages,
            libc::SYS_quotactl_fd,
            libc::SYS_process_madvise,
        ] {
            assert!(!super::ALLOWED.contains(&nr), "syscall {nr} is allowed");
        }
    }
}

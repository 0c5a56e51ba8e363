//! The few places the agent needs raw system calls. Every `unsafe` block lives here or in
//! `process::spawn`, each with its justification.

use std::io;

use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, getpid, ForkResult, Pid};

/// When running as PID 1 (a sandbox's init), forks: the parent stays PID 1 and only reaps
/// orphans and forwards termination signals; the child returns and runs the agent. This keeps
/// orphan reaping away from the agent's own child bookkeeping (a `waitpid(-1)` there would steal
/// exit statuses of the commands it runs).
pub fn become_init_if_pid1() {
    if getpid().as_raw() != 1 {
        return;
    }
    // SAFETY: called first thing in `main`, before the async runtime or any other thread
    // exists, so the child is a faithful single-threaded copy and may continue normally.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {}
        Ok(ForkResult::Parent { child }) => reap_forever(child),
        Err(e) => eprintln!("warren-agent: fork as init failed ({e}); running without a reaper"),
    }
}

fn reap_forever(agent: Pid) -> ! {
    use nix::sys::signal::{signal, SigHandler, Signal};
    for sig in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        // SAFETY: installing SIG_IGN runs no handler code; PID 1 ignores these so the kernel's
        // default (ignored for init anyway) is explicit, and the agent child decides shutdown.
        let _ = unsafe { signal(sig, SigHandler::SigIgn) };
    }
    loop {
        match waitpid(None::<Pid>, Some(WaitPidFlag::__WALL)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == agent => std::process::exit(code),
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == agent => {
                std::process::exit(128 + sig as i32)
            }
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(100)),
        }
    }
}

/// Sets the wall clock (CLOCK_REALTIME). Needs CAP_SYS_TIME; used after a snapshot restore.
pub fn set_wall_clock(secs: i64, nanos: u32) -> io::Result<()> {
    let ts = nix::sys::time::TimeSpec::new(secs, nanos as i64);
    nix::time::clock_settime(nix::time::ClockId::CLOCK_REALTIME, ts).map_err(io::Error::from)
}

/// `_IO('R', 0x07)`: reseed the kernel's CRNG from its input pool now.
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;

/// Mixes `seed` into the kernel's random pool (any process may write to `/dev/urandom`) and
/// forces a reseed of the CRNG (needs CAP_SYS_ADMIN), so that VMs restored from one snapshot
/// stop sharing their random state at once instead of at the next periodic reseed.
pub fn reseed_random(seed: &[u8]) -> io::Result<()> {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let mut urandom = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/urandom")?;
    urandom.write_all(seed)?;
    // SAFETY: RNDRESEEDCRNG takes no argument; the descriptor is open for the whole call.
    let rc = unsafe { libc::ioctl(urandom.as_raw_fd(), RNDRESEEDCRNG) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

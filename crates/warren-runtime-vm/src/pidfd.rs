//! Waiting for a process that is not our child to exit, through a pidfd (Linux 5.3+): it
//! turns readable when the process ends, so a watcher sleeps until then instead of polling.

use std::os::fd::{FromRawFd, OwnedFd};

use tokio::io::unix::AsyncFd;

/// A pidfd of one process.
pub struct PidFd(OwnedFd);

impl PidFd {
    /// Opens a pidfd of `pid`. `ESRCH` when no such process exists, `ENOSYS` on kernels
    /// without pidfds.
    pub fn open(pid: u32) -> std::io::Result<Self> {
        let pid = libc::pid_t::try_from(pid)
            .map_err(|_| std::io::Error::from_raw_os_error(libc::ESRCH))?;
        // SAFETY: pidfd_open takes a pid and flags by value and touches no memory of ours;
        // on success it returns a new file descriptor that nothing else owns.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0 as libc::c_uint) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let fd = i32::try_from(fd).map_err(|_| std::io::Error::other("pidfd out of range"))?;
        // SAFETY: `fd` was just returned by pidfd_open, is open and owned by no one else.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Returns once the process has exited (also when it has not been reaped yet).
    pub async fn exited(self) -> std::io::Result<()> {
        // SAFETY: the OwnedFd moves into the AsyncFd, which keeps it open (and its number
        // the same) until the AsyncFd is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(self.0, tokio::io::Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        // A pidfd stays readable once the process has ended; it is never read.
        let _ready = fd.readable().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// Whether `fd` is readable right now (poll with a zero timeout).
    fn readable_now(fd: &OwnedFd) -> bool {
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is one valid pollfd that lives across the call; the timeout is 0.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        assert!(n >= 0, "poll: {}", std::io::Error::last_os_error());
        n > 0
    }

    #[tokio::test]
    async fn the_pidfd_of_a_process_turns_ready_when_it_exits() {
        let mut child = std::process::Command::new("sleep")
            .arg("1000")
            .spawn()
            .unwrap();
        let fd = PidFd::open(child.id()).unwrap();
        assert!(
            !readable_now(&fd.0),
            "a running process's pidfd is not ready"
        );
        child.kill().unwrap();
        // The watcher of a process that is not its child never reaps it: wait unreaped.
        fd.exited().await.unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_gone_process_has_no_pidfd() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let e = PidFd::open(pid)
            .err()
            .expect("a reaped process has a pidfd");
        assert_eq!(e.raw_os_error(), Some(libc::ESRCH), "{e}");
    }
}

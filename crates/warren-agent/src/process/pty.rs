//! A pseudo-terminal master driven asynchronously.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
use nix::pty::{openpty, Winsize};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// The master side of a PTY; the slave side goes to the child as its stdio.
pub struct PtyMaster {
    fd: AsyncFd<OwnedFd>,
    write_lock: tokio::sync::Mutex<()>,
}

fn winsize(cols: u16, rows: u16) -> Winsize {
    Winsize {
        ws_row: rows.max(1),
        ws_col: cols.max(1),
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

impl PtyMaster {
    /// Opens a PTY pair of the given size. Both fds are close-on-exec so no child inherits the
    /// master (which would keep the terminal open after the program exits).
    pub fn open(cols: u16, rows: u16) -> io::Result<(PtyMaster, OwnedFd)> {
        let pair = openpty(Some(&winsize(cols, rows)), None).map_err(io::Error::from)?;
        for fd in [&pair.master, &pair.slave] {
            fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).map_err(io::Error::from)?;
        }
        let flags = OFlag::from_bits_truncate(
            fcntl(&pair.master, FcntlArg::F_GETFL).map_err(io::Error::from)?,
        );
        fcntl(&pair.master, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))
            .map_err(io::Error::from)?;
        // SAFETY: `OwnedFd` owns an open descriptor and always returns that same descriptor from
        // `as_raw_fd`; the `AsyncFd` owns it until dropped, so it stays open while registered.
        let fd = unsafe {
            AsyncFd::register_with_interest(pair.master, Interest::READABLE | Interest::WRITABLE)
        }
        .map_err(io::Error::from)?;
        Ok((
            PtyMaster {
                fd,
                write_lock: tokio::sync::Mutex::new(()),
            },
            pair.slave,
        ))
    }

    /// Reads terminal output. `Ok(0)` once every slave descriptor is closed (the kernel reports
    /// that as EIO on Linux).
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|fd| nix::unistd::read(fd.get_ref(), buf).map_err(io::Error::from)) {
                Ok(Ok(n)) => return Ok(n),
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }

    /// Writes all of `data` as terminal input; concurrent writers do not interleave.
    pub async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        let _serial = self.write_lock.lock().await;
        while !data.is_empty() {
            let mut guard = self.fd.writable().await?;
            match guard.try_io(|fd| nix::unistd::write(fd.get_ref(), data).map_err(io::Error::from))
            {
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    /// Changes the terminal size; the kernel signals SIGWINCH to the foreground group.
    pub fn resize(&self, cols: u16, rows: u16) -> io::Result<()> {
        let ws = winsize(cols, rows);
        // SAFETY: TIOCSWINSZ reads one `struct winsize` from the pointer, which points to a
        // live, properly initialised value for the whole call; the fd is an open PTY master.
        let rc = unsafe { libc::ioctl(self.fd.get_ref().as_raw_fd(), libc::TIOCSWINSZ, &ws) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

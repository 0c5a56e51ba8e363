//! Every program executed on this kernel, as the kernel's process events connector reports it
//! (CN_PROC over a `NETLINK_CONNECTOR` socket, multicast group `CN_IDX_PROC`).
//!
//! [`Watcher::subscribe`] opens the socket and asks the connector to send events
//! (`PROC_CN_MCAST_LISTEN`). The kernel only accepts that from a process in the initial user
//! and pid namespaces with `CAP_NET_ADMIN`, and only serves sockets in the initial network
//! namespace: inside a container it fails (the kernel does not answer, or answers EPERM),
//! which [`Watcher::subscribe`] reports as an error after a short wait.
//!
//! The connector reports pids only: [`procfs`] reads the rest (argv, cwd, owner, parent,
//! namespaced pids, cgroup) from `/proc/<pid>` right after the event, so a process that is
//! already gone by then leaves only what a zombie still shows (its name), or nothing.
//! [`Tracker`] remembers the processes a consumer cares about, so an exit can be matched to
//! its exec (and a duration computed) and a child to its parent.

pub mod procfs;
pub mod wire;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use netlink_sys::{protocols::NETLINK_CONNECTOR, Socket, SocketAddr};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

pub use procfs::ProcInfo;
pub use wire::ExitStatus;
use wire::{McastOp, ProcEvent};

/// What a process did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Process `pid` executed a program.
    Exec { pid: u32, at_ns: u64 },
    /// Process `parent` made process `child` (fork or clone without `CLONE_THREAD`).
    Fork { parent: u32, child: u32, at_ns: u64 },
    /// Process `pid` ended.
    Exit {
        pid: u32,
        at_ns: u64,
        status: ExitStatus,
    },
    /// The kernel dropped this many events for this socket (it fell behind): whatever they
    /// were is unknown. Told when the next event numbered on the same CPU arrives.
    Lost(u64),
}

/// Counters of one subscription.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Connector messages received.
    pub messages: u64,
    /// Events the kernel numbered but never delivered.
    pub lost: u64,
    /// Times the socket's buffer overflowed (ENOBUFS).
    pub overruns: u64,
}

/// How long [`Watcher::subscribe`] waits for the connector's answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);
/// The socket's receive buffer: room for bursts (a build starting thousands of processes)
/// while the reader reads `/proc`. Each event takes about 800 bytes of buffer.
const RECV_BUFFER: usize = 8 << 20;

/// A subscription to the process events connector.
pub struct Watcher {
    sock: Socket,
    port: u32,
    buf: Vec<u8>,
    /// Events received while waiting for the answer to the subscription.
    pending: VecDeque<Event>,
    /// The last message number seen per CPU (the kernel numbers them per CPU).
    last_seq: HashMap<u32, u32>,
    stats: Stats,
}

impl Watcher {
    /// Subscribes to process events. Fails where the kernel will not send them to us (not
    /// root of the initial namespaces, or a kernel without `CONFIG_PROC_EVENTS`).
    pub fn subscribe() -> io::Result<Self> {
        let mut sock = Socket::new(NETLINK_CONNECTOR)?;
        sock.bind(&SocketAddr::new(0, wire::CN_IDX_PROC))?;
        let mut addr = SocketAddr::new(0, 0);
        sock.get_address(&mut addr)?;
        if let Err(e) = sock.set_rx_buf_sz(RECV_BUFFER) {
            tracing::debug!(error = %e, "could not enlarge the process events buffer");
        }
        let mut w = Watcher {
            sock,
            port: addr.port_number(),
            buf: Vec::with_capacity(16 << 10),
            pending: VecDeque::new(),
            last_seq: HashMap::new(),
            stats: Stats::default(),
        };
        // Any number tells our answer from another listener's (answers are multicast too).
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let ack = std::process::id() ^ nanos;
        w.request(McastOp::Listen, ack)?;
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "the process events connector did not answer (not in the initial user, pid \
                     and network namespaces?)",
                ));
            }
            let mut events = Vec::new();
            if let Some(err) = w.receive(left, &mut events, Some(ack.wrapping_add(1)))? {
                w.pending.extend(events);
                return match err {
                    0 => Ok(w),
                    err => Err(io::Error::from_raw_os_error(err as i32)),
                };
            }
            w.pending.extend(events);
        }
    }

    fn request(&self, op: McastOp, ack: u32) -> io::Result<()> {
        let msg = wire::mcast_request(op, ack, self.port);
        self.sock.send_to(&msg, &SocketAddr::new(0, 0), 0)?;
        Ok(())
    }

    /// The events that arrive within `timeout` (at least one unless the time runs out), in
    /// order. Threads are left out: every pid is a process (thread group) id.
    pub fn next_events(&mut self, timeout: Duration) -> io::Result<Vec<Event>> {
        let mut out: Vec<Event> = self.pending.drain(..).collect();
        if out.is_empty() {
            self.receive(timeout, &mut out, None)?;
        }
        Ok(out)
    }

    /// Sets the socket's receive buffer (the kernel doubles it, and caps it at
    /// `net.core.rmem_max`). [`Watcher::subscribe`] asks for 8 MiB.
    pub fn set_receive_buffer(&self, bytes: usize) -> io::Result<()> {
        self.sock.set_rx_buf_sz(bytes)
    }

    /// Counters so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Waits up to `timeout` for messages, then reads every one queued. Returns the error
    /// number of the answer whose `ack` is `answer`, when one came.
    fn receive(
        &mut self,
        timeout: Duration,
        out: &mut Vec<Event>,
        answer: Option<u32>,
    ) -> io::Result<Option<u32>> {
        let timeout = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(self.sock.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, timeout) {
            Ok(0) => return Ok(None),
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        let mut answered = None;
        loop {
            self.buf.clear();
            match self.sock.recv_from(&mut self.buf, libc::MSG_DONTWAIT) {
                // Only the kernel (port 0) speaks for the connector: a datagram from a
                // process is not an event, whatever it says.
                Ok((_, from)) if from.port_number() != 0 => continue,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    // The kernel dropped messages for us; the gaps in their numbers say how
                    // many once the next ones arrive.
                    self.stats.overruns += 1;
                    continue;
                }
                Err(e) => return Err(e),
            }
            for msg in wire::parse_datagram(&self.buf).into_iter().flatten() {
                self.stats.messages += 1;
                let gap = self.gap(msg.cpu, msg.seq);
                if gap > 0 {
                    self.stats.lost += gap;
                    out.push(Event::Lost(gap));
                }
                match msg.event {
                    ProcEvent::Ack { err } if Some(msg.ack) == answer => answered = Some(err),
                    ProcEvent::Exec { pid, tgid } if pid == tgid => out.push(Event::Exec {
                        pid,
                        at_ns: msg.timestamp_ns,
                    }),
                    ProcEvent::Fork {
                        parent_tgid,
                        child_pid,
                        child_tgid,
                        ..
                    } if child_pid == child_tgid => out.push(Event::Fork {
                        parent: parent_tgid,
                        child: child_tgid,
                        at_ns: msg.timestamp_ns,
                    }),
                    ProcEvent::Exit {
                        pid,
                        tgid,
                        exit_code,
                        ..
                    } if pid == tgid => out.push(Event::Exit {
                        pid,
                        at_ns: msg.timestamp_ns,
                        status: ExitStatus::from_wait_status(exit_code),
                    }),
                    _ => {}
                }
            }
        }
        Ok(answered)
    }

    /// Messages missing before number `seq` on `cpu`.
    fn gap(&mut self, cpu: u32, seq: u32) -> u64 {
        let gap = match self.last_seq.insert(cpu, seq) {
            Some(last) => seq.wrapping_sub(last).wrapping_sub(1),
            None => 0,
        };
        // A number going backwards (a message reordered, or the counter restarted) is no loss.
        if gap < 1 << 24 {
            u64::from(gap)
        } else {
            0
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        // The kernel counts listeners and builds events while any is counted; tell it this
        // one is gone (older kernels never notice a closed socket).
        let _ = self.request(McastOp::Ignore, 0);
    }
}

/// A process a consumer follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tracked<T> {
    pub tag: T,
    /// When it executed its last program (ns since boot); `None` for a child that has not
    /// executed anything yet.
    pub exec_ns: Option<u64>,
}

/// The end of a followed process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended<T> {
    pub tag: T,
    /// How long its last program ran; `None` when it never executed one (a fork only).
    pub ran: Option<Duration>,
}

/// The processes a consumer follows, by pid, with a tag of its own (e.g. which sandbox).
///
/// Bounded: exits can be lost (an overrun), so when it holds more than its bound it forgets
/// the processes that no longer exist.
pub struct Tracker<T> {
    procs: HashMap<u32, Tracked<T>>,
    bound: usize,
}

impl<T: Clone> Tracker<T> {
    pub fn new(bound: usize) -> Self {
        Self {
            procs: HashMap::new(),
            bound,
        }
    }

    pub fn get(&self, pid: u32) -> Option<&Tracked<T>> {
        self.procs.get(&pid)
    }

    pub fn len(&self) -> usize {
        self.procs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    /// Follows `pid`, which has not executed anything we saw (e.g. already running).
    pub fn adopt(&mut self, pid: u32, tag: T) {
        self.procs
            .entry(pid)
            .or_insert(Tracked { tag, exec_ns: None });
        self.bound_size();
    }

    /// `pid` executed a program at `at_ns`.
    pub fn exec(&mut self, pid: u32, at_ns: u64, tag: T) {
        self.procs.insert(
            pid,
            Tracked {
                tag,
                exec_ns: Some(at_ns),
            },
        );
        self.bound_size();
    }

    /// A followed parent made `child`: the child is followed with the parent's tag. Whether
    /// the parent was followed.
    pub fn fork(&mut self, parent: u32, child: u32) -> bool {
        let Some(tag) = self.procs.get(&parent).map(|t| t.tag.clone()) else {
            return false;
        };
        self.adopt(child, tag);
        true
    }

    /// `pid` ended at `at_ns`: forgets it, and returns its tag when it was followed.
    pub fn exit(&mut self, pid: u32, at_ns: u64) -> Option<Ended<T>> {
        let t = self.procs.remove(&pid)?;
        Some(Ended {
            tag: t.tag,
            ran: t
                .exec_ns
                .map(|start| Duration::from_nanos(at_ns.saturating_sub(start))),
        })
    }

    /// Forgets every process whose tag matches (e.g. a sandbox that is gone).
    pub fn forget_where(&mut self, mut matches: impl FnMut(&T) -> bool) {
        self.procs.retain(|_, t| !matches(&t.tag));
    }

    fn bound_size(&mut self) {
        if self.procs.len() <= self.bound {
            return;
        }
        self.procs
            .retain(|pid, _| std::path::Path::new(&format!("/proc/{pid}")).exists());
        if self.procs.len() > self.bound {
            // Still too many live processes: the ones that never executed anything matter least.
            self.procs.retain(|_, t| t.exec_ns.is_some());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tracker_times_a_program_and_follows_children() {
        let mut t: Tracker<&str> = Tracker::new(100);
        t.exec(10, 1_000, "a");
        assert!(t.fork(10, 11));
        assert!(!t.fork(99, 12));
        let child = t.exit(11, 5_000).unwrap();
        assert_eq!((child.tag, child.ran), ("a", None));
        let parent = t.exit(10, 3_001_000).unwrap();
        assert_eq!(parent.ran, Some(Duration::from_millis(3)));
        assert!(t.exit(10, 0).is_none());
        assert!(t.is_empty());
    }

    #[test]
    fn the_tracker_stays_bounded_by_forgetting_gone_processes() {
        let mut t: Tracker<u8> = Tracker::new(4);
        // Pids far above any real pid_max: none exists.
        for pid in 0..10 {
            t.exec(4_000_000_000 + pid, 0, 1);
        }
        assert!(t.len() <= 4, "{}", t.len());
        t.adopt(std::process::id(), 2);
        t.forget_where(|tag| *tag == 1);
        assert_eq!(t.len(), 1);
    }
}

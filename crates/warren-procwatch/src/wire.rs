//! The bytes of the process events connector: netlink header, `struct cn_msg`, `struct
//! proc_event` (include/uapi/linux/netlink.h, connector.h, cn_proc.h), parsed from and built
//! into plain byte slices. Everything is in the host's byte order; the kernel and this process
//! share it. Parsing never trusts a length it has not checked against the slice.

/// `struct nlmsghdr`: len u32, type u16, flags u16, seq u32, pid u32.
pub const NLMSG_HDRLEN: usize = 16;
/// `struct cn_msg` without its data: id (idx u32, val u32), seq u32, ack u32, len u16, flags u16.
pub const CN_MSG_LEN: usize = 20;
/// `NLMSG_DONE`: the connector sends every message with this type.
pub const NLMSG_DONE: u16 = 3;
/// `NLMSG_ERROR`, `NLMSG_NOOP` and `NLMSG_OVERRUN` carry no connector payload.
const NLMSG_NOOP: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_OVERRUN: u16 = 4;
/// `CN_IDX_PROC` / `CN_VAL_PROC`: the process events connector's id (and multicast group).
pub const CN_IDX_PROC: u32 = 1;
pub const CN_VAL_PROC: u32 = 1;

/// `enum proc_cn_mcast_op`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum McastOp {
    Listen = 1,
    Ignore = 2,
}

const PROC_EVENT_NONE: u32 = 0;
const PROC_EVENT_FORK: u32 = 0x1;
const PROC_EVENT_EXEC: u32 = 0x2;
const PROC_EVENT_EXIT: u32 = 0x8000_0000;
/// Offset of `event_data` in `struct proc_event`: what u32, cpu u32, timestamp_ns u64.
const EVENT_DATA: usize = 16;

/// One `struct proc_event`, the kinds this crate uses decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcEvent {
    /// `PROC_EVENT_NONE`: the answer to a listen or ignore request (`err` 0: done).
    Ack {
        err: u32,
    },
    Fork {
        parent_pid: u32,
        parent_tgid: u32,
        child_pid: u32,
        child_tgid: u32,
    },
    Exec {
        pid: u32,
        tgid: u32,
    },
    Exit {
        pid: u32,
        tgid: u32,
        /// The task's `exit_code`: a wait status (`code << 8`, or the signal, `| 0x80` on a core).
        exit_code: u32,
        /// The signal the parent is sent (SIGCHLD usually), not what killed the task.
        exit_signal: u32,
        /// Absent from kernels older than 4.x, whose exit event is shorter.
        parent_tgid: Option<u32>,
    },
    /// Any other kind (uid, gid, sid, ptrace, comm, coredump): not used.
    Other {
        what: u32,
    },
}

/// One connector message of the process events connector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message {
    /// The kernel numbers messages per CPU, without gaps: a gap on one CPU is lost messages.
    pub seq: u32,
    pub ack: u32,
    pub cpu: u32,
    /// Nanoseconds since boot (CLOCK_MONOTONIC).
    pub timestamp_ns: u64,
    pub event: ProcEvent,
}

/// Why a netlink message was not a process event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// Shorter than its headers say or need.
    Truncated,
    /// A connector message of another connector (or a netlink control message).
    NotProcEvent,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    let bytes = b.get(at..at.checked_add(2)?)?;
    Some(u16::from_ne_bytes(bytes.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    let bytes = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_ne_bytes(bytes.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    let bytes = b.get(at..at.checked_add(8)?)?;
    Some(u64::from_ne_bytes(bytes.try_into().ok()?))
}

/// The netlink messages of one datagram (one, from the connector, but netlink allows more),
/// each parsed. A message whose length is impossible ends the walk: nothing after it can be
/// found.
pub fn parse_datagram(buf: &[u8]) -> Vec<Result<Message, ParseError>> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while buf.len().saturating_sub(at) >= NLMSG_HDRLEN {
        let (Some(len), Some(kind)) = (u32_at(buf, at), u16_at(buf, at + 4)) else {
            break;
        };
        let len = len as usize;
        let Some(msg) = at.checked_add(len).and_then(|end| buf.get(at..end)) else {
            out.push(Err(ParseError::Truncated));
            break;
        };
        if len < NLMSG_HDRLEN {
            out.push(Err(ParseError::Truncated));
            break;
        }
        out.push(match kind {
            NLMSG_NOOP | NLMSG_ERROR | NLMSG_OVERRUN => Err(ParseError::NotProcEvent),
            _ => parse_cn_msg(&msg[NLMSG_HDRLEN..]),
        });
        // NLMSG_ALIGN: messages start on 4-byte boundaries.
        at += (len + 3) & !3;
    }
    out
}

/// One `struct cn_msg` carrying a `struct proc_event`.
pub fn parse_cn_msg(b: &[u8]) -> Result<Message, ParseError> {
    let header = (
        u32_at(b, 0),
        u32_at(b, 4),
        u32_at(b, 8),
        u32_at(b, 12),
        u16_at(b, 16),
    );
    let (Some(idx), Some(val), Some(seq), Some(ack), Some(len)) = header else {
        return Err(ParseError::Truncated);
    };
    if (idx, val) != (CN_IDX_PROC, CN_VAL_PROC) {
        return Err(ParseError::NotProcEvent);
    }
    let data = b
        .get(CN_MSG_LEN..CN_MSG_LEN + len as usize)
        .ok_or(ParseError::Truncated)?;
    let (Some(what), Some(cpu), Some(timestamp_ns)) =
        (u32_at(data, 0), u32_at(data, 4), u64_at(data, 8))
    else {
        return Err(ParseError::Truncated);
    };
    let field = |i: usize| u32_at(data, EVENT_DATA + 4 * i).ok_or(ParseError::Truncated);
    let event = match what {
        PROC_EVENT_NONE => ProcEvent::Ack { err: field(0)? },
        PROC_EVENT_FORK => ProcEvent::Fork {
            parent_pid: field(0)?,
            parent_tgid: field(1)?,
            child_pid: field(2)?,
            child_tgid: field(3)?,
        },
        PROC_EVENT_EXEC => ProcEvent::Exec {
            pid: field(0)?,
            tgid: field(1)?,
        },
        PROC_EVENT_EXIT => ProcEvent::Exit {
            pid: field(0)?,
            tgid: field(1)?,
            exit_code: field(2)?,
            exit_signal: field(3)?,
            parent_tgid: field(5).ok(),
        },
        what => ProcEvent::Other { what },
    };
    Ok(Message {
        seq,
        ack,
        cpu,
        timestamp_ns,
        event,
    })
}

/// A request to the connector: start (`Listen`) or stop (`Ignore`) sending process events to
/// this socket. The answer is an [`ProcEvent::Ack`] whose `ack` is this one's plus one.
pub fn mcast_request(op: McastOp, ack: u32, port: u32) -> Vec<u8> {
    let data_len: u16 = 4;
    let total = NLMSG_HDRLEN + CN_MSG_LEN + usize::from(data_len);
    let mut b = Vec::with_capacity(total);
    // nlmsghdr
    b.extend_from_slice(&(total as u32).to_ne_bytes());
    b.extend_from_slice(&NLMSG_DONE.to_ne_bytes());
    b.extend_from_slice(&0u16.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes());
    b.extend_from_slice(&port.to_ne_bytes());
    // cn_msg
    b.extend_from_slice(&CN_IDX_PROC.to_ne_bytes());
    b.extend_from_slice(&CN_VAL_PROC.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes());
    b.extend_from_slice(&ack.to_ne_bytes());
    b.extend_from_slice(&data_len.to_ne_bytes());
    b.extend_from_slice(&0u16.to_ne_bytes());
    // enum proc_cn_mcast_op (the short form: every event kind)
    b.extend_from_slice(&(op as u32).to_ne_bytes());
    b
}

/// How a process ended, from the wait status the kernel reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// `exit(code)`.
    Exited(i32),
    /// Killed by `signal` (`core`: it dumped core).
    Signaled { signal: i32, core: bool },
}

impl ExitStatus {
    /// Decodes a wait status (as `WIFEXITED`/`WTERMSIG` do).
    pub fn from_wait_status(status: u32) -> Self {
        let signal = (status & 0x7f) as i32;
        if signal == 0 {
            ExitStatus::Exited(((status >> 8) & 0xff) as i32)
        } else {
            ExitStatus::Signaled {
                signal,
                core: status & 0x80 != 0,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A datagram as the kernel sends it: nlmsghdr + cn_msg + proc_event with `data` after the
    /// proc_event header.
    fn datagram(seq: u32, cpu: u32, what: u32, ts: u64, data: &[u32]) -> Vec<u8> {
        let mut ev = Vec::new();
        ev.extend_from_slice(&what.to_ne_bytes());
        ev.extend_from_slice(&cpu.to_ne_bytes());
        ev.extend_from_slice(&ts.to_ne_bytes());
        for d in data {
            ev.extend_from_slice(&d.to_ne_bytes());
        }
        // The union is as large as its largest member (comm: 24 bytes); pad like the kernel.
        ev.resize(EVENT_DATA + 24, 0);
        let mut cn = Vec::new();
        for v in [CN_IDX_PROC, CN_VAL_PROC, seq, 0] {
            cn.extend_from_slice(&v.to_ne_bytes());
        }
        cn.extend_from_slice(&(ev.len() as u16).to_ne_bytes());
        cn.extend_from_slice(&0u16.to_ne_bytes());
        cn.extend_from_slice(&ev);
        let mut b = Vec::new();
        b.extend_from_slice(&((NLMSG_HDRLEN + cn.len()) as u32).to_ne_bytes());
        b.extend_from_slice(&NLMSG_DONE.to_ne_bytes());
        b.extend_from_slice(&0u16.to_ne_bytes());
        b.extend_from_slice(&seq.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        b.extend_from_slice(&cn);
        b
    }

    #[test]
    fn an_exec_event_is_parsed() {
        let b = datagram(7, 1, PROC_EVENT_EXEC, 123_456, &[4242, 4242]);
        let got = parse_datagram(&b);
        assert_eq!(
            got,
            vec![Ok(Message {
                seq: 7,
                ack: 0,
                cpu: 1,
                timestamp_ns: 123_456,
                event: ProcEvent::Exec {
                    pid: 4242,
                    tgid: 4242
                }
            })]
        );
    }

    #[test]
    fn an_exit_event_carries_the_wait_status_and_parent() {
        let b = datagram(1, 0, PROC_EVENT_EXIT, 9, &[10, 10, 3 << 8, 17, 5, 5]);
        let [Ok(m)] = parse_datagram(&b)[..] else {
            panic!("one message")
        };
        assert_eq!(
            m.event,
            ProcEvent::Exit {
                pid: 10,
                tgid: 10,
                exit_code: 0x300,
                exit_signal: 17,
                parent_tgid: Some(5)
            }
        );
    }

    #[test]
    fn fork_and_ack_events_are_parsed() {
        let fork = datagram(2, 0, PROC_EVENT_FORK, 1, &[1, 1, 2, 2]);
        assert!(matches!(
            parse_datagram(&fork)[0],
            Ok(Message {
                event: ProcEvent::Fork {
                    parent_tgid: 1,
                    child_tgid: 2,
                    ..
                },
                ..
            })
        ));
        let ack = datagram(3, 0, PROC_EVENT_NONE, 1, &[1]);
        assert!(matches!(
            parse_datagram(&ack)[0],
            Ok(Message {
                event: ProcEvent::Ack { err: 1 },
                ..
            })
        ));
    }

    #[test]
    fn two_messages_in_one_datagram_are_both_read() {
        let mut b = datagram(1, 0, PROC_EVENT_EXEC, 1, &[1, 1]);
        b.extend(datagram(2, 0, PROC_EVENT_EXEC, 2, &[2, 2]));
        assert_eq!(parse_datagram(&b).len(), 2);
    }

    #[test]
    fn truncated_and_foreign_messages_are_errors_not_panics() {
        let b = datagram(1, 0, PROC_EVENT_EXIT, 1, &[1, 1, 0, 17, 0, 0]);
        for cut in 0..b.len() {
            // Every prefix parses to something without panicking.
            let _ = parse_datagram(&b[..cut]);
        }
        assert_eq!(
            parse_datagram(&b[..b.len() - 1]),
            vec![Err(ParseError::Truncated)]
        );
        let mut foreign = b.clone();
        foreign[NLMSG_HDRLEN..NLMSG_HDRLEN + 4].copy_from_slice(&9u32.to_ne_bytes());
        assert_eq!(
            parse_datagram(&foreign),
            vec![Err(ParseError::NotProcEvent)]
        );
        // A length field smaller than the header must not loop forever.
        let mut zero = b.clone();
        zero[0..4].copy_from_slice(&0u32.to_ne_bytes());
        assert_eq!(parse_datagram(&zero), vec![Err(ParseError::Truncated)]);
        // An old kernel's exit event without the parent fields.
        let mut old = datagram(1, 0, PROC_EVENT_EXIT, 1, &[1, 1, 0, 17]);
        let short = (EVENT_DATA + 16) as u16;
        let at = NLMSG_HDRLEN + 16;
        old[at..at + 2].copy_from_slice(&short.to_ne_bytes());
        let len = NLMSG_HDRLEN + CN_MSG_LEN + usize::from(short);
        old.truncate(len);
        old[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
        assert!(matches!(
            parse_datagram(&old)[0],
            Ok(Message {
                event: ProcEvent::Exit {
                    parent_tgid: None,
                    ..
                },
                ..
            })
        ));
    }

    #[test]
    fn the_listen_request_has_the_connector_layout() {
        let b = mcast_request(McastOp::Listen, 41, 99);
        assert_eq!(b.len(), 40);
        assert_eq!(u32_at(&b, 0), Some(40));
        assert_eq!(u16_at(&b, 4), Some(NLMSG_DONE));
        assert_eq!(u32_at(&b, 12), Some(99));
        assert_eq!(u32_at(&b, 16), Some(CN_IDX_PROC));
        assert_eq!(u32_at(&b, 20), Some(CN_VAL_PROC));
        assert_eq!(u32_at(&b, 28), Some(41));
        assert_eq!(u16_at(&b, 32), Some(4));
        assert_eq!(u32_at(&b, 36), Some(1));
    }

    #[test]
    fn wait_statuses_decode() {
        assert_eq!(ExitStatus::from_wait_status(0), ExitStatus::Exited(0));
        assert_eq!(ExitStatus::from_wait_status(3 << 8), ExitStatus::Exited(3));
        assert_eq!(
            ExitStatus::from_wait_status(9),
            ExitStatus::Signaled {
                signal: 9,
                core: false
            }
        );
        assert_eq!(
            ExitStatus::from_wait_status(0x80 | 11),
            ExitStatus::Signaled {
                signal: 11,
                core: true
            }
        );
    }
}

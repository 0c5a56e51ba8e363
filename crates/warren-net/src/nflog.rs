//! Flow-log entries for what a slot's nftables filter decides alone: connections allowed or
//! refused by address (no name involved, so neither the resolver nor the egress proxy sees
//! them).
//!
//! The slot's filter logs the first packet of each such connection to NFLOG group
//! [`GROUP`] with a prefix that says the verdict ([`rules`]: rate-limited per slot, and the
//! verdict is a separate rule, so a packet over the limit is decided all the same). The
//! nfnetlink_log instance is per network namespace, so every slot has its own group
//! [`GROUP`]; a reader per leased slot holds a netlink socket made inside the slot's
//! namespace, parses each logged packet's IPv4 header and records a [`Flow`].
//! Messages are built and parsed with `netlink-packet-netfilter`; the socket is
//! `netlink-sys`'s.
//!
//! [`rules`]: crate::rules

use std::os::fd::{FromRawFd, IntoRawFd};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
use netlink_packet_netfilter::nflog::{
    config_request, ConfigCmd, ConfigMode, ConfigNla, PacketNla, Timeout, ULogMessage,
};
use netlink_packet_netfilter::{NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily};
use netlink_sys::constants::NETLINK_NETFILTER;
use netlink_sys::{AsyncSocketExt, Socket, TokioSocket};
use warren_runtime::flows::{Flow, FlowKind, FlowVerdict};

use crate::error::{Error, Result};
use crate::flows::{now_ms, FlowLog};

/// The NFLOG group of every slot's filter (one instance per namespace).
pub(crate) const GROUP: u16 = 7;
/// Log prefixes, one per verdict.
pub(crate) const ALLOW: &str = "wr-allow";
pub(crate) const DENY: &str = "wr-deny";
pub(crate) const BLOCK: &str = "wr-block";
/// Log entries per second and slot (each verdict kind); more are decided but not logged.
pub(crate) const RATE: u32 = 50;
/// Bytes of each packet copied to the reader: the IPv4 header and the ports.
const SNAPLEN: u32 = 64;

/// The `nft` statement that logs a connection's first packet with `prefix`, at most
/// `rate` per second (burst twice that).
pub(crate) fn log_statement(prefix: &str, rate: u32) -> String {
    format!(
        "limit rate {rate}/second burst {} packets log prefix \"{prefix}\" group {GROUP} \
         snaplen {SNAPLEN} queue-threshold 1",
        rate.saturating_mul(2)
    )
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Resolver { what, source }
}

/// A socket bound to group [`GROUP`] of the namespace at `netns`.
fn open_in(netns: &Path) -> Result<Socket> {
    crate::netns::run_in(netns, || -> Result<Socket> {
        let mut s = Socket::new(NETLINK_NETFILTER).map_err(io("open an NFLOG socket"))?;
        s.bind_auto().map_err(io("bind the NFLOG socket"))?;
        // Bursts must not overflow the socket before the reader runs (ENOBUFS loses them).
        let _ = s.set_rx_buf_sz(1 << 20);
        let flush: Timeout = Duration::from_millis(50).into();
        let req = config_request(
            NetfilterProtoFamily::Unspec,
            GROUP,
            vec![
                ConfigCmd::Bind.into(),
                ConfigMode::new_packet(SNAPLEN).into(),
                ConfigNla::QThresh(1),
                flush.into(),
            ],
        );
        let mut buf = vec![0; req.header.length as usize];
        req.serialize(&mut buf);
        s.send(&buf, 0).map_err(io("configure the NFLOG group"))?;
        Ok(s)
    })?
}

/// Reads slot `slot`'s logged packets into `flows` until the task is aborted. Opening is
/// retried briefly: the socket of the slot's previous reader may still be closing (the
/// group can be bound once per namespace).
pub(crate) async fn read(slot: String, netns: std::path::PathBuf, flows: Arc<FlowLog>) {
    let mut socket = None;
    for _ in 0..20 {
        let path = netns.clone();
        match tokio::task::spawn_blocking(move || open_in(&path)).await {
            Ok(Ok(s)) => {
                socket = Some(s);
                break;
            }
            Ok(Err(e)) => tracing::debug!(%slot, error = %e, "NFLOG reader not ready yet"),
            Err(_) => return,
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let Some(socket) = socket else {
        tracing::warn!(%slot, "no NFLOG reader: connections decided by address are not logged");
        return;
    };
    // SAFETY: the descriptor comes from `into_raw_fd` of a socket this function owns, so
    // nothing else closes or uses it; `TokioSocket` takes that ownership over.
    let socket = unsafe { TokioSocket::from_raw_fd(socket.into_raw_fd()) };
    loop {
        let buf = match socket.recv_from_full().await {
            Ok((buf, _)) => buf,
            Err(e) => {
                // ENOBUFS: entries were lost, the socket goes on.
                tracing::debug!(%slot, error = %e, "NFLOG receive");
                continue;
            }
        };
        for (prefix, payload) in packets(&buf) {
            if let Some(flow) = flow_of(&prefix, &payload) {
                flows.record(&slot, flow);
            }
        }
    }
}

/// The (prefix, packet) pairs of one receive (several messages may come at once).
fn packets(buf: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut off = 0;
    while off < buf.len() {
        let Ok(msg) = NetlinkMessage::<NetfilterMessage>::deserialize(&buf[off..]) else {
            break;
        };
        let len = msg.header.length as usize;
        if let NetlinkPayload::InnerMessage(NetfilterMessage {
            inner: NetfilterMessageInner::ULog(ULogMessage::Packet(nlas)),
            ..
        }) = msg.payload
        {
            let mut prefix = String::new();
            let mut payload = Vec::new();
            for nla in nlas {
                match nla {
                    PacketNla::Prefix(p) => prefix = p.to_string_lossy().into_owned(),
                    PacketNla::Payload(p) => payload = p,
                    _ => {}
                }
            }
            out.push((prefix, payload));
        }
        if len == 0 {
            break;
        }
        off += (len + 3) & !3;
    }
    out
}

/// The flow one logged IPv4 packet stands for.
pub(crate) fn flow_of(prefix: &str, packet: &[u8]) -> Option<Flow> {
    let (verdict, reason) = match prefix.trim() {
        ALLOW => (FlowVerdict::Allowed, None),
        DENY => (
            FlowVerdict::Denied,
            Some("address denied by the sandbox's policy"),
        ),
        BLOCK => (
            FlowVerdict::Denied,
            Some("a range only the operator may open (private, loopback, link-local, host)"),
        ),
        _ => return None,
    };
    if packet.len() < 20 || packet[0] >> 4 != 4 {
        return None;
    }
    let header = usize::from(packet[0] & 0x0f) * 4;
    let dst = std::net::Ipv4Addr::new(packet[16], packet[17], packet[18], packet[19]);
    let port = packet
        .get(header + 2..header + 4)
        .map(|p| u16::from_be_bytes([p[0], p[1]]));
    let (kind, destination) = match (packet[9], port) {
        (6, Some(p)) => (FlowKind::Tcp, format!("{dst}:{p}")),
        (17, Some(p)) => (FlowKind::Udp, format!("{dst}:{p}")),
        _ => (FlowKind::Other, dst.to_string()),
    };
    Some(Flow {
        at_ms: now_ms(),
        kind,
        verdict,
        name: None,
        destination: Some(destination),
        addresses: Vec::new(),
        via: "address".into(),
        reason: reason.map(str::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ipv4(proto: u8, dst: [u8; 4], port: u16) -> Vec<u8> {
        let mut p = vec![0u8; 24];
        p[0] = 0x45;
        p[9] = proto;
        p[16..20].copy_from_slice(&dst);
        p[22..24].copy_from_slice(&port.to_be_bytes());
        p
    }

    #[test]
    fn packets_become_flows() {
        let f = flow_of(ALLOW, &ipv4(6, [192, 0, 2, 7], 443)).unwrap();
        assert_eq!(
            (f.kind, f.verdict, f.destination.as_deref()),
            (FlowKind::Tcp, FlowVerdict::Allowed, Some("192.0.2.7:443"))
        );
        let f = flow_of(DENY, &ipv4(17, [198, 51, 100, 2], 53)).unwrap();
        assert_eq!((f.kind, f.verdict), (FlowKind::Udp, FlowVerdict::Denied));
        assert!(f.reason.unwrap().contains("policy"));
        let f = flow_of(BLOCK, &ipv4(1, [10, 0, 0, 1], 0)).unwrap();
        assert_eq!(f.kind, FlowKind::Other);
        assert_eq!(f.destination.as_deref(), Some("10.0.0.1"));
        assert!(flow_of("someone-else", &ipv4(6, [1, 2, 3, 4], 80)).is_none());
        assert!(flow_of(ALLOW, &[0x60; 40]).is_none(), "not IPv4");
        assert!(flow_of(ALLOW, &[0x45; 8]).is_none(), "cut short");
    }

    #[test]
    fn the_statement_limits_then_logs() {
        assert_eq!(
            log_statement(DENY, 50),
            "limit rate 50/second burst 100 packets log prefix \"wr-deny\" group 7 snaplen 64 \
             queue-threshold 1"
        );
    }
}

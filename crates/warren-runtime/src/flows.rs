//! A sandbox's network flow log: what its egress policy decided, one entry per DNS answer
//! and per TCP connection the host's resolver and egress proxy saw.

use serde::{Deserialize, Serialize};

/// What was decided about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlowKind {
    /// A DNS query (its answer, or REFUSED).
    Dns,
    /// A TCP connection.
    Tcp,
    /// A UDP flow (its first packet).
    Udp,
    /// Another protocol (ICMP...), by its first packet.
    Other,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlowVerdict {
    Allowed,
    Denied,
}

/// One decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Flow {
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    pub kind: FlowKind,
    pub verdict: FlowVerdict,
    /// The name asked for (DNS) or carried (TLS SNI, HTTP Host), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Where a connection was headed (`ip:port`), as the sandbox addressed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub destination: Option<String>,
    /// The addresses a DNS answer gave (and the sandbox may now reach).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// How the decision was reached: `dns`, `tls-sni`, `http-host` or `address`.
    pub via: String,
    /// Why a connection was denied (or failed), when it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

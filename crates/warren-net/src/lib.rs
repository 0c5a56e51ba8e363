//! Network slots for Warren sandboxes.
//!
//! A **slot** is a named network namespace (`<prefix>-<index>`) joined to the host by a veth
//! pair. Inside, the sandbox always sees the same address ([`SANDBOX_ADDR`] on
//! [`SANDBOX_IFACE`], gateway [`SANDBOX_GATEWAY`]), so a VM snapshot restores into any slot.
//! The host reaches each slot at a unique *host-side address* from a configurable pool;
//! nftables NAT inside the slot maps one to the other. Host-wide nftables rules in the table
//! `inet <prefix>` give slots NAT egress through the host's routes, cut all egress of a slot
//! (`allow_internet_access = false`), and keep slots away from each other and from the
//! host's own services; each slot's own filter table enforces its sandbox's address policy
//! ([`SlotPolicy`]: allow and deny CIDRs, a refused TCP connection reset at once). The address plan and rules are described in docs/networking.md.
//!
//! [`NetPool`] builds slots ahead of demand and recycles them:
//!
//! ```no_run
//! # async fn demo() -> Result<(), warren_net::Error> {
//! let pool = warren_net::NetPool::start(warren_net::NetConfig::default()).await?;
//! let slot = pool.acquire(&warren_net::SlotPolicy::open()).await?;
//! // Start the sandbox inside `slot.netns_path()`, write `slot.resolv_conf()` into its
//! // /etc/resolv.conf, reach its agent at `slot.agent_endpoint()`...
//! pool.release(slot).await?;
//! pool.shutdown().await?;
//! # Ok(()) }
//! ```
//!
//! Everything here needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN for namespaces) and the
//! `ip` (iproute2), `nft` (nftables) and `conntrack` (conntrack) tools; the last one is
//! optional only with `flush_conntrack = false`.

mod addr;
mod adopt;
mod broker;
mod cleanup;
mod cmd;
mod config;
mod dns;
mod error;
mod flows;
mod host;
pub mod netns;
mod nflog;
mod peers;
mod pins;
mod policy;
mod pool;
mod proxy;
mod resolver;
pub mod rewrite;
mod rules;
mod slot;
mod vmslot;
mod watchdog;

pub use addr::{
    slot_capacity, Ipv4Cidr, ParseCidrError, SlotAddrs, AGENT_PORT, GATEWAY_MAC, NFS_PORT,
    SANDBOX_ADDR, SANDBOX_GATEWAY, SANDBOX_IFACE, SANDBOX_MAC, SANDBOX_PREFIX_LEN, TAP_IFACE,
};
pub use adopt::AdoptSlot;
pub use broker::{Broker, BrokerError, SecretFuture, SecretSource};
pub use cleanup::{cleanup_stale, CleanupReport};
pub use config::{default_blocked, DnsSource, NetConfig};
pub use dns::{parse_nameservers, DnsConfig};
pub use error::{Error, Result};
pub use policy::SlotPolicy;
pub use pool::{NetPool, PoolStats};
pub use slot::Slot;
pub use watchdog::TableCheck;

//! Host-wide state: the prefix lock, IPv4 forwarding, the `inet <prefix>` table, and
//! listing the objects (namespaces, links, tables) that exist on the host.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde_json::Value;

use crate::addr::Ipv4Cidr;
use crate::cmd::{Invocation, IP, NFT};
use crate::config::NetConfig;
use crate::error::{Error, Result};
use crate::rules::SlotFilter;

const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

/// Exclusive ownership of a prefix on this host, held for the lifetime of a pool.
///
/// An advisory `flock` on `<run_dir>/<prefix>.lock`: the kernel drops it when the owner
/// exits, even by crashing, so "the lock is free" proves no live pool owns the prefix and
/// everything carrying it is a leftover that is safe to remove.
#[derive(Debug)]
pub(crate) struct PrefixLock {
    _lock: Flock<File>,
}

impl PrefixLock {
    pub fn acquire(config: &NetConfig) -> Result<Self> {
        let dir = &config.run_dir;
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let path = dir.join(format!("{}.lock", config.prefix));
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(Self { _lock: lock }),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(Error::PrefixInUse {
                prefix: config.prefix.clone(),
                path,
            }),
            Err((_, errno)) => Err(Error::io(path, errno.into())),
        }
    }
}

/// How slots get IPv4 forwarding on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Forwarding {
    /// `net.ipv4.ip_forward` was already on: every interface forwards; nothing to do.
    Global,
    /// Forwarding is on only for these uplinks and for each slot link (set at creation).
    PerLink { uplinks: Vec<String> },
}

/// Makes slots' traffic forwardable without turning on `net.ipv4.ip_forward`, which would
/// make the host route between all its networks.
///
/// The kernel checks the forwarding switch of the interface a packet *arrives* on
/// (`net.ipv4.conf.<if>.forwarding`), so forwarding is needed on each slot link (the
/// sandbox's packets) and on the uplinks (the replies, which the host de-masquerades and
/// forwards to the slot); measured on Linux 6.18: with either alone, NAT egress fails.
/// The global switch is left alone: if it is already on, nothing changes; it is never
/// turned off (other software may rely on it).
pub(crate) async fn setup_forwarding(config: &NetConfig) -> Result<Forwarding> {
    let current = std::fs::read_to_string(IP_FORWARD).map_err(|e| Error::io(IP_FORWARD, e))?;
    if current.trim() == "1" {
        return Ok(Forwarding::Global);
    }
    let uplinks = if config.forward_uplinks.is_empty() {
        default_route_devs().await?
    } else {
        config.forward_uplinks.clone()
    };
    for uplink in &uplinks {
        enable_link_forwarding(uplink)?;
    }
    Ok(Forwarding::PerLink { uplinks })
}

/// Turns on IPv4 forwarding for packets arriving on the host link `name`.
pub(crate) fn enable_link_forwarding(name: &str) -> Result<()> {
    let path = PathBuf::from(format!("/proc/sys/net/ipv4/conf/{name}/forwarding"));
    std::fs::write(&path, "1\n").map_err(|e| Error::io(path, e))
}

/// The interfaces of the host's IPv4 default routes (main table).
async fn default_route_devs() -> Result<Vec<String>> {
    let command = "ip -j -4 route show default";
    let out = Invocation::new(IP)
        .args(["-j", "-4", "route", "show", "default"])
        .run()
        .await?;
    let mut devs: Vec<String> = json_array(command, &out)?
        .iter()
        .filter_map(|r| Some(r.get("dev")?.as_str()?.to_owned()))
        .collect();
    devs.sort();
    devs.dedup();
    Ok(devs)
}

/// Every IPv4 address of the host's own interfaces: a sandbox must reach none of them, even
/// those outside the special-purpose ranges (a public address on the uplink).
pub(crate) async fn host_addrs() -> Result<Vec<std::net::Ipv4Addr>> {
    let command = "ip -j -4 addr show";
    let out = Invocation::new(IP)
        .args(["-j", "-4", "addr", "show"])
        .run()
        .await?;
    let mut addrs: Vec<std::net::Ipv4Addr> = json_array(command, &out)?
        .iter()
        .filter_map(|link| link.get("addr_info")?.as_array())
        .flatten()
        .filter_map(|a| a.get("local")?.as_str()?.parse().ok())
        .collect();
    addrs.sort();
    addrs.dedup();
    Ok(addrs)
}

/// Loads (atomically replaces) the host table.
pub(crate) async fn install_table(ruleset: String) -> Result<()> {
    Invocation::new(NFT)
        .args(["-f", "-"])
        .stdin(ruleset)
        .run()
        .await
        .map(drop)
}

pub(crate) async fn delete_table(family: &str, name: &str) -> Result<()> {
    Invocation::new(NFT)
        .args(["delete", "table", family, name])
        .run()
        .await
        .map(drop)
}

/// Fails when a route that does not belong to one of our slot links overlaps the pool:
/// handing out those addresses would hijack or shadow someone else's traffic. Run after the
/// stale cleanup, so our own leftovers are already gone.
pub(crate) async fn check_pool_free(config: &NetConfig) -> Result<()> {
    let command = "ip -j -4 route show table all";
    let out = Invocation::new(IP)
        .args(["-j", "-4", "route", "show", "table", "all"])
        .run()
        .await?;
    for route in json_array(command, &out)? {
        let dst = route.get("dst").and_then(Value::as_str).unwrap_or("");
        let dev = route.get("dev").and_then(Value::as_str).unwrap_or("");
        let route_type = route.get("type").and_then(Value::as_str).unwrap_or("");
        // Local/broadcast entries mirror addresses, which also show up as prefix routes.
        if dst == "default" || route_type == "local" || route_type == "broadcast" {
            continue;
        }
        let Ok(net) = dst.parse::<Ipv4Cidr>() else {
            continue;
        };
        if net.overlaps(&config.host_cidr) && !config.is_slot_name(dev) {
            return Err(Error::RangeInUse {
                pool: config.host_cidr,
                route: format!("{dst} dev {dev}"),
            });
        }
    }
    Ok(())
}

/// Names of all named network namespaces (`ip netns list`).
pub(crate) fn list_netns() -> Result<Vec<String>> {
    // `ip netns list` reads /run/netns; doing it ourselves saves a process.
    let dir = Path::new(crate::netns::NETNS_DIR);
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(dir, e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        if let Some(name) = entry.file_name().to_str() {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

/// Names of all links in the host namespace.
pub(crate) fn list_links() -> Result<Vec<String>> {
    let dir = Path::new("/sys/class/net");
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        if let Some(name) = entry.file_name().to_str() {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

/// Whether a link of that name exists in the host namespace.
pub(crate) fn link_exists(name: &str) -> bool {
    PathBuf::from("/sys/class/net").join(name).exists()
}

/// All nftables tables of the host namespace as (family, name).
pub(crate) async fn list_tables() -> Result<Vec<(String, String)>> {
    let command = "nft -j list tables";
    let out = Invocation::new(NFT)
        .args(["-j", "list", "tables"])
        .run()
        .await?;
    let doc: Value = serde_json::from_str(&out).map_err(|e| Error::BadOutput {
        command: command.into(),
        detail: e.to_string(),
    })?;
    let items = doc
        .get("nftables")
        .and_then(Value::as_array)
        .ok_or_else(|| Error::BadOutput {
            command: command.into(),
            detail: "no `nftables` array".into(),
        })?;
    Ok(items
        .iter()
        .filter_map(|item| {
            let t = item.get("table")?;
            Some((
                t.get("family")?.as_str()?.to_owned(),
                t.get("name")?.as_str()?.to_owned(),
            ))
        })
        .collect())
}

fn json_array(command: &str, out: &str) -> Result<Vec<Value>> {
    // iproute2 prints nothing at all (not `[]`) for some empty listings.
    if out.trim().is_empty() {
        return Ok(Vec::new());
    }
    match serde_json::from_str(out) {
        Ok(Value::Array(items)) => Ok(items),
        Ok(_) => Err(Error::BadOutput {
            command: command.into(),
            detail: "expected a JSON array".into(),
        }),
        Err(e) => Err(Error::BadOutput {
            command: command.into(),
            detail: e.to_string(),
        }),
    }
}

/// The in-slot filter for this pool: the host table's isolation, repeated inside each slot.
pub(crate) async fn slot_filter(
    config: &NetConfig,
    dns: &[std::net::Ipv4Addr],
) -> Result<SlotFilter> {
    let mut isolated = vec![config.host_cidr];
    isolated.extend(
        host_addrs()
            .await?
            .into_iter()
            .filter(|a| !config.host_cidr.contains(*a))
            .map(crate::addr::Ipv4Cidr::host),
    );
    Ok(SlotFilter {
        table: config.prefix.clone(),
        blocked: config.blocked_destinations.clone(),
        isolated,
        dns_servers: dns.to_vec(),
        max_connections: config.max_connections_per_slot,
        new_per_second: config.new_connections_per_second,
        resolver_port: None,
        pool: config.host_cidr,
    })
}

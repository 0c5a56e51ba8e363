//! Addresses a slot may reach because a name its policy allows resolved to them.
//!
//! The pins themselves live in the slot's filter table (set `pinned`, with a timeout each),
//! where nftables enforces them for every protocol. This keeps a copy of what was pinned and
//! until when, so the resolver and the egress proxy skip the `nft` call when an address is
//! pinned already (the common case: a sandbox resolves a name, then connects to it).

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::cmd::{Invocation, NFT};
use crate::error::Result;
use crate::netns::netns_path;
use crate::policy;

/// Bounds of how long a pin lasts, whatever TTL the answer had: long enough for a client
/// that caches past a tiny TTL, short enough that a name's old address does not stay open.
pub(crate) const PIN_MIN_SECS: u32 = 60;
pub(crate) const PIN_MAX_SECS: u32 = 3600;
/// A pin with less than this left is renewed rather than trusted.
const RENEW_BEFORE: Duration = Duration::from_secs(30);

pub(crate) struct Pins {
    /// The pool's prefix: the name of each slot's filter table.
    table: String,
    /// By slot name: each pinned address and when its pin ends.
    known: Mutex<HashMap<String, HashMap<Ipv4Addr, Instant>>>,
}

impl Pins {
    pub(crate) fn new(table: &str) -> Self {
        Self {
            table: table.to_owned(),
            known: Mutex::new(HashMap::new()),
        }
    }

    /// Makes sure `ips` are pinned in `slot` for at least the clamped `ttl_secs`; returns
    /// once nftables has them (the caller's next packet to them passes).
    pub(crate) async fn ensure(&self, slot: &str, ips: &[Ipv4Addr], ttl_secs: u32) -> Result<()> {
        let ttl = ttl_secs.clamp(PIN_MIN_SECS, PIN_MAX_SECS);
        let now = Instant::now();
        let missing: Vec<Ipv4Addr> = {
            let known = self.lock();
            let pinned = known.get(slot);
            ips.iter()
                .copied()
                .filter(|ip| {
                    pinned
                        .and_then(|p| p.get(ip))
                        .is_none_or(|until| *until < now + RENEW_BEFORE)
                })
                .collect()
        };
        if missing.is_empty() {
            return Ok(());
        }
        // `add element` keeps an existing element's timeout, so a renewal deletes it first
        // (in the same transaction: the address never stops being reachable in between).
        let mut batch = String::new();
        for ip in &missing {
            batch.push_str(&format!(
                "add element inet {t} pinned {{ {ip} }}\ndelete element inet {t} pinned {{ {ip} }}\n",
                t = self.table
            ));
        }
        batch.push_str(&policy::pin(&self.table, &missing, ttl));
        Invocation::new(NFT)
            .args(["-f", "-"])
            .stdin(batch)
            .in_netns(&netns_path(slot))
            .run()
            .await?;
        let until = now + Duration::from_secs(u64::from(ttl));
        let mut known = self.lock();
        let pinned = known.entry(slot.to_owned()).or_default();
        pinned.retain(|_, end| *end > now);
        for ip in missing {
            pinned.insert(ip, until);
        }
        Ok(())
    }

    /// The slot's pins were flushed (a new policy, a released slot).
    pub(crate) fn forget(&self, slot: &str) {
        self.lock().remove(slot);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, HashMap<Ipv4Addr, Instant>>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }
}

//! The start of a pool: its host-side layers, and the slots it adopts.

use crate::adopt::AdoptSlot;
use crate::config::NetConfig;
use crate::dns::DnsConfig;
use crate::error::{Error, Result};
use crate::host::{self, Forwarding};
use crate::rules::{self, HostRules};
use crate::slot::{self, Slot};
use crate::watchdog;

use super::Inner;

/// What the host-side layers of a starting pool are: the in-slot filter, whether forwarding
/// is per link, the slots without egress and the host table as installed.
pub(super) struct HostLayers {
    pub filter: crate::rules::SlotFilter,
    pub forward_per_link: bool,
    pub no_egress: Vec<String>,
    pub expected_table: String,
}

/// Sets up forwarding, installs the host table (adopted slots keep their egress setting) and
/// puts the current in-slot filter into every adopted slot.
pub(super) async fn install_host_layers(
    config: &NetConfig,
    dns: &DnsConfig,
    resolver_port: u16,
    adopt: &[AdoptSlot],
    verdicts: &[std::result::Result<crate::addr::SlotAddrs, String>],
) -> Result<HostLayers> {
    let forwarding = host::setup_forwarding(config).await?;
    if let Forwarding::PerLink { uplinks } = &forwarding {
        tracing::info!(
            ?uplinks,
            "IPv4 forwarding is off on the host; enabled it on \
                the uplinks and on each slot link only"
        );
    }
    let forward_per_link = forwarding != Forwarding::Global;
    let mut filter = host::slot_filter(config, &dns.servers).await?;
    filter.resolver_port = Some(resolver_port);
    let link_glob = config.link_glob();
    let no_egress: Vec<String> = adopt
        .iter()
        .zip(verdicts)
        .filter(|(a, v)| v.is_ok() && a.effective_policy().denies_everything())
        .map(|(a, _)| config.slot_name(a.index))
        .collect();
    host::install_table(rules::host_ruleset(&HostRules {
        table: &config.prefix,
        link_glob: &link_glob,
        pool: config.host_cidr,
        blocked: &config.blocked_destinations,
        dns_servers: &dns.servers,
        no_egress: &no_egress,
        resolver_port: Some(resolver_port),
        // Private networks come back when the control plane sets each slot's peers again:
        // until then adopted sandboxes reach no other slot (closed, not open).
        peer_links: &[],
    }))
    .await?;
    let expected_table = watchdog::list_host_table(&config.prefix)
        .await?
        .ok_or_else(|| Error::HostTableMissing {
            table: format!("inet {}", config.prefix),
        })?
        .shape;
    // Adopted slots may predate the in-slot filter, or carry an older configuration's (and
    // the DNS redirect to an earlier run's resolver port).
    for (a, v) in adopt.iter().zip(verdicts) {
        if let Ok(addrs) = v {
            let name = config.slot_name(a.index);
            slot::install_filter(&name, addrs, &filter, &a.effective_policy()).await?;
            if forward_per_link {
                host::enable_link_forwarding(&name)?;
            }
        }
    }
    Ok(HostLayers {
        filter,
        forward_per_link,
        no_egress,
        expected_table,
    })
}

/// The adopted slots in the order of `adopt`, or why each could not be adopted.
pub(super) fn adopted_slots(
    inner: &Inner,
    adopt: &[AdoptSlot],
    verdicts: Vec<std::result::Result<crate::addr::SlotAddrs, String>>,
) -> Vec<Result<Slot>> {
    adopt
        .iter()
        .zip(verdicts)
        .map(|(a, verdict)| {
            let name = inner.config.slot_name(a.index);
            match verdict {
                Ok(addrs) => {
                    let mut slot = inner.slot(name, addrs);
                    slot.policy = a.effective_policy();
                    slot.internet = !slot.policy.denies_everything();
                    inner.resolver.register(
                        addrs.host_side,
                        &slot.name,
                        slot.policy.name_rules(),
                        slot.policy.denies_everything(),
                    );
                    if let Err(e) = inner.proxy.register(&slot.name, slot.policy.names.as_ref()) {
                        // Fails closed: the slot's redirect leads to nothing.
                        tracing::warn!(slot = %slot.name, error = %e,
                            "the adopted slot's TCP by name stays cut");
                    }
                    Ok(slot)
                }
                Err(reason) => {
                    tracing::warn!(slot = %name, %reason, "could not adopt a slot");
                    Err(Error::NotAdoptable { name, reason })
                }
            }
        })
        .collect()
}

//! Removing what a crashed predecessor left behind.

use std::collections::HashSet;

use crate::cmd::{Invocation, IP};
use crate::config::NetConfig;
use crate::error::{Error, Result};
use crate::host::{self, PrefixLock};
use crate::rules;

/// What a stale cleanup removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Network namespaces removed.
    pub netns: Vec<String>,
    /// Host links removed (usually the host ends of veth pairs whose namespace is gone).
    pub links: Vec<String>,
    /// nftables tables removed, as `family name`.
    pub tables: Vec<String>,
}

impl CleanupReport {
    pub fn is_empty(&self) -> bool {
        self.netns.is_empty() && self.links.is_empty() && self.tables.is_empty()
    }
}

/// Removes every network namespace, link and nftables table of `config.prefix`, after
/// taking the prefix lock to prove no live pool owns them. For tooling (e.g. a `cleanup`
/// command); a pool does the same on start.
pub async fn cleanup_stale(config: &NetConfig) -> Result<CleanupReport> {
    config.validate()?;
    let _lock = PrefixLock::acquire(config)?;
    remove_prefix_objects(config, &HashSet::new(), Tables::RemoveAll).await
}

/// What [`remove_prefix_objects`] does with the nftables tables named `<prefix>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tables {
    /// Remove them all (shutdown, standalone cleanup).
    RemoveAll,
    /// Keep the host table `inet <prefix>`, which the caller is about to replace atomically
    /// (pool start: slots adopted from the previous run stay isolated throughout), and
    /// remove any other.
    KeepHostTable,
    /// Keep them all (they belong to the live pool that calls this).
    KeepAll,
}

/// Removes the prefix's objects except the slots named in `keep`, and the tables as
/// `tables` says.
pub(crate) async fn remove_prefix_objects(
    config: &NetConfig,
    keep: &HashSet<String>,
    tables: Tables,
) -> Result<CleanupReport> {
    let mut report = CleanupReport::default();
    let stale = |name: &String| config.is_slot_name(name) && !keep.contains(name);

    report.links = host::list_links()?.into_iter().filter(stale).collect();
    report.netns = host::list_netns()?.into_iter().filter(stale).collect();
    report.links.sort();
    report.netns.sort();
    if !report.links.is_empty() || !report.netns.is_empty() {
        let links: Vec<&str> = report.links.iter().map(String::as_str).collect();
        let netns: Vec<&str> = report.netns.iter().map(String::as_str).collect();
        // -force: keep going past objects that vanish underneath us (a namespace whose
        // deletion also removed a link); what is left afterwards is checked below.
        let result = Invocation::new(IP)
            .args(["-force", "-batch", "-"])
            .stdin(rules::destroy_batch(&links, &netns))
            .run()
            .await;
        let remaining: Vec<String> = host::list_netns()?
            .into_iter()
            .filter(|n| report.netns.contains(n))
            .chain(
                report
                    .links
                    .iter()
                    .filter(|l| host::link_exists(l))
                    .cloned(),
            )
            .collect();
        if !remaining.is_empty() {
            let err = result.err().map(|e| format!(" ({e})")).unwrap_or_default();
            return Err(Error::Leftover {
                what: format!("stale network objects {}{err}", remaining.join(", ")),
            });
        }
    }

    if tables != Tables::KeepAll {
        for (family, name) in host::list_tables().await? {
            let host_table = family == "inet" && tables == Tables::KeepHostTable;
            if name == config.prefix && !host_table {
                host::delete_table(&family, &name).await?;
                report.tables.push(format!("{family} {name}"));
            }
        }
    }
    Ok(report)
}

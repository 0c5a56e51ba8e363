//! The pool's side of the host table: what it holds (the no-egress set and the private
//! networks' link pairs, from the pool's own record) and the watchdog's check and restore.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use super::Inner;
use crate::error::{Error, Result};
use crate::host;
use crate::rules::{self, HostRules};
use crate::watchdog::{self, TableCheck};

impl Inner {
    pub(super) fn host_ruleset(&self, no_egress: &[String]) -> String {
        let peer_links: Vec<(String, String)> = self
            .lock()
            .peer_links
            .values()
            .flatten()
            .cloned()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        rules::host_ruleset(&HostRules {
            peer_links: &peer_links,
            table: &self.config.prefix,
            link_glob: &self.config.link_glob(),
            pool: self.config.host_cidr,
            blocked: &self.config.blocked_destinations,
            dns_servers: &self.dns.servers,
            no_egress,
            resolver_port: Some(self.resolver.port()),
        })
    }

    pub(super) async fn check_host_table(&self) -> Result<TableCheck> {
        let _table = self.table_lock.lock().await;
        let result = self.check_and_restore().await;
        self.healthy.store(result.is_ok(), Ordering::Relaxed);
        result
    }

    async fn check_and_restore(&self) -> Result<TableCheck> {
        let table = &self.config.prefix;
        let want: Vec<String> = self.lock().no_egress.iter().cloned().collect();
        let want_links: BTreeSet<(String, String)> =
            self.lock().peer_links.values().flatten().cloned().collect();
        let found = watchdog::list_host_table(table).await?;
        let verdict = match &found {
            None => TableCheck::RestoredMissing,
            Some(l)
                if l.shape
                    == *self
                        .expected_table
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                    && l.no_egress.iter().eq(want.iter())
                    && l.peer_links == want_links =>
            {
                return Ok(TableCheck::Intact)
            }
            Some(_) => TableCheck::RestoredAltered,
        };
        tracing::warn!(table = %format!("inet {table}"), ?verdict,
            "the host's nftables table of the network pool was removed or changed (e.g. by \
             `nft flush ruleset`); loading it again");
        host::install_table(self.host_ruleset(&want)).await?;
        let now =
            watchdog::list_host_table(table)
                .await?
                .ok_or_else(|| Error::HostTableMissing {
                    table: format!("inet {table}"),
                })?;
        *self
            .expected_table
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = now.shape;
        Ok(verdict)
    }
}

//! Checking that the host table is still in place.
//!
//! The host table is one of two isolation layers (the other lives inside each slot and is
//! out of reach of the host's firewall tooling). Anything that runs `nft flush ruleset` on
//! the host (a `systemctl reload nftables` on Debian, a firewalld or ufw restart) removes it,
//! and with it the slots' masquerade, the no-egress switch and the host's input and output
//! rules. The pool's watchdog lists the table periodically, compares it with what it
//! loaded, and loads it again when it is missing or differs.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::cmd::{Invocation, NFT};
use crate::error::{Error, Result};
use crate::peers::PEER_LINKS;
use crate::rules::NO_EGRESS_SET;

/// What a check of the host table found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableCheck {
    /// The table is there, as loaded.
    Intact,
    /// The table was gone and has been loaded again.
    RestoredMissing,
    /// The table had been changed (rules, chains or set elements) and has been replaced.
    RestoredAltered,
}

/// A host table as listed by nft, reduced to what must not change: everything but handles,
/// counter values and the elements of the no-egress set (which the pool changes itself and
/// compares with its own bookkeeping).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Listing {
    pub shape: String,
    pub no_egress: BTreeSet<String>,
    /// The elements of the private networks' link-pair set (the pool changes them too).
    pub peer_links: BTreeSet<(String, String)>,
}

/// Lists `inet <table>`; `None` when it does not exist.
pub(crate) async fn list_host_table(table: &str) -> Result<Option<Listing>> {
    let result = Invocation::new(NFT)
        .args(["-j", "list", "table", "inet", table])
        .run()
        .await;
    let out = match result {
        Ok(out) => out,
        // nft's way of saying the table does not exist.
        Err(Error::CommandFailed { stderr, .. })
            if stderr.contains("No such file or directory") =>
        {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    parse_listing(&out)
        .map(Some)
        .map_err(|detail| Error::BadOutput {
            command: format!("nft -j list table inet {table}"),
            detail,
        })
}

pub(crate) fn parse_listing(json: &str) -> std::result::Result<Listing, String> {
    let doc: Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let items = doc
        .get("nftables")
        .and_then(Value::as_array)
        .ok_or("no `nftables` array")?;
    let mut no_egress = BTreeSet::new();
    let mut peer_links = BTreeSet::new();
    let mut shape = Vec::new();
    for item in items {
        if item.get("metainfo").is_some() {
            continue;
        }
        let mut item = item.clone();
        if let Some(set) = item.get_mut("set").and_then(Value::as_object_mut) {
            if set.get("name").and_then(Value::as_str) == Some(NO_EGRESS_SET) {
                if let Some(Value::Array(elems)) = set.remove("elem") {
                    no_egress.extend(elems.iter().filter_map(|e| e.as_str().map(str::to_owned)));
                }
            }
            if set.get("name").and_then(Value::as_str) == Some(PEER_LINKS) {
                if let Some(Value::Array(elems)) = set.remove("elem") {
                    peer_links.extend(elems.iter().filter_map(|e| {
                        let pair = e.get("concat")?.as_array()?;
                        Some((
                            pair.first()?.as_str()?.to_owned(),
                            pair.get(1)?.as_str()?.to_owned(),
                        ))
                    }));
                }
            }
        }
        normalize(&mut item);
        shape.push(item);
    }
    Ok(Listing {
        shape: Value::Array(shape).to_string(),
        no_egress,
        peer_links,
    })
}

/// Drops handles and counter values, which change without anyone altering the table.
fn normalize(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.remove("handle");
            if let Some(c) = map.get_mut("counter") {
                *c = Value::Null;
            }
            map.values_mut().for_each(normalize);
        }
        Value::Array(items) => items.iter_mut().for_each(normalize),
        _ => {}
    }
}

/// Runs `check` every `every_ms` milliseconds, forever (the pool aborts the task), and logs
/// what it finds.
pub(crate) async fn run<F, Fut>(every_ms: u64, check: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<TableCheck>>,
{
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(every_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick fires at once; the table was just loaded.
    tick.tick().await;
    loop {
        tick.tick().await;
        match check().await {
            Ok(TableCheck::Intact) => {}
            Ok(verdict) => {
                tracing::warn!(?verdict, "restored the network pool's host table");
            }
            Err(e) => {
                tracing::error!(error = %e, "the network pool's host table is not in place \
                    and could not be restored; refusing new sandboxes until it is");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}},
        {"table": {"family": "inet", "name": "w", "handle": 7}},
        {"set": {"family": "inet", "name": "no_egress", "table": "w", "type": "ifname", "handle": 1, "elem": ["w-3", "w-1"]}},
        {"chain": {"family": "inet", "table": "w", "name": "input", "handle": 2, "type": "filter", "hook": "input", "prio": 0, "policy": "accept"}},
        {"rule": {"family": "inet", "table": "w", "chain": "input", "handle": 9, "expr": [{"counter": {"packets": 12, "bytes": 900}}, {"drop": null}]}}]}"#;

    #[test]
    fn counters_handles_and_no_egress_elements_do_not_count() {
        let a = parse_listing(LISTING).unwrap();
        assert_eq!(
            a.no_egress,
            BTreeSet::from(["w-1".to_owned(), "w-3".to_owned()])
        );
        let changed = LISTING
            .replace("\"packets\": 12", "\"packets\": 99")
            .replace("\"handle\": 9", "\"handle\": 10")
            .replace("[\"w-3\", \"w-1\"]", "[\"w-3\"]");
        let b = parse_listing(&changed).unwrap();
        assert_eq!(a.shape, b.shape);
        assert_ne!(a.no_egress, b.no_egress);
        // A removed rule does count.
        let no_rule = LISTING.replace("{\"drop\": null}", "{\"accept\": null}");
        assert_ne!(parse_listing(&no_rule).unwrap().shape, a.shape);
    }
}

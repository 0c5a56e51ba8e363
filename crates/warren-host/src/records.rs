//! The records both runtimes hand the control plane to persist, as far as taking their
//! sandboxes back after a restart goes: parsing them, and the network slots to adopt for them.

use serde::{Deserialize, Serialize};
use warren_net::{AdoptSlot, NetConfig, NetPool, Slot, SlotPolicy};
use warren_runtime::{RuntimeError, RuntimeSandbox};

/// A record handed to `reattach`, with its runtime's own record parsed.
pub type Parsed<R> = (RuntimeSandbox, Option<R>);

/// What `reattach` answers: each sandbox's id with the sandbox taken back, or why not.
pub type Outcomes = Vec<(String, Result<RuntimeSandbox, RuntimeError>)>;

/// The network slot a runtime's record names. Flattened into that record
/// (`#[serde(flatten)]`): its fields stand at the record's top level.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotRecord {
    /// [`Slot::index`].
    pub slot: u32,
    pub allow_internet_access: bool,
    /// The slot's egress policy (none: open, or deny-all without internet access).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<SlotPolicy>,
}

impl SlotRecord {
    /// The record of a sandbox that holds no slot (slot 0, no policy): a paused VM's.
    pub fn unslotted(allow_internet_access: bool) -> Self {
        Self {
            slot: 0,
            allow_internet_access,
            policy: None,
        }
    }
}

impl From<&Slot> for SlotRecord {
    fn from(slot: &Slot) -> Self {
        let adopt = AdoptSlot::from(slot);
        Self {
            slot: adopt.index,
            allow_internet_access: adopt.allow_internet_access,
            policy: adopt.policy,
        }
    }
}

impl From<&SlotRecord> for AdoptSlot {
    fn from(r: &SlotRecord) -> Self {
        Self {
            index: r.slot,
            allow_internet_access: r.allow_internet_access,
            policy: r.policy.clone(),
        }
    }
}

/// Records handed to `reattach`, each with its runtime's own record parsed (`None` when it
/// cannot be: a damaged store, or a record of another release).
pub fn parse_records<R: serde::de::DeserializeOwned>(
    records: Vec<RuntimeSandbox>,
) -> Vec<Parsed<R>> {
    records
        .into_iter()
        .map(|r| {
            let rec = serde_json::from_value::<R>(r.record.clone()).ok();
            (r, rec)
        })
        .collect()
}

/// [`parse_records`], split in two: first those whose parsed record `set_aside` picks (the
/// paused sandboxes a runtime keeps without adopting anything), then the rest (in their order).
pub fn split_records<R: serde::de::DeserializeOwned>(
    records: Vec<RuntimeSandbox>,
    set_aside: impl Fn(&R) -> bool,
) -> (Vec<Parsed<R>>, Vec<Parsed<R>>) {
    parse_records(records)
        .into_iter()
        .partition(|(_, rec)| rec.as_ref().is_some_and(&set_aside))
}

/// The slots to adopt for `parsed`, in its order: one per parsed record (`slot` names its
/// [`SlotRecord`]), none for a record that did not parse.
pub fn adopt_slots<R>(parsed: &[Parsed<R>], slot: impl Fn(&R) -> &SlotRecord) -> Vec<AdoptSlot> {
    parsed
        .iter()
        .filter_map(|(_, rec)| rec.as_ref().map(|r| AdoptSlot::from(slot(r))))
        .collect()
}

/// Starts the network pool into `net`, adopting the slots of `parsed` ([`adopt_slots`]): what
/// became of each slot, in `parsed`'s order (one per parsed record). When the pool does not
/// start, `Err` holds the failure of every record of `parsed`, with that cause.
pub async fn start_adopting<R>(
    net: &tokio::sync::OnceCell<NetPool>,
    config: NetConfig,
    parsed: &[Parsed<R>],
    slot: impl Fn(&R) -> &SlotRecord,
) -> Result<std::vec::IntoIter<warren_net::Result<Slot>>, Outcomes> {
    match NetPool::start_adopting(config, adopt_slots(parsed, slot)).await {
        Ok((pool, slots)) => {
            let _ = net.set(pool);
            Ok(slots.into_iter())
        }
        Err(e) => {
            tracing::error!(error = %warren_runtime::chain(&e), "network pool did not start");
            let cause = warren_runtime::SharedCause::new(e);
            Err(parsed
                .iter()
                .map(|(r, _)| {
                    let e = RuntimeError::unavailable("network pool did not start", cause.clone());
                    (r.id.clone(), Err(e))
                })
                .collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Serialize, Deserialize)]
    struct Record {
        pid: u32,
        #[serde(flatten)]
        net: SlotRecord,
        #[serde(default)]
        paused: bool,
    }

    fn sandbox(id: &str, record: serde_json::Value) -> RuntimeSandbox {
        RuntimeSandbox {
            id: id.into(),
            agent: "127.0.0.1:49983".parse().unwrap(),
            record,
        }
    }

    #[test]
    fn a_flattened_slot_record_keeps_the_fields_at_the_top_level() {
        let policy = SlotPolicy::deny_all();
        let rec = Record {
            pid: 7,
            net: SlotRecord {
                slot: 3,
                allow_internet_access: false,
                policy: Some(policy.clone()),
            },
            paused: false,
        };
        let v = serde_json::to_value(&rec).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "pid": 7,
                "slot": 3,
                "allow_internet_access": false,
                "policy": serde_json::to_value(&policy).unwrap(),
                "paused": false,
            })
        );
        // Records written without a policy read as none, and write none.
        let old = serde_json::json!({"pid": 1, "slot": 2, "allow_internet_access": true});
        let rec: Record = serde_json::from_value(old.clone()).unwrap();
        assert_eq!(
            rec.net,
            SlotRecord {
                slot: 2,
                ..SlotRecord::unslotted(true)
            }
        );
        let mut back = serde_json::to_value(&rec).unwrap();
        back.as_object_mut().unwrap().remove("paused");
        assert_eq!(back, old);
    }

    #[tokio::test]
    async fn a_pool_that_does_not_start_fails_every_record_with_its_cause() {
        let records = vec![
            sandbox(
                "a",
                serde_json::json!({"pid": 1, "slot": 1, "allow_internet_access": true}),
            ),
            sandbox("b", serde_json::json!({"garbage": true})),
        ];
        let parsed = parse_records::<Record>(records);
        let config = NetConfig {
            prefix: "!".into(),
            ..NetConfig::default()
        };
        let net = tokio::sync::OnceCell::new();
        let failed = start_adopting(&net, config, &parsed, |r| &r.net)
            .await
            .unwrap_err();
        assert!(net.get().is_none());
        assert_eq!(failed.len(), 2);
        for ((id, result), want) in failed.iter().zip(["a", "b"]) {
            assert_eq!(id, want);
            let e = result.as_ref().unwrap_err();
            assert_eq!(e.category(), warren_runtime::Category::Unavailable);
            assert!(e.to_string().contains("network pool did not start"), "{e}");
        }
    }

    #[test]
    fn records_split_and_adopt_in_order_and_unreadable_ones_adopt_nothing() {
        let rec = |slot, paused| serde_json::json!({"pid": 1, "slot": slot, "allow_internet_access": true, "paused": paused});
        let records = vec![
            sandbox("a", rec(1, false)),
            sandbox("b", rec(2, true)),
            sandbox("c", serde_json::json!({"garbage": true})),
            sandbox("d", rec(4, false)),
        ];
        let (paused, running) = split_records::<Record>(records, |r| r.paused);
        let ids = |v: &[Parsed<Record>]| v.iter().map(|(r, _)| r.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&paused), ["b"]);
        assert_eq!(ids(&running), ["a", "c", "d"]);
        let adopt = adopt_slots(&running, |r| &r.net);
        assert_eq!(adopt.iter().map(|a| a.index).collect::<Vec<_>>(), [1, 4]);
        assert!(adopt
            .iter()
            .all(|a| a.allow_internet_access && a.policy.is_none()));
    }
}

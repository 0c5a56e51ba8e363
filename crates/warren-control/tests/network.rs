//! Egress policy decisions of the control plane: what a create and a live update hand to the
//! runtime, store-first ordering, and the recorded policy put back after a restart.

mod common;

use common::{admin, base, full_caps, start_with, FakeRuntime};
use warren_control::store::*;
use warren_control::{
    Capabilities, Config, Control, ControlError, CreateRequest, EgressPolicy, Network,
    NetworkUpdate,
};

fn lists(allow: &[&str], deny: &[&str]) -> EgressPolicy {
    let own = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    EgressPolicy::from_lists(&own(allow), &own(deny), None).unwrap()
}

/// A live update to `egress`, and to internet access where `allow_internet_access` says.
fn update(egress: EgressPolicy, allow_internet_access: Option<bool>) -> NetworkUpdate {
    NetworkUpdate {
        egress,
        allow_internet_access,
    }
}

fn applied(rt: &FakeRuntime, id: &str) -> Vec<EgressPolicy> {
    rt.egress
        .lock()
        .unwrap()
        .iter()
        .filter(|(i, _)| i == id)
        .map(|(_, p)| p.clone())
        .collect()
}

#[tokio::test]
async fn create_passes_the_policy_with_internet_access_folded_in() {
    let (c, _, rt) = start_with(full_caps(), Config::default()).await;
    let sb = admin(&c)
        .create(CreateRequest {
            allow_internet_access: Some(false),
            network: Network {
                egress: lists(&["192.0.2.0/28"], &[]),
                ..Network::default()
            },
            ..base()
        })
        .await
        .unwrap();
    let spec = rt.specs.lock().unwrap().last().unwrap().clone();
    assert_eq!(spec.id, sb.id);
    assert_eq!(
        spec.egress_policy(),
        lists(&["192.0.2.0/28"], &["0.0.0.0/0"])
    );
    // Stored as given; the flag is kept beside it.
    assert_eq!(sb.network.egress, lists(&["192.0.2.0/28"], &[]));
    assert!(!sb.allow_internet_access);
}

#[tokio::test]
async fn an_update_is_stored_then_applied_and_replaces_everything() {
    let (c, store, rt) = start_with(full_caps(), Config::default()).await;
    let sb = admin(&c)
        .create(CreateRequest {
            network: Network {
                egress: lists(&[], &["198.51.100.0/24"]),
                ..Network::default()
            },
            ..base()
        })
        .await
        .unwrap();
    admin(&c)
        .update_network(&sb.id, update(lists(&["203.0.113.1"], &[]), Some(false)))
        .await
        .unwrap();
    assert_eq!(
        applied(&rt, &sb.id),
        vec![lists(&["203.0.113.1"], &["0.0.0.0/0"])]
    );
    let rec = store.get_sandbox(&sb.id).await.unwrap().unwrap();
    assert_eq!(rec.network.egress, lists(&["203.0.113.1"], &[]));
    assert!(!rec.allow_internet_access);

    // A failing runtime: the caller hears it (503), the policy is on record, and the next
    // start of the server puts it on the sandbox.
    *rt.fail_egress.lock().unwrap() = true;
    match admin(&c)
        .update_network(&sb.id, update(lists(&[], &["192.0.2.0/24"]), None))
        .await
    {
        Err(ControlError::Unavailable(m)) => assert!(m.contains("nft failed"), "{m}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    let rec = store.get_sandbox(&sb.id).await.unwrap().unwrap();
    assert_eq!(rec.network.egress, lists(&[], &["192.0.2.0/24"]));
    assert!(rec.allow_internet_access);
    c.shutdown();
    *rt.fail_egress.lock().unwrap() = false;
    let _c2 = Control::start(store.clone(), rt.clone(), Config::default())
        .await
        .unwrap();
    assert_eq!(
        applied(&rt, &sb.id).last(),
        Some(&lists(&[], &["192.0.2.0/24"]))
    );
}

#[tokio::test]
async fn paused_sandboxes_get_the_policy_on_resume() {
    let (c, _, rt) = start_with(full_caps(), Config::default()).await;
    let sb = admin(&c).create(base()).await.unwrap();
    admin(&c).pause(&sb.id, None).await.unwrap();
    admin(&c)
        .update_network(&sb.id, update(lists(&[], &["192.0.2.0/24"]), None))
        .await
        .unwrap();
    assert!(
        applied(&rt, &sb.id).is_empty(),
        "nothing runs to apply it to"
    );
    admin(&c).connect(&sb.id, None).await.unwrap();
    let resumed = rt.specs.lock().unwrap().last().unwrap().clone();
    assert_eq!(resumed.egress_policy(), lists(&[], &["192.0.2.0/24"]));
}

#[tokio::test]
async fn runtimes_without_egress_policies_or_names_refuse_them() {
    let (c, _, _) = start_with(Capabilities::default(), Config::default()).await;
    let req = |egress| CreateRequest {
        network: Network {
            egress,
            ..Network::default()
        },
        ..base()
    };
    match admin(&c).create(req(lists(&[], &["192.0.2.0/24"]))).await {
        Err(ControlError::InvalidArgument(m)) => assert!(m.contains("does not enforce"), "{m}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    // allow_internet_access=false alone is not a list policy: it still works there.
    admin(&c)
        .create(CreateRequest {
            allow_internet_access: Some(false),
            ..base()
        })
        .await
        .unwrap();
    let (c, _, _) = start_with(full_caps(), Config::default()).await;
    match admin(&c)
        .create(req(lists(&["example.test"], &["0.0.0.0/0"])))
        .await
    {
        Err(ControlError::InvalidArgument(m)) => assert!(m.contains("domain rules"), "{m}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

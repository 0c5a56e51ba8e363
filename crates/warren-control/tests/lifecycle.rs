//! Lifecycle tests of the domain alone, against the in-test fakes of `common` (see there why
//! fakes are right here).

mod common;

use std::time::Duration;

use common::{admin, base, start};
use warren_control::{
    Config, Control, ControlError, CreateRequest, ListQuery, SandboxState, SandboxStore,
};

#[tokio::test]
async fn create_get_kill() {
    let (c, store, rt) = start(Config::default()).await;
    let sb = admin(&c).create(base()).await.unwrap();
    assert_eq!(sb.state, SandboxState::Running);
    assert!(c.route(&sb.id).is_some());
    assert_eq!(
        store.get_sandbox(&sb.id).await.unwrap().unwrap().state,
        SandboxState::Running
    );
    let route = c.route(&sb.id).unwrap();
    admin(&c).kill(&sb.id).await.unwrap();
    assert!(route.cancel.is_cancelled(), "open streams must be cut");
    assert!(c.route(&sb.id).is_none());
    assert!(rt.alive.lock().unwrap().is_empty());
    assert!(matches!(
        admin(&c).get(&sb.id).await,
        Err(ControlError::NotFound(_))
    ));
    assert!(matches!(
        admin(&c).kill(&sb.id).await,
        Err(ControlError::NotFound(_))
    ));
    assert_eq!(
        store.get_sandbox(&sb.id).await.unwrap().unwrap().state,
        SandboxState::Killed
    );
}

#[tokio::test]
async fn bad_input_changes_nothing() {
    let (c, store, _) = start(Config::default()).await;
    for t in [Some(0), Some(-5), Some(10_000_000)] {
        let r = admin(&c)
            .create(CreateRequest {
                timeout: t,
                ..base()
            })
            .await;
        assert!(matches!(r, Err(ControlError::InvalidArgument(_))), "{t:?}");
    }
    let r = admin(&c)
        .create(CreateRequest {
            template: "nope".into(),
            ..Default::default()
        })
        .await;
    assert!(matches!(r, Err(ControlError::NotFound(_))));
    assert!(admin(&c)
        .list(&ListQuery::default())
        .await
        .unwrap()
        .items
        .is_empty());
    // The bad timeouts are refused before anything is stored; the unknown template reaches
    // the runtime, and that one failed creation is remembered as failed, never as running.
    // (The count matters: "every record is Failed" also holds for an empty store.)
    let states: Vec<SandboxState> = store
        .sandboxes
        .lock()
        .unwrap()
        .values()
        .map(|s| s.state)
        .collect();
    assert_eq!(states, [SandboxState::Failed]);
}

#[tokio::test]
async fn expiry_kills_at_end_time() {
    let (c, _, rt) = start(Config::default()).await;
    let sb = admin(&c).create(base()).await.unwrap();
    admin(&c).set_timeout(&sb.id, 1).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert!(matches!(
        admin(&c).get(&sb.id).await,
        Err(ControlError::NotFound(_))
    ));
    assert!(rt.alive.lock().unwrap().is_empty());
}

#[tokio::test]
async fn connect_only_extends() {
    let (c, _, _) = start(Config::default()).await;
    let sb = admin(&c)
        .create(CreateRequest {
            timeout: Some(600),
            ..base()
        })
        .await
        .unwrap();
    let (after, resumed) = admin(&c).connect(&sb.id, Some(10)).await.unwrap();
    assert!(!resumed);
    assert_eq!(after.end_at, sb.end_at);
    let (after, _) = admin(&c).connect(&sb.id, Some(3600)).await.unwrap();
    assert!(after.end_at > sb.end_at);
}

#[tokio::test]
async fn concurrency_limit() {
    let (c, _, _) = start(Config {
        max_concurrent: 2,
        ..Config::default()
    })
    .await;
    let a = admin(&c).create(base()).await.unwrap();
    admin(&c).create(base()).await.unwrap();
    match admin(&c).create(base()).await {
        Err(ControlError::ResourceExhausted { retry_after, .. }) => {
            assert!(retry_after > Duration::ZERO)
        }
        other => panic!("expected ResourceExhausted, got {other:?}"),
    }
    admin(&c).kill(&a.id).await.unwrap();
    admin(&c).create(base()).await.unwrap();
}

#[tokio::test]
async fn restart_reattaches_or_fails_with_reason() {
    let (c, store, rt) = start(Config::default()).await;
    let keep = admin(&c).create(base()).await.unwrap();
    let lost = admin(&c).create(base()).await.unwrap();
    c.shutdown();
    rt.lose.lock().unwrap().push(lost.id.to_string());
    let c2 = Control::start(store.clone(), rt.clone(), Config::default())
        .await
        .unwrap();
    assert_eq!(
        admin(&c2).get(&keep.id).await.unwrap().state,
        SandboxState::Running
    );
    assert!(c2.route(&keep.id).is_some());
    let lost_rec = store.get_sandbox(&lost.id).await.unwrap().unwrap();
    assert_eq!(lost_rec.state, SandboxState::Failed);
    assert!(lost_rec.failure.unwrap().contains("process is gone"));
}

#[tokio::test]
async fn api_keys() {
    let (c, _, _) = start(Config::default()).await;
    assert!(matches!(
        c.keys().authenticate("whatever").await,
        Err(ControlError::Unauthenticated)
    ));
    let k = c.keys().create_api_key("ci").await.unwrap();
    assert_eq!(c.keys().authenticate(&k.secret).await.unwrap().id, k.key.id);
    c.keys()
        .seed_api_key("env", "a-known-key-for-scripts")
        .await
        .unwrap();
    c.keys()
        .seed_api_key("env", "a-known-key-for-scripts")
        .await
        .unwrap();
    assert_eq!(c.keys().api_keys().await.unwrap().len(), 2);
    c.keys().revoke_api_key(&k.key.id).await.unwrap();
    assert!(c.keys().authenticate(&k.secret).await.is_err());
    assert!(c.keys().revoke_api_key(&k.key.id).await.is_err());
}

//! A server restarted with another runtime than the one its sandboxes run on refuses to start
//! (saying how to go on) instead of handing that runtime records it cannot read.

mod common;

use common::*;
use warren_control::store::*;
use warren_control::{Config, Control, ControlError, SandboxState};

#[tokio::test]
async fn records_of_another_runtime_refuse_the_start() {
    let (c, store, rt) = start_with(full_caps(), Config::default()).await;
    let running = admin(&c).create(base()).await.unwrap();
    c.shutdown();
    // As if the sandbox had been started by the vm runtime.
    let mut sb = store.get_sandbox(&running.id).await.unwrap().unwrap();
    sb.runtime.as_mut().unwrap().record["runtime"] = "vm".into();
    store.update_sandbox(&sb).await.unwrap();

    let err = match Control::start(store.clone(), rt.clone(), Config::default()).await {
        Ok(_) => panic!("a server of the fake runtime took back a vm sandbox"),
        Err(e) => e,
    };
    let ControlError::FailedPrecondition(msg) = &err else {
        panic!("{err:?}");
    };
    assert!(
        msg.contains("vm runtime")
            && msg.contains("--runtime vm")
            && msg.contains(running.id.as_str()),
        "{msg}"
    );
    // Nothing was given up: the sandbox is still recorded as running, and still alive.
    let kept = store.get_sandbox(&running.id).await.unwrap().unwrap();
    assert_eq!(kept.state, SandboxState::Running);
    assert!(rt.alive.lock().unwrap().contains_key(running.id.as_str()));
}

#[tokio::test]
async fn own_and_untagged_records_are_taken_back() {
    let (c, store, rt) = start_with(full_caps(), Config::default()).await;
    let tagged = admin(&c).create(base()).await.unwrap();
    let legacy = admin(&c).create(base()).await.unwrap();
    c.shutdown();
    // A record written before records were tagged.
    let mut sb = store.get_sandbox(&legacy.id).await.unwrap().unwrap();
    let record = sb.runtime.as_mut().unwrap().record.as_object_mut().unwrap();
    record.remove("runtime");
    store.update_sandbox(&sb).await.unwrap();

    let c2 = Control::start(store.clone(), rt.clone(), Config::default())
        .await
        .unwrap();
    for id in [&tagged.id, &legacy.id] {
        assert_eq!(
            admin(&c2).get(id).await.unwrap().state,
            SandboxState::Running
        );
    }
}

//! Runtime failures reach the caller in the category the runtime gave them, with their cause.

mod common;

use common::*;
use warren_control::{Config, ControlError, SandboxState};

#[tokio::test]
async fn a_full_disk_during_a_pause_is_a_storage_error_with_its_cause() {
    let (c, _store, rt) = start_with(full_caps(), Config::default()).await;
    let sb = admin(&c).create(base()).await.unwrap();
    *rt.pause_io_error.lock().unwrap() = Some(std::io::ErrorKind::StorageFull);
    let err = admin(&c).pause(&sb.id, None).await.unwrap_err();
    let ControlError::QuotaExceeded(msg) = &err else {
        panic!("a full disk is not a {err:?}");
    };
    assert!(
        msg.contains(&format!("save the layer of sandbox {}", sb.id)),
        "{msg}"
    );
    assert!(msg.contains("disk is full"), "{msg}");
    // It keeps running.
    assert_eq!(
        admin(&c).get(&sb.id).await.unwrap().state,
        SandboxState::Running
    );
}

#[tokio::test]
async fn another_io_failure_during_a_pause_is_unavailable_with_its_cause() {
    let (c, _store, rt) = start_with(full_caps(), Config::default()).await;
    let sb = admin(&c).create(base()).await.unwrap();
    *rt.pause_io_error.lock().unwrap() = Some(std::io::ErrorKind::PermissionDenied);
    let err = admin(&c).pause(&sb.id, None).await.unwrap_err();
    let ControlError::Unavailable(msg) = &err else {
        panic!("{err:?}");
    };
    assert!(
        msg.contains("save the layer") && msg.contains("ermission denied"),
        "{msg}"
    );
}

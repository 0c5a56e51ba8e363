//! Runtime failures reach the caller in the category the runtime gave them, with their cause.

mod common;

use common::*;
use warren_control::{Config, Control, ControlError, Sandbox, SandboxState};

/// Pauses a new sandbox while saving its layer fails with `kind`: the control plane, the
/// sandbox and the pause's error.
async fn failed_pause(kind: std::io::ErrorKind) -> (Control, Sandbox, ControlError) {
    let (c, _store, rt) = start_with(full_caps(), Config::default()).await;
    let sb = admin(&c).create(base()).await.unwrap();
    *rt.pause_io_error.lock().unwrap() = Some(kind);
    let err = admin(&c).pause(&sb.id, None).await.unwrap_err();
    (c, sb, err)
}

#[tokio::test]
async fn a_full_disk_during_a_pause_is_a_storage_error_with_its_cause() {
    let (c, sb, err) = failed_pause(std::io::ErrorKind::StorageFull).await;
    let ControlError::QuotaExceeded(msg) = &err else {
        panic!("a full disk is not a {err:?}");
    };
    assert!(
        msg.contains(&format!("save the layer of sandbox {}", sb.id)),
        "{msg}"
    );
    assert!(msg.contains("disk is full"), "{msg}");
    // It keeps running.
    assert_eq!(state(&c, &sb.id).await, SandboxState::Running);
}

#[tokio::test]
async fn another_io_failure_during_a_pause_is_unavailable_with_its_cause() {
    let (_c, _sb, err) = failed_pause(std::io::ErrorKind::PermissionDenied).await;
    let ControlError::Unavailable(msg) = &err else {
        panic!("{err:?}");
    };
    assert!(
        msg.contains("save the layer") && msg.contains("ermission denied"),
        "{msg}"
    );
}

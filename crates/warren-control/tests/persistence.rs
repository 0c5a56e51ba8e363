//! Pause, resume, snapshots and fork in the domain alone, against the fakes of `common`.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;
use warren_control::store::*;

use common::{admin, base, full_caps, ns_caps, start_with, state};
use warren_control::{
    Capabilities, Config, Control, ControlError, CreateRequest, Lifecycle, OnTimeout, PauseMode,
    SandboxState, SnapshotQuery,
};
use warren_runtime::SandboxRuntime;

fn with_env() -> CreateRequest {
    CreateRequest {
        env_vars: BTreeMap::from([("TOKEN".to_string(), "t0p".to_string())]),
        metadata: BTreeMap::from([("team".to_string(), "a".to_string())]),
        allow_internet_access: Some(false),
        ..base()
    }
}

/// Pause on timeout, with the memory choice and auto-resume given.
fn pausing(pause_memory: Option<bool>, auto_resume: bool) -> Lifecycle {
    Lifecycle {
        on_timeout: OnTimeout::Pause,
        pause_memory,
        auto_resume,
    }
}

#[tokio::test]
async fn pause_resume_round_trip_keeps_env_and_token() {
    let (c, store, rt) = start_with(full_caps(), Config::default()).await;
    let sb = admin(&c).create(with_env()).await.unwrap();
    let route = c.route(&sb.id).unwrap();
    admin(&c).pause(&sb.id, None).await.unwrap();
    assert!(route.cancel.is_cancelled(), "open streams must be cut");
    assert!(c.route(&sb.id).is_none());
    let rec = store.get_sandbox(&sb.id).await.unwrap().unwrap();
    assert_eq!(rec.state, SandboxState::Paused);
    assert_eq!(
        rec.pause_mode,
        Some(PauseMode::Memory),
        "best mode by default"
    );
    assert_eq!(rec.runtime.unwrap().record["paused"], "memory");
    assert_eq!(admin(&c).get(&sb.id).await.unwrap().api_state(), "paused");

    // Pausing again is the 409 the SDK turns into `False`.
    assert!(matches!(
        admin(&c).pause(&sb.id, None).await,
        Err(ControlError::FailedPrecondition(_))
    ));

    for _ in 0..3 {
        let (after, resumed) = admin(&c).connect(&sb.id, Some(60)).await.unwrap();
        assert!(resumed);
        assert_eq!(after.state, SandboxState::Running);
        assert_eq!(after.pause_mode, None);
        assert!(c.route(&sb.id).is_some());
        let spec = rt.specs.lock().unwrap().last().cloned().unwrap();
        assert_eq!(spec.id, sb.id);
        assert_eq!(spec.env_vars["TOKEN"], "t0p");
        assert_eq!(
            spec.access_token.as_deref(),
            Some(sb.envd_access_token.as_str())
        );
        assert!(!spec.allow_internet_access);
        assert_eq!(spec.from_snapshot, None);
        // Connecting to the running sandbox again is not a resume.
        assert!(!admin(&c).connect(&sb.id, Some(60)).await.unwrap().1);
        admin(&c).pause(&sb.id, Some(false)).await.unwrap();
        assert_eq!(
            store.get_sandbox(&sb.id).await.unwrap().unwrap().pause_mode,
            Some(PauseMode::Filesystem)
        );
    }
    // Killing a paused sandbox frees its saved state.
    admin(&c).kill(&sb.id).await.unwrap();
    assert!(rt.paused.lock().unwrap().is_empty());
    assert!(matches!(
        admin(&c).get(&sb.id).await,
        Err(ControlError::NotFound(_))
    ));
}

#[tokio::test]
async fn failed_resume_leaves_it_paused() {
    let (c, store, rt) = start_with(full_caps(), Config::default()).await;
    let sb = admin(&c).create(base()).await.unwrap();
    admin(&c).pause(&sb.id, Some(true)).await.unwrap();
    *rt.fail_resume.lock().unwrap() = true;
    match admin(&c).connect(&sb.id, None).await {
        Err(ControlError::Unavailable(m)) => {
            assert!(
                m.contains("stays paused") && m.contains("disk is full"),
                "{m}"
            )
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert_eq!(
        store.get_sandbox(&sb.id).await.unwrap().unwrap().state,
        SandboxState::Paused
    );
    *rt.fail_resume.lock().unwrap() = false;
    assert!(admin(&c).connect(&sb.id, None).await.unwrap().1);
}

#[tokio::test]
async fn unsupported_modes_are_clear_400s() {
    let caps = Capabilities {
        pause_filesystem: true,
        snapshot: true,
        snapshot_filesystem: true,
        ..Capabilities::default()
    };
    let (c, _, _) = start_with(caps, Config::default()).await;
    let sb = admin(&c).create(base()).await.unwrap();
    match admin(&c).pause(&sb.id, Some(true)).await {
        Err(ControlError::InvalidArgument(m)) => assert!(m.contains("filesystem"), "{m}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    match admin(&c).create_snapshot(&sb.id, None, Some(true)).await {
        Err(ControlError::InvalidArgument(m)) => assert!(m.contains("mode=\"filesystem\""), "{m}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    // A runtime whose snapshots always keep memory refuses a filesystem-only one.
    let (full, _, _) = start_with(
        Capabilities {
            snapshot: true,
            snapshot_memory: true,
            ..Capabilities::default()
        },
        Config::default(),
    )
    .await;
    let other = admin(&full).create(base()).await.unwrap();
    match admin(&full)
        .create_snapshot(&other.id, None, Some(false))
        .await
    {
        Err(ControlError::InvalidArgument(m)) => assert!(m.contains("mode=\"full\""), "{m}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    // Still running and routed after the refusals.
    assert!(c.route(&sb.id).is_some());
    let r = admin(&c)
        .create(CreateRequest {
            lifecycle: pausing(Some(true), false),
            ..base()
        })
        .await;
    assert!(matches!(r, Err(ControlError::InvalidArgument(_))));

    let (none, _, _) = start_with(Capabilities::default(), Config::default()).await;
    let sb = admin(&none).create(base()).await.unwrap();
    assert!(matches!(
        admin(&none).pause(&sb.id, None).await,
        Err(ControlError::InvalidArgument(_))
    ));
    assert!(matches!(
        admin(&none).fork(&sb.id, Some(1), None).await,
        Err(ControlError::InvalidArgument(_))
    ));
}

#[tokio::test]
async fn paused_sandboxes_survive_restart_and_do_not_expire() {
    let (c, store, rt) = start_with(full_caps(), Config::default()).await;
    let sb = admin(&c).create(base()).await.unwrap();
    // An end time that passes while it is paused does not end it.
    admin(&c).set_timeout(&sb.id, 1).await.unwrap();
    admin(&c).pause(&sb.id, None).await.unwrap();
    // A paused sandbox has no timeout to set (as on E2B: "not found" until it runs again).
    assert!(matches!(
        admin(&c).set_timeout(&sb.id, 1).await,
        Err(ControlError::NotFound(_))
    ));
    c.shutdown();
    let c2 = Control::start(store.clone(), rt.clone(), Config::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let got = admin(&c2).get(&sb.id).await.unwrap();
    assert_eq!(got.state, SandboxState::Paused);
    assert!(c2.route(&sb.id).is_none());
    assert!(admin(&c2).connect(&sb.id, None).await.unwrap().1);
    assert!(c2.route(&sb.id).is_some());
}

/// The server died after the runtime's pause had finished and before the pause was recorded:
/// the restarted control plane records it paused (with its event), and it resumes.
#[tokio::test]
async fn a_pause_that_finished_while_the_server_was_down_is_recorded() {
    let (c, store, rt) = start_with(full_caps(), Config::default()).await;
    let sb = admin(&c).create(base()).await.unwrap();
    c.shutdown();
    rt.finish_pause.lock().unwrap().push(sb.id.to_string());
    let c2 = Control::start(store.clone(), rt.clone(), Config::default())
        .await
        .unwrap();
    let got = admin(&c2).get(&sb.id).await.unwrap();
    assert_eq!(got.state, SandboxState::Paused);
    assert_eq!(got.pause_mode, Some(warren_runtime::PauseMode::Memory));
    let record = &got.runtime.as_ref().unwrap().record;
    assert!(
        record.get(warren_runtime::RECORD_FINISHED_PAUSE).is_none(),
        "the mark is not kept: {record}"
    );
    assert!(c2.route(&sb.id).is_none());
    rt.finish_pause.lock().unwrap().clear();
    assert!(
        admin(&c2).connect(&sb.id, None).await.unwrap().1,
        "it resumes"
    );
    assert_eq!(
        admin(&c2).get(&sb.id).await.unwrap().state,
        SandboxState::Running
    );
}

#[tokio::test]
async fn on_timeout_pause_then_traffic_resumes() {
    let (c, store, _) = start_with(full_caps(), Config::default()).await;
    let sb = admin(&c)
        .create(CreateRequest {
            timeout: Some(1),
            lifecycle: pausing(None, true),
            ..base()
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let rec = store.get_sandbox(&sb.id).await.unwrap().unwrap();
    assert_eq!(rec.state, SandboxState::Paused, "paused, not killed");
    assert!(c.route(&sb.id).is_none());
    // A request the sandbox would refuse does not wake it.
    let refused = c.route_or_resume(&sb.id, |_| false).await;
    assert!(matches!(refused, Err(ControlError::PermissionDenied(_))));
    assert_eq!(state(&c, &sb.id).await, SandboxState::Paused);
    let route = c
        .route_or_resume(&sb.id, |a| a.envd_access_token == sb.envd_access_token)
        .await
        .unwrap();
    assert!(route.is_some(), "traffic wakes it");
    let got = admin(&c).get(&sb.id).await.unwrap();
    assert_eq!(got.state, SandboxState::Running);
    assert!(got.end_at > chrono::Utc::now() + chrono::Duration::seconds(200));

    // Without autoResume traffic does not wake it.
    let plain = admin(&c).create(base()).await.unwrap();
    admin(&c).pause(&plain.id, None).await.unwrap();
    assert!(c
        .route_or_resume(&plain.id, |_| true)
        .await
        .unwrap()
        .is_none());
    assert_eq!(state(&c, &plain.id).await, SandboxState::Paused);
}

#[tokio::test]
async fn snapshots_create_from_list_replace_delete() {
    let (c, store, rt) = start_with(ns_caps(), Config::default()).await;
    let sb = admin(&c).create(with_env()).await.unwrap();
    let s1 = admin(&c)
        .create_snapshot(&sb.id, Some("nightly".into()), None)
        .await
        .unwrap();
    assert!(!s1.memory, "the runtime's snapshots carry files only");
    assert_eq!(state(&c, &sb.id).await, SandboxState::Running);

    // The id, with or without a tag, and the name are templates.
    for template in [
        s1.id.clone(),
        format!("{}:default", s1.id),
        "nightly".into(),
    ] {
        let child = admin(&c)
            .create(CreateRequest { template, ..base() })
            .await
            .unwrap();
        assert_eq!(child.template, "base");
        let spec = rt.specs.lock().unwrap().last().cloned().unwrap();
        assert_eq!(spec.from_snapshot.as_deref(), Some(s1.key.as_str()));
        assert_eq!(
            spec.env_vars["TOKEN"], "t0p",
            "env vars come with the snapshot"
        );
    }

    // Reusing the name replaces the older snapshot and frees its saved state.
    let s2 = admin(&c)
        .create_snapshot(&sb.id, Some("nightly".into()), Some(false))
        .await
        .unwrap();
    assert!(store.get_snapshot(&s1.id).await.unwrap().is_none());
    assert!(!rt.snapshots.lock().unwrap().contains_key(&s1.key));
    let s3 = admin(&c).create_snapshot(&sb.id, None, None).await.unwrap();

    let all = admin(&c)
        .list_snapshots(&SnapshotQuery::default())
        .await
        .unwrap();
    let ids: Vec<&str> = all.items.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, [s3.id.as_str(), s2.id.as_str()], "newest first");
    let page = admin(&c)
        .list_snapshots(&SnapshotQuery {
            limit: Some(1),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.items[0].id, s3.id);
    let next = admin(&c)
        .list_snapshots(&SnapshotQuery {
            limit: Some(1),
            next_token: page.next_token,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(next.items[0].id, s2.id);
    assert!(next.next_token.is_none());
    let named = admin(&c)
        .list_snapshots(&SnapshotQuery {
            name: Some("nightly:default".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(named.items.len(), 1);
    assert!(admin(&c)
        .list_snapshots(&SnapshotQuery {
            sandbox_id: Some("iother".into()),
            ..Default::default()
        })
        .await
        .unwrap()
        .items
        .is_empty());

    admin(&c).delete_snapshot(&s2.id).await.unwrap();
    assert!(!rt.snapshots.lock().unwrap().contains_key(&s2.key));
    assert!(matches!(
        admin(&c).delete_snapshot(&s2.id).await,
        Err(ControlError::NotFound(_))
    ));
    // Snapshots outlive their sandbox.
    admin(&c).kill(&sb.id).await.unwrap();
    assert!(admin(&c)
        .create(CreateRequest {
            template: s3.id.clone(),
            ..base()
        })
        .await
        .is_ok());
    assert!(matches!(
        admin(&c).create_snapshot(&sb.id, None, None).await,
        Err(ControlError::NotFound(_))
    ));
    assert!(matches!(
        admin(&c)
            .create_snapshot("inope", Some("bad:name".into()), None)
            .await,
        Err(ControlError::InvalidArgument(_))
    ));
}

#[tokio::test]
async fn fork_children_inherit_and_fail_alone() {
    let (c, _, rt) = start_with(ns_caps(), Config::default()).await;
    let parent = admin(&c)
        .create(CreateRequest {
            lifecycle: pausing(Some(false), false),
            ..with_env()
        })
        .await
        .unwrap();
    for bad in [0, 101, -1] {
        assert!(matches!(
            admin(&c).fork(&parent.id, Some(bad), None).await,
            Err(ControlError::InvalidArgument(_))
        ));
    }
    assert!(matches!(
        admin(&c).fork("inope", Some(1), None).await,
        Err(ControlError::NotFound(_))
    ));

    *rt.fail_creates.lock().unwrap() = 1;
    let results = admin(&c)
        .fork(&parent.id, Some(4), Some(120))
        .await
        .unwrap();
    assert_eq!(results.len(), 4);
    let children: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(children.len(), 3, "one child failed on its own");
    let mut ids: Vec<&str> = children.iter().map(|s| s.id.as_str()).collect();
    ids.push(&parent.id);
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 4, "children are new sandboxes");
    for ch in &children {
        assert_eq!(ch.state, SandboxState::Running);
        assert_eq!(ch.metadata, parent.metadata);
        assert_eq!(ch.env_vars, parent.env_vars);
        assert_eq!(ch.lifecycle, parent.lifecycle);
        assert!(!ch.allow_internet_access);
        assert_ne!(ch.envd_access_token, parent.envd_access_token);
    }
    // The checkpoint is gone once the children started; the parent still runs.
    assert!(rt.snapshots.lock().unwrap().is_empty());
    assert_eq!(state(&c, &parent.id).await, SandboxState::Running);

    admin(&c).pause(&parent.id, None).await.unwrap();
    assert!(matches!(
        admin(&c).fork(&parent.id, None, None).await,
        Err(ControlError::FailedPrecondition(_))
    ));
}

#[tokio::test]
async fn auto_resume_survives_restart() {
    let (c, store, rt) = start_with(full_caps(), Config::default()).await;
    let sb = admin(&c)
        .create(CreateRequest {
            lifecycle: pausing(Some(false), true),
            ..base()
        })
        .await
        .unwrap();
    admin(&c).pause(&sb.id, None).await.unwrap();
    c.shutdown();
    let c2 = Control::start(store.clone(), rt.clone(), Config::default())
        .await
        .unwrap();
    assert!(c2
        .route_or_resume(&sb.id, |_| true)
        .await
        .unwrap()
        .is_some());
    assert_eq!(
        admin(&c2).get(&sb.id).await.unwrap().state,
        SandboxState::Running
    );
    // Killed while paused: traffic gets the plain not-found answer.
    admin(&c2).pause(&sb.id, None).await.unwrap();
    admin(&c2).kill(&sb.id).await.unwrap();
    assert!(c2
        .route_or_resume(&sb.id, |_| true)
        .await
        .unwrap()
        .is_none());
}

#[tokio::test]
async fn a_snapshot_cannot_take_a_template_name() {
    let config = Config {
        template_names: vec!["base".into(), "code-interpreter-v1".into()],
        ..Config::default()
    };
    let (c, _store, _rt) = start_with(ns_caps(), config).await;
    let sb = admin(&c).create(with_env()).await.unwrap();
    for name in ["base", "base:default", "code-interpreter-v1"] {
        let err = admin(&c)
            .create_snapshot(&sb.id, Some(name.into()), None)
            .await
            .unwrap_err();
        assert!(
            matches!(err, ControlError::InvalidArgument(_)),
            "{name}: {err:?}"
        );
    }
    assert!(admin(&c)
        .create_snapshot(&sb.id, Some("base-2".into()), None)
        .await
        .is_ok());
}

#[tokio::test]
async fn a_restart_removes_runtime_snapshots_nothing_records_but_build_layers() {
    let (c, store, rt) = start_with(full_caps(), Config::default()).await;
    let sb = admin(&c).create(base()).await.unwrap();
    let kept = admin(&c).create_snapshot(&sb.id, None, None).await.unwrap();
    // What a fork leaves when the server dies before deleting its checkpoint.
    rt.snapshot(&sb.id, "forkleftover", true).await.unwrap();
    // A template build's cached step: the builder records it, not the store.
    let layer = format!("{}0123456789abcdef", warren_control::BUILD_LAYER_PREFIX);
    rt.snapshot(&sb.id, &layer, false).await.unwrap();
    c.shutdown();
    let _c2 = Control::start(store.clone(), rt.clone(), Config::default())
        .await
        .unwrap();
    let keys = rt.snapshot_keys().await;
    assert!(keys.contains(&kept.key), "{keys:?}");
    assert!(!keys.contains(&"forkleftover".to_string()), "{keys:?}");
    assert!(keys.contains(&layer), "a build layer was removed: {keys:?}");
}

/// Threat model M6: a sandbox that makes its own end-of-life pause fail is killed after a few
/// attempts instead of running past its end time forever.
#[tokio::test]
async fn an_end_of_life_pause_that_keeps_failing_ends_the_sandbox() {
    let config = Config {
        end_of_life_pause_attempts: 3,
        end_of_life_pause_retry: Duration::from_millis(200),
        ..Config::default()
    };
    let (c, store, rt) = start_with(full_caps(), config).await;
    *rt.fail_pause.lock().unwrap() = true;
    let sb = admin(&c)
        .create(CreateRequest {
            timeout: Some(1),
            lifecycle: pausing(None, false),
            ..base()
        })
        .await
        .unwrap();
    let mut state = SandboxState::Running;
    for _ in 0..100 {
        state = store.get_sandbox(&sb.id).await.unwrap().unwrap().state;
        if state == SandboxState::Killed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(state, SandboxState::Killed);
    assert!(
        rt.alive.lock().unwrap().get(sb.id.as_str()).is_none(),
        "the runtime ended it"
    );
}

/// Threat model M5: snapshots and pauses have quotas, answered with a clear refusal.
#[tokio::test]
async fn snapshots_and_pauses_have_quotas() {
    let config = Config {
        max_snapshots: 3,
        max_snapshots_per_sandbox: 2,
        max_paused: 1,
        ..Config::default()
    };
    let (c, _, _) = start_with(full_caps(), config).await;
    let a = admin(&c).create(base()).await.unwrap();
    let b = admin(&c).create(base()).await.unwrap();
    admin(&c).create_snapshot(&a.id, None, None).await.unwrap();
    admin(&c)
        .create_snapshot(&a.id, Some("keep".into()), None)
        .await
        .unwrap();
    let per_sandbox = admin(&c).create_snapshot(&a.id, None, None).await;
    assert!(
        matches!(per_sandbox, Err(ControlError::QuotaExceeded(_))),
        "{per_sandbox:?}"
    );
    // Replacing a name frees the older one.
    admin(&c)
        .create_snapshot(&a.id, Some("keep".into()), None)
        .await
        .unwrap();
    admin(&c).create_snapshot(&b.id, None, None).await.unwrap();
    let total = admin(&c).create_snapshot(&b.id, None, None).await;
    assert!(
        matches!(total, Err(ControlError::QuotaExceeded(_))),
        "{total:?}"
    );

    admin(&c).pause(&a.id, None).await.unwrap();
    let paused = admin(&c).pause(&b.id, None).await;
    assert!(
        matches!(paused, Err(ControlError::QuotaExceeded(_))),
        "{paused:?}"
    );
    assert_eq!(state(&c, &b.id).await, SandboxState::Running);
}

/// Threat model M5: a nearly full disk (bytes or inodes) refuses new saved state with 507,
/// and new sandboxes, whose disks live there too.
#[tokio::test]
async fn a_nearly_full_disk_refuses_creates_pauses_snapshots_and_forks() {
    let (c, _, rt) = start_with(full_caps(), Config::default()).await;
    let sb = admin(&c).create(base()).await.unwrap();
    for (bytes, inodes) in [
        (10 * 1024 * 1024, 10_000_000),
        (100 * 1024 * 1024 * 1024, 10),
    ] {
        *rt.headroom.lock().unwrap() = Some(warren_runtime::Headroom {
            free_bytes: bytes,
            free_inodes: inodes,
        });
        let snap = admin(&c).create_snapshot(&sb.id, None, None).await;
        assert!(
            matches!(snap, Err(ControlError::QuotaExceeded(_))),
            "{snap:?}"
        );
        let fork = admin(&c).fork(&sb.id, None, None).await;
        assert!(
            matches!(fork, Err(ControlError::QuotaExceeded(_))),
            "{fork:?}"
        );
        let pause = admin(&c).pause(&sb.id, None).await;
        assert!(
            matches!(pause, Err(ControlError::QuotaExceeded(_))),
            "{pause:?}"
        );
        let create = admin(&c).create(base()).await;
        assert!(
            matches!(&create, Err(ControlError::QuotaExceeded(m)) if m.contains("stay free")),
            "{create:?}"
        );
        assert_eq!(state(&c, &sb.id).await, SandboxState::Running);
    }
    *rt.headroom.lock().unwrap() = Some(warren_runtime::Headroom {
        free_bytes: 100 * 1024 * 1024 * 1024,
        free_inodes: 10_000_000,
    });
    // Space freed: everything works again, with no restart.
    admin(&c).create(base()).await.unwrap();
    admin(&c).create_snapshot(&sb.id, None, None).await.unwrap();
    admin(&c).pause(&sb.id, None).await.unwrap();
}

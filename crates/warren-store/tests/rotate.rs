//! Rotation of the store key: every sealed value (sandbox tokens and env vars, snapshot env
//! vars, volume tokens, secret values) is sealed again under a new key, and a rotation a
//! crash interrupted is finished or undone on the next open.

use std::collections::BTreeMap;

use chrono::Utc;
use warren_control::{
    Lifecycle, Network, SandboxState, SealedSecret, SecretInfo, Store, Volume, VolumeQuota,
};
use warren_store::SqliteStore;

fn sandbox() -> warren_control::Sandbox {
    warren_control::Sandbox {
        id: "irot".into(),
        template: "base".into(),
        state: SandboxState::Paused,
        failure: None,
        cpu_count: 1,
        memory_mb: 256,
        disk_mb: 512,
        allow_internet_access: true,
        metadata: BTreeMap::new(),
        started_at: Utc::now(),
        end_at: Utc::now(),
        envd_access_token: "ea_rotate_me".into(),
        traffic_access_token: "ta_rotate_me".into(),
        runtime: None,
        env_vars: BTreeMap::from([("TOKEN".to_string(), "env-rotate-me".to_string())]),
        lifecycle: Lifecycle::default(),
        pause_mode: None,
        network: Network::default(),
        team: "t".into(),
        volume_mounts: Vec::new(),
    }
}

async fn fill(path: &std::path::Path) {
    let store = SqliteStore::open(path).unwrap();
    store.insert_sandbox(&sandbox()).await.unwrap();
    store
        .put_volume(&Volume {
            id: "volrot".into(),
            name: "data".into(),
            team: "t".into(),
            quota: VolumeQuota {
                bytes: 1 << 30,
                inodes: 1 << 16,
            },
            created_at: Utc::now(),
            token: "wvt_rotate_me".into(),
        })
        .await
        .unwrap();
    store
        .put_secret(&SealedSecret {
            info: SecretInfo {
                id: "sec_rot".into(),
                name: "k".into(),
                team: "t".into(),
                version: 1,
                metadata: BTreeMap::new(),
                created_at: Utc::now(),
                updated_at: Utc::now(),
            },
            value: "secret-rotate-me".into(),
        })
        .await
        .unwrap();
}

async fn assert_readable(path: &std::path::Path) {
    let store = SqliteStore::open(path).unwrap();
    let sb = store.get_sandbox("irot").await.unwrap().unwrap();
    assert_eq!(sb.envd_access_token, "ea_rotate_me");
    assert_eq!(sb.traffic_access_token, "ta_rotate_me");
    assert_eq!(sb.env_vars["TOKEN"], "env-rotate-me");
    let v = store.get_volume("volrot").await.unwrap().unwrap();
    assert_eq!(v.token, "wvt_rotate_me");
    let s = store.get_secret("sec_rot").await.unwrap().unwrap();
    assert_eq!(s.value, "secret-rotate-me");
}

#[tokio::test]
async fn rotation_reseals_everything_under_a_new_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("warren.db");
    fill(&path).await;
    let old_key = std::fs::read(dir.path().join("warren.key")).unwrap();
    let n = SqliteStore::rotate_key(&path).unwrap();
    assert_eq!(
        n, 5,
        "three sandbox columns, a volume token, a secret value"
    );
    let new_key = std::fs::read(dir.path().join("warren.key")).unwrap();
    assert_ne!(old_key, new_key);
    assert!(!dir.path().join("warren.key.new").exists());
    assert_readable(&path).await;
    // The old key no longer opens the database: a leaked copy of it is worthless now.
    std::fs::write(dir.path().join("warren.key"), &old_key).unwrap();
    let store = SqliteStore::open(&path).unwrap();
    assert!(store.get_secret("sec_rot").await.is_err());
}

#[tokio::test]
async fn a_rotation_interrupted_after_its_commit_is_finished_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("warren.db");
    fill(&path).await;
    SqliteStore::rotate_key_interrupted(&path).unwrap();
    assert!(dir.path().join("warren.key.new").exists());
    assert_readable(&path).await;
    assert!(!dir.path().join("warren.key.new").exists());
}

#[tokio::test]
async fn a_new_key_left_without_a_commit_is_dropped_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("warren.db");
    fill(&path).await;
    // A crash after the new key was written but before the transaction committed.
    std::fs::write(dir.path().join("warren.key.new"), [7u8; 32]).unwrap();
    assert_readable(&path).await;
    assert!(!dir.path().join("warren.key.new").exists());
}

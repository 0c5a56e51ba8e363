//! The SQLite store against real database files.

use std::collections::BTreeMap;
use warren_control::store::*;

use chrono::{TimeZone, Utc};
use warren_control::{
    ApiKey, Lifecycle, Network, OnTimeout, PauseMode, Sandbox, SandboxState, Snapshot,
};
use warren_runtime::RuntimeSandbox;
use warren_store::SqliteStore;

fn sandbox(id: &str) -> Sandbox {
    Sandbox {
        id: id.parse().expect("a valid sandbox id"),
        template: "base".into(),
        state: SandboxState::Pending,
        failure: None,
        resources: warren_control::Resources {
            cpu_count: 2,
            memory_mb: 512,
            disk_mb: 2048,
        },
        allow_internet_access: true,
        metadata: BTreeMap::from([("k".to_string(), "v w".to_string())]),
        started_at: Utc.timestamp_micros(1_700_000_000_123_456).unwrap(),
        end_at: Utc.timestamp_micros(1_700_000_300_123_456).unwrap(),
        envd_access_token: "ea_x".into(),
        traffic_access_token: "ta_x".into(),
        runtime: None,
        env_vars: BTreeMap::from([("SECRET".to_string(), "s3cr3t".to_string())]),
        lifecycle: Lifecycle::default(),
        pause_mode: None,
        network: Network {
            allow_public_traffic: false,
            egress: warren_control::EgressPolicy::from_lists(
                &["192.0.2.0/24".into()],
                &["0.0.0.0/0".into()],
                None,
            )
            .unwrap(),
            mask_request_host: Some("app.test:${PORT}".into()),
        },
        team: "team-a".into(),
        volume_mounts: vec![warren_control::VolumeMountRecord {
            volume_id: "vol1".into(),
            name: "data".into(),
            path: "/mnt/data".into(),
            read_only: true,
            subpath: None,
        }],
    }
}

fn snapshot(id: &str, name: Option<&str>, secs: i64) -> Snapshot {
    Snapshot {
        id: id.into(),
        names: name.map(str::to_string).into_iter().collect(),
        key: format!("key-{id}"),
        sandbox_id: "iabc".into(),
        template: "base".into(),
        resources: warren_control::Resources {
            cpu_count: 2,
            memory_mb: 512,
            disk_mb: 2048,
        },
        allow_internet_access: false,
        env_vars: BTreeMap::from([("A".to_string(), "1".to_string())]),
        metadata: BTreeMap::from([("m".to_string(), "n".to_string())]),
        memory: false,
        bytes: 123_456_789_012,
        created_at: Utc.timestamp_micros(secs * 1_000_000).unwrap(),
        team: "team-a".into(),
        volume_mounts: vec![warren_control::VolumeMountRecord {
            volume_id: "vol1".into(),
            name: "data".into(),
            path: "/data".into(),
            read_only: false,
            subpath: None,
        }],
    }
}

#[tokio::test]
async fn paused_sandboxes_keep_what_resume_needs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("warren.db");
    let mut s = sandbox("ipause");
    s.state = SandboxState::Paused;
    s.pause_mode = Some(PauseMode::Filesystem);
    s.lifecycle = Lifecycle {
        on_timeout: OnTimeout::Pause,
        pause_memory: Some(false),
        auto_resume: true,
    };
    {
        let store = SqliteStore::open(&path).unwrap();
        store.insert_sandbox(&s).await.unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    let got = store.get_sandbox("ipause").await.unwrap().unwrap();
    assert_eq!(got, s);
    s.state = SandboxState::Running;
    s.pause_mode = None;
    store.update_sandbox(&s).await.unwrap();
    assert_eq!(store.get_sandbox("ipause").await.unwrap().unwrap(), s);
}

#[tokio::test]
async fn snapshots_round_trip_replace_by_name_and_delete() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("warren.db");
    {
        let store = SqliteStore::open(&path).unwrap();
        store
            .insert_snapshot(&snapshot("s1", Some("nightly"), 10), None)
            .await
            .unwrap();
        store
            .insert_snapshot(&snapshot("s2", None, 20), None)
            .await
            .unwrap();
        // A second snapshot under a taken name without replacing is refused.
        assert!(store
            .insert_snapshot(&snapshot("s3", Some("nightly"), 30), None)
            .await
            .is_err());
        store
            .insert_snapshot(&snapshot("s3", Some("nightly"), 30), Some("s1"))
            .await
            .unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    assert!(store.get_snapshot("s1").await.unwrap().is_none());
    let by_name = store.snapshot_by_name("nightly").await.unwrap().unwrap();
    assert_eq!(by_name, snapshot("s3", Some("nightly"), 30));
    assert_eq!(
        store.get_snapshot("s2").await.unwrap().unwrap(),
        snapshot("s2", None, 20)
    );
    let mut ids: Vec<String> = store
        .snapshots()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    ids.sort();
    assert_eq!(ids, ["s2", "s3"]);
    assert!(store.delete_snapshot("s2").await.unwrap());
    assert!(!store.delete_snapshot("s2").await.unwrap());
    assert_eq!(store.snapshots().await.unwrap().len(), 1);
}

#[tokio::test]
async fn sandboxes_round_trip_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("warren.db");
    {
        let store = SqliteStore::open(&path).unwrap();
        let mut s = sandbox("iabc");
        store.insert_sandbox(&s).await.unwrap();
        assert!(store.insert_sandbox(&s).await.is_err(), "duplicate id");
        s.state = SandboxState::Running;
        s.runtime = Some(RuntimeSandbox {
            id: "iabc".into(),
            agent: "10.0.0.2:49983".parse().unwrap(),
            record: serde_json::json!({"pid": 42}),
        });
        store.update_sandbox(&s).await.unwrap();
        store.insert_sandbox(&sandbox("idef")).await.unwrap();
    }
    // Reopening re-runs no migration and finds everything.
    let store = SqliteStore::open(&path).unwrap();
    let got = store.get_sandbox("iabc").await.unwrap().unwrap();
    assert_eq!(got.state, SandboxState::Running);
    assert_eq!(got.runtime.unwrap().record["pid"], 42);
    assert_eq!(got.metadata["k"], "v w");
    assert_eq!(got.started_at, sandbox("x").started_at);
    assert_eq!(
        store
            .sandboxes_in(&[SandboxState::Running])
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        store
            .sandboxes_in(&[SandboxState::Running, SandboxState::Pending])
            .await
            .unwrap()
            .len(),
        2
    );
    assert!(store.get_sandbox("nope").await.unwrap().is_none());
    assert!(store.update_sandbox(&sandbox("nope")).await.is_err());
}

#[tokio::test]
async fn wal_mode_is_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("warren.db");
    let _store = SqliteStore::open(&path).unwrap();
    let conn = rusqlite::Connection::open(&path).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[tokio::test]
async fn api_keys_store_hashes_only() {
    let store = SqliteStore::open_in_memory().unwrap();
    let key = ApiKey {
        id: "k1".into(),
        name: "ci".into(),
        hash: warren_control::hash_api_key("secret-value-1234"),
        prefix: "secret-val".into(),
        created_at: Utc::now(),
        revoked_at: None,
        team: "team-a".into(),
        admin: false,
    };
    store.insert_api_key(&key).await.unwrap();
    assert!(store.insert_api_key(&key).await.is_err());
    let found = store.api_key_by_hash(&key.hash).await.unwrap().unwrap();
    assert_eq!(found.id, "k1");
    assert_eq!((found.team.as_str(), found.admin), ("team-a", false));
    assert!(store.revoke_api_key("k1").await.unwrap());
    assert!(!store.revoke_api_key("k1").await.unwrap());
    assert!(store.api_key_by_hash(&key.hash).await.unwrap().is_none());
    assert!(store.api_keys().await.unwrap()[0].revoked_at.is_some());
}

/// A database written before pause existed (schema version 1) opens with its sandboxes intact
/// and the new fields at their defaults.
#[tokio::test]
async fn version_1_databases_upgrade_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("warren.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY NOT NULL, applied_at TEXT NOT NULL);
             INSERT INTO schema_migrations VALUES (1, 'then');
             CREATE TABLE sandboxes (
                id TEXT PRIMARY KEY NOT NULL, template TEXT NOT NULL, state TEXT NOT NULL,
                failure TEXT, cpu_count INTEGER NOT NULL, memory_mb INTEGER NOT NULL,
                disk_mb INTEGER NOT NULL, allow_internet_access INTEGER NOT NULL,
                metadata TEXT NOT NULL, started_at_us INTEGER NOT NULL, end_at_us INTEGER NOT NULL,
                envd_access_token TEXT NOT NULL, traffic_access_token TEXT NOT NULL, runtime TEXT);
             CREATE INDEX sandboxes_state ON sandboxes(state);
             CREATE TABLE api_keys (id TEXT PRIMARY KEY NOT NULL, name TEXT NOT NULL,
                hash TEXT NOT NULL UNIQUE, prefix TEXT NOT NULL, created_at_us INTEGER NOT NULL,
                revoked_at_us INTEGER);
             INSERT INTO sandboxes VALUES ('iold', 'base', 'running', NULL, 2, 512, 2048, 1,
                '{}', 1, 2, 'ea', 'ta', NULL);",
        )
        .unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    let old = store.get_sandbox("iold").await.unwrap().unwrap();
    assert_eq!(old.state, SandboxState::Running);
    assert!(old.env_vars.is_empty());
    assert_eq!(old.lifecycle, Lifecycle::default());
    assert_eq!(old.pause_mode, None);
    assert!(store.snapshots().await.unwrap().is_empty());
}

/// Every byte SQLite wrote for `path` (the database and its WAL).
fn raw_bytes(path: &std::path::Path) -> Vec<u8> {
    let mut all = Vec::new();
    for suffix in ["", "-wal"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        if let Ok(b) = std::fs::read(&p) {
            all.extend(b);
        }
    }
    all
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[tokio::test]
async fn secrets_are_encrypted_at_rest_and_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("warren.db");
    let store = SqliteStore::open(&path).unwrap();
    let mut s = sandbox("isecret");
    s.envd_access_token = "ea_tokenvalue0123456789".into();
    s.traffic_access_token = "ta_tokenvalue0123456789".into();
    s.env_vars = BTreeMap::from([("DB_PASSWORD".into(), "hunter2-very-secret".into())]);
    store.insert_sandbox(&s).await.unwrap();
    let mut snap = snapshot("ssecret", None, 1);
    snap.env_vars = BTreeMap::from([("TOKEN".into(), "snapshot-secret-value".into())]);
    store.insert_snapshot(&snap, None).await.unwrap();

    let raw = raw_bytes(&path);
    for secret in [
        "ea_tokenvalue0123456789",
        "ta_tokenvalue0123456789",
        "hunter2-very-secret",
        "snapshot-secret-value",
    ] {
        assert!(
            !contains(&raw, secret),
            "{secret} is readable in the database file"
        );
    }
    assert_eq!(store.get_sandbox("isecret").await.unwrap().unwrap(), s);
    assert_eq!(store.get_snapshot("ssecret").await.unwrap().unwrap(), snap);
    for name in ["warren.db", "warren.db-wal", "warren.db-shm", "warren.key"] {
        let mode = std::fs::metadata(dir.path().join(name))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{name} is {mode:o}");
    }
    // Another data dir's key cannot read these rows.
    drop(store);
    std::fs::remove_file(dir.path().join("warren.key")).unwrap();
    let store = SqliteStore::open(&path).unwrap();
    assert!(store.get_sandbox("isecret").await.is_err());
}

#[tokio::test]
async fn rows_from_before_encryption_are_sealed_on_open() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("warren.db");
    drop(SqliteStore::open(&path).unwrap());
    // What an older version left: plaintext secrets in a world-readable file.
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute(
            "INSERT INTO sandboxes (id, template, state, cpu_count, memory_mb, disk_mb, \
             allow_internet_access, metadata, started_at_us, end_at_us, envd_access_token, \
             traffic_access_token, env_vars) VALUES ('iold', 'base', 'running', 1, 512, 1024, 1, \
             '{}', 0, 0, 'ea_oldplaintexttoken', 'ta_oldplaintexttoken', '{\"OLD\":\"oldsecretvalue\"}')",
            [],
        )
        .unwrap();
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
            .unwrap();
    }
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let store = SqliteStore::open(&path).unwrap();
    let got = store.get_sandbox("iold").await.unwrap().unwrap();
    assert_eq!(got.envd_access_token, "ea_oldplaintexttoken");
    assert_eq!(got.env_vars["OLD"], "oldsecretvalue");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0);
    drop(store);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let (token, env): (String, String) = conn
        .query_row(
            "SELECT envd_access_token, env_vars FROM sandboxes WHERE id='iold'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!(token.starts_with("enc1:") && env.starts_with("enc1:"));
}

#[tokio::test]
async fn ended_sandboxes_are_pruned_after_the_retention() {
    let store = SqliteStore::open_in_memory().unwrap();
    let mut old = sandbox("iold");
    old.state = SandboxState::Killed;
    let mut failed = sandbox("ifailed");
    failed.state = SandboxState::Failed;
    let mut paused = sandbox("ipaused");
    paused.state = SandboxState::Paused;
    for s in [&old, &failed, &paused] {
        store.insert_sandbox(s).await.unwrap();
    }
    let cut = old.end_at + chrono::Duration::seconds(1);
    assert_eq!(store.prune_ended(cut).await.unwrap(), 2);
    assert!(store.get_sandbox("iold").await.unwrap().is_none());
    assert!(store.get_sandbox("ifailed").await.unwrap().is_none());
    // Live ones are kept whatever their end time.
    assert!(store.get_sandbox("ipaused").await.unwrap().is_some());
}

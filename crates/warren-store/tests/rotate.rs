//! Rotation of the store key: every sealed value (sandbox tokens and env vars, snapshot env
//! vars, volume tokens, secret values) is sealed again under a new key, and a rotation a
//! crash interrupted is finished or undone on the next open.

use std::collections::BTreeMap;
use warren_control::store::*;

use chrono::Utc;
use warren_control::{
    Lifecycle, Network, SandboxState, SealedSecret, SecretInfo, Volume, VolumeQuota,
};
use warren_store::SqliteStore;

fn sandbox() -> warren_control::Sandbox {
    warren_control::Sandbox {
        id: "irot".parse().expect("a valid sandbox id"),
        template: "base".into(),
        state: SandboxState::Paused,
        failure: None,
        resources: warren_control::Resources {
            cpu_count: 1,
            memory_mb: 256,
            disk_mb: 512,
        },
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

/// The database's files as one byte string (a file SQLite has removed counts as empty).
fn raw_files(path: &std::path::Path) -> Vec<u8> {
    let mut all = Vec::new();
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        match std::fs::read(&p) {
            Ok(b) => all.extend(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("reading {}: {e}", std::path::Path::new(&p).display()),
        }
    }
    all
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Every run of base64 long enough to be a sealed value (`enc1:` and at least 54 characters
/// of nonce, ciphertext and tag; nothing else in these tests' databases is one), live or left
/// in free space, whole or the part of it on one page.
fn base64_runs(raw: &[u8]) -> Vec<Vec<u8>> {
    let b64 = |c: &u8| c.is_ascii_alphanumeric() || *c == b'+' || *c == b'/';
    raw.split(|c| !b64(c))
        .filter(|run| run.len() >= 48)
        .map(<[u8]>::to_vec)
        .collect()
}

/// Pieces of 32 base64 characters (192 bits: they occur nowhere by chance) of `values`,
/// so a value SQLite split across pages is still found by its pieces.
fn pieces(values: &[Vec<u8>]) -> Vec<Vec<u8>> {
    values
        .iter()
        .flat_map(|v| v.chunks(32).filter(|c| c.len() == 32).map(<[u8]>::to_vec))
        .collect()
}

#[tokio::test]
async fn after_a_rotation_the_files_hold_no_old_ciphertext() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("warren.db");
    fill(&path).await;
    {
        // History the old key sealed: a secret updated, another deleted, and an ended sandbox
        // with a large environment (overflow pages) pruned.
        let store = SqliteStore::open(&path).unwrap();
        let mut s = store.get_secret("sec_rot").await.unwrap().unwrap();
        s.value = "secret-rotate-me-v2".into();
        s.info.version = 2;
        store.put_secret(&s).await.unwrap();
        s.info.id = "sec_gone".into();
        s.info.name = "gone".into();
        store.put_secret(&s).await.unwrap();
        assert!(store.delete_secret("sec_gone").await.unwrap());
        let mut ended = sandbox();
        ended.id = "iended".parse().expect("a valid sandbox id");
        ended.state = SandboxState::Killed;
        ended.end_at = Utc::now() - chrono::Duration::hours(1);
        ended.env_vars = (0..200)
            .map(|i| (format!("VAR_{i}"), format!("value-{i}-{}", "x".repeat(40))))
            .collect();
        store.insert_sandbox(&ended).await.unwrap();
        assert_eq!(store.prune_ended(Utc::now()).await.unwrap(), 1);
    }
    let old = base64_runs(&raw_files(&path));
    // The live values are among them (the scan finds what it must not find later).
    let conn = rusqlite::Connection::open(&path).unwrap();
    let live: String = conn
        .query_row("SELECT value FROM secrets WHERE id = 'sec_rot'", [], |r| {
            r.get(0)
        })
        .unwrap();
    drop(conn);
    assert!(old.iter().any(|v| contains(v, &live.as_bytes()[5..])));
    let old = pieces(&old);
    // At least one piece of each of the five live values.
    assert!(old.len() >= 5, "{} pieces of old ciphertext", old.len());

    // Another connection open across the rotation (a reader, a backup tool) keeps SQLite from
    // removing the WAL when the rotation's connection closes.
    let held = SqliteStore::open(&path).unwrap();
    SqliteStore::rotate_key(&path).unwrap();
    let raw = raw_files(&path);
    let left = old.iter().filter(|p| contains(&raw, p)).count();
    assert_eq!(
        left, 0,
        "{left} pieces of old ciphertext are still in the files"
    );
    drop(held);
    let raw = raw_files(&path);
    let left = old.iter().filter(|p| contains(&raw, p)).count();
    assert_eq!(
        left, 0,
        "{left} pieces of old ciphertext are still in the files"
    );
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(
        store.get_secret("sec_rot").await.unwrap().unwrap().value,
        "secret-rotate-me-v2"
    );
    let sb = store.get_sandbox("irot").await.unwrap().unwrap();
    assert_eq!(sb.env_vars["TOKEN"], "env-rotate-me");
}

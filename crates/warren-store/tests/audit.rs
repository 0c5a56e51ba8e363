//! What the audit trail's budget asks the store: the bytes a sandbox's entries take (the same
//! estimate the budget adds up) and where each source's kept entries end.

use std::collections::BTreeMap;
use warren_control::store::*;

use chrono::{TimeZone, Utc};
use warren_control::{AuditEntry, AuditLevel, StoredAudit, AUDIT_ROW_OVERHEAD};
use warren_store::SqliteStore;

fn row(sandbox: &str, source: &str, position: u64, message: &str) -> StoredAudit {
    StoredAudit {
        source: source.into(),
        position,
        entry: AuditEntry {
            sandbox_id: sandbox.into(),
            team: "team-a".into(),
            at: Utc
                .timestamp_micros(1_700_000_000_000_000 + position as i64)
                .unwrap(),
            kind: "process.exec".into(),
            level: AuditLevel::Info,
            message: message.into(),
            fields: BTreeMap::from([("argv".into(), "[\"/bin/true\"]".into())]),
        },
    }
}

fn estimate(s: &StoredAudit) -> u64 {
    let e = &s.entry;
    (e.sandbox_id.len()
        + e.team.len()
        + s.source.len()
        + e.kind.len()
        + e.message.len()
        + serde_json::to_string(&e.fields).unwrap().len()) as u64
        + AUDIT_ROW_OVERHEAD
}

#[tokio::test]
async fn usage_and_last_positions_per_sandbox_and_source() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("warren.db")).unwrap();
    let a: Vec<StoredAudit> = (1..=5)
        .map(|n| row("sa", "host:boot1", n, "é true"))
        .chain([row("sa", "network", 77, "tcp allowed")])
        .collect();
    let b = vec![row("sb", "host:boot1", 9, "x")];
    store.append_audit(&a).await.unwrap();
    store.append_audit(&b).await.unwrap();
    // Kept once: a second append of the same rows adds nothing.
    assert!(store.append_audit(&a).await.unwrap().is_empty());

    assert_eq!(
        store.audit_usage("sa").await.unwrap(),
        a.iter().map(estimate).sum::<u64>()
    );
    assert_eq!(store.audit_usage("sb").await.unwrap(), estimate(&b[0]));
    assert_eq!(store.audit_usage("none").await.unwrap(), 0);

    let (position, at) = store.audit_last("sa", "host:boot1").await.unwrap().unwrap();
    assert_eq!((position, at), (5, a[4].entry.at));
    assert_eq!(
        store.audit_last("sa", "network").await.unwrap().unwrap().0,
        77
    );
    assert!(store
        .audit_last("sa", "host:boot2")
        .await
        .unwrap()
        .is_none());
}

//! Templates, builds and build logs in SQLite: what the control plane relies on.

use chrono::{TimeZone, Utc};
use warren_control::store::*;
use warren_control::{Build, BuildReason, BuildStatus, LogEntry, LogLevel, TagRef, Template};
use warren_store::SqliteStore;

fn template(id: &str, alias: Option<&str>) -> Template {
    let t = Utc.timestamp_micros(1_700_000_000_000_000).unwrap();
    Template {
        id: id.into(),
        team: "team-a".into(),
        alias: alias.map(str::to_string),
        public: false,
        resources: warren_control::Resources {
            cpu_count: 2,
            memory_mb: 1024,
            disk_mb: 4096,
        },
        created_at: t,
        updated_at: t,
        build_count: 0,
        spawn_count: 0,
        last_spawned_at: None,
        tags: Default::default(),
    }
}

fn build(id: &str, template: &str, status: BuildStatus) -> Build {
    let t = Utc.timestamp_micros(1_700_000_000_000_000).unwrap();
    Build {
        id: id.into(),
        template_id: template.into(),
        status,
        tags: vec!["default".into()],
        reason: None,
        image: None,
        resources: warren_control::Resources {
            cpu_count: 2,
            memory_mb: 1024,
            disk_mb: 4096,
        },
        created_at: t,
        updated_at: t,
    }
}

fn entry(n: usize) -> LogEntry {
    LogEntry {
        timestamp: Utc
            .timestamp_micros(1_700_000_000_000_000 + n as i64)
            .unwrap(),
        level: if n.is_multiple_of(2) {
            LogLevel::Info
        } else {
            LogLevel::Warn
        },
        message: format!("line {n}"),
        step: Some((n % 3).to_string()),
    }
}

#[tokio::test]
async fn templates_round_trip_and_aliases_stay_unique() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("w.db")).unwrap();
    let mut t = template("t1", Some("app"));
    t.tags.insert(
        "default".into(),
        TagRef {
            build_id: "b1".into(),
            created_at: t.created_at,
        },
    );
    store.put_template(&t).await.unwrap();
    assert_eq!(store.get_template("t1").await.unwrap(), Some(t.clone()));
    assert_eq!(
        store.template_by_alias("app").await.unwrap(),
        Some(t.clone())
    );
    // Another template cannot take the alias; the same one can be updated.
    assert!(store
        .put_template(&template("t2", Some("app")))
        .await
        .is_err());
    t.public = true;
    store.put_template(&t).await.unwrap();
    assert!(store.get_template("t1").await.unwrap().unwrap().public);
    store.put_template(&template("t3", None)).await.unwrap();
    assert_eq!(store.templates().await.unwrap().len(), 2);
    // Reopened: everything is still there.
    drop(store);
    let store = SqliteStore::open(&dir.path().join("w.db")).unwrap();
    assert_eq!(store.get_template("t1").await.unwrap(), Some(t));
}

#[tokio::test]
async fn builds_page_their_logs_and_go_with_their_template() {
    let store = SqliteStore::open_in_memory().unwrap();
    store
        .put_template(&template("t1", Some("app")))
        .await
        .unwrap();
    let mut b = build("b1", "t1", BuildStatus::Building);
    store.put_build(&b).await.unwrap();
    store
        .put_build(&build("b2", "t1", BuildStatus::Ready))
        .await
        .unwrap();
    assert_eq!(
        store.builds_in(BuildStatus::Building).await.unwrap(),
        vec![b.clone()]
    );
    b.status = BuildStatus::Error;
    b.reason = Some(BuildReason {
        message: "failed".into(),
        step: Some("2".into()),
    });
    store.put_build(&b).await.unwrap();
    assert_eq!(store.get_build("b1").await.unwrap(), Some(b.clone()));
    assert!(store
        .builds_in(BuildStatus::Building)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(store.builds_of("t1").await.unwrap().len(), 2);

    let entries: Vec<LogEntry> = (0..250).map(entry).collect();
    store.append_build_logs("b1", 0, &entries).await.unwrap();
    let page = store.build_logs("b1", 100, 100).await.unwrap();
    assert_eq!(page, entries[100..200].to_vec());
    assert_eq!(
        store.build_logs("b1", 240, 100).await.unwrap(),
        entries[240..].to_vec()
    );
    assert!(store.build_logs("b1", 250, 100).await.unwrap().is_empty());
    assert!(store.build_logs("b2", 0, 100).await.unwrap().is_empty());

    assert!(store.delete_template("t1").await.unwrap());
    assert!(!store.delete_template("t1").await.unwrap());
    assert_eq!(store.get_build("b1").await.unwrap(), None);
    assert!(store.build_logs("b1", 0, 100).await.unwrap().is_empty());
    assert_eq!(store.template_by_alias("app").await.unwrap(), None);
}

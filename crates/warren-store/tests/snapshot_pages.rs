//! Snapshot listings and quota sums answered by SQL (threat model M5): pages in a stable
//! order, each team's rows only, counts and bytes as aggregates.

use std::collections::BTreeMap;
use warren_control::store::*;

use chrono::{TimeZone, Utc};
use warren_control::Snapshot;
use warren_store::SqliteStore;

fn snap(id: &str, team: &str, sandbox: &str, micros: i64, bytes: u64) -> Snapshot {
    Snapshot {
        volume_mounts: Vec::new(),
        id: id.into(),
        names: Vec::new(),
        key: format!("key-{id}"),
        sandbox_id: sandbox.into(),
        template: "base".into(),
        resources: warren_control::Resources {
            cpu_count: 1,
            memory_mb: 512,
            disk_mb: 1024,
        },
        allow_internet_access: true,
        env_vars: BTreeMap::from([("SECRET".to_string(), format!("of-{id}"))]),
        metadata: BTreeMap::new(),
        memory: false,
        bytes,
        created_at: Utc.timestamp_micros(micros).unwrap(),
        team: team.into(),
    }
}

fn named(mut s: Snapshot, name: &str) -> Snapshot {
    s.names = vec![name.into()];
    s
}

async fn insert(store: &SqliteStore, s: &Snapshot) {
    store.insert_snapshot(s, None).await.unwrap();
}

fn ids(page: &[Snapshot]) -> Vec<&str> {
    page.iter().map(|s| s.id.as_str()).collect()
}

/// Reads every page of a listing through the store's cursor.
async fn all_pages(
    store: &SqliteStore,
    team: Option<&str>,
    sandbox: Option<&str>,
    limit: usize,
) -> Vec<Vec<String>> {
    let mut pages = Vec::new();
    let mut after: Option<(i64, String)> = None;
    loop {
        let page = store
            .snapshot_page(
                team,
                sandbox,
                None,
                after.as_ref().map(|(t, id)| (*t, id.as_str())),
                limit,
            )
            .await
            .unwrap();
        assert!(page.len() <= limit);
        if page.is_empty() {
            return pages;
        }
        let last = page.last().unwrap();
        after = Some((last.created_at.timestamp_micros(), last.id.clone()));
        pages.push(page.into_iter().map(|s| s.id).collect());
    }
}

#[tokio::test]
async fn pages_are_newest_first_and_cover_every_snapshot_once() {
    let store = SqliteStore::open_in_memory().unwrap();
    // Inserted out of order; "sb" and "sc" share a creation time, so the id decides.
    for (id, t) in [
        ("sa", 10),
        ("sd", 40),
        ("sc", 30),
        ("sb", 30),
        ("se", 50),
        ("sf", 5),
    ] {
        insert(&store, &snap(id, "team-a", "iabc", t, 1)).await;
    }
    let pages = all_pages(&store, None, None, 2).await;
    assert_eq!(
        pages,
        [vec!["se", "sd"], vec!["sc", "sb"], vec!["sa", "sf"]],
        "newest first, then by id descending"
    );
    // Rows decode in full (sealed env vars included).
    let first = store
        .snapshot_page(None, None, None, None, 1)
        .await
        .unwrap();
    assert_eq!(first, [snap("se", "team-a", "iabc", 50, 1)]);
    assert!(store
        .snapshot_page(None, None, None, None, 0)
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn a_cursor_holds_while_snapshots_come_and_go_between_pages() {
    let store = SqliteStore::open_in_memory().unwrap();
    for (id, t) in [("s1", 1), ("s2", 2), ("s3", 3), ("s4", 4), ("s5", 5)] {
        insert(&store, &snap(id, "team-a", "iabc", t, 1)).await;
    }
    let page1 = store
        .snapshot_page(None, None, None, None, 2)
        .await
        .unwrap();
    assert_eq!(ids(&page1), ["s5", "s4"]);
    let cursor = (page1[1].created_at.timestamp_micros(), page1[1].id.clone());

    // A new snapshot (newer than everything) and the deletion of the cursor's own row.
    insert(&store, &snap("s9", "team-a", "iabc", 9, 1)).await;
    assert!(store.delete_snapshot("s4").await.unwrap());

    let page2 = store
        .snapshot_page(None, None, None, Some((cursor.0, &cursor.1)), 2)
        .await
        .unwrap();
    assert_eq!(ids(&page2), ["s3", "s2"], "no repeat, no skip, no newcomer");
    let last = page2.last().unwrap();
    let page3 = store
        .snapshot_page(
            None,
            None,
            None,
            Some((last.created_at.timestamp_micros(), &last.id)),
            2,
        )
        .await
        .unwrap();
    assert_eq!(ids(&page3), ["s1"]);
}

#[tokio::test]
async fn one_team_never_sees_another_teams_snapshots() {
    let store = SqliteStore::open_in_memory().unwrap();
    insert(
        &store,
        &named(snap("sa1", "team-a", "ia", 1, 1), "a-nightly"),
    )
    .await;
    insert(&store, &snap("sa2", "team-a", "ia", 3, 1)).await;
    insert(
        &store,
        &named(snap("sb1", "team-b", "ib", 2, 1), "b-nightly"),
    )
    .await;
    insert(&store, &snap("sb2", "team-b", "ib", 4, 1)).await;

    assert_eq!(
        all_pages(&store, Some("team-a"), None, 1).await,
        [vec!["sa2"], vec!["sa1"]]
    );
    assert_eq!(
        all_pages(&store, Some("team-b"), None, 10).await,
        [vec!["sb2", "sb1"]]
    );
    assert!(all_pages(&store, Some("team-c"), None, 10).await.is_empty());
    // An admin's view: every team, interleaved by time.
    assert_eq!(
        all_pages(&store, None, None, 10).await,
        [vec!["sb2", "sa2", "sb1", "sa1"]]
    );
    // Naming another team's sandbox, id or name finds nothing.
    assert!(all_pages(&store, Some("team-a"), Some("ib"), 10)
        .await
        .is_empty());
    assert_eq!(
        all_pages(&store, None, Some("ib"), 10).await,
        [vec!["sb2", "sb1"]]
    );
    for r in ["sb1", "b-nightly"] {
        let mine = store
            .snapshot_page(Some("team-a"), None, Some(r), None, 10)
            .await
            .unwrap();
        assert!(mine.is_empty(), "team-a sees {r}: {:?}", ids(&mine));
        let theirs = store
            .snapshot_page(Some("team-b"), None, Some(r), None, 10)
            .await
            .unwrap();
        assert_eq!(ids(&theirs), ["sb1"], "by id or by name");
    }
    // Every filter at once.
    let one = store
        .snapshot_page(Some("team-a"), Some("ia"), Some("a-nightly"), None, 10)
        .await
        .unwrap();
    assert_eq!(ids(&one), ["sa1"]);
}

#[tokio::test]
async fn usage_is_counted_and_summed_per_server_and_per_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("warren.db");
    let big = 3 * 1024 * 1024 * 1024 * 1024; // 3 TiB: sums past u32 stay exact.
    {
        let store = SqliteStore::open(&path).unwrap();
        assert_eq!(store.snapshot_usage(None, None).await.unwrap(), (0, 0));
        insert(&store, &snap("s1", "team-a", "ia", 1, big)).await;
        insert(&store, &named(snap("s2", "team-a", "ia", 2, 7), "keep")).await;
        insert(&store, &snap("s3", "team-b", "ib", 3, 11)).await;
    }
    // The sums come from the database file, not from what this process inserted.
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(
        store.snapshot_usage(None, None).await.unwrap(),
        (3, big + 18)
    );
    assert_eq!(
        store.snapshot_usage(Some("ia"), None).await.unwrap(),
        (2, big + 7)
    );
    assert_eq!(
        store.snapshot_usage(Some("ib"), None).await.unwrap(),
        (1, 11)
    );
    assert_eq!(
        store.snapshot_usage(Some("inone"), None).await.unwrap(),
        (0, 0)
    );
    // The snapshot a reused name replaces is left out; unnamed ones always count.
    assert_eq!(
        store.snapshot_usage(None, Some("keep")).await.unwrap(),
        (2, big + 11)
    );
    assert_eq!(
        store
            .snapshot_usage(Some("ia"), Some("keep"))
            .await
            .unwrap(),
        (1, big)
    );
    assert_eq!(
        store.snapshot_usage(None, Some("other")).await.unwrap(),
        (3, big + 18)
    );
    assert!(store.delete_snapshot("s1").await.unwrap());
    assert_eq!(store.snapshot_usage(None, None).await.unwrap(), (2, 18));
}

/// A page decodes only its own rows and the sums decode none: a record that no longer opens
/// (here, another team's, with its sealed env vars damaged on disk) fails only the listings
/// that include it.
#[tokio::test]
async fn only_the_rows_of_a_page_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("warren.db");
    {
        let store = SqliteStore::open(&path).unwrap();
        insert(&store, &snap("sa1", "team-a", "ia", 1, 5)).await;
        insert(&store, &snap("sb1", "team-b", "ib", 2, 6)).await;
    }
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        let n = conn
            .execute(
                "UPDATE snapshots SET env_vars = 'enc1:damaged' WHERE id = 'sb1'",
                [],
            )
            .unwrap();
        assert_eq!(n, 1);
    }
    let store = SqliteStore::open(&path).unwrap();
    let a = store
        .snapshot_page(Some("team-a"), None, None, None, 10)
        .await
        .unwrap();
    assert_eq!(ids(&a), ["sa1"]);
    assert_eq!(store.snapshot_usage(None, None).await.unwrap(), (2, 11));
    assert!(store
        .snapshot_page(None, None, None, None, 10)
        .await
        .is_err());
}

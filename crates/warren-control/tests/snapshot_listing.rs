//! Snapshot listings and quotas as the control plane answers them from the store's pages and
//! sums (threat model M5): paged newest first, scoped to the caller's team, refused at the
//! quota.

mod common;

use chrono::Utc;
use common::{admin, base, full_caps, start_with};
use warren_control::store::*;
use warren_control::{ApiKey, Config, Control, ControlError, Snapshot, SnapshotQuery, Tenant};

fn key(team: &str, admin: bool) -> ApiKey {
    ApiKey {
        id: format!("k-{team}"),
        name: team.into(),
        hash: format!("hash-{team}"),
        prefix: "wr_".into(),
        created_at: Utc::now(),
        revoked_at: None,
        team: team.into(),
        admin,
    }
}

/// The first page of `q` for a key of `team` without admin rights.
async fn listed(c: &Control, team: &str, q: SnapshotQuery) -> Vec<Snapshot> {
    let page = c.tenant(&key(team, false)).list_snapshots(&q).await;
    page.unwrap().items
}

/// Every page of a listing, following `nextToken` until it is absent.
async fn pages(c: &Tenant, mut q: SnapshotQuery) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    loop {
        let page = c.list_snapshots(&q).await.unwrap();
        out.push(page.items.iter().map(|s| s.id.clone()).collect());
        match page.next_token {
            Some(t) => q.next_token = Some(t),
            None => return out,
        }
    }
}

/// Ids newest first, the listing's order (creation time, then id).
fn newest_first(mut snaps: Vec<Snapshot>) -> Vec<String> {
    snaps.sort_by_key(|s| std::cmp::Reverse((s.created_at, s.id.clone())));
    snaps.into_iter().map(|s| s.id).collect()
}

#[tokio::test]
async fn listings_page_newest_first_within_the_callers_team() {
    let (c, store, _) = start_with(full_caps(), Config::default()).await;
    let a = c
        .tenant(&key("team-a", false))
        .create(base())
        .await
        .unwrap();
    let b = c
        .tenant(&key("team-b", false))
        .create(base())
        .await
        .unwrap();
    for _ in 0..5 {
        admin(&c).create_snapshot(&a.id, None, None).await.unwrap();
    }
    for _ in 0..2 {
        admin(&c).create_snapshot(&b.id, None, None).await.unwrap();
    }
    let all = store.snapshots().await.unwrap();
    let of = |team: &str| newest_first(all.iter().filter(|s| s.team == team).cloned().collect());

    let q = SnapshotQuery {
        limit: Some(2),
        ..Default::default()
    };
    let a_pages = pages(&c.tenant(&key("team-a", false)), q.clone()).await;
    assert_eq!(a_pages.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 1]);
    assert_eq!(a_pages.concat(), of("team-a"));
    let b_pages = pages(&c.tenant(&key("team-b", false)), q.clone()).await;
    assert_eq!(b_pages, [of("team-b")], "no token after the last page");
    let admin = pages(&c.tenant(&key("ops", true)), q.clone()).await;
    assert_eq!(admin.concat(), newest_first(all.clone()));

    // Another team's sandbox or snapshot is not there for this key.
    let b_sandbox = SnapshotQuery {
        sandbox_id: Some(b.id.to_string()),
        ..Default::default()
    };
    assert!(listed(&c, "team-a", b_sandbox).await.is_empty());
    let b_snapshot = SnapshotQuery {
        name: Some(format!("{}:default", of("team-b")[0])),
        ..Default::default()
    };
    assert!(listed(&c, "team-a", b_snapshot.clone()).await.is_empty());
    assert_eq!(listed(&c, "team-b", b_snapshot).await.len(), 1);
}

#[tokio::test]
async fn bad_pages_are_refused() {
    let (c, _, _) = start_with(full_caps(), Config::default()).await;
    for q in [
        SnapshotQuery {
            limit: Some(0),
            ..Default::default()
        },
        SnapshotQuery {
            limit: Some(101),
            ..Default::default()
        },
        SnapshotQuery {
            next_token: Some("!!".into()),
            ..Default::default()
        },
        SnapshotQuery {
            // Valid base64, but not a position.
            next_token: Some("bm9wZQ".into()),
            ..Default::default()
        },
    ] {
        let got = admin(&c).list_snapshots(&q).await;
        assert!(
            matches!(got, Err(ControlError::InvalidArgument(_))),
            "{q:?}: {got:?}"
        );
    }
}

/// The byte quota is summed by the store: the fake runtime reports 4096 bytes per snapshot.
#[tokio::test]
async fn the_byte_quota_refuses_at_the_limit_and_a_replaced_name_frees_its_bytes() {
    let config = Config {
        max_snapshot_bytes: 2 * 4096,
        ..Config::default()
    };
    let (c, store, _) = start_with(full_caps(), config).await;
    let sb = admin(&c).create(base()).await.unwrap();
    admin(&c).create_snapshot(&sb.id, None, None).await.unwrap();
    admin(&c)
        .create_snapshot(&sb.id, Some("keep".into()), None)
        .await
        .unwrap();
    let over = admin(&c).create_snapshot(&sb.id, None, None).await;
    assert!(
        matches!(over, Err(ControlError::QuotaExceeded(_))),
        "{over:?}"
    );
    admin(&c)
        .create_snapshot(&sb.id, Some("keep".into()), None)
        .await
        .unwrap();
    assert_eq!(store.snapshot_usage(None, None).await.unwrap(), (2, 8192));
    assert_eq!(
        store
            .snapshot_usage(Some(&sb.id), Some("keep"))
            .await
            .unwrap(),
        (1, 4096)
    );
}

/// Listings and quota checks read pages and sums, never every snapshot record at once (the
/// store refuses that here), so their cost follows the page, not the table.
#[tokio::test]
async fn listings_and_quotas_never_load_every_snapshot() {
    let config = Config {
        max_snapshots: 3,
        ..Config::default()
    };
    let (c, store, _) = start_with(full_caps(), config).await;
    let sb = admin(&c).create(base()).await.unwrap();
    *store.refuse_full_scans.lock().unwrap() = true;
    for _ in 0..3 {
        admin(&c).create_snapshot(&sb.id, None, None).await.unwrap();
    }
    let over = admin(&c).create_snapshot(&sb.id, None, None).await;
    assert!(
        matches!(over, Err(ControlError::QuotaExceeded(_))),
        "{over:?}"
    );
    let q = SnapshotQuery {
        limit: Some(2),
        ..Default::default()
    };
    let listed = pages(&c.tenant(&key("default", false)), q).await;
    assert_eq!(listed.iter().map(Vec::len).collect::<Vec<_>>(), [2, 1]);
}

//! The audit trail's bounds (threat model W3-M2): one sandbox's flood of program executions is
//! kept at its budget and summed up in an `audit.dropped` entry (never dropped silently),
//! another sandbox's entries are untouched, a source's huge pages are read a bounded number of
//! bytes per round, and below the data disk's free-space floor nothing more is stored.

mod common;

use chrono::Utc;
use common::*;
use warren_control::{
    ApiKey, AuditBudget, AuditEntry, AuditQuery, Config, Control, Sandbox, Tenant, KIND_DROPPED,
};

fn admin_key() -> ApiKey {
    ApiKey {
        id: "k".into(),
        name: "admin".into(),
        hash: "hash".into(),
        prefix: "wr_".into(),
        created_at: Utc::now(),
        revoked_at: None,
        team: String::new(),
        admin: true,
    }
}

/// A budget whose rate adds nothing within a test: only the burst counts.
fn budget(burst: u32) -> Config {
    Config {
        audit_budget: AuditBudget {
            entries_per_second: 0,
            burst,
            ..AuditBudget::default()
        },
        ..Config::default()
    }
}

/// The sandbox's trail (which reads a running sandbox's journals first), of `kinds`.
async fn trail(t: &Tenant, id: &str, kinds: &[&str]) -> Vec<AuditEntry> {
    t.audit(AuditQuery {
        sandbox_id: id.into(),
        kinds: kinds.iter().map(|k| k.to_string()).collect(),
        limit: 10_000,
        ..AuditQuery::default()
    })
    .await
    .unwrap()
}

fn summed(summaries: &[AuditEntry], field: &str) -> u64 {
    summaries
        .iter()
        .map(|e| e.fields.get(field).map_or(0, |v| v.parse::<u64>().unwrap()))
        .sum()
}

async fn two(c: &Control) -> (Sandbox, Sandbox) {
    (
        admin(c).create(base()).await.unwrap(),
        admin(c).create(base()).await.unwrap(),
    )
}

#[tokio::test]
async fn a_flood_from_one_sandbox_is_kept_at_its_budget_and_summed_up() {
    let (c, store, rt) = start(budget(100)).await;
    let t = c.tenant(&admin_key());
    let (loud, quiet) = two(&c).await;
    rt.exec(&loud.id, 5000, 100);
    rt.exec(&quiet.id, 50, 100);

    let kept = trail(&t, &loud.id, &["process"]).await;
    assert_eq!(kept.len(), 100, "the burst is kept, the rest is not");
    assert!(kept[0].message.starts_with("1 "), "the first ones are kept");
    // The kill reads what is left and writes the summary that is due.
    admin(&c).kill(&loud.id).await.unwrap();
    let summaries = trail(&t, &loud.id, &["audit"]).await;
    assert_eq!(summaries.len(), 1, "{summaries:?}");
    let s = &summaries[0];
    assert_eq!(s.kind, KIND_DROPPED);
    assert_eq!(s.fields["entries"], "4900", "{s:?}");
    assert_eq!(s.fields["kinds"], "process.exec:4900");
    assert_eq!(s.fields["reasons"], "rate:4900");
    assert!(summed(&summaries, "bytes") > 4900 * 100);
    assert!(s.message.contains("4900 audit entries"), "{}", s.message);

    // What the store holds of the loud sandbox is its burst and one summary.
    let rows = store.audit.lock().unwrap().clone();
    let loud_rows: Vec<_> = rows
        .iter()
        .filter(|r| loud.id == r.entry.sandbox_id)
        .collect();
    assert_eq!(loud_rows.len(), 101);
    let loud_bytes: u64 = loud_rows.iter().map(|r| row_bytes(r)).sum();
    assert!(loud_bytes < 101 * 1024, "{loud_bytes} bytes kept");

    // The quiet sandbox lost nothing to its neighbour.
    let theirs = trail(&t, &quiet.id, &["process"]).await;
    assert_eq!(theirs.len(), 50);
    admin(&c).kill(&quiet.id).await.unwrap();
    let all = trail(&t, &quiet.id, &[]).await;
    assert!(all.iter().all(|e| e.kind != KIND_DROPPED), "{all:?}");
}

#[tokio::test]
async fn a_sandboxs_bytes_are_bounded_also_across_a_restart() {
    let mut config = budget(100_000);
    // About 40 entries of 1 KiB each.
    config.audit_budget.sandbox_bytes = 40 * 1200;
    let (c, store, rt) = start(config.clone()).await;
    let t = c.tenant(&admin_key());
    let sb = admin(&c).create(base()).await.unwrap();
    rt.exec(&sb.id, 30, 1024);
    assert_eq!(trail(&t, &sb.id, &["process"]).await.len(), 30);

    // A restart neither reads the kept entries again nor renews the budget.
    c.shutdown();
    let c = Control::start(store.clone(), rt.clone(), config)
        .await
        .unwrap();
    let t = c.tenant(&admin_key());
    rt.exec(&sb.id, 30, 1024);
    let kept = trail(&t, &sb.id, &["process"]).await.len();
    assert!(kept > 30 && kept < 45, "{kept} entries kept");
    let bytes: u64 = store.audit.lock().unwrap().iter().map(row_bytes).sum();
    assert!(bytes <= 40 * 1200, "{bytes} bytes kept");
    admin(&c).kill(&sb.id).await.unwrap();
    let summaries = trail(&t, &sb.id, &["audit"]).await;
    assert_eq!(summed(&summaries, "entries"), 60 - kept as u64);
    assert!(summaries[0].fields["reasons"].starts_with("size:"));
    assert_eq!(store.audit.lock().unwrap().len(), kept + 1);
}

#[tokio::test]
async fn huge_pages_are_read_a_bounded_number_of_bytes_per_round() {
    let mut config = budget(100_000);
    config.audit_budget.round_bytes = 1 << 20;
    let (c, store, rt) = start(config).await;
    let t = c.tenant(&admin_key());
    let sb = admin(&c).create(base()).await.unwrap();
    // A hostile source: 100 KiB entries, two a page.
    *rt.journal_page.lock().unwrap() = Some(2);
    rt.exec(&sb.id, 40, 100 * 1024);
    let reads_before = *rt.journal_reads.lock().unwrap();
    trail(&t, &sb.id, &["process"]).await;
    let reads = *rt.journal_reads.lock().unwrap() - reads_before;
    // 1 MiB a round is five or six pages, not the twenty allowed.
    assert!(reads <= 6, "{reads} pages read in one round");
    // The rest waits for the next rounds, and each entry kept is clipped to the entry bound.
    for _ in 0..5 {
        trail(&t, &sb.id, &["process"]).await;
    }
    let rows = store.audit.lock().unwrap().clone();
    assert_eq!(rows.len(), 40);
    for r in &rows {
        assert!(row_bytes(r) < 17 * 1024 + 256, "{} bytes", row_bytes(r));
        assert!(r.entry.fields.contains_key("clipped_bytes"));
    }
}

#[tokio::test]
async fn below_the_free_space_floor_nothing_more_is_stored() {
    let (c, store, rt) = start(budget(100_000)).await;
    let t = c.tenant(&admin_key());
    let sb = admin(&c).create(base()).await.unwrap();
    let floor = c.config().audit_budget.min_free_bytes;
    let free = |bytes: u64| {
        Some(warren_runtime::Headroom {
            free_bytes: bytes,
            free_inodes: 1 << 20,
        })
    };
    // Above the pause floor, below the trail's.
    *rt.headroom.lock().unwrap() = free(floor - 1);
    rt.exec(&sb.id, 20, 100);
    assert!(trail(&t, &sb.id, &["process", "audit"]).await.is_empty());
    assert!(store.audit.lock().unwrap().is_empty(), "nothing is stored");
    // A summary is not written either while the disk is full; it is once there is room.
    admin(&c)
        .kill(&sb.id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(store.audit.lock().unwrap().is_empty());

    let (c, store, rt) = start(budget(100_000)).await;
    let t = c.tenant(&admin_key());
    let sb = admin(&c).create(base()).await.unwrap();
    *rt.headroom.lock().unwrap() = free(floor - 1);
    rt.exec(&sb.id, 20, 100);
    trail(&t, &sb.id, &["process"]).await;
    *rt.headroom.lock().unwrap() = free(floor * 2);
    rt.exec(&sb.id, 5, 100);
    assert_eq!(trail(&t, &sb.id, &["process"]).await.len(), 5);
    admin(&c).kill(&sb.id).await.unwrap();
    let summaries = trail(&t, &sb.id, &["audit"]).await;
    assert_eq!(summed(&summaries, "entries"), 20, "{summaries:?}");
    assert_eq!(summaries[0].fields["reasons"], "disk:20");
    assert_eq!(store.audit.lock().unwrap().len(), 5 + 1);
}

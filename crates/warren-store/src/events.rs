//! The `events` table: sandboxes' lifecycle events, one JSON document each, in the order they
//! were recorded.

use rusqlite::{params, ToSql};
use warren_control::{EventQuery, SandboxEvent, StoreError};

use crate::{backend, docs, Db};

pub(crate) fn append(db: &mut Db, e: &SandboxEvent) -> Result<(), StoreError> {
    let doc = serde_json::to_string(e).map_err(backend)?;
    db.conn
        .execute(
            "INSERT INTO events (id, sandbox_id, team, kind, at_us, doc)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                e.id,
                e.sandbox_id,
                e.team,
                e.kind.type_name(),
                e.at.timestamp_micros(),
                doc
            ],
        )
        .map_err(backend)?;
    Ok(())
}

pub(crate) fn query(db: &mut Db, q: &EventQuery) -> Result<Vec<SandboxEvent>, StoreError> {
    let mut filters = Vec::new();
    let mut args: Vec<Box<dyn ToSql>> = Vec::new();
    if let Some(id) = &q.sandbox_id {
        args.push(Box::new(id.clone()));
        filters.push(format!("sandbox_id = ?{}", args.len()));
    }
    if let Some(team) = &q.team {
        args.push(Box::new(team.clone()));
        filters.push(format!("team = ?{}", args.len()));
    }
    if let Some(since) = q.since {
        args.push(Box::new(since.timestamp_micros()));
        filters.push(format!("at_us >= ?{}", args.len()));
    }
    if !q.kinds.is_empty() {
        let mut marks = Vec::new();
        for k in &q.kinds {
            args.push(Box::new(k.type_name()));
            marks.push(format!("?{}", args.len()));
        }
        filters.push(format!("kind IN ({})", marks.join(", ")));
    }
    let filter = if filters.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", filters.join(" AND "))
    };
    let order = if q.ascending { "ASC" } else { "DESC" };
    args.push(Box::new(i64::try_from(q.limit).unwrap_or(i64::MAX)));
    let limit = args.len();
    args.push(Box::new(i64::try_from(q.offset).unwrap_or(i64::MAX)));
    let offset = args.len();
    let sql = format!(
        "SELECT id, doc FROM events {filter} ORDER BY seq {order} LIMIT ?{limit} OFFSET ?{offset}"
    );
    let refs: Vec<&dyn ToSql> = args.iter().map(|a| a.as_ref()).collect();
    docs(db, &sql, refs.as_slice(), "event", |d| {
        serde_json::from_str(d)
    })
}

pub(crate) fn prune(db: &mut Db, before_us: i64) -> Result<usize, StoreError> {
    db.conn
        .execute("DELETE FROM events WHERE at_us < ?1", [before_us])
        .map_err(backend)
}

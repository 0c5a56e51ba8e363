//! The `audit` table: what happened inside sandboxes (see `warren_control::audit`), one row
//! per entry, unique by sandbox, source and position so that reading a journal again keeps
//! nothing twice.

use rusqlite::{params, ToSql};
use warren_control::{AuditEntry, AuditLevel, AuditQuery, StoreError, StoredAudit};

use crate::{backend, Db};

fn level_number(l: AuditLevel) -> i64 {
    match l {
        AuditLevel::Debug => 0,
        AuditLevel::Info => 1,
        AuditLevel::Warn => 2,
        AuditLevel::Error => 3,
    }
}

fn level_of(n: i64) -> AuditLevel {
    match n {
        0 => AuditLevel::Debug,
        2 => AuditLevel::Warn,
        3 => AuditLevel::Error,
        _ => AuditLevel::Info,
    }
}

pub(crate) fn append(db: &mut Db, entries: &[StoredAudit]) -> Result<Vec<usize>, StoreError> {
    let tx = db.conn.transaction().map_err(backend)?;
    let mut fresh = Vec::new();
    {
        let mut insert = tx
            .prepare_cached(
                "INSERT OR IGNORE INTO audit
                 (sandbox_id, team, source, position, at_us, kind, level, message, fields)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )
            .map_err(backend)?;
        for (i, s) in entries.iter().enumerate() {
            let e = &s.entry;
            let fields = serde_json::to_string(&e.fields).map_err(backend)?;
            let changed = insert
                .execute(params![
                    e.sandbox_id,
                    e.team,
                    s.source,
                    i64::try_from(s.position).unwrap_or(i64::MAX),
                    e.at.timestamp_micros(),
                    e.kind,
                    level_number(e.level),
                    e.message,
                    fields
                ])
                .map_err(backend)?;
            if changed > 0 {
                fresh.push(i);
            }
        }
    }
    tx.commit().map_err(backend)?;
    Ok(fresh)
}

pub(crate) fn query(db: &mut Db, q: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError> {
    let mut args: Vec<Box<dyn ToSql>> = vec![Box::new(q.sandbox_id.clone())];
    let mut filters = vec!["sandbox_id = ?1".to_string()];
    let arg = |v: Box<dyn ToSql>, args: &mut Vec<Box<dyn ToSql>>| {
        args.push(v);
        args.len()
    };
    if let Some(team) = &q.team {
        let n = arg(Box::new(team.clone()), &mut args);
        filters.push(format!("team = ?{n}"));
    }
    if let Some(since) = q.since {
        let n = arg(Box::new(since.timestamp_micros()), &mut args);
        filters.push(format!("at_us >= ?{n}"));
    }
    if let Some(until) = q.until {
        let n = arg(Box::new(until.timestamp_micros()), &mut args);
        filters.push(format!("at_us <= ?{n}"));
    }
    if let Some(level) = q.min_level {
        let n = arg(Box::new(level_number(level)), &mut args);
        filters.push(format!("level >= ?{n}"));
    }
    if let Some(search) = &q.search {
        let n = arg(Box::new(search.to_lowercase()), &mut args);
        filters.push(format!("instr(lower(message), ?{n}) > 0"));
    }
    if !q.kinds.is_empty() {
        let mut any = Vec::new();
        for k in &q.kinds {
            let whole = arg(Box::new(k.clone()), &mut args);
            let prefix = arg(Box::new(format!("{k}.")), &mut args);
            any.push(format!(
                "kind = ?{whole} OR substr(kind, 1, length(?{prefix})) = ?{prefix}"
            ));
        }
        filters.push(format!("({})", any.join(" OR ")));
    }
    let order = if q.descending { "DESC" } else { "ASC" };
    let limit = arg(
        Box::new(i64::try_from(q.limit).unwrap_or(i64::MAX)),
        &mut args,
    );
    let sql = format!(
        "SELECT sandbox_id, team, at_us, kind, level, message, fields FROM audit
         WHERE {} ORDER BY at_us {order}, seq {order} LIMIT ?{limit}",
        filters.join(" AND ")
    );
    let refs: Vec<&dyn ToSql> = args.iter().map(|a| a.as_ref()).collect();
    let mut stmt = db.conn.prepare(&sql).map_err(backend)?;
    let rows = stmt
        .query_map(refs.as_slice(), |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, i64>(4)?,
                r.get::<_, String>(5)?,
                r.get::<_, String>(6)?,
            ))
        })
        .map_err(backend)?;
    let mut out = Vec::new();
    for row in rows {
        let (sandbox_id, team, at_us, kind, level, message, fields) = row.map_err(backend)?;
        out.push(AuditEntry {
            sandbox_id,
            team,
            at: chrono::DateTime::from_timestamp_micros(at_us).unwrap_or_default(),
            kind,
            level: level_of(level),
            message,
            fields: serde_json::from_str(&fields).map_err(|e| {
                StoreError::Corrupt(format!("audit entry fields are not a JSON map: {e}"))
            })?,
        });
    }
    Ok(out)
}

/// Bytes of a sandbox's entries: the estimate of `warren_control`'s audit budget (texts, fields
/// as JSON, and a row's fixed cost).
pub(crate) fn usage(db: &mut Db, sandbox_id: &str) -> Result<u64, StoreError> {
    let bytes: i64 = db
        .conn
        .query_row(
            "SELECT coalesce(sum(length(CAST(sandbox_id AS BLOB)) + length(CAST(team AS BLOB))
                 + length(CAST(source AS BLOB)) + length(CAST(kind AS BLOB))
                 + length(CAST(message AS BLOB)) + length(CAST(fields AS BLOB)) + ?2), 0)
             FROM audit WHERE sandbox_id = ?1",
            params![sandbox_id, warren_control::AUDIT_ROW_OVERHEAD as i64],
            |r| r.get(0),
        )
        .map_err(backend)?;
    Ok(u64::try_from(bytes).unwrap_or(0))
}

/// The highest position and newest time of a sandbox's entries from one source.
pub(crate) fn last(
    db: &mut Db,
    sandbox_id: &str,
    source: &str,
) -> Result<Option<(u64, chrono::DateTime<chrono::Utc>)>, StoreError> {
    let (position, at_us): (Option<i64>, Option<i64>) = db
        .conn
        .query_row(
            "SELECT max(position), max(at_us) FROM audit WHERE sandbox_id = ?1 AND source = ?2",
            params![sandbox_id, source],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .map_err(backend)?;
    Ok(match (position, at_us) {
        (Some(p), Some(at)) => Some((
            u64::try_from(p).unwrap_or(0),
            chrono::DateTime::from_timestamp_micros(at).unwrap_or_default(),
        )),
        _ => None,
    })
}

pub(crate) fn prune(db: &mut Db, before_us: i64) -> Result<usize, StoreError> {
    db.conn
        .execute("DELETE FROM audit WHERE at_us < ?1", [before_us])
        .map_err(backend)
}

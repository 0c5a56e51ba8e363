//! The `templates`, `builds` and `build_logs` tables.

use rusqlite::{params, OptionalExtension};
use warren_control::{Build, BuildStatus, LogEntry, StoreError, Template};

use crate::{backend, Db};

pub(crate) fn corrupt(what: &str, id: &str) -> impl FnOnce(serde_json::Error) -> StoreError {
    let (what, id) = (what.to_string(), id.to_string());
    move |e| StoreError::Corrupt(format!("{what} {id}: {e}"))
}

pub(crate) fn put_template(db: &mut Db, t: &Template) -> Result<(), StoreError> {
    let doc = serde_json::to_string(t).map_err(backend)?;
    db.conn
        .execute(
            "INSERT INTO templates (id, team, alias, doc) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT(id) DO UPDATE SET team = ?2, alias = ?3, doc = ?4",
            params![t.id, t.team, t.alias, doc],
        )
        .map_err(backend)?;
    Ok(())
}

fn one_template(db: &mut Db, column: &str, value: &str) -> Result<Option<Template>, StoreError> {
    let doc: Option<(String, String)> = db
        .conn
        .query_row(
            &format!("SELECT id, doc FROM templates WHERE {column} = ?1"),
            [value],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(backend)?;
    doc.map(|(id, d)| serde_json::from_str(&d).map_err(corrupt("template", &id)))
        .transpose()
}

pub(crate) fn get_template(db: &mut Db, id: &str) -> Result<Option<Template>, StoreError> {
    one_template(db, "id", id)
}

pub(crate) fn template_by_alias(db: &mut Db, alias: &str) -> Result<Option<Template>, StoreError> {
    one_template(db, "alias", alias)
}

pub(crate) fn templates(db: &mut Db) -> Result<Vec<Template>, StoreError> {
    let mut stmt = db
        .conn
        .prepare("SELECT id, doc FROM templates")
        .map_err(backend)?;
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
        .map_err(backend)?;
    let mut out = Vec::new();
    for row in rows {
        let (id, doc) = row.map_err(backend)?;
        out.push(serde_json::from_str(&doc).map_err(corrupt("template", &id))?);
    }
    Ok(out)
}

pub(crate) fn delete_template(db: &mut Db, id: &str) -> Result<bool, StoreError> {
    let tx = db.conn.transaction().map_err(backend)?;
    tx.execute(
        "DELETE FROM build_logs WHERE build_id IN (SELECT id FROM builds WHERE template_id = ?1)",
        [id],
    )
    .map_err(backend)?;
    tx.execute("DELETE FROM builds WHERE template_id = ?1", [id])
        .map_err(backend)?;
    let n = tx
        .execute("DELETE FROM templates WHERE id = ?1", [id])
        .map_err(backend)?;
    tx.commit().map_err(backend)?;
    Ok(n > 0)
}

pub(crate) fn put_build(db: &mut Db, b: &Build) -> Result<(), StoreError> {
    let doc = serde_json::to_string(b).map_err(backend)?;
    db.conn
        .execute(
            "INSERT INTO builds (id, template_id, status, doc) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT(id) DO UPDATE SET template_id = ?2, status = ?3, doc = ?4",
            params![b.id, b.template_id, b.status.as_str(), doc],
        )
        .map_err(backend)?;
    Ok(())
}

fn builds_where(db: &mut Db, column: &str, value: &str) -> Result<Vec<Build>, StoreError> {
    let mut stmt = db
        .conn
        .prepare(&format!("SELECT id, doc FROM builds WHERE {column} = ?1"))
        .map_err(backend)?;
    let rows = stmt
        .query_map([value], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
        })
        .map_err(backend)?;
    let mut out = Vec::new();
    for row in rows {
        let (id, doc) = row.map_err(backend)?;
        out.push(serde_json::from_str(&doc).map_err(corrupt("build", &id))?);
    }
    Ok(out)
}

pub(crate) fn get_build(db: &mut Db, id: &str) -> Result<Option<Build>, StoreError> {
    Ok(builds_where(db, "id", id)?.into_iter().next())
}

pub(crate) fn builds_of(db: &mut Db, template_id: &str) -> Result<Vec<Build>, StoreError> {
    builds_where(db, "template_id", template_id)
}

pub(crate) fn builds_in(db: &mut Db, status: BuildStatus) -> Result<Vec<Build>, StoreError> {
    builds_where(db, "status", status.as_str())
}

pub(crate) fn append_logs(
    db: &mut Db,
    build_id: &str,
    first: usize,
    entries: &[LogEntry],
) -> Result<(), StoreError> {
    let tx = db.conn.transaction().map_err(backend)?;
    {
        let mut stmt = tx
            .prepare("INSERT OR REPLACE INTO build_logs (build_id, seq, doc) VALUES (?1, ?2, ?3)")
            .map_err(backend)?;
        for (i, e) in entries.iter().enumerate() {
            let doc = serde_json::to_string(e).map_err(backend)?;
            let seq = i64::try_from(first + i).map_err(backend)?;
            stmt.execute(params![build_id, seq, doc]).map_err(backend)?;
        }
    }
    tx.commit().map_err(backend)?;
    Ok(())
}

pub(crate) fn logs(
    db: &mut Db,
    build_id: &str,
    offset: usize,
    limit: usize,
) -> Result<Vec<LogEntry>, StoreError> {
    let offset = i64::try_from(offset).unwrap_or(i64::MAX);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut stmt = db
        .conn
        .prepare(
            "SELECT doc FROM build_logs WHERE build_id = ?1 AND seq >= ?2 ORDER BY seq LIMIT ?3",
        )
        .map_err(backend)?;
    let rows = stmt
        .query_map(params![build_id, offset, limit], |r| r.get::<_, String>(0))
        .map_err(backend)?;
    let mut out = Vec::new();
    for row in rows {
        let doc = row.map_err(backend)?;
        out.push(serde_json::from_str(&doc).map_err(corrupt("build log of", build_id))?);
    }
    Ok(out)
}

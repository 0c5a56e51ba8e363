//! The `volumes` table: a JSON document per volume, its content-API token sealed apart.

use rusqlite::{params, OptionalExtension, ToSql};
use warren_control::{StoreError, Volume, VolumeSnapshot};

use crate::templates::corrupt;
use crate::{backend, docs, Db};

const TOKEN_COLUMN: &str = "volume_token";

pub(crate) fn put(db: &mut Db, v: &Volume) -> Result<(), StoreError> {
    let doc = serde_json::to_string(v).map_err(backend)?;
    let token = db.sealer.seal(TOKEN_COLUMN, &v.token)?;
    db.conn
        .execute(
            "INSERT INTO volumes (id, team, name, token, doc) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT(id) DO UPDATE SET team = ?2, name = ?3, token = ?4, doc = ?5",
            params![v.id, v.team, v.name, token, doc],
        )
        .map_err(backend)?;
    Ok(())
}

fn decode(db: &Db, id: &str, token: &str, doc: &str) -> Result<Volume, StoreError> {
    let mut v: Volume = serde_json::from_str(doc).map_err(corrupt("volume", id))?;
    v.token = db.sealer.open(TOKEN_COLUMN, token)?;
    Ok(v)
}

/// The volume `filter` (a `WHERE` clause over `args`) selects.
pub(crate) fn get(
    db: &mut Db,
    filter: &str,
    args: &[&dyn ToSql],
) -> Result<Option<Volume>, StoreError> {
    let row: Option<(String, String, String)> = db
        .conn
        .query_row(
            &format!("SELECT id, token, doc FROM volumes WHERE {filter}"),
            args,
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()
        .map_err(backend)?;
    row.map(|(id, token, doc)| decode(db, &id, &token, &doc))
        .transpose()
}

pub(crate) fn all(db: &mut Db, team: Option<&str>) -> Result<Vec<Volume>, StoreError> {
    let mut stmt = db
        .conn
        .prepare("SELECT id, token, doc FROM volumes WHERE ?1 IS NULL OR team = ?1")
        .map_err(backend)?;
    let rows: Vec<(String, String, String)> = stmt
        .query_map([team], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .map_err(backend)?
        .collect::<Result<_, _>>()
        .map_err(backend)?;
    drop(stmt);
    rows.iter()
        .map(|(id, token, doc)| decode(db, id, token, doc))
        .collect()
}

pub(crate) fn delete(db: &mut Db, id: &str) -> Result<bool, StoreError> {
    let n = db
        .conn
        .execute("DELETE FROM volumes WHERE id = ?1", [id])
        .map_err(backend)?;
    Ok(n > 0)
}

pub(crate) fn put_snapshot(db: &mut Db, s: &VolumeSnapshot) -> Result<(), StoreError> {
    let doc = serde_json::to_string(s).map_err(backend)?;
    db.conn
        .execute(
            "INSERT INTO volume_snapshots (id, team, volume_id, doc) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT(id) DO UPDATE SET team = ?2, volume_id = ?3, doc = ?4",
            params![s.id, s.team, s.volume_id, doc],
        )
        .map_err(backend)?;
    Ok(())
}

pub(crate) fn get_snapshot(db: &mut Db, id: &str) -> Result<Option<VolumeSnapshot>, StoreError> {
    let doc: Option<String> = db
        .conn
        .query_row(
            "SELECT doc FROM volume_snapshots WHERE id = ?1",
            [id],
            |r| r.get(0),
        )
        .optional()
        .map_err(backend)?;
    doc.map(|d| serde_json::from_str(&d).map_err(corrupt("volume snapshot", id)))
        .transpose()
}

pub(crate) fn snapshots(
    db: &mut Db,
    team: Option<&str>,
) -> Result<Vec<VolumeSnapshot>, StoreError> {
    docs(
        db,
        "SELECT id, doc FROM volume_snapshots WHERE ?1 IS NULL OR team = ?1",
        [team],
        "volume snapshot",
        |d| serde_json::from_str(d),
    )
}

pub(crate) fn delete_snapshot(db: &mut Db, id: &str) -> Result<bool, StoreError> {
    let n = db
        .conn
        .execute("DELETE FROM volume_snapshots WHERE id = ?1", [id])
        .map_err(backend)?;
    Ok(n > 0)
}

//! The `secrets` table: a JSON document per secret, its value sealed in a column of its own.

use rusqlite::{params, OptionalExtension, ToSql};
use warren_control::{SealedSecret, SecretInfo, StoreError};

use crate::templates::corrupt;
use crate::{backend, docs, Db};

const VALUE_COLUMN: &str = "secret_value";

pub(crate) fn put(db: &mut Db, s: &SealedSecret) -> Result<(), StoreError> {
    let doc = serde_json::to_string(&s.info).map_err(backend)?;
    let value = db.sealer.seal(VALUE_COLUMN, &s.value)?;
    db.conn
        .execute(
            "INSERT INTO secrets (id, team, name, value, doc) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT(id) DO UPDATE SET team = ?2, name = ?3, value = ?4, doc = ?5",
            params![s.info.id, s.info.team, s.info.name, value, doc],
        )
        .map_err(backend)?;
    Ok(())
}

/// The secret `filter` (a `WHERE` clause over `args`) selects, with its value.
pub(crate) fn get(
    db: &mut Db,
    filter: &str,
    args: &[&dyn ToSql],
) -> Result<Option<SealedSecret>, StoreError> {
    let row: Option<(String, String, String)> = db
        .conn
        .query_row(
            &format!("SELECT id, value, doc FROM secrets WHERE {filter}"),
            args,
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()
        .map_err(backend)?;
    row.map(|(id, value, doc)| {
        Ok(SealedSecret {
            info: serde_json::from_str(&doc).map_err(corrupt("secret", &id))?,
            value: db.sealer.open(VALUE_COLUMN, &value)?,
        })
    })
    .transpose()
}

pub(crate) fn all(db: &mut Db, team: Option<&str>) -> Result<Vec<SecretInfo>, StoreError> {
    docs(
        db,
        "SELECT id, doc FROM secrets WHERE ?1 IS NULL OR team = ?1",
        [team],
        "secret",
        |d| serde_json::from_str(d),
    )
}

pub(crate) fn delete(db: &mut Db, id: &str) -> Result<bool, StoreError> {
    let n = db
        .conn
        .execute("DELETE FROM secrets WHERE id = ?1", [id])
        .map_err(backend)?;
    Ok(n > 0)
}

//! The `networks` and `network_members` tables.

use rusqlite::params;
use warren_control::{Member, PrivateNetwork, StoreError};

use crate::{backend, docs, Db};

pub(crate) fn put_network(db: &mut Db, n: &PrivateNetwork) -> Result<(), StoreError> {
    let doc = serde_json::to_string(n).map_err(backend)?;
    db.conn
        .execute(
            "INSERT INTO networks (id, team, name, doc) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT(id) DO UPDATE SET team = ?2, name = ?3, doc = ?4",
            params![n.id, n.team, n.name, doc],
        )
        .map_err(backend)?;
    Ok(())
}

pub(crate) fn delete_network(db: &mut Db, id: &str) -> Result<bool, StoreError> {
    let tx = db.conn.transaction().map_err(backend)?;
    tx.execute("DELETE FROM network_members WHERE network_id = ?1", [id])
        .map_err(backend)?;
    let n = tx
        .execute("DELETE FROM networks WHERE id = ?1", [id])
        .map_err(backend)?;
    tx.commit().map_err(backend)?;
    Ok(n > 0)
}

pub(crate) fn networks(db: &mut Db) -> Result<Vec<PrivateNetwork>, StoreError> {
    docs(db, "SELECT id, doc FROM networks", [], "network", |d| {
        serde_json::from_str(d)
    })
}

pub(crate) fn put_member(db: &mut Db, m: &Member) -> Result<(), StoreError> {
    let doc = serde_json::to_string(m).map_err(backend)?;
    db.conn
        .execute(
            "INSERT INTO network_members (network_id, sandbox_id, doc) VALUES (?1, ?2, ?3)
             ON CONFLICT(network_id, sandbox_id) DO UPDATE SET doc = ?3",
            params![m.network_id, m.sandbox_id, doc],
        )
        .map_err(backend)?;
    Ok(())
}

pub(crate) fn delete_member(
    db: &mut Db,
    network_id: &str,
    sandbox_id: &str,
) -> Result<bool, StoreError> {
    let n = db
        .conn
        .execute(
            "DELETE FROM network_members WHERE network_id = ?1 AND sandbox_id = ?2",
            params![network_id, sandbox_id],
        )
        .map_err(backend)?;
    Ok(n > 0)
}

pub(crate) fn members(db: &mut Db) -> Result<Vec<Member>, StoreError> {
    docs(
        db,
        "SELECT network_id || '/' || sandbox_id, doc FROM network_members",
        [],
        "network member",
        |d| serde_json::from_str(d),
    )
}

//! The `webhooks` table (a JSON document each, the signature secret sealed in a column of its
//! own) and `webhook_deliveries`, the deliveries receivers have not acknowledged yet.

use rusqlite::{params, OptionalExtension};
use warren_control::{Delivery, SealedWebhook, StoreError, Webhook};

use crate::templates::corrupt;
use crate::{backend, docs, Db};

const SECRET_COLUMN: &str = "webhook_secret";

pub(crate) fn put(db: &mut Db, h: &SealedWebhook) -> Result<(), StoreError> {
    let doc = serde_json::to_string(&h.hook).map_err(backend)?;
    let secret = db.sealer.seal(SECRET_COLUMN, &h.secret)?;
    db.conn
        .execute(
            "INSERT INTO webhooks (id, team, secret, doc) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT(id) DO UPDATE SET team = ?2, secret = ?3, doc = ?4",
            params![h.hook.id, h.hook.team, secret, doc],
        )
        .map_err(backend)?;
    Ok(())
}

pub(crate) fn get(db: &mut Db, id: &str) -> Result<Option<SealedWebhook>, StoreError> {
    let row: Option<(String, String)> = db
        .conn
        .query_row(
            "SELECT secret, doc FROM webhooks WHERE id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(backend)?;
    row.map(|(secret, doc)| {
        Ok(SealedWebhook {
            hook: serde_json::from_str(&doc).map_err(corrupt("webhook", id))?,
            secret: db.sealer.open(SECRET_COLUMN, &secret)?,
        })
    })
    .transpose()
}

pub(crate) fn all(db: &mut Db, team: Option<&str>) -> Result<Vec<Webhook>, StoreError> {
    docs(
        db,
        "SELECT id, doc FROM webhooks WHERE ?1 IS NULL OR team = ?1",
        [team],
        "webhook",
        |d| serde_json::from_str(d),
    )
}

pub(crate) fn delete(db: &mut Db, id: &str) -> Result<bool, StoreError> {
    let tx = db.conn.transaction().map_err(backend)?;
    tx.execute("DELETE FROM webhook_deliveries WHERE webhook_id = ?1", [id])
        .map_err(backend)?;
    let n = tx
        .execute("DELETE FROM webhooks WHERE id = ?1", [id])
        .map_err(backend)?;
    tx.commit().map_err(backend)?;
    Ok(n > 0)
}

pub(crate) fn put_delivery(db: &mut Db, d: &Delivery) -> Result<(), StoreError> {
    let doc = serde_json::to_string(d).map_err(backend)?;
    db.conn
        .execute(
            "INSERT INTO webhook_deliveries (id, webhook_id, doc) VALUES (?1, ?2, ?3)
             ON CONFLICT(id) DO UPDATE SET doc = ?3",
            params![d.id, d.webhook_id, doc],
        )
        .map_err(backend)?;
    Ok(())
}

pub(crate) fn deliveries(db: &mut Db) -> Result<Vec<Delivery>, StoreError> {
    docs(
        db,
        "SELECT id, doc FROM webhook_deliveries ORDER BY rowid",
        [],
        "webhook delivery",
        |d| serde_json::from_str(d),
    )
}

pub(crate) fn delete_delivery(db: &mut Db, id: &str) -> Result<(), StoreError> {
    db.conn
        .execute("DELETE FROM webhook_deliveries WHERE id = ?1", [id])
        .map_err(backend)?;
    Ok(())
}

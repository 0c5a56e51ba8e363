//! Rotation of the store key (`<db>.key`): every sealed value is opened with the current key
//! and sealed again with a new one, in one transaction, then the new key replaces the old.
//!
//! The new key is written first, to `<db>.key.new` (0600, fsynced); the re-sealed rows are
//! committed; only then is it renamed over the old key. A crash in between leaves both files:
//! the next open looks at one sealed value to see which key the database holds, keeps that
//! one and drops the other ([`recover`]). The server must not run meanwhile (its copy of the
//! old key would seal new rows with it): `warren store rotate-key` holds the data dir's
//! serve lock.
//!
//! Once the new key is in place the old ciphertexts are erased from the files too
//! ([`purge`]): the UPDATEs leave them in free space of pages and in the WAL, where a later
//! copy of the files plus a leaked old key would still open them.

use std::path::{Path, PathBuf};

use rusqlite::params;
use warren_control::StoreError;

use crate::seal::{is_plain, Sealer};
use crate::{backend, Db, OpenError, SqliteStore};

/// Every sealed column: table, column, and the name it is sealed under (its AAD).
pub(crate) const SEALED: &[(&str, &str, &str)] = &[
    ("sandboxes", "envd_access_token", "envd_access_token"),
    ("sandboxes", "traffic_access_token", "traffic_access_token"),
    ("sandboxes", "env_vars", "env_vars"),
    ("snapshots", "env_vars", "env_vars"),
    ("volumes", "token", "volume_token"),
    ("secrets", "value", "secret_value"),
    ("webhooks", "secret", "webhook_secret"),
];

pub(crate) fn new_key_path(key: &Path) -> PathBuf {
    let mut name = key.as_os_str().to_owned();
    name.push(".new");
    PathBuf::from(name)
}

fn sync_dir(path: &Path) -> Result<(), StoreError> {
    match path.parent() {
        Some(dir) => std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(backend),
        None => Ok(()),
    }
}

/// One sealed value of the database, with the name it is sealed under, if there is any.
fn probe(db: &Db) -> Result<Option<(String, &'static str)>, StoreError> {
    for (table, column, aad) in SEALED {
        let v: Option<String> = db
            .conn
            .query_row(
                &format!("SELECT {column} FROM {table} WHERE {column} LIKE 'enc1:%' LIMIT 1"),
                [],
                |r| r.get(0),
            )
            .map(Some)
            .or_else(|e| match e {
                rusqlite::Error::QueryReturnedNoRows => Ok(None),
                e => Err(backend(e)),
            })?;
        if let Some(v) = v {
            return Ok(Some((v, aad)));
        }
    }
    Ok(None)
}

/// Finishes or undoes a rotation a crash interrupted (see the module's doc).
pub(crate) fn recover(db: &mut Db, key: &Path) -> Result<(), OpenError> {
    let new_path = new_key_path(key);
    if !new_path.exists() {
        return Ok(());
    }
    let new = Sealer::load_or_create(&new_path)?;
    let holds_new = match probe(db).map_err(OpenError::Reseal)? {
        Some((v, aad)) if db.sealer.open(aad, &v).is_ok() => false,
        Some((v, aad)) if new.open(aad, &v).is_ok() => true,
        // Neither key opens it: touch nothing, say so.
        Some(_) => {
            return Err(OpenError::Reseal(StoreError::Corrupt(format!(
                "neither {} nor {} opens the store's sealed values",
                key.display(),
                new_path.display()
            ))))
        }
        None => false,
    };
    let io = |e: std::io::Error| OpenError::Reseal(backend(e));
    if holds_new {
        std::fs::rename(&new_path, key).map_err(io)?;
        db.sealer = new;
        tracing::warn!(key = %key.display(), "finished a key rotation a crash interrupted");
    } else {
        std::fs::remove_file(&new_path).map_err(io)?;
        tracing::warn!(key = %key.display(), "dropped the new key of a rotation that never committed");
    }
    sync_dir(key).map_err(OpenError::Reseal)
}

/// Re-seals every value with `new` in one transaction; returns how many.
fn reseal_all(db: &mut Db, new: &Sealer) -> Result<usize, StoreError> {
    let tx = db.conn.transaction().map_err(backend)?;
    let mut n = 0;
    for (table, column, aad) in SEALED {
        let rows: Vec<(i64, String)> = {
            let mut stmt = tx
                .prepare(&format!("SELECT rowid, {column} FROM {table}"))
                .map_err(backend)?;
            let rows = stmt
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                .map_err(backend)?;
            rows.collect::<Result<_, _>>().map_err(backend)?
        };
        for (rowid, stored) in rows {
            let plain = if is_plain(&stored) {
                stored
            } else {
                db.sealer.open(aad, &stored)?
            };
            tx.execute(
                &format!("UPDATE {table} SET {column} = ?1 WHERE rowid = ?2"),
                params![new.seal(aad, &plain)?, rowid],
            )
            .map_err(backend)?;
            n += 1;
        }
    }
    tx.commit().map_err(backend)?;
    Ok(n)
}

/// Leaves no page of the database's files holding what the old key sealed: `VACUUM` rebuilds
/// the database from its live rows only (old values in free pages and in free space inside
/// pages are not copied), then a `TRUNCATE` checkpoint writes the rebuilt pages into the main
/// file and empties the WAL, whose frames still hold the pages from before the rotation.
fn purge(db: &mut Db) -> Result<(), StoreError> {
    // secure_delete (on for every connection, see `init`) already zeroes what the re-seal
    // freed; VACUUM also drops what was freed before it was on (older versions).
    db.conn.execute_batch("VACUUM").map_err(backend)?;
    let (busy, wal_frames, checkpointed): (i64, i64, i64) = db
        .conn
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .map_err(backend)?;
    if busy != 0 {
        // Another connection is reading: the WAL cannot be emptied under it.
        return Err(StoreError::backend(format!(
            "another connection kept the WAL busy ({checkpointed} of {wal_frames} frames \
             checkpointed); run the rotation again once nothing else has the database open"
        )));
    }
    Ok(())
}

impl SqliteStore {
    /// Rotates the key of the database at `path` (the server must not be running); returns
    /// how many values were sealed again.
    pub fn rotate_key(path: &Path) -> Result<usize, OpenError> {
        let (n, new_path, key, store) = Self::rotate_until_commit(path)?;
        std::fs::rename(&new_path, &key).map_err(|e| OpenError::Reseal(backend(e)))?;
        sync_dir(&key).map_err(OpenError::Reseal)?;
        // After the rename: the rotation stands even if erasing fails, and the error says
        // what is left to do.
        let mut db = store
            .db
            .lock()
            .map_err(|_| OpenError::Purge(StoreError::backend("database connection poisoned")))?;
        purge(&mut db).map_err(OpenError::Purge)?;
        Ok(n)
    }

    /// [`SqliteStore::rotate_key`] up to the commit, without putting the new key in place:
    /// what a crash at the worst moment leaves (tests of the recovery).
    #[doc(hidden)]
    pub fn rotate_key_interrupted(path: &Path) -> Result<usize, OpenError> {
        Self::rotate_until_commit(path).map(|(n, _, _, _)| n)
    }

    /// Re-seals and commits; returns how many values, the new key's path, the key's path and
    /// the store (open, for the purge).
    fn rotate_until_commit(
        path: &Path,
    ) -> Result<(usize, PathBuf, PathBuf, SqliteStore), OpenError> {
        let store = SqliteStore::open(path)?;
        let key = path.with_extension("key");
        let new_path = new_key_path(&key);
        let new = Sealer::load_or_create(&new_path)?;
        let mut db = store
            .db
            .lock()
            .map_err(|_| OpenError::Reseal(StoreError::backend("database connection poisoned")))?;
        let n = reseal_all(&mut db, &new).map_err(OpenError::Reseal)?;
        drop(db);
        Ok((n, new_path, key, store))
    }
}

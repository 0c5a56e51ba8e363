//! SQLite implementation of [`warren_control::Store`].
//!
//! One connection behind a mutex: SQLite serialises writers anyway, and the control plane's
//! write rate (a few per sandbox lifetime) is far below what one connection sustains. Calls
//! run on tokio's blocking pool so the async executor never waits on disk. The database is in
//! WAL mode with `synchronous=FULL`, so a write has reached the disk when the call returns:
//! the API only acknowledges what is durable.

#![forbid(unsafe_code)]

mod audit;
mod events;
mod migrations;
mod networks;
mod port;
mod rotate;
mod sandboxes;
mod seal;
mod snapshots;
mod templates;
mod vault;
mod volumes;
mod webhooks;

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::{params, Connection, OptionalExtension, Row};
use warren_control::{ApiKey, Sandbox, SandboxState, Snapshot, StoreError};

use crate::sandboxes::{read_row, write_sandbox, SANDBOX_COLUMNS};

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("opening database {path}")]
    Open {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("configuring database")]
    Configure(#[source] rusqlite::Error),
    #[error("applying migration {version}")]
    Migrate {
        version: i64,
        #[source]
        source: rusqlite::Error,
    },
    #[error("making {path} private")]
    Permissions {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Key(#[from] seal::KeyError),
    #[error("encrypting the secrets of rows written before encryption")]
    Reseal(#[source] StoreError),
    #[error(
        "the key was rotated, but erasing the old key's ciphertexts from the database files failed"
    )]
    Purge(#[source] StoreError),
}

pub use seal::KeyError;

/// The connection and the key its secrets are sealed with.
pub(crate) struct Db {
    conn: Connection,
    sealer: seal::Sealer,
}

#[derive(Clone)]
pub struct SqliteStore {
    db: Arc<Mutex<Db>>,
}

/// A database failure, the driver's error kept as the source.
pub(crate) fn backend<E>(e: E) -> StoreError
where
    E: std::error::Error + Send + Sync + 'static,
{
    StoreError::backend_cause("the database failed")(e)
}

/// The `(key, JSON document)` rows `sql` selects with `params`, decoded (`what` names a
/// record in the error of one that does not decode).
pub(crate) fn docs<T, F>(
    db: &mut Db,
    sql: &str,
    params: impl rusqlite::Params,
    what: &str,
    decode: F,
) -> Result<Vec<T>, StoreError>
where
    F: Fn(&str) -> serde_json::Result<T>,
{
    let mut stmt = db.conn.prepare(sql).map_err(backend)?;
    let rows = stmt
        .query_map(params, |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
        })
        .map_err(backend)?;
    let mut out = Vec::new();
    for row in rows {
        let (id, doc) = row.map_err(backend)?;
        out.push(decode(&doc).map_err(templates::corrupt(what, &id))?);
    }
    Ok(out)
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` and brings its schema up to date.
    /// The database and its WAL files are readable by their owner only; secrets in it are
    /// sealed with the key in `<path>.key` (created on first open, 0600).
    pub fn open(path: &Path) -> Result<SqliteStore, OpenError> {
        make_private(path)?;
        let conn = Connection::open(path).map_err(|source| OpenError::Open {
            path: path.display().to_string(),
            source,
        })?;
        let key = path.with_extension("key");
        let sealer = seal::Sealer::load_or_create(&key)?;
        Self::init(conn, sealer, Some(&key))
    }

    /// A private in-memory database (tests).
    pub fn open_in_memory() -> Result<SqliteStore, OpenError> {
        let conn = Connection::open_in_memory().map_err(|source| OpenError::Open {
            path: ":memory:".into(),
            source,
        })?;
        Self::init(conn, seal::Sealer::ephemeral()?, None)
    }

    fn init(
        mut conn: Connection,
        sealer: seal::Sealer,
        key: Option<&Path>,
    ) -> Result<SqliteStore, OpenError> {
        // Several warren processes (server, `warren keys` on the same data dir) may touch the
        // file: wait for locks instead of failing with SQLITE_BUSY.
        conn.busy_timeout(Duration::from_secs(10))
            .map_err(OpenError::Configure)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(OpenError::Configure)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(OpenError::Configure)?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(OpenError::Configure)?;
        // Freed content (a deleted secret's or sandbox's sealed values, the old ciphertexts a
        // key rotation replaces) is overwritten with zeros instead of lingering in free pages
        // for a later copy of the file. Measured: a bulk prune of 100k audit rows writes ~1.5x
        // the WAL bytes and takes ~5% longer; single deletes are fsync-bound either way.
        conn.pragma_update(None, "secure_delete", "ON")
            .map_err(OpenError::Configure)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS schema_migrations (
                version INTEGER PRIMARY KEY NOT NULL,
                applied_at TEXT NOT NULL
            )",
        )
        .map_err(OpenError::Configure)?;
        for (version, sql) in migrations::MIGRATIONS {
            let migrate = |source| OpenError::Migrate {
                version: *version,
                source,
            };
            let tx = conn.transaction().map_err(migrate)?;
            let done: bool = tx
                .query_row(
                    "SELECT EXISTS(SELECT 1 FROM schema_migrations WHERE version = ?1)",
                    [version],
                    |r| r.get(0),
                )
                .map_err(migrate)?;
            if !done {
                tx.execute_batch(sql).map_err(migrate)?;
                tx.execute(
                    "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, ?2)",
                    params![version, Utc::now().to_rfc3339()],
                )
                .map_err(migrate)?;
            }
            tx.commit().map_err(migrate)?;
        }
        let mut db = Db { conn, sealer };
        if let Some(key) = key {
            rotate::recover(&mut db, key)?;
        }
        reseal(&mut db).map_err(OpenError::Reseal)?;
        Ok(SqliteStore {
            db: Arc::new(Mutex::new(db)),
        })
    }

    /// Runs `f` with the connection on the blocking pool.
    async fn with<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Db) -> Result<T, StoreError> + Send + 'static,
    {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            let mut guard = db
                .lock()
                .map_err(|_| StoreError::backend("database connection poisoned"))?;
            f(&mut guard)
        })
        .await
        .map_err(backend)?
    }
}

/// Creates the database file 0600 (SQLite gives its `-wal` and `-shm` files the main file's
/// mode) and tightens files an older version left world-readable.
fn make_private(path: &Path) -> Result<(), OpenError> {
    let err = |p: &Path, source| OpenError::Permissions {
        path: p.display().to_string(),
        source,
    };
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(|e| err(path, e))?;
    for suffix in ["", "-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        let p = Path::new(&name);
        match std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(err(p, e)),
            _ => {}
        }
    }
    Ok(())
}

/// Seals the secrets of rows written before the store encrypted them.
fn reseal(db: &mut Db) -> Result<(), StoreError> {
    let tx = db.conn.transaction().map_err(backend)?;
    let plain_sandboxes: Vec<(String, String, String, String)> = {
        let mut stmt = tx
            .prepare(
                "SELECT id, envd_access_token, traffic_access_token, env_vars FROM sandboxes \
                 WHERE envd_access_token NOT LIKE 'enc1:%' OR traffic_access_token NOT LIKE 'enc1:%' \
                 OR env_vars NOT LIKE 'enc1:%'",
            )
            .map_err(backend)?;
        let rows = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .map_err(backend)?;
        rows.collect::<Result<_, _>>().map_err(backend)?
    };
    let seal = |column: &str, v: &str| -> Result<String, StoreError> {
        if seal::is_plain(v) {
            db.sealer.seal(column, v)
        } else {
            Ok(v.to_string())
        }
    };
    for (id, envd, traffic, env) in plain_sandboxes {
        tx.execute(
            "UPDATE sandboxes SET envd_access_token=?2, traffic_access_token=?3, env_vars=?4 \
             WHERE id=?1",
            params![
                id,
                seal("envd_access_token", &envd)?,
                seal("traffic_access_token", &traffic)?,
                seal("env_vars", &env)?
            ],
        )
        .map_err(backend)?;
    }
    let plain_snapshots: Vec<(String, String)> = {
        let mut stmt = tx
            .prepare("SELECT id, env_vars FROM snapshots WHERE env_vars NOT LIKE 'enc1:%'")
            .map_err(backend)?;
        let rows = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(backend)?;
        rows.collect::<Result<_, _>>().map_err(backend)?
    };
    for (id, env) in plain_snapshots {
        tx.execute(
            "UPDATE snapshots SET env_vars=?2 WHERE id=?1",
            params![id, seal("env_vars", &env)?],
        )
        .map_err(backend)?;
    }
    tx.commit().map_err(backend)
}

pub(crate) fn micros(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

pub(crate) fn from_micros(us: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_micros(us)
        .ok_or_else(|| StoreError::Corrupt(format!("timestamp {us}")))
}

type KeyRow = (
    String,
    String,
    String,
    String,
    i64,
    Option<i64>,
    String,
    bool,
);

fn read_key(r: &Row<'_>) -> rusqlite::Result<KeyRow> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
    ))
}

fn decode_key(
    (id, name, hash, prefix, created, revoked, team, admin): KeyRow,
) -> Result<ApiKey, StoreError> {
    Ok(ApiKey {
        id,
        name,
        hash,
        prefix,
        created_at: from_micros(created)?,
        revoked_at: revoked.map(from_micros).transpose()?,
        team,
        admin,
    })
}

const KEY_COLUMNS: &str = "id, name, hash, prefix, created_at_us, revoked_at_us, team, admin";

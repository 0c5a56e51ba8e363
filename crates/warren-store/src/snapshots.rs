//! The `snapshots` table. A snapshot has at most one name (unique), which is how a newer
//! snapshot of the same name replaces the older one in one transaction.

use rusqlite::{params, OptionalExtension, Row};
use warren_control::{Snapshot, StoreError};

use crate::seal::Sealer;
use crate::{backend, from_micros, micros, Db};

const COLUMNS: &str = "id, name, runtime_key, sandbox_id, template, cpu_count, memory_mb, \
     disk_mb, allow_internet_access, env_vars, metadata, memory, bytes, created_at_us, team";

struct SnapshotRow {
    id: String,
    name: Option<String>,
    key: String,
    sandbox_id: String,
    template: String,
    cpu_count: u32,
    memory_mb: u32,
    disk_mb: u32,
    allow_internet_access: bool,
    env_vars: String,
    metadata: String,
    memory: bool,
    bytes: i64,
    created_at_us: i64,
    team: String,
}

fn read_row(r: &Row<'_>) -> rusqlite::Result<SnapshotRow> {
    Ok(SnapshotRow {
        id: r.get(0)?,
        name: r.get(1)?,
        key: r.get(2)?,
        sandbox_id: r.get(3)?,
        template: r.get(4)?,
        cpu_count: r.get(5)?,
        memory_mb: r.get(6)?,
        disk_mb: r.get(7)?,
        allow_internet_access: r.get(8)?,
        env_vars: r.get(9)?,
        metadata: r.get(10)?,
        memory: r.get(11)?,
        bytes: r.get(12)?,
        created_at_us: r.get(13)?,
        team: r.get(14)?,
    })
}

impl SnapshotRow {
    fn decode(self, sealer: &Sealer) -> Result<Snapshot, StoreError> {
        let corrupt = |what: &str| StoreError::Corrupt(format!("snapshot {}: {what}", self.id));
        let env_vars = sealer.open("env_vars", &self.env_vars)?;
        Ok(Snapshot {
            env_vars: serde_json::from_str(&env_vars).map_err(|_| corrupt("env vars"))?,
            metadata: serde_json::from_str(&self.metadata).map_err(|_| corrupt("metadata"))?,
            bytes: u64::try_from(self.bytes).map_err(|_| corrupt("bytes"))?,
            created_at: from_micros(self.created_at_us)?,
            names: self.name.into_iter().collect(),
            id: self.id,
            key: self.key,
            sandbox_id: self.sandbox_id,
            template: self.template,
            cpu_count: self.cpu_count,
            memory_mb: self.memory_mb,
            disk_mb: self.disk_mb,
            allow_internet_access: self.allow_internet_access,
            memory: self.memory,
            team: self.team,
        })
    }
}

pub(crate) fn insert(db: &mut Db, s: &Snapshot, replaces: Option<&str>) -> Result<(), StoreError> {
    if s.names.len() > 1 {
        return Err(backend("a snapshot has at most one name"));
    }
    let env_vars = serde_json::to_string(&s.env_vars).map_err(backend)?;
    let env_vars = db.sealer.seal("env_vars", &env_vars)?;
    let conn = &mut db.conn;
    let metadata = serde_json::to_string(&s.metadata).map_err(backend)?;
    let bytes = i64::try_from(s.bytes).map_err(backend)?;
    let tx = conn.transaction().map_err(backend)?;
    if let Some(old) = replaces {
        tx.execute("DELETE FROM snapshots WHERE id = ?1", [old])
            .map_err(backend)?;
    }
    tx.execute(
        &format!(
            "INSERT INTO snapshots ({COLUMNS}) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15)"
        ),
        params![
            s.id,
            s.names.first(),
            s.key,
            s.sandbox_id,
            s.template,
            s.cpu_count,
            s.memory_mb,
            s.disk_mb,
            s.allow_internet_access,
            env_vars,
            metadata,
            s.memory,
            bytes,
            micros(s.created_at),
            s.team,
        ],
    )
    .map_err(backend)?;
    tx.commit().map_err(backend)
}

/// By `id` or `name` (the only two columns callers pass).
pub(crate) fn get(db: &mut Db, column: &str, value: &str) -> Result<Option<Snapshot>, StoreError> {
    let conn = &db.conn;
    let column = match column {
        "id" => "id",
        _ => "name",
    };
    conn.query_row(
        &format!("SELECT {COLUMNS} FROM snapshots WHERE {column} = ?1"),
        [value],
        read_row,
    )
    .optional()
    .map_err(backend)?
    .map(|r| r.decode(&db.sealer))
    .transpose()
}

pub(crate) fn all(db: &mut Db) -> Result<Vec<Snapshot>, StoreError> {
    let mut stmt = db
        .conn
        .prepare(&format!("SELECT {COLUMNS} FROM snapshots"))
        .map_err(backend)?;
    let rows = stmt.query_map([], read_row).map_err(backend)?;
    rows.map(|r| r.map_err(backend).and_then(|r| r.decode(&db.sealer)))
        .collect()
}

pub(crate) fn delete(db: &mut Db, id: &str) -> Result<bool, StoreError> {
    let n = db
        .conn
        .execute("DELETE FROM snapshots WHERE id = ?1", [id])
        .map_err(backend)?;
    Ok(n == 1)
}

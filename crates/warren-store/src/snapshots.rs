//! The `snapshots` table. A snapshot has at most one name (unique), which is how a newer
//! snapshot of the same name replaces the older one in one transaction.

use rusqlite::types::Value;
use rusqlite::{params, params_from_iter, OptionalExtension, Row};
use warren_control::{Snapshot, StoreError};

use crate::seal::Sealer;
use crate::{backend, from_micros, micros, Db};

const COLUMNS: &str = "id, name, runtime_key, sandbox_id, template, cpu_count, memory_mb, \
     disk_mb, allow_internet_access, env_vars, metadata, memory, bytes, created_at_us, team, volume_mounts";

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
    volume_mounts: String,
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
        volume_mounts: r.get(15)?,
    })
}

impl SnapshotRow {
    fn decode(self, sealer: &Sealer) -> Result<Snapshot, StoreError> {
        let corrupt = |what: &str| StoreError::Corrupt(format!("snapshot {}: {what}", self.id));
        let env_vars = sealer.open("env_vars", &self.env_vars)?;
        let volume_mounts =
            serde_json::from_str(&self.volume_mounts).map_err(|_| corrupt("volume mounts"))?;
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
            resources: warren_control::Resources {
                cpu_count: self.cpu_count,
                memory_mb: self.memory_mb,
                disk_mb: self.disk_mb,
            },
            allow_internet_access: self.allow_internet_access,
            memory: self.memory,
            volume_mounts,
            team: self.team,
        })
    }
}

pub(crate) fn insert(db: &mut Db, s: &Snapshot, replaces: Option<&str>) -> Result<(), StoreError> {
    if s.names.len() > 1 {
        return Err(StoreError::backend("a snapshot has at most one name"));
    }
    let env_vars = serde_json::to_string(&s.env_vars).map_err(backend)?;
    let env_vars = db.sealer.seal("env_vars", &env_vars)?;
    let conn = &mut db.conn;
    let metadata = serde_json::to_string(&s.metadata).map_err(backend)?;
    let bytes = i64::try_from(s.bytes).map_err(backend)?;
    let volume_mounts = serde_json::to_string(&s.volume_mounts).map_err(backend)?;
    let tx = conn.transaction().map_err(backend)?;
    if let Some(old) = replaces {
        tx.execute("DELETE FROM snapshots WHERE id = ?1", [old])
            .map_err(backend)?;
    }
    tx.execute(
        &format!(
            "INSERT INTO snapshots ({COLUMNS}) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16)"
        ),
        params![
            s.id,
            s.names.first(),
            s.key,
            s.sandbox_id,
            s.template,
            s.resources.cpu_count,
            s.resources.memory_mb,
            s.resources.disk_mb,
            s.allow_internet_access,
            env_vars,
            metadata,
            s.memory,
            bytes,
            micros(s.created_at),
            s.team,
            volume_mounts,
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

/// The `WHERE` clause and parameters of one page's query (see [`page`]).
fn page_query(
    team: Option<&str>,
    sandbox_id: Option<&str>,
    name: Option<&str>,
    after: Option<(i64, &str)>,
    limit: usize,
) -> (String, Vec<Value>) {
    // Only the filters given go into the SQL: `?1 IS NULL OR team = ?1` would keep SQLite
    // from using the index of the filter that is given.
    let mut clauses = Vec::new();
    let mut args = Vec::new();
    if let Some(t) = team {
        clauses.push("team = ?");
        args.push(Value::Text(t.to_string()));
    }
    if let Some(id) = sandbox_id {
        clauses.push("sandbox_id = ?");
        args.push(Value::Text(id.to_string()));
    }
    if let Some(n) = name {
        clauses.push("(id = ? OR name = ?)");
        args.push(Value::Text(n.to_string()));
        args.push(Value::Text(n.to_string()));
    }
    if let Some((t, id)) = after {
        // A row value compares as the ORDER BY does, and SQLite answers it from the index.
        clauses.push("(created_at_us, id) < (?, ?)");
        args.push(Value::Integer(t));
        args.push(Value::Text(id.to_string()));
    }
    let filter = if clauses.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", clauses.join(" AND "))
    };
    args.push(Value::Integer(i64::try_from(limit).unwrap_or(i64::MAX)));
    (
        format!(
            "SELECT {COLUMNS} FROM snapshots{filter} ORDER BY created_at_us DESC, id DESC LIMIT ?"
        ),
        args,
    )
}

/// One page of snapshots, newest first (the order `Store::snapshot_page` defines).
pub(crate) fn page(
    db: &mut Db,
    team: Option<&str>,
    sandbox_id: Option<&str>,
    name: Option<&str>,
    after: Option<(i64, &str)>,
    limit: usize,
) -> Result<Vec<Snapshot>, StoreError> {
    let (sql, args) = page_query(team, sandbox_id, name, after, limit);
    let mut stmt = db.conn.prepare_cached(&sql).map_err(backend)?;
    let rows = stmt
        .query_map(params_from_iter(args), read_row)
        .map_err(backend)?;
    rows.map(|r| r.map_err(backend).and_then(|r| r.decode(&db.sealer)))
        .collect()
}

/// The aggregate behind [`usage`] and its parameters; only the filters given go into the SQL.
fn usage_query(sandbox_id: Option<&str>, except_name: Option<&str>) -> (String, Vec<Value>) {
    let mut clauses = Vec::new();
    let mut args = Vec::new();
    if let Some(id) = sandbox_id {
        clauses.push("sandbox_id = ?");
        args.push(Value::Text(id.to_string()));
    }
    if let Some(n) = except_name {
        // `IS NOT` keeps the unnamed rows (NULL), which `<>` would drop.
        clauses.push("name IS NOT ?");
        args.push(Value::Text(n.to_string()));
    }
    let filter = if clauses.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", clauses.join(" AND "))
    };
    (
        format!("SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM snapshots{filter}"),
        args,
    )
}

/// `(count, bytes)` of every snapshot, or of one sandbox's, leaving out the one named
/// `except_name`: aggregates answered from `snapshots_sandbox_created` alone.
pub(crate) fn usage(
    db: &mut Db,
    sandbox_id: Option<&str>,
    except_name: Option<&str>,
) -> Result<(u64, u64), StoreError> {
    let (sql, args) = usage_query(sandbox_id, except_name);
    let (n, bytes): (i64, i64) = db
        .conn
        .prepare_cached(&sql)
        .and_then(|mut stmt| stmt.query_row(params_from_iter(args), |r| Ok((r.get(0)?, r.get(1)?))))
        .map_err(backend)?;
    let corrupt = || StoreError::Corrupt(format!("snapshot usage ({n}, {bytes})"));
    Ok((
        u64::try_from(n).map_err(|_| corrupt())?,
        u64::try_from(bytes).map_err(|_| corrupt())?,
    ))
}

pub(crate) fn delete(db: &mut Db, id: &str) -> Result<bool, StoreError> {
    let n = db
        .conn
        .execute("DELETE FROM snapshots WHERE id = ?1", [id])
        .map_err(backend)?;
    Ok(n == 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SqliteStore;

    /// What SQLite plans for a query, one line per step.
    fn plan(db: &Db, sql: &str, args: Vec<Value>) -> String {
        let mut stmt = db
            .conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .unwrap();
        let rows = stmt
            .query_map(params_from_iter(args), |r| r.get::<_, String>(3))
            .unwrap();
        rows.map(Result::unwrap).collect::<Vec<_>>().join("\n")
    }

    /// Pages are read from an index in order: no table scan and no sort of every row, for
    /// each way a listing is narrowed, with and without a cursor.
    #[test]
    fn pages_are_read_in_index_order() {
        let store = SqliteStore::open_in_memory().unwrap();
        let db = store.db.lock().unwrap();
        for team in [None, Some("team-a")] {
            for sandbox in [None, Some("iabc")] {
                for after in [None, Some((5, "s5"))] {
                    let (sql, args) = page_query(team, sandbox, None, after, 10);
                    let plan = plan(&db, &sql, args);
                    assert!(plan.contains("USING INDEX"), "{sql}:\n{plan}");
                    assert!(!plan.contains("TEMP B-TREE"), "{sql}:\n{plan}");
                    if after.is_some() && team.is_none() && sandbox.is_none() {
                        assert!(plan.contains("SEARCH"), "the cursor seeks: {sql}:\n{plan}");
                    }
                }
            }
        }
        // By id or name: the primary key and the unique name, at most two rows.
        let (sql, args) = page_query(None, None, Some("nightly"), None, 10);
        let plan = plan(&db, &sql, args);
        assert!(
            !plan.contains("SCAN snapshots\n") && !plan.ends_with("SCAN snapshots"),
            "{plan}"
        );
    }

    /// The quota sums are answered from an index, never by reading (and decrypting) rows.
    #[test]
    fn usage_reads_only_an_index() {
        let store = SqliteStore::open_in_memory().unwrap();
        let db = store.db.lock().unwrap();
        for sandbox in [None, Some("iabc")] {
            for except in [None, Some("keep")] {
                let (sql, args) = usage_query(sandbox, except);
                let plan = plan(&db, &sql, args);
                assert!(plan.contains("COVERING INDEX"), "{sql}:\n{plan}");
            }
        }
    }
}

//! Versioned schema. Append new versions; never edit an applied one.

pub(crate) const MIGRATIONS: &[(i64, &str)] = &[(
    1,
    "CREATE TABLE sandboxes (
        id TEXT PRIMARY KEY NOT NULL,
        template TEXT NOT NULL,
        state TEXT NOT NULL,
        failure TEXT,
        cpu_count INTEGER NOT NULL,
        memory_mb INTEGER NOT NULL,
        disk_mb INTEGER NOT NULL,
        allow_internet_access INTEGER NOT NULL,
        metadata TEXT NOT NULL,
        started_at_us INTEGER NOT NULL,
        end_at_us INTEGER NOT NULL,
        envd_access_token TEXT NOT NULL,
        traffic_access_token TEXT NOT NULL,
        runtime TEXT
    );
    CREATE INDEX sandboxes_state ON sandboxes(state);
    CREATE TABLE api_keys (
        id TEXT PRIMARY KEY NOT NULL,
        name TEXT NOT NULL,
        hash TEXT NOT NULL UNIQUE,
        prefix TEXT NOT NULL,
        created_at_us INTEGER NOT NULL,
        revoked_at_us INTEGER
    );",
)];

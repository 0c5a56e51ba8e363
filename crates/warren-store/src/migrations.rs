//! Versioned schema. Append new versions; never edit an applied one.

pub(crate) const MIGRATIONS: &[(i64, &str)] = &[
    (
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
    ),
    (
        2,
        // Pause, resume, snapshots, fork: what a later resume or fork needs of a sandbox, and
        // the snapshots themselves.
        "ALTER TABLE sandboxes ADD COLUMN env_vars TEXT NOT NULL DEFAULT '{}';
        ALTER TABLE sandboxes ADD COLUMN lifecycle TEXT NOT NULL DEFAULT '{}';
        ALTER TABLE sandboxes ADD COLUMN pause_mode TEXT;
        CREATE TABLE snapshots (
            id TEXT PRIMARY KEY NOT NULL,
            name TEXT UNIQUE,
            runtime_key TEXT NOT NULL,
            sandbox_id TEXT NOT NULL,
            template TEXT NOT NULL,
            cpu_count INTEGER NOT NULL,
            memory_mb INTEGER NOT NULL,
            disk_mb INTEGER NOT NULL,
            allow_internet_access INTEGER NOT NULL,
            env_vars TEXT NOT NULL,
            metadata TEXT NOT NULL,
            memory INTEGER NOT NULL,
            bytes INTEGER NOT NULL,
            created_at_us INTEGER NOT NULL
        );
        CREATE INDEX snapshots_sandbox ON snapshots(sandbox_id);",
    ),
    (
        3,
        // Who may reach a sandbox's ports (`allowPublicTraffic`); egress policy joins it later.
        "ALTER TABLE sandboxes ADD COLUMN network TEXT NOT NULL DEFAULT '{}';",
    ),
    (
        4,
        // Teams: sandboxes and snapshots belong to the team of the key that made them; a key
        // sees only its team's unless it is an admin key. Keys from before teams keep the
        // power they had (admin), and everything they made is the default team's.
        "ALTER TABLE sandboxes ADD COLUMN team TEXT NOT NULL DEFAULT 'default';
        ALTER TABLE snapshots ADD COLUMN team TEXT NOT NULL DEFAULT 'default';
        ALTER TABLE api_keys ADD COLUMN team TEXT NOT NULL DEFAULT 'default';
        ALTER TABLE api_keys ADD COLUMN admin INTEGER NOT NULL DEFAULT 1;",
    ),
    (
        5,
        // Snapshot listings are paged in SQL, newest first by (created_at_us, id): one index
        // per way a listing is narrowed (none for an admin, by team, by source sandbox), so a
        // page reads only its own rows. The sandbox index also holds `bytes` and `name`, so
        // the quota sums (COUNT/SUM, leaving out a replaced name) never read table rows,
        // whose env vars and metadata may be large.
        "DROP INDEX snapshots_sandbox;
        CREATE INDEX snapshots_created ON snapshots(created_at_us, id);
        CREATE INDEX snapshots_team_created ON snapshots(team, created_at_us, id);
        CREATE INDEX snapshots_sandbox_created
            ON snapshots(sandbox_id, created_at_us, id, bytes, name);",
    ),
    (
        6,
        // Templates built here, their builds and the builds' logs. What is queried (id,
        // alias, team, status, position) has columns; the rest of a record is one JSON
        // document, so new fields need no migration.
        "CREATE TABLE templates (
            id TEXT PRIMARY KEY NOT NULL,
            team TEXT NOT NULL,
            alias TEXT UNIQUE,
            doc TEXT NOT NULL
        );
        CREATE TABLE builds (
            id TEXT PRIMARY KEY NOT NULL,
            template_id TEXT NOT NULL,
            status TEXT NOT NULL,
            doc TEXT NOT NULL
        );
        CREATE INDEX builds_template ON builds(template_id);
        CREATE INDEX builds_status ON builds(status);
        CREATE TABLE build_logs (
            build_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            doc TEXT NOT NULL,
            PRIMARY KEY (build_id, seq)
        );",
    ),
    (
        7,
        // Private networks and their members (Warren's own resource). Queried by id, team
        // and name, and by sandbox; the rest of each record is a JSON document.
        "CREATE TABLE networks (
            id TEXT PRIMARY KEY NOT NULL,
            team TEXT NOT NULL,
            name TEXT NOT NULL,
            doc TEXT NOT NULL,
            UNIQUE (team, name)
        );
        CREATE TABLE network_members (
            network_id TEXT NOT NULL,
            sandbox_id TEXT NOT NULL,
            doc TEXT NOT NULL,
            PRIMARY KEY (network_id, sandbox_id)
        );
        CREATE INDEX network_members_sandbox ON network_members(sandbox_id);",
    ),
    (
        8,
        // Volumes (a JSON document, the content-API token sealed in a column of its own),
        // and the volumes each sandbox and snapshot mounts.
        "CREATE TABLE volumes (
            id TEXT PRIMARY KEY NOT NULL,
            team TEXT NOT NULL,
            name TEXT NOT NULL,
            token TEXT NOT NULL,
            doc TEXT NOT NULL,
            UNIQUE (team, name)
        );
        ALTER TABLE sandboxes ADD COLUMN volume_mounts TEXT NOT NULL DEFAULT '[]';
        ALTER TABLE snapshots ADD COLUMN volume_mounts TEXT NOT NULL DEFAULT '[]';",
    ),
    (
        9,
        // Volume snapshots (they outlive their volume).
        "CREATE TABLE volume_snapshots (
            id TEXT PRIMARY KEY NOT NULL,
            team TEXT NOT NULL,
            volume_id TEXT NOT NULL,
            doc TEXT NOT NULL
        );",
    ),
    (
        10,
        // Secrets: the value sealed in a column of its own, the rest a JSON document.
        "CREATE TABLE secrets (
            id TEXT PRIMARY KEY NOT NULL,
            team TEXT NOT NULL,
            name TEXT NOT NULL,
            value TEXT NOT NULL,
            doc TEXT NOT NULL,
            UNIQUE (team, name)
        );",
    ),
    (
        11,
        // Lifecycle events, in the order they happened (`seq`), kept for a retention period.
        "CREATE TABLE events (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL,
            sandbox_id TEXT NOT NULL,
            team TEXT NOT NULL,
            kind TEXT NOT NULL,
            at_us INTEGER NOT NULL,
            doc TEXT NOT NULL
        );
        CREATE INDEX events_sandbox ON events(sandbox_id, seq);
        CREATE INDEX events_team ON events(team, seq);
        CREATE INDEX events_at ON events(at_us);",
    ),
    (
        12,
        // Webhooks (the signature secret sealed in a column of its own) and the deliveries
        // not yet acknowledged by their receivers.
        "CREATE TABLE webhooks (
            id TEXT PRIMARY KEY NOT NULL,
            team TEXT NOT NULL,
            secret TEXT NOT NULL,
            doc TEXT NOT NULL
        );
        CREATE INDEX webhooks_team ON webhooks(team);
        CREATE TABLE webhook_deliveries (
            id TEXT PRIMARY KEY NOT NULL,
            webhook_id TEXT NOT NULL,
            doc TEXT NOT NULL
        );
        CREATE INDEX webhook_deliveries_hook ON webhook_deliveries(webhook_id);",
    ),
    (
        13,
        // The audit trail: entries of sandboxes' journals and flow logs, unique by their
        // source's position (a journal read twice keeps each entry once).
        "CREATE TABLE audit (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            sandbox_id TEXT NOT NULL,
            team TEXT NOT NULL,
            source TEXT NOT NULL,
            position INTEGER NOT NULL,
            at_us INTEGER NOT NULL,
            kind TEXT NOT NULL,
            level INTEGER NOT NULL,
            message TEXT NOT NULL,
            fields TEXT NOT NULL,
            UNIQUE (sandbox_id, source, position)
        );
        CREATE INDEX audit_sandbox_at ON audit(sandbox_id, at_us);
        CREATE INDEX audit_at ON audit(at_us);",
    ),
];

//! The `sandboxes` table's rows: encoding a [`Sandbox`] (its secrets sealed) and decoding it.

use rusqlite::{params, Row};
use warren_control::{Sandbox, SandboxState, StoreError};
use warren_runtime::RuntimeSandbox;

use crate::{backend, from_micros, micros, seal, Db};

pub(crate) const SANDBOX_COLUMNS: &str =
    "id, template, state, failure, cpu_count, memory_mb, disk_mb, \
     allow_internet_access, metadata, started_at_us, end_at_us, envd_access_token, \
     traffic_access_token, runtime, env_vars, lifecycle, pause_mode, network, team, volume_mounts";

/// Raw row, decoded outside rusqlite's closure so decode errors keep their own type.
pub(crate) struct SandboxRow {
    id: String,
    template: String,
    state: String,
    failure: Option<String>,
    cpu_count: u32,
    memory_mb: u32,
    disk_mb: u32,
    allow_internet_access: bool,
    metadata: String,
    started_at_us: i64,
    end_at_us: i64,
    envd_access_token: String,
    traffic_access_token: String,
    runtime: Option<String>,
    env_vars: String,
    lifecycle: String,
    pause_mode: Option<String>,
    network: String,
    team: String,
    volume_mounts: String,
}

pub(crate) fn read_row(r: &Row<'_>) -> rusqlite::Result<SandboxRow> {
    Ok(SandboxRow {
        id: r.get(0)?,
        template: r.get(1)?,
        state: r.get(2)?,
        failure: r.get(3)?,
        cpu_count: r.get(4)?,
        memory_mb: r.get(5)?,
        disk_mb: r.get(6)?,
        allow_internet_access: r.get(7)?,
        metadata: r.get(8)?,
        started_at_us: r.get(9)?,
        end_at_us: r.get(10)?,
        envd_access_token: r.get(11)?,
        traffic_access_token: r.get(12)?,
        runtime: r.get(13)?,
        env_vars: r.get(14)?,
        lifecycle: r.get(15)?,
        pause_mode: r.get(16)?,
        network: r.get(17)?,
        team: r.get(18)?,
        volume_mounts: r.get(19)?,
    })
}

impl SandboxRow {
    pub(crate) fn decode(self, sealer: &seal::Sealer) -> Result<Sandbox, StoreError> {
        let corrupt = |what: &str| StoreError::Corrupt(format!("sandbox {}: {what}", self.id));
        let env_vars = sealer.open("env_vars", &self.env_vars)?;
        let envd_access_token = sealer.open("envd_access_token", &self.envd_access_token)?;
        let traffic_access_token =
            sealer.open("traffic_access_token", &self.traffic_access_token)?;
        let state = SandboxState::parse(&self.state).ok_or_else(|| corrupt("state"))?;
        let id = self.id.parse().map_err(|_| corrupt("id"))?;
        let metadata = serde_json::from_str(&self.metadata).map_err(|_| corrupt("metadata"))?;
        let runtime: Option<RuntimeSandbox> = match &self.runtime {
            Some(json) => Some(serde_json::from_str(json).map_err(|_| corrupt("runtime record"))?),
            None => None,
        };
        let env_vars = serde_json::from_str(&env_vars).map_err(|_| corrupt("env vars"))?;
        let lifecycle = serde_json::from_str(&self.lifecycle).map_err(|_| corrupt("lifecycle"))?;
        let network = serde_json::from_str(&self.network).map_err(|_| corrupt("network"))?;
        let pause_mode = match &self.pause_mode {
            Some(m) => Some(
                serde_json::from_value(serde_json::Value::String(m.clone()))
                    .map_err(|_| corrupt("pause mode"))?,
            ),
            None => None,
        };
        let volume_mounts =
            serde_json::from_str(&self.volume_mounts).map_err(|_| corrupt("volume mounts"))?;
        Ok(Sandbox {
            volume_mounts,
            state,
            env_vars,
            lifecycle,
            pause_mode,
            network,
            team: self.team,
            metadata,
            runtime,
            started_at: from_micros(self.started_at_us)?,
            end_at: from_micros(self.end_at_us)?,
            id,
            template: self.template,
            failure: self.failure,
            resources: warren_control::Resources {
                cpu_count: self.cpu_count,
                memory_mb: self.memory_mb,
                disk_mb: self.disk_mb,
            },
            allow_internet_access: self.allow_internet_access,
            envd_access_token,
            traffic_access_token,
        })
    }
}

pub(crate) fn write_sandbox(db: &Db, s: &Sandbox, insert: bool) -> Result<(), StoreError> {
    let conn = &db.conn;
    let metadata = serde_json::to_string(&s.metadata).map_err(backend)?;
    let runtime = s
        .runtime
        .as_ref()
        .map(serde_json::to_string)
        .transpose()
        .map_err(backend)?;
    let env_vars = serde_json::to_string(&s.env_vars).map_err(backend)?;
    let env_vars = db.sealer.seal("env_vars", &env_vars)?;
    let envd_access_token = db.sealer.seal("envd_access_token", &s.envd_access_token)?;
    let traffic_access_token = db
        .sealer
        .seal("traffic_access_token", &s.traffic_access_token)?;
    let lifecycle = serde_json::to_string(&s.lifecycle).map_err(backend)?;
    let network = serde_json::to_string(&s.network).map_err(backend)?;
    let volume_mounts = serde_json::to_string(&s.volume_mounts).map_err(backend)?;
    let pause_mode = s
        .pause_mode
        .map(|m| match serde_json::to_value(m) {
            Ok(serde_json::Value::String(m)) => Ok(m),
            _ => Err(StoreError::backend(
                "pause mode does not serialise to a string",
            )),
        })
        .transpose()?;
    let sql = if insert {
        format!("INSERT INTO sandboxes ({SANDBOX_COLUMNS}) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19,?20)")
    } else {
        "UPDATE sandboxes SET template=?2, state=?3, failure=?4, cpu_count=?5, memory_mb=?6, \
         disk_mb=?7, allow_internet_access=?8, metadata=?9, started_at_us=?10, end_at_us=?11, \
         envd_access_token=?12, traffic_access_token=?13, runtime=?14, env_vars=?15, \
         lifecycle=?16, pause_mode=?17, network=?18, team=?19, volume_mounts=?20 WHERE id=?1"
            .to_string()
    };
    let n = conn
        .execute(
            &sql,
            params![
                s.id.as_str(),
                s.template,
                s.state.as_str(),
                s.failure,
                s.resources.cpu_count,
                s.resources.memory_mb,
                s.resources.disk_mb,
                s.allow_internet_access,
                metadata,
                micros(s.started_at),
                micros(s.end_at),
                envd_access_token,
                traffic_access_token,
                runtime,
                env_vars,
                lifecycle,
                pause_mode,
                network,
                s.team,
                volume_mounts,
            ],
        )
        .map_err(backend)?;
    if n != 1 {
        return Err(StoreError::backend(format!(
            "sandbox {} was not recorded",
            s.id
        )));
    }
    Ok(())
}

//! Wire types of the control-plane API (`e2b-compat.md` §2.3). Field names are the SDKs':
//! camelCase, except the snake_case `allow_internet_access` upstream also has.

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use warren_control::Sandbox;

/// Every error response.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// The HTTP status, repeated (the JS SDK reads it from the body).
    pub code: u16,
    pub message: String,
}

/// Upstream's constant legacy client id; SDKs require the field.
pub const CLIENT_ID: &str = "6532622b";

/// Request of `POST /v2/sandboxes`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Seconds until the sandbox is killed (default 300).
    pub timeout: Option<i64>,
    /// Pause instead of kill at timeout: not supported yet, `true` is rejected.
    pub auto_pause: Option<bool>,
    pub metadata: Option<BTreeMap<String, String>>,
    pub env_vars: Option<BTreeMap<String, String>>,
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    /// Accepted for compatibility; network policy is not enforced yet.
    #[schema(value_type = Option<Object>)]
    pub network: Option<serde_json::Value>,
    #[schema(value_type = Option<Object>)]
    pub mcp: Option<serde_json::Value>,
    pub secure: Option<bool>,
}

/// Request of `POST /v2/sandboxes/{sandboxID}/connect`.
#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct ConnectSandbox {
    /// Seconds; the sandbox then lives at least this long (default 300).
    pub timeout: Option<i64>,
    /// `false` asks for a cold resume of a paused sandbox; ignored while nothing pauses.
    pub memory: Option<bool>,
}

/// Request of `POST /sandboxes/{sandboxID}/timeout`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct SetTimeout {
    /// Seconds from now.
    pub timeout: i64,
}

/// Response of create and connect.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxCreated {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    pub envd_version: String,
    pub alias: Option<String>,
    pub envd_access_token: Option<String>,
    pub traffic_access_token: Option<String>,
    pub domain: Option<String>,
}

/// Response of `GET /sandboxes/{sandboxID}`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDetail {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    /// RFC 3339.
    pub started_at: String,
    /// RFC 3339.
    pub end_at: String,
    pub envd_version: String,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u32,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u32,
    /// `running` or `paused`.
    pub state: String,
    pub alias: Option<String>,
    pub envd_access_token: Option<String>,
    pub allow_internet_access: Option<bool>,
    pub domain: Option<String>,
    pub metadata: BTreeMap<String, String>,
}

/// Items of `GET /v2/sandboxes`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListedSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    pub started_at: String,
    pub end_at: String,
    pub envd_version: String,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u32,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u32,
    pub state: String,
    pub alias: Option<String>,
    pub metadata: BTreeMap<String, String>,
}

/// Items of `GET /sandboxes/{sandboxID}/metrics`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxMetric {
    pub timestamp: String,
    pub timestamp_unix: i64,
    pub cpu_count: u32,
    pub cpu_used_pct: f64,
    pub mem_used: u64,
    pub mem_total: u64,
    pub mem_cache: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

/// Query of `GET /v2/sandboxes`. Numbers are strings here so bad values get our error shape.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// `k1=v1&k2=v2`, keys and values URL-encoded (`e2b-compat.md` §2.4).
    pub metadata: Option<String>,
    /// Comma-separated: `running`, `paused`.
    pub state: Option<String>,
    /// `asc` or `desc` by start time (default `desc`).
    pub order: Option<String>,
    /// RFC 3339; only sandboxes started at or after it.
    pub started_after: Option<String>,
    pub template: Option<String>,
    /// 1..=100, default 100.
    pub limit: Option<String>,
    /// Cursor from the previous page's `x-next-token` header.
    pub next_token: Option<String>,
}

pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

impl SandboxCreated {
    pub fn new(s: &Sandbox, envd_version: &str, domain: Option<&str>) -> Self {
        SandboxCreated {
            template_id: s.template.clone(),
            sandbox_id: s.id.clone(),
            client_id: CLIENT_ID.into(),
            envd_version: envd_version.into(),
            alias: Some(s.template.clone()),
            envd_access_token: Some(s.envd_access_token.clone()),
            traffic_access_token: Some(s.traffic_access_token.clone()),
            domain: domain.map(str::to_string),
        }
    }
}

impl SandboxDetail {
    pub fn new(s: &Sandbox, envd_version: &str, domain: Option<&str>) -> Self {
        SandboxDetail {
            template_id: s.template.clone(),
            sandbox_id: s.id.clone(),
            client_id: CLIENT_ID.into(),
            started_at: rfc3339(s.started_at),
            end_at: rfc3339(s.end_at),
            envd_version: envd_version.into(),
            cpu_count: s.cpu_count,
            memory_mb: s.memory_mb,
            disk_size_mb: s.disk_mb,
            state: s.api_state().into(),
            alias: Some(s.template.clone()),
            envd_access_token: Some(s.envd_access_token.clone()),
            allow_internet_access: Some(s.allow_internet_access),
            domain: domain.map(str::to_string),
            metadata: s.metadata.clone(),
        }
    }
}

impl ListedSandbox {
    pub fn new(s: &Sandbox, envd_version: &str) -> Self {
        ListedSandbox {
            template_id: s.template.clone(),
            sandbox_id: s.id.clone(),
            client_id: CLIENT_ID.into(),
            started_at: rfc3339(s.started_at),
            end_at: rfc3339(s.end_at),
            envd_version: envd_version.into(),
            cpu_count: s.cpu_count,
            memory_mb: s.memory_mb,
            disk_size_mb: s.disk_mb,
            state: s.api_state().into(),
            alias: Some(s.template.clone()),
            metadata: s.metadata.clone(),
        }
    }
}

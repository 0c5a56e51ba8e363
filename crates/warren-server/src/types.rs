//! Wire types of the control-plane API (`e2b-compat.md` §2.3). Field names are the SDKs':
//! camelCase, except the snake_case `allow_internet_access` upstream also has.

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use warren_control::EgressPolicy;
use warren_control::{Capabilities, OnTimeout, PauseMode, Sandbox, Snapshot};
use warren_control::{HeaderRules, HostRule};

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
    /// Pause instead of kill at the end time.
    pub auto_pause: Option<bool>,
    /// With `autoPause`: `false` pauses keeping only the filesystem; absent = the best the
    /// runtime has.
    pub auto_pause_memory: Option<bool>,
    /// Traffic through the proxy resumes the paused sandbox.
    pub auto_resume: Option<AutoResume>,
    pub metadata: Option<BTreeMap<String, String>>,
    pub env_vars: Option<BTreeMap<String, String>>,
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    pub network: Option<NetworkConfig>,
    #[schema(value_type = Option<Object>)]
    pub mcp: Option<serde_json::Value>,
    pub secure: Option<bool>,
    /// Warren's extension: private networks to join, each `"name"`, `"name:alias"` or
    /// `{"network", "alias"}` (the metadata key `warren.networks` does the same for SDKs).
    pub networks: Option<Vec<crate::networks::JoinSpec>>,
    /// Volumes to mount: `[{"name", "path"}]` (E2B), plus Warren's `readOnly`.
    pub volume_mounts: Option<Vec<VolumeMountSpec>>,
}

/// One of create's `volumeMounts`, and how details and listings echo them.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeMountSpec {
    /// The volume's name (or id).
    pub name: String,
    /// Absolute, clean path in the sandbox.
    pub path: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subpath: Option<String>,
}

impl VolumeMountSpec {
    pub fn into_request(self) -> warren_control::MountRequest {
        warren_control::MountRequest {
            name: self.name,
            path: self.path,
            read_only: self.read_only,
            subpath: self.subpath,
        }
    }

    fn of(s: &Sandbox) -> Vec<VolumeMountSpec> {
        s.volume_mounts
            .iter()
            .map(|m| VolumeMountSpec {
                name: m.name.clone(),
                path: m.path.clone(),
                read_only: m.read_only,
                subpath: m.subpath.clone(),
            })
            .collect()
    }
}

/// `network` of create (`e2b-compat-wave2.md` §2.1). `allowPublicTraffic` is enforced by the
/// proxy, `allowOut` / `denyOut` by the sandbox's network slot; fields Warren does not
/// enforce yet are refused (400) rather than ignored, so nobody believes a sandbox is fenced
/// when it is not.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    /// `false`: user ports need the `e2b-traffic-access-token` header.
    pub allow_public_traffic: Option<bool>,
    /// Reachable destinations: IPv4 addresses and CIDRs (allow beats deny).
    pub allow_out: Option<Vec<String>>,
    /// Refused destinations: IPv4 addresses and CIDRs; `0.0.0.0/0` denies all but `allowOut`.
    pub deny_out: Option<Vec<String>>,
    /// The `Host` header services on user ports get, as `host[:port]`; `${PORT}` is replaced
    /// by the port.
    pub mask_request_host: Option<String>,
    /// Headers the egress proxy sets on requests to named hosts: `{host: [{"transform":
    /// {"headers": {name: value}}}]}`; values may hold `${e2b.secrets.NAME}`.
    #[schema(value_type = Option<Object>)]
    pub rules: Option<BTreeMap<String, Vec<HostRule>>>,
    /// Every other key (`dnsServers`, ...).
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub unsupported: BTreeMap<String, serde_json::Value>,
}

/// Body of `PUT /sandboxes/{sandboxID}/network` (`e2b-compat-wave2.md` §2.2): the whole egress
/// configuration, replacing the previous one (an omitted list is cleared).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkUpdateBody {
    pub allow_out: Option<Vec<String>>,
    pub deny_out: Option<Vec<String>>,
    /// `false` denies all traffic but `allowOut`; absent means allowed.
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    /// As create's `network.rules`; omitted clears them.
    #[schema(value_type = Option<Object>)]
    pub rules: Option<BTreeMap<String, Vec<HostRule>>>,
    /// Every other key (`dnsServers`, `egressProxy`, ...).
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub unsupported: BTreeMap<String, serde_json::Value>,
}

/// The first key of `extra` that holds a value Warren does not enforce, as a 400 message.
fn refuse_unsupported(extra: &BTreeMap<String, serde_json::Value>) -> Result<(), String> {
    let empty = |v: &serde_json::Value| match v {
        serde_json::Value::Null => true,
        serde_json::Value::Array(a) => a.is_empty(),
        serde_json::Value::Object(o) => o.is_empty(),
        _ => false,
    };
    match extra.iter().find(|(_, v)| !empty(v)) {
        Some((key, _)) => Err(format!(
            "network.{key} is not supported by this server yet; remove it (network.allowOut, \
             network.denyOut, network.rules and allow_internet_access are enforced)"
        )),
        None => Ok(()),
    }
}

fn egress_of(
    allow_out: Option<Vec<String>>,
    deny_out: Option<Vec<String>>,
    allow_internet_access: Option<bool>,
    rules: Option<BTreeMap<String, Vec<HostRule>>>,
) -> Result<EgressPolicy, String> {
    let rules = HeaderRules::parse(rules.unwrap_or_default()).map_err(|e| e.to_string())?;
    Ok(EgressPolicy::from_lists(
        &allow_out.unwrap_or_default(),
        &deny_out.unwrap_or_default(),
        allow_internet_access,
    )
    .map_err(|e| e.to_string())?
    .with_rules(rules))
}

/// A `maskRequestHost` must be an ASCII `host[:port]` once `${PORT}` is replaced (as E2B).
fn check_mask(mask: &str) -> Result<(), String> {
    let probe = mask.replace("${PORT}", "1");
    let ok = !probe.is_empty()
        && probe.is_ascii()
        && !probe.contains(['@', '/', '?', '#', ' '])
        && probe.parse::<axum::http::uri::Authority>().is_ok();
    if ok {
        Ok(())
    } else {
        Err(format!(
            "network.maskRequestHost {mask:?} is not an ASCII host[:port] (\"${{PORT}}\" may \
             stand for the port)"
        ))
    }
}

impl NetworkConfig {
    /// The enforced settings (`allow_internet_access` is the create's top-level field), or
    /// why the request asks for something Warren does not do.
    pub fn into_network(
        self,
        allow_internet_access: Option<bool>,
    ) -> Result<warren_control::Network, String> {
        refuse_unsupported(&self.unsupported)?;
        if let Some(mask) = &self.mask_request_host {
            check_mask(mask)?;
        }
        Ok(warren_control::Network {
            allow_public_traffic: self.allow_public_traffic.unwrap_or(true),
            egress: egress_of(
                self.allow_out,
                self.deny_out,
                allow_internet_access,
                self.rules,
            )?,
            mask_request_host: self.mask_request_host,
        })
    }
}

impl NetworkUpdateBody {
    pub fn into_update(self) -> Result<warren_control::NetworkUpdate, String> {
        refuse_unsupported(&self.unsupported)?;
        Ok(warren_control::NetworkUpdate {
            egress: egress_of(
                self.allow_out,
                self.deny_out,
                self.allow_internet_access,
                self.rules,
            )?,
            allow_internet_access: self.allow_internet_access,
        })
    }
}

/// `network` of a sandbox's detail.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkInfo {
    pub allow_public_traffic: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_out: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_out: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_request_host: Option<String>,
    /// `network.rules` as given (placeholders, never secret values).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schema(value_type = Object)]
    pub rules: BTreeMap<String, Vec<HostRule>>,
}

/// One entry of a sandbox's flow log: a decision of its egress policy.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlowEntry {
    /// When, as RFC 3339.
    pub time: String,
    /// `dns` (a query), `tcp` (a connection), `udp` or `other` (their first packet).
    pub kind: String,
    /// `allowed` or `denied`.
    pub verdict: String,
    /// The name asked for (DNS) or carried (TLS SNI, HTTP Host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Where a connection was headed, `ip:port` (`ip` for protocols without ports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<String>,
    /// Addresses of a DNS answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// `dns`, `tls-sni`, `http-host` or `address`.
    pub via: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl From<warren_control::Flow> for FlowEntry {
    fn from(f: warren_control::Flow) -> Self {
        let kind = match f.kind {
            warren_control::FlowKind::Dns => "dns",
            warren_control::FlowKind::Tcp => "tcp",
            warren_control::FlowKind::Udp => "udp",
            warren_control::FlowKind::Other => "other",
        };
        let verdict = match f.verdict {
            warren_control::FlowVerdict::Allowed => "allowed",
            warren_control::FlowVerdict::Denied => "denied",
        };
        let time = chrono::DateTime::from_timestamp_millis(f.at_ms as i64)
            .unwrap_or_default()
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        Self {
            time,
            kind: kind.into(),
            verdict: verdict.into(),
            name: f.name,
            destination: f.destination,
            addresses: f.addresses,
            via: f.via,
            reason: f.reason,
        }
    }
}

/// Response of `GET /sandboxes/{sandboxID}/network/flows`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct FlowList {
    /// Oldest first; the last 500 decisions at most.
    pub flows: Vec<FlowEntry>,
}

/// `autoResume` of create.
#[derive(Debug, Deserialize, ToSchema)]
pub struct AutoResume {
    pub enabled: bool,
}

/// Request of `POST /sandboxes/{sandboxID}/pause`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PauseSandbox {
    /// Keep memory and processes (`true`) or only the filesystem (`false`); absent = the best
    /// the runtime has.
    pub memory: Option<bool>,
    /// Accepted; a pause never succeeds without the guest's state being saved.
    pub require_healthy_guest: Option<bool>,
}

/// Request of `POST /sandboxes/{sandboxID}/snapshots`.
#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct NewSnapshot {
    /// Reusing a name replaces the older snapshot of that name.
    pub name: Option<String>,
    /// Ask for memory in the snapshot (`true`) or only files (`false`); absent = the best the
    /// runtime has.
    pub memory: Option<bool>,
}

/// A snapshot (`SnapshotInfo`); `snapshotID` works as `templateID` in create.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotInfo {
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    pub names: Vec<String>,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Whether memory and processes are in it (else only the filesystem).
    pub memory: bool,
    pub size_bytes: u64,
    pub created_at: String,
}

/// Query of `GET /snapshots`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SnapshotListParams {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: Option<String>,
    /// Name or id, optionally tag-qualified.
    pub name: Option<String>,
    /// 1..=100, default 100.
    pub limit: Option<String>,
    #[serde(rename = "nextToken")]
    pub next_token: Option<String>,
}

/// Request of `POST /sandboxes/{sandboxID}/fork`.
#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct ForkSandbox {
    /// Seconds the children live (default 300).
    pub timeout: Option<i64>,
    /// Children to create, 1..=100 (default 1).
    pub count: Option<i64>,
}

/// One child of a fork: its sandbox or why it failed.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ForkResultItem {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxCreated>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

/// `lifecycle` of a sandbox's detail.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleInfo {
    pub auto_resume: bool,
    /// `kill` or `pause`.
    pub on_timeout: String,
}

/// Which runtime runs the sandbox and what it can keep (a Warren extension; SDKs ignore it).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeInfo {
    /// `ns` or `vm`.
    pub name: String,
    /// Pause modes it has: `full` (memory and processes), `filesystem`.
    pub pause_modes: Vec<String>,
    /// Snapshot (and fork) modes it has: `full`, `filesystem`.
    pub snapshot_modes: Vec<String>,
}

impl RuntimeInfo {
    pub fn new(name: &str, caps: Capabilities) -> RuntimeInfo {
        let modes = |full: bool, fs: bool| {
            let mut v = Vec::new();
            if full {
                v.push("full".to_string());
            }
            if fs {
                v.push("filesystem".to_string());
            }
            v
        };
        RuntimeInfo {
            name: name.to_string(),
            pause_modes: modes(caps.pause_memory, caps.pause_filesystem),
            snapshot_modes: modes(
                caps.snapshot && caps.snapshot_memory,
                caps.snapshot && caps.snapshot_filesystem,
            ),
        }
    }
}

/// Request of `POST /v2/sandboxes/{sandboxID}/connect`.
#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct ConnectSandbox {
    /// Seconds; the sandbox then lives at least this long (default 300).
    pub timeout: Option<i64>,
    /// `false` asks for a cold resume of a paused sandbox; accepted, the runtime resumes the
    /// way the sandbox was paused.
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
    pub lifecycle: LifecycleInfo,
    pub network: NetworkInfo,
    /// While paused: `full` (memory kept) or `filesystem`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pause_mode: Option<String>,
    pub runtime: RuntimeInfo,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<VolumeMountSpec>,
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
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<VolumeMountSpec>,
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

impl From<&warren_control::MetricPoint> for SandboxMetric {
    fn from(p: &warren_control::MetricPoint) -> Self {
        SandboxMetric {
            timestamp: rfc3339(p.at),
            timestamp_unix: p.at.timestamp(),
            cpu_count: p.cpu_count,
            cpu_used_pct: p.cpu_used_pct,
            mem_used: p.mem_used,
            mem_total: p.mem_total,
            mem_cache: p.mem_cache,
            disk_used: p.disk_used,
            disk_total: p.disk_total,
        }
    }
}

/// Query of `GET /sandboxes/{sandboxID}/metrics`: unix seconds, both optional (E2B's).
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MetricsParams {
    pub start: Option<String>,
    pub end: Option<String>,
}

/// Query of `GET /sandboxes/metrics`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SandboxesMetricsParams {
    /// Comma-separated sandbox ids (at most 100).
    pub sandbox_ids: Option<String>,
}

/// Body of `GET /sandboxes/metrics`: each sandbox's newest sample by id.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SandboxesWithMetrics {
    pub sandboxes: std::collections::BTreeMap<String, SandboxMetric>,
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
            sandbox_id: s.id.to_string(),
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
    pub fn new(
        s: &Sandbox,
        envd_version: &str,
        domain: Option<&str>,
        runtime: RuntimeInfo,
    ) -> Self {
        SandboxDetail {
            template_id: s.template.clone(),
            sandbox_id: s.id.to_string(),
            client_id: CLIENT_ID.into(),
            started_at: rfc3339(s.started_at),
            end_at: rfc3339(s.end_at),
            envd_version: envd_version.into(),
            cpu_count: s.resources.cpu_count,
            memory_mb: s.resources.memory_mb,
            disk_size_mb: s.resources.disk_mb,
            state: s.api_state().into(),
            alias: Some(s.template.clone()),
            envd_access_token: Some(s.envd_access_token.clone()),
            allow_internet_access: Some(s.allow_internet_access),
            domain: domain.map(str::to_string),
            metadata: s.metadata.clone(),
            lifecycle: LifecycleInfo {
                auto_resume: s.lifecycle.auto_resume,
                on_timeout: s.lifecycle.on_timeout.as_str().into(),
            },
            network: NetworkInfo {
                allow_public_traffic: s.network.allow_public_traffic,
                allow_out: s
                    .network
                    .egress
                    .allow_out
                    .iter()
                    .map(|r| r.to_string())
                    .collect(),
                deny_out: s
                    .network
                    .egress
                    .deny_out
                    .iter()
                    .map(|r| r.to_string())
                    .collect(),
                mask_request_host: s.network.mask_request_host.clone(),
                rules: s.network.egress.rules.0.clone(),
            },
            pause_mode: s.pause_mode.map(|m| {
                match m {
                    PauseMode::Memory => "full",
                    PauseMode::Filesystem => "filesystem",
                }
                .to_string()
            }),
            runtime,
            volume_mounts: VolumeMountSpec::of(s),
        }
    }
}

impl SnapshotInfo {
    pub fn new(s: &Snapshot) -> Self {
        SnapshotInfo {
            snapshot_id: s.id.clone(),
            names: s.names.clone(),
            sandbox_id: s.sandbox_id.clone(),
            template_id: s.template.clone(),
            memory: s.memory,
            size_bytes: s.bytes,
            created_at: rfc3339(s.created_at),
        }
    }
}

/// The domain lifecycle of create's `autoPause`, `autoPauseMemory`, `autoResume`.
pub fn lifecycle_of(body: &NewSandbox) -> warren_control::Lifecycle {
    let pause = body.auto_pause == Some(true);
    warren_control::Lifecycle {
        on_timeout: if pause {
            OnTimeout::Pause
        } else {
            OnTimeout::Kill
        },
        pause_memory: if pause { body.auto_pause_memory } else { None },
        auto_resume: body.auto_resume.as_ref().is_some_and(|a| a.enabled),
    }
}

impl ListedSandbox {
    pub fn new(s: &Sandbox, envd_version: &str) -> Self {
        ListedSandbox {
            template_id: s.template.clone(),
            sandbox_id: s.id.to_string(),
            client_id: CLIENT_ID.into(),
            started_at: rfc3339(s.started_at),
            end_at: rfc3339(s.end_at),
            envd_version: envd_version.into(),
            cpu_count: s.resources.cpu_count,
            memory_mb: s.resources.memory_mb,
            disk_size_mb: s.resources.disk_mb,
            state: s.api_state().into(),
            alias: Some(s.template.clone()),
            metadata: s.metadata.clone(),
            volume_mounts: VolumeMountSpec::of(s),
        }
    }
}

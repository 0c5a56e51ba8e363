//! The audit trail (`GET /v1/sandboxes/{id}/audit`, Warren's) and E2B's sandbox logs
//! (`GET /sandboxes/{id}/logs`, `GET /v2/sandboxes/{id}/logs`): translation only.

use std::collections::BTreeMap;

use axum::extract::{Path, RawQuery};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use warren_control::{AuditEntry, AuditLevel, AuditQuery, MAX_AUDIT_PAGE};

use crate::error::ApiError;
use crate::extract::Authed;
use crate::types::{rfc3339, ErrorBody};

type ApiResult<T> = Result<T, ApiError>;

/// Entries a read returns unless it asks for another number.
const DEFAULT_LIMIT: usize = 1000;

/// One entry of the audit trail.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditBody {
    /// RFC 3339, milliseconds.
    pub timestamp: String,
    /// `process.start|end|exec|exit|output`, `file.write|remove|rename|mkdir`, `agent`,
    /// `network.dns|tcp|udp|other`, `lifecycle.created|paused|resumed|...`.
    pub kind: String,
    /// `debug`, `info`, `warn` or `error`.
    pub level: String,
    pub message: String,
    /// The details: `pid`, `argv` (a JSON array), `cwd`, `user`, `uid`, `exit_code`,
    /// `duration_ms`, `path`, `verdict`, `destination`, `trace_id`, ...
    pub fields: BTreeMap<String, String>,
}

impl From<AuditEntry> for AuditBody {
    fn from(e: AuditEntry) -> Self {
        AuditBody {
            timestamp: rfc3339(e.at),
            kind: e.kind,
            level: e.level.as_str().into(),
            message: e.message,
            fields: e.fields,
        }
    }
}

/// `GET /v1/sandboxes/{id}/audit`'s answer.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditPage {
    pub entries: Vec<AuditBody>,
}

/// A time in a query: RFC 3339 or Unix milliseconds.
pub(crate) fn time_of(what: &str, v: &str) -> ApiResult<DateTime<Utc>> {
    if let Ok(ms) = v.trim().parse::<i64>() {
        return DateTime::<Utc>::from_timestamp_millis(ms)
            .ok_or_else(|| ApiError::bad_request(format!("{what} {ms} is not a time")));
    }
    DateTime::parse_from_rfc3339(v.trim())
        .map(|t| t.with_timezone(&Utc))
        .map_err(|_| {
            ApiError::bad_request(format!(
                "{what} must be RFC 3339 or Unix milliseconds, not {v:?}"
            ))
        })
}

fn limit_of(v: &str) -> ApiResult<usize> {
    match v.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_AUDIT_PAGE).contains(&n) => Ok(n),
        _ => Err(ApiError::bad_request(format!(
            "limit must be a whole number in 1..={MAX_AUDIT_PAGE}, not {v:?}"
        ))),
    }
}

fn level_of(v: &str) -> ApiResult<AuditLevel> {
    AuditLevel::parse(v.trim()).ok_or_else(|| {
        ApiError::bad_request(format!(
            "level must be debug, info, warn or error, not {v:?}"
        ))
    })
}

fn pairs(raw: Option<&str>) -> Vec<(String, String)> {
    form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// The trail's query: `since`, `until`, repeatable or comma-separated `kind`, `level` (the
/// least), `search`, `limit` (1..=10000, default 1000), `order` (`asc` or `desc`), `format`
/// (`json` or `jsonl`).
fn audit_query(id: String, raw: Option<&str>) -> ApiResult<(AuditQuery, bool)> {
    let mut q = AuditQuery {
        sandbox_id: id,
        limit: DEFAULT_LIMIT,
        ..AuditQuery::default()
    };
    let mut jsonl = false;
    for (k, v) in pairs(raw) {
        match k.as_str() {
            "since" => q.since = Some(time_of("since", &v)?),
            "until" => q.until = Some(time_of("until", &v)?),
            "kind" | "kinds" => q.kinds.extend(
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from),
            ),
            "level" => q.min_level = Some(level_of(&v)?),
            "search" => q.search = Some(v).filter(|s| !s.is_empty()),
            "limit" => q.limit = limit_of(&v)?,
            "order" => {
                q.descending = match v.as_str() {
                    "asc" => false,
                    "desc" => true,
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "order must be asc or desc, not {other:?}"
                        )))
                    }
                }
            }
            "format" => {
                jsonl = match v.as_str() {
                    "json" => false,
                    "jsonl" => true,
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "format must be json or jsonl, not {other:?}"
                        )))
                    }
                }
            }
            _ => {}
        }
    }
    Ok((q, jsonl))
}

/// A sandbox's audit trail: processes (started through the API and executed inside), their
/// output, files changed through the API, network decisions and lifecycle changes, oldest
/// first. `format=jsonl` answers one JSON object per line (`application/x-ndjson`).
#[utoipa::path(
    get, path = "/v1/sandboxes/{sandboxID}/audit",
    params(("sandboxID" = String, Path), ("since" = Option<String>, Query),
           ("until" = Option<String>, Query), ("kind" = Option<Vec<String>>, Query),
           ("level" = Option<String>, Query), ("search" = Option<String>, Query),
           ("limit" = Option<u32>, Query), ("order" = Option<String>, Query),
           ("format" = Option<String>, Query)),
    responses((status = 200, body = AuditPage), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn sandbox_audit(
    Authed(me): Authed,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Response> {
    let (q, jsonl) = audit_query(id, raw.as_deref())?;
    let entries: Vec<AuditBody> = me
        .audit(q)
        .await?
        .into_iter()
        .map(AuditBody::from)
        .collect();
    if !jsonl {
        return Ok(Json(AuditPage { entries }).into_response());
    }
    let mut body = String::new();
    for e in &entries {
        body.push_str(&serde_json::to_string(e).map_err(|e| {
            ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
        })?);
        body.push('\n');
    }
    let mut resp = body.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    Ok(resp)
}

/// E2B's `SandboxLogEntry`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LogEntryBody {
    pub timestamp: String,
    pub message: String,
    pub level: String,
    pub fields: BTreeMap<String, String>,
}

/// E2B's `SandboxLog` (v1): the entry as one JSON line.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LogLineBody {
    pub timestamp: String,
    pub line: String,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxLogsV1 {
    pub logs: Vec<LogLineBody>,
    pub log_entries: Vec<LogEntryBody>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SandboxLogsV2 {
    pub logs: Vec<LogEntryBody>,
}

/// The service an entry's kind belongs to, as E2B's envd names its loggers (the CLI filters
/// by them: `process` and `filesystem` unless told otherwise).
fn logger_of(kind: &str) -> &'static str {
    match kind.split('.').next().unwrap_or_default() {
        "process" => "processSvc",
        "file" => "filesystemSvc",
        "network" => "networkSvc",
        _ => "systemSvc",
    }
}

fn log_entry(e: AuditEntry) -> LogEntryBody {
    let mut fields = e.fields;
    fields.insert("logger".into(), logger_of(&e.kind).into());
    fields.insert("kind".into(), e.kind);
    LogEntryBody {
        timestamp: rfc3339(e.at),
        message: e.message,
        level: e.level.as_str().into(),
        fields,
    }
}

fn log_line(e: &LogEntryBody) -> LogLineBody {
    let mut line = serde_json::Map::new();
    for (k, v) in &e.fields {
        line.insert(k.clone(), serde_json::Value::String(v.clone()));
    }
    line.insert("level".into(), e.level.clone().into());
    line.insert("message".into(), e.message.clone().into());
    LogLineBody {
        timestamp: e.timestamp.clone(),
        line: serde_json::Value::Object(line).to_string(),
    }
}

/// What the sandbox logs show: the trail without lifecycle changes (with the summaries of
/// what the audit budget left out).
const LOG_KINDS: [&str; 5] = ["process", "file", "agent", "network", "audit"];

fn log_query(id: String) -> AuditQuery {
    AuditQuery {
        sandbox_id: id,
        kinds: LOG_KINDS.iter().map(|k| k.to_string()).collect(),
        limit: DEFAULT_LIMIT,
        ..AuditQuery::default()
    }
}

/// A sandbox's logs (E2B's v1, what `e2b sandbox logs` reads): `start` (Unix milliseconds,
/// entries from then on) and `limit`, oldest first.
#[utoipa::path(
    get, path = "/sandboxes/{sandboxID}/logs",
    params(("sandboxID" = String, Path), ("start" = Option<i64>, Query),
           ("limit" = Option<u32>, Query)),
    responses((status = 200, body = SandboxLogsV1), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn sandbox_logs_v1(
    Authed(me): Authed,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<SandboxLogsV1>> {
    let mut q = log_query(id);
    for (k, v) in pairs(raw.as_deref()) {
        match k.as_str() {
            "start" => q.since = Some(time_of("start", &v)?),
            "limit" => q.limit = limit_of(&v)?,
            _ => {}
        }
    }
    let entries: Vec<LogEntryBody> = me.audit(q).await?.into_iter().map(log_entry).collect();
    Ok(Json(SandboxLogsV1 {
        logs: entries.iter().map(log_line).collect(),
        log_entries: entries,
    }))
}

/// A sandbox's logs (E2B's v2): `cursor` (Unix milliseconds), `direction` (`backward`, the
/// default: from the cursor back, newest first; `forward`: from it on, oldest first),
/// `level` (the least), `search`, `limit`.
#[utoipa::path(
    get, path = "/v2/sandboxes/{sandboxID}/logs",
    params(("sandboxID" = String, Path), ("cursor" = Option<i64>, Query),
           ("direction" = Option<String>, Query), ("level" = Option<String>, Query),
           ("search" = Option<String>, Query), ("limit" = Option<u32>, Query)),
    responses((status = 200, body = SandboxLogsV2), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn sandbox_logs_v2(
    Authed(me): Authed,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<SandboxLogsV2>> {
    let mut q = log_query(id);
    q.descending = true;
    let mut cursor = None;
    for (k, v) in pairs(raw.as_deref()) {
        match k.as_str() {
            "cursor" => cursor = Some(time_of("cursor", &v)?),
            "direction" => {
                q.descending = match v.as_str() {
                    "backward" => true,
                    "forward" => false,
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "direction must be forward or backward, not {other:?}"
                        )))
                    }
                }
            }
            "level" => q.min_level = Some(level_of(&v)?),
            "search" => q.search = Some(v).filter(|s| !s.is_empty()),
            "limit" => q.limit = limit_of(&v)?,
            _ => {}
        }
    }
    if q.descending {
        q.until = cursor;
    } else {
        q.since = cursor;
    }
    let logs = me.audit(q).await?.into_iter().map(log_entry).collect();
    Ok(Json(SandboxLogsV2 { logs }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_or_milliseconds() {
        assert_eq!(
            time_of("since", "1700000000123")
                .unwrap()
                .timestamp_millis(),
            1_700_000_000_123
        );
        assert_eq!(
            time_of("since", "2026-12-03T10:00:00Z")
                .unwrap()
                .timestamp(),
            1_796_292_000
        );
        assert!(time_of("since", "yesterday").is_err());
    }

    #[test]
    fn the_audit_query_reads_every_parameter_and_refuses_bad_ones() {
        let (q, jsonl) = audit_query(
            "s".into(),
            Some("kind=process,file.write&kind=network&level=warn&limit=5&order=desc&format=jsonl&search=x"),
        )
        .unwrap();
        assert_eq!(q.kinds, vec!["process", "file.write", "network"]);
        assert_eq!(q.min_level, Some(AuditLevel::Warn));
        assert_eq!((q.limit, q.descending, jsonl), (5, true, true));
        assert_eq!(q.search.as_deref(), Some("x"));
        for bad in [
            "limit=0",
            "limit=x",
            "order=up",
            "format=xml",
            "level=loud",
            "since=x",
        ] {
            assert!(audit_query("s".into(), Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_log_line_is_json_with_level_message_and_logger() {
        let e = log_entry(AuditEntry {
            sandbox_id: "s".into(),
            team: "t".into(),
            at: Utc::now(),
            kind: "process.start".into(),
            level: AuditLevel::Info,
            message: "process 7 started".into(),
            fields: BTreeMap::from([("pid".to_string(), "7".to_string())]),
        });
        let line: serde_json::Value = serde_json::from_str(&log_line(&e).line).unwrap();
        assert_eq!(line["level"], "info");
        assert_eq!(line["logger"], "processSvc");
        assert_eq!(line["message"], "process 7 started");
        assert_eq!(line["pid"], "7");
    }
}

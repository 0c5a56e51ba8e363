//! `warren sandbox audit <id>`: a sandbox's audit trail, as lines, JSON or JSON lines.

use std::time::Duration;

use clap::Args;
use reqwest::Method;
use serde_json::Value;

use crate::client::Client;
use crate::ClientArgs;

#[derive(Args, Debug)]
pub struct AuditArgs {
    pub id: String,
    /// From this time on: RFC 3339, Unix milliseconds, or an age such as `30s`, `10m`, `2h`,
    /// `1d`.
    #[arg(long)]
    pub since: Option<String>,
    /// Up to this time (same forms as --since).
    #[arg(long)]
    pub until: Option<String>,
    /// Only entries of this kind or family (`process`, `process.exec`, `file`, `network`,
    /// `lifecycle`, `agent`); repeatable.
    #[arg(long)]
    pub kind: Vec<String>,
    /// Only entries of this level or above (debug, info, warn, error).
    #[arg(long)]
    pub level: Option<String>,
    /// Only entries whose message contains this.
    #[arg(long)]
    pub search: Option<String>,
    /// At most this many entries (1..=10000).
    #[arg(long)]
    pub limit: Option<u32>,
    /// One JSON object per line (for export).
    #[arg(long)]
    pub jsonl: bool,
    /// Keep printing new entries until interrupted.
    #[arg(long, short)]
    pub follow: bool,
}

/// An age (`30s`, `10m`, `2h`, `1d`) as the Unix milliseconds of that long ago; anything
/// else passes as it is (the server reads RFC 3339 and milliseconds).
fn time_arg(v: &str, now_ms: i64) -> String {
    let (number, unit) = v.split_at(v.len().saturating_sub(1));
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return v.to_string(),
    };
    match number.parse::<i64>() {
        Ok(n) if n >= 0 => (now_ms - n * secs * 1000).to_string(),
        _ => v.to_string(),
    }
}

fn query(a: &AuditArgs, since: Option<String>, now_ms: i64) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    if let Some(s) = since {
        q.append_pair("since", &time_arg(&s, now_ms));
    }
    if let Some(u) = &a.until {
        q.append_pair("until", &time_arg(u, now_ms));
    }
    for k in &a.kind {
        q.append_pair("kind", k);
    }
    if let Some(l) = &a.level {
        q.append_pair("level", l);
    }
    if let Some(s) = &a.search {
        q.append_pair("search", s);
    }
    if let Some(n) = a.limit {
        q.append_pair("limit", &n.to_string());
    }
    q.finish()
}

/// `TIME KIND MESSAGE`.
fn line(e: &Value) -> String {
    let s = |k: &str| e[k].as_str().unwrap_or_default();
    format!("{} {:<15} {}", s("timestamp"), s("kind"), s("message"))
}

pub async fn run(client: &Client, args: &ClientArgs, a: AuditArgs) -> anyhow::Result<()> {
    let mut since = a.since.clone();
    loop {
        let now_ms = chrono::Utc::now().timestamp_millis();
        let path = format!(
            "/v1/sandboxes/{}/audit?{}",
            a.id,
            query(&a, since.clone(), now_ms)
        );
        let v: Value = client.api(Method::GET, &path, None).await?.json().await?;
        let entries = v["entries"].as_array().cloned().unwrap_or_default();
        for e in &entries {
            if a.jsonl {
                println!("{e}");
            } else if args.json && !a.follow {
                // One JSON document for the whole read.
            } else {
                println!("{}", line(e));
            }
        }
        if args.json && !a.follow && !a.jsonl {
            println!("{}", Value::Array(entries.clone()));
        }
        if !a.follow {
            return Ok(());
        }
        // The next read starts after the newest entry seen (the server's times are
        // milliseconds).
        since = match entries.last().and_then(|e| e["timestamp"].as_str()) {
            Some(t) => chrono::DateTime::parse_from_rfc3339(t)
                .map(|t| (t.timestamp_millis() + 1).to_string())
                .ok(),
            None => since,
        }
        .or_else(|| Some(now_ms.to_string()));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_become_milliseconds_and_the_rest_passes() {
        assert_eq!(time_arg("10m", 1_000_000), "400000");
        assert_eq!(time_arg("2026-12-03T10:00:00Z", 0), "2026-12-03T10:00:00Z");
        assert_eq!(time_arg("1700000000000", 0), "1700000000000");
    }

    #[test]
    fn the_query_carries_every_filter() {
        let a = AuditArgs {
            id: "s".into(),
            since: None,
            until: Some("5s".into()),
            kind: vec!["process".into(), "file.write".into()],
            level: Some("warn".into()),
            search: Some("a b".into()),
            limit: Some(7),
            jsonl: false,
            follow: false,
        };
        assert_eq!(
            query(&a, Some("1000".into()), 10_000),
            "since=1000&until=5000&kind=process&kind=file.write&level=warn&search=a+b&limit=7"
        );
    }
}

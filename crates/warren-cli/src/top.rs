//! `warren top`: a live view of the server's sandboxes and what each uses, redrawn every
//! `--interval` seconds (`--once`: one frame, for scripts), busiest first.
//!
//! Reads only the public API: `GET /v2/sandboxes` (running and paused, every page) and
//! `GET /sandboxes/metrics` (each one's newest sample, 100 ids a request).

use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use reqwest::Method;
use serde_json::Value;

use crate::client::{query_value, Client};
use crate::ClientArgs;

#[derive(Args)]
pub struct TopArgs {
    /// Seconds between frames.
    #[arg(long, default_value_t = 2.0)]
    interval: f64,
    /// Prints one frame and exits.
    #[arg(long)]
    once: bool,
    #[command(flatten)]
    client: ClientArgs,
}

const MIB: f64 = 1024.0 * 1024.0;

/// One row of the view.
#[derive(Debug, PartialEq)]
struct Row {
    id: String,
    template: String,
    state: String,
    cpus: u64,
    cpu_pct: Option<f64>,
    mem_used: Option<u64>,
    mem_total: u64,
    disk_used: Option<u64>,
    started: String,
}

async fn sandboxes(client: &Client) -> anyhow::Result<Vec<Value>> {
    let mut all = Vec::new();
    let mut next: Option<String> = None;
    loop {
        let mut path = "/v2/sandboxes?state=running,paused&limit=100".to_string();
        if let Some(t) = &next {
            path.push_str(&format!("&nextToken={}", query_value(t)));
        }
        let resp = client.api(Method::GET, &path, None).await?;
        next = resp
            .headers()
            .get("x-next-token")
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map(String::from);
        let page: Vec<Value> = resp.json().await.context("reading the sandbox list")?;
        all.extend(page);
        if next.is_none() {
            return Ok(all);
        }
    }
}

async fn latest(client: &Client, ids: &[String]) -> anyhow::Result<HashMap<String, Value>> {
    let mut out = HashMap::new();
    for chunk in ids.chunks(100) {
        let path = format!(
            "/sandboxes/metrics?sandbox_ids={}",
            query_value(&chunk.join(","))
        );
        let body: Value = client.api(Method::GET, &path, None).await?.json().await?;
        if let Some(map) = body["sandboxes"].as_object() {
            out.extend(map.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
    }
    Ok(out)
}

fn rows(listed: &[Value], metrics: &HashMap<String, Value>) -> Vec<Row> {
    let mut rows: Vec<Row> = listed
        .iter()
        .map(|s| {
            let id = s["sandboxID"].as_str().unwrap_or_default().to_string();
            let m = metrics.get(&id);
            let running = s["state"] == "running";
            // A paused sandbox's last sample is history, not what it uses now.
            let now = |k: &str| m.filter(|_| running).and_then(|m| m[k].as_u64());
            Row {
                template: s["alias"]
                    .as_str()
                    .or(s["templateID"].as_str())
                    .unwrap_or_default()
                    .to_string(),
                state: s["state"].as_str().unwrap_or_default().to_string(),
                cpus: s["cpuCount"].as_u64().unwrap_or(0),
                cpu_pct: m.filter(|_| running).and_then(|m| m["cpuUsedPct"].as_f64()),
                mem_used: now("memUsed"),
                mem_total: s["memoryMB"].as_u64().unwrap_or(0) * 1024 * 1024,
                disk_used: now("diskUsed"),
                started: s["startedAt"].as_str().unwrap_or_default().to_string(),
                id,
            }
        })
        .collect();
    rows.sort_by(|a, b| {
        b.cpu_pct
            .unwrap_or(-1.0)
            .total_cmp(&a.cpu_pct.unwrap_or(-1.0))
            .then_with(|| a.id.cmp(&b.id))
    });
    rows
}

fn frame(rows: &[Row]) -> String {
    let running = rows.iter().filter(|r| r.state == "running").count();
    let mem: u64 = rows.iter().filter_map(|r| r.mem_used).sum();
    let mut out = format!(
        "{} sandboxes, {running} running, {:.0} MiB in use\n\n{:<22} {:<20} {:<8} {:>4} {:>6} {:>17} {:>9}  {}\n",
        rows.len(),
        mem as f64 / MIB,
        "SANDBOX",
        "TEMPLATE",
        "STATE",
        "CPUS",
        "CPU%",
        "MEMORY MiB",
        "DISK MiB",
        "STARTED"
    );
    let dash = "-".to_string();
    for r in rows {
        let cpu = r.cpu_pct.map(|p| format!("{p:.1}")).unwrap_or(dash.clone());
        let mem = match r.mem_used {
            Some(u) => format!("{:.0}/{:.0}", u as f64 / MIB, r.mem_total as f64 / MIB),
            None => format!("-/{:.0}", r.mem_total as f64 / MIB),
        };
        let disk = r
            .disk_used
            .map(|d| format!("{:.0}", d as f64 / MIB))
            .unwrap_or(dash.clone());
        out.push_str(&format!(
            "{:<22} {:<20} {:<8} {:>4} {:>6} {:>17} {:>9}  {}\n",
            r.id, r.template, r.state, r.cpus, cpu, mem, disk, r.started
        ));
    }
    out
}

pub async fn run(args: TopArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.client)?;
    let interval = Duration::from_secs_f64(args.interval.max(0.2));
    loop {
        let listed = sandboxes(&client).await?;
        let ids: Vec<String> = listed
            .iter()
            .filter_map(|s| s["sandboxID"].as_str().map(String::from))
            .collect();
        let metrics = latest(&client, &ids).await?;
        let text = frame(&rows(&listed, &metrics));
        let mut stdout = std::io::stdout().lock();
        if args.once {
            stdout.write_all(text.as_bytes())?;
            return Ok(());
        }
        // Home, clear to the end: redrawn in place, no flicker of a full clear.
        write!(stdout, "\x1b[H\x1b[2J{text}")?;
        stdout.flush()?;
        drop(stdout);
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_busiest_come_first_and_paused_ones_show_no_current_use() {
        let listed = vec![
            json!({"sandboxID": "a", "templateID": "base", "state": "running", "cpuCount": 2, "memoryMB": 512, "startedAt": "t"}),
            json!({"sandboxID": "b", "templateID": "base", "state": "running", "cpuCount": 1, "memoryMB": 256, "startedAt": "t"}),
            json!({"sandboxID": "c", "alias": "mine", "templateID": "x1", "state": "paused", "cpuCount": 1, "memoryMB": 256, "startedAt": "t"}),
        ];
        let metrics: HashMap<String, Value> = [
            (
                "a".to_string(),
                json!({"cpuUsedPct": 5.0, "memUsed": 10 << 20, "diskUsed": 1 << 20}),
            ),
            (
                "b".to_string(),
                json!({"cpuUsedPct": 90.0, "memUsed": 20 << 20, "diskUsed": 2 << 20}),
            ),
            (
                "c".to_string(),
                json!({"cpuUsedPct": 50.0, "memUsed": 30 << 20, "diskUsed": 3 << 20}),
            ),
        ]
        .into_iter()
        .collect();
        let r = rows(&listed, &metrics);
        assert_eq!(
            r.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
            ["b", "a", "c"]
        );
        assert_eq!(r[2].template, "mine");
        assert_eq!((r[2].cpu_pct, r[2].mem_used), (None, None));
        let text = frame(&r);
        assert!(
            text.starts_with("3 sandboxes, 2 running, 30 MiB in use"),
            "{text}"
        );
        assert!(text.contains("20/256"), "{text}");
    }
}

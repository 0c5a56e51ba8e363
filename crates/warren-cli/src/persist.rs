//! `warren sandbox pause|resume|snapshot|fork` and `warren snapshot list|delete`.

use clap::Subcommand;
use reqwest::Method;
use serde_json::{json, Value};

use crate::client::Client;
use crate::ClientArgs;

#[derive(Subcommand)]
pub enum SnapshotCommand {
    /// Lists snapshots, newest first.
    List {
        /// Only snapshots of this sandbox.
        #[arg(long)]
        sandbox: Option<String>,
        /// Only the snapshot with this name or id.
        #[arg(long)]
        name: Option<String>,
    },
    /// Deletes a snapshot (by id or name); sandboxes created from it live on.
    Delete { id: String },
}

/// `memory` of a pause or snapshot request from the `--full`/`--filesystem` flags.
pub fn memory_flag(full: bool, filesystem: bool) -> Option<bool> {
    match (full, filesystem) {
        (true, _) => Some(true),
        (_, true) => Some(false),
        _ => None,
    }
}

pub async fn pause(
    client: &Client,
    args: &ClientArgs,
    id: &str,
    memory: Option<bool>,
) -> anyhow::Result<()> {
    let mut body = json!({});
    if let Some(m) = memory {
        body["memory"] = m.into();
    }
    client
        .api(Method::POST, &format!("/sandboxes/{id}/pause"), Some(body))
        .await?;
    if !args.json {
        println!("paused {id}");
    }
    Ok(())
}

pub async fn resume(
    client: &Client,
    args: &ClientArgs,
    id: &str,
    timeout: Option<i64>,
) -> anyhow::Result<()> {
    let mut body = json!({});
    if let Some(t) = timeout {
        body["timeout"] = t.into();
    }
    let resp = client
        .api(
            Method::POST,
            &format!("/v2/sandboxes/{id}/connect"),
            Some(body),
        )
        .await?;
    let resumed = resp.status() == reqwest::StatusCode::CREATED;
    if args.json {
        println!("{}", json!({"sandboxID": id, "resumed": resumed}));
    } else if resumed {
        println!("resumed {id}");
    } else {
        println!("{id} was running");
    }
    Ok(())
}

pub async fn snapshot(
    client: &Client,
    args: &ClientArgs,
    id: &str,
    name: Option<String>,
    memory: Option<bool>,
) -> anyhow::Result<()> {
    let mut body = json!({});
    if let Some(n) = name {
        body["name"] = n.into();
    }
    if let Some(m) = memory {
        body["memory"] = m.into();
    }
    let v: Value = client
        .api(
            Method::POST,
            &format!("/sandboxes/{id}/snapshots"),
            Some(body),
        )
        .await?
        .json()
        .await?;
    if args.json {
        println!("{v}");
    } else {
        println!("{}", v["snapshotID"].as_str().unwrap_or_default());
    }
    Ok(())
}

/// Prints each child's id (or its error); fails when any child failed.
pub async fn fork(
    client: &Client,
    args: &ClientArgs,
    id: &str,
    count: Option<i64>,
    timeout: Option<i64>,
) -> anyhow::Result<u8> {
    let mut body = json!({});
    if let Some(c) = count {
        body["count"] = c.into();
    }
    if let Some(t) = timeout {
        body["timeout"] = t.into();
    }
    let items: Vec<Value> = client
        .api(Method::POST, &format!("/sandboxes/{id}/fork"), Some(body))
        .await?
        .json()
        .await?;
    let failed = items.iter().filter(|i| i.get("error").is_some()).count();
    if args.json {
        println!("{}", Value::Array(items));
    } else {
        for i in &items {
            match (
                i["sandbox"]["sandboxID"].as_str(),
                i["error"]["message"].as_str(),
            ) {
                (Some(child), _) => println!("{child}"),
                (None, msg) => eprintln!("child failed: {}", msg.unwrap_or("no details")),
            }
        }
    }
    Ok(u8::from(failed > 0))
}

pub async fn run(cmd: SnapshotCommand, args: ClientArgs) -> anyhow::Result<u8> {
    let client = Client::new(&args)?;
    match cmd {
        SnapshotCommand::List { sandbox, name } => {
            let mut items: Vec<Value> = Vec::new();
            let mut token: Option<String> = None;
            loop {
                let mut url = reqwest::Url::parse("http://x/snapshots")?;
                {
                    let mut q = url.query_pairs_mut();
                    if let Some(s) = &sandbox {
                        q.append_pair("sandboxID", s);
                    }
                    if let Some(n) = &name {
                        q.append_pair("name", n);
                    }
                    if let Some(t) = &token {
                        q.append_pair("nextToken", t);
                    }
                }
                let path = format!("/snapshots?{}", url.query().unwrap_or_default());
                let resp = client.api(Method::GET, &path, None).await?;
                token = resp
                    .headers()
                    .get("x-next-token")
                    .and_then(|v| v.to_str().ok())
                    .filter(|t| !t.is_empty())
                    .map(str::to_string);
                let page: Vec<Value> = resp.json().await?;
                items.extend(page);
                if token.is_none() {
                    break;
                }
            }
            if args.json {
                println!("{}", Value::Array(items));
            } else {
                println!(
                    "{:<24} {:<20} {:<24} {:<11} {:>12} CREATED",
                    "ID", "NAME", "SANDBOX", "MODE", "BYTES"
                );
                for s in items {
                    let names: Vec<&str> = s["names"]
                        .as_array()
                        .map(|a| a.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default();
                    println!(
                        "{:<24} {:<20} {:<24} {:<11} {:>12} {}",
                        s["snapshotID"].as_str().unwrap_or_default(),
                        names.join(","),
                        s["sandboxID"].as_str().unwrap_or_default(),
                        if s["memory"].as_bool() == Some(true) {
                            "full"
                        } else {
                            "filesystem"
                        },
                        s["sizeBytes"].as_u64().unwrap_or_default(),
                        s["createdAt"].as_str().unwrap_or_default(),
                    );
                }
            }
        }
        SnapshotCommand::Delete { id } => {
            // Ids are path segments; names may hold `/`.
            let encoded: String = id
                .bytes()
                .map(|b| {
                    if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.') {
                        (b as char).to_string()
                    } else {
                        format!("%{b:02X}")
                    }
                })
                .collect();
            client
                .api(Method::DELETE, &format!("/templates/{encoded}"), None)
                .await?;
            if !args.json {
                println!("deleted {id}");
            }
        }
    }
    Ok(0)
}

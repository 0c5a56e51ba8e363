//! `warren template list`: the server's templates (`GET /templates`, E2B's listing).

use anyhow::bail;
use clap::Subcommand;
use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::client::Client;
use crate::ClientArgs;

#[derive(Subcommand)]
pub enum TemplateCommand {
    /// Lists the templates the server can create sandboxes from.
    List,
}

pub async fn run(cmd: TemplateCommand, args: ClientArgs) -> anyhow::Result<u8> {
    let client = Client::new(&args)?;
    match cmd {
        TemplateCommand::List => list(&client, args.json).await,
    }
}

async fn list(client: &Client, json: bool) -> anyhow::Result<u8> {
    let resp = client.api_unchecked(Method::GET, "/templates").await?;
    if matches!(
        resp.status(),
        StatusCode::NOT_FOUND | StatusCode::NOT_IMPLEMENTED | StatusCode::METHOD_NOT_ALLOWED
    ) {
        bail!(
            "this server does not list templates (GET /templates answered {}); \
             sandboxes are created from `--template base` unless you name another",
            resp.status()
        );
    }
    let items: Vec<Value> = Client::check(resp).await?.json().await?;
    if json {
        println!("{}", Value::Array(items));
        return Ok(0);
    }
    for line in table(&items) {
        println!("{line}");
    }
    Ok(0)
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().map(text).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// Header plus one line per template, from E2B's `Template` fields (missing ones left blank).
fn table(items: &[Value]) -> Vec<String> {
    let mut lines = vec![format!(
        "{:<24} {:<20} {:<10} {:>4} {:>8} {:>8}  CREATED",
        "ID", "ALIASES", "STATUS", "CPU", "MEM_MB", "DISK_MB"
    )];
    for t in items {
        let aliases = match (&t["aliases"], &t["names"]) {
            (Value::Array(a), _) if !a.is_empty() => text(&t["aliases"]),
            (_, names) => text(names),
        };
        lines.push(format!(
            "{:<24} {:<20} {:<10} {:>4} {:>8} {:>8}  {}",
            text(&t["templateID"]),
            aliases,
            text(&t["buildStatus"]),
            text(&t["cpuCount"]),
            text(&t["memoryMB"]),
            text(&t["diskSizeMB"]),
            text(&t["createdAt"]),
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn table_rows_from_e2b_fields() {
        let lines = table(&[json!({
            "templateID": "base", "aliases": ["base", "default"], "buildStatus": "ready",
            "cpuCount": 2, "memoryMB": 512, "diskSizeMB": 1024, "createdAt": "2025-01-01T00:00:00Z"
        })]);
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("ID"));
        assert!(lines[1].starts_with("base "));
        assert!(lines[1].contains("base,default"));
        assert!(lines[1].contains("ready"));
        assert!(lines[1].ends_with("2025-01-01T00:00:00Z"));
    }

    #[test]
    fn missing_fields_are_blank() {
        let lines = table(&[json!({"templateID": "t1", "names": ["n"]})]);
        assert!(lines[1].starts_with("t1 "));
        assert!(lines[1].contains(" n "));
    }
}

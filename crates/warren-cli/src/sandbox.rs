//! `warren sandbox create|list|info|exec|kill`.

use std::io::Write;

use anyhow::{bail, Context};
use base64::Engine as _;
use clap::Subcommand;
use futures::StreamExt;
use reqwest::Method;
use serde_json::{json, Value};

use crate::client::Client;
use crate::ClientArgs;

#[derive(Subcommand)]
pub enum SandboxCommand {
    /// Creates a sandbox and prints its id.
    Create {
        #[arg(long, default_value = "base")]
        template: String,
        /// Seconds until it is killed.
        #[arg(long)]
        timeout: Option<i64>,
        /// KEY=VALUE metadata (repeatable).
        #[arg(long = "metadata", value_parser = key_value)]
        metadata: Vec<(String, String)>,
        /// KEY=VALUE environment variables (repeatable).
        #[arg(long = "env", value_parser = key_value)]
        env: Vec<(String, String)>,
    },
    List {
        /// KEY=VALUE metadata filter (repeatable).
        #[arg(long = "metadata", value_parser = key_value)]
        metadata: Vec<(String, String)>,
    },
    Info {
        id: String,
    },
    /// Runs a command (through `/bin/bash -l -c`) and exits with its status.
    Exec {
        id: String,
        #[arg(long)]
        user: Option<String>,
        #[arg(required = true, trailing_var_arg = true)]
        command: Vec<String>,
    },
    Kill {
        id: String,
    },
}

fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

fn map(pairs: Vec<(String, String)>) -> Value {
    Value::Object(
        pairs
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect(),
    )
}

pub async fn run(cmd: SandboxCommand, args: ClientArgs) -> anyhow::Result<u8> {
    let client = Client::new(&args)?;
    match cmd {
        SandboxCommand::Create {
            template,
            timeout,
            metadata,
            env,
        } => {
            let mut body =
                json!({"templateID": template, "metadata": map(metadata), "envVars": map(env)});
            if let Some(t) = timeout {
                body["timeout"] = t.into();
            }
            let v: Value = client
                .api(Method::POST, "/v2/sandboxes", Some(body))
                .await?
                .json()
                .await?;
            if args.json {
                println!("{v}");
            } else {
                println!("{}", v["sandboxID"].as_str().unwrap_or_default());
            }
        }
        SandboxCommand::List { metadata } => {
            let mut path = "/v2/sandboxes".to_string();
            if !metadata.is_empty() {
                let q: Vec<String> = metadata.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let encoded: String = q.join("&").bytes().map(|b| format!("%{b:02X}")).collect();
                path.push_str(&format!("?metadata={encoded}"));
            }
            let items: Vec<Value> = client.api(Method::GET, &path, None).await?.json().await?;
            if args.json {
                println!("{}", Value::Array(items));
            } else {
                println!(
                    "{:<24} {:<12} {:<9} {:<26} {:<26} METADATA",
                    "ID", "TEMPLATE", "STATE", "STARTED", "ENDS"
                );
                for s in items {
                    let meta = s["metadata"].as_object().map(|m| {
                        m.iter()
                            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                            .collect::<Vec<_>>()
                            .join(",")
                    });
                    println!(
                        "{:<24} {:<12} {:<9} {:<26} {:<26} {}",
                        s["sandboxID"].as_str().unwrap_or_default(),
                        s["templateID"].as_str().unwrap_or_default(),
                        s["state"].as_str().unwrap_or_default(),
                        s["startedAt"].as_str().unwrap_or_default(),
                        s["endAt"].as_str().unwrap_or_default(),
                        meta.unwrap_or_default()
                    );
                }
            }
        }
        SandboxCommand::Info { id } => {
            let mut v: Value = client
                .api(Method::GET, &format!("/sandboxes/{id}"), None)
                .await?
                .json()
                .await?;
            // The access token is a secret: not printed by default.
            if let Some(o) = v.as_object_mut() {
                o.remove("envdAccessToken");
            }
            if args.json {
                println!("{v}");
            } else if let Some(o) = v.as_object() {
                for (k, val) in o {
                    println!(
                        "{k:<22} {}",
                        val.as_str().map_or_else(|| val.to_string(), str::to_string)
                    );
                }
            }
        }
        SandboxCommand::Exec { id, user, command } => {
            return exec(&client, &id, user, &command.join(" ")).await
        }
        SandboxCommand::Kill { id } => {
            client
                .api(Method::DELETE, &format!("/sandboxes/{id}"), None)
                .await?;
            if !args.json {
                println!("killed {id}");
            }
        }
    }
    Ok(0)
}

/// Streams a command's output through the proxy (Connect server stream, JSON envelopes).
async fn exec(
    client: &Client,
    id: &str,
    user: Option<String>,
    command: &str,
) -> anyhow::Result<u8> {
    let detail: Value = client
        .api(Method::GET, &format!("/sandboxes/{id}"), None)
        .await?
        .json()
        .await?;
    let token = detail["envdAccessToken"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let payload = serde_json::to_vec(&json!({
        "process": {"cmd": "/bin/bash", "args": ["-l", "-c", command]}, "stdin": false
    }))?;
    let mut body = vec![0u8];
    body.extend_from_slice(
        &u32::try_from(payload.len())
            .context("command too long")?
            .to_be_bytes(),
    );
    body.extend_from_slice(&payload);
    let mut req = client
        .sandbox(id, &token, "/process.Process/Start")
        .header("content-type", "application/connect+json")
        .header("connect-protocol-version", "1")
        .body(body);
    if let Some(u) = user {
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{u}:"));
        req = req.header("authorization", format!("Basic {basic}"));
    }
    let resp = req.send().await.context("contacting the sandbox")?;
    if !resp.status().is_success() {
        let status = resp.status();
        bail!(
            "sandbox answered {status}: {}",
            resp.text().await.unwrap_or_default()
        );
    }
    let mut stream = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    let mut code: u8 = 0;
    let b64 = base64::engine::general_purpose::STANDARD;
    while let Some(chunk) = stream.next().await {
        buf.extend_from_slice(&chunk.context("stream from the sandbox broke")?);
        while buf.len() >= 5 {
            let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
            if buf.len() < 5 + len {
                break;
            }
            let flags = buf[0];
            let msg: Value =
                serde_json::from_slice(&buf[5..5 + len]).context("malformed stream message")?;
            buf.drain(..5 + len);
            if flags & 2 != 0 {
                if let Some(err) = msg.get("error") {
                    bail!(
                        "{}: {}",
                        err["code"].as_str().unwrap_or("error"),
                        err["message"].as_str().unwrap_or("")
                    );
                }
                return Ok(code);
            }
            let event = &msg["event"];
            if let Some(d) = event["data"]["stdout"].as_str() {
                std::io::stdout().write_all(&b64.decode(d)?)?;
                std::io::stdout().flush()?;
            }
            if let Some(d) = event["data"]["stderr"].as_str() {
                std::io::stderr().write_all(&b64.decode(d)?)?;
            }
            if let Some(end) = event.get("end") {
                code = end["exitCode"]
                    .as_i64()
                    .map_or(0, |c| u8::try_from(c).unwrap_or(1));
            }
        }
    }
    bail!("the sandbox closed the stream early")
}

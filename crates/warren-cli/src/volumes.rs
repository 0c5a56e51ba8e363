//! `warren volume ...`: volumes (`docs/volumes.md`) through the server's `/volumes` API, their
//! files through the volume content API (with the volume's token), and their snapshots.

use anyhow::Context;
use clap::Subcommand;
use reqwest::Method;
use serde_json::{json, Value};

use crate::client::{path_segment as seg, query_value as enc, Client};
use crate::ClientArgs;

#[derive(Subcommand, Debug)]
pub enum VolumeCommand {
    /// Creates a volume (mount it with `warren sandbox create --volume NAME:/path`).
    Create {
        name: String,
        /// Bytes its files may take, e.g. `512M`, `10G` (default: the server's).
        #[arg(long)]
        size: Option<String>,
        /// Files and directories it may hold (default: the server's).
        #[arg(long)]
        inodes: Option<u64>,
        /// Start with the content (and quota) of this volume snapshot.
        #[arg(long = "from-snapshot")]
        from_snapshot: Option<String>,
    },
    /// Lists volumes.
    List,
    /// Shows a volume: quota, usage, content-API token.
    Info { volume: String },
    /// Deletes a volume and its files (refused while a sandbox mounts it).
    Delete { volume: String },
    /// Grows a volume to a new size (e.g. `20G`); volumes never shrink.
    Grow {
        volume: String,
        #[arg(long)]
        size: String,
    },
    /// Lists a directory of a volume.
    Ls {
        volume: String,
        #[arg(default_value = "/")]
        path: String,
        #[arg(long, default_value_t = 1)]
        depth: u32,
    },
    /// Uploads a local file to a volume path.
    Put {
        volume: String,
        local: std::path::PathBuf,
        path: String,
        /// Replace an existing file.
        #[arg(long)]
        force: bool,
    },
    /// Downloads a volume file (to stdout without LOCAL).
    Get {
        volume: String,
        path: String,
        local: Option<std::path::PathBuf>,
    },
    /// Makes a directory (`-p`: and its parents).
    Mkdir {
        volume: String,
        path: String,
        #[arg(short = 'p', long)]
        parents: bool,
    },
    /// Removes a file or a directory with everything in it.
    Rm { volume: String, path: String },
    /// Takes a snapshot of a volume.
    Snapshot { volume: String },
    /// Lists a volume's snapshots.
    Snapshots { volume: String },
    /// Deletes a volume snapshot.
    DeleteSnapshot { snapshot: String },
}

/// `512M`, `10G`, `1T`, `4096` (bytes).
fn parse_size(s: &str) -> anyhow::Result<u64> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, ""), |i| s.split_at(i));
    let n: u64 = num.parse().with_context(|| format!("size {s:?}"))?;
    let mult: u64 = match unit
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        other => anyhow::bail!("size {s:?}: unknown unit {other:?} (K, M, G, T)"),
    };
    n.checked_mul(mult)
        .with_context(|| format!("size {s:?} is too large"))
}

async fn get_json(client: &Client, path: &str) -> anyhow::Result<Value> {
    Ok(client.api(Method::GET, path, None).await?.json().await?)
}

/// The volume's id and content-API token.
async fn token_of(client: &Client, volume: &str) -> anyhow::Result<(String, String)> {
    let v = get_json(client, &format!("/volumes/{}", seg(volume))).await?;
    Ok((
        v["volumeID"].as_str().unwrap_or_default().to_string(),
        v["token"].as_str().unwrap_or_default().to_string(),
    ))
}

fn print_entries(list: &[Value]) {
    for e in list {
        println!(
            "{:<9} {:>5o} {:>5}:{:<5} {:>12} {}",
            e["type"].as_str().unwrap_or_default(),
            e["mode"].as_u64().unwrap_or_default(),
            e["uid"].as_u64().unwrap_or_default(),
            e["gid"].as_u64().unwrap_or_default(),
            e["size"].as_u64().unwrap_or_default(),
            e["path"].as_str().unwrap_or_default()
        );
    }
}

pub async fn run(cmd: VolumeCommand, args: ClientArgs) -> anyhow::Result<u8> {
    let client = Client::new(&args)?;
    let print = |v: &Value, short: &str| {
        if args.json {
            println!("{v}");
        } else {
            println!("{}", v[short].as_str().unwrap_or_default());
        }
    };
    match cmd {
        VolumeCommand::Create {
            name,
            size,
            inodes,
            from_snapshot,
        } => {
            let mut body = json!({"name": name});
            let bytes = size.as_deref().map(parse_size).transpose()?;
            if bytes.is_some() || inodes.is_some() {
                body["quota"] = json!({"bytes": bytes, "inodes": inodes});
            }
            if let Some(s) = from_snapshot {
                body["fromSnapshot"] = s.into();
            }
            let v: Value = client
                .api(Method::POST, "/volumes", Some(body))
                .await?
                .json()
                .await?;
            print(&v, "volumeID");
        }
        VolumeCommand::List => {
            let list = get_json(&client, "/volumes").await?;
            if args.json {
                println!("{list}");
            } else {
                println!("{:<24} NAME", "ID");
                for v in list.as_array().into_iter().flatten() {
                    println!(
                        "{:<24} {}",
                        v["volumeID"].as_str().unwrap_or_default(),
                        v["name"].as_str().unwrap_or_default()
                    );
                }
            }
        }
        VolumeCommand::Info { volume } => {
            let v = get_json(&client, &format!("/volumes/{}", seg(&volume))).await?;
            if args.json {
                println!("{v}");
            } else {
                let u = &v["usage"];
                println!(
                    "volume {} ({})",
                    v["name"].as_str().unwrap_or_default(),
                    v["volumeID"].as_str().unwrap_or_default()
                );
                println!(
                    "bytes  {} of {} (quota {})",
                    u["bytesUsed"], u["bytesTotal"], v["quota"]["bytes"]
                );
                println!(
                    "inodes {} of {} (quota {})",
                    u["inodesUsed"], u["inodesTotal"], v["quota"]["inodes"]
                );
                println!("token  {}", v["token"].as_str().unwrap_or_default());
            }
        }
        VolumeCommand::Delete { volume } => {
            client
                .api(Method::DELETE, &format!("/volumes/{}", seg(&volume)), None)
                .await?;
        }
        VolumeCommand::Grow { volume, size } => {
            let body = json!({"quota": {"bytes": parse_size(&size)?}});
            let v: Value = client
                .api(
                    Method::PATCH,
                    &format!("/volumes/{}", seg(&volume)),
                    Some(body),
                )
                .await?
                .json()
                .await?;
            if args.json {
                println!("{v}");
            } else {
                println!(
                    "volume {} now holds {} bytes",
                    v["name"].as_str().unwrap_or_default(),
                    v["quota"]["bytes"]
                );
            }
        }
        VolumeCommand::Ls {
            volume,
            path,
            depth,
        } => {
            let (id, token) = token_of(&client, &volume).await?;
            let q = format!(
                "/volumecontent/{}/dir?path={}&depth={depth}",
                seg(&id),
                enc(&path)
            );
            let list: Value = client
                .volume_content(Method::GET, &q, &token, None)
                .await?
                .json()
                .await?;
            if args.json {
                println!("{list}");
            } else {
                print_entries(list.as_array().map(Vec::as_slice).unwrap_or_default());
            }
        }
        VolumeCommand::Put {
            volume,
            local,
            path,
            force,
        } => {
            let (id, token) = token_of(&client, &volume).await?;
            let file = tokio::fs::File::open(&local)
                .await
                .with_context(|| format!("opening {}", local.display()))?;
            let q = format!(
                "/volumecontent/{}/file?path={}&force={force}",
                seg(&id),
                enc(&path)
            );
            let body = reqwest::Body::from(file);
            let e: Value = client
                .volume_content(Method::PUT, &q, &token, Some(body))
                .await?
                .json()
                .await?;
            print(&e, "path");
        }
        VolumeCommand::Get {
            volume,
            path,
            local,
        } => {
            let (id, token) = token_of(&client, &volume).await?;
            let q = format!("/volumecontent/{}/file?path={}", seg(&id), enc(&path));
            let mut resp = client.volume_content(Method::GET, &q, &token, None).await?;
            let mut out: Box<dyn tokio::io::AsyncWrite + Unpin> = match &local {
                Some(p) => Box::new(
                    tokio::fs::File::create(p)
                        .await
                        .with_context(|| format!("creating {}", p.display()))?,
                ),
                None => Box::new(tokio::io::stdout()),
            };
            use tokio::io::AsyncWriteExt;
            while let Some(chunk) = resp.chunk().await? {
                out.write_all(&chunk).await?;
            }
            out.flush().await?;
        }
        VolumeCommand::Mkdir {
            volume,
            path,
            parents,
        } => {
            let (id, token) = token_of(&client, &volume).await?;
            let q = format!(
                "/volumecontent/{}/dir?path={}&force={parents}",
                seg(&id),
                enc(&path)
            );
            client
                .volume_content(Method::POST, &q, &token, None)
                .await?;
        }
        VolumeCommand::Rm { volume, path } => {
            let (id, token) = token_of(&client, &volume).await?;
            let q = format!("/volumecontent/{}/path?path={}", seg(&id), enc(&path));
            client
                .volume_content(Method::DELETE, &q, &token, None)
                .await?;
        }
        VolumeCommand::Snapshot { volume } => {
            let s: Value = client
                .api(
                    Method::POST,
                    &format!("/v1/volumes/{}/snapshots", seg(&volume)),
                    None,
                )
                .await?
                .json()
                .await?;
            print(&s, "snapshotID");
        }
        VolumeCommand::Snapshots { volume } => {
            let list =
                get_json(&client, &format!("/v1/volumes/{}/snapshots", seg(&volume))).await?;
            if args.json {
                println!("{list}");
            } else {
                println!("{:<24} {:>14} CREATED", "ID", "BYTES");
                for s in list.as_array().into_iter().flatten() {
                    println!(
                        "{:<24} {:>14} {}",
                        s["snapshotID"].as_str().unwrap_or_default(),
                        s["sizeBytes"].as_u64().unwrap_or_default(),
                        s["createdAt"].as_str().unwrap_or_default()
                    );
                }
            }
        }
        VolumeCommand::DeleteSnapshot { snapshot } => {
            client
                .api(
                    Method::DELETE,
                    &format!("/v1/volume-snapshots/{}", seg(&snapshot)),
                    None,
                )
                .await?;
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("10GiB").unwrap(), 10 << 30);
        assert_eq!(parse_size("1t").unwrap(), 1 << 40);
        assert!(parse_size("12X").is_err() && parse_size("").is_err());
    }
}

//! `warren keys create|list|revoke`: straight on the data dir's store, so they work for the
//! operator of the machine whether or not the server runs (SQLite's busy timeout serialises).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use warren_control::store::*;

use anyhow::Context;
use clap::Subcommand;
use warren_control::ApiKey;
use warren_store::SqliteStore;

#[derive(Subcommand)]
pub enum KeysCommand {
    /// Creates a key and prints it (the only time it is shown).
    Create {
        #[arg(long, default_value = "cli")]
        name: String,
        /// The key sees only this team's sandboxes and snapshots.
        #[arg(long, default_value = warren_control::DEFAULT_TEAM)]
        team: String,
        /// The key sees and acts on every team's sandboxes (an operator's key).
        #[arg(long)]
        admin: bool,
    },
    List,
    Revoke {
        id: String,
    },
}

/// Writes the key file readable by its owner only, also when an older file was not.
pub fn write_key_file(path: &Path, secret: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    // `mode` applies only when the file is created.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("making {} private", path.display()))?;
    writeln!(f, "{secret}").with_context(|| format!("writing {}", path.display()))?;
    f.sync_all()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn show(k: &ApiKey) -> serde_json::Value {
    serde_json::json!({
        "id": k.id, "name": k.name, "prefix": k.prefix, "team": k.team, "admin": k.admin,
        "createdAt": k.created_at.to_rfc3339(),
        "revokedAt": k.revoked_at.map(|t| t.to_rfc3339()),
    })
}

pub async fn run(cmd: KeysCommand, data_dir: &Path, json: bool) -> anyhow::Result<()> {
    let store = SqliteStore::open(&data_dir.join("warren.db")).context("opening the store")?;
    match cmd {
        KeysCommand::Create { name, team, admin } => {
            let new = warren_control::new_api_key(&name, &team, admin)?;
            let (key, secret) = (new.key, new.secret);
            store.insert_api_key(&key).await?;
            if json {
                let mut v = show(&key);
                v["key"] = secret.into();
                println!("{v}");
            } else {
                println!("{secret}");
            }
        }
        KeysCommand::List => {
            let keys = store.api_keys().await?;
            if json {
                println!(
                    "{}",
                    serde_json::Value::Array(keys.iter().map(show).collect())
                );
            } else {
                println!(
                    "{:<14} {:<16} {:<12} {:<16} {:<26} STATUS",
                    "ID", "NAME", "PREFIX", "TEAM", "CREATED"
                );
                for k in keys {
                    let status = if k.revoked_at.is_some() {
                        "revoked"
                    } else {
                        "active"
                    };
                    let team = if k.admin {
                        "(all: admin)".to_string()
                    } else {
                        k.team.clone()
                    };
                    println!(
                        "{:<14} {:<16} {:<12} {:<16} {:<26} {status}",
                        k.id,
                        k.name,
                        k.prefix,
                        team,
                        k.created_at.format("%Y-%m-%d %H:%M:%S UTC")
                    );
                }
            }
        }
        KeysCommand::Revoke { id } => {
            if !store.revoke_api_key(&id).await? {
                anyhow::bail!("no active API key {id}");
            }
            println!("revoked {id}");
        }
    }
    Ok(())
}

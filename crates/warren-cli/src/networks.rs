//! `warren network ...`: private networks between sandboxes (`docs/networking.md`, "Private
//! networks"), through the server's `/v1/networks` API.

use clap::Subcommand;
use reqwest::Method;
use serde_json::{json, Value};

use crate::client::{path_segment as seg, Client};
use crate::ClientArgs;

#[derive(Subcommand, Debug)]
pub enum NetworkCommand {
    /// Creates a network; its members reach each other at `<sandboxID>.<name>.internal`.
    Create {
        name: String,
        /// Members reach each other on this TCP/UDP port only (repeatable; default: all).
        #[arg(long = "port", value_name = "PORT")]
        ports: Vec<u16>,
    },
    /// Lists networks and how many members each has.
    List,
    /// Shows a network and its members (addresses, names).
    Info { network: String },
    /// Deletes a network without members.
    Delete { network: String },
    /// Puts a sandbox into a network, optionally with an alias (`<alias>.<network>.internal`).
    Join {
        network: String,
        sandbox: String,
        #[arg(long)]
        alias: Option<String>,
    },
    /// Takes a sandbox out of a network; its connections to the members end.
    Leave { network: String, sandbox: String },
}

fn print_members(n: &Value) {
    println!(
        "network {} ({}), {}, ports: {}",
        n["name"].as_str().unwrap_or_default(),
        n["networkID"].as_str().unwrap_or_default(),
        n["cidr"].as_str().unwrap_or_default(),
        ports_of(n)
    );
    println!("{:<24} {:<15} NAMES", "SANDBOX", "ADDRESS");
    for m in n["members"].as_array().into_iter().flatten() {
        let names: Vec<&str> = m["names"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        println!(
            "{:<24} {:<15} {}",
            m["sandboxID"].as_str().unwrap_or_default(),
            m["address"].as_str().unwrap_or_default(),
            names.join(" ")
        );
    }
}

fn ports_of(n: &Value) -> String {
    let ports: Vec<String> = n["ports"]
        .as_array()
        .map(|a| a.iter().map(ToString::to_string).collect())
        .unwrap_or_default();
    if ports.is_empty() {
        "all".into()
    } else {
        ports.join(",")
    }
}

pub async fn run(cmd: NetworkCommand, args: ClientArgs) -> anyhow::Result<u8> {
    let client = Client::new(&args)?;
    match cmd {
        NetworkCommand::Create { name, ports } => {
            let body = json!({"name": name, "ports": ports});
            let n: Value = client
                .api(Method::POST, "/v1/networks", Some(body))
                .await?
                .json()
                .await?;
            if args.json {
                println!("{n}");
            } else {
                println!("{}", n["networkID"].as_str().unwrap_or_default());
            }
        }
        NetworkCommand::List => {
            let list: Vec<Value> = client
                .api(Method::GET, "/v1/networks", None)
                .await?
                .json()
                .await?;
            if args.json {
                println!("{}", Value::Array(list));
            } else {
                println!(
                    "{:<24} {:<20} {:<16} {:>7} PORTS",
                    "ID", "NAME", "CIDR", "MEMBERS"
                );
                for n in list {
                    println!(
                        "{:<24} {:<20} {:<16} {:>7} {}",
                        n["networkID"].as_str().unwrap_or_default(),
                        n["name"].as_str().unwrap_or_default(),
                        n["cidr"].as_str().unwrap_or_default(),
                        n["members"].as_array().map_or(0, Vec::len),
                        ports_of(&n)
                    );
                }
            }
        }
        NetworkCommand::Info { network } => {
            let n: Value = client
                .api(
                    Method::GET,
                    &format!("/v1/networks/{}", seg(&network)),
                    None,
                )
                .await?
                .json()
                .await?;
            if args.json {
                println!("{n}");
            } else {
                print_members(&n);
            }
        }
        NetworkCommand::Delete { network } => {
            client
                .api(
                    Method::DELETE,
                    &format!("/v1/networks/{}", seg(&network)),
                    None,
                )
                .await?;
        }
        NetworkCommand::Join {
            network,
            sandbox,
            alias,
        } => {
            let mut body = json!({"sandboxID": sandbox});
            if let Some(a) = alias {
                body["alias"] = a.into();
            }
            let m: Value = client
                .api(
                    Method::POST,
                    &format!("/v1/networks/{}/members", seg(&network)),
                    Some(body),
                )
                .await?
                .json()
                .await?;
            if args.json {
                println!("{m}");
            } else {
                println!("{}", m["address"].as_str().unwrap_or_default());
            }
        }
        NetworkCommand::Leave { network, sandbox } => {
            client
                .api(
                    Method::DELETE,
                    &format!("/v1/networks/{}/members/{}", seg(&network), seg(&sandbox)),
                    None,
                )
                .await?;
        }
    }
    Ok(0)
}

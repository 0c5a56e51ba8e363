//! `warren template ...`: templates built through the server's API (build from a Dockerfile,
//! list, info, logs, tags, delete, disk use, prune), and the catalog templates of this host's
//! data dir (`base`, `code-interpreter-v1`, `code-interpreter-full`), whose images
//! `build <catalog name>` makes locally (that needs root and this machine, not the server).

use anyhow::{bail, Context};
use clap::Subcommand;
use reqwest::Method;
use serde_json::{json, Value};

use crate::client::{path_segment as enc, Client};
use crate::template_build::BuildArgs;
use crate::ClientArgs;

#[derive(Subcommand)]
pub enum TemplateCommand {
    /// Lists the catalog templates of this host and the templates built through the server.
    List,
    /// Builds a template from a Dockerfile through the server, showing its log as it runs; a
    /// catalog name (`base`, `code-interpreter-v1`, `code-interpreter-full`) builds that image
    /// locally instead.
    Build(BuildArgs),
    /// Shows one template: names, resources, tags and its latest build.
    Info {
        /// Template id or name.
        name: String,
    },
    /// Prints the log of a template's latest build (or of `--build`), following it while it
    /// runs.
    Logs {
        /// Template id or name.
        name: String,
        /// A build id (default: the latest).
        #[arg(long)]
        build: Option<String>,
    },
    /// Lists a template's tags.
    Tags {
        /// Template id or name.
        name: String,
    },
    /// Points tags at the build `target` (`name[:tag]`) names.
    Tag {
        target: String,
        #[arg(required = true)]
        tags: Vec<String>,
    },
    /// Removes tags from a template (`default` stays).
    Untag {
        name: String,
        #[arg(required = true)]
        tags: Vec<String>,
    },
    /// Deletes a template and its images (refused while sandboxes or snapshots use it).
    Delete {
        /// Template id or name.
        name: String,
    },
    /// What template images, cached build steps and pulled layers take on disk (admin key).
    Disk,
    /// Deletes what nothing uses: untagged images, every cached build step and every pulled
    /// layer (admin key). Sandboxes, snapshots and tagged builds keep theirs.
    Prune,
}

pub async fn run(cmd: TemplateCommand, args: ClientArgs) -> anyhow::Result<u8> {
    match cmd {
        TemplateCommand::List => list(&args).await,
        TemplateCommand::Build(b) if warren_template::recipe(&b.name).is_some() => {
            build_catalog(&args, &b.name).await
        }
        TemplateCommand::Build(b) => crate::template_build::run(b, &args).await,
        TemplateCommand::Info { name } => info(&args, &name).await,
        TemplateCommand::Logs { name, build } => logs(&args, &name, build.as_deref()).await,
        TemplateCommand::Tags { name } => tags(&args, &name).await,
        TemplateCommand::Tag { target, tags } => {
            let c = Client::new(&args)?;
            let out: Value = c
                .api(
                    Method::POST,
                    "/templates/tags",
                    Some(json!({"target": target, "tags": tags})),
                )
                .await?
                .json()
                .await?;
            print_or(&args, &out, || {
                println!(
                    "tagged build {} as {}",
                    out["buildID"].as_str().unwrap_or_default(),
                    tags.join(", ")
                )
            });
            Ok(0)
        }
        TemplateCommand::Untag { name, tags } => {
            let c = Client::new(&args)?;
            c.api(
                Method::DELETE,
                "/templates/tags",
                Some(json!({"name": name, "tags": tags})),
            )
            .await?;
            Ok(0)
        }
        TemplateCommand::Delete { name } => {
            let c = Client::new(&args)?;
            c.api(Method::DELETE, &format!("/templates/{}", enc(&name)), None)
                .await?;
            if !args.json {
                println!("deleted {name}");
            }
            Ok(0)
        }
        TemplateCommand::Disk => disk(&args, Method::GET, "/v1/templates/disk", "in use").await,
        TemplateCommand::Prune => disk(&args, Method::POST, "/v1/templates/prune", "freed").await,
    }
}

fn print_or(args: &ClientArgs, v: &Value, table: impl FnOnce()) {
    if args.json {
        println!("{v}");
    } else {
        table();
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / 1048576.0)
}

/// The built templates the server lists, with `name` found by id or alias.
async fn find(c: &Client, name: &str) -> anyhow::Result<Value> {
    let all: Vec<Value> = c.api(Method::GET, "/templates", None).await?.json().await?;
    let bare = name.split(':').next().unwrap_or(name);
    let bare = bare.rsplit('/').next().unwrap_or(bare);
    all.into_iter()
        .find(|t| {
            t["templateID"].as_str() == Some(name)
                || t["aliases"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|x| x.as_str() == Some(bare)))
        })
        .with_context(|| format!("no template {name:?} (see `warren template list`)"))
}

async fn info(args: &ClientArgs, name: &str) -> anyhow::Result<u8> {
    let c = Client::new(args)?;
    let mut t = find(&c, name).await?;
    let id = t["templateID"].as_str().unwrap_or_default().to_string();
    let tags: Value = c
        .api(Method::GET, &format!("/templates/{id}/tags"), None)
        .await?
        .json()
        .await?;
    t["tags"] = tags.clone();
    print_or(args, &t, || {
        let s = |k: &str| t[k].as_str().unwrap_or("-").to_string();
        let n = |k: &str| t[k].as_u64().map(|v| v.to_string()).unwrap_or("-".into());
        println!("template   {id}");
        println!("names      {}", t["names"]);
        println!("build      {} ({})", s("buildID"), s("buildStatus"));
        println!(
            "resources  {} vCPU, {} MiB memory, {} MiB disk",
            n("cpuCount"),
            n("memoryMB"),
            n("diskSizeMB")
        );
        println!("public     {}", t["public"]);
        println!(
            "builds     {}   spawns {}   last spawned {}",
            n("buildCount"),
            n("spawnCount"),
            s("lastSpawnedAt")
        );
        println!("updated    {}", s("updatedAt"));
        for tag in tags.as_array().into_iter().flatten() {
            println!(
                "tag        {:<16} build {}  since {}",
                tag["tag"].as_str().unwrap_or_default(),
                tag["buildID"].as_str().unwrap_or_default(),
                tag["createdAt"].as_str().unwrap_or_default()
            );
        }
    });
    Ok(0)
}

async fn tags(args: &ClientArgs, name: &str) -> anyhow::Result<u8> {
    let c = Client::new(args)?;
    let tags: Value = c
        .api(Method::GET, &format!("/templates/{}/tags", enc(name)), None)
        .await?
        .json()
        .await?;
    print_or(args, &tags, || {
        println!("{:<16} {:<38} CREATED", "TAG", "BUILD");
        for t in tags.as_array().into_iter().flatten() {
            println!(
                "{:<16} {:<38} {}",
                t["tag"].as_str().unwrap_or_default(),
                t["buildID"].as_str().unwrap_or_default(),
                t["createdAt"].as_str().unwrap_or_default()
            );
        }
    });
    Ok(0)
}

/// Prints a build's log from the start, following it until the build ends; the exit code
/// is 1 when the build failed.
async fn logs(args: &ClientArgs, name: &str, build: Option<&str>) -> anyhow::Result<u8> {
    let c = Client::new(args)?;
    let t = find(&c, name).await?;
    let tid = t["templateID"].as_str().unwrap_or_default().to_string();
    let bid = match build {
        Some(b) => b.to_string(),
        None => t["buildID"]
            .as_str()
            .filter(|b| !b.is_empty())
            .with_context(|| format!("template {name:?} has no build"))?
            .to_string(),
    };
    let last = follow_build(&c, &tid, &bid, |e| {
        if args.json {
            println!("{e}");
        } else {
            println!(
                "{} {:<5} {}",
                e["timestamp"].as_str().unwrap_or_default(),
                e["level"].as_str().unwrap_or_default(),
                e["message"].as_str().unwrap_or_default()
            );
        }
    })
    .await?;
    if last["status"].as_str() == Some("error") {
        let reason = &last["reason"];
        eprintln!(
            "build failed at step {}: {}",
            reason["step"].as_str().unwrap_or("?"),
            reason["message"].as_str().unwrap_or("no reason given")
        );
        return Ok(1);
    }
    Ok(0)
}

/// Follows build `bid` of template `tid`: every log entry from the first, in order, to
/// `on_entry`, until the build has ended and its log is drained (a page holds at most 100
/// entries, so an ended build may still have more). Answers the last status page.
pub(crate) async fn follow_build(
    c: &Client,
    tid: &str,
    bid: &str,
    mut on_entry: impl FnMut(&Value),
) -> anyhow::Result<Value> {
    let mut offset = 0usize;
    loop {
        let page: Value = c
            .api(
                Method::GET,
                &format!("/templates/{tid}/builds/{bid}/status?logsOffset={offset}"),
                None,
            )
            .await?
            .json()
            .await?;
        let entries = page["logEntries"].as_array().cloned().unwrap_or_default();
        offset += entries.len();
        entries.iter().for_each(&mut on_entry);
        let ended = matches!(page["status"].as_str(), Some("ready" | "error"));
        if entries.is_empty() {
            if ended {
                return Ok(page);
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
    }
}

async fn disk(args: &ClientArgs, method: Method, path: &str, what: &str) -> anyhow::Result<u8> {
    let c = Client::new(args)?;
    let u: Value = c.api(method, path, None).await?.json().await?;
    print_or(args, &u, || {
        let row = |label: &str, k: &str| {
            println!(
                "{label:<22} {:>6} {:>12}",
                u[k]["count"].as_u64().unwrap_or(0),
                mib(u[k]["bytes"].as_u64().unwrap_or(0))
            )
        };
        println!("{:<22} {:>6} {:>12}", "", "COUNT", "SIZE");
        if what == "in use" {
            row("images in use", "imagesInUse");
        }
        row("images unused", "imagesUnused");
        row("cached build steps", "layers");
        row("pulled layers", "blobs");
        let label = if what == "in use" {
            "prunable"
        } else {
            "freed"
        };
        println!(
            "{label:<22} {:>6} {:>12}",
            "",
            mib(u["prunableBytes"].as_u64().unwrap_or(0))
        );
    });
    Ok(0)
}

/// Built templates as the server lists them (none, with a note, when it is not running).
async fn built_rows(args: &ClientArgs) -> (Vec<Value>, Option<String>) {
    let c = match Client::new(args) {
        Ok(c) => c,
        Err(e) => return (Vec::new(), Some(format!("{e:#}"))),
    };
    match c.api(Method::GET, "/templates", None).await {
        Ok(r) => match r.json::<Vec<Value>>().await {
            Ok(v) => (v, None),
            Err(e) => (Vec::new(), Some(e.to_string())),
        },
        Err(e) => (Vec::new(), Some(format!("{e:#}"))),
    }
}

async fn list(args: &ClientArgs) -> anyhow::Result<u8> {
    let (built, note) = built_rows(args).await;
    let catalog = catalog_rows(args)?;
    if args.json {
        println!(
            "{}",
            json!({"catalog": catalog, "built": built, "serverError": note})
        );
        return Ok(0);
    }
    print_catalog(&catalog);
    println!();
    match note {
        Some(n) => println!("(built templates: the server did not answer: {n})"),
        None => {
            println!(
                "{:<22} {:<24} {:<9} {:>4} {:>7} {:>6} {:>6}  UPDATED",
                "ID", "NAME", "STATUS", "CPU", "MEMORY", "BUILDS", "SPAWNS"
            );
            for t in &built {
                let s = |k: &str| t[k].as_str().unwrap_or("-").to_string();
                let n = |k: &str| t[k].as_u64().map(|v| v.to_string()).unwrap_or("-".into());
                let names = t["aliases"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .unwrap_or_default();
                println!(
                    "{:<22} {:<24} {:<9} {:>4} {:>7} {:>6} {:>6}  {}",
                    s("templateID"),
                    names,
                    s("buildStatus"),
                    n("cpuCount"),
                    n("memoryMB"),
                    n("buildCount"),
                    n("spawnCount"),
                    s("updatedAt")
                );
            }
        }
    }
    Ok(0)
}

fn catalog_rows(args: &ClientArgs) -> anyhow::Result<Vec<Value>> {
    let mut rows = Vec::new();
    for name in warren_template::TEMPLATES {
        let Some(recipe) = warren_template::recipe(name) else {
            continue;
        };
        let image = warren_template::cached_image(&recipe, &args.data_dir)
            .with_context(|| format!("reading the cache of template {name}"))?;
        rows.push(match image {
            Some(img) => json!({
                "name": name,
                "status": "built",
                "cacheKey": recipe.cache_key(),
                "imageBytes": img.manifest.image_size,
                "builtAt": img.manifest.built_at,
                "packages": img.manifest.installed_packages.len(),
            }),
            None => json!({ "name": name, "status": "not built", "cacheKey": recipe.cache_key() }),
        });
    }
    Ok(rows)
}

fn print_catalog(rows: &[Value]) {
    println!(
        "{:<20} {:<10} {:<20} {:>9} {:>8}  BUILT AT",
        "NAME", "STATUS", "CACHE KEY", "SIZE", "PACKAGES"
    );
    for r in rows.iter() {
        let size = r["imageBytes"]
            .as_u64()
            .map(|b| format!("{} MiB", b >> 20))
            .unwrap_or_default();
        println!(
            "{:<20} {:<10} {:<20} {:>9} {:>8}  {}",
            r["name"].as_str().unwrap_or_default(),
            r["status"].as_str().unwrap_or_default(),
            r["cacheKey"].as_str().unwrap_or_default(),
            size,
            r["packages"]
                .as_u64()
                .map(|n| n.to_string())
                .unwrap_or_default(),
            r["builtAt"].as_str().unwrap_or_default(),
        );
    }
}

async fn build_catalog(args: &ClientArgs, name: &str) -> anyhow::Result<u8> {
    let Some(recipe) = warren_template::recipe(name) else {
        bail!(
            "unknown template {name:?} (known: {})",
            warren_template::TEMPLATES.join(", ")
        );
    };
    let data_dir = args.data_dir.clone();
    let image = tokio::task::spawn_blocking(move || {
        warren_template::ensure_image(
            &recipe,
            &data_dir,
            &mut warren_template::StderrProgress::new(),
        )
    })
    .await?
    .with_context(|| format!("building template {name}"))?;
    let m = &image.manifest;
    if args.json {
        println!(
            "{}",
            json!({"name": name, "image": image.image, "built": image.built, "imageBytes": m.image_size})
        );
    } else {
        let what = if image.built {
            "built"
        } else {
            "already built"
        };
        println!(
            "template {name} {what}: {} ({} MiB)",
            image.image.display(),
            m.image_size >> 20
        );
    }
    Ok(0)
}

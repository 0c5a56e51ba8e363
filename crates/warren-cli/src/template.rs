//! `warren template list|build`: the templates of this host's data dir. Like `keys`, these work
//! on the data dir directly (building an image needs root and this machine), whether or not the
//! server runs; the server mounts whatever is built here.

use anyhow::{bail, Context};
use clap::Subcommand;
use serde_json::json;

use crate::ClientArgs;

#[derive(Subcommand)]
pub enum TemplateCommand {
    /// Lists the templates this host knows and whether their images are built.
    List,
    /// Builds a template's image now (with progress), or confirms it is already built.
    Build {
        /// Template name.
        #[arg(default_value = "base")]
        name: String,
    },
}

pub async fn run(cmd: TemplateCommand, args: ClientArgs) -> anyhow::Result<u8> {
    match cmd {
        TemplateCommand::List => list(&args),
        TemplateCommand::Build { name } => build(&args, &name).await,
    }
}

fn list(args: &ClientArgs) -> anyhow::Result<u8> {
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
    if args.json {
        println!("{}", serde_json::Value::Array(rows));
        return Ok(0);
    }
    println!(
        "{:<12} {:<10} {:<20} {:>9} {:>8}  BUILT AT",
        "NAME", "STATUS", "CACHE KEY", "SIZE", "PACKAGES"
    );
    for r in rows {
        let size = r["imageBytes"]
            .as_u64()
            .map(|b| format!("{} MiB", b >> 20))
            .unwrap_or_default();
        println!(
            "{:<12} {:<10} {:<20} {:>9} {:>8}  {}",
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
    Ok(0)
}

async fn build(args: &ClientArgs, name: &str) -> anyhow::Result<u8> {
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

//! `warren template build <name> [-f Dockerfile] [context]`: a Dockerfile built by the server.
//!
//! The context directory is packed into one tar (minus what `.dockerignore` excludes),
//! uploaded once by its SHA-256 (the server keeps it per team, so an unchanged context is not
//! sent again), and the build is started with the Dockerfile's text; the server parses it,
//! and its log is printed as it runs. Exit code 0 when the template is ready, 1 when the build
//! failed (with the server's reason and the step or Dockerfile line).
//!
//! The tar is made reproducible (sorted entries, times, owners and names zeroed, modes kept),
//! so the same files give the same hash and the build's layer cache holds across checkouts.
//!
//! `.dockerignore` follows Docker's rules, not gitignore's: every pattern is matched from the
//! context's root (`foo` excludes `./foo` only; `**/foo` excludes it at any depth), a match of
//! a directory covers everything in it, `!pattern` re-includes (even inside an excluded
//! directory), the last matching pattern wins, and `*`, `?` and `[...]` never match `/`. The
//! patterns are compiled by `globset` (Go's `filepath.Match` is Docker's; the two agree on
//! these forms, except that globset reads `{a,b}` as alternatives where Go has it literal).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use reqwest::Method;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::client::Client;
use crate::ClientArgs;

#[derive(clap::Args, Debug)]
pub struct BuildArgs {
    /// Template name (`[namespace/]alias[:tag]`); building a name again rebuilds it in place.
    pub name: String,
    /// The Dockerfile (default: `<context>/Dockerfile`).
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// The build context: the directory COPY and ADD read.
    #[arg(default_value = ".")]
    pub context: PathBuf,
    /// A value for an ARG (`--build-arg K=V`, repeatable).
    #[arg(long = "build-arg", value_parser = build_arg)]
    pub build_args: Vec<(String, String)>,
    /// vCPUs of the template's sandboxes.
    #[arg(long)]
    pub cpu: Option<u32>,
    /// Memory of the template's sandboxes, in MiB.
    #[arg(long = "memory-mb")]
    pub memory_mb: Option<u32>,
    /// Rebuild every step, ignoring the layer cache.
    #[arg(long)]
    pub no_cache: bool,
}

fn build_arg(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected K=V, got {s:?}")),
    }
}

/// One `.dockerignore` pattern.
struct Rule {
    glob: globset::GlobMatcher,
    /// `!pattern`: re-includes what it matches.
    include: bool,
}

/// `.dockerignore`, compiled.
pub(crate) struct Ignore {
    rules: Vec<Rule>,
}

impl Ignore {
    pub(crate) fn parse(text: &str) -> anyhow::Result<Ignore> {
        let mut rules = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (include, pattern) = match line.strip_prefix('!') {
                Some(p) => (true, p.trim()),
                None => (false, line),
            };
            // Docker cleans each pattern as a path: no leading `/` or `./`, no trailing `/`.
            let cleaned: Vec<&str> = pattern
                .split('/')
                .filter(|p| !p.is_empty() && *p != ".")
                .collect();
            if cleaned.is_empty() {
                continue;
            }
            let glob = globset::GlobBuilder::new(&cleaned.join("/"))
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .with_context(|| format!(".dockerignore: bad pattern {line:?}"))?
                .compile_matcher();
            rules.push(Rule { glob, include });
        }
        Ok(Ignore { rules })
    }

    /// Whether `rel` (relative to the context, `/`-separated) is left out: the last pattern
    /// that matches it or one of its parent directories decides.
    pub(crate) fn excluded(&self, rel: &str) -> bool {
        let mut out = false;
        for r in &self.rules {
            let mut hit = false;
            let mut end = rel.len();
            loop {
                if r.glob.is_match(&rel[..end]) {
                    hit = true;
                    break;
                }
                match rel[..end].rfind('/') {
                    Some(i) => end = i,
                    None => break,
                }
            }
            if hit {
                out = !r.include;
            }
        }
        out
    }

    fn has_exceptions(&self) -> bool {
        self.rules.iter().any(|r| r.include)
    }
}

/// A writer that hashes what passes through it.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The context's files (relative paths, sorted), minus what `.dockerignore` excludes.
fn walk(dir: &Path, rel: &str, ignore: &Ignore, out: &mut Vec<String>) -> anyhow::Result<()> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()
        .with_context(|| format!("reading {}", dir.display()))?;
    names.sort();
    for name in names {
        let path = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        let full = dir.join(&name);
        let meta = std::fs::symlink_metadata(&full)
            .with_context(|| format!("reading {}", full.display()))?;
        let excluded = ignore.excluded(&path);
        if !excluded {
            out.push(path.clone());
        }
        // An excluded directory is still read when a `!` pattern may bring back part of it.
        if meta.is_dir() && (!excluded || ignore.has_exceptions()) {
            walk(&full, &path, ignore, out)?;
        }
    }
    Ok(())
}

/// Packs `context` into the tar `out` and returns its SHA-256 (hex): the files hash.
pub(crate) fn pack_context(context: &Path, out: &Path) -> anyhow::Result<String> {
    let ignore = match std::fs::read_to_string(context.join(".dockerignore")) {
        Ok(t) => Ignore::parse(&t)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ignore { rules: Vec::new() },
        Err(e) => return Err(e).context("reading .dockerignore"),
    };
    let mut paths = Vec::new();
    walk(context, "", &ignore, &mut paths)?;
    let file = std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut tar = tar::Builder::new(Hashing {
        inner: std::io::BufWriter::new(file),
        hash: Sha256::new(),
    });
    for rel in &paths {
        let full = context.join(rel);
        let meta = std::fs::symlink_metadata(&full)?;
        let mut h = tar::Header::new_gnu();
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mode(std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777);
        let ft = meta.file_type();
        if ft.is_dir() {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_size(0);
            tar.append_data(&mut h, format!("{rel}/"), std::io::empty())?;
        } else if ft.is_symlink() {
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            let target = std::fs::read_link(&full)?;
            tar.append_link(&mut h, rel, target)?;
        } else if ft.is_file() {
            h.set_entry_type(tar::EntryType::Regular);
            h.set_size(meta.len());
            let f = std::fs::File::open(&full)
                .with_context(|| format!("reading {}", full.display()))?;
            tar.append_data(&mut h, rel, f)?;
        }
        // Sockets, fifos and devices are not files a build can copy.
    }
    let mut w = tar.into_inner()?;
    w.flush()?;
    Ok(w.hash
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

pub async fn run(args: BuildArgs, client_args: &ClientArgs) -> anyhow::Result<u8> {
    let client = Client::new(client_args)?;
    let file = args
        .file
        .clone()
        .unwrap_or_else(|| args.context.join("Dockerfile"));
    let dockerfile =
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    // The server parses it again; a file it would refuse is refused here before the context
    // is packed and sent (the same parser, so the same words and line).
    let build_args: HashMap<String, String> = args.build_args.iter().cloned().collect();
    if let Err(e) = warren_buildspec::dockerfile::parse(&dockerfile, &build_args) {
        eprintln!("{}: {e}", file.display());
        return Ok(1);
    }
    let tmp = std::env::temp_dir().join(format!(
        "warren-context-{}-{}.tar",
        std::process::id(),
        unique_stamp()
    ));
    let (context, tar_path) = (args.context.clone(), tmp.clone());
    let hash = tokio::task::spawn_blocking(move || pack_context(&context, &tar_path))
        .await
        .context("packing the context")??;
    let result = build(&client, client_args, &args, &dockerfile, &hash, &tmp).await;
    let _ = std::fs::remove_file(&tmp);
    result
}

/// A per-call suffix for temporary names.
fn unique_stamp() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

async fn build(
    client: &Client,
    client_args: &ClientArgs,
    args: &BuildArgs,
    dockerfile: &str,
    hash: &str,
    tar: &Path,
) -> anyhow::Result<u8> {
    let mut body = json!({ "name": args.name });
    if let Some(c) = args.cpu {
        body["cpuCount"] = json!(c);
    }
    if let Some(m) = args.memory_mb {
        body["memoryMB"] = json!(m);
    }
    let reg: Value = client
        .api(Method::POST, "/v3/templates", Some(body))
        .await?
        .json()
        .await?;
    let (Some(tid), Some(bid)) = (reg["templateID"].as_str(), reg["buildID"].as_str()) else {
        bail!("the server's answer lacks templateID or buildID: {reg}");
    };
    let link: Value = client
        .api(Method::GET, &format!("/templates/{tid}/files/{hash}"), None)
        .await?
        .json()
        .await?;
    if link["present"].as_bool() != Some(true) {
        let Some(url) = link["url"].as_str() else {
            bail!("the server gave no upload URL for the context: {link}");
        };
        let bytes = tokio::fs::read(tar)
            .await
            .context("reading the context tar")?;
        eprintln!("Uploading the build context ({} bytes)", bytes.len());
        // The URL is signed: it carries no API key.
        let resp = reqwest::Client::new()
            .put(url)
            .body(bytes)
            .send()
            .await
            .context("uploading the build context")?;
        Client::check(resp).await?;
    }
    let build_args: HashMap<&str, &str> = args
        .build_args
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    client
        .api(
            Method::POST,
            &format!("/v2/templates/{tid}/builds/{bid}"),
            Some(json!({
                "dockerfile": dockerfile,
                "contextFilesHash": hash,
                "buildArgs": build_args,
                "force": args.no_cache,
            })),
        )
        .await?;
    let json_out = client_args.json;
    let last = crate::template::follow_build(client, tid, bid, |e| {
        if !json_out {
            println!("{}", e["message"].as_str().unwrap_or(""));
        }
    })
    .await?;
    if last["status"].as_str() == Some("error") {
        let reason = &last["reason"];
        let message = reason["message"].as_str().unwrap_or("no reason given");
        let step = reason["step"].as_str().unwrap_or("?");
        if client_args.json {
            println!(
                "{}",
                json!({"templateID": tid, "buildID": bid, "status": "error", "reason": reason})
            );
        }
        eprintln!("Build failed at step {step}: {message}");
        return Ok(1);
    }
    if client_args.json {
        println!(
            "{}",
            json!({"templateID": tid, "buildID": bid, "status": "ready"})
        );
    } else {
        eprintln!("Template {} is ready ({tid}, build {bid})", args.name);
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dockerignore_follows_dockers_rules() {
        let ig = Ignore::parse(
            "# comment\nsecret.txt\n/build/\n**/*.log\n*.tmp\nvendor\n!vendor/keep\ndocs/*.md\n!docs/README.md\n",
        )
        .unwrap();
        assert!(ig.excluded("secret.txt"));
        // Matched from the root only, unlike gitignore.
        assert!(!ig.excluded("sub/secret.txt"));
        assert!(ig.excluded("build/out/x"));
        assert!(ig.excluded("a/b/c.log"));
        assert!(ig.excluded("c.log"));
        assert!(ig.excluded("x.tmp"));
        assert!(!ig.excluded("sub/x.tmp"));
        assert!(ig.excluded("vendor/lib/a.go"));
        // Re-included inside an excluded directory (gitignore cannot).
        assert!(!ig.excluded("vendor/keep"));
        assert!(ig.excluded("docs/a.md"));
        assert!(!ig.excluded("docs/README.md"));
        assert!(!ig.excluded("docs/sub/a.md"));
        assert!(!ig.excluded("app.py"));
    }

    #[test]
    fn the_context_tar_leaves_out_ignored_files_and_is_reproducible() {
        let d = tempfile::tempdir().unwrap();
        let ctx = d.path().join("ctx");
        std::fs::create_dir_all(ctx.join("sub")).unwrap();
        std::fs::write(ctx.join("keep.txt"), "k").unwrap();
        std::fs::write(ctx.join("secret.txt"), "s").unwrap();
        std::fs::write(ctx.join("sub/a.txt"), "a").unwrap();
        std::os::unix::fs::symlink("keep.txt", ctx.join("link")).unwrap();
        std::fs::write(ctx.join(".dockerignore"), "secret.txt\n").unwrap();
        let h1 = pack_context(&ctx, &d.path().join("1.tar")).unwrap();
        // Newer times, same content: the same hash.
        std::fs::write(ctx.join("keep.txt"), "k").unwrap();
        let h2 = pack_context(&ctx, &d.path().join("2.tar")).unwrap();
        assert_eq!(h1, h2);
        assert_eq!(h1.len(), 64);
        let bytes = std::fs::read(d.path().join("1.tar")).unwrap();
        assert_eq!(h1, format!("{:x}", Sha256::digest(&bytes)));
        let mut ar = tar::Archive::new(&bytes[..]);
        let names: Vec<String> = ar
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [".dockerignore", "keep.txt", "link", "sub/", "sub/a.txt"]
        );
        std::fs::write(ctx.join("keep.txt"), "changed").unwrap();
        assert_ne!(pack_context(&ctx, &d.path().join("3.tar")).unwrap(), h1);
    }

    #[test]
    fn build_args_are_key_value() {
        assert_eq!(build_arg("A=b=c").unwrap(), ("A".into(), "b=c".into()));
        assert!(build_arg("nope").is_err());
    }
}

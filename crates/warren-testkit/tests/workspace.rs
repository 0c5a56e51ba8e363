//! Rules about the workspace's source that no compiler checks.

use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Settings are configuration: `warren serve` reads its flags (and the few variables it
/// documents) and passes values down; a library that reads the environment has a setting
/// nobody sees, as `WARREN_NS_CONFINEMENT` once weakened every sandbox without a flag or a log
/// line. Binaries (`warren-cli`, any `main.rs` or `src/bin/`) may read it; so may the test
/// kit (its `WARREN_REQUIRE_ALL`). Looking up tools on `PATH` is not a setting.
#[test]
fn libraries_read_no_environment() {
    // A process handing its child its configuration: a protocol, not a setting.
    const HANDOFFS: [&str; 1] = ["warren-runtime-ns/src/nsinit.rs"];
    let crates = workspace().join("crates");
    let mut found = Vec::new();
    for krate in std::fs::read_dir(&crates).unwrap().flatten() {
        let name = krate.file_name().to_string_lossy().into_owned();
        if name == "warren-cli" || name == "warren-testkit" {
            continue;
        }
        let mut files = Vec::new();
        let src = krate.path().join("src");
        if src.is_dir() {
            rust_files(&src, &mut files);
        }
        for file in files {
            let rel = file
                .strip_prefix(&crates)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if file.ends_with("main.rs")
                || rel.contains("/src/bin/")
                || HANDOFFS.contains(&rel.as_str())
            {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            for (n, line) in text.lines().enumerate() {
                let reads = ["env::var(", "env::var_os(", "env::vars(", "try_from_env("]
                    .iter()
                    .any(|p| line.contains(p));
                if reads && !line.contains("\"PATH\"") {
                    found.push(format!("{rel}:{}: {}", n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "libraries read the environment (make it a `warren serve` flag and pass it down):\n{}",
        found.join("\n")
    );
}

/// The workspace's crates and each one's `warren-*` dependencies of any kind, from
/// `cargo metadata`.
fn crate_graph() -> std::collections::BTreeMap<String, Vec<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(workspace())
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let mut deps: Vec<String> = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|d| d["name"].as_str())
                .filter(|n| n.starts_with("warren-"))
                .map(String::from)
                .collect();
            deps.sort();
            deps.dedup();
            (p["name"].as_str().unwrap().to_string(), deps)
        })
        .collect()
}

/// The crates `docs/architecture.md` lists under "Workspace layout", in order.
fn architecture_list() -> Vec<String> {
    let doc = std::fs::read_to_string(workspace().join("docs/architecture.md")).unwrap();
    let section = doc
        .split("## Workspace layout")
        .nth(1)
        .expect("docs/architecture.md has a Workspace layout section");
    let block = section
        .split("```")
        .nth(1)
        .expect("the list is a code block");
    block
        .lines()
        .filter(|l| l.starts_with("warren-"))
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect()
}

/// The crates the README's Layout table names.
fn readme_crates() -> Vec<String> {
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    readme
        .lines()
        .filter_map(|l| l.strip_prefix("| `crates/"))
        .map(|l| {
            l.split('`')
                .next()
                .unwrap()
                .trim_end_matches('/')
                .to_string()
        })
        .collect()
}

/// A newcomer's map must be the territory: every crate in `docs/architecture.md`'s list and
/// in the README's table, nothing else, and no crate depending on one listed above it.
#[test]
fn the_documented_crate_map_matches_cargo_metadata() {
    let graph = crate_graph();
    let listed = architecture_list();
    let mut members: Vec<&String> = graph.keys().collect();
    members.sort();
    let mut sorted: Vec<&String> = listed.iter().collect();
    sorted.sort();
    assert_eq!(
        sorted, members,
        "docs/architecture.md's crate list and the workspace differ"
    );
    let mut readme = readme_crates();
    readme.sort();
    assert_eq!(
        readme.iter().collect::<Vec<_>>(),
        members,
        "README.md's Layout table and the workspace differ"
    );
    let place = |name: &str| listed.iter().position(|c| c == name).unwrap();
    let mut upward = Vec::new();
    for (krate, deps) in &graph {
        for dep in deps {
            if dep != krate && place(dep) < place(krate) {
                upward.push(format!("{krate} -> {dep}"));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "dependencies pointing up docs/architecture.md's list: {}",
        upward.join(", ")
    );
}

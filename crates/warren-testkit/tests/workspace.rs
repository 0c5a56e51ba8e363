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

//! Shared test helpers: the tool guard and scratch directories.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};

/// Whether every tool is installed. When one is missing the test cannot run here: the
/// reason is printed (`SKIP: ...`) and false returned, or, under `WARREN_REQUIRE_ALL=1`, the
/// test fails with it (docs/testing.md).
pub fn require_tools(test: &str, tools: &[(&str, &str)]) -> bool {
    let missing: Vec<String> = tools
        .iter()
        .filter(|(tool, _)| warren_testkit::on_path(tool).is_none())
        .map(|(tool, package)| format!("`{tool}` (Debian package `{package}`)"))
        .collect();
    warren_testkit::require(
        format_args!(
            "{} for the {test} (scripts/setup.sh installs them)",
            missing.join(", ")
        ),
        missing.is_empty(),
    )
}

/// A scratch directory under /var/tmp (disk-backed on every host we use; /tmp may be a small
/// tmpfs elsewhere), removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = Path::new("/var/tmp").join(format!(
            "warren-template-test-{name}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("create scratch directory under /var/tmp");
        Scratch(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Never recurse into something still mounted inside (an image mounted by a failed
        // test): leave the directory for a human instead.
        let mounted = std::fs::read_to_string("/proc/self/mountinfo")
            .map(|info| {
                info.lines().any(|l| {
                    l.split(' ')
                        .nth(4)
                        .is_some_and(|m| Path::new(m).starts_with(&self.0))
                })
            })
            .unwrap_or(true);
        if mounted {
            eprintln!(
                "warning: leaving {} in place: something is mounted inside it",
                self.0.display()
            );
            return;
        }
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            eprintln!("warning: could not remove {}: {e}", self.0.display());
        }
    }
}

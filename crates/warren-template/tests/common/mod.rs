//! Shared test helpers: the tool guard and scratch directories.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};

/// Returns false (after printing a loud SKIPPED line) when `WARREN_SKIP_IMAGE_BUILD=1` is set.
/// Otherwise panics if any tool is missing: a test that silently passes without the tools it
/// exercises would hide a broken setup.
pub fn require_tools(test: &str, tools: &[(&str, &str)]) -> bool {
    if std::env::var("WARREN_SKIP_IMAGE_BUILD").as_deref() == Ok("1") {
        // Straight to the stderr handle: the test harness captures eprintln! output of
        // passing tests, and a skip must be seen.
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "\n!!!!! SKIPPED: {test}: WARREN_SKIP_IMAGE_BUILD=1 is set !!!!!\n"
        );
        return false;
    }
    for (tool, package) in tools {
        let found = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
            .iter()
            .map(PathBuf::from)
            .chain(std::env::split_paths(
                &std::env::var_os("PATH").unwrap_or_default(),
            ))
            .any(|dir| dir.join(tool).is_file());
        assert!(
            found,
            "{test} needs `{tool}` (Debian package `{package}`), which is not installed. \
             Run scripts/setup.sh (or `apt-get install {package}`), or set \
             WARREN_SKIP_IMAGE_BUILD=1 to skip the image tests."
        );
    }
    true
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

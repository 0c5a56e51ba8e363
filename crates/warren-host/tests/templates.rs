//! Template mounts shared by every manager of a host: managers that start at once (a restarted
//! server next to a draining one, tests side by side) mount an image once, and all of them use
//! that mount. Needs root and the base image (built on first use).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};

fn mounts_on(path: &Path) -> usize {
    let needle = format!(" {} ", path.display());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(&needle))
        .count()
}

#[test]
fn managers_starting_at_once_mount_a_template_once() {
    if !warren_testkit::require(
        "root (it mounts template images)",
        warren_testkit::is_root(),
    ) {
        return;
    }
    let dir = PathBuf::from(format!(
        "/run/warren-test-mount-race-{}",
        std::process::id()
    ));
    let data = PathBuf::from("/var/lib/warren");
    let managers = 6;
    let barrier = Arc::new(Barrier::new(managers));
    let roots: Vec<PathBuf> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..managers)
            .map(|_| {
                let (barrier, dir, data) = (barrier.clone(), dir.clone(), data.clone());
                s.spawn(move || {
                    // Each its own registry, as each manager process has.
                    let templates = warren_host::Templates::default();
                    // The image is built (or found) before the race: only the mount races.
                    let recipe = warren_template::recipe("base").unwrap();
                    warren_template::ensure_image(
                        &recipe,
                        &data,
                        &mut warren_template::StderrProgress::new(),
                    )
                    .unwrap_or_else(|e| panic!("{e}"));
                    barrier.wait();
                    templates
                        .root("base", &data, &dir)
                        .unwrap_or_else(|e| panic!("{e}"))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let root = roots[0].clone();
    let seen = mounts_on(&root);
    // Unmounted before asserting, so a failure leaves nothing behind.
    while nix::mount::umount(&root).is_ok() {}
    let _ = std::fs::remove_dir_all(&dir);
    assert!(roots.iter().all(|r| *r == root), "{roots:?}");
    assert_eq!(seen, 1, "the image is mounted once on {}", root.display());
}

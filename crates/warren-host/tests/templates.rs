//! Template mounts on the host: private to root, `nosuid` and `nodev`, mounted once while
//! held, and gone when the last holder goes, the template is forgotten or the runtime stops.
//! Needs root and the base image (built on first use), whose `su` is setuid root.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};

/// The mount options of every mount on `path`.
fn mounts_on(path: &Path) -> Vec<String> {
    let needle = path.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.split(' ').nth(4) == Some(needle.as_str()))
        .map(|l| l.split(' ').nth(5).unwrap_or_default().to_string())
        .collect()
}

struct Scene {
    dir: PathBuf,
    data: PathBuf,
}

impl Scene {
    fn new(tag: &str) -> Option<Scene> {
        if !warren_testkit::require(
            "root (it mounts template images)",
            warren_testkit::is_root(),
        ) {
            return None;
        }
        let data = PathBuf::from("/var/lib/warren");
        let recipe = warren_template::recipe("base").unwrap();
        warren_template::ensure_image(&recipe, &data, &mut warren_template::StderrProgress::new())
            .unwrap_or_else(|e| panic!("{e}"));
        let dir = PathBuf::from(format!(
            "/run/warren-test-templates-{tag}-{}",
            std::process::id()
        ));
        Some(Scene { dir, data })
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        warren_host::Templates::sweep(&self.dir);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn a_template_mount_is_private_nosuid_and_nodev() {
    let Some(s) = Scene::new("private") else {
        return;
    };
    let templates = warren_host::Templates::default();
    let root = templates.root("base", &s.data, &s.dir).unwrap();
    let opts = mounts_on(root.path());
    assert_eq!(opts.len(), 1, "{opts:?}");
    for o in ["ro", "nosuid", "nodev"] {
        assert!(opts[0].split(',').any(|x| x == o), "{o} in {opts:?}");
    }
    // The mount's own root shows the image's `/` (0755); the directory holding it is what
    // keeps everyone but root out.
    assert_eq!(root.path().parent(), Some(s.dir.as_path()));
    let m = std::fs::metadata(&s.dir).unwrap();
    assert_eq!((m.permissions().mode() & 0o777, m.uid()), (0o700, 0));
    // The image's setuid-root su, run by nobody from the host's mount: not even reachable.
    let su = root.path().join("usr/bin/su");
    assert_ne!(
        std::fs::metadata(&su).unwrap().mode() & 0o4000,
        0,
        "su is setuid in the image"
    );
    // Through a shell: setpriv opens the program it runs before it changes ids.
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(["/bin/sh", "-c", "exec \"$0\" --version"])
        .arg(&su)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "nobody ran {}: {out:?}",
        su.display()
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "{out:?}"
    );
}

#[test]
fn a_template_is_mounted_once_while_held_and_unmounted_by_its_last_holder() {
    let Some(s) = Scene::new("held") else {
        return;
    };
    let templates = Arc::new(warren_host::Templates::default());
    let users = 6;
    let barrier = Arc::new(Barrier::new(users));
    let roots: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..users)
            .map(|_| {
                let (barrier, templates, s) = (barrier.clone(), templates.clone(), &s);
                scope.spawn(move || {
                    barrier.wait();
                    templates.root("base", &s.data, &s.dir).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let path = roots[0].path().to_path_buf();
    assert!(roots.iter().all(|r| r.path() == path), "one mount for all");
    assert_eq!(mounts_on(&path).len(), 1);
    drop(roots);
    assert!(
        mounts_on(&path).is_empty(),
        "unmounted with its last holder"
    );
    assert!(!path.exists(), "its directory is gone");

    // Forgetting a template detaches its mount at once, even while held.
    let held = templates.root("base", &s.data, &s.dir).unwrap();
    assert_ne!(held.path(), path, "a new mount, in a directory of its own");
    templates.forget("base");
    assert!(mounts_on(held.path()).is_empty(), "detached when forgotten");
    let again = templates.root("base", &s.data, &s.dir).unwrap();
    assert_eq!(mounts_on(again.path()).len(), 1, "mounted anew after");

    // A stopping runtime detaches everything it mounted.
    templates.unmount_all();
    assert!(mounts_on(again.path()).is_empty());
}

#[test]
fn a_crashed_servers_template_mounts_are_swept() {
    let Some(s) = Scene::new("sweep") else {
        return;
    };
    let templates = warren_host::Templates::default();
    let root = templates.root("base", &s.data, &s.dir).unwrap();
    let path = root.path().to_path_buf();
    // As a crash would: the registry never drops its mount.
    std::mem::forget(root);
    std::mem::forget(templates);
    // And an older server's mount point with its lock file.
    let old = s.dir.join("base-old");
    std::fs::create_dir(&old).unwrap();
    std::fs::write(s.dir.join("base-old.lock"), "").unwrap();
    assert_eq!(mounts_on(&path).len(), 1);
    warren_host::Templates::sweep(&s.dir);
    assert!(mounts_on(&path).is_empty(), "swept");
    let left: Vec<_> = std::fs::read_dir(&s.dir).unwrap().flatten().collect();
    assert!(left.is_empty(), "{left:?}");
}

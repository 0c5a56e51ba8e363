//! Cache behaviour around builds, without building a real image: a second builder waits for
//! the first and reuses its result; a failed build leaves nothing that looks like an image and
//! reports the failing command with its output.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{require_tools, Scratch};
use nix::fcntl::{Flock, FlockArg};
use warren_template::{
    ensure_image, BuildPhase, BuildProgress, ImageError, Manifest, Recipe, FORMAT_VERSION,
    IMAGE_FILE, MANIFEST_FILE,
};

#[derive(Clone, Default)]
struct Shared {
    phases: Arc<Mutex<Vec<BuildPhase>>>,
    lines: Arc<Mutex<Vec<String>>>,
}

impl BuildProgress for Shared {
    fn phase(&mut self, phase: BuildPhase, _detail: &str) {
        self.phases.lock().expect("phases lock").push(phase);
    }
    fn log(&mut self, line: &str) {
        self.lines.lock().expect("lines lock").push(line.to_owned());
    }
}

fn tiny_image(scratch: &Path) -> PathBuf {
    let tree = scratch.join("tree");
    fs::create_dir_all(tree.join("etc")).expect("mkdir");
    fs::write(tree.join("etc/hostname"), "tiny\n").expect("write");
    let image = scratch.join("tiny.erofs");
    let out = Command::new("mkfs.erofs")
        .arg(&image)
        .arg(&tree)
        .output()
        .expect("run mkfs.erofs");
    assert!(
        out.status.success(),
        "mkfs.erofs failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    image
}

/// Writes a complete cache entry for `recipe` the way a build commits one: everything in a
/// temporary directory, then one rename.
fn commit_entry(data_dir: &Path, recipe: &Recipe, image: &Path, manifest_hash: &str) -> PathBuf {
    let images = data_dir.join("images");
    let tmp = images.join("planting");
    fs::create_dir_all(&tmp).expect("mkdir");
    fs::copy(image, tmp.join(IMAGE_FILE)).expect("copy image");
    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        name: recipe.name.clone(),
        recipe_hash: manifest_hash.to_owned(),
        image_file: IMAGE_FILE.to_owned(),
        image_size: fs::metadata(image).expect("stat").len(),
        image_sha256: String::new(),
        built_at: "2025-01-01T00:00:00Z".to_owned(),
        build_seconds: 0.0,
        mmdebstrap_version: "test".to_owned(),
        recipe: recipe.clone(),
        installed_packages: Vec::new(),
    };
    let json = serde_json::to_string_pretty(&manifest).expect("serialize manifest");
    fs::write(tmp.join(MANIFEST_FILE), json).expect("write manifest");
    let dir = images.join(recipe.cache_key());
    fs::rename(&tmp, &dir).expect("commit entry");
    dir
}

#[test]
fn a_second_builder_waits_for_the_first_and_reuses_its_image() {
    if !require_tools("lock wait", &[("mkfs.erofs", "erofs-utils")]) {
        return;
    }
    let scratch = Scratch::new("lock");
    let image = tiny_image(scratch.path());
    let data = scratch.path().join("data");
    let recipe = Recipe::base();
    let images = data.join("images");
    fs::create_dir_all(&images).expect("mkdir images");

    // Play the first builder: hold the recipe's lock.
    let lock_file =
        fs::File::create(images.join(format!("{}.lock", recipe.cache_key()))).expect("lock file");
    let held = Flock::lock(lock_file, FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .expect("take lock");

    let progress = Shared::default();
    let waiter = {
        let (recipe, data, mut progress) = (recipe.clone(), data.clone(), progress.clone());
        std::thread::spawn(move || ensure_image(&recipe, &data, &mut progress))
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !progress
        .phases
        .lock()
        .expect("phases")
        .contains(&BuildPhase::WaitingForLock)
    {
        assert!(
            Instant::now() < deadline,
            "the second builder never reported waiting"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    // The "first builder" finishes: commit the entry, then release the lock.
    commit_entry(&data, &recipe, &image, &recipe.hash());
    drop(held);

    let result = waiter
        .join()
        .expect("waiter thread")
        .expect("waiter gets the image");
    assert!(
        !result.built,
        "the waiter reused the image instead of building"
    );
    assert_eq!(result.dir, images.join(recipe.cache_key()));
    assert_eq!(
        *progress.phases.lock().expect("phases"),
        vec![BuildPhase::WaitingForLock]
    );
}

#[test]
fn a_failed_build_replaces_nothing_and_reports_the_command() {
    if !require_tools(
        "failed build",
        &[("mkfs.erofs", "erofs-utils"), ("mmdebstrap", "mmdebstrap")],
    ) {
        return;
    }
    let scratch = Scratch::new("failed");
    let image = tiny_image(scratch.path());
    let data = scratch.path().join("data");
    // An archive on a loopback port nobody listens on: apt fails within a second.
    let mut recipe = Recipe::base();
    recipe.mirror = "http://127.0.0.1:9/debian".to_owned();

    // An invalid entry (manifest for some other recipe) sits where the image belongs.
    let entry = commit_entry(&data, &recipe, &image, &"0".repeat(64));

    let mut progress = Shared::default();
    let err = ensure_image(&recipe, &data, &mut progress).expect_err("the build cannot succeed");
    let lines = progress.lines.lock().expect("lines").join("\n");
    assert!(lines.contains("discarding invalid cache entry"), "{lines}");
    match &err {
        ImageError::CommandFailed { command, tail, .. } => {
            assert!(
                command.contains("mmdebstrap") && command.contains("127.0.0.1:9"),
                "{command}"
            );
            assert!(
                !tail.is_empty() && tail != "(no output)",
                "the error carries mmdebstrap's output"
            );
        }
        // Without root the build stops before running anything; the rest still holds.
        ImageError::NeedsRoot { .. } => {}
        other => panic!("unexpected error: {other}"),
    }
    eprintln!("failed build reported: {err}");

    // Nothing that could pass for an image: no entry, no build or trash directory.
    assert!(!entry.exists(), "the invalid entry was discarded");
    let left: Vec<String> = fs::read_dir(data.join("images"))
        .expect("list images")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, vec![format!("{}.lock", recipe.cache_key())]);
}

//! Corrupt or incomplete cache entries must be detected (and then rebuilt), and a valid entry
//! must be reused without building. Uses a tiny erofs image made with mkfs.erofs, so it runs in
//! a second and needs neither root nor the network.

mod common;

use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{require_tools, Scratch};
use warren_template::{
    cached_image, ensure_image, verify_image, BuildPhase, BuildProgress, ImageError, Manifest,
    Recipe, FORMAT_VERSION, IMAGE_FILE, MANIFEST_FILE,
};

fn tiny_image(scratch: &Path) -> PathBuf {
    let tree = scratch.join("tree");
    fs::create_dir_all(tree.join("etc")).expect("mkdir");
    fs::write(tree.join("etc/hostname"), "tiny\n").expect("write");
    fs::write(tree.join("big"), vec![b'x'; 256 * 1024]).expect("write");
    let image = scratch.join("tiny.erofs");
    let out = Command::new("mkfs.erofs")
        .arg("-zlz4hc")
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

fn patch(path: &Path, offset: u64, bytes: &[u8]) {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open for patching");
    file.seek(SeekFrom::Start(offset)).expect("seek");
    file.write_all(bytes).expect("patch");
}

fn expect_corrupt(path: &Path, needle: &str) {
    match verify_image(path) {
        Err(ImageError::CorruptImage { reason, .. }) => {
            assert!(reason.contains(needle), "expected {needle:?} in {reason:?}")
        }
        other => panic!("expected a corrupt-image error mentioning {needle:?}, got {other:?}"),
    }
}

#[test]
fn verify_image_accepts_good_and_rejects_damaged_images() {
    if !require_tools("verify_image", &[("mkfs.erofs", "erofs-utils")]) {
        return;
    }
    let scratch = Scratch::new("verify");
    let image = tiny_image(scratch.path());
    let info = verify_image(&image).expect("fresh image verifies");
    assert!(
        info.checksummed,
        "mkfs.erofs writes a superblock checksum by default"
    );
    assert_eq!(info.block_size, 4096);
    assert!(info.blocks * u64::from(info.block_size) <= info.file_size);

    let copy = |name: &str| {
        let path = scratch.path().join(name);
        fs::copy(&image, &path).expect("copy image");
        path
    };

    let bad_magic = copy("magic.erofs");
    patch(&bad_magic, 1024, &[0, 0, 0, 0]);
    expect_corrupt(&bad_magic, "bad magic");

    // The volume name field: not structural, so only the checksum catches the change.
    let flipped = copy("flipped.erofs");
    patch(&flipped, 1024 + 64, b"tampered");
    expect_corrupt(&flipped, "checksum");

    let truncated = copy("truncated.erofs");
    let len = fs::metadata(&truncated).expect("stat").len();
    fs::OpenOptions::new()
        .write(true)
        .open(&truncated)
        .and_then(|f| f.set_len(len - 4096))
        .expect("truncate");
    expect_corrupt(&truncated, "truncated");

    let garbage = scratch.path().join("garbage.erofs");
    fs::write(&garbage, vec![0xAB; 8192]).expect("write");
    expect_corrupt(&garbage, "bad magic");

    let short = scratch.path().join("short.erofs");
    fs::write(&short, b"erofs?").expect("write");
    expect_corrupt(&short, "shorter than a superblock");

    assert!(matches!(
        verify_image(&scratch.path().join("missing.erofs")),
        Err(ImageError::Io { .. })
    ));
}

#[derive(Default)]
struct Recorder(Vec<BuildPhase>);

impl BuildProgress for Recorder {
    fn phase(&mut self, phase: BuildPhase, _detail: &str) {
        self.0.push(phase);
    }
}

/// Plants a cache entry for `recipe` as a build would leave it, with `image` as its image.
fn plant_entry(data_dir: &Path, recipe: &Recipe, image: &Path) -> PathBuf {
    let dir = data_dir.join("images").join(recipe.cache_key());
    fs::create_dir_all(&dir).expect("mkdir entry");
    fs::copy(image, dir.join(IMAGE_FILE)).expect("copy image");
    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        name: recipe.name.clone(),
        recipe_hash: recipe.hash(),
        image_file: IMAGE_FILE.to_owned(),
        image_size: fs::metadata(image).expect("stat").len(),
        image_sha256: String::new(),
        built_at: "2025-01-01T00:00:00Z".to_owned(),
        build_seconds: 0.0,
        mmdebstrap_version: "test".to_owned(),
        recipe: recipe.clone(),
        installed_packages: Vec::new(),
    };
    fs::write(dir.join(MANIFEST_FILE), serde_json_string(&manifest)).expect("write manifest");
    dir
}

fn serde_json_string(manifest: &Manifest) -> String {
    // The crate's own writer is private; a Manifest round-trips through its public serde impls.
    serde_json::to_string_pretty(manifest).expect("serialize manifest")
}

#[test]
fn cache_lookup_reuses_valid_entries_and_rejects_broken_ones() {
    if !require_tools("cache lookup", &[("mkfs.erofs", "erofs-utils")]) {
        return;
    }
    let scratch = Scratch::new("cache");
    let image = tiny_image(scratch.path());
    let data = scratch.path().join("data");
    let recipe = Recipe::base();

    assert!(
        cached_image(&recipe, &data).expect("lookup").is_none(),
        "empty cache"
    );

    let entry = plant_entry(&data, &recipe, &image);
    let found = cached_image(&recipe, &data)
        .expect("lookup")
        .expect("valid entry is found");
    assert_eq!(found.dir, entry);
    assert!(!found.built);

    // ensure_image on a valid entry: no build, not a single phase reported, not even a lock.
    let mut phases = Recorder::default();
    let reused = ensure_image(&recipe, &data, &mut phases).expect("reuse");
    assert!(!reused.built);
    assert!(
        phases.0.is_empty(),
        "a cache hit reported phases: {:?}",
        phases.0
    );
    assert!(!data
        .join("images")
        .join(format!("{}.lock", recipe.cache_key()))
        .exists());

    // A different recipe does not match this entry.
    let mut other = recipe.clone();
    other.packages.push("vim-tiny".to_owned());
    assert!(cached_image(&other, &data).expect("lookup").is_none());

    // Damaged image: superblock checksum mismatch.
    patch(&entry.join(IMAGE_FILE), 1024 + 64, b"tampered");
    assert!(
        cached_image(&recipe, &data).expect("lookup").is_none(),
        "corrupt image is ignored"
    );

    // Image intact but not the size the manifest recorded (e.g. replaced by another build).
    fs::copy(&image, entry.join(IMAGE_FILE)).expect("restore image");
    assert!(cached_image(&recipe, &data).expect("lookup").is_some());
    let mut manifest = Manifest::read(&entry.join(MANIFEST_FILE)).expect("read manifest");
    manifest.image_size += 4096;
    fs::write(entry.join(MANIFEST_FILE), serde_json_string(&manifest)).expect("write");
    assert!(
        cached_image(&recipe, &data).expect("lookup").is_none(),
        "size mismatch is caught"
    );

    // Manifest for another recipe hash or format.
    manifest.image_size -= 4096;
    manifest.recipe_hash = other.hash();
    fs::write(entry.join(MANIFEST_FILE), serde_json_string(&manifest)).expect("write");
    assert!(
        cached_image(&recipe, &data).expect("lookup").is_none(),
        "hash mismatch is caught"
    );

    // No manifest (a crash before it was written cannot produce this, but a human can).
    fs::remove_file(entry.join(MANIFEST_FILE)).expect("remove manifest");
    assert!(
        cached_image(&recipe, &data).expect("lookup").is_none(),
        "missing manifest"
    );
}

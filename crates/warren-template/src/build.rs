//! The image cache and the builder behind it.
//!
//! Layout under the data directory:
//!
//! ```text
//! <data_dir>/images/
//!   base-1a2b3c4d5e6f/            one finished image per recipe hash (never modified again)
//!     rootfs.erofs                the read-only root filesystem
//!     manifest.json               written last; its presence + validity marks the entry complete
//!   base-1a2b3c4d5e6f.lock        flock(2) serialising builders of that recipe (kept forever:
//!                                 deleting a lock file while someone waits on it breaks locking)
//!   .build-base-1a2b3c4d5e6f-*/   a build in progress, or the remains of a crashed one
//! ```
//!
//! A build happens entirely inside `.build-*` and becomes visible with one `rename(2)`, so a
//! crash at any point leaves either no entry or a complete one, never a half image that looks
//! finished.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::command::{self, GROUPADD, MKFS_EROFS, MMDEBSTRAP, UNSHARE, USERADD};
use crate::erofs::verify_image;
use crate::error::{ImageError, Result};
use crate::fsutil::{self, remove_tree, sync_path};
use crate::manifest::{self, Manifest, IMAGE_FILE, MANIFEST_FILE};
use crate::progress::{BuildPhase, BuildProgress};
use crate::recipe::{PostStep, Recipe, FORMAT_VERSION};
use crate::steps;

/// A finished image in the cache.
#[derive(Debug, Clone)]
pub struct ImagePath {
    /// The cache entry directory (`<data_dir>/images/<name>-<hash12>`).
    pub dir: PathBuf,
    /// The erofs image file inside it. Mount it read-only, or hand it to QEMU as a read-only
    /// drive; never write to it: every sandbox of this template shares it.
    pub image: PathBuf,
    /// The entry's manifest.
    pub manifest: Manifest,
    /// True if this call built the image, false if it was already cached (or another process
    /// built it while we waited for the lock).
    pub built: bool,
}

impl ImagePath {
    /// Full integrity check: re-hashes the whole image and compares it with the manifest.
    /// Reads every byte (about a second for the base image), so it is for audits and for
    /// images copied from elsewhere, not for every sandbox start.
    pub fn verify_digest(&self) -> Result<()> {
        let actual = manifest::sha256_file(&self.image)?;
        if actual != self.manifest.image_sha256 {
            return Err(ImageError::CorruptImage {
                path: self.image.clone(),
                reason: format!(
                    "SHA-256 {actual} does not match the manifest's {}",
                    self.manifest.image_sha256
                ),
            });
        }
        Ok(())
    }
}

/// Where images live under a data directory.
pub fn images_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("images")
}

/// Returns the cached image for `recipe` if there is a complete, valid one; never builds.
pub fn cached_image(recipe: &Recipe, data_dir: &Path) -> Result<Option<ImagePath>> {
    recipe.validate()?;
    let dir = images_dir(&absolute(data_dir)?).join(recipe.cache_key());
    Ok(match inspect_entry(&dir, &recipe.hash()) {
        Entry::Valid(image) => Some(*image),
        Entry::Missing | Entry::Invalid(_) => None,
    })
}

/// Returns the image for `recipe`, building it first if the cache has no valid one.
///
/// A cache hit costs a manifest parse and a one-block header check, and reports nothing to
/// `progress`. Otherwise the build lock for this recipe is taken (waiting, with a
/// [`BuildPhase::WaitingForLock`] report, if another builder holds it; its result is then
/// reused), and the image is built, verified and committed atomically. Building needs root,
/// `mmdebstrap`, `mkfs.erofs` (erofs-utils) and network access to the Debian archive.
pub fn ensure_image(
    recipe: &Recipe,
    data_dir: &Path,
    progress: &mut dyn BuildProgress,
) -> Result<ImagePath> {
    recipe.validate()?;
    let hash = recipe.hash();
    let key = recipe.cache_key();
    let images = images_dir(&absolute(data_dir)?);
    let final_dir = images.join(&key);
    if let Entry::Valid(image) = inspect_entry(&final_dir, &hash) {
        return Ok(*image);
    }

    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&images)
        .map_err(ImageError::io("create directory", &images))?;
    let _lock = lock(&images.join(format!("{key}.lock")), progress)?;

    // Look again: whoever held the lock may just have finished this very image.
    match inspect_entry(&final_dir, &hash) {
        Entry::Valid(image) => return Ok(*image),
        Entry::Invalid(reason) => {
            progress.log(&format!(
                "discarding invalid cache entry {}: {reason}",
                final_dir.display()
            ));
            let trash = images.join(format!(".trash-{key}-{}", unique_suffix()));
            fs::rename(&final_dir, &trash).map_err(ImageError::io("move aside", &final_dir))?;
            remove_tree(&trash)?;
        }
        Entry::Missing => {}
    }
    build(recipe, &hash, &key, &images, &final_dir, progress)
}

enum Entry {
    Missing,
    Invalid(String),
    // Boxed: the manifest makes this variant large, and the others carry next to nothing.
    Valid(Box<ImagePath>),
}

/// Decides whether a cache entry directory holds a usable image. Only cheap checks: this runs
/// on every lookup.
fn inspect_entry(dir: &Path, hash: &str) -> Entry {
    let manifest_path = dir.join(MANIFEST_FILE);
    match fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Entry::Missing,
        Err(e) => return Entry::Invalid(format!("cannot stat the entry: {e}")),
        Ok(meta) if !meta.is_dir() => return Entry::Invalid("not a directory".to_owned()),
        Ok(_) => {}
    }
    let manifest = match Manifest::read(&manifest_path) {
        Ok(manifest) => manifest,
        Err(e) => return Entry::Invalid(e.to_string()),
    };
    if manifest.format_version != FORMAT_VERSION || manifest.recipe_hash != hash {
        return Entry::Invalid(format!(
            "manifest is for format {} / recipe {}, expected format {FORMAT_VERSION} / recipe {hash}",
            manifest.format_version, manifest.recipe_hash
        ));
    }
    // The manifest names the file, but we only ever look at our own fixed name: a manifest
    // must not be able to point us elsewhere.
    if manifest.image_file != IMAGE_FILE {
        return Entry::Invalid(format!(
            "manifest names image file {:?}",
            manifest.image_file
        ));
    }
    let image = dir.join(IMAGE_FILE);
    let info = match verify_image(&image) {
        Ok(info) => info,
        Err(e) => return Entry::Invalid(e.to_string()),
    };
    if info.file_size != manifest.image_size {
        return Entry::Invalid(format!(
            "{} is {} bytes, the manifest says {}",
            image.display(),
            info.file_size,
            manifest.image_size
        ));
    }
    Entry::Valid(Box::new(ImagePath {
        dir: dir.to_owned(),
        image,
        manifest,
        built: false,
    }))
}

/// Takes the exclusive build lock, reporting a wait if someone else holds it. Released when
/// the returned value is dropped, or by the kernel if this process dies.
fn lock(path: &Path, progress: &mut dyn BuildProgress) -> Result<Flock<fs::File>> {
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(ImageError::io("open lock file", path))?;
    let file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => return Ok(lock),
        Err((file, Errno::EWOULDBLOCK)) => file,
        Err((_, errno)) => return Err(ImageError::io("lock", path)(io::Error::from(errno))),
    };
    progress.phase(
        BuildPhase::WaitingForLock,
        &format!(
            "another builder holds {}; waiting to reuse its image",
            path.display()
        ),
    );
    let mut file = file;
    loop {
        match Flock::lock(file, FlockArg::LockExclusive) {
            Ok(lock) => return Ok(lock),
            Err((again, Errno::EINTR)) => file = again,
            Err((_, errno)) => return Err(ImageError::io("lock", path)(io::Error::from(errno))),
        }
    }
}

/// Removes the build directory on drop unless the build was committed.
struct TempDir {
    path: PathBuf,
    armed: bool,
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if self.armed {
            // Best effort: whatever is left is removed by the next build of this recipe.
            let _ = remove_tree(&self.path);
        }
    }
}

fn build(
    recipe: &Recipe,
    hash: &str,
    key: &str,
    images: &Path,
    final_dir: &Path,
    progress: &mut dyn BuildProgress,
) -> Result<ImagePath> {
    let started = Instant::now();
    progress.phase(
        BuildPhase::Prepare,
        &format!("building image {key}: checking tools"),
    );
    if !nix::unistd::geteuid().is_root() {
        return Err(ImageError::NeedsRoot {
            name: recipe.name.clone(),
        });
    }
    let unshare = command::locate(UNSHARE)?;
    let mmdebstrap = command::locate(MMDEBSTRAP)?;
    let mkfs = command::locate(MKFS_EROFS)?;
    for step in &recipe.post_steps {
        match step {
            PostStep::User { .. } => {
                command::locate(USERADD)?;
            }
            PostStep::Group { .. } => {
                command::locate(GROUPADD)?;
            }
            _ => {}
        }
    }
    let mmdebstrap_version = command::capture(Command::new(&mmdebstrap).arg("--version"))?;
    remove_leftovers(images, key, progress)?;

    let tmp = TempDir {
        path: images.join(format!(".build-{key}-{}", unique_suffix())),
        armed: true,
    };
    fs::DirBuilder::new()
        .mode(0o755)
        .create(&tmp.path)
        .map_err(ImageError::io("create directory", &tmp.path))?;
    let rootfs = tmp.path.join("rootfs");

    progress.phase(
        BuildPhase::Bootstrap,
        &format!(
            "mmdebstrap {} {} + {} packages from {} (downloads; about a minute)",
            recipe.suite,
            recipe.variant,
            recipe.packages.len(),
            recipe.mirror
        ),
    );
    command::run_streaming(
        &mut mmdebstrap_command(&unshare, &mmdebstrap, recipe, &rootfs),
        progress,
    )?;

    progress.phase(
        BuildPhase::Configure,
        &format!("{} post-steps", recipe.post_steps.len()),
    );
    for step in &recipe.post_steps {
        progress.log(&describe(step));
        steps::apply(&rootfs, step, progress)?;
    }
    let installed_packages = manifest::installed_packages(&rootfs)?;

    let image = tmp.path.join(IMAGE_FILE);
    progress.phase(
        BuildPhase::MakeImage,
        &format!("mkfs.erofs ({:?} compression)", recipe.compression).to_lowercase(),
    );
    let mut mkfs_cmd = Command::new(&mkfs);
    // --quiet: erofs-utils 1.5 draws a per-file progress meter with '\r' (tens of thousands
    // of "lines" for this tree); errors are still printed.
    mkfs_cmd.arg("--quiet");
    mkfs_cmd
        .args(recipe.compression.mkfs_arg())
        .arg(&image)
        .arg(&rootfs);
    command::run_streaming(&mut mkfs_cmd, progress)?;

    progress.phase(
        BuildPhase::Verify,
        "checking the image and writing the manifest",
    );
    let info = verify_image(&image)?;
    // Read-only for everyone: the file is shared by every sandbox of the template.
    fs::set_permissions(&image, fs::Permissions::from_mode(0o444))
        .map_err(ImageError::io("chmod", &image))?;
    sync_path(&image)?;
    let image_sha256 = manifest::sha256_file(&image)?;
    // The unpacked tree has served its purpose; the cache keeps only the image.
    remove_tree(&rootfs)?;
    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        name: recipe.name.clone(),
        recipe_hash: hash.to_owned(),
        image_file: IMAGE_FILE.to_owned(),
        image_size: info.file_size,
        image_sha256,
        built_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        build_seconds: (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        mmdebstrap_version,
        recipe: recipe.clone(),
        installed_packages,
    };
    manifest.write(&tmp.path.join(MANIFEST_FILE))?;
    sync_path(&tmp.path)?;

    progress.phase(
        BuildPhase::Commit,
        &format!(
            "{} ({} MiB, {:.0}s)",
            final_dir.display(),
            info.file_size >> 20,
            started.elapsed().as_secs_f64()
        ),
    );
    fs::rename(&tmp.path, final_dir).map_err(ImageError::io("rename build into", final_dir))?;
    let mut tmp = tmp;
    tmp.armed = false;
    sync_path(images)?;
    Ok(ImagePath {
        dir: final_dir.to_owned(),
        image: final_dir.join(IMAGE_FILE),
        manifest,
        built: true,
    })
}

/// The mmdebstrap invocation. It runs inside a private mount namespace (`unshare --mount`):
/// mmdebstrap's root mode mounts /proc, /sys and /dev pieces inside the tree while it works,
/// and if it is killed those mounts die with the namespace instead of lingering on the host
/// under a directory someone will later delete recursively.
fn mmdebstrap_command(
    unshare: &Path,
    mmdebstrap: &Path,
    recipe: &Recipe,
    rootfs: &Path,
) -> Command {
    let mut cmd = Command::new(unshare);
    cmd.args(["--mount", "--propagation", "private", "--"])
        .arg(mmdebstrap)
        .args(["--mode=root", "--format=directory"])
        .arg(format!("--variant={}", recipe.variant))
        .arg(format!("--architectures={}", recipe.architecture))
        .arg(format!("--components={}", recipe.components.join(",")));
    let mut packages = recipe.packages.clone();
    packages.sort();
    packages.dedup();
    if !packages.is_empty() {
        cmd.arg(format!("--include={}", packages.join(",")));
    }
    for option in &recipe.apt_options {
        cmd.arg(format!("--aptopt={option}"));
    }
    for option in &recipe.dpkg_options {
        cmd.arg(format!("--dpkgopt={option}"));
    }
    for dir in &recipe.setup_dirs {
        // Validated as a plain absolute path (Recipe::validate); "$1" is the tree.
        cmd.arg(format!("--setup-hook=mkdir -p \"$1{dir}\""));
    }
    // Given a bare URL, mmdebstrap writes exactly one source line (`deb <mirror> <suite>
    // <components>`): no -updates or -security suites, which is what we want (one archive).
    cmd.arg(&recipe.suite).arg(rootfs).arg(&recipe.mirror);
    // English, locale-independent tool output in logs and error tails, whatever the host has.
    cmd.env("LC_ALL", "C.UTF-8");
    cmd
}

/// One line saying what a post-step does, for the build log.
fn describe(step: &PostStep) -> String {
    match step {
        PostStep::Group { name, gid } => format!("group {name} (gid {gid})"),
        PostStep::User {
            name,
            uid,
            gid,
            home,
            shell,
            groups,
        } => format!(
            "user {name} (uid {uid}, gid {gid}, home {home}, shell {shell}, groups [{}])",
            groups.join(",")
        ),
        PostStep::WriteFile {
            path,
            mode,
            contents,
        } => {
            format!("write {path} (mode {mode:04o}, {} bytes)", contents.len())
        }
        PostStep::ClearDir { path } => format!("clear {path}"),
    }
}

/// Deletes the build and trash directories of `key` left by crashed or killed builders. Only
/// called while holding that key's lock, so none of them can belong to a live build.
fn remove_leftovers(images: &Path, key: &str, progress: &mut dyn BuildProgress) -> Result<()> {
    let prefixes = [format!(".build-{key}-"), format!(".trash-{key}-")];
    for path in fsutil::list_dir(images)? {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if prefixes.iter().any(|p| name.starts_with(p.as_str())) {
            progress.log(&format!(
                "removing leftover of an interrupted build: {}",
                path.display()
            ));
            remove_tree(&path)?;
        }
    }
    Ok(())
}

/// `<pid>-<counter>`: unique among concurrent builds on this host.
fn unique_suffix() -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn absolute(path: &Path) -> Result<PathBuf> {
    // useradd --root and our symlink checks need absolute paths.
    std::path::absolute(path).map_err(ImageError::io("resolve", path))
}

//! Saving and restoring a sandbox's writable layer on the host's disk.
//!
//! The writable layer is the overlayfs upper directory: every file the sandbox created or
//! changed, plus whiteouts (0/0 character devices) and opaque-directory xattrs for what it
//! deleted. It lives on the sandbox's disk (see [`crate::disk`]), so a save keeps that disk's
//! image: linked for a pause (nothing is copied), copied by data or as a reflink for a
//! snapshot ([`save_disk`]). The image is saved while the sandbox is frozen and its filesystem
//! synced, so it is consistent. A saved directory holds the image and the host id range its
//! files are owned by.
//!
//! Saves made before sandboxes had disks (and the staging of an export) hold the upper
//! directory itself, copied with `cp -a`, which keeps ownership, modes, times, xattrs, device
//! nodes, hard links and holes ([`save`]); a sandbox resumed from one gets a blank disk with
//! the tree copied onto it. Every save is durable before it returns (every file and
//! directory fsynced, then renamed into place and the parent directory synced), and replacing
//! an earlier save is atomic: a crash leaves either the old or the new copy, never a mix.

use std::fs;
use std::io;
use std::path::Path;

/// Name of the layer inside a saved directory.
const UPPER: &str = "upper";

/// The saved upper directory inside a directory written by [`save`].
pub fn upper_of(saved: &Path) -> std::path::PathBuf {
    saved.join(UPPER)
}
/// Name of the file recording the host id range the saved files are owned by.
const IDS: &str = "id-base";
/// The range every sandbox used before ranges were per sandbox (saves without [`IDS`]).
const LEGACY_ID_BASE: u32 = 100_000;

/// Copies the layer `upper` of a sandbox whose ids start at host id `id_base` into the
/// directory `dest` (created or atomically replaced) and returns the bytes it takes. Durable
/// when it returns.
pub async fn save(upper: &Path, dest: &Path, id_base: u32) -> io::Result<u64> {
    let staging = staging_for(dest)?;
    copy(upper, &staging.join(UPPER)).await?;
    fs::write(staging.join(IDS), format!("{id_base}\n"))?;
    warren_host::durable::install(&staging, dest).await
}

/// Saves the disk `image` of a sandbox whose ids start at host id `id_base` into the
/// directory `dest` (created or atomically replaced): linked when `link` (a pause), else
/// copied (a snapshot). Returns the bytes the saved image takes. Durable when it returns.
pub async fn save_disk(image: &Path, dest: &Path, id_base: u32, link: bool) -> io::Result<u64> {
    let staging = staging_for(dest)?;
    let (img, st) = (image.to_path_buf(), staging.clone());
    tokio::task::spawn_blocking(move || crate::disk::save(&img, &st, link))
        .await
        .map_err(io::Error::other)??;
    fs::write(staging.join(IDS), format!("{id_base}\n"))?;
    warren_host::durable::install(&staging, dest).await
}

/// A new, empty staging directory beside `dest`, for a save to be installed there.
fn staging_for(dest: &Path) -> io::Result<std::path::PathBuf> {
    let parent = dest
        .parent()
        .ok_or_else(|| io::Error::other(format!("{} has no parent", dest.display())))?;
    fs::create_dir_all(parent)?;
    let staging = warren_host::durable::sibling(dest, "partial");
    warren_host::durable::remove_tree(&staging)?;
    fs::create_dir(&staging)?;
    Ok(staging)
}

/// The host id range the layer saved in `saved` is owned by.
pub fn saved_id_base(saved: &Path) -> io::Result<u32> {
    match fs::read_to_string(saved.join(IDS)) {
        Ok(s) => s
            .trim()
            .parse()
            .map_err(|e| io::Error::other(format!("{}: {e}", saved.join(IDS).display()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(LEGACY_ID_BASE),
        Err(e) => Err(e),
    }
}

/// Fills `upper` (which must not exist yet) from a directory written by [`save`], for a
/// sandbox whose ids start at host id `id_base`: files saved from a sandbox with another range
/// are given the same ids in the new range.
pub async fn restore(saved: &Path, upper: &Path, id_base: u32) -> io::Result<()> {
    let src = saved.join(UPPER);
    if !src.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no saved layer at {}", saved.display()),
        ));
    }
    let from = saved_id_base(saved)?;
    copy(&src, upper).await?;
    if from != id_base {
        let upper = upper.to_path_buf();
        tokio::task::spawn_blocking(move || shift_ids(&upper, from, id_base))
            .await
            .map_err(io::Error::other)??;
    }
    Ok(())
}

/// Moves the ownership of every file under `root` from the id range at `from` to the one at
/// `to` (ids outside the range are left alone). Setuid and setgid bits, which `chown` clears,
/// are put back. File capabilities that name their namespace's root (`security.capability`
/// version 3) keep naming the old range and stop applying.
pub fn shift_ids(root: &Path, from: u32, to: u32) -> io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let count = crate::config::ID_COUNT;
    let map = |id: u32| (id >= from && id - from < count).then(|| id - from + to);
    let mut stack = vec![root.to_path_buf()];
    let visit = |path: &Path| -> io::Result<bool> {
        let meta = fs::symlink_metadata(path)?;
        let (uid, gid) = (map(meta.uid()), map(meta.gid()));
        if uid.is_some() || gid.is_some() {
            std::os::unix::fs::lchown(path, uid, gid)?;
            let special = meta.mode() & 0o6000;
            if special != 0 && !meta.file_type().is_symlink() {
                fs::set_permissions(path, fs::Permissions::from_mode(meta.mode() & 0o7777))?;
            }
        }
        Ok(meta.is_dir())
    };
    visit(root)?;
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir)? {
            let path = entry?.path();
            if visit(&path)? {
                stack.push(path);
            }
        }
    }
    Ok(())
}

/// Whether `saved` holds a layer written by [`save_disk`] or [`save`].
pub fn exists(saved: &Path) -> bool {
    saved.join(crate::disk::IMAGE).is_file() || saved.join(UPPER).is_dir()
}

/// Deletes a saved directory. Idempotent.
pub fn remove(saved: &Path) -> io::Result<()> {
    warren_host::durable::remove_tree(saved)?;
    warren_host::durable::remove_tree(&warren_host::durable::sibling(saved, "partial"))
}

async fn copy(from: &Path, to: &Path) -> io::Result<()> {
    let out = tokio::process::Command::new("cp")
        .arg("-a")
        .arg("--no-target-directory")
        .arg(from)
        .arg(to)
        .output()
        .await?;
    if out.status.success() {
        return Ok(());
    }
    Err(crate::disk::tool_failed(
        &format!("copy {} to {}", from.display(), to.display()),
        &out.stderr,
    ))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;
    use std::time::Instant;

    /// What restoring into another id range costs next to the copy itself (run as root):
    /// `cargo test --release -p warren-runtime-ns --lib shift_cost -- --ignored --nocapture`.
    #[tokio::test]
    #[ignore = "a measurement; needs root"]
    async fn shift_cost() {
        let base = std::env::temp_dir().join(format!("warren-shift-{}", std::process::id()));
        let src = base.join("saved");
        let (from, to) = (1u32 << 30, (1u32 << 30) + 65536);
        for d in 0..100 {
            let dir = src.join("upper").join(format!("d{d}"));
            std::fs::create_dir_all(&dir).unwrap();
            for f in 0..200 {
                std::fs::write(dir.join(format!("f{f}")), b"x").unwrap();
            }
        }
        super::shift_ids(&src.join("upper"), 0, from).unwrap();
        std::fs::write(src.join(super::IDS), format!("{from}\n")).unwrap();
        let t = Instant::now();
        super::copy(&src.join("upper"), &base.join("copy"))
            .await
            .unwrap();
        let copy = t.elapsed();
        let t = Instant::now();
        super::shift_ids(&base.join("copy"), from, to).unwrap();
        let shift = t.elapsed();
        let m = std::fs::metadata(base.join("copy/d5/f5")).unwrap();
        assert_eq!(m.uid(), to);
        println!("20000 files, 100 directories: cp -a {copy:?}, id shift {shift:?}");
        std::fs::remove_dir_all(&base).unwrap();
    }
}

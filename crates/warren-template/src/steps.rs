//! Applying a recipe's post-steps to a bootstrapped tree.
//!
//! The tree is a Debian root filesystem we just built, but it is still treated as hostile in
//! one respect: paths inside it are resolved component by component and symlinks are never
//! followed, because an absolute symlink such as `/etc/resolv.conf -> /run/...` would otherwise
//! make us write to the *host's* /run.

use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::command::{self, GROUPADD, USERADD};
use crate::error::{ImageError, Result};
use crate::fsutil;
use crate::progress::BuildProgress;
use crate::recipe::{image_path, PostStep};

/// Applies `step` to the tree at `root` (an absolute path).
pub(crate) fn apply(root: &Path, step: &PostStep, progress: &mut dyn BuildProgress) -> Result<()> {
    match step {
        PostStep::Group { name, gid } => {
            // --root makes the tree's own groupadd logic edit the tree's /etc/group and
            // /etc/gshadow (it chroots), so we never hand-edit shadow files.
            let mut cmd = Command::new(command::locate(GROUPADD)?);
            cmd.arg("--root")
                .arg(root)
                .arg("--gid")
                .arg(gid.to_string())
                .arg(name);
            command::run_streaming(&mut cmd, progress)
        }
        PostStep::User {
            name,
            uid,
            gid,
            home,
            shell,
            groups,
        } => {
            let mut cmd = Command::new(command::locate(USERADD)?);
            cmd.arg("--root")
                .arg(root)
                .args(["--uid", &uid.to_string(), "--gid", &gid.to_string()])
                .args(["--home-dir", home, "--create-home", "--shell", shell]);
            if !groups.is_empty() {
                cmd.args(["--groups", &groups.join(",")]);
            }
            cmd.arg(name);
            command::run_streaming(&mut cmd, progress)
        }
        PostStep::WriteFile {
            path,
            contents,
            mode,
        } => {
            let target = resolve_parent_dirs(root, path, true)?;
            write_file(&target, contents.as_bytes(), *mode)
        }
        PostStep::ClearDir { path } => {
            let target = resolve_parent_dirs(root, path, false)?;
            clear_dir(&target)
        }
    }
}

/// Returns `root` joined with the image path, after checking that every *parent* directory
/// inside the tree is a real directory (not a symlink). With `create`, missing parents are
/// created (mode 0755, like a package would).
fn resolve_parent_dirs(root: &Path, path: &str, create: bool) -> Result<PathBuf> {
    let parts = image_path(path)?;
    let Some((_, parents)) = parts.split_last() else {
        return Err(ImageError::InvalidRecipe(
            "a post-step may not target /".to_owned(),
        ));
    };
    let mut current = root.to_path_buf();
    for part in parents {
        current.push(part);
        match fs::symlink_metadata(&current) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(ImageError::InvalidRecipe(format!(
                    "{path}: {} is not a directory inside the image (a symlink or file); \
                     refusing to follow it",
                    current.display()
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
                fs::DirBuilder::new()
                    .mode(0o755)
                    .create(&current)
                    .map_err(ImageError::io("create directory", &current))?;
            }
            Err(e) => return Err(ImageError::io("inspect", &current)(e)),
        }
    }
    Ok(root.join(parts.join("/")))
}

fn write_file(target: &Path, contents: &[u8], mode: u32) -> Result<()> {
    match fs::symlink_metadata(target) {
        Ok(meta) if meta.is_dir() => {
            return Err(ImageError::InvalidRecipe(format!(
                "cannot write file {}: a directory is in the way",
                target.display()
            )))
        }
        // Unlink whatever is there (a symlink is removed, not followed) so the new file is a
        // fresh regular file with exactly our owner and mode.
        Ok(_) => fs::remove_file(target).map_err(ImageError::io("remove", target))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(ImageError::io("inspect", target)(e)),
    }
    // create_new is O_CREAT|O_EXCL (never follows a symlink planted in between); O_NOFOLLOW is
    // belt and braces.
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(o_nofollow())
        .open(target)
        .map_err(ImageError::io("create", target))?;
    file.write_all(contents)
        .map_err(ImageError::io("write", target))?;
    // Set the mode explicitly: the builder's umask must not leak into the image.
    file.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(ImageError::io("chmod", target))?;
    Ok(())
}

fn o_nofollow() -> i32 {
    nix::fcntl::OFlag::O_NOFOLLOW.bits()
}

fn clear_dir(dir: &Path) -> Result<()> {
    match fs::symlink_metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(ImageError::InvalidRecipe(format!(
                "cannot clear {}: not a directory (symlinks are not followed)",
                dir.display()
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ImageError::io("inspect", dir)(e)),
    }
    for entry in fsutil::list_dir(dir)? {
        let meta = fs::symlink_metadata(&entry).map_err(ImageError::io("inspect", &entry))?;
        if meta.is_dir() {
            fsutil::remove_tree(&entry)?;
        } else {
            fs::remove_file(&entry).map_err(ImageError::io("remove", &entry))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::SilentProgress;
    use std::os::unix::fs::symlink;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "warren-template-steps-{name}-{}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("etc")).expect("create scratch tree");
        dir
    }

    #[test]
    fn write_file_replaces_a_symlink_instead_of_following_it() {
        let root = scratch("symlink");
        let outside = root.with_extension("outside");
        fs::write(&outside, "host file\n").expect("write outside file");
        symlink(&outside, root.join("etc/resolv.conf")).expect("plant symlink");

        let step = PostStep::WriteFile {
            path: "/etc/resolv.conf".to_owned(),
            contents: "nameserver 192.0.2.1\n".to_owned(),
            mode: 0o644,
        };
        apply(&root, &step, &mut SilentProgress).expect("apply");

        let meta = fs::symlink_metadata(root.join("etc/resolv.conf")).expect("stat");
        assert!(meta.is_file());
        assert_eq!(meta.permissions().mode() & 0o7777, 0o644);
        assert_eq!(fs::read_to_string(&outside).expect("read"), "host file\n");
        let _ = fs::remove_dir_all(&root);
        let _ = fs::remove_file(&outside);
    }

    #[test]
    fn symlinked_parent_directories_are_refused() {
        let root = scratch("parent");
        symlink("/etc", root.join("etc/sudoers.d")).expect("plant symlink");
        let step = PostStep::WriteFile {
            path: "/etc/sudoers.d/x".to_owned(),
            contents: String::new(),
            mode: 0o440,
        };
        assert!(apply(&root, &step, &mut SilentProgress).is_err());
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn clear_dir_keeps_the_directory() {
        let root = scratch("clear");
        fs::create_dir_all(root.join("dev/pts")).expect("mkdir");
        fs::write(root.join("dev/null"), "").expect("write");
        apply(
            &root,
            &PostStep::ClearDir {
                path: "/dev".to_owned(),
            },
            &mut SilentProgress,
        )
        .expect("clear");
        assert!(root.join("dev").is_dir());
        assert_eq!(fs::read_dir(root.join("dev")).expect("list").count(), 0);
        let _ = fs::remove_dir_all(&root);
    }
}

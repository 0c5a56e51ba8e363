//! Template images, mounted read-only on the host while sandboxes are made from them.
//!
//! A template's erofs image is a tenant's filesystem (built from its steps or pulled from a
//! registry): setuid files, secrets baked into it. The host's mount of it is therefore private
//! to root (it sits in the templates directory, which is 0700), `nosuid`
//! and `nodev` (a setuid file or device node in it means nothing on the host; a sandbox's own
//! copy gets its setuid bits back, see `warren-runtime-ns`'s `sys`), and it lives only as
//! long as someone holds it: each [`TemplateRoot`] (held by every sandbox made from it, and by
//! a create or export in flight) keeps it mounted, and the last one to go unmounts it. A
//! runtime that stops calls [`Templates::unmount_all`]; one that starts after a crash calls
//! [`Templates::sweep`], so no template stays mounted on a host where no server runs. A
//! sandbox keeps its own copy of the mount (an id-mapped clone inside its mount namespace),
//! so unmounting the host's copy never disturbs a running sandbox.

use std::collections::HashMap;
use std::os::unix::ffi::OsStringExt as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use nix::mount::{MntFlags, MsFlags};
use warren_runtime::RuntimeError;

/// Mounted template roots, by template name.
#[derive(Default)]
pub struct Templates {
    mounted: Mutex<HashMap<String, Weak<Mounted>>>,
}

/// Tells mounts of one image apart, across every registry of the process: each gets a
/// directory of its own, so one being unmounted never races another being mounted.
static SEQ: AtomicU64 = AtomicU64::new(0);

/// One mount of a template image; unmounted when the last [`TemplateRoot`] of it goes.
#[derive(Debug)]
struct Mounted {
    path: PathBuf,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        unmount(&self.path);
    }
}

/// A template's mounted root, kept mounted while this (or a clone of it) lives.
#[derive(Debug, Clone)]
pub struct TemplateRoot(Arc<Mounted>);

impl TemplateRoot {
    /// The mount point (private to root).
    pub fn path(&self) -> &Path {
        &self.0.path
    }
}

/// Detaches the mount at `path` (sandboxes keep their own copies) and removes its directory.
fn unmount(path: &Path) {
    match nix::mount::umount2(path, MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => {}
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "could not unmount a template image")
        }
    }
    let _ = std::fs::remove_dir(path);
}

/// Makes `dir` a directory only root can enter, whatever mode it had.
fn private_dir(dir: &Path) -> Result<(), RuntimeError> {
    std::fs::create_dir_all(dir).map_err(RuntimeError::io(format!("create {}", dir.display())))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(RuntimeError::io(format!("make {} private", dir.display())))
}

/// Why the image of template `name` could not be had, typed: a host I/O failure keeps its
/// `io::Error` (a full disk is storage, not a bug); a missing tool, missing root or a build
/// that failed means this host cannot serve the template now.
pub fn image_error(name: &str, e: warren_template::ImageError) -> RuntimeError {
    match e {
        warren_template::ImageError::Io { op, path, source } => RuntimeError::Io {
            what: format!("template {name}: {op} {}", path.display()),
            source,
        },
        e => RuntimeError::unavailable(format!("template {name}"), e),
    }
}

/// The image file of template `name` and the name of its mount point: a catalog template's
/// (built from its recipe on first use) or one built from steps (`warren-build`).
pub fn image_of(name: &str, data_dir: &Path) -> Result<(PathBuf, String), RuntimeError> {
    if let Some(built) =
        warren_template::built_template(data_dir, name).map_err(|e| image_error(name, e))?
    {
        return Ok((built.image, name.to_string()));
    }
    let recipe = warren_template::recipe(name)
        .ok_or_else(|| RuntimeError::UnknownTemplate(name.to_string()))?;
    let image = warren_template::ensure_image(
        &recipe,
        data_dir,
        &mut warren_template::StderrProgress::new(),
    )
    .map_err(|e| image_error(name, e))?;
    Ok((image.image, recipe.cache_key()))
}

impl Templates {
    /// The mounted root of template `name`, building its image on first use; mounted under
    /// `templates_dir` unless a live [`TemplateRoot`] of it exists.
    pub fn root(
        &self,
        name: &str,
        data_dir: &Path,
        templates_dir: &Path,
    ) -> Result<TemplateRoot, RuntimeError> {
        if let Some(root) = self.live(name) {
            return Ok(root);
        }
        // Outside the lock: the first build of an image takes minutes.
        let (image, cache_key) = image_of(name, data_dir)?;
        let mut mounted = self.mounted.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(root) = mounted.get(name).and_then(Weak::upgrade) {
            return Ok(TemplateRoot(root));
        }
        private_dir(templates_dir)?;
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let mnt = templates_dir.join(format!("{cache_key}.{}-{n}", std::process::id()));
        // Made new (a directory left there would be someone else's).
        std::fs::create_dir(&mnt).map_err(RuntimeError::io(format!("create {}", mnt.display())))?;
        if let Err(e) = nix::mount::mount(
            Some(&image),
            &mnt,
            Some("erofs"),
            // The host's copy honours no setuid bit and no device node of the tenant's image;
            // the sandboxes' clones clear `nosuid` again (sudo in them needs it).
            MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            None::<&str>,
        ) {
            let _ = std::fs::remove_dir(&mnt);
            // A kernel without erofs, a damaged image: this host cannot serve the template now.
            return Err(RuntimeError::unavailable(
                format!("mount {} on {}", image.display(), mnt.display()),
                std::io::Error::from(e),
            ));
        }
        let root = Arc::new(Mounted { path: mnt });
        mounted.insert(name.to_string(), Arc::downgrade(&root));
        Ok(TemplateRoot(root))
    }

    fn live(&self, name: &str) -> Option<TemplateRoot> {
        let mounted = self.mounted.lock().unwrap_or_else(|e| e.into_inner());
        mounted.get(name).and_then(Weak::upgrade).map(TemplateRoot)
    }

    /// Template `name` is going away: its mount is detached now, whoever still holds it (their
    /// sandboxes run on from their own copies).
    pub fn forget(&self, name: &str) {
        let gone = self
            .mounted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name)
            .and_then(|w| w.upgrade());
        if let Some(m) = gone {
            unmount(&m.path);
        }
    }

    /// Detaches every mount this registry made (the runtime is stopping; its sandboxes run
    /// on from their own copies).
    pub fn unmount_all(&self) {
        let all: Vec<_> = self
            .mounted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .filter_map(|(_, w)| w.upgrade())
            .collect();
        for m in all {
            unmount(&m.path);
        }
    }

    /// Detaches whatever is mounted under `templates_dir` and removes what is left there: the
    /// mounts of a server that did not stop cleanly (or of an older server, which kept them
    /// for good). Only for a runtime that holds the host lock: no other manager uses them.
    pub fn sweep(templates_dir: &Path) {
        let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
            return;
        };
        let mut points: Vec<PathBuf> = info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(unescape_mountinfo)
            .filter(|p| p.starts_with(templates_dir) && p != templates_dir)
            .collect();
        // Deepest first, so nothing is detached from under another mount point of ours.
        points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for p in &points {
            unmount(p);
        }
        if let Ok(entries) = std::fs::read_dir(templates_dir) {
            for e in entries.flatten() {
                let p = e.path();
                // Only empty directories and the lock files older servers kept: rmdir never
                // removes what might still be a mount's content.
                let _ = std::fs::remove_dir(&p);
                if p.extension().is_some_and(|x| x == "lock") {
                    let _ = std::fs::remove_file(&p);
                }
            }
        }
    }
}

/// A mount point as `/proc/self/mountinfo` writes it: space, tab, newline and backslash as
/// three octal digits after a backslash.
fn unescape_mountinfo(field: &str) -> PathBuf {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let n = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |n, c| n * 8 + u32::from(c - b'0'));
            out.push(n as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_runtime::Category;

    #[test]
    fn a_template_without_a_recipe_is_unknown() {
        let dir = std::env::temp_dir().join(format!("warren-tpl-{}", uuid::Uuid::new_v4()));
        let e = Templates::default()
            .root("no-such-template", &dir, &dir.join("templates"))
            .unwrap_err();
        assert!(matches!(e, RuntimeError::UnknownTemplate(ref t) if t == "no-such-template"));
        assert_eq!(e.category(), Category::NotFound);
        assert!(
            !dir.exists(),
            "nothing is built or created for an unknown template"
        );
    }

    #[test]
    fn mount_points_are_read_as_mountinfo_escapes_them() {
        assert_eq!(
            unescape_mountinfo(r"/run/a\040b\134c\011"),
            Path::new("/run/a b\\c\t")
        );
        assert_eq!(unescape_mountinfo(r"/x\04"), Path::new(r"/x\04"));
    }

    #[test]
    fn a_full_disk_while_building_an_image_is_storage() {
        let e = image_error(
            "base",
            warren_template::ImageError::Io {
                op: "write",
                path: "/data/images/x".into(),
                source: std::io::Error::from_raw_os_error(libc::ENOSPC),
            },
        );
        assert_eq!(e.category(), Category::StorageFull, "{e:?}");
        assert_eq!(
            warren_runtime::chain(&e),
            format!(
                "template base: write /data/images/x: {}",
                std::io::Error::from_raw_os_error(libc::ENOSPC)
            )
        );
    }

    #[test]
    fn a_missing_build_tool_is_unavailable_with_its_cause() {
        let e = image_error(
            "base",
            warren_template::ImageError::ToolMissing {
                tool: "mkfs.erofs",
                package: "erofs-utils",
            },
        );
        assert_eq!(e.category(), Category::Unavailable, "{e:?}");
        assert!(warren_runtime::chain(&e).contains("erofs-utils"));
    }
}

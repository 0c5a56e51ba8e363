//! Template images, mounted read-only once per host and shared by every sandbox.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use warren_runtime::RuntimeError;

/// Mounted template roots, by template name.
#[derive(Default)]
pub struct Templates {
    mounted: std::sync::Mutex<HashMap<String, PathBuf>>,
}

fn is_mounted(path: &Path) -> bool {
    let needle = format!(" {} ", path.display());
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|m| m.contains(&needle))
        .unwrap_or(false)
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
    /// The mounted root of template `name`, building its image on first use.
    pub fn root(
        &self,
        name: &str,
        data_dir: &Path,
        templates_dir: &Path,
    ) -> Result<PathBuf, RuntimeError> {
        if let Some(p) = self
            .mounted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
        {
            return Ok(p.clone());
        }
        let (image, cache_key) = image_of(name, data_dir)?;
        let mnt = templates_dir.join(&cache_key);
        std::fs::create_dir_all(&mnt)
            .map_err(RuntimeError::io(format!("create {}", mnt.display())))?;
        // Mounts outlive the server (sandboxes keep using them); a restarted server reuses it.
        // Managers of this host (a restarted server, tests side by side) share the mount
        // point: the look and the mount happen under a lock of its own, so two never both see
        // it unmounted and race to mount it.
        let lock_path = templates_dir.join(format!("{cache_key}.lock"));
        let lock_file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(RuntimeError::io(format!("open {}", lock_path.display())))?;
        let _lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| RuntimeError::Io {
                what: format!("lock {}", lock_path.display()),
                source: e.into(),
            })?;
        if !is_mounted(&mnt) {
            nix::mount::mount(
                Some(&image),
                &mnt,
                Some("erofs"),
                // Read-only only: sudo in the sandboxes needs its setuid bit.
                nix::mount::MsFlags::MS_RDONLY,
                None::<&str>,
            )
            .map_err(|e| {
                // A kernel without erofs, a damaged image: this host cannot serve the
                // template now.
                RuntimeError::unavailable(
                    format!("mount {} on {}", image.display(), mnt.display()),
                    std::io::Error::from(e),
                )
            })?;
        }
        self.mounted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), mnt.clone());
        Ok(mnt)
    }
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

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
        let recipe = warren_template::recipe(name)
            .ok_or_else(|| RuntimeError::UnknownTemplate(name.to_string()))?;
        let image = warren_template::ensure_image(
            &recipe,
            data_dir,
            &mut warren_template::StderrProgress::new(),
        )
        .map_err(|e| RuntimeError::Failed(format!("template {name}: {e}")))?;
        let mnt = templates_dir.join(recipe.cache_key());
        std::fs::create_dir_all(&mnt)
            .map_err(|e| RuntimeError::Failed(format!("create {}: {e}", mnt.display())))?;
        // Mounts outlive the server (sandboxes keep using them); a restarted server reuses it.
        // Managers of this host (a restarted server, tests side by side) share the mount
        // point: the look and the mount happen under a lock of its own, so two never both see
        // it unmounted and race to mount it.
        let lock_path = templates_dir.join(format!("{}.lock", recipe.cache_key()));
        let lock_file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| RuntimeError::Failed(format!("open {}: {e}", lock_path.display())))?;
        let _lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| RuntimeError::Failed(format!("lock {}: {e}", lock_path.display())))?;
        if !is_mounted(&mnt) {
            nix::mount::mount(
                Some(&image.image),
                &mnt,
                Some("erofs"),
                // Read-only only: sudo in the sandboxes needs its setuid bit.
                nix::mount::MsFlags::MS_RDONLY,
                None::<&str>,
            )
            .map_err(|e| {
                RuntimeError::Failed(format!(
                    "mount {} on {}: {e}",
                    image.image.display(),
                    mnt.display()
                ))
            })?;
        }
        self.mounted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), mnt.clone());
        Ok(mnt)
    }
}

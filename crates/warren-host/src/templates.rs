//! Template images, mounted read-only once per host and shared by every sandbox.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use warren_image::Recipe;
use warren_runtime::RuntimeError;

/// Names of the templates this host can build.
pub const TEMPLATES: &[&str] = &["base", warren_image::CODE_INTERPRETER_TEMPLATE];

/// Known templates by name.
pub fn recipe(name: &str) -> Option<Recipe> {
    match name {
        "base" => Some(Recipe::base()),
        warren_image::CODE_INTERPRETER_TEMPLATE => Some(Recipe::code_interpreter()),
        _ => None,
    }
}

/// A long-running service a template starts in every sandbox, after the agent is initialised.
///
/// The host starts it through the agent (as the sandbox's default user, detached: it outlives
/// the request that started it) and the create waits until `ready_port` answers
/// `GET ready_path` with 200, so the first call after `Sandbox.create()` finds it ready.
/// Keeping it running is the service's own job (the code interpreter supervises itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartCommand {
    /// Program and arguments, run without a shell.
    pub argv: Vec<String>,
    /// Working directory inside the sandbox.
    pub cwd: String,
    /// Sandbox port whose HTTP `ready_path` answers 200 once the service is ready.
    pub ready_port: u16,
    /// Path of the readiness check.
    pub ready_path: String,
    /// How long the service may take to become ready before the create fails.
    pub ready_timeout: std::time::Duration,
}

/// The start command of template `name`, if it has one.
pub fn start_command(name: &str) -> Option<StartCommand> {
    match name {
        warren_image::CODE_INTERPRETER_TEMPLATE => Some(StartCommand {
            argv: warren_image::code_interpreter_start_argv(),
            cwd: warren_image::USER_HOME.to_owned(),
            ready_port: warren_image::INTERP_PORT,
            ready_path: "/health".to_owned(),
            // The server starts the default Python kernel before it opens its port: a few
            // seconds on an idle host, more on a busy one.
            ready_timeout: std::time::Duration::from_secs(90),
        }),
        _ => None,
    }
}

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
        let recipe = recipe(name).ok_or_else(|| RuntimeError::UnknownTemplate(name.to_string()))?;
        let image =
            warren_image::ensure_image(&recipe, data_dir, &mut warren_image::StderrProgress::new())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_template_has_a_recipe() {
        for name in TEMPLATES {
            let recipe = recipe(name).expect("recipe");
            assert_eq!(recipe.name, *name);
            recipe.validate().expect("valid recipe");
        }
        assert!(recipe("nope").is_none());
    }

    #[test]
    fn only_the_code_interpreter_has_a_start_command() {
        assert!(start_command("base").is_none());
        let cmd = start_command(warren_image::CODE_INTERPRETER_TEMPLATE).expect("start command");
        assert_eq!(cmd.ready_port, 49999);
        assert!(cmd.argv[1].ends_with("supervise.py"));
    }
}

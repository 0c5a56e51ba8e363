//! The agent layer: a tiny directory tree holding only `/usr/local/bin/warren-agent`.
//!
//! The guest agent changes far more often than the template image. Baking it into the image
//! would turn every agent rebuild into a full image rebuild (a minute of downloads) and a new
//! multi-hundred-megabyte file per agent version. Instead a runtime stacks this layer above the
//! image, e.g. for `ns`:
//!
//! ```text
//! mount -t overlay overlay -o lowerdir=<agent layer>:<mounted image>,upperdir=...,workdir=...
//! ```
//!
//! Overlayfs takes a merged directory's owner and mode from the topmost layer that has it, so
//! the layer's `/usr`, `/usr/local` and `/usr/local/bin` are created root-owned and 0755,
//! exactly like the image's; otherwise the layer would silently change them in every sandbox.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use crate::error::{ImageError, Result};
use crate::fsutil::{remove_tree, sync_path};
use crate::manifest::sha256_file;
use crate::recipe::SHORT_HASH_LEN;

/// Where the agent binary appears inside every sandbox.
pub const AGENT_PATH_IN_GUEST: &str = "/usr/local/bin/warren-agent";

/// Creates the agent layer in `layer_dir` (which may exist and must not hold another
/// agent): copies `agent_binary` to `<layer_dir>/usr/local/bin/warren-agent` with mode 0755.
/// Returns `layer_dir`. The copy is written under a temporary name and renamed, so a
/// concurrent reader never sees a partial binary.
pub fn create_agent_layer(agent_binary: &Path, layer_dir: &Path) -> Result<PathBuf> {
    let meta =
        fs::metadata(agent_binary).map_err(ImageError::io("stat agent binary", agent_binary))?;
    if !meta.is_file() {
        return Err(ImageError::Io {
            op: "use as agent binary",
            path: agent_binary.to_owned(),
            source: io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"),
        });
    }
    let is_root = nix::unistd::geteuid().is_root();
    let mut dir = layer_dir.to_path_buf();
    make_dir(&dir, is_root)?;
    for part in ["usr", "local", "bin"] {
        dir.push(part);
        make_dir(&dir, is_root)?;
    }

    let target = dir.join("warren-agent");
    let partial = dir.join(format!(".warren-agent.partial-{}", std::process::id()));
    fs::copy(agent_binary, &partial).map_err(ImageError::io("copy agent binary to", &partial))?;
    fs::set_permissions(&partial, fs::Permissions::from_mode(0o755))
        .map_err(ImageError::io("chmod", &partial))?;
    if is_root {
        std::os::unix::fs::chown(&partial, Some(0), Some(0))
            .map_err(ImageError::io("chown", &partial))?;
    }
    sync_path(&partial)?;
    fs::rename(&partial, &target).map_err(ImageError::io("rename agent binary to", &target))?;
    sync_path(&dir)?;
    Ok(layer_dir.to_owned())
}

/// Content-addressed agent layer under `<data_dir>/agent-layers/<sha256-12 of the binary>/`:
/// created once per agent build and reused after that. Running sandboxes keep the layer they
/// started with, so a new agent never changes files under a live sandbox.
pub fn ensure_agent_layer(agent_binary: &Path, data_dir: &Path) -> Result<PathBuf> {
    let digest = sha256_file(agent_binary)?;
    let layers = data_dir.join("agent-layers");
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&layers)
        .map_err(ImageError::io("create directory", &layers))?;
    let final_dir = layers.join(&digest[..SHORT_HASH_LEN]);
    if final_dir.join("usr/local/bin/warren-agent").is_file() {
        return Ok(final_dir);
    }
    // Build under a private name and rename; if another process won the race, its (identical)
    // layer is used and ours discarded.
    let tmp = layers.join(format!(
        ".build-{}-{}",
        &digest[..SHORT_HASH_LEN],
        std::process::id()
    ));
    remove_tree(&tmp)?;
    create_agent_layer(agent_binary, &tmp)?;
    match fs::rename(&tmp, &final_dir) {
        Ok(()) => {
            sync_path(&layers)?;
            Ok(final_dir)
        }
        Err(_) if final_dir.join("usr/local/bin/warren-agent").is_file() => {
            remove_tree(&tmp)?;
            Ok(final_dir)
        }
        Err(e) => {
            let _ = remove_tree(&tmp);
            Err(ImageError::io("rename agent layer to", &final_dir)(e))
        }
    }
}

fn make_dir(dir: &Path, is_root: bool) -> Result<()> {
    match fs::DirBuilder::new().mode(0o755).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => {}
        Err(e) => return Err(ImageError::io("create directory", dir)(e)),
    }
    // Explicit, because DirBuilder's mode is filtered by the umask and an existing directory
    // keeps whatever mode it had.
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
        .map_err(ImageError::io("chmod", dir))?;
    if is_root {
        std::os::unix::fs::chown(dir, Some(0), Some(0)).map_err(ImageError::io("chown", dir))?;
    }
    Ok(())
}

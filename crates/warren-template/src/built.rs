//! Templates built from steps (the E2B builder, Dockerfiles): finished images the runtimes
//! start sandboxes from, next to the catalog's recipe images.
//!
//! ```text
//! <data_dir>/images/
//!   b1a2b3c4d5e6f7a8b9c0d1e2f3/   one finished build, by its key (never modified again)
//!     rootfs.erofs                the root filesystem the steps made (without the agent)
//!     template.json               written last: how sandboxes of it start
//! ```
//!
//! The key is the runtime's template name: `b` and 24 hex digits of the build's content hash
//! (see `warren-build`), so a catalog name can never be mistaken for one.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{ImageError, Result};
use crate::manifest::IMAGE_FILE;

/// File name of a built template's description inside its entry.
pub const TEMPLATE_FILE: &str = "template.json";

/// How sandboxes of a built template start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuiltConfig {
    /// The user processes run as by default (the build's last `USER`; `user` by default).
    pub user: String,
    /// The default working directory (the build's last `WORKDIR`), if it set one.
    #[serde(default)]
    pub workdir: Option<String>,
    /// A shell command started in every sandbox, in the background, before the create answers.
    #[serde(default)]
    pub start_cmd: Option<String>,
    /// A shell command that exits 0 once the start command is ready.
    #[serde(default)]
    pub ready_cmd: Option<String>,
    /// The build's environment: given to the start command only (build-time variables do not
    /// reach other processes, as on E2B).
    #[serde(default)]
    pub start_env: BTreeMap<String, String>,
    /// The shell that runs commands (`/bin/bash -l -c` where the image has bash).
    #[serde(default = "default_shell")]
    pub shell: Vec<String>,
    /// The runtime key of the template the build started from.
    pub parent: String,
}

fn default_shell() -> Vec<String> {
    vec!["/bin/bash".into(), "-l".into(), "-c".into()]
}

/// A finished built template.
#[derive(Debug, Clone)]
pub struct BuiltTemplate {
    /// The entry directory.
    pub dir: PathBuf,
    /// Its erofs root filesystem (read-only, shared by every sandbox of it).
    pub image: PathBuf,
    /// How its sandboxes start.
    pub config: BuiltConfig,
}

/// Whether `name` is a built template's key (`b` + 24 lowercase hex digits).
pub fn is_built_key(name: &str) -> bool {
    name.len() == 25
        && name.starts_with('b')
        && name[1..]
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The entry directory of built template `key`.
pub fn built_dir(data_dir: &Path, key: &str) -> PathBuf {
    crate::images_dir(data_dir).join(key)
}

/// The built template `key`, if its entry is complete.
pub fn built_template(data_dir: &Path, key: &str) -> Result<Option<BuiltTemplate>> {
    if !is_built_key(key) {
        return Ok(None);
    }
    let dir = built_dir(data_dir, key);
    let file = dir.join(TEMPLATE_FILE);
    let text = match fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ImageError::io("read", &file)(e)),
    };
    let config: BuiltConfig = serde_json::from_str(&text).map_err(|e| ImageError::Manifest {
        path: file.clone(),
        reason: e.to_string(),
    })?;
    let image = dir.join(IMAGE_FILE);
    crate::verify_image(&image)?;
    Ok(Some(BuiltTemplate { dir, image, config }))
}

/// Makes `staging` (a directory holding `rootfs.erofs`, on the same filesystem as the data
/// dir) the built template `key`: writes its `template.json`, syncs both and renames the
/// directory into place. An entry that already exists wins (same key, same content).
pub fn commit_built(
    data_dir: &Path,
    key: &str,
    staging: &Path,
    config: &BuiltConfig,
) -> Result<BuiltTemplate> {
    let image = staging.join(IMAGE_FILE);
    crate::verify_image(&image)?;
    let file = staging.join(TEMPLATE_FILE);
    let text = serde_json::to_vec_pretty(config).map_err(|e| ImageError::Manifest {
        path: file.clone(),
        reason: e.to_string(),
    })?;
    let mut f = fs::File::create(&file).map_err(ImageError::io("create", &file))?;
    f.write_all(&text)
        .and_then(|()| f.sync_all())
        .map_err(ImageError::io("write", &file))?;
    fs::File::open(&image)
        .and_then(|f| f.sync_all())
        .map_err(ImageError::io("sync", &image))?;
    let dest = built_dir(data_dir, key);
    match fs::rename(staging, &dest) {
        Ok(()) => {}
        // Someone committed the same key first: theirs is the same build.
        Err(e) if dest.join(TEMPLATE_FILE).exists() => {
            let _ = e;
            crate::fsutil::remove_tree(staging)?;
        }
        Err(e) => return Err(ImageError::io("rename", staging)(e)),
    }
    let images = crate::images_dir(data_dir);
    fs::File::open(&images)
        .and_then(|d| d.sync_all())
        .map_err(ImageError::io("sync", &images))?;
    built_template(data_dir, key)?.ok_or_else(|| ImageError::Manifest {
        path: dest.join(TEMPLATE_FILE),
        reason: "vanished after commit".into(),
    })
}

/// Deletes built template `key`'s entry (nothing if there is none).
pub fn remove_built(data_dir: &Path, key: &str) -> Result<()> {
    if !is_built_key(key) {
        return Ok(());
    }
    let dir = built_dir(data_dir, key);
    if dir.exists() {
        crate::fsutil::remove_tree(&dir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_keys_never_look_like_catalog_names() {
        assert!(is_built_key("b0123456789abcdef01234567"));
        for k in [
            "base",
            "code-interpreter-v1",
            "b0123",
            "B0123456789abcdef01234567",
            "b0123456789abcdef0123456z",
        ] {
            assert!(!is_built_key(k), "{k}");
        }
    }

    #[test]
    fn configs_written_before_the_shell_field_read_back() {
        let c: BuiltConfig = serde_json::from_str(r#"{"user":"user","parent":"base"}"#).unwrap();
        assert_eq!(c.shell, ["/bin/bash", "-l", "-c"]);
        assert!(c.start_cmd.is_none());
    }
}

//! `manifest.json`: the record of a finished build, and the marker that a cache entry is
//! complete. It is written last, inside the temporary build directory, before that directory
//! is renamed into place; so a cache directory either does not exist or has a manifest that
//! describes the image next to it.

use std::fs::{self, File};
use std::io::{Read as _, Write as _};
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{ImageError, Result};
use crate::recipe::{hex, Recipe};

/// File name of the manifest inside a cache entry.
pub const MANIFEST_FILE: &str = "manifest.json";
/// File name of the image inside a cache entry.
pub const IMAGE_FILE: &str = "rootfs.erofs";

/// What was built, from what, when, and how to check it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`crate::FORMAT_VERSION`] of the code that built it.
    pub format_version: u32,
    /// Recipe name.
    pub name: String,
    /// Full recipe hash (the cache key).
    pub recipe_hash: String,
    /// Image file name, relative to the manifest.
    pub image_file: String,
    /// Image size in bytes.
    pub image_size: u64,
    /// SHA-256 of the image file, for full integrity checks and for shipping the image to
    /// another host.
    pub image_sha256: String,
    /// When the build finished, RFC 3339 UTC.
    pub built_at: String,
    /// Wall-clock seconds the build took.
    pub build_seconds: f64,
    /// `mmdebstrap --version` of the builder.
    pub mmdebstrap_version: String,
    /// The recipe, in full, so an image can be explained without the code that made it.
    pub recipe: Recipe,
    /// Every installed package as `name=version`, sorted: what the recipe resolved to on the
    /// day it was built (the archive moves; the recipe hash does not).
    pub installed_packages: Vec<String>,
}

impl Manifest {
    /// Reads and parses a manifest.
    pub fn read(path: &Path) -> Result<Manifest> {
        let text = fs::read_to_string(path).map_err(ImageError::io("read", path))?;
        serde_json::from_str(&text).map_err(|e| ImageError::Manifest {
            path: path.to_owned(),
            reason: e.to_string(),
        })
    }

    /// Writes the manifest and fsyncs it.
    pub(crate) fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(|e| ImageError::Manifest {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        let mut file = File::create(path).map_err(ImageError::io("create", path))?;
        file.write_all(text.as_bytes())
            .and_then(|()| file.write_all(b"\n"))
            .and_then(|()| file.sync_all())
            .map_err(ImageError::io("write", path))
    }
}

/// SHA-256 of a file's contents, hex.
pub(crate) fn sha256_file(path: &Path) -> Result<String> {
    let mut file = File::open(path).map_err(ImageError::io("open", path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(ImageError::io("read", path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

/// Installed packages of a tree as sorted `name=version` (`name:arch=version` for foreign
/// architectures), read from its dpkg status database. Parsing the file directly keeps the
/// builder independent of the host's dpkg.
pub(crate) fn installed_packages(root: &Path) -> Result<Vec<String>> {
    let status_path = root.join("var/lib/dpkg/status");
    let status = fs::read_to_string(&status_path).map_err(ImageError::io("read", &status_path))?;
    Ok(parse_dpkg_status(&status))
}

fn parse_dpkg_status(status: &str) -> Vec<String> {
    let mut packages = Vec::new();
    for stanza in status.split("\n\n") {
        let (mut name, mut version, mut arch, mut installed) = (None, None, None, false);
        for line in stanza.lines() {
            if let Some(v) = line.strip_prefix("Package: ") {
                name = Some(v.trim());
            } else if let Some(v) = line.strip_prefix("Version: ") {
                version = Some(v.trim());
            } else if let Some(v) = line.strip_prefix("Architecture: ") {
                arch = Some(v.trim());
            } else if let Some(v) = line.strip_prefix("Status: ") {
                installed = v.trim().ends_with(" installed");
            }
        }
        if let (Some(name), Some(version), true) = (name, version, installed) {
            let native = matches!(arch, None | Some("all"))
                || arch == Some(crate::recipe::host_debian_arch());
            packages.push(match arch {
                Some(arch) if !native => format!("{name}:{arch}={version}"),
                _ => format!("{name}={version}"),
            });
        }
    }
    packages.sort();
    packages
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dpkg_status_lists_installed_packages_only() {
        let arch = crate::recipe::host_debian_arch();
        let status = format!(
            "Package: bash\nStatus: install ok installed\nArchitecture: {arch}\n\
             Version: 5.2.15-2+b7\nDescription: GNU shell\n more text\n\n\
             Package: removed\nStatus: deinstall ok config-files\nVersion: 1\n\n\
             Package: ca-certificates\nStatus: install ok installed\n\
             Architecture: all\nVersion: 20230311\n"
        );
        assert_eq!(
            parse_dpkg_status(&status),
            vec![
                "bash=5.2.15-2+b7".to_owned(),
                "ca-certificates=20230311".to_owned()
            ]
        );
    }
}

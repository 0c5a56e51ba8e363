//! Small filesystem helpers shared by the builder and the agent layer: durable writes, safe
//! recursive deletion, and mount-point detection.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use crate::error::{ImageError, Result};

/// fsyncs a file or directory. Renames are only durable once the directory holding them is
/// synced, and a cache entry must never survive a power cut as a name without its contents.
pub(crate) fn sync_path(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(ImageError::io("fsync", path))
}

/// Mount points at or below `dir`, from /proc/self/mountinfo.
pub(crate) fn mounts_under(dir: &Path) -> Result<Vec<String>> {
    let info_path = Path::new("/proc/self/mountinfo");
    let info = fs::read_to_string(info_path).map_err(ImageError::io("read", info_path))?;
    Ok(info
        .lines()
        // Field 5 is the mount point, with space, tab, newline and backslash octal-escaped.
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape_mountinfo)
        .filter(|mount_point| Path::new(mount_point).starts_with(dir))
        .collect())
}

fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b));
        if bytes[i] == b'\\' && octal {
            // Three octal digits never exceed 0o377 in practice; wrapping keeps a bogus one harmless.
            let value = (bytes[i + 1] - b'0')
                .wrapping_mul(64)
                .wrapping_add((bytes[i + 2] - b'0') * 8)
                .wrapping_add(bytes[i + 3] - b'0');
            out.push(value);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Deletes a directory tree, after making sure nothing is mounted inside it. A crashed build
/// could in principle leave /proc or a /dev bind mount in its tree, and a recursive delete
/// through those would hit the host.
pub(crate) fn remove_tree(dir: &Path) -> Result<()> {
    let canonical = match dir.canonicalize() {
        Ok(path) => path,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ImageError::io("resolve", dir)(e)),
    };
    let mounts = mounts_under(&canonical)?;
    if !mounts.is_empty() {
        return Err(ImageError::MountsInside {
            path: canonical,
            mounts,
        });
    }
    fs::remove_dir_all(&canonical).map_err(ImageError::io("remove directory tree", canonical))
}

/// `dir/name` for every entry of `dir`.
pub(crate) fn list_dir(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = fs::read_dir(dir).map_err(ImageError::io("list", dir))?;
    let mut paths = Vec::new();
    for entry in entries {
        paths.push(entry.map_err(ImageError::io("list", dir))?.path());
    }
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape_mountinfo(r"/var/tmp/a\040b"), "/var/tmp/a b");
        assert_eq!(unescape_mountinfo(r"/x\134y"), r"/x\y");
        assert_eq!(unescape_mountinfo(r"/plain"), "/plain");
        assert_eq!(unescape_mountinfo(r"/trailing\04"), r"/trailing\04");
    }

    #[test]
    fn root_has_mounts_under_it() {
        let mounts = mounts_under(Path::new("/")).expect("mountinfo is readable");
        assert!(mounts.iter().any(|m| m == "/"), "{mounts:?}");
    }
}

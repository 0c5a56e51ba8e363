//! File metadata: user key/value pairs stored as `user.e2b.<key>` extended attributes.
//!
//! `user.` is the only xattr class unprivileged files may carry; `e2b.` keeps our keys apart
//! from other tools' attributes. Uploads write it (`/files`), entries report it (`EntryInfo`).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use xattr::FileExt;

/// Namespace of the metadata attributes.
pub const XATTR_PREFIX: &str = "user.e2b.";

/// File metadata, ordered so responses are deterministic.
pub type Metadata = BTreeMap<String, String>;

/// Whether an xattr error means the filesystem has no (user) xattrs at all.
pub fn unsupported(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EOPNOTSUPP) || e.raw_os_error() == Some(libc::ENOTSUP)
}

/// The metadata stored on `path` (following symlinks). Empty when the filesystem has no xattrs.
pub fn read(path: &Path) -> io::Result<Metadata> {
    let mut out = Metadata::new();
    let names = match xattr::list_deref(path) {
        Ok(n) => n,
        Err(e) if unsupported(&e) => return Ok(out),
        Err(e) => return Err(e),
    };
    for name in names {
        let Some(key) = metadata_key(&name) else {
            continue;
        };
        // An attribute removed between list and get simply is not reported.
        if let Some(value) = xattr::get_deref(path, &name)? {
            out.insert(key, String::from_utf8_lossy(&value).into_owned());
        }
    }
    Ok(out)
}

/// Makes `metadata` the complete metadata of `path`: other `user.e2b.*` attributes are removed
/// (an overwritten file keeps its xattrs across `O_TRUNC`), other namespaces are untouched.
pub fn replace(path: &Path, metadata: &Metadata) -> io::Result<()> {
    let names = xattr::list_deref(path)?;
    for name in names {
        let Some(key) = metadata_key(&name) else {
            continue;
        };
        if !metadata.contains_key(&key) {
            match xattr::remove_deref(path, &name) {
                Ok(()) => {}
                // Already gone (a concurrent writer): that is the state we want.
                Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
                Err(e) => return Err(e),
            }
        }
    }
    for (key, value) in metadata {
        xattr::set_deref(path, format!("{XATTR_PREFIX}{key}"), value.as_bytes())?;
    }
    Ok(())
}

/// [`read`] through an open file: no path is looked up again.
pub fn read_fd(file: &File) -> io::Result<Metadata> {
    let mut out = Metadata::new();
    let names = match file.list_xattr() {
        Ok(n) => n,
        Err(e) if unsupported(&e) => return Ok(out),
        Err(e) => return Err(e),
    };
    for name in names {
        let Some(key) = metadata_key(&name) else {
            continue;
        };
        if let Some(value) = file.get_xattr(&name)? {
            out.insert(key, String::from_utf8_lossy(&value).into_owned());
        }
    }
    Ok(out)
}

/// [`replace`] through an open file, so a path swapped after the open cannot redirect it.
pub fn replace_fd(file: &File, metadata: &Metadata) -> io::Result<()> {
    for name in file.list_xattr()? {
        let Some(key) = metadata_key(&name) else {
            continue;
        };
        if !metadata.contains_key(&key) {
            match file.remove_xattr(&name) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
                Err(e) => return Err(e),
            }
        }
    }
    for (key, value) in metadata {
        file.set_xattr(format!("{XATTR_PREFIX}{key}"), value.as_bytes())?;
    }
    Ok(())
}

/// The metadata key of an attribute name, if it is in our namespace.
fn metadata_key(name: &OsStr) -> Option<String> {
    let rest = name.as_bytes().strip_prefix(XATTR_PREFIX.as_bytes())?;
    (!rest.is_empty()).then(|| String::from_utf8_lossy(rest).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch file on a filesystem with user xattrs: the temporary directory (tmpfs has
    /// them since Linux 6.6), else /var/tmp (disk-backed, ext4 on our hosts). `None` when
    /// neither has them.
    fn file_with_user_xattrs() -> Option<(std::path::PathBuf, std::path::PathBuf)> {
        for base in [std::env::temp_dir(), "/var/tmp".into()] {
            let dir = base.join(format!("warren-meta-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir_all(&dir).unwrap();
            let file = dir.join("f");
            std::fs::write(&file, b"").unwrap();
            match xattr::set(&file, "user.other", b"keep") {
                Ok(()) => return Some((dir, file)),
                Err(e) => {
                    assert!(unsupported(&e), "user xattr on {}: {e}", file.display());
                    std::fs::remove_dir_all(&dir).unwrap();
                }
            }
        }
        None
    }

    #[test]
    fn metadata_is_replaced_not_merged() {
        let Some((dir, file)) = file_with_user_xattrs() else {
            warren_testkit::skip("no user xattrs in the temporary directory or /var/tmp");
            return;
        };
        let map = |pairs: &[(&str, &str)]| -> Metadata {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        replace(&file, &map(&[("a", "1"), ("b", "2")])).unwrap();
        assert_eq!(read(&file).unwrap(), map(&[("a", "1"), ("b", "2")]));
        replace(&file, &map(&[("b", "3")])).unwrap();
        assert_eq!(read(&file).unwrap(), map(&[("b", "3")]));
        replace(&file, &Metadata::new()).unwrap();
        assert!(read(&file).unwrap().is_empty());
        let fd = File::options().write(true).open(&file).unwrap();
        replace_fd(&fd, &map(&[("c", "4")])).unwrap();
        assert_eq!(read_fd(&fd).unwrap(), map(&[("c", "4")]));
        replace_fd(&fd, &Metadata::new()).unwrap();
        assert!(read(&file).unwrap().is_empty());
        // Attributes outside our namespace are left alone.
        assert_eq!(
            xattr::get(&file, "user.other").unwrap().as_deref(),
            Some(&b"keep"[..])
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

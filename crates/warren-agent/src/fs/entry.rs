//! `EntryInfo` as envd 0.6.13 reports it.
//!
//! Most fields describe the entry itself (lstat): name, path, size, owner, group, mtime and the
//! Go-style permission string. For a symlink, `type` and `mode` describe the *target* and
//! `symlinkTarget` is the fully resolved path, because that is what the SDKs' tests expect.

use std::fs::{self, Metadata};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use warren_proto::filesystem::{EntryInfo, FileType};
use warren_proto::Timestamp;

use crate::users::UserDb;

/// The entry at `path`, without following a final symlink.
pub fn entry_info(path: &Path, users: &UserDb) -> io::Result<EntryInfo> {
    let meta = fs::symlink_metadata(path)?;
    Ok(entry_from_metadata(path, &meta, users))
}

/// Builds the entry for `path` from its lstat result.
pub fn entry_from_metadata(path: &Path, meta: &Metadata, users: &UserDb) -> EntryInfo {
    let (kind, mode, symlink_target) = if meta.file_type().is_symlink() {
        // An unresolvable link keeps its own path as target, like envd; the type then stays
        // unspecified, which makes `files.list` drop it.
        let target = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let (kind, mode) = match fs::metadata(&target) {
            Ok(t) => (file_type(&t), t.mode() & 0o777),
            Err(_) => (FileType::Unspecified, 0),
        };
        (kind, mode, Some(target.to_string_lossy().into_owned()))
    } else {
        (file_type(meta), meta.mode() & 0o777, None)
    };
    EntryInfo {
        name: base_name(path),
        r#type: kind as i32,
        path: path.to_string_lossy().into_owned(),
        size: meta.size() as i64,
        mode,
        permissions: permissions_string(meta.mode()),
        owner: users.user_name(meta.uid()),
        group: users.group_name(meta.gid()),
        modified_time: timestamp(meta.mtime(), meta.mtime_nsec()),
        symlink_target,
        // Unreadable metadata (no xattr support, a race) is reported as none.
        metadata: crate::fs::metadata::read(path)
            .unwrap_or_default()
            .into_iter()
            .collect(),
        // Left false on purpose: newer Python SDKs would turn it into FileType.SYMLINK, while
        // the published tests expect the target's type.
        is_symlink: false,
    }
}

fn file_type(meta: &Metadata) -> FileType {
    let ft = meta.file_type();
    if ft.is_file() {
        FileType::File
    } else if ft.is_dir() {
        FileType::Directory
    } else if ft.is_symlink() {
        FileType::Symlink
    } else {
        FileType::Unspecified
    }
}

/// Go's `filepath.Base`-like name: the last component, `/` for the root.
fn base_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "/".to_string())
}

/// A protobuf timestamp, or none for the zero time (as envd omits it).
fn timestamp(secs: i64, nanos: i64) -> Option<Timestamp> {
    if secs == 0 && nanos == 0 {
        return None;
    }
    Some(Timestamp {
        seconds: secs,
        nanos: nanos.clamp(0, 999_999_999) as i32,
    })
}

/// Renders a Unix `st_mode` the way Go's `os.FileMode.String()` does for the same file, e.g.
/// `-rw-r--r--`, `drwxr-xr-x`, `Lrwxrwxrwx`, `dtrwxrwxrwx` (sticky), `urwxr-xr-x` (setuid),
/// `Dcrw-rw-rw-` (character device).
pub fn permissions_string(st_mode: u32) -> String {
    const S_IFMT: u32 = 0o170000;
    let fmt = st_mode & S_IFMT;
    // Go's type/attribute letters in the order it prints them ("dalTLDpSugct?"); the ones a
    // Unix stat cannot produce (a, l, T, ?) are left out.
    let flags = [
        ('d', fmt == 0o040000),
        ('L', fmt == 0o120000),
        ('D', fmt == 0o060000 || fmt == 0o020000),
        ('p', fmt == 0o010000),
        ('S', fmt == 0o140000),
        ('u', st_mode & 0o4000 != 0),
        ('g', st_mode & 0o2000 != 0),
        ('c', fmt == 0o020000),
        ('t', st_mode & 0o1000 != 0),
    ];
    let mut out: String = flags.iter().filter(|f| f.1).map(|f| f.0).collect();
    if out.is_empty() {
        out.push('-');
    }
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        out.push(if st_mode & (1 << (8 - i)) != 0 {
            c
        } else {
            '-'
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permissions_like_go() {
        assert_eq!(permissions_string(0o100644), "-rw-r--r--");
        assert_eq!(permissions_string(0o040755), "drwxr-xr-x");
        assert_eq!(permissions_string(0o120777), "Lrwxrwxrwx");
        assert_eq!(permissions_string(0o041777), "dtrwxrwxrwx");
        assert_eq!(permissions_string(0o104755), "urwxr-xr-x");
        assert_eq!(permissions_string(0o102755), "grwxr-xr-x");
        assert_eq!(permissions_string(0o106755), "ugrwxr-xr-x");
        assert_eq!(permissions_string(0o020666), "Dcrw-rw-rw-");
        assert_eq!(permissions_string(0o060660), "Drw-rw----");
        assert_eq!(permissions_string(0o010644), "prw-r--r--");
        assert_eq!(permissions_string(0o140755), "Srwxr-xr-x");
        assert_eq!(permissions_string(0o100000), "----------");
    }

    #[test]
    fn names_and_timestamps() {
        assert_eq!(base_name(Path::new("/")), "/");
        assert_eq!(base_name(Path::new("/a/b.txt")), "b.txt");
        assert_eq!(timestamp(0, 0), None);
        assert_eq!(
            timestamp(5, 7),
            Some(Timestamp {
                seconds: 5,
                nanos: 7
            })
        );
    }

    #[test]
    fn entry_of_file_and_symlinks() {
        let dir = std::env::temp_dir().join(format!("warren-entry-{}", uuid::Uuid::new_v4()));
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("f.txt");
        fs::write(&file, b"hello").unwrap();
        let link = dir.join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let dangling = dir.join("dangling");
        std::os::unix::fs::symlink(dir.join("missing"), &dangling).unwrap();
        let db = UserDb::parse("root:x:0:0::/root:/bin/sh\n", "root:x:0:\n");

        let e = entry_info(&file, &db).unwrap();
        assert_eq!(e.name, "f.txt");
        assert_eq!(e.r#type, FileType::File as i32);
        assert_eq!(e.size, 5);
        assert!(e.symlink_target.is_none());
        assert!(e.modified_time.is_some());

        let l = entry_info(&link, &db).unwrap();
        assert_eq!(l.r#type, FileType::File as i32);
        assert!(l.permissions.starts_with('L'));
        let canon = fs::canonicalize(&file).unwrap();
        assert_eq!(l.symlink_target.as_deref(), canon.to_str());
        assert_eq!(l.mode, e.mode);

        let d = entry_info(&dangling, &db).unwrap();
        assert_eq!(d.r#type, FileType::Unspecified as i32);
        assert_eq!(d.mode, 0);
        assert_eq!(d.symlink_target.as_deref(), dangling.to_str());
        fs::remove_dir_all(&dir).unwrap();
    }
}

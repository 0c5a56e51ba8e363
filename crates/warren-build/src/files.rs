//! The files of COPY steps, uploaded once per team and content hash.
//!
//! ```text
//! <data_dir>/build-files/<team digest>/<files hash>.tar   checked, uncompressed
//! ```
//!
//! An upload is written to a temporary file (at most `max_bytes`), decompressed if it is
//! gzip (detected by its magic bytes, as the SDKs send `gzip=False` archives too), and
//! checked entry by entry before it is renamed into place: no absolute paths, no `..`, no
//! device files, no link whose target climbs out of the archive, and no entry written
//! through a symlink the archive itself made. A refused upload leaves nothing behind.

use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use warren_control::BuilderError;

/// Where COPY files live.
#[derive(Debug, Clone)]
pub struct FileStore {
    root: PathBuf,
    /// Largest upload accepted, compressed or not.
    max_bytes: u64,
    /// The data disk's reserve, which no upload eats into.
    reserve: crate::room::Reserve,
}

fn io_error(what: impl Into<String>) -> impl FnOnce(io::Error) -> BuilderError {
    let what = what.into();
    move |source| BuilderError::Io { what, source }
}

fn invalid(msg: impl Into<String>) -> BuilderError {
    BuilderError::Invalid(msg.into())
}

impl FileStore {
    pub fn new(data_dir: &Path, max_bytes: u64) -> FileStore {
        FileStore {
            root: data_dir.join("build-files"),
            max_bytes,
            reserve: crate::room::Reserve::new(data_dir.to_path_buf(), 0),
        }
    }

    /// Keeps `bytes` of the data disk free: an upload that would leave less is refused
    /// ([`BuilderError::NoSpace`]) and what it wrote removed.
    pub fn with_reserve(mut self, bytes: u64) -> FileStore {
        self.reserve = crate::room::Reserve::new(
            self.root.parent().unwrap_or(&self.root).to_path_buf(),
            bytes,
        );
        self
    }

    fn team_dir(&self, team: &str) -> PathBuf {
        // Team names are free text; their digest is a safe directory name.
        let digest = Sha256::digest(team.as_bytes());
        let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        self.root.join(hex)
    }

    /// The checked archive of `hash` for `team`.
    pub fn path(&self, team: &str, hash: &str) -> PathBuf {
        self.team_dir(team).join(format!("{hash}.tar"))
    }

    pub fn has(&self, team: &str, hash: &str) -> bool {
        self.path(team, hash).is_file()
    }

    /// Stores an upload: see the module's description.
    pub async fn put(
        &self,
        team: &str,
        hash: &str,
        mut body: Box<dyn AsyncRead + Send + Unpin>,
    ) -> Result<(), BuilderError> {
        let dir = self.team_dir(team);
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(io_error(format!("create {}", dir.display())))?;
        let raw = dir.join(format!(".upload-{hash}-{}", std::process::id()));
        let result = async {
            let mut out = tokio::fs::File::create(&raw)
                .await
                .map_err(io_error(format!("create {}", raw.display())))?;
            let mut buf = vec![0u8; 256 * 1024];
            let (mut total, mut next_check) = (0u64, 0u64);
            loop {
                let n = body
                    .read(&mut buf)
                    .await
                    .map_err(io_error("read the upload"))?;
                if n == 0 {
                    break;
                }
                // Checked before the first write and at every 16 MiB after it.
                if total >= next_check {
                    self.reserve
                        .check("the upload", ROOM_EVERY)
                        .map_err(BuilderError::NoSpace)?;
                    next_check = total + ROOM_EVERY;
                }
                total += n as u64;
                if total > self.max_bytes {
                    return Err(BuilderError::TooLarge(format!(
                        "the upload is larger than {} bytes",
                        self.max_bytes
                    )));
                }
                out.write_all(&buf[..n])
                    .await
                    .map_err(io_error(format!("write {}", raw.display())))?;
            }
            out.flush().await.map_err(io_error("flush the upload"))?;
            drop(out);
            // The checked copy can be as large as the upload (larger when it was gzip).
            self.reserve
                .check("the unpacked upload", total)
                .map_err(BuilderError::NoSpace)?;
            let (raw2, dest, max) = (raw.clone(), self.path(team, hash), self.max_bytes);
            tokio::task::spawn_blocking(move || normalise(&raw2, &dest, max))
                .await
                .map_err(|e| io_error("check the upload")(io::Error::other(e.to_string())))?
        }
        .await;
        let _ = tokio::fs::remove_file(&raw).await;
        result
    }
}

/// How often (in bytes written) an upload checks the disk's reserve.
const ROOM_EVERY: u64 = 16 << 20;

/// A reader that fails once more than `left` bytes went through it.
struct Capped<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            return Err(io::Error::new(io::ErrorKind::FileTooLarge, "too large"));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Decompresses (if gzip) `raw` into a checked tar at `dest`.
fn normalise(raw: &Path, dest: &Path, max: u64) -> Result<(), BuilderError> {
    let mut magic = [0u8; 2];
    let gz = std::fs::File::open(raw)
        .and_then(|mut f| f.read(&mut magic))
        .map_err(io_error(format!("read {}", raw.display())))?
        == 2
        && magic == [0x1f, 0x8b];
    let tmp = dest.with_extension("tar.part");
    let result = (|| {
        let file = std::fs::File::open(raw).map_err(io_error(format!("open {}", raw.display())))?;
        let reader: Box<dyn Read> = if gz {
            Box::new(flate2::read::GzDecoder::new(file))
        } else {
            Box::new(file)
        };
        let mut capped = Capped {
            inner: reader,
            left: max,
        };
        let mut out =
            std::fs::File::create(&tmp).map_err(io_error(format!("create {}", tmp.display())))?;
        match io::copy(&mut capped, &mut out) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::FileTooLarge => {
                return Err(BuilderError::TooLarge(format!(
                    "the upload unpacks to more than {max} bytes"
                )))
            }
            Err(e) => return Err(invalid(format!("the upload is not a valid archive: {e}"))),
        }
        out.sync_all()
            .map_err(io_error(format!("sync {}", tmp.display())))?;
        check_archive(&tmp)?;
        std::fs::rename(&tmp, dest).map_err(io_error(format!("rename {}", tmp.display())))?;
        if let Some(dir) = dest.parent() {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io_error(format!("sync {}", dir.display())))?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// `path` made of normal components only, or why not.
fn relative_inside(path: &Path) -> Result<PathBuf, String> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!("{} is an absolute path", path.display()))
            }
            Component::ParentDir => return Err(format!("{} contains '..'", path.display())),
        }
    }
    Ok(out)
}

/// Whether a link at `link` (inside the archive) pointing at `target` stays inside it.
fn link_stays_inside(link: &Path, target: &Path) -> bool {
    if target.is_absolute() {
        // Resolved inside the sandbox, against its own root: not an escape from the archive's
        // target on the host, and common in real contexts (`python -> /usr/bin/python3`).
        return true;
    }
    let mut depth: i64 = link.components().count() as i64 - 1;
    for c in target.components() {
        match c {
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            _ => {}
        }
        if depth < 0 {
            return false;
        }
    }
    true
}

/// Checks every entry of a tar (see the module's description).
pub(crate) fn check_archive(tar_path: &Path) -> Result<(), BuilderError> {
    let file =
        std::fs::File::open(tar_path).map_err(io_error(format!("open {}", tar_path.display())))?;
    let mut archive = tar::Archive::new(file);
    let mut symlinks: Vec<PathBuf> = Vec::new();
    let entries = archive
        .entries()
        .map_err(|e| invalid(format!("the upload is not a tar archive: {e}")))?;
    for entry in entries {
        let entry = entry.map_err(|e| invalid(format!("the upload is not a valid tar: {e}")))?;
        let raw = entry
            .path()
            .map_err(|e| invalid(format!("an entry has an unreadable name: {e}")))?
            .into_owned();
        let path = relative_inside(&raw).map_err(|m| invalid(format!("refused entry: {m}")))?;
        if let Some(link) = symlinks.iter().find(|l| path.starts_with(l) && path != **l) {
            return Err(invalid(format!(
                "refused entry: {} would be written through the symlink {}",
                path.display(),
                link.display()
            )));
        }
        let kind = entry.header().entry_type();
        match kind {
            tar::EntryType::Regular
            | tar::EntryType::Continuous
            | tar::EntryType::Directory
            | tar::EntryType::GNUSparse => {}
            tar::EntryType::Symlink | tar::EntryType::Link => {
                let target = entry
                    .link_name()
                    .map_err(|e| invalid(format!("unreadable link target: {e}")))?
                    .ok_or_else(|| invalid(format!("link {} has no target", path.display())))?;
                let inside = if kind == tar::EntryType::Link {
                    relative_inside(&target).is_ok()
                } else {
                    link_stays_inside(&path, &target)
                };
                if !inside {
                    return Err(invalid(format!(
                        "refused entry: the link {} -> {} points outside the archive",
                        path.display(),
                        target.display()
                    )));
                }
                if kind == tar::EntryType::Symlink {
                    symlinks.push(path.clone());
                }
            }
            other => {
                return Err(invalid(format!(
                    "refused entry: {} is a {other:?}, not a file, directory or link",
                    path.display()
                )))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_of(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        b.into_inner().unwrap()
    }

    fn file(b: &mut tar::Builder<Vec<u8>>, name: &str, data: &[u8]) {
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        // `set_path` refuses `..`; write the raw name so hostile archives can be made.
        let name_bytes = name.as_bytes();
        h.as_old_mut().name[..name_bytes.len()].copy_from_slice(name_bytes);
        h.set_cksum();
        b.append(&h, data).unwrap();
    }

    fn link(b: &mut tar::Builder<Vec<u8>>, name: &str, target: &str) {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        h.set_path(name).unwrap();
        let t = target.as_bytes();
        h.as_old_mut().linkname[..t.len()].copy_from_slice(t);
        h.set_cksum();
        b.append(&h, &[][..]).unwrap();
    }

    fn check(bytes: &[u8]) -> Result<(), BuilderError> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.tar");
        std::fs::write(&p, bytes).unwrap();
        check_archive(&p)
    }

    #[test]
    fn ordinary_archives_pass() {
        let t = tar_of(|b| {
            file(b, "app/main.py", b"print(1)");
            link(b, "app/link.py", "main.py");
            link(b, "app/py", "/usr/bin/python3");
        });
        check(&t).unwrap();
    }

    #[test]
    fn hostile_archives_are_refused_with_the_reason() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (tar_of(|b| file(b, "../evil", b"x")), "contains '..'"),
            (tar_of(|b| file(b, "/etc/passwd", b"x")), "absolute path"),
            (tar_of(|b| link(b, "up", "../../etc")), "points outside"),
            (
                tar_of(|b| {
                    link(b, "d", "sub");
                    file(b, "d/x", b"x");
                }),
                "written through the symlink",
            ),
            (
                b"not a tar at all, just some bytes".repeat(20),
                "not a valid",
            ),
        ];
        for (bytes, want) in cases {
            let err = check(&bytes).unwrap_err().to_string();
            assert!(err.contains(want), "{err:?} lacks {want:?}");
        }
    }

    #[tokio::test]
    async fn uploads_are_decompressed_capped_and_leave_nothing_when_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path(), 64 * 1024);
        let plain = tar_of(|b| file(b, "a.txt", b"hello"));
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        io::Write::write_all(&mut gz, &plain).unwrap();
        let gz = gz.finish().unwrap();
        let h = "a".repeat(64);
        store
            .put("t", &h, Box::new(io::Cursor::new(gz)))
            .await
            .unwrap();
        assert!(store.has("t", &h));
        assert!(!store.has("other-team", &h));
        let stored = std::fs::read(store.path("t", &h)).unwrap();
        assert_eq!(stored, plain, "stored uncompressed");

        let big = tar_of(|b| file(b, "big", &vec![0u8; 100 * 1024]));
        let h2 = "b".repeat(64);
        let err = store.put("t", &h2, Box::new(io::Cursor::new(big))).await;
        assert!(matches!(err, Err(BuilderError::TooLarge(_))), "{err:?}");
        // A disk without room for the reserve: refused with the numbers, nothing kept.
        let full = FileStore::new(dir.path(), 64 * 1024).with_reserve(u64::MAX / 2);
        let small = tar_of(|b| file(b, "s.txt", b"small"));
        let h4 = "d".repeat(64);
        let err = full.put("t", &h4, Box::new(io::Cursor::new(small))).await;
        match err {
            Err(BuilderError::NoSpace(m)) => assert!(m.contains("free"), "{m}"),
            other => panic!("an upload into the reserve: {other:?}"),
        }
        let h3 = "c".repeat(64);
        let evil = tar_of(|b| file(b, "../x", b"x"));
        assert!(store
            .put("t", &h3, Box::new(io::Cursor::new(evil)))
            .await
            .is_err());
        let left: Vec<_> = std::fs::read_dir(store.team_dir("t"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(
            left,
            [format!("{h}.tar")],
            "nothing left of refused uploads"
        );
    }
}

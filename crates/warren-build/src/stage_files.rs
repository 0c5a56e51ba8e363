//! Files out of a finished image, for `COPY --from=<stage>`: the image's erofs is mounted
//! read-only in the private mount namespace of a child process (so the mount never shows in
//! the host's table and goes away with the child, whatever happens here), read through
//! `/proc/<child>/root`, and the requested paths are packed into a tar that the step then
//! copies into the build sandbox the way COPY copies uploaded files.
//!
//! The image is the user's: a symlink in it must not lead out of it. Every path is resolved
//! component by component inside the image's root (an absolute link target starts again at
//! that root, `..` stops there), as a chroot would, and the tar stores links as links, never
//! following them. The mount is read-only, so nothing changes between the check and the read.

use std::io::{BufRead, BufReader};
use std::path::{Component, Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Most symlinks one path may pass through (Linux's own limit).
const MAX_LINKS: usize = 40;

/// A mounted image, unmounted when dropped (the child's stdin closes and it exits).
struct Mounted {
    child: Child,
    root: PathBuf,
    dir: PathBuf,
}

impl Mounted {
    fn new(image: &Path, dir: &Path) -> Result<Mounted, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let mut child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c"])
            .arg(r#"mount -t erofs -o ro,loop,nodev,nosuid "$1" "$2" && echo mounted && read _"#)
            .arg("stage-files")
            .arg(image)
            .arg(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("unshare (to mount {}): {e}", image.display()))?;
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            let _ = BufReader::new(out).read_line(&mut line);
        }
        if line.trim() != "mounted" {
            let out = child.wait_with_output().map_err(|e| e.to_string())?;
            return Err(format!(
                "mounting the stage's image {}: {}",
                image.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let root = PathBuf::from(format!("/proc/{}/root", child.id())).join(
            dir.strip_prefix("/")
                .map_err(|_| format!("{} is not absolute", dir.display()))?,
        );
        Ok(Mounted {
            child,
            root,
            dir: dir.to_path_buf(),
        })
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// `path` (absolute in the image, or relative to its root) resolved inside `root`, every
/// symlink followed as it would be with `root` as `/`.
pub(crate) fn resolve_in(root: &Path, path: &str) -> Result<PathBuf, String> {
    let mut todo: Vec<String> = path
        .split('/')
        .filter(|p| !p.is_empty())
        .rev()
        .map(str::to_string)
        .collect();
    let mut at: Vec<String> = Vec::new();
    let mut links = 0;
    while let Some(part) = todo.pop() {
        match part.as_str() {
            "." => continue,
            ".." => {
                at.pop();
                continue;
            }
            _ => {}
        }
        let here = at
            .iter()
            .fold(root.to_path_buf(), |p, c| p.join(c))
            .join(&part);
        let meta = std::fs::symlink_metadata(&here)
            .map_err(|e| format!("{path}: not found in the stage ({e})"))?;
        if !meta.file_type().is_symlink() {
            at.push(part);
            continue;
        }
        links += 1;
        if links > MAX_LINKS {
            return Err(format!("{path}: too many levels of symbolic links"));
        }
        let target = std::fs::read_link(&here).map_err(|e| format!("{path}: {e}"))?;
        if target.is_absolute() {
            at.clear();
        }
        let mut parts: Vec<String> = Vec::new();
        for c in target.components() {
            match c {
                Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
                Component::ParentDir => parts.push("..".into()),
                _ => {}
            }
        }
        todo.extend(parts.into_iter().rev());
    }
    Ok(at.iter().fold(root.to_path_buf(), |p, c| p.join(c)))
}

/// The name a source has in the tar (and so the prefix COPY reads): relative, `.` for the root.
pub(crate) fn archive_name(src: &str) -> String {
    let parts: Vec<&str> = src
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.is_empty() {
        ".".into()
    } else {
        parts.join("/")
    }
}

fn pack(root: &Path, src: &str, out: &Path) -> Result<(), String> {
    let found = resolve_in(root, src)?;
    let meta = std::fs::metadata(&found).map_err(|e| format!("{src}: {e}"))?;
    let file = std::fs::File::create(out).map_err(|e| format!("create {}: {e}", out.display()))?;
    let mut tar = tar::Builder::new(std::io::BufWriter::new(file));
    tar.follow_symlinks(false);
    let name = archive_name(src);
    let r = if meta.is_dir() {
        tar.append_dir_all(&name, &found)
    } else {
        tar.append_path_with_name(&found, &name)
    };
    r.and_then(|_| tar.into_inner().map(|_| ()))
        .map_err(|e| format!("packing {src} from the stage: {e}"))
}

/// Packs each of `srcs` from the erofs `image` into a tar of its own under `work` (one per
/// source, named by its index), each entry under [`archive_name`] of its source. Needs root.
pub(crate) fn pack_from_image(
    image: &Path,
    srcs: &[String],
    work: &Path,
) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(work).map_err(|e| format!("create {}: {e}", work.display()))?;
    let mounted = Mounted::new(image, &work.join("mnt"))?;
    let mut out = Vec::new();
    for (i, src) in srcs.iter().enumerate() {
        let tar = work.join(format!("{i}.tar"));
        pack(&mounted.root, src, &tar)?;
        out.push(tar);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn links_resolve_inside_the_root_never_above_it() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        std::fs::create_dir_all(root.join("usr/lib")).unwrap();
        std::fs::write(root.join("usr/lib/x"), "x").unwrap();
        symlink("usr/lib", root.join("lib")).unwrap();
        symlink("/etc", root.join("escape")).unwrap();
        symlink("../../../../etc", root.join("usr/climb")).unwrap();
        symlink("loop", root.join("loop")).unwrap();
        assert_eq!(resolve_in(root, "/lib/x").unwrap(), root.join("usr/lib/x"));
        // An absolute target starts again at the image's root: /etc of the image, not the host's.
        assert!(resolve_in(root, "/escape/passwd")
            .unwrap_err()
            .contains("not found in the stage"));
        assert!(resolve_in(root, "usr/climb/passwd")
            .unwrap_err()
            .contains("not found"));
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::write(root.join("etc/passwd"), "mine").unwrap();
        assert_eq!(
            resolve_in(root, "/escape/passwd").unwrap(),
            root.join("etc/passwd")
        );
        assert_eq!(
            resolve_in(root, "/../../usr/climb/passwd").unwrap(),
            root.join("etc/passwd")
        );
        assert!(resolve_in(root, "loop")
            .unwrap_err()
            .contains("too many levels"));
        assert_eq!(resolve_in(root, "/").unwrap(), root.to_path_buf());
    }

    #[test]
    fn tars_keep_links_as_links() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        std::fs::create_dir_all(root.join("out")).unwrap();
        std::fs::write(root.join("out/a"), "a").unwrap();
        symlink("/etc/passwd", root.join("out/pw")).unwrap();
        let tar = d.path().join("o.tar");
        pack(&root, "/out", &tar).unwrap();
        let mut ar = tar::Archive::new(std::fs::File::open(&tar).unwrap());
        let mut seen = Vec::new();
        for e in ar.entries().unwrap() {
            let e = e.unwrap();
            let p = e.path().unwrap().to_string_lossy().into_owned();
            seen.push((
                p,
                e.header().entry_type().is_symlink(),
                e.header().size().unwrap(),
            ));
        }
        seen.sort();
        assert!(seen.contains(&("out/a".into(), false, 1)), "{seen:?}");
        assert!(seen.contains(&("out/pw".into(), true, 0)), "{seen:?}");
        assert_eq!(archive_name("/"), ".");
        assert_eq!(archive_name("/out/./bin/"), "out/bin");
    }
}

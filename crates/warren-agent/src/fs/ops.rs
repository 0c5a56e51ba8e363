//! The unary filesystem operations: Stat, MakeDir, Move, ListDir and Remove.
//!
//! Everything here is blocking `std::fs` work; the service runs it with the caller's filesystem
//! identity (`identity::run_as`), so the kernel checks every step as it would for the caller,
//! and directories created are the caller's. Paths arrive raw from the client and are resolved
//! once per call against the run-as user.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use warren_proto::filesystem::*;

use super::entry::{entry_from_metadata, entry_info};
use crate::paths;
use crate::users::{User, UserDb};
use warren_proto::connect::{Code, ConnectError};
use warren_proto::server::RpcResult;

/// Who is calling and how their paths resolve.
#[derive(Debug, Clone)]
pub struct Caller {
    pub user: User,
    pub default_workdir: Option<PathBuf>,
}

impl Caller {
    /// Absolute, lexically cleaned path of a client-supplied one (§3.1 rules).
    pub fn resolve(&self, raw: &str) -> PathBuf {
        paths::resolve(raw, &self.user, self.default_workdir.as_deref())
    }
}

pub fn stat(caller: &Caller, req: StatRequest) -> RpcResult<StatResponse> {
    let path = caller.resolve(&req.path);
    let entry = entry_info(&path, &UserDb::load())
        .map_err(|e| lookup_error(&e, "file not found", &path))?;
    Ok(StatResponse { entry: Some(entry) })
}

pub fn make_dir(caller: &Caller, req: MakeDirRequest) -> RpcResult<MakeDirResponse> {
    let path = caller.resolve(&req.path);
    match fs::metadata(&path) {
        Ok(m) if m.is_dir() => {
            return Err(ConnectError::new(
                Code::AlreadyExists,
                format!("directory already exists: {}", path.display()),
            ))
        }
        Ok(_) => {
            return Err(ConnectError::invalid_argument(format!(
                "path already exists but it is not a directory: {}",
                path.display()
            )))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_error(&e, format!("error reading {}", path.display()))),
    }
    super::identity::open_dirs(&path)
        .map_err(|e| io_error(&e, format!("error creating directory {}", path.display())))?;
    let entry = entry_info(&path, &UserDb::load())
        .map_err(|e| lookup_error(&e, "file not found", &path))?;
    Ok(MakeDirResponse { entry: Some(entry) })
}

pub fn move_entry(caller: &Caller, req: MoveRequest) -> RpcResult<MoveResponse> {
    let source = caller.resolve(&req.source);
    let destination = caller.resolve(&req.destination);
    // Checked up front so a missing source is reported as such rather than as a rename error
    // that could equally be about the destination.
    fs::symlink_metadata(&source).map_err(|e| lookup_error(&e, "source not found", &source))?;
    if let Some(parent) = destination.parent() {
        super::identity::open_dirs(parent)
            .map_err(|e| io_error(&e, format!("error creating directory {}", parent.display())))?;
    }
    fs::rename(&source, &destination).map_err(|e| {
        let what = format!(
            "error moving {} to {}",
            source.display(),
            destination.display()
        );
        io_error(&e, what)
    })?;
    let entry = entry_info(&destination, &UserDb::load())
        .map_err(|e| lookup_error(&e, "file not found", &destination))?;
    Ok(MoveResponse { entry: Some(entry) })
}

pub fn remove(caller: &Caller, req: RemoveRequest) -> RpcResult<RemoveResponse> {
    let path = caller.resolve(&req.path);
    // `rm -rf /` is refused by coreutils too; in a sandbox it would only destroy the sandbox.
    if path == Path::new("/") {
        return Err(ConnectError::invalid_argument(
            "refusing to remove the root directory",
        ));
    }
    let meta = match fs::symlink_metadata(&path) {
        Ok(m) => m,
        // rm -rf semantics: a path that does not (or cannot) exist is already removed.
        Err(e) if is_absent(&e) => return Ok(RemoveResponse {}),
        Err(e) => return Err(io_error(&e, format!("error removing {}", path.display()))),
    };
    // A symlink is removed itself, never what it points to.
    let result = if meta.is_dir() {
        fs::remove_dir_all(&path)
    } else {
        fs::remove_file(&path)
    };
    match result {
        Ok(()) => Ok(RemoveResponse {}),
        Err(e) if is_absent(&e) => Ok(RemoveResponse {}),
        Err(e) => Err(io_error(&e, format!("error removing {}", path.display()))),
    }
}

pub fn list_dir(caller: &Caller, req: ListDirRequest) -> RpcResult<ListDirResponse> {
    let requested = caller.resolve(&req.path);
    let depth = req.depth.max(1);
    // The walk happens in the resolved directory, but entries are reported under the requested
    // path, as envd does.
    let resolved = fs::canonicalize(&requested).map_err(|e| {
        if e.raw_os_error() == Some(libc::ELOOP) {
            ConnectError::new(
                Code::FailedPrecondition,
                format!(
                    "cyclic symlink or too many levels of symlinks at {}",
                    requested.display()
                ),
            )
        } else {
            lookup_error(&e, "directory not found", &requested)
        }
    })?;
    let meta =
        fs::metadata(&resolved).map_err(|e| lookup_error(&e, "directory not found", &requested))?;
    if !meta.is_dir() {
        return Err(ConnectError::invalid_argument(format!(
            "path is not a directory: {}",
            requested.display()
        )));
    }
    let entries = walk(&resolved, &requested, depth, &UserDb::load())?;
    Ok(ListDirResponse { entries })
}

/// A pending item of the walk: where it really is, how it is reported, how deep it sits.
struct Pending {
    real: PathBuf,
    shown: PathBuf,
    meta: fs::Metadata,
    depth: u32,
}

/// Depth-first pre-order walk in lexical name order (Go's `filepath.WalkDir` order), not
/// following symlinks, down to `max_depth` levels below `root`.
fn walk(
    root: &Path,
    shown_root: &Path,
    max_depth: u32,
    users: &UserDb,
) -> RpcResult<Vec<EntryInfo>> {
    let mut out = Vec::new();
    let mut stack: Vec<Pending> = Vec::new();
    push_children(&mut stack, root, shown_root, 1)?;
    while let Some(item) = stack.pop() {
        out.push(entry_from_metadata(&item.shown, &item.meta, users));
        if item.meta.is_dir() && item.depth < max_depth {
            push_children(&mut stack, &item.real, &item.shown, item.depth + 1)?;
        }
    }
    Ok(out)
}

/// Pushes the children of `dir` in reverse name order so they pop in name order.
fn push_children(stack: &mut Vec<Pending>, dir: &Path, shown: &Path, depth: u32) -> RpcResult<()> {
    let read_err = |e: io::Error| {
        ConnectError::internal(format!("error reading directory {}: {e}", shown.display()))
    };
    let iter = match fs::read_dir(dir) {
        Ok(it) => it,
        // Removed while we walked: it simply has no children any more.
        Err(e) if is_absent(&e) => return Ok(()),
        Err(e) => return Err(read_err(e)),
    };
    let mut children = Vec::new();
    for entry in iter {
        let entry = entry.map_err(read_err)?;
        // `DirEntry::metadata` does not follow symlinks, i.e. it is the lstat envd reports.
        let meta = match entry.metadata() {
            Ok(m) => m,
            Err(e) if is_absent(&e) => continue,
            Err(e) => return Err(read_err(e)),
        };
        children.push((entry.file_name(), meta));
    }
    children.sort_by(|a, b| b.0.cmp(&a.0));
    for (name, meta) in children {
        stack.push(Pending {
            real: dir.join(&name),
            shown: shown.join(&name),
            meta,
            depth,
        });
    }
    Ok(())
}

/// Whether an error means "there is nothing at that path" (including a parent being a file).
fn is_absent(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

/// A failed lookup of `path`: `not_found` with `missing` when nothing is there (a file in
/// place of a parent directory counts as nothing), else as `io_error`.
fn lookup_error(e: &io::Error, missing: &str, path: &Path) -> ConnectError {
    if is_absent(e) {
        ConnectError::not_found(format!("{missing}: {}", path.display()))
    } else {
        io_error(e, format!("error reading {}", path.display()))
    }
}

/// Maps an I/O error to a Connect error whose code follows the error kind; the message is
/// `what: <os error>`.
pub fn io_error(e: &io::Error, what: impl std::fmt::Display) -> ConnectError {
    use io::ErrorKind as K;
    let code = match e.kind() {
        K::NotFound => Code::NotFound,
        K::PermissionDenied => Code::PermissionDenied,
        K::AlreadyExists => Code::AlreadyExists,
        K::NotADirectory | K::IsADirectory | K::InvalidInput | K::InvalidFilename => {
            Code::InvalidArgument
        }
        K::DirectoryNotEmpty | K::CrossesDevices | K::ReadOnlyFilesystem => {
            Code::FailedPrecondition
        }
        _ => Code::Internal,
    };
    ConnectError::new(code, format!("{what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch() -> PathBuf {
        let d = std::env::temp_dir().join(format!("warren-ops-{}", uuid::Uuid::new_v4()));
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn caller() -> Caller {
        Caller {
            user: User {
                name: "root".into(),
                uid: nix::unistd::getuid().as_raw(),
                gid: nix::unistd::getgid().as_raw(),
                home: "/root".into(),
                shell: "/bin/sh".into(),
                groups: vec![],
            },
            default_workdir: None,
        }
    }

    fn names(entries: &[EntryInfo]) -> Vec<&str> {
        entries.iter().map(|e| e.path.as_str()).collect()
    }

    #[test]
    fn walk_is_preorder_lexical_and_depth_limited() {
        let d = scratch();
        for p in ["b/y", "b/x/deep", "a"] {
            fs::create_dir_all(d.join(p)).unwrap();
        }
        fs::write(d.join("c.txt"), b"").unwrap();
        let c = caller();
        let list = |depth| {
            list_dir(
                &c,
                ListDirRequest {
                    path: d.display().to_string(),
                    depth,
                },
            )
            .unwrap()
            .entries
        };
        let root = d.display().to_string();
        let rel =
            |v: Vec<&str>| -> Vec<String> { v.iter().map(|s| format!("{root}/{s}")).collect() };
        assert_eq!(names(&list(0)), rel(vec!["a", "b", "c.txt"]));
        assert_eq!(names(&list(2)), rel(vec!["a", "b", "b/x", "b/y", "c.txt"]));
        assert_eq!(
            names(&list(9)),
            rel(vec!["a", "b", "b/x", "b/x/deep", "b/y", "c.txt"])
        );
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn error_codes() {
        let d = scratch();
        let c = caller();
        let file = d.join("f");
        fs::write(&file, b"x").unwrap();
        let missing = stat(
            &c,
            StatRequest {
                path: d.join("nope").display().to_string(),
            },
        );
        assert_eq!(missing.unwrap_err().code, Code::NotFound);
        let not_dir = list_dir(
            &c,
            ListDirRequest {
                path: file.display().to_string(),
                depth: 1,
            },
        );
        assert_eq!(not_dir.unwrap_err().code, Code::InvalidArgument);
        let a = d.join("loop-a");
        let b = d.join("loop-b");
        std::os::unix::fs::symlink(&b, &a).unwrap();
        std::os::unix::fs::symlink(&a, &b).unwrap();
        let cyclic = list_dir(
            &c,
            ListDirRequest {
                path: a.display().to_string(),
                depth: 1,
            },
        );
        assert_eq!(cyclic.unwrap_err().code, Code::FailedPrecondition);
        let exists = make_dir(
            &c,
            MakeDirRequest {
                path: d.display().to_string(),
            },
        );
        assert_eq!(exists.unwrap_err().code, Code::AlreadyExists);
        let over_file = make_dir(
            &c,
            MakeDirRequest {
                path: file.display().to_string(),
            },
        );
        assert_eq!(over_file.unwrap_err().code, Code::InvalidArgument);
        let under_file = make_dir(
            &c,
            MakeDirRequest {
                path: file.join("x").display().to_string(),
            },
        );
        assert_eq!(under_file.unwrap_err().code, Code::InvalidArgument);
        let mv = move_entry(
            &c,
            MoveRequest {
                source: d.join("nope").display().to_string(),
                destination: d.join("x").display().to_string(),
            },
        );
        assert_eq!(mv.unwrap_err().code, Code::NotFound);
        assert!(remove(
            &c,
            RemoveRequest {
                path: file.join("x").display().to_string()
            }
        )
        .is_ok());
        assert_eq!(
            remove(&c, RemoveRequest { path: "/".into() })
                .unwrap_err()
                .code,
            Code::InvalidArgument
        );
        fs::remove_dir_all(&d).unwrap();
    }
}

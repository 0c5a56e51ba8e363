//! `warren-nfsd`: the NFS helper of one microVM, started by the vm runtime.
//!
//! ```text
//! warren-nfsd --key-file PATH [--export PATH ROOT SUBPATH ro|rw]... < listening socket
//! ```
//!
//! Standard input is a TCP socket already listening (made by the runtime inside the VM's
//! network namespace, so the guest's connections queue there even before this process
//! accepts them). Each export serves `ROOT` (a volume's filesystem), or the directory
//! `SUBPATH` beneath it (empty: the root) resolved with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)`: the volume is shared with
//! other sandboxes, and a link planted on the way fails the start instead of exporting
//! whatever it names. The key file holds the 32-byte key that seals file handles (the same
//! for every VM of a host and across restarts, so a restored guest's handles stay valid).
//! Once every export is open the helper writes `ready` to standard output, then serves until
//! it is killed. Errors go to standard error.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;

use rustix::fs::{Mode, OFlags, ResolveFlags};
use warren_nfs::{Export, Server};

/// An export as given on the command line.
struct Arg {
    path: String,
    root: PathBuf,
    subpath: String,
    read_only: bool,
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<(PathBuf, Vec<Arg>), String> {
    let usage = "usage: warren-nfsd --key-file PATH [--export PATH ROOT SUBPATH ro|rw]...";
    let mut key = None;
    let mut exports = Vec::new();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--key-file" => key = Some(PathBuf::from(args.next().ok_or(usage)?)),
            "--export" => {
                let path = args.next().ok_or(usage)?;
                let root = PathBuf::from(args.next().ok_or(usage)?);
                let subpath = args.next().ok_or(usage)?;
                let read_only = match args.next().as_deref() {
                    Some("ro") => true,
                    Some("rw") => false,
                    _ => return Err(usage.into()),
                };
                exports.push(Arg {
                    path,
                    root,
                    subpath,
                    read_only,
                });
            }
            _ => return Err(usage.into()),
        }
    }
    Ok((key.ok_or(usage)?, exports))
}

fn read_key(path: &std::path::Path) -> Result<[u8; 32], String> {
    let mut f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut key = [0u8; 32];
    f.read_exact(&mut key)
        .map_err(|e| format!("{}: {e} (want 32 bytes)", path.display()))?;
    Ok(key)
}

/// The directory an export serves, open (`O_PATH`), and the path it can be opened by.
fn resolve(a: &Arg) -> Result<(OwnedFd, PathBuf), String> {
    let what = |e: rustix::io::Errno| format!("export {}: {}: {e}", a.path, a.root.display());
    let root = rustix::fs::open(
        &a.root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(what)?;
    let dir = if a.subpath.is_empty() {
        root
    } else {
        rustix::fs::openat2(
            &root,
            a.subpath.as_str(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH
                | ResolveFlags::NO_SYMLINKS
                | ResolveFlags::NO_MAGICLINKS
                | ResolveFlags::NO_XDEV,
        )
        .map_err(|e| format!("export {}: subpath {:?}: {e}", a.path, a.subpath))?
    };
    // The exact directory just resolved: reopening it through its descriptor's link
    // follows no name on the way.
    let path = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
    Ok((dir, path))
}

fn main() {
    if let Err(e) = run() {
        eprintln!("warren-nfsd: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let (key_file, args) = parse(std::env::args().skip(1))?;
    let key = read_key(&key_file)?;
    let mut held = Vec::new();
    let mut exports = Vec::new();
    for a in &args {
        let (fd, root) = resolve(a)?;
        held.push(fd);
        exports.push(Export {
            path: a.path.clone(),
            root,
            read_only: a.read_only,
        });
    }
    let server = Server::new(exports, key).map_err(|e| e.to_string())?;
    drop(held);
    // SAFETY: standard input is the listening socket the runtime passed, owned by nothing
    // else in this process from here on.
    let listener = unsafe { OwnedFd::from_raw_fd(0) };
    let listener = std::net::TcpListener::from(listener);
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("standard input is not a listening socket: {e}"))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(64)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| format!("standard input is not a listening socket: {e}"))?;
        let mut out = std::io::stdout();
        let _ = writeln!(out, "ready").and_then(|()| out.flush());
        server.serve(listener).await.map_err(|e| e.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> impl Iterator<Item = String> + '_ {
        s.split(' ').map(str::to_string)
    }

    #[test]
    fn parses_exports_and_refuses_half_ones() {
        let (key, ex) = parse(args(
            "--key-file /k --export /v0 /r sub ro --export /v1 /s  rw",
        ))
        .expect("parses");
        assert_eq!(key, PathBuf::from("/k"));
        assert_eq!(ex.len(), 2);
        assert!(ex[0].read_only && ex[0].subpath == "sub");
        assert!(!ex[1].read_only && ex[1].subpath.is_empty());
        assert!(parse(args("--key-file /k --export /v0 /r sub")).is_err());
        assert!(parse(args("--key-file /k --export /v0 /r sub yes")).is_err());
        assert!(parse(args("--export /v0 /r sub ro")).is_err());
    }
}

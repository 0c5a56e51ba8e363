//! The `warren-nfsd` helper as the vm runtime runs it: a listening socket on standard input,
//! the key in a file, exports (with subpaths) on the command line, `ready` once it serves.

mod common;

use std::io::{BufRead, BufReader};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::*;
use nfs3_client::nfs3_types::nfs3::nfsstat3;

/// A running helper, killed when dropped (a failing assertion leaves none behind).
struct Helper(Option<Child>);

impl Drop for Helper {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A helper serving `exports` (`[path, root, subpath, ro|rw]`), and its first line.
fn helper(key: &Path, exports: &[[&str; 4]]) -> (Helper, std::net::SocketAddr, String) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_warren-nfsd"));
    cmd.arg("--key-file").arg(key);
    for e in exports {
        cmd.arg("--export").args(e);
    }
    let mut child = cmd
        .stdin(Stdio::from(OwnedFd::from(listener)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (Helper(Some(child)), addr, line)
}

/// Stops the helper; what it wrote to stderr.
fn stop(mut h: Helper) -> String {
    let mut child = h.0.take().unwrap();
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn key_file(dir: &Path) -> std::path::PathBuf {
    let k = dir.join("nfs.key");
    std::fs::write(&k, [7u8; 32]).unwrap();
    k
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_subpaths_read_only_and_handles_outlive_the_helper() {
    let vol = ext4(16);
    std::fs::create_dir_all(vol.mnt.join("sub/dir")).unwrap();
    std::fs::write(vol.mnt.join("sub/dir/f"), "in sub").unwrap();
    let key = key_file(vol.tmp.path());
    let root = vol.mnt.to_str().unwrap();
    let exports = [["/v0", root, "", "rw"], ["/v1", root, "sub/dir", "ro"]];

    let (child, addr, line) = helper(&key, &exports);
    assert_eq!(line, "ready\n", "{}", stop(child));
    let mut sub = mount(addr, "/v1", Some((0, 0, vec![]))).await;
    let r = sub.root.clone();
    let mut names = sub.readdir(&r).await.unwrap();
    names.sort();
    assert_eq!(names, [".", "..", "f"]);
    assert_eq!(
        err(sub.create(&r, "new", 0o644).await),
        Some(nfsstat3::NFS3ERR_ROFS)
    );
    let mut whole = mount(addr, "/v0", Some((0, 0, vec![]))).await;
    let r0 = whole.root.clone();
    let made = whole.create(&r0, "kept", 0o644).await.unwrap();
    drop((sub, whole));
    stop(child);

    // A new helper with the same key (a restored VM's): the old handle still names the file.
    let (child, addr, line) = helper(&key, &exports);
    assert_eq!(line, "ready\n", "{}", stop(child));
    let mut again = mount(addr, "/v0", Some((0, 0, vec![]))).await;
    let attr = again.getattr(&made).await.unwrap();
    assert_eq!((attr.uid, attr.size), (0, 0));
    drop(again);
    stop(child);
}

#[test]
fn a_subpath_through_a_link_or_outside_fails_the_start() {
    let vol = ext4(16);
    std::os::unix::fs::symlink("/etc", vol.mnt.join("link")).unwrap();
    std::fs::create_dir(vol.mnt.join("d")).unwrap();
    std::os::unix::fs::symlink("..", vol.mnt.join("d/up")).unwrap();
    let key = key_file(vol.tmp.path());
    let root = vol.mnt.to_str().unwrap();
    for sub in ["link", "link/ssl", "d/up", "../", "/etc", "missing"] {
        let (child, _, line) = helper(&key, &[["/v0", root, sub, "rw"]]);
        assert_eq!(line, "", "{sub}: the helper started");
        let stderr = stop(child);
        assert!(stderr.contains("subpath"), "{sub}: {stderr}");
    }
    // A key of the wrong size is refused too.
    std::fs::write(&key, [1u8; 16]).unwrap();
    let (child, _, line) = helper(&key, &[["/v0", root, "", "rw"]]);
    assert_eq!(line, "");
    assert!(stop(child).contains("32 bytes"));
}

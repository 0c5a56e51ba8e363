//! The file APIs act with the caller's identity: a user cannot make the (root) agent read or
//! write through a symlink, or create and chown inside a directory, where the user could not
//! themselves. Runs the real agent as root; needs the account `user` with its home directory.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{user_ids, Agent};
use reqwest::StatusCode;
use warren_proto::client::{AgentClient, CallOptions};
use warren_proto::connect::{Code, ConnectError};
use warren_proto::filesystem::{MakeDirRequest, MakeDirResponse, MoveRequest, MoveResponse};

/// A root-owned directory (0755) with a root-owned file (0600) in it: what `user` must not touch.
struct RootTree {
    dir: PathBuf,
}

impl RootTree {
    fn new() -> RootTree {
        let dir = PathBuf::from(format!(
            "/tmp/warren-root-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, PermissionsExt::from_mode(0o755)).unwrap();
        std::fs::create_dir(dir.join("sub")).unwrap();
        std::fs::write(dir.join("secret"), b"original").unwrap();
        std::fs::set_permissions(dir.join("secret"), PermissionsExt::from_mode(0o600)).unwrap();
        RootTree { dir }
    }

    fn secret(&self) -> PathBuf {
        self.dir.join("secret")
    }

    /// Every entry below the tree with its owner; must stay `[(.., 0)]`, unchanged.
    fn listing(&self) -> Vec<(PathBuf, u32)> {
        let mut out = Vec::new();
        let mut stack = vec![self.dir.clone()];
        while let Some(d) = stack.pop() {
            let meta = std::fs::symlink_metadata(&d).unwrap();
            out.push((d.clone(), meta.uid()));
            if meta.is_dir() {
                for e in std::fs::read_dir(&d).unwrap() {
                    stack.push(e.unwrap().path());
                }
            }
        }
        out.sort();
        out
    }
}

impl Drop for RootTree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A fresh name in the user's home, removed on drop.
struct InHome(PathBuf);

impl InHome {
    fn new(tag: &str) -> InHome {
        let home = Path::new("/home/user");
        assert!(
            home.is_dir(),
            "/home/user is missing: useradd -m user (the tests act in the user's home)"
        );
        InHome(home.join(format!("warren-{tag}-{}", uuid::Uuid::new_v4().simple())))
    }
}

impl Drop for InHome {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn symlink_as_user(target: &Path, link: &Path) {
    std::os::unix::fs::symlink(target, link).unwrap();
    let (uid, gid) = user_ids("user");
    std::os::unix::fs::lchown(link, Some(uid), Some(gid)).unwrap();
}

fn files_url(agent: &Agent, path: &Path, user: &str) -> String {
    let mut url = reqwest::Url::parse(&agent.url("/files")).unwrap();
    url.query_pairs_mut()
        .append_pair("path", &path.display().to_string())
        .append_pair("username", user);
    url.to_string()
}

async fn upload(agent: &Agent, path: &Path, user: &str, data: &[u8]) -> (StatusCode, String) {
    let resp = reqwest::Client::new()
        .post(files_url(agent, path, user))
        .header("content-type", "application/octet-stream")
        .body(data.to_vec())
        .send()
        .await
        .unwrap();
    (resp.status(), resp.text().await.unwrap())
}

async fn upload_multipart(agent: &Agent, path: &Path, user: &str) -> (StatusCode, String) {
    let body = format!(
        "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{}\"\r\n\
         Content-Type: application/octet-stream\r\n\r\npwned\r\n--XyZ--\r\n",
        path.display()
    );
    let mut url = reqwest::Url::parse(&agent.url("/files")).unwrap();
    url.query_pairs_mut().append_pair("username", user);
    let resp = reqwest::Client::new()
        .post(url)
        .header("content-type", "multipart/form-data; boundary=XyZ")
        .body(body)
        .send()
        .await
        .unwrap();
    (resp.status(), resp.text().await.unwrap())
}

/// A unary filesystem call as `user`, through the typed client; the agent's error, if any.
async fn rpc<Req: serde::Serialize, Resp: serde::de::DeserializeOwned>(
    agent: &Agent,
    procedure: &'static str,
    msg: &Req,
    user: &str,
) -> Result<Resp, ConnectError> {
    AgentClient::new(reqwest::Client::new(), agent.base.clone())
        .unary(procedure, msg, &CallOptions::new().user(user))
        .await
        .map_err(|e| {
            e.rpc()
                .cloned()
                .unwrap_or_else(|| panic!("not an RPC error: {e:?}"))
        })
}

#[tokio::test]
async fn a_symlink_to_a_root_file_is_not_written_or_read() {
    let agent = Agent::start();
    let tree = RootTree::new();
    let link = InHome::new("link");
    symlink_as_user(&tree.secret(), &link.0);
    let before = tree.listing();

    let (status, body) = upload(&agent, &link.0, "user", b"pwned").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body.contains("ermission denied"), "{body}");
    let (status, body) = upload_multipart(&agent, &link.0, "user").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");

    let resp = reqwest::get(files_url(&agent, &link.0, "user"))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let resp = reqwest::get(files_url(&agent, &tree.secret(), "user"))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);

    assert_eq!(std::fs::read(tree.secret()).unwrap(), b"original");
    assert_eq!(tree.listing(), before, "the root-owned tree changed");

    // Root still reads and writes anywhere, through the same link.
    let (status, body) = upload(&agent, &link.0, "root", b"by root").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(std::fs::read(tree.secret()).unwrap(), b"by root");
    assert_eq!(std::fs::metadata(tree.secret()).unwrap().uid(), 0);
    let resp = reqwest::get(files_url(&agent, &link.0, "root"))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.bytes().await.unwrap().as_ref(), b"by root");
}

#[tokio::test]
async fn a_symlinked_directory_gives_no_way_into_a_root_directory() {
    let agent = Agent::start();
    let tree = RootTree::new();
    let link = InHome::new("dirlink");
    symlink_as_user(&tree.dir, &link.0);
    let before = tree.listing();

    // New parents, an existing root-owned parent, and a new file in the root directory.
    for rel in ["new/deeper/f.txt", "sub/f.txt", "f.txt"] {
        let (status, body) = upload(&agent, &link.0.join(rel), "user", b"x").await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{rel}: {body}");
    }
    let err = rpc::<_, MakeDirResponse>(
        &agent,
        "filesystem.Filesystem/MakeDir",
        &MakeDirRequest {
            path: link.0.join("made/here").display().to_string(),
        },
        "user",
    )
    .await
    .unwrap_err();
    assert_eq!(err.code, Code::PermissionDenied, "{err}");
    let (uid, _) = user_ids("user");
    let err = rpc::<_, MoveResponse>(
        &agent,
        "filesystem.Filesystem/Move",
        &MoveRequest {
            source: tree.secret().display().to_string(),
            destination: format!("/tmp/warren-stolen-{uid}"),
        },
        "user",
    )
    .await
    .unwrap_err();
    assert_eq!(err.code, Code::PermissionDenied, "{err}");
    assert_eq!(tree.listing(), before, "the root-owned tree changed");
}

/// `ensure_dirs` used to `mkdir` and then `chown` by path: a user swapping a path component
/// for a symlink in between could have root chown any directory. Swaps one while uploading.
#[tokio::test]
async fn a_symlink_swap_while_creating_parents_cannot_chown_a_root_directory() {
    let agent = Agent::start();
    let tree = RootTree::new();
    let base = InHome::new("race");
    std::fs::create_dir(&base.0).unwrap();
    let (uid, gid) = user_ids("user");
    std::os::unix::fs::chown(&base.0, Some(uid), Some(gid)).unwrap();
    let before = tree.listing();

    // `base/flip` alternates between a real (user-owned) directory and a link to the root tree.
    let flip = base.0.join("flip");
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (flip, stop, target) = (flip.clone(), stop.clone(), tree.dir.clone());
        std::thread::spawn(move || {
            let spare = flip.with_extension("spare");
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let _ = std::fs::remove_dir_all(&spare);
                let _ = std::fs::remove_file(&spare);
                if swaps.is_multiple_of(2) {
                    let _ = std::fs::create_dir(&spare);
                    let _ = std::os::unix::fs::chown(&spare, Some(uid), Some(gid));
                } else {
                    let _ = std::os::unix::fs::symlink(&target, &spare);
                }
                // rename(2) replaces the link or an empty directory atomically.
                let _ = std::fs::remove_dir_all(&flip);
                let _ = std::fs::rename(&spare, &flip);
                swaps += 1;
            }
            swaps
        })
    };
    let mut outcomes = std::collections::BTreeMap::<u16, u32>::new();
    for i in 0..300 {
        let path = flip.join(format!("sub/d{i}/f.txt"));
        let (status, _) = upload(&agent, &path, "user", b"x").await;
        *outcomes.entry(status.as_u16()).or_default() += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    eprintln!("uploads by status: {outcomes:?}; swaps: {swaps}");
    assert_eq!(tree.listing(), before, "the root-owned tree changed");
}

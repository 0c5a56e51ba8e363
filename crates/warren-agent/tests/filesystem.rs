//! The `filesystem.Filesystem` service over real HTTP against a real agent (run as root; the
//! account `user` must exist).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{basic, envelope, parse_envelopes, Agent, EnvelopeStream};
use serde::Serialize;
use serde_json::{json, to_value, Value};
use warren_proto::filesystem::{
    CreateWatcherRequest, GetWatcherEventsRequest, ListDirRequest, MakeDirRequest, MoveRequest,
    RemoveRequest, RemoveWatcherRequest, StatRequest, WatchDirRequest,
};

const STREAM: &str = warren_proto::connect::STREAM_CONTENT_TYPE;

fn client() -> reqwest::Client {
    reqwest::Client::builder().http1_only().build().unwrap()
}

/// A scratch directory under /tmp, removed on drop. It belongs to `user`, as a workspace in a
/// sandbox would: the agent acts with the caller's identity, so `user` may only create where
/// `user` could.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        let p = PathBuf::from(format!("/tmp/warren-fs-test-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&p).unwrap();
        let (uid, gid) = common::user_ids("user");
        std::os::unix::fs::chown(&p, Some(uid), Some(gid)).unwrap();
        Scratch(p)
    }
    fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }
    fn s(&self, rel: &str) -> String {
        self.path(rel).display().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn stat(path: impl Into<String>) -> StatRequest {
    StatRequest { path: path.into() }
}

fn make_dir(path: impl Into<String>) -> MakeDirRequest {
    MakeDirRequest { path: path.into() }
}

fn remove(path: impl Into<String>) -> RemoveRequest {
    RemoveRequest { path: path.into() }
}

fn list_dir(path: impl Into<String>, depth: u32) -> ListDirRequest {
    ListDirRequest {
        path: path.into(),
        depth,
    }
}

fn move_to(source: impl Into<String>, destination: impl Into<String>) -> MoveRequest {
    MoveRequest {
        source: source.into(),
        destination: destination.into(),
    }
}

fn watch_dir(path: impl Into<String>, recursive: bool, include_entry: bool) -> WatchDirRequest {
    WatchDirRequest {
        path: path.into(),
        recursive,
        include_entry,
        ..Default::default()
    }
}

fn create_watcher(path: impl Into<String>, recursive: bool) -> CreateWatcherRequest {
    CreateWatcherRequest {
        path: path.into(),
        recursive,
        ..Default::default()
    }
}

fn watcher_events(watcher_id: impl Into<String>) -> GetWatcherEventsRequest {
    GetWatcherEventsRequest {
        watcher_id: watcher_id.into(),
    }
}

fn remove_watcher(watcher_id: impl Into<String>) -> RemoveWatcherRequest {
    RemoveWatcherRequest {
        watcher_id: watcher_id.into(),
    }
}

/// A unary call as `user` (None: the agent's default user, `user`).
async fn call(
    agent: &Agent,
    method: &str,
    msg: impl Serialize,
    user: Option<&str>,
) -> (u16, Value) {
    call_raw(agent, method, serde_json::to_vec(&msg).unwrap(), user).await
}

async fn call_raw(agent: &Agent, method: &str, body: Vec<u8>, user: Option<&str>) -> (u16, Value) {
    let mut req = client()
        .post(agent.url(&format!("/filesystem.Filesystem/{method}")))
        .header("content-type", "application/json")
        .header("connect-protocol-version", "1")
        .body(body);
    if let Some(u) = user {
        req = req.header("authorization", basic(u));
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    assert_eq!(resp.headers()["content-type"], "application/json");
    (status, resp.json().await.unwrap())
}

async fn root_call(agent: &Agent, method: &str, msg: impl Serialize) -> Value {
    let (status, body) = call(agent, method, msg, Some("root")).await;
    assert_eq!(status, 200, "{method}: {body}");
    body
}

async fn open_watch(
    agent: &Agent,
    msg: WatchDirRequest,
    headers: &[(&str, &str)],
) -> EnvelopeStream {
    let mut req = client()
        .post(agent.url("/filesystem.Filesystem/WatchDir"))
        .header("content-type", STREAM)
        .header("connect-protocol-version", "1")
        .header("authorization", basic("root"))
        .body(envelope(0, &msg));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200, "streams always answer 200");
    assert_eq!(resp.headers()["content-type"], STREAM);
    let mut stream = EnvelopeStream::new(resp);
    let (flags, first) = next_msg(&mut stream).await;
    assert_eq!(
        (flags, &first),
        (0, &json!({"start": {}})),
        "first message is start"
    );
    stream
}

async fn next_msg(stream: &mut EnvelopeStream) -> (u8, Value) {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("a stream message within 10 s")
        .expect("stream still open")
}

/// Reads filesystem events until every one of `want` (name, type) has been seen in that
/// order (other events may be interleaved); returns all events read.
async fn expect_events(stream: &mut EnvelopeStream, want: &[(&str, &str)]) -> Vec<Value> {
    let mut seen = Vec::new();
    let mut idx = 0;
    while idx < want.len() {
        let (flags, msg) = next_msg(stream).await;
        assert_eq!(flags, 0, "unexpected end of stream: {msg} (seen {seen:?})");
        let Some(ev) = msg.get("filesystem") else {
            continue;
        };
        if ev["name"] == want[idx].0 && ev["type"] == want[idx].1 {
            idx += 1;
        }
        seen.push(ev.clone());
    }
    seen
}

fn find<'a>(events: &'a [Value], name: &str, ty: &str) -> &'a Value {
    events
        .iter()
        .find(|e| e["name"] == name && e["type"] == ty)
        .unwrap_or_else(|| panic!("no {ty} event for {name} in {events:?}"))
}

/// Number of inotify instances the agent holds open.
fn inotify_fds(agent: &Agent) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", agent.pid()))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            std::fs::read_link(e.path())
                .map(|t| t.to_string_lossy().contains("inotify"))
                .unwrap_or(false)
        })
        .count()
}

async fn wait_for_inotify_fds(agent: &Agent, want: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while inotify_fds(agent) != want {
        assert!(
            Instant::now() < deadline,
            "agent still holds {} inotify fds, want {want}",
            inotify_fds(agent)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn write(path: &Path, data: &str, mode: u32) {
    std::fs::write(path, data).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[tokio::test]
async fn stat_files_dirs_symlinks_and_missing() {
    let agent = Agent::start();
    let dir = Scratch::new();
    write(&dir.path("a.txt"), "hello", 0o644);
    std::fs::create_dir(dir.path("d")).unwrap();
    std::fs::set_permissions(dir.path("d"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink(dir.path("a.txt"), dir.path("link")).unwrap();
    std::os::unix::fs::symlink(dir.path("gone"), dir.path("dangling")).unwrap();
    xattr::set(dir.path("a.txt"), "user.e2b.owner-note", b"hi").unwrap();
    xattr::set(dir.path("a.txt"), "user.other", b"not ours").unwrap();

    let e = &root_call(&agent, "Stat", stat(dir.s("a.txt"))).await["entry"];
    assert_eq!(e["name"], "a.txt");
    assert_eq!(e["type"], "FILE_TYPE_FILE");
    assert_eq!(e["path"], dir.s("a.txt"));
    assert_eq!(e["size"], "5", "int64 travels as a JSON string");
    assert_eq!(e["mode"], 420);
    assert_eq!(e["permissions"], "-rw-r--r--");
    assert_eq!(e["owner"], "root");
    assert_eq!(e["group"], "root");
    assert!(e["modifiedTime"].as_str().unwrap().ends_with('Z'), "{e}");
    assert!(e.get("symlinkTarget").is_none());
    assert!(e.get("isSymlink").is_none());
    assert_eq!(e["metadata"], json!({"owner-note": "hi"}));

    let d = &root_call(&agent, "Stat", stat(dir.s("d"))).await["entry"];
    assert_eq!(d["type"], "FILE_TYPE_DIRECTORY");
    assert_eq!(d["permissions"], "drwxr-xr-x");
    assert_eq!(d["mode"], 493);

    let l = &root_call(&agent, "Stat", stat(dir.s("link"))).await["entry"];
    assert_eq!(
        l["type"], "FILE_TYPE_FILE",
        "a symlink reports its target's type"
    );
    assert_eq!(l["symlinkTarget"], dir.s("a.txt"));
    assert_eq!(l["permissions"], "Lrwxrwxrwx");
    assert_eq!(l["mode"], 420, "mode of the target");
    assert_eq!(l["name"], "link");

    let g = &root_call(&agent, "Stat", stat(dir.s("dangling"))).await["entry"];
    assert!(
        g.get("type").is_none(),
        "dangling link: unspecified type (omitted): {g}"
    );

    let (status, err) = call(&agent, "Stat", stat(dir.s("missing")), Some("root")).await;
    assert_eq!(status, 404);
    assert_eq!(err["code"], "not_found");
    assert!(
        err["message"].as_str().unwrap().contains("file not found"),
        "{err}"
    );

    // No user header: the default user `user`, and "~" is its home.
    let (status, home) = call(&agent, "Stat", stat("~"), None).await;
    assert_eq!(status, 200, "{home}");
    assert_eq!(home["entry"]["path"], "/home/user");
    assert_eq!(home["entry"]["type"], "FILE_TYPE_DIRECTORY");

    let (status, err) = call(&agent, "Stat", stat("/"), Some("nosuchuser")).await;
    assert_eq!(
        (status, err["code"].as_str()),
        (401, Some("unauthenticated"))
    );
}

#[tokio::test]
async fn list_dir_depths_and_errors() {
    let agent = Agent::start();
    let dir = Scratch::new();
    std::fs::create_dir_all(dir.path("a/sub")).unwrap();
    write(&dir.path("a/inner.txt"), "x", 0o644);
    write(&dir.path("a/sub/deep.txt"), "x", 0o644);
    write(&dir.path("b.txt"), "x", 0o644);
    std::os::unix::fs::symlink(dir.path("a"), dir.path("link-to-a")).unwrap();

    let paths = |v: &Value| -> Vec<String> {
        v["entries"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|e| e["path"].as_str().unwrap().to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    let rel = |names: &[&str]| -> Vec<String> { names.iter().map(|n| dir.s(n)).collect() };

    let one = root_call(&agent, "ListDir", list_dir(dir.s(""), 1)).await;
    assert_eq!(paths(&one), rel(&["a", "b.txt", "link-to-a"]));
    let link_entry = &one["entries"][2];
    assert_eq!(link_entry["type"], "FILE_TYPE_DIRECTORY");
    assert_eq!(link_entry["symlinkTarget"], dir.s("a"));

    let zero = root_call(&agent, "ListDir", list_dir(dir.s(""), 0)).await;
    assert_eq!(paths(&zero), paths(&one), "depth 0 means 1");

    let two = root_call(&agent, "ListDir", list_dir(dir.s(""), 2)).await;
    assert_eq!(
        paths(&two),
        rel(&["a", "a/inner.txt", "a/sub", "b.txt", "link-to-a"])
    );

    // A symlinked directory is listed, with paths under the requested (link) path.
    let via_link = root_call(&agent, "ListDir", list_dir(dir.s("link-to-a"), 2)).await;
    assert_eq!(
        paths(&via_link),
        rel(&[
            "link-to-a/inner.txt",
            "link-to-a/sub",
            "link-to-a/sub/deep.txt"
        ])
    );

    let empty = root_call(&agent, "ListDir", list_dir(dir.s("a/sub/deep.txt/.."), 0)).await;
    assert_eq!(
        paths(&empty),
        rel(&["a/sub/deep.txt"]),
        "paths are cleaned lexically"
    );

    let (status, err) = call(&agent, "ListDir", list_dir(dir.s("b.txt"), 0), Some("root")).await;
    assert_eq!(
        (status, err["code"].as_str()),
        (400, Some("invalid_argument"))
    );
    let (status, err) = call(&agent, "ListDir", list_dir(dir.s("nope"), 0), Some("root")).await;
    assert_eq!((status, err["code"].as_str()), (404, Some("not_found")));
    std::os::unix::fs::symlink(dir.path("loop2"), dir.path("loop1")).unwrap();
    std::os::unix::fs::symlink(dir.path("loop1"), dir.path("loop2")).unwrap();
    let (status, err) = call(&agent, "ListDir", list_dir(dir.s("loop1"), 0), Some("root")).await;
    assert_eq!(
        (status, err["code"].as_str()),
        (400, Some("failed_precondition"))
    );
}

#[tokio::test]
async fn make_dir_move_and_remove() {
    let agent = Agent::start();
    let dir = Scratch::new();

    // Nested creation as `user`: every new directory belongs to the user.
    let (status, made) = call(&agent, "MakeDir", make_dir(dir.s("x/y/z")), Some("user")).await;
    assert_eq!(status, 200, "{made}");
    assert_eq!(made["entry"]["path"], dir.s("x/y/z"));
    assert_eq!(made["entry"]["name"], "z");
    assert_eq!(made["entry"]["type"], "FILE_TYPE_DIRECTORY");
    for p in ["x", "x/y", "x/y/z"] {
        let e = &root_call(&agent, "Stat", stat(dir.s(p))).await["entry"];
        assert_eq!(
            (e["owner"].as_str(), e["group"].as_str()),
            (Some("user"), Some("user")),
            "{p}"
        );
    }
    let (status, err) = call(&agent, "MakeDir", make_dir(dir.s("x/y")), Some("user")).await;
    assert_eq!(
        (status, err["code"].as_str()),
        (409, Some("already_exists"))
    );
    write(&dir.path("f.txt"), "data", 0o600);
    let (status, err) = call(&agent, "MakeDir", make_dir(dir.s("f.txt")), Some("user")).await;
    assert_eq!(
        (status, err["code"].as_str()),
        (400, Some("invalid_argument"))
    );

    // Move creates the destination's parents and returns the destination entry.
    let moved = root_call(
        &agent,
        "Move",
        move_to(dir.s("f.txt"), dir.s("new/parent/g.txt")),
    )
    .await;
    assert_eq!(moved["entry"]["path"], dir.s("new/parent/g.txt"));
    assert_eq!(moved["entry"]["name"], "g.txt");
    assert_eq!(moved["entry"]["size"], "4");
    assert!(!dir.path("f.txt").exists());
    assert_eq!(
        std::fs::read_to_string(dir.path("new/parent/g.txt")).unwrap(),
        "data"
    );
    let (status, err) = call(
        &agent,
        "Move",
        move_to(dir.s("f.txt"), dir.s("h.txt")),
        Some("root"),
    )
    .await;
    assert_eq!((status, err["code"].as_str()), (404, Some("not_found")));

    // Remove is rm -rf: trees go, missing paths are fine.
    assert_eq!(
        root_call(&agent, "Remove", remove(dir.s("x"))).await,
        json!({})
    );
    assert!(!dir.path("x").exists());
    assert_eq!(
        root_call(&agent, "Remove", remove(dir.s("x"))).await,
        json!({})
    );
    std::os::unix::fs::symlink(dir.path("new"), dir.path("link")).unwrap();
    root_call(&agent, "Remove", remove(dir.s("link"))).await;
    assert!(
        dir.path("new/parent/g.txt").exists(),
        "removing a link keeps its target"
    );
}

#[tokio::test]
async fn protocol_errors() {
    let agent = Agent::start();
    let (status, err) = call_raw(&agent, "Stat", b"{not json".to_vec(), Some("root")).await;
    assert_eq!(
        (status, err["code"].as_str()),
        (400, Some("invalid_argument"))
    );
    let (status, err) = call(&agent, "Frobnicate", json!({}), Some("root")).await;
    assert_eq!((status, err["code"].as_str()), (404, Some("unimplemented")));
}

#[tokio::test]
async fn watch_dir_reports_changes() {
    let agent = Agent::start();
    let dir = Scratch::new();
    let before = inotify_fds(&agent);
    let mut plain = open_watch(&agent, watch_dir(dir.s(""), false, false), &[]).await;
    let mut with_entries = open_watch(&agent, watch_dir(dir.s(""), false, true), &[]).await;
    assert_eq!(inotify_fds(&agent), before + 2);

    write(&dir.path("f.txt"), "hello", 0o644);
    std::fs::rename(dir.path("f.txt"), dir.path("g.txt")).unwrap();
    std::fs::set_permissions(dir.path("g.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::remove_file(dir.path("g.txt")).unwrap();
    let want = [
        ("f.txt", "EVENT_TYPE_CREATE"),
        ("f.txt", "EVENT_TYPE_WRITE"),
        ("f.txt", "EVENT_TYPE_RENAME"),
        ("g.txt", "EVENT_TYPE_CREATE"),
        ("g.txt", "EVENT_TYPE_CHMOD"),
        ("g.txt", "EVENT_TYPE_REMOVE"),
    ];
    let events = expect_events(&mut plain, &want).await;
    assert!(
        events.iter().all(|e| e.get("entry").is_none()),
        "{events:?}"
    );

    let events = expect_events(&mut with_entries, &want).await;
    let created = find(&events, "f.txt", "EVENT_TYPE_CREATE");
    // The file may be gone by the time the event is handled; if there is an entry, it is right.
    if let Some(entry) = created.get("entry") {
        assert_eq!(entry["name"], "f.txt");
        assert_eq!(entry["path"], dir.s("f.txt"));
    }
    for e in &events {
        if e["type"] == "EVENT_TYPE_REMOVE" || e["type"] == "EVENT_TYPE_RENAME" {
            assert!(e.get("entry").is_none(), "no entry for {e}");
        }
    }

    // Disconnecting ends the watches and closes their inotify instances.
    drop(plain);
    drop(with_entries);
    wait_for_inotify_fds(&agent, before).await;
}

#[tokio::test]
async fn watch_dir_entries_for_existing_files() {
    let agent = Agent::start();
    let dir = Scratch::new();
    write(&dir.path("keep.txt"), "", 0o644);
    let mut stream = open_watch(&agent, watch_dir(dir.s(""), false, true), &[]).await;
    std::fs::write(dir.path("keep.txt"), "more").unwrap();
    let events = expect_events(&mut stream, &[("keep.txt", "EVENT_TYPE_WRITE")]).await;
    let entry = &find(&events, "keep.txt", "EVENT_TYPE_WRITE")["entry"];
    assert_eq!(entry["type"], "FILE_TYPE_FILE");
    assert_eq!(entry["path"], dir.s("keep.txt"));
    assert_eq!(entry["owner"], "root");
}

#[tokio::test]
async fn recursive_watch_follows_new_subdirectories() {
    let agent = Agent::start();
    let dir = Scratch::new();
    std::fs::create_dir(dir.path("existing")).unwrap();
    let mut stream = open_watch(&agent, watch_dir(dir.s(""), true, false), &[]).await;

    write(&dir.path("existing/a.txt"), "x", 0o644);
    expect_events(&mut stream, &[("existing/a.txt", "EVENT_TYPE_CREATE")]).await;

    std::fs::create_dir(dir.path("later")).unwrap();
    expect_events(&mut stream, &[("later", "EVENT_TYPE_CREATE")]).await;
    write(&dir.path("later/b.txt"), "x", 0o644);
    expect_events(
        &mut stream,
        &[
            ("later/b.txt", "EVENT_TYPE_CREATE"),
            ("later/b.txt", "EVENT_TYPE_WRITE"),
        ],
    )
    .await;

    // A whole tree at once: everything inside is reported even if it predates its watch.
    std::fs::create_dir_all(dir.path("t1/t2/t3")).unwrap();
    let events = expect_events(
        &mut stream,
        &[
            ("t1", "EVENT_TYPE_CREATE"),
            ("t1/t2/t3", "EVENT_TYPE_CREATE"),
        ],
    )
    .await;
    find(&events, "t1/t2", "EVENT_TYPE_CREATE");
    write(&dir.path("t1/t2/t3/c.txt"), "x", 0o644);
    expect_events(&mut stream, &[("t1/t2/t3/c.txt", "EVENT_TYPE_CREATE")]).await;

    // A renamed subdirectory keeps being watched under its new name.
    std::fs::rename(dir.path("later"), dir.path("renamed")).unwrap();
    expect_events(
        &mut stream,
        &[
            ("later", "EVENT_TYPE_RENAME"),
            ("renamed", "EVENT_TYPE_CREATE"),
        ],
    )
    .await;
    write(&dir.path("renamed/d.txt"), "x", 0o644);
    expect_events(&mut stream, &[("renamed/d.txt", "EVENT_TYPE_CREATE")]).await;

    std::fs::remove_dir_all(dir.path("t1")).unwrap();
    expect_events(
        &mut stream,
        &[
            ("t1/t2/t3/c.txt", "EVENT_TYPE_REMOVE"),
            ("t1", "EVENT_TYPE_REMOVE"),
        ],
    )
    .await;
}

#[tokio::test]
async fn watch_dir_keepalive_and_deadline() {
    let agent = Agent::start();
    let dir = Scratch::new();
    let started = Instant::now();
    let mut stream = open_watch(
        &agent,
        watch_dir(dir.s(""), false, false),
        &[
            ("keepalive-ping-interval", "1"),
            ("connect-timeout-ms", "2500"),
        ],
    )
    .await;
    let (flags, msg) = next_msg(&mut stream).await;
    assert_eq!((flags, msg), (0, json!({"keepalive": {}})));
    loop {
        let (flags, msg) = next_msg(&mut stream).await;
        if flags == 0 {
            assert_eq!(msg, json!({"keepalive": {}}));
            continue;
        }
        assert_eq!(flags, 2);
        assert_eq!(msg["error"]["code"], "deadline_exceeded");
        break;
    }
    assert!(started.elapsed() >= Duration::from_millis(2400));
    assert!(
        stream.next().await.is_none(),
        "nothing after the end-of-stream envelope"
    );
}

#[tokio::test]
async fn watch_dir_validation_errors_travel_in_the_stream() {
    let agent = Agent::start();
    let dir = Scratch::new();
    write(&dir.path("file"), "", 0o644);
    for (path, code) in [
        (dir.s("missing"), "not_found"),
        (dir.s("file"), "invalid_argument"),
    ] {
        let resp = client()
            .post(agent.url("/filesystem.Filesystem/WatchDir"))
            .header("content-type", STREAM)
            .header("authorization", basic("root"))
            .body(envelope(0, &watch_dir(path, false, false)))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], STREAM);
        let envs = parse_envelopes(&resp.bytes().await.unwrap());
        assert_eq!(envs.len(), 1, "{envs:?}");
        assert_eq!(envs[0].0, 2, "end-of-stream envelope");
        assert_eq!(envs[0].1["error"]["code"], code, "{envs:?}");
    }
}

/// Drains a polling watcher until an event `(name, ty)` shows up; returns all events drained.
async fn poll_until(agent: &Agent, id: &str, name: &str, ty: &str) -> Vec<Value> {
    let mut events = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !events
        .iter()
        .any(|e: &Value| e["name"] == name && e["type"] == ty)
    {
        assert!(
            Instant::now() < deadline,
            "no {ty} for {name} in {events:?}"
        );
        let got = root_call(agent, "GetWatcherEvents", watcher_events(id)).await;
        events.extend(got["events"].as_array().cloned().unwrap_or_default());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    events
}

#[tokio::test]
async fn polling_watchers() {
    let agent = Agent::start();
    let dir = Scratch::new();
    let before = inotify_fds(&agent);
    let created = root_call(&agent, "CreateWatcher", create_watcher(dir.s(""), true)).await;
    let id = created["watcherId"].as_str().unwrap().to_string();
    assert!(uuid::Uuid::parse_str(&id).is_ok(), "{id}");
    assert_eq!(inotify_fds(&agent), before + 1);

    // The subdirectory's watch is in place once its CREATE was handled; only then is a write
    // inside it certain to be seen (as with any inotify-based recursive watcher).
    std::fs::create_dir(dir.path("sub")).unwrap();
    poll_until(&agent, &id, "sub", "EVENT_TYPE_CREATE").await;
    write(&dir.path("sub/a.txt"), "x", 0o644);
    let events = poll_until(&agent, &id, "sub/a.txt", "EVENT_TYPE_WRITE").await;
    find(&events, "sub/a.txt", "EVENT_TYPE_CREATE");
    // Drained: nothing new until something happens.
    assert_eq!(
        root_call(&agent, "GetWatcherEvents", watcher_events(&id)).await,
        json!({})
    );

    assert_eq!(
        root_call(&agent, "RemoveWatcher", remove_watcher(&id)).await,
        json!({})
    );
    wait_for_inotify_fds(&agent, before).await;
    let after_removal = [
        ("GetWatcherEvents", to_value(watcher_events(&id)).unwrap()),
        ("RemoveWatcher", to_value(remove_watcher(&id)).unwrap()),
    ];
    for (method, msg) in after_removal {
        let (status, err) = call(&agent, method, msg, Some("root")).await;
        assert_eq!(
            (status, err["code"].as_str()),
            (404, Some("not_found")),
            "{method}"
        );
    }
    let (status, err) = call(&agent, "GetWatcherEvents", watcher_events("nope"), None).await;
    assert_eq!((status, err["code"].as_str()), (404, Some("not_found")));

    let (status, err) = call(
        &agent,
        "CreateWatcher",
        create_watcher(dir.s("missing"), false),
        Some("root"),
    )
    .await;
    assert_eq!((status, err["code"].as_str()), (404, Some("not_found")));
}

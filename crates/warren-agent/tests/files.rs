//! End-to-end tests of `GET/POST /files` and `GET /metrics` against the real agent binary.
//!
//! Needs root (the agent chowns uploads) and a `user` account (`useradd -m user`).

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use async_compression::tokio::bufread::{GzipDecoder, GzipEncoder};
use base64::Engine;
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

const TOKEN: &str = "test-token-123";

/// A running agent, killed when dropped.
struct Agent {
    child: Child,
    base: String,
    http: reqwest::Client,
}

impl Agent {
    async fn start(token: Option<&str>) -> Agent {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
            l.local_addr().expect("local addr").port()
        };
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_warren-agent"));
        cmd.arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--default-user")
            .arg("user")
            .env("WARREN_LOG", "warn")
            .stdout(Stdio::null());
        if let Some(t) = token {
            cmd.arg("--access-token").arg(t);
        }
        let child = cmd.spawn().expect("start the agent");
        let agent = Agent {
            child,
            base: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
        };
        for _ in 0..200 {
            if let Ok(r) = agent.http.get(agent.url("/health")).send().await {
                if r.status() == StatusCode::NO_CONTENT {
                    return agent;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("agent did not become healthy");
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// `/files?<query>` with the query pairs percent-encoded.
    fn files(&self, query: &[(&str, &str)]) -> String {
        let mut url = reqwest::Url::parse(&self.url("/files")).expect("url");
        for (k, v) in query {
            url.query_pairs_mut().append_pair(k, v);
        }
        url.to_string()
    }

    async fn put(&self, path: &str, data: Vec<u8>) -> reqwest::Response {
        self.http
            .post(self.files(&[("path", path)]))
            .header("content-type", "application/octet-stream")
            .header("x-access-token", TOKEN)
            .body(data)
            .send()
            .await
            .expect("upload")
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        self.http
            .get(self.files(&[("path", path)]))
            .header("x-access-token", TOKEN)
            .send()
            .await
            .expect("download")
    }

    fn vm_hwm_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("agent status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .expect("VmHWM")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A scratch directory removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(parent: &str, tag: &str) -> Scratch {
        let dir = PathBuf::from(format!(
            "{parent}/warren-files-{tag}-{}",
            uuid::Uuid::new_v4().simple()
        ));
        Scratch(dir)
    }
    fn path(&self, rest: &str) -> String {
        format!("{}/{rest}", self.0.display())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn user_ids(name: &str) -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").expect("passwd");
    passwd
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() > 3 && f[0] == name).then(|| (f[2].parse().ok(), f[3].parse().ok()))
        })
        .and_then(|(u, g)| Some((u?, g?)))
        .expect("the test machine needs a `user` account")
}

fn binary_sample(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 256) as u8).collect()
}

async fn gzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    GzipEncoder::new(data)
        .read_to_end(&mut out)
        .await
        .expect("gzip");
    out
}

async fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    GzipDecoder::new(data)
        .read_to_end(&mut out)
        .await
        .expect("gunzip");
    out
}

/// A multipart/form-data body: (field name, filename, data) per part.
fn multipart(parts: &[(&str, Option<&str>, &[u8])]) -> (String, Vec<u8>) {
    let boundary = "----warren-test-boundary-7d1f";
    let mut body = Vec::new();
    for (name, filename, data) in parts {
        body.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        let mut cd = format!("Content-Disposition: form-data; name=\"{name}\"");
        if let Some(f) = filename {
            cd.push_str(&format!("; filename=\"{f}\""));
        }
        body.extend_from_slice(cd.as_bytes());
        body.extend_from_slice(b"\r\nContent-Type: application/octet-stream\r\n\r\n");
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

async fn json_of(resp: reqwest::Response) -> Value {
    resp.json().await.expect("JSON body")
}

/// Asserts a JSON error body with the given status and a message containing `needle`.
async fn assert_error(resp: reqwest::Response, status: StatusCode, needle: &str) {
    assert_eq!(resp.status(), status);
    let body = json_of(resp).await;
    assert_eq!(body["code"], status.as_u16(), "{body}");
    let msg = body["message"].as_str().expect("message");
    assert!(msg.contains(needle), "message {msg:?} lacks {needle:?}");
}

fn signature(path: &str, op: &str, user: &str, exp: Option<i64>) -> String {
    let mut text = format!("{path}:{op}:{user}:{TOKEN}");
    if let Some(e) = exp {
        text.push_str(&format!(":{e}"));
    }
    let digest = Sha256::digest(text.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64
}

#[tokio::test]
async fn octet_stream_roundtrip_and_overwrite() {
    let agent = Agent::start(None).await;
    let dir = Scratch::new("/tmp", "raw");
    let target = dir.path("deep/er/a.bin");
    let data = binary_sample(300_000);

    let resp = agent.put(&target, data.clone()).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let body = json_of(resp).await;
    assert_eq!(
        body,
        serde_json::json!([{"path": target, "name": "a.bin", "type": "file"}])
    );
    assert_eq!(std::fs::read(&target).expect("written"), data);
    let (uid, gid) = user_ids("user");
    let meta = std::fs::metadata(&target).expect("stat");
    assert_eq!((meta.uid(), meta.gid()), (uid, gid));
    // Every directory the upload created belongs to the user too.
    for d in [dir.path("deep"), dir.path("deep/er")] {
        assert_eq!(std::fs::metadata(&d).expect("dir").uid(), uid, "{d}");
    }

    let resp = agent.get(&target).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let h = resp.headers().clone();
    assert_eq!(h["content-type"], "application/octet-stream");
    assert_eq!(h["content-disposition"], "inline; filename=\"a.bin\"");
    assert_eq!(h["content-length"], data.len().to_string().as_str());
    assert!(h.get("content-encoding").is_none());
    assert_eq!(resp.bytes().await.expect("body").as_ref(), &data[..]);

    // Overwrite with something shorter: the file is truncated.
    let resp = agent.put(&target, b"short".to_vec()).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = agent.get(&target).await;
    assert_eq!(resp.bytes().await.expect("body").as_ref(), b"short");
}

#[tokio::test]
async fn relative_paths_land_in_the_users_home() {
    let agent = Agent::start(None).await;
    let name = format!("warren-files-rel-{}", uuid::Uuid::new_v4().simple());
    let _cleanup = Scratch(PathBuf::from(format!("/home/user/{name}")));
    let (uid, gid) = user_ids("user");

    // Default user, then the same user named explicitly.
    for query in [vec![], vec![("username", "user")]] {
        let rel = format!("{name}/sub/x.txt");
        let mut q = vec![("path", rel.as_str())];
        q.extend(query.iter().copied());
        let resp = agent
            .http
            .post(agent.files(&q))
            .header("content-type", "application/octet-stream")
            .body("hello")
            .send()
            .await
            .expect("upload");
        assert_eq!(resp.status(), StatusCode::OK);
        let body = json_of(resp).await;
        let abs = format!("/home/user/{name}/sub/x.txt");
        assert_eq!(body[0]["path"], abs.as_str());
        let meta = std::fs::metadata(&abs).expect("stat");
        assert_eq!((meta.uid(), meta.gid()), (uid, gid));
        let dir = std::fs::metadata(format!("/home/user/{name}/sub")).expect("stat dir");
        assert_eq!((dir.uid(), dir.gid()), (uid, gid));

        let resp = agent.get(&format!("~/{name}/sub/x.txt")).await;
        assert_eq!(resp.text().await.expect("body"), "hello");
    }
}

#[tokio::test]
async fn multipart_uploads() {
    let agent = Agent::start(None).await;
    let dir = Scratch::new("/tmp", "multi");

    // Single file: the query path wins over the part's filename; other fields are ignored.
    let single = dir.path("single.txt");
    let (ct, body) = multipart(&[
        ("note", None, b"ignored"),
        ("file", Some("/ignored/name.txt"), b"one"),
    ]);
    let resp = agent
        .http
        .post(agent.files(&[("path", &single)]))
        .header("content-type", ct)
        .body(body)
        .send()
        .await
        .expect("upload");
    assert_eq!(resp.status(), StatusCode::OK);
    let body = json_of(resp).await;
    assert_eq!(body.as_array().map(Vec::len), Some(1));
    assert_eq!(body[0]["path"], single.as_str());
    assert_eq!(std::fs::read(&single).expect("file"), b"one");
    assert!(!Path::new("/ignored/name.txt").exists());

    // Several files: each part's filename is its full path.
    let (a, b) = (dir.path("m/a.txt"), dir.path("m/n/b.bin"));
    let blob = binary_sample(70_000);
    let (ct, body) = multipart(&[("file", Some(&a), b"alpha"), ("file", Some(&b), &blob)]);
    let resp = agent
        .http
        .post(agent.files(&[]))
        .header("content-type", ct)
        .body(body)
        .send()
        .await
        .expect("upload");
    assert_eq!(resp.status(), StatusCode::OK);
    let body = json_of(resp).await;
    assert_eq!(
        body,
        serde_json::json!([
            {"path": a, "name": "a.txt", "type": "file"},
            {"path": b, "name": "b.bin", "type": "file"},
        ])
    );
    assert_eq!(std::fs::read(&a).expect("a"), b"alpha");
    assert_eq!(std::fs::read(&b).expect("b"), blob);

    // Two parts resolving to one path.
    let dup = dir.path("dup.txt");
    let (ct, body) = multipart(&[("file", Some(&dup), b"1"), ("file", Some(&dup), b"2")]);
    let resp = agent
        .http
        .post(agent.files(&[]))
        .header("content-type", ct)
        .body(body)
        .send()
        .await
        .expect("upload");
    assert_error(resp, StatusCode::BAD_REQUEST, "same path").await;

    // A gzip-encoded multipart body.
    let gz = dir.path("gz-multi.txt");
    let (ct, body) = multipart(&[("file", Some(&gz), b"zipped form")]);
    let resp = agent
        .http
        .post(agent.files(&[]))
        .header("content-type", ct)
        .header("content-encoding", "gzip")
        .body(gzip(&body).await)
        .send()
        .await
        .expect("upload");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(std::fs::read(&gz).expect("gz"), b"zipped form");
}

#[tokio::test]
async fn gzip_both_ways_and_ranges() {
    let agent = Agent::start(None).await;
    let dir = Scratch::new("/tmp", "gzip");
    let target = dir.path("z.bin");
    let data = binary_sample(200_000);

    let resp = agent
        .http
        .post(agent.files(&[("path", &target)]))
        .header("content-type", "application/octet-stream")
        .header("content-encoding", "gzip")
        .body(gzip(&data).await)
        .send()
        .await
        .expect("upload");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(std::fs::read(&target).expect("file"), data);

    // Not gzip at all: 400, and nothing is created.
    let bad = dir.path("bad.bin");
    let resp = agent
        .http
        .post(agent.files(&[("path", &bad)]))
        .header("content-type", "application/octet-stream")
        .header("content-encoding", "gzip")
        .body("definitely not gzip")
        .send()
        .await
        .expect("upload");
    assert_error(resp, StatusCode::BAD_REQUEST, "decompress").await;
    assert!(!Path::new(&bad).exists());

    // The SDKs' default Accept-Encoding gets gzip.
    let resp = agent
        .http
        .get(agent.files(&[("path", &target)]))
        .header("accept-encoding", "gzip, deflate")
        .send()
        .await
        .expect("download");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-encoding"], "gzip");
    assert_eq!(resp.headers()["vary"], "Accept-Encoding");
    let zipped = resp.bytes().await.expect("body");
    assert_eq!(gunzip(&zipped).await, data);

    // Identity refused and nothing else acceptable.
    let resp = agent
        .http
        .get(agent.files(&[("path", &target)]))
        .header("accept-encoding", "identity;q=0")
        .send()
        .await
        .expect("download");
    assert_error(resp, StatusCode::NOT_ACCEPTABLE, "encoding").await;

    // Ranges are served in identity even when gzip is acceptable.
    let resp = agent
        .http
        .get(agent.files(&[("path", &target)]))
        .header("range", "bytes=1000-1999")
        .header("accept-encoding", "gzip")
        .send()
        .await
        .expect("download");
    assert_eq!(resp.status(), StatusCode::PARTIAL_CONTENT);
    assert!(resp.headers().get("content-encoding").is_none());
    assert_eq!(
        resp.headers()["content-range"],
        format!("bytes 1000-1999/{}", data.len()).as_str()
    );
    assert_eq!(
        resp.bytes().await.expect("body").as_ref(),
        &data[1000..2000]
    );

    let resp = agent
        .http
        .get(agent.files(&[("path", &target)]))
        .header("range", "bytes=-10")
        .send()
        .await
        .expect("download");
    assert_eq!(resp.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(
        resp.bytes().await.expect("body").as_ref(),
        &data[data.len() - 10..]
    );

    let resp = agent
        .http
        .get(agent.files(&[("path", &target)]))
        .header("range", format!("bytes={}-", data.len()))
        .send()
        .await
        .expect("download");
    assert_eq!(
        resp.headers()["content-range"],
        format!("bytes */{}", data.len()).as_str()
    );
    assert_error(resp, StatusCode::RANGE_NOT_SATISFIABLE, "range").await;
}

#[tokio::test]
async fn metadata_headers_become_xattrs() {
    let agent = Agent::start(None).await;
    let dir = Scratch::new("/tmp", "meta");
    let target = dir.path("m.txt");
    let upload = |headers: Vec<(&'static str, &'static [u8])>| {
        let mut req = agent
            .http
            .post(agent.files(&[("path", &target)]))
            .header("content-type", "application/octet-stream")
            .body("data");
        for (k, v) in headers {
            req = req.header(
                k,
                reqwest::header::HeaderValue::from_bytes(v).expect("header"),
            );
        }
        req.send()
    };
    let xattrs = |path: &str| -> BTreeMap<String, String> {
        xattr::list(path)
            .expect("list xattrs")
            .filter_map(|n| {
                let n = n.to_string_lossy().into_owned();
                let key = n.strip_prefix("user.e2b.")?.to_string();
                let v = xattr::get(path, &n).ok()??;
                Some((key, String::from_utf8_lossy(&v).into_owned()))
            })
            .collect()
    };

    let resp = upload(vec![
        ("X-Metadata-Author", b"mish"),
        ("X-Metadata-Purpose", b"unit test"),
    ])
    .await
    .expect("upload");
    assert_eq!(resp.status(), StatusCode::OK);
    let body = json_of(resp).await;
    assert_eq!(
        body[0]["metadata"],
        serde_json::json!({"author": "mish", "purpose": "unit test"})
    );
    assert_eq!(xattrs(&target).len(), 2);
    assert_eq!(xattrs(&target)["author"], "mish");

    // A new upload replaces the set ...
    let resp = upload(vec![("X-Metadata-Author", b"other")])
        .await
        .expect("upload");
    let body = json_of(resp).await;
    assert_eq!(body[0]["metadata"], serde_json::json!({"author": "other"}));
    assert_eq!(
        xattrs(&target),
        BTreeMap::from([("author".to_string(), "other".to_string())])
    );

    // ... and no headers clear it.
    let resp = upload(vec![]).await.expect("upload");
    let body = json_of(resp).await;
    assert!(body[0].get("metadata").is_none(), "{body}");
    assert!(xattrs(&target).is_empty());

    // Invalid metadata: non-ASCII value, oversized key, oversized total.
    let resp = upload(vec![("X-Metadata-K", b"caf\xc3\xa9")])
        .await
        .expect("upload");
    assert_error(resp, StatusCode::BAD_REQUEST, "invalid metadata").await;
    let long_key: &'static str = Box::leak(format!("x-metadata-{}", "k".repeat(247)).into());
    let resp = upload(vec![(long_key, b"v")]).await.expect("upload");
    assert_error(resp, StatusCode::BAD_REQUEST, "invalid metadata").await;
    let big: &'static [u8] = Box::leak(vec![b'v'; 5000].into_boxed_slice());
    let resp = upload(vec![("x-metadata-big", big)]).await.expect("upload");
    assert_error(resp, StatusCode::BAD_REQUEST, "invalid metadata").await;
}

#[tokio::test]
async fn access_token_and_signatures() {
    let agent = Agent::start(Some(TOKEN)).await;
    let dir = Scratch::new("/tmp", "sign");
    let target = dir.path("s.txt");
    let plain = |url: String| agent.http.get(url).send();

    // Header token: right for writes and reads, wrong is refused.
    assert_eq!(
        agent.put(&target, b"signed".to_vec()).await.status(),
        StatusCode::OK
    );
    assert_eq!(agent.get(&target).await.status(), StatusCode::OK);
    let resp = agent
        .http
        .get(agent.files(&[("path", &target)]))
        .header("x-access-token", "wrong")
        .send()
        .await
        .expect("download");
    assert_error(resp, StatusCode::UNAUTHORIZED, "does not match").await;

    // Neither header nor signature.
    let resp = plain(agent.files(&[("path", &target)])).await.expect("get");
    assert_error(resp, StatusCode::UNAUTHORIZED, "missing signature").await;

    // A valid read signature, with and without expiry and username.
    let sig = signature(&target, "read", "", None);
    let resp = plain(agent.files(&[("path", &target), ("signature", &sig)]))
        .await
        .expect("get");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.text().await.expect("body"), "signed");
    let exp = now() + 300;
    let sig = signature(&target, "read", "user", Some(exp));
    let exp_s = exp.to_string();
    let resp = plain(agent.files(&[
        ("path", &target),
        ("username", "user"),
        ("signature", &sig),
        ("signature_expiration", &exp_s),
    ]))
    .await
    .expect("get");
    assert_eq!(resp.status(), StatusCode::OK);

    // Tampered signature; a read signature used for a write.
    let resp = plain(agent.files(&[("path", &target), ("signature", "v1_bogus")]))
        .await
        .expect("get");
    assert_error(resp, StatusCode::UNAUTHORIZED, "invalid signature").await;
    let sig = signature(&target, "read", "", None);
    let resp = agent
        .http
        .post(agent.files(&[("path", &target), ("signature", &sig)]))
        .header("content-type", "application/octet-stream")
        .body("x")
        .send()
        .await
        .expect("post");
    assert_error(resp, StatusCode::UNAUTHORIZED, "invalid signature").await;

    // A write signature uploads.
    let sig = signature(&target, "write", "", None);
    let resp = agent
        .http
        .post(agent.files(&[("path", &target), ("signature", &sig)]))
        .header("content-type", "application/octet-stream")
        .body("via url")
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(std::fs::read(&target).expect("file"), b"via url");

    // Expired: the exact body the SDK tests assert.
    let exp = now() - 10;
    let sig = signature(&target, "read", "", Some(exp));
    let exp_s = exp.to_string();
    let resp = plain(agent.files(&[
        ("path", &target),
        ("signature", &sig),
        ("signature_expiration", &exp_s),
    ]))
    .await
    .expect("get");
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        resp.text().await.expect("body"),
        r#"{"code":401,"message":"signature is already expired"}"#
    );

    // /metrics sits behind the token.
    let resp = agent
        .http
        .get(agent.url("/metrics"))
        .send()
        .await
        .expect("metrics");
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn error_statuses() {
    let agent = Agent::start(None).await;
    let dir = Scratch::new("/tmp", "err");
    std::fs::create_dir_all(dir.path("adir")).expect("mkdir");

    let resp = agent
        .http
        .get(agent.files(&[("path", "/tmp/x"), ("username", "nosuchuser")]))
        .send()
        .await
        .expect("get");
    assert_error(
        resp,
        StatusCode::UNAUTHORIZED,
        "error looking up user 'nosuchuser'",
    )
    .await;

    let missing = dir.path("missing.txt");
    let resp = agent.get(&missing).await;
    assert_error(
        resp,
        StatusCode::NOT_FOUND,
        &format!("path '{missing}' does not exist"),
    )
    .await;

    let resp = agent.get(&dir.path("adir")).await;
    assert_error(resp, StatusCode::BAD_REQUEST, "is a directory").await;
    let resp = agent.put(&dir.path("adir"), b"x".to_vec()).await;
    assert_error(resp, StatusCode::BAD_REQUEST, "is a directory").await;
    // A parent that is a regular file.
    std::fs::write(dir.path("plain"), b"f").expect("write");
    let resp = agent.put(&dir.path("plain/child.txt"), b"x".to_vec()).await;
    assert_error(resp, StatusCode::BAD_REQUEST, "error ensuring directories").await;

    let resp = agent
        .http
        .post(agent.files(&[]))
        .header("content-type", "application/octet-stream")
        .body("x")
        .send()
        .await
        .expect("post");
    assert_error(
        resp,
        StatusCode::BAD_REQUEST,
        "path query parameter is required",
    )
    .await;

    let resp = agent
        .http
        .post(agent.files(&[("path", &dir.path("t.txt"))]))
        .header("content-type", "text/plain")
        .body("x")
        .send()
        .await
        .expect("post");
    assert_error(resp, StatusCode::BAD_REQUEST, "unsupported content type").await;

    let resp = agent
        .http
        .get(agent.files(&[("path", "/tmp"), ("signature_expiration", "soon")]))
        .send()
        .await
        .expect("get");
    assert_error(resp, StatusCode::BAD_REQUEST, "signature_expiration").await;
}

#[tokio::test]
async fn metrics_report_every_field() {
    let agent = Agent::start(Some(TOKEN)).await;
    let resp = agent
        .http
        .get(agent.url("/metrics"))
        .header("x-access-token", TOKEN)
        .send()
        .await
        .expect("metrics");
    assert_eq!(resp.status(), StatusCode::OK);
    let m = json_of(resp).await;
    for key in [
        "ts",
        "cpu_count",
        "mem_total",
        "mem_used",
        "mem_cache",
        "mem_total_mib",
        "mem_used_mib",
        "disk_used",
        "disk_total",
    ] {
        assert!(m[key].is_u64(), "{key} in {m}");
    }
    assert!(m["cpu_used_pct"].is_number(), "{m}");
    assert!(m["cpu_count"].as_u64() >= Some(1));
    assert!(m["mem_total"].as_u64() > Some(0));
    assert!(m["disk_total"].as_u64() > m["disk_used"].as_u64());
    assert!((m["ts"].as_i64().unwrap_or(0) - now()).abs() < 60);
}

/// Block `i` of the 1 GiB test file: a fixed pseudo-random MiB with `i` in its first 8 bytes.
const BLOCK: usize = 1 << 20;
const BLOCKS: u64 = 1024;

fn base_block() -> Vec<u8> {
    let mut x: u32 = 0x9e37_79b9;
    (0..BLOCK)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

#[tokio::test]
async fn one_gib_each_way_in_bounded_memory() {
    let agent = Agent::start(None).await;
    let dir = Scratch::new("/tmp", "big");
    let target = dir.path("big.bin");
    let base = std::sync::Arc::new(base_block());

    let gen = base.clone();
    let body = futures::stream::iter(0..BLOCKS).map(move |i| {
        let mut block = gen.as_ref().clone();
        block[..8].copy_from_slice(&i.to_le_bytes());
        Ok::<_, std::io::Error>(bytes::Bytes::from(block))
    });
    let resp = agent
        .http
        .post(agent.files(&[("path", &target)]))
        .header("content-type", "application/octet-stream")
        .body(reqwest::Body::wrap_stream(body))
        .send()
        .await
        .expect("upload");
    assert_eq!(resp.status(), StatusCode::OK);
    let size = std::fs::metadata(&target).expect("stat").len();
    assert_eq!(size, BLOCKS * BLOCK as u64);

    let resp = agent.get(&target).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut stream = resp.bytes_stream();
    let mut offset: u64 = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.expect("chunk");
        let mut rest = chunk.as_ref();
        while !rest.is_empty() {
            let block = offset / BLOCK as u64;
            let at = (offset % BLOCK as u64) as usize;
            let n = rest.len().min(BLOCK - at);
            let mut expected = base[at..at + n].to_vec();
            for (j, b) in block.to_le_bytes().iter().enumerate() {
                if j >= at && j < at + n {
                    expected[j - at] = *b;
                }
            }
            assert!(rest[..n] == expected[..], "mismatch at byte {offset}");
            rest = &rest[n..];
            offset += n as u64;
        }
    }
    assert_eq!(offset, size);

    let hwm_mib = agent.vm_hwm_kib() / 1024;
    eprintln!("agent VmHWM: {hwm_mib} MiB");
    assert!(hwm_mib < 200, "agent peaked at {hwm_mib} MiB");
    std::fs::remove_file(&target).expect("delete the big file");
}

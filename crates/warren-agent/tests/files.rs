//! End-to-end tests of file transfer over `GET/POST /files` against the real agent binary:
//! raw and multipart uploads, gzip both ways, ranges, metadata headers, and 1 GiB each way.
//! Authentication, error statuses and `/metrics` are in files_access.rs.
//!
//! Needs root (the agent chowns uploads) and a `user` account (`useradd -m user`).

mod files_support;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use futures::StreamExt;
use reqwest::StatusCode;

use files_support::*;

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
            .upload(&q, "application/octet-stream", "hello")
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
        .upload(&[("path", &single)], ct, body)
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
    let resp = agent.upload(&[], ct, body).send().await.expect("upload");
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
    let resp = agent.upload(&[], ct, body).send().await.expect("upload");
    assert_error(resp, StatusCode::BAD_REQUEST, "same path").await;

    // A gzip-encoded multipart body.
    let gz = dir.path("gz-multi.txt");
    let (ct, body) = multipart(&[("file", Some(&gz), b"zipped form")]);
    let resp = agent
        .upload(&[], ct, gzip(&body).await)
        .header("content-encoding", "gzip")
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
        .upload(
            &[("path", &target)],
            "application/octet-stream",
            gzip(&data).await,
        )
        .header("content-encoding", "gzip")
        .send()
        .await
        .expect("upload");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(std::fs::read(&target).expect("file"), data);

    // Not gzip at all: 400, and nothing is created.
    let bad = dir.path("bad.bin");
    let resp = agent
        .upload(
            &[("path", &bad)],
            "application/octet-stream",
            "definitely not gzip",
        )
        .header("content-encoding", "gzip")
        .send()
        .await
        .expect("upload");
    assert_error(resp, StatusCode::BAD_REQUEST, "decompress").await;
    assert!(!Path::new(&bad).exists());

    // The SDKs' default Accept-Encoding gets gzip.
    let resp = agent
        .download(&target, &[("accept-encoding", "gzip, deflate")])
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-encoding"], "gzip");
    assert_eq!(resp.headers()["vary"], "Accept-Encoding");
    let zipped = resp.bytes().await.expect("body");
    assert_eq!(gunzip(&zipped).await, data);

    // Identity refused and nothing else acceptable.
    let resp = agent
        .download(&target, &[("accept-encoding", "identity;q=0")])
        .await;
    assert_error(resp, StatusCode::NOT_ACCEPTABLE, "encoding").await;

    // Ranges are served in identity even when gzip is acceptable.
    let resp = agent
        .download(
            &target,
            &[("range", "bytes=1000-1999"), ("accept-encoding", "gzip")],
        )
        .await;
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

    let resp = agent.download(&target, &[("range", "bytes=-10")]).await;
    assert_eq!(resp.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(
        resp.bytes().await.expect("body").as_ref(),
        &data[data.len() - 10..]
    );

    let resp = agent
        .download(&target, &[("range", &format!("bytes={}-", data.len()))])
        .await;
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
        .upload(
            &[("path", &target)],
            "application/octet-stream",
            reqwest::Body::wrap_stream(body),
        )
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

/// An upload that does not fit on its disk is 507 with the cause, and its client gets that
/// answer (the agent reads off the rest of the body rather than closing on a client still
/// sending, which it would see as a broken pipe); the connection stays usable.
#[tokio::test]
async fn an_upload_past_a_full_disk_is_507_and_the_client_hears_it() {
    let dir = Scratch::new("/tmp", "full");
    std::fs::create_dir_all(&dir.0).expect("mkdir");
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&dir.0)
        .status()
        .expect("mount");
    assert!(mounted.success(), "mounting a small tmpfs needs root");
    // Unmounted before the scratch dir goes (drops run in reverse), also when the test fails.
    let _unmount = Unmount(dir.0.clone());
    let agent = Agent::start(None).await;
    let big = binary_sample(16 << 20);
    let (content_type, form) = multipart(&[("file", Some("big.bin"), &big)]);
    for (kind, body) in [
        ("application/octet-stream", big.clone()),
        (content_type.as_str(), form),
    ] {
        let resp = agent
            .http
            .post(agent.files(&[("path", &dir.path("big.bin"))]))
            .header("content-type", kind)
            .header("x-access-token", TOKEN)
            .body(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{kind}: the client did not get the answer: {e}"));
        assert!(
            resp.headers().get("connection").is_none(),
            "{kind}: {resp:?}"
        );
        assert_error(resp, StatusCode::INSUFFICIENT_STORAGE, "No space left").await;
    }
    let resp = agent.put(&dir.path("small.bin"), b"fits".to_vec()).await;
    assert_eq!(resp.status(), StatusCode::OK);
}

/// Unmounts its path when dropped.
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

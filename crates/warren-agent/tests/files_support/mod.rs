//! Shared by the `/files` test files (files.rs, files_access.rs): an agent that serves
//! `/files` to a token holder, scratch directories, and request bodies.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use async_compression::tokio::bufread::{GzipDecoder, GzipEncoder};
use base64::Engine;
use reqwest::StatusCode;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

pub const TOKEN: &str = "test-token-123";

/// A running agent, killed when dropped.
pub struct Agent {
    child: Child,
    pub base: String,
    pub http: reqwest::Client,
}

impl Agent {
    pub async fn start(token: Option<&str>) -> Agent {
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

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// `/files?<query>` with the query pairs percent-encoded.
    pub fn files(&self, query: &[(&str, &str)]) -> String {
        let mut url = reqwest::Url::parse(&self.url("/files")).expect("url");
        for (k, v) in query {
            url.query_pairs_mut().append_pair(k, v);
        }
        url.to_string()
    }

    /// A POST of `body`, as `content_type`, to `/files?<query>`: ready to send, or to give
    /// more headers first.
    pub fn upload(
        &self,
        query: &[(&str, &str)],
        content_type: impl AsRef<str>,
        body: impl Into<reqwest::Body>,
    ) -> reqwest::RequestBuilder {
        self.http
            .post(self.files(query))
            .header("content-type", content_type.as_ref())
            .body(body)
    }

    /// A GET of `/files?path=<path>` with `headers` besides (no access token).
    pub async fn download(&self, path: &str, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut req = self.http.get(self.files(&[("path", path)]));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.send().await.expect("download")
    }

    pub async fn put(&self, path: &str, data: Vec<u8>) -> reqwest::Response {
        self.http
            .post(self.files(&[("path", path)]))
            .header("content-type", "application/octet-stream")
            .header("x-access-token", TOKEN)
            .body(data)
            .send()
            .await
            .expect("upload")
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.http
            .get(self.files(&[("path", path)]))
            .header("x-access-token", TOKEN)
            .send()
            .await
            .expect("download")
    }

    pub fn vm_hwm_kib(&self) -> u64 {
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
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(parent: &str, tag: &str) -> Scratch {
        let dir = PathBuf::from(format!(
            "{parent}/warren-files-{tag}-{}",
            uuid::Uuid::new_v4().simple()
        ));
        Scratch(dir)
    }
    pub fn path(&self, rest: &str) -> String {
        format!("{}/{rest}", self.0.display())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn user_ids(name: &str) -> (u32, u32) {
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

pub fn binary_sample(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 256) as u8).collect()
}

pub async fn gzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    GzipEncoder::new(data)
        .read_to_end(&mut out)
        .await
        .expect("gzip");
    out
}

pub async fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    GzipDecoder::new(data)
        .read_to_end(&mut out)
        .await
        .expect("gunzip");
    out
}

/// A multipart/form-data body: (field name, filename, data) per part.
pub fn multipart(parts: &[(&str, Option<&str>, &[u8])]) -> (String, Vec<u8>) {
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

pub async fn json_of(resp: reqwest::Response) -> Value {
    resp.json().await.expect("JSON body")
}

/// Asserts a JSON error body with the given status and a message containing `needle`.
pub async fn assert_error(resp: reqwest::Response, status: StatusCode, needle: &str) {
    assert_eq!(resp.status(), status);
    let body = json_of(resp).await;
    assert_eq!(body["code"], status.as_u16(), "{body}");
    let msg = body["message"].as_str().expect("message");
    assert!(msg.contains(needle), "message {msg:?} lacks {needle:?}");
}

pub fn signature(path: &str, op: &str, user: &str, exp: Option<i64>) -> String {
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

pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64
}

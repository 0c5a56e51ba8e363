//! Shared helpers for the agent's integration tests: a real agent process on a free port, and
//! Connect envelope framing.

#![allow(dead_code)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use warren_proto::connect;

pub mod process;

/// A running `warren-agent` on a loopback port, killed on drop.
pub struct Agent {
    child: Child,
    pub port: u16,
    pub base: String,
}

impl Agent {
    pub fn start() -> Agent {
        Self::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Agent {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(env!("CARGO_BIN_EXE_warren-agent"))
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .args(extra)
            .env("WARREN_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("start warren-agent");
        let agent = Agent {
            child,
            port,
            base: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
                use std::io::{Read, Write};
                let _ =
                    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
                let mut out = String::new();
                let _ = s.read_to_string(&mut out);
                if out.starts_with("HTTP/1.1 204") {
                    return agent;
                }
            }
            assert!(
                Instant::now() < deadline,
                "agent did not become healthy on port {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Peak resident memory of the agent (VmHWM), in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One Connect envelope around a message, framed by the codec the agent and the typed client
/// share. Any JSON is accepted, not only the typed messages: these tests also send what the
/// typed messages cannot express (wrong types, explicit defaults).
pub fn envelope<T: serde::Serialize + ?Sized>(flags: u8, msg: &T) -> Vec<u8> {
    let payload = serde_json::to_vec(msg).unwrap();
    connect::encode_frame(flags, &payload).unwrap()
}

/// Splits a complete streamed body into (flags, message) pairs.
pub fn parse_envelopes(body: &[u8]) -> Vec<(u8, serde_json::Value)> {
    connect::decode_all(body, usize::MAX)
        .expect("whole envelopes")
        .into_iter()
        .map(|(flags, payload)| (flags, serde_json::from_slice(&payload).unwrap()))
        .collect()
}

/// Incremental envelope decoder over a streaming response.
pub struct EnvelopeStream {
    resp: reqwest::Response,
    decoder: connect::Decoder,
}

impl EnvelopeStream {
    pub fn new(resp: reqwest::Response) -> Self {
        Self {
            resp,
            decoder: connect::Decoder::new(usize::MAX),
        }
    }

    /// Next (flags, message); `None` when the body ends.
    pub async fn next(&mut self) -> Option<(u8, serde_json::Value)> {
        loop {
            if let Some((flags, payload)) = self.decoder.next_raw().expect("an envelope") {
                return Some((flags, serde_json::from_slice(&payload).unwrap()));
            }
            match self.resp.chunk().await.unwrap() {
                Some(c) => self.decoder.push(&c),
                None => return None,
            }
        }
    }
}

pub fn basic(user: &str) -> String {
    use base64::Engine;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:"))
    )
}

/// uid and gid of a local account, from /etc/passwd (panics when it is missing: the tests need
/// it and say so).
pub fn user_ids(name: &str) -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
    passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() >= 4 && f[0] == name)
        .map(|f| (f[2].parse().unwrap(), f[3].parse().unwrap()))
        .unwrap_or_else(|| panic!("account '{name}' is missing: useradd -m {name}"))
}

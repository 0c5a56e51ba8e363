//! Shared by the `process.Process` test files (process.rs, process_http.rs): raw calls that
//! keep the wire in view (status, envelopes, trailers) with typed request messages.

use base64::Engine;
use serde::Serialize;
use serde_json::Value;
use warren_proto::client::pid as by_pid;
use warren_proto::process::{
    process_input, process_selector, pty, stream_input_request, ProcessConfig, ProcessInput,
    ProcessSelector, Pty, SendInputRequest, SendSignalRequest, Signal, StartRequest,
    StreamInputRequest,
};

use super::{envelope, parse_envelopes, Agent, EnvelopeStream};

pub const STREAM: &str = warren_proto::connect::STREAM_CONTENT_TYPE;

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().http1_only().build().unwrap()
}

pub fn b64(v: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str().unwrap())
        .unwrap()
}

/// A streaming request (`body`: its envelopes) to `process.Process/<method>`, ready to send.
pub fn stream_request(
    agent: &Agent,
    method: &str,
    body: impl Into<reqwest::Body>,
) -> reqwest::RequestBuilder {
    client()
        .post(agent.url(&format!("/process.Process/{method}")))
        .header("content-type", STREAM)
        .body(body)
}

/// Runs a server-streaming call to completion and returns its envelopes.
pub async fn stream_call(
    agent: &Agent,
    method: &str,
    msg: impl Serialize,
    headers: &[(&str, &str)],
) -> Vec<(u8, Value)> {
    let mut req =
        stream_request(agent, method, envelope(0, &msg)).header("connect-protocol-version", "1");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200, "streams always answer 200");
    assert_eq!(resp.headers()["content-type"], STREAM);
    parse_envelopes(&resp.bytes().await.unwrap())
}

/// Runs `cmd` under bash through `Start` until the stream ends: its envelopes.
pub async fn start_bash(agent: &Agent, cmd: &str, headers: &[(&str, &str)]) -> Vec<(u8, Value)> {
    stream_call(agent, "Start", bash(cmd), headers).await
}

pub async fn unary(agent: &Agent, method: &str, msg: impl Serialize) -> (u16, Value) {
    let resp = client()
        .post(agent.url(&format!("/process.Process/{method}")))
        .header("content-type", "application/json")
        .json(&msg)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

pub fn command(cmd: &str, args: &[&str]) -> ProcessConfig {
    ProcessConfig {
        cmd: cmd.into(),
        args: args.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    }
}

pub fn bash(cmd: &str) -> StartRequest {
    StartRequest {
        process: Some(command("/bin/bash", &["-l", "-c", cmd])),
        stdin: Some(false),
        ..Default::default()
    }
}

pub fn by_tag(tag: &str) -> Option<ProcessSelector> {
    Some(ProcessSelector {
        selector: Some(process_selector::Selector::Tag(tag.into())),
    })
}

pub fn input(pid: u32, input: process_input::Input) -> SendInputRequest {
    SendInputRequest {
        process: by_pid(pid),
        input: Some(ProcessInput { input: Some(input) }),
    }
}

pub fn sigkill(pid: u32) -> SendSignalRequest {
    SendSignalRequest {
        process: by_pid(pid),
        signal: Signal::Sigkill.into(),
    }
}

pub fn size(cols: u32, rows: u32) -> Pty {
    Pty {
        size: Some(pty::Size { cols, rows }),
    }
}

/// An interactive bash (no rc files, prompt `$ `) in a PTY of `cols` x `rows`.
pub fn pty_shell(cols: u32, rows: u32) -> StartRequest {
    let mut config = command("/bin/bash", &["--norc", "--noprofile", "-i"]);
    config.envs.insert("PS1".into(), "$ ".into());
    StartRequest {
        process: Some(config),
        pty: Some(size(cols, rows)),
        ..Default::default()
    }
}

pub fn stream_input(event: stream_input_request::Event) -> StreamInputRequest {
    StreamInputRequest { event: Some(event) }
}

/// Opens a server stream and reads its first message, the start event: the stream and the pid.
pub async fn open_stream(
    agent: &Agent,
    method: &str,
    msg: &impl Serialize,
) -> (EnvelopeStream, u32) {
    let resp = stream_request(agent, method, envelope(0, msg))
        .send()
        .await
        .unwrap();
    let mut stream = EnvelopeStream::new(resp);
    let (_, first) = stream.next().await.unwrap();
    let pid = first["event"]["start"]["pid"]
        .as_u64()
        .expect("a start event first");
    (stream, pid as u32)
}

/// A `StreamInput` request's envelopes: the start naming `pid`, then each chunk of stdin, with
/// a keepalive after the first.
pub fn stdin_frames(pid: u32, chunks: &[&[u8]]) -> Vec<Vec<u8>> {
    let start = stream_input_request::StartEvent {
        process: by_pid(pid),
    };
    let mut frames = vec![envelope(
        0,
        &stream_input(stream_input_request::Event::Start(start)),
    )];
    for (i, chunk) in chunks.iter().enumerate() {
        let data = stream_input_request::DataEvent {
            input: Some(ProcessInput {
                input: Some(process_input::Input::Stdin(chunk.to_vec())),
            }),
        };
        frames.push(envelope(
            0,
            &stream_input(stream_input_request::Event::Data(data)),
        ));
        if i == 0 {
            let keepalive =
                stream_input_request::Event::Keepalive(stream_input_request::KeepAlive {});
            frames.push(envelope(0, &stream_input(keepalive)));
        }
    }
    frames
}

/// Sends `frames` as one chunked `StreamInput` body; the answer's envelopes.
pub async fn stream_input_call(agent: &Agent, frames: Vec<Vec<u8>>) -> Vec<(u8, Value)> {
    let body = reqwest::Body::wrap_stream(futures::stream::iter(
        frames.into_iter().map(Ok::<_, std::io::Error>),
    ));
    let resp = stream_request(agent, "StreamInput", body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    parse_envelopes(&resp.bytes().await.unwrap())
}

/// Collected output of a finished `Start`.
pub struct Run {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub end: Value,
    pub trailer: Value,
}

pub fn collect(envs: Vec<(u8, Value)>) -> Run {
    assert!(
        envs.len() >= 2,
        "at least start and end-of-stream: {envs:?}"
    );
    assert_eq!(envs[0].0, 0);
    assert!(
        envs[0].1["event"]["start"]["pid"].as_u64().unwrap() > 0,
        "first event is start: {envs:?}"
    );
    let (last_flags, trailer) = envs.last().unwrap().clone();
    assert_eq!(last_flags, 2, "stream ends with an end-of-stream envelope");
    let mut run = Run {
        stdout: vec![],
        stderr: vec![],
        end: Value::Null,
        trailer,
    };
    let mut ends = 0;
    for (flags, msg) in &envs[1..envs.len() - 1] {
        assert_eq!(*flags, 0);
        let ev = &msg["event"];
        assert!(run.end.is_null(), "nothing after end: {msg}");
        if let Some(d) = ev.get("data") {
            if let Some(s) = d.get("stdout") {
                run.stdout.extend(b64(s));
            }
            if let Some(s) = d.get("stderr") {
                run.stderr.extend(b64(s));
            }
        } else if let Some(e) = ev.get("end") {
            ends += 1;
            run.end = e.clone();
        }
    }
    assert!(ends <= 1);
    run
}

//! The typed agent client against a loopback HTTP/1.1 server that answers with exactly the
//! bytes each test gives it (the real agent is exercised by warren-agent's tests/typed_client.rs).

#![cfg(feature = "client")]

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use warren_proto::client::{self, AgentClient, CallOptions, Error};
use warren_proto::connect::{self, Code, CodecError, ConnectError};
use warren_proto::process::process_event::{data_event, DataEvent, EndEvent, Event, StartEvent};
use warren_proto::process::{
    ProcessConfig, ProcessEvent, SendSignalRequest, Signal, StartRequest, StartResponse,
};

/// What the server saw: the request head (lowercased) and body.
struct Seen {
    head: String,
    body: Vec<u8>,
}

/// Serves one request: answers `status` with `content_type`, then writes `parts` one by one
/// (each flushed on its own, so the client sees them as separate chunks) and closes.
async fn serve_once(
    status: &'static str,
    content_type: &'static str,
    parts: Vec<Vec<u8>>,
) -> (SocketAddr, tokio::task::JoinHandle<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        let head_end = loop {
            let mut chunk = [0u8; 4096];
            let n = s.read(&mut chunk).await.unwrap();
            assert!(n > 0, "client closed before sending its request");
            buf.extend_from_slice(&chunk[..n]);
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        while buf.len() < head_end + len {
            let mut chunk = [0u8; 4096];
            let n = s.read(&mut chunk).await.unwrap();
            assert!(n > 0, "client closed inside its request body");
            buf.extend_from_slice(&chunk[..n]);
        }
        let answer = format!(
            "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\nconnection: close\r\n\r\n"
        );
        s.write_all(answer.as_bytes()).await.unwrap();
        for part in parts {
            // The client may already have given up (an oversized frame): that is its right.
            if s.write_all(&part).await.is_err() || s.flush().await.is_err() {
                break;
            }
            tokio::task::yield_now().await;
        }
        let _ = s.shutdown().await;
        Seen {
            head,
            body: buf[head_end..head_end + len].to_vec(),
        }
    });
    (addr, task)
}

fn event(event: Event) -> StartResponse {
    StartResponse {
        event: Some(ProcessEvent { event: Some(event) }),
    }
}

fn echo_request() -> StartRequest {
    StartRequest {
        process: Some(ProcessConfig {
            cmd: "/bin/echo".into(),
            args: vec!["hi".into()],
            cwd: Some("/tmp".into()),
            ..Default::default()
        }),
        stdin: Some(false),
        ..Default::default()
    }
}

#[tokio::test]
async fn start_streams_typed_events_split_anywhere_then_the_error_trailer() {
    let events = [
        event(Event::Start(StartEvent { pid: 42 })),
        event(Event::Data(DataEvent {
            output: Some(data_event::Output::Stdout(b"hi\n".to_vec())),
        })),
        event(Event::End(EndEvent {
            exit_code: 3,
            exited: true,
            status: "exit status 3".into(),
            error: None,
        })),
    ];
    let mut body = Vec::new();
    for e in &events {
        body.extend(connect::encode_message(e).unwrap());
    }
    let err = ConnectError {
        code: Code::DeadlineExceeded,
        message: "too slow".into(),
    };
    body.extend(connect::encode_end_stream(Err(&err)).unwrap());
    // One byte per write: envelopes and their headers arrive cut at every point.
    let parts = body.iter().map(|b| vec![*b]).collect();
    let (addr, seen) = serve_once("200 OK", connect::STREAM_CONTENT_TYPE, parts).await;

    let agent = AgentClient::at(reqwest::Client::new(), addr)
        .with_access_token("secret")
        .unwrap();
    let opts = CallOptions::new()
        .user("root")
        .keepalive_ping_interval(std::time::Duration::from_secs(50));
    let mut stream = agent.process().start(&echo_request(), &opts).await.unwrap();
    let mut got = Vec::new();
    let end = loop {
        match stream.next().await {
            Ok(Some(e)) => got.push(e),
            Ok(None) => panic!("clean end, but the trailer carried an error"),
            Err(e) => break e,
        }
    };
    assert_eq!(got, events);
    assert_eq!(end.rpc(), Some(&err));
    assert!(
        stream.next().await.unwrap().is_none(),
        "nothing after the end"
    );

    let seen = seen.await.unwrap();
    assert!(
        seen.head
            .starts_with("post /process.process/start http/1.1"),
        "{}",
        seen.head
    );
    assert!(seen.head.contains("content-type: application/connect+json"));
    assert!(seen.head.contains("connect-protocol-version: 1"));
    assert!(seen.head.contains("x-access-token: secret"));
    // "root:" in base64 (cm9vdDo=), lowercased with the rest of the head.
    assert!(
        seen.head.contains("authorization: basic cm9vddo="),
        "{}",
        seen.head
    );
    assert!(seen.head.contains("keepalive-ping-interval: 50"));
    let frames = connect::decode_all(&seen.body, 1 << 20).unwrap();
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].0, 0);
    let sent: StartRequest = serde_json::from_slice(&frames[0].1).unwrap();
    assert_eq!(sent, echo_request());
}

#[tokio::test]
async fn an_oversized_frame_is_refused_before_it_is_buffered() {
    let start = connect::encode_message(&event(Event::Start(StartEvent { pid: 1 }))).unwrap();
    // A header announcing 1 GiB, and only a little of it.
    let huge = vec![0u8, 0x40, 0, 0, 0, b'{'];
    let (addr, _seen) = serve_once("200 OK", connect::STREAM_CONTENT_TYPE, vec![start, huge]).await;
    let agent = AgentClient::at(reqwest::Client::new(), addr);
    let opts = CallOptions::new().max_message(1024);
    let mut stream = agent.process().start(&echo_request(), &opts).await.unwrap();
    assert!(stream.next().await.unwrap().is_some());
    match stream.next().await {
        Err(Error::Decode {
            source: CodecError::FrameTooLarge { len, max },
            ..
        }) => assert_eq!((len, max), (1 << 30, 1024)),
        other => panic!("expected a refused frame, got {other:?}"),
    }
}

#[tokio::test]
async fn a_stream_cut_before_its_trailer_is_an_error() {
    let start = connect::encode_message(&event(Event::Start(StartEvent { pid: 1 }))).unwrap();
    let (addr, _seen) = serve_once(
        "200 OK",
        connect::STREAM_CONTENT_TYPE,
        vec![start, vec![0, 0, 0]],
    )
    .await;
    let agent = AgentClient::at(reqwest::Client::new(), addr);
    let mut stream = agent
        .process()
        .start(&echo_request(), &CallOptions::new())
        .await
        .unwrap();
    assert!(stream.next().await.unwrap().is_some());
    match stream.next().await {
        Err(Error::Truncated { leftover, .. }) => assert_eq!(leftover, 3),
        other => panic!("expected a truncated stream, got {other:?}"),
    }
}

#[tokio::test]
async fn unary_calls_send_json_and_decode_errors() {
    let (addr, seen) = serve_once("200 OK", "application/json", vec![b"{}".to_vec()]).await;
    let agent = AgentClient::at(reqwest::Client::new(), addr);
    let request = SendSignalRequest {
        process: client::pid(7),
        signal: Signal::Sigkill as i32,
    };
    agent
        .process()
        .send_signal(&request, &CallOptions::new())
        .await
        .unwrap();
    let seen = seen.await.unwrap();
    assert!(seen.head.starts_with("post /process.process/sendsignal "));
    assert!(seen.head.contains("content-type: application/json"));
    let body: serde_json::Value = serde_json::from_slice(&seen.body).unwrap();
    assert_eq!(
        body,
        serde_json::json!({"process": {"pid": 7}, "signal": "SIGNAL_SIGKILL"})
    );

    let (addr, _) = serve_once(
        "404 Not Found",
        "application/json",
        vec![br#"{"code":"not_found","message":"process with pid 7 not found"}"#.to_vec()],
    )
    .await;
    let agent = AgentClient::at(reqwest::Client::new(), addr);
    let err = agent
        .process()
        .send_signal(&request, &CallOptions::new())
        .await
        .unwrap_err();
    assert_eq!(err.rpc().map(|e| e.code), Some(Code::NotFound));

    // Not the agent: a proxy's own error body (its code is a number) stays an HTTP error.
    let (addr, _) = serve_once(
        "502 Bad Gateway",
        "application/json",
        vec![br#"{"code":502,"message":"sandbox was not found"}"#.to_vec()],
    )
    .await;
    let agent = AgentClient::at(reqwest::Client::new(), addr);
    match agent
        .process()
        .send_signal(&request, &CallOptions::new())
        .await
    {
        Err(Error::Http { status, body, .. }) => {
            assert_eq!(status, 502);
            assert!(body.contains("sandbox was not found"));
        }
        other => panic!("expected an HTTP error, got {other:?}"),
    }
}

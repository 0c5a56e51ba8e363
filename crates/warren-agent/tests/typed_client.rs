//! The typed client of `warren_proto::client` against the real agent: what the host, the CLI
//! and the test helpers send is what the agent accepts, and what it answers decodes. A change
//! to one side of `proto/envd` (or of the framing) that the other does not follow fails here.

mod common;

use std::time::Duration;

use common::Agent;
use warren_proto::client::{self, AgentClient, CallOptions, Error, EventStream, ProcessClient};
use warren_proto::connect::Code;
use warren_proto::process::process_event::data_event::Output;
use warren_proto::process::process_event::{DataEvent, EndEvent, Event, StartEvent};
use warren_proto::process::{
    process_input, pty, ConnectRequest, ConnectResponse, ProcessConfig, ProcessEvent, ProcessInput,
    Pty, SendInputRequest, SendSignalRequest, SendSignalResponse, Signal, StartRequest,
    StartResponse, UpdateRequest,
};

fn agent_client(agent: &Agent) -> AgentClient {
    AgentClient::new(reqwest::Client::new(), agent.base.clone())
}

fn bash(cmd: &str) -> StartRequest {
    StartRequest {
        process: Some(ProcessConfig {
            cmd: "/bin/bash".into(),
            args: vec!["-c".into(), cmd.into()],
            ..Default::default()
        }),
        stdin: Some(false),
        ..Default::default()
    }
}

fn event(msg: StartResponse) -> Option<Event> {
    msg.event.and_then(|ProcessEvent { event }| event)
}

/// Starts `req` and reads the first event, its start: the stream and the pid.
async fn start(
    process: &ProcessClient<'_>,
    req: &StartRequest,
    opts: &CallOptions,
) -> (EventStream<StartResponse>, u32) {
    let mut stream = process.start(req, opts).await.unwrap();
    let pid = match event(stream.next().await.unwrap().unwrap()) {
        Some(Event::Start(StartEvent { pid })) => pid,
        other => panic!("first event: {other:?}"),
    };
    (stream, pid)
}

/// Attaches to the events of the running process `pid`.
async fn attach(
    process: &ProcessClient<'_>,
    pid: u32,
    opts: &CallOptions,
) -> EventStream<ConnectResponse> {
    let request = ConnectRequest {
        process: client::pid(pid),
    };
    process.connect(&request, opts).await.unwrap()
}

/// Sends `signal` to the process `pid`.
async fn signal(
    process: &ProcessClient<'_>,
    pid: u32,
    signal: Signal,
    opts: &CallOptions,
) -> Result<SendSignalResponse, Error> {
    let request = SendSignalRequest {
        process: client::pid(pid),
        signal: signal as i32,
    };
    process.send_signal(&request, opts).await
}

/// Reads a stream to its clean end: (pid, stdout, stderr, pty output, end event).
async fn finish(
    mut stream: EventStream<StartResponse>,
) -> (u32, Vec<u8>, Vec<u8>, Vec<u8>, EndEvent) {
    let (mut pid, mut out, mut err, mut pty, mut end) = (0, vec![], vec![], vec![], None);
    while let Some(msg) = stream.next().await.unwrap() {
        match event(msg) {
            Some(Event::Start(StartEvent { pid: p })) => pid = p,
            Some(Event::Data(DataEvent { output: Some(o) })) => match o {
                Output::Stdout(b) => out.extend(b),
                Output::Stderr(b) => err.extend(b),
                Output::Pty(b) => pty.extend(b),
            },
            Some(Event::End(e)) => end = Some(e),
            _ => {}
        }
    }
    (
        pid,
        out,
        err,
        pty,
        end.expect("an end event before the clean end"),
    )
}

#[tokio::test]
async fn start_with_user_cwd_env_and_token() {
    let agent = Agent::start_with(&["--access-token", "tok"]);
    let mut req = bash("whoami; pwd; echo $GREETING; echo oops >&2; exit 7");
    let config = req.process.as_mut().unwrap();
    config.cwd = Some("/tmp".into());
    config.envs.insert("GREETING".into(), "hello".into());

    // No token: the agent refuses before the RPC (a plain 401, not a Connect error).
    match agent_client(&agent)
        .process()
        .start(&req, &CallOptions::new())
        .await
    {
        Err(Error::Http { status, .. }) => assert_eq!(status, 401),
        other => panic!("expected a 401, got {other:?}"),
    }

    let client = agent_client(&agent).with_access_token("tok").unwrap();
    let opts = CallOptions::new()
        .user("root")
        .keepalive_ping_interval(Duration::from_secs(50));
    let stream = client.process().start(&req, &opts).await.unwrap();
    let (pid, out, err, _, end) = finish(stream).await;
    assert!(pid > 0);
    assert_eq!(String::from_utf8_lossy(&out), "root\n/tmp\nhello\n");
    assert_eq!(err, b"oops\n");
    assert_eq!(end.exit_code, 7);
    assert!(end.exited);

    // An unknown user is the agent's own error, typed.
    let err = client
        .process()
        .start(&req, &CallOptions::new().user("no-such-user"))
        .await;
    let err = match err {
        Ok(mut stream) => stream.next().await.unwrap_err(),
        Err(e) => e,
    };
    assert_eq!(
        err.rpc().map(|e| e.code),
        Some(Code::Unauthenticated),
        "{err:?}"
    );
}

#[tokio::test]
async fn pty_input_resize_and_connect() {
    let agent = Agent::start();
    let client = agent_client(&agent);
    let process = client.process();
    let opts = CallOptions::new().user("root");
    let size = |cols, rows| {
        Some(Pty {
            size: Some(pty::Size { cols, rows }),
        })
    };
    let req = StartRequest {
        process: Some(ProcessConfig {
            cmd: "/bin/bash".into(),
            args: vec!["--norc".into(), "-i".into()],
            ..Default::default()
        }),
        pty: size(80, 24),
        ..Default::default()
    };
    let (mut stream, pid) = start(&process, &req, &opts).await;

    process
        .update(
            &UpdateRequest {
                process: client::pid(pid),
                pty: size(100, 30),
            },
            &opts,
        )
        .await
        .unwrap();
    // A second subscriber sees the same process's output.
    let mut attached = attach(&process, pid, &opts).await;
    process
        .send_input(
            &SendInputRequest {
                process: client::pid(pid),
                input: Some(ProcessInput {
                    input: Some(process_input::Input::Pty(b"stty size; exit 5\n".to_vec())),
                }),
            },
            &opts,
        )
        .await
        .unwrap();
    let mut pty_out = Vec::new();
    let end = loop {
        match event(stream.next().await.unwrap().expect("an end event")) {
            Some(Event::Data(DataEvent {
                output: Some(Output::Pty(b)),
            })) => pty_out.extend(b),
            Some(Event::End(end)) => break end,
            _ => {}
        }
    };
    assert!(
        String::from_utf8_lossy(&pty_out).contains("30 100"),
        "the resize reached the PTY: {:?}",
        String::from_utf8_lossy(&pty_out)
    );
    assert_eq!(end.exit_code, 5);
    assert!(stream.next().await.unwrap().is_none());
    let mut saw_end = false;
    while let Some(msg) = attached.next().await.unwrap() {
        if let Some(Event::End(e)) = msg.event.and_then(|e| e.event) {
            assert_eq!(e.exit_code, 5);
            saw_end = true;
        }
    }
    assert!(saw_end, "the connected stream saw the end too");
}

#[tokio::test]
async fn signal_by_pid_then_a_typed_not_found() {
    let agent = Agent::start();
    let client = agent_client(&agent);
    let process = client.process();
    let opts = CallOptions::new().user("root");
    // SIGKILL by pid ends a long command; the listing no longer has it afterwards.
    let (stream, pid) = start(&process, &bash("sleep 60"), &opts).await;
    let listed = process.list(&opts).await.unwrap();
    assert!(listed.processes.iter().any(|p| p.pid == pid), "{listed:?}");
    signal(&process, pid, Signal::Sigkill, &opts).await.unwrap();
    let (_, _, _, _, end) = finish(stream).await;
    assert!(end.status.contains("killed"), "{end:?}");

    // A pid the agent does not know is its typed not_found.
    let err = signal(&process, pid, Signal::Sigterm, &opts)
        .await
        .unwrap_err();
    assert_eq!(err.rpc().map(|e| e.code), Some(Code::NotFound), "{err:?}");
}

/// The host starts a template's service this way: it reads up to the start event and drops
/// the stream. The process must outlive the stream (it belongs to the agent).
#[tokio::test]
async fn a_dropped_start_stream_leaves_the_process_running() {
    let agent = Agent::start();
    let client = agent_client(&agent);
    let process = client.process();
    let opts = CallOptions::new().user("root");
    let (stream, pid) = start(&process, &bash("sleep 60"), &opts).await;
    drop(stream);
    // It can still be attached to, and the agent still lists it.
    let mut attached = attach(&process, pid, &opts).await;
    let first = attached.next().await.unwrap().unwrap();
    match first.event.and_then(|e| e.event) {
        Some(Event::Start(StartEvent { pid: p })) => assert_eq!(p, pid),
        other => panic!("first event of Connect: {other:?}"),
    }
    drop(attached);
    let listed = process.list(&opts).await.unwrap();
    assert!(listed.processes.iter().any(|p| p.pid == pid), "{listed:?}");
    signal(&process, pid, Signal::Sigkill, &opts).await.unwrap();
}

//! The `process.Process` service over real HTTP against a real agent: starting, output,
//! users and environment, background processes and their input, signals, PTYs, and the
//! errors bad input gets. Access tokens, `/init`, h2c and large output are in process_http.rs.

mod common;

use std::time::Duration;

use common::process::*;
use common::{basic, parse_envelopes, Agent, EnvelopeStream};
use serde_json::{json, Value};
use warren_proto::client::pid as by_pid;
use warren_proto::process::{
    process_input, CloseStdinRequest, ConnectRequest, ListRequest, ProcessInput, SendInputRequest,
    StartRequest, UpdateRequest,
};

#[tokio::test]
async fn start_streams_start_output_and_one_end() {
    let agent = Agent::start();
    let run = collect(start_bash(&agent, "echo hi; echo oops >&2; exit 3", &[]).await);
    assert_eq!(run.stdout, b"hi\n");
    assert_eq!(run.stderr, b"oops\n");
    assert_eq!(run.end["exitCode"], 3);
    assert_eq!(run.end["exited"], true);
    assert_eq!(run.end["status"], "exit status 3");
    assert_eq!(run.end["error"], "exit status 3");
    assert_eq!(run.trailer, json!({}));

    let ok = collect(start_bash(&agent, "true", &[]).await);
    assert!(
        ok.end.get("exitCode").is_none(),
        "zero exit code is omitted: {}",
        ok.end
    );
    assert!(ok.end.get("error").is_none());
}

#[tokio::test]
async fn runs_as_the_requested_user_with_a_login_environment() {
    let agent = Agent::start();
    let script = "id -un; echo $HOME; echo $USER; pwd; echo $FOO; echo $E2B_SANDBOX";
    let mut msg = bash(script);
    let config = msg.process.as_mut().unwrap();
    config.envs.insert("FOO".into(), "bar".into());
    let run = collect(stream_call(&agent, "Start", msg.clone(), &[]).await);
    let out = String::from_utf8(run.stdout).unwrap();
    let home = out.lines().nth(1).unwrap().to_string();
    assert_eq!(out, format!("user\n{home}\nuser\n{home}\nbar\ntrue\n"));

    let root = basic("root");
    let run = collect(stream_call(&agent, "Start", msg, &[("authorization", &root)]).await);
    assert_eq!(
        String::from_utf8(run.stdout).unwrap(),
        "root\n/root\nroot\n/root\nbar\ntrue\n"
    );
}

#[tokio::test]
async fn cwd_is_honoured_and_a_missing_cwd_is_invalid_argument() {
    let agent = Agent::start();
    let mut msg = bash("pwd");
    msg.process.as_mut().unwrap().cwd = Some("/tmp".into());
    let run = collect(stream_call(&agent, "Start", msg.clone(), &[]).await);
    assert_eq!(run.stdout, b"/tmp\n");

    msg.process.as_mut().unwrap().cwd = Some("/does/not/exist".into());
    let envs = stream_call(&agent, "Start", msg, &[]).await;
    assert_eq!(envs.len(), 1);
    assert_eq!(envs[0].0, 2);
    assert_eq!(envs[0].1["error"]["code"], "invalid_argument");
    assert_eq!(
        envs[0].1["error"]["message"],
        "cwd '/does/not/exist' does not exist"
    );
}

#[tokio::test]
async fn unknown_user_and_bad_command_fail_in_the_trailer() {
    let agent = Agent::start();
    let nobody = basic("no-such-user");
    let envs = start_bash(&agent, "true", &[("authorization", &nobody)]).await;
    assert_eq!(envs[0].1["error"]["code"], "unauthenticated");
    assert_eq!(
        envs[0].1["error"]["message"],
        "invalid username: 'no-such-user'"
    );

    let envs = stream_call(
        &agent,
        "Start",
        StartRequest {
            process: Some(command("/no/such/binary", &[])),
            ..Default::default()
        },
        &[],
    )
    .await;
    assert_eq!(envs[0].1["error"]["code"], "invalid_argument");
}

#[tokio::test]
async fn stdin_false_reads_eof() {
    let agent = Agent::start();
    let run = collect(start_bash(&agent, "cat; echo done", &[]).await);
    assert_eq!(run.stdout, b"done\n");
}

#[tokio::test]
async fn deadline_kills_the_process_and_ends_with_deadline_exceeded() {
    let agent = Agent::start();
    let envs = start_bash(&agent, "sleep 30", &[("connect-timeout-ms", "500")]).await;
    let (flags, trailer) = envs.last().unwrap();
    assert_eq!(*flags, 2);
    assert_eq!(trailer["error"]["code"], "deadline_exceeded");
    // The process is gone: nothing is left running.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, list) = unary(&agent, "List", ListRequest {}).await;
    assert!(list.get("processes").is_none(), "no process left: {list}");
}

#[tokio::test]
async fn keepalives_are_sent_when_idle() {
    let agent = Agent::start();
    let envs = start_bash(
        &agent,
        "sleep 2.5; echo x",
        &[("keepalive-ping-interval", "1")],
    )
    .await;
    let keepalives = envs
        .iter()
        .filter(|(_, m)| m["event"].get("keepalive").is_some())
        .count();
    assert!(keepalives >= 1, "expected keepalive events: {envs:?}");
}

#[tokio::test]
async fn background_process_list_connect_input_signal() {
    let agent = Agent::start();
    // A tagged process with stdin that echoes each line back.
    let msg = StartRequest {
        process: Some(command(
            "/bin/bash",
            &["-c", "while read l; do echo got:$l; done; echo eof"],
        )),
        tag: Some("echoer".into()),
        stdin: Some(true),
        ..Default::default()
    };
    let (mut start_stream, pid) = open_stream(&agent, "Start", &msg).await;

    let (status, list) = unary(&agent, "List", ListRequest {}).await;
    assert_eq!(status, 200);
    let procs = list["processes"].as_array().unwrap();
    let me = procs.iter().find(|p| p["pid"] == pid).expect("listed");
    assert_eq!(me["tag"], "echoer");
    assert_eq!(me["config"]["cmd"], "/bin/bash");

    // A second stream attached by tag sees output produced from now on.
    let connect = ConnectRequest {
        process: by_tag("echoer"),
    };
    let (mut connected, connected_pid) = open_stream(&agent, "Connect", &connect).await;
    assert_eq!(connected_pid, pid);

    let (status, _) = unary(
        &agent,
        "SendInput",
        input(pid, process_input::Input::Stdin(b"hello\n".to_vec())),
    )
    .await;
    assert_eq!(status, 200);
    for s in [&mut start_stream, &mut connected] {
        let (_, m) = s.next().await.unwrap();
        assert_eq!(b64(&m["event"]["data"]["stdout"]), b"got:hello\n");
    }

    // Client-streaming input, in order, on one chunked request body.
    let envs = stream_input_call(&agent, stdin_frames(pid, &[b"a\n", b"b\n"])).await;
    assert_eq!(envs, vec![(0, json!({})), (2, json!({}))]);
    let mut seen = Vec::new();
    while seen.len() < b"got:a\ngot:b\n".len() {
        let (_, m) = start_stream.next().await.unwrap();
        seen.extend(b64(&m["event"]["data"]["stdout"]));
    }
    assert_eq!(seen, b"got:a\ngot:b\n");

    // Closing stdin ends the loop; the process exits normally.
    let (status, _) = unary(
        &agent,
        "CloseStdin",
        CloseStdinRequest {
            process: by_pid(pid),
        },
    )
    .await;
    assert_eq!(status, 200);
    let mut tail = Vec::new();
    let mut end = Value::Null;
    while let Some((flags, m)) = start_stream.next().await {
        if flags == 2 {
            assert_eq!(m, json!({}));
            break;
        }
        if let Some(d) = m["event"]["data"].get("stdout") {
            tail.extend(b64(d));
        }
        if let Some(e) = m["event"].get("end") {
            end = e.clone();
        }
    }
    assert_eq!(tail, b"eof\n");
    assert_eq!(end["exited"], true);

    // A finished process stays connectable: start + stored end.
    let envs = stream_call(
        &agent,
        "Connect",
        ConnectRequest {
            process: by_pid(pid),
        },
        &[],
    )
    .await;
    assert_eq!(envs.len(), 3, "{envs:?}");
    assert_eq!(envs[1].1["event"]["end"]["exited"], true);
    // But it is no longer running.
    let (status, err) = unary(&agent, "SendSignal", sigkill(pid)).await;
    assert_eq!((status, err["code"].as_str()), (404, Some("not_found")));
}

#[tokio::test]
async fn sigkill_reaches_the_whole_process_group() {
    let agent = Agent::start();
    let msg = bash("sleep 300 & echo $!; wait");
    let (mut s, pid) = open_stream(&agent, "Start", &msg).await;
    let (_, out) = s.next().await.unwrap();
    let child: u32 = String::from_utf8(b64(&out["event"]["data"]["stdout"]))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(std::path::Path::new(&format!("/proc/{child}")).exists());

    let (status, _) = unary(&agent, "SendSignal", sigkill(pid)).await;
    assert_eq!(status, 200);
    let mut end = Value::Null;
    while let Some((flags, m)) = s.next().await {
        if flags == 2 {
            break;
        }
        if let Some(e) = m["event"].get("end") {
            end = e.clone();
        }
    }
    assert_eq!(end["exitCode"], -1);
    assert_eq!(end["status"], "signal: killed");
    // The grandchild in the same group died too (poll: reaping is asynchronous).
    let gone = async {
        while std::fs::read_to_string(format!("/proc/{child}/stat"))
            .is_ok_and(|s| !s.contains(") Z "))
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), gone)
        .await
        .expect("grandchild killed");

    let (status, err) = unary(&agent, "SendSignal", sigkill(999_999)).await;
    assert_eq!((status, err["code"].as_str()), (404, Some("not_found")));
    // Written out: typed messages omit a default enum, and the agent must read its name too.
    let (status, err) = unary(
        &agent,
        "SendSignal",
        json!({"process": {"pid": pid}, "signal": "SIGNAL_UNSPECIFIED"}),
    )
    .await;
    assert!(status == 404 || status == 501, "{status} {err}");
}

#[tokio::test]
async fn pty_is_a_real_terminal_with_resize_and_raw_input() {
    let agent = Agent::start();
    let mut msg = pty_shell(100, 30);
    let config = msg.process.as_mut().unwrap();
    config.envs.insert("TERM".into(), "xterm".into());
    let (mut s, pid) = open_stream(&agent, "Start", &msg).await;

    async fn until(s: &mut EnvelopeStream, needle: &str) -> String {
        let mut seen = String::new();
        let wait = async {
            while !seen.contains(needle) {
                let (flags, m) = s.next().await.expect("stream open");
                assert_eq!(flags, 0, "unexpected end: {m}");
                if let Some(p) = m["event"]["data"].get("pty") {
                    seen.push_str(&String::from_utf8_lossy(&b64(p)));
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(20), wait)
            .await
            .unwrap_or_else(|_| panic!("no {needle:?} in {seen:?}"));
        seen
    }

    let send = |text: &str| {
        unary(
            &agent,
            "SendInput",
            input(pid, process_input::Input::Pty(text.as_bytes().to_vec())),
        )
    };
    let (status, _) = send("tty; stty size\n").await;
    assert_eq!(status, 200);
    let out = until(&mut s, "30 100").await;
    assert!(out.contains("/dev/pts/"), "{out}");

    let (status, _) = unary(
        &agent,
        "Update",
        UpdateRequest {
            process: by_pid(pid),
            pty: Some(size(120, 40)),
        },
    )
    .await;
    assert_eq!(status, 200);
    send("stty size\n").await;
    until(&mut s, "40 120").await;

    // stdin bytes to a pty process and CloseStdin are refused.
    let (status, _) = unary(
        &agent,
        "SendInput",
        input(pid, process_input::Input::Stdin(b"x".to_vec())),
    )
    .await;
    assert_eq!(status, 500);
    let (status, _) = unary(
        &agent,
        "CloseStdin",
        CloseStdinRequest {
            process: by_pid(pid),
        },
    )
    .await;
    assert_eq!(status, 500);

    send("exit 7\n").await;
    let mut end = Value::Null;
    while let Some((flags, m)) = s.next().await {
        if flags == 2 {
            break;
        }
        if let Some(e) = m["event"].get("end") {
            end = e.clone();
        }
    }
    assert_eq!(end["exitCode"], 7);
}

#[tokio::test]
async fn bad_input_gets_connect_errors_and_the_agent_keeps_serving() {
    let agent = Agent::start();
    let c = client();
    // Malformed JSON on a unary call; an unknown method.
    for (method, body, status, code) in [
        ("List", "{nope", 400, "invalid_argument"),
        ("Nope", "{}", 404, "unimplemented"),
    ] {
        let resp = c
            .post(agent.url(&format!("/process.Process/{method}")))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), status, "{method}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["code"], code, "{method}");
    }
    // Unknown pid / tag / missing selector.
    let (s, v) = unary(
        &agent,
        "SendInput",
        SendInputRequest {
            process: by_tag("ghost"),
            input: Some(ProcessInput {
                input: Some(process_input::Input::Stdin(Vec::new())),
            }),
        },
    )
    .await;
    assert_eq!((s, v["code"].as_str()), (404, Some("not_found")));
    let (s, v) = unary(&agent, "CloseStdin", CloseStdinRequest { process: None }).await;
    assert_eq!((s, v["code"].as_str()), (501, Some("unimplemented")));
    let envs = stream_call(
        &agent,
        "Connect",
        ConnectRequest {
            process: by_pid(424242),
        },
        &[],
    )
    .await;
    assert_eq!(envs[0].1["error"]["code"], "not_found");
    // A garbage envelope (huge declared length) and a truncated one.
    for body in [
        vec![0u8, 0xff, 0xff, 0xff, 0xff, b'{'],
        vec![0u8, 0, 0, 0, 10, b'{'],
    ] {
        let resp = c
            .post(agent.url("/process.Process/Start"))
            .header("content-type", STREAM)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let envs = parse_envelopes(&resp.bytes().await.unwrap());
        assert_eq!(envs[0].0, 2);
        assert!(envs[0].1["error"]["code"].is_string());
    }
    // Wrong type for a field.
    // Written out: a message of the wrong shape, which no typed message can be.
    let envs = stream_call(&agent, "Start", json!({"process": {"cmd": 5}}), &[]).await;
    assert_eq!(envs[0].1["error"]["code"], "invalid_argument");
    // Still healthy and serving.
    let run = collect(start_bash(&agent, "echo alive", &[]).await);
    assert_eq!(run.stdout, b"alive\n");
}

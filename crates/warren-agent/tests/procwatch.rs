//! Programs executed under the agent reach its journal (`process.exec`, `process.exit`) when
//! it runs as a microVM's agent (`--sync-clock`), and only then: a host's agent never records
//! the host. Commands typed in a terminal are programs like any other. Watching needs root of the initial namespaces (as in a microVM); elsewhere the
//! recording test skips, saying why.

mod common;

use std::time::{Duration, Instant};

use common::process::{b64, collect, command, input, open_stream, pty_shell, stream_call, unary};
use common::Agent;
use serde_json::Value;
use warren_proto::process::{process_input, StartRequest};

async fn journal(agent: &Agent) -> Vec<Value> {
    let page: Value = reqwest::get(agent.url("/journal?after=0&limit=1000"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    page["entries"].as_array().cloned().unwrap_or_default()
}

fn argv(e: &Value) -> Vec<String> {
    serde_json::from_str(e["fields"]["argv"].as_str().unwrap_or("[]")).unwrap_or_default()
}

async fn run_marked(agent: &Agent, marker: &str) {
    // Programs that live a while: one gone before its /proc is read is journaled by its name
    // only (see docs/agent.md).
    let script = format!("/bin/sleep 0.1; : {marker}; exit 3");
    let msg = StartRequest {
        process: Some(command("/bin/sh", &["-c", &script])),
        stdin: Some(false),
        ..Default::default()
    };
    let run = collect(stream_call(agent, "Start", msg, &[]).await);
    assert_eq!(run.end["exitCode"], 3, "{:?}", run.end);
}

#[tokio::test]
async fn programs_run_under_a_microvm_agent_are_journaled_with_argv_and_status() {
    if !can_watch() {
        return;
    }
    let agent = Agent::start_with(&["--sync-clock"]);
    // The agent subscribes in a thread of its own after it starts listening: run marked
    // commands until one is seen.
    let deadline = Instant::now() + Duration::from_secs(20);
    for i in 0.. {
        assert!(Instant::now() < deadline, "no process.exec recorded");
        let marker = format!("procwatch-marker-{}-{i}", std::process::id());
        run_marked(&agent, &marker).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let entries = journal(&agent).await;
        let Some(shell) = entries.iter().find(|e| {
            e["kind"] == "process.exec"
                && argv(e).first().map(String::as_str) == Some("/bin/sh")
                && argv(e).iter().any(|a| a.contains(&marker))
        }) else {
            continue;
        };
        let f = &shell["fields"];
        let pid = f["pid"].as_str().unwrap();
        assert!(pid.parse::<u32>().unwrap() > 0, "{shell}");
        assert!(f["ppid"].as_str().is_some(), "{shell}");
        assert!(
            f["uid"].as_str().is_some() && f["user"].as_str().is_some(),
            "{shell}"
        );
        assert!(f["cwd"].as_str().unwrap().starts_with('/'), "{shell}");
        assert_eq!(
            shell["message"],
            format!("exec /bin/sh -c /bin/sleep 0.1; : {marker}; exit 3")
        );
        // Its child, and its end with status 3 after its exec.
        let sleep = entries
            .iter()
            .find(|e| {
                e["kind"] == "process.exec"
                    && argv(e) == ["/bin/sleep", "0.1"]
                    && e["fields"]["ppid"].as_str() == Some(pid)
            })
            .unwrap_or_else(|| panic!("the shell's child: {entries:#?}"));
        assert!(sleep["seq"].as_u64() > shell["seq"].as_u64());
        let exit = entries
            .iter()
            .find(|e| e["kind"] == "process.exit" && e["fields"]["pid"].as_str() == Some(pid))
            .unwrap_or_else(|| panic!("the shell's exit: {entries:#?}"));
        assert_eq!(exit["fields"]["exit_code"], "3", "{exit}");
        let ran: u64 = exit["fields"]["duration_ms"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(ran >= 100, "{exit}");
        assert!(exit["seq"].as_u64() > shell["seq"].as_u64());
        return;
    }
}

/// Whether this host can watch (root of the initial namespaces), saying why not.
fn can_watch() -> bool {
    if !warren_testkit::require("root", warren_testkit::is_root()) {
        return false;
    }
    if let Err(e) = warren_procwatch::Watcher::subscribe() {
        warren_testkit::skip(format!("the process events connector: {e}"));
        return false;
    }
    true
}

/// Waits until `agent` journals programs (it subscribes in a thread after it starts).
async fn until_watching(agent: &Agent) {
    let deadline = Instant::now() + Duration::from_secs(20);
    for i in 0.. {
        let marker = format!("procwatch-ready-{}-{i}", std::process::id());
        run_marked(agent, &marker).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        if journal(agent)
            .await
            .iter()
            .any(|e| argv(e).iter().any(|a| a.contains(&marker)))
        {
            return;
        }
        assert!(Instant::now() < deadline, "no process.exec recorded");
    }
}

#[tokio::test]
async fn what_is_typed_in_a_terminal_is_journaled_too() {
    if !can_watch() {
        return;
    }
    let agent = Agent::start_with(&["--sync-clock"]);
    until_watching(&agent).await;
    let (mut stream, pid) = open_stream(&agent, "Start", &pty_shell(80, 24)).await;
    let pid = pid.to_string();
    let marker = format!("typed-{}", std::process::id());
    let line = format!("/bin/sh -c 'sleep 0.2; : {marker}'; exit 7\n");
    let (status, _) = unary(
        &agent,
        "SendInput",
        input(
            pid.parse().unwrap(),
            process_input::Input::Pty(line.into_bytes()),
        ),
    )
    .await;
    assert_eq!(status, 200);
    // The terminal's output until the shell ends.
    let mut out = String::new();
    while let Some((flags, m)) = stream.next().await {
        if flags != 0 {
            break;
        }
        if let Some(p) = m["event"]["data"].get("pty") {
            out.push_str(&String::from_utf8_lossy(&b64(p)));
        }
    }
    assert!(out.contains(&marker), "{out}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let entries = journal(&agent).await;
        let echo = entries.iter().find(|e| {
            e["kind"] == "process.exec"
                && argv(e).first().map(String::as_str) == Some("/bin/sh")
                && argv(e).iter().any(|a| a.contains(&marker))
        });
        let shell_exit = entries
            .iter()
            .find(|e| e["kind"] == "process.exit" && e["fields"]["pid"].as_str() == Some(&pid));
        if let (Some(echo), Some(exit)) = (echo, shell_exit) {
            // Typed into the terminal's shell: its child.
            assert_eq!(
                echo["fields"]["ppid"].as_str(),
                Some(pid.as_str()),
                "{echo}"
            );
            assert_eq!(exit["fields"]["exit_code"], "7", "{exit}");
            return;
        }
        assert!(Instant::now() < deadline, "{entries:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn an_agent_on_a_host_records_no_programs() {
    let agent = Agent::start();
    run_marked(&agent, "procwatch-host-marker").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let entries = journal(&agent).await;
    assert!(
        !entries
            .iter()
            .any(|e| e["kind"] == "process.exec" || e["kind"] == "process.exit"),
        "{entries:#?}"
    );
}

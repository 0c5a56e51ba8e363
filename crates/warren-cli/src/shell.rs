//! `warren sandbox shell`: an interactive terminal in a sandbox, over the agent's PTY API
//! (`process.Process/Start` with `pty`, `SendInput`, `Update`) through the server's proxy.
//!
//! Tasks: a thread reads the local terminal (a blocking read that cannot be cancelled, so not
//! on the runtime), a task turns SIGWINCH into resize messages, one writer task sends input and
//! resizes in order, and the calling task copies the shell's output to stdout until `end`.

use std::io::{IsTerminal, Read, Write};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use warren_proto::client::{self, AgentClient, CallOptions, EventStream};
use warren_proto::process::process_event::data_event::Output;
use warren_proto::process::process_event::{DataEvent, Event, StartEvent};
use warren_proto::process::{
    process_input, pty, ProcessConfig, ProcessInput, Pty, SendInputRequest, SendSignalRequest,
    Signal, StartRequest, StartResponse, UpdateRequest,
};

use crate::client::Client;
use crate::connect;
use crate::sandbox;

/// Size used when the local terminal does not report one.
const FALLBACK_SIZE: (u16, u16) = (80, 24);
/// Most input bytes sent in one `SendInput`.
const MAX_BATCH: usize = 64 * 1024;
/// How long output may still arrive after input could not be delivered (the shell may just
/// have exited, and its `end` event be on the way).
const GRACE: Duration = Duration::from_secs(3);

/// What the writer task sends to the agent, in order.
#[derive(Debug, PartialEq)]
enum Input {
    Bytes(Vec<u8>),
    Resize { cols: u16, rows: u16 },
}

fn pty_size(cols: u16, rows: u16) -> Option<Pty> {
    Some(Pty {
        size: Some(pty::Size {
            cols: cols.into(),
            rows: rows.into(),
        }),
    })
}

/// The `Start` request: a login shell on a PTY of the given size.
fn start_request(term: &str, cols: u16, rows: u16) -> StartRequest {
    StartRequest {
        process: Some(ProcessConfig {
            cmd: "/bin/bash".into(),
            args: vec!["-i".into(), "-l".into()],
            envs: [("TERM", term), ("LANG", "C.UTF-8")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            cwd: None,
        }),
        pty: pty_size(cols, rows),
        ..Default::default()
    }
}

fn send_input_request(pid: u32, bytes: &[u8]) -> SendInputRequest {
    SendInputRequest {
        process: client::pid(pid),
        input: Some(ProcessInput {
            input: Some(process_input::Input::Pty(bytes.to_vec())),
        }),
    }
}

fn update_request(pid: u32, cols: u16, rows: u16) -> UpdateRequest {
    UpdateRequest {
        process: client::pid(pid),
        pty: pty_size(cols, rows),
    }
}

/// Merges what queued up into as few calls as possible without reordering: consecutive
/// input chunks join (up to `MAX_BATCH` bytes), consecutive resizes keep only the last.
fn coalesce(batch: Vec<Input>) -> Vec<Input> {
    let mut out: Vec<Input> = Vec::new();
    for item in batch {
        match (out.last_mut(), item) {
            (Some(Input::Bytes(prev)), Input::Bytes(b)) if prev.len() + b.len() <= MAX_BATCH => {
                prev.extend_from_slice(&b)
            }
            (Some(Input::Resize { cols, rows }), Input::Resize { cols: c, rows: r }) => {
                *cols = c;
                *rows = r;
            }
            (_, item) => out.push(item),
        }
    }
    out
}

/// TERM for the remote shell: the local one, else `xterm-256color`.
fn remote_term(local: Option<String>) -> String {
    local
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| "xterm-256color".to_string())
}

fn terminal_size() -> (u16, u16) {
    match crossterm::terminal::size() {
        Ok((c, r)) if c > 0 && r > 0 => (c, r),
        _ => FALLBACK_SIZE,
    }
}

/// Raw mode for as long as it lives; restored on drop, and by a panic hook before the panic
/// message is printed.
struct RawMode;

impl RawMode {
    fn enable() -> anyhow::Result<RawMode> {
        static HOOK: std::sync::Once = std::sync::Once::new();
        HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                let _ = crossterm::terminal::disable_raw_mode();
                previous(info);
            }));
        });
        crossterm::terminal::enable_raw_mode().context("putting the terminal in raw mode")?;
        Ok(RawMode)
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = crossterm::terminal::disable_raw_mode();
    }
}

pub async fn run(client: &Client, id: &str, user: Option<String>) -> anyhow::Result<u8> {
    if !std::io::stdin().is_terminal() {
        bail!(
            "standard input is not a terminal, and `warren sandbox shell` is interactive; \
             to run a command without one, use `warren sandbox exec {id} -- <command>`"
        );
    }
    let token = sandbox::agent_token(client, id).await?;
    let (cols, rows) = terminal_size();
    let term = remote_term(std::env::var("TERM").ok());
    let mut stream = sandbox::start_process(
        client,
        id,
        &token,
        user.as_deref(),
        &start_request(&term, cols, rows),
    )
    .await?;
    let pid = loop {
        match stream.next().await {
            Ok(Some(msg)) => match connect::event(msg) {
                Some(Event::Start(StartEvent { pid })) => break pid,
                Some(Event::Keepalive(_)) => {}
                other => {
                    bail!("the sandbox did not start the shell: unexpected first event {other:?}")
                }
            },
            Err(e @ client::Error::Rpc { .. }) => {
                return Err(anyhow::Error::new(e).context("starting the shell"))
            }
            Ok(None) | Err(client::Error::Truncated { .. }) => {
                bail!("the sandbox closed the stream before the shell started")
            }
            Err(e) => return Err(e.into()),
        }
    };

    let session = Session {
        agent: client.agent(id, &token)?,
        pid,
    };
    let guard = RawMode::enable()?;
    let result = session.pump(stream).await;
    drop(guard);
    if result.is_err() {
        // Leave no orphan shell behind when the session broke off.
        session.kill().await;
    }
    result
}

struct Session {
    agent: AgentClient,
    pid: u32,
}

impl Session {
    async fn kill(&self) {
        let msg = SendSignalRequest {
            process: client::pid(self.pid),
            signal: Signal::Sigkill as i32,
        };
        let opts = CallOptions::new();
        let process = self.agent.process();
        let call = process.send_signal(&msg, &opts);
        let _ = tokio::time::timeout(Duration::from_secs(3), call).await;
    }

    async fn pump(&self, mut stream: EventStream<StartResponse>) -> anyhow::Result<u8> {
        let (tx, mut rx) = mpsc::channel::<Input>(256);

        // Local terminal → channel. A plain thread: the process may exit while it is blocked.
        let stdin_tx = tx.clone();
        std::thread::spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        if stdin_tx
                            .blocking_send(Input::Bytes(buf[..n].to_vec()))
                            .is_err()
                        {
                            break;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        });

        // SIGWINCH → channel.
        let mut winch = signal(SignalKind::window_change()).context("watching for resizes")?;
        let resize_tx = tx;
        let resizer = tokio::spawn(async move {
            while winch.recv().await.is_some() {
                let (cols, rows) = terminal_size();
                if resize_tx.send(Input::Resize { cols, rows }).await.is_err() {
                    break;
                }
            }
        });

        // Channel → agent, one call at a time so input keeps its order.
        let agent = self.agent.clone();
        let pid = self.pid;
        let mut writer = tokio::spawn(async move {
            let opts = CallOptions::new();
            while let Some(first) = rx.recv().await {
                let mut batch = vec![first];
                while let Ok(more) = rx.try_recv() {
                    batch.push(more);
                }
                let process = agent.process();
                for item in coalesce(batch) {
                    match item {
                        Input::Bytes(b) => process
                            .send_input(&send_input_request(pid, &b), &opts)
                            .await
                            .map(drop)
                            .context("sending input to the shell")?,
                        Input::Resize { cols, rows } => process
                            .update(&update_request(pid, cols, rows), &opts)
                            .await
                            .map(drop)
                            .context("resizing the shell's terminal")?,
                    }
                }
            }
            anyhow::Ok(())
        });

        let result = self.copy_output(&mut stream, &mut writer).await;
        resizer.abort();
        writer.abort();
        result
    }

    async fn copy_output(
        &self,
        stream: &mut EventStream<StartResponse>,
        writer: &mut tokio::task::JoinHandle<anyhow::Result<()>>,
    ) -> anyhow::Result<u8> {
        let mut term = signal(SignalKind::terminate())?;
        let mut hangup = signal(SignalKind::hangup())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut writer_failed: Option<anyhow::Error> = None;
        let grace = tokio::time::sleep(Duration::from_secs(0));
        tokio::pin!(grace);
        loop {
            tokio::select! {
                // `next` is cancel-safe: losing the race to another branch drops nothing.
                frame = stream.next() => match frame {
                    Ok(Some(msg)) => match connect::event(msg) {
                        Some(Event::Data(DataEvent { output: Some(Output::Stderr(bytes)) })) => {
                            std::io::stderr().write_all(&bytes)?;
                        }
                        Some(Event::Data(DataEvent {
                            output: Some(Output::Pty(bytes) | Output::Stdout(bytes)),
                        })) => {
                            let mut out = std::io::stdout();
                            out.write_all(&bytes)?;
                            out.flush()?;
                        }
                        Some(Event::End(end)) => return Ok(connect::exit_code(&end)),
                        _ => {}
                    },
                    Err(e @ client::Error::Rpc { .. }) => {
                        return Err(anyhow::Error::new(e).context("the shell's stream ended"))
                    }
                    Ok(None) | Err(client::Error::Truncated { .. }) => {
                        return Err(writer_failed.unwrap_or_else(|| {
                            anyhow!("the sandbox closed the stream before the shell ended")
                        }))
                    }
                    Err(e) => return Err(e.into()),
                },
                joined = &mut *writer, if writer_failed.is_none() => {
                    let err = match joined {
                        Ok(Ok(())) => anyhow!("input to the shell stopped"),
                        Ok(Err(e)) => e,
                        Err(e) => anyhow!("input task failed: {e}"),
                    };
                    writer_failed = Some(err);
                    grace.as_mut().reset(tokio::time::Instant::now() + GRACE);
                }
                () = &mut grace, if writer_failed.is_some() => {
                    return Err(writer_failed.take().unwrap_or_else(|| anyhow!("input failed")));
                }
                _ = term.recv() => bail!("terminated"),
                _ = hangup.recv() => bail!("the terminal hung up"),
                _ = interrupt.recv() => bail!("interrupted"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use serde_json::json;

    #[test]
    fn start_request_asks_for_a_pty_login_shell() {
        let v = serde_json::to_value(start_request("screen", 120, 40)).unwrap();
        assert_eq!(v["process"]["cmd"], "/bin/bash");
        assert_eq!(v["process"]["args"], json!(["-i", "-l"]));
        assert_eq!(v["process"]["envs"]["TERM"], "screen");
        assert_eq!(v["process"]["envs"]["LANG"], "C.UTF-8");
        assert_eq!(v["pty"], json!({"size": {"cols": 120, "rows": 40}}));
        assert!(v.get("stdin").is_none());
    }

    #[test]
    fn input_is_base64_pty_bytes() {
        let v = serde_json::to_value(send_input_request(42, b"ls\r\x03")).unwrap();
        assert_eq!(
            v,
            json!({"process": {"pid": 42}, "input": {"pty": "bHMNAw=="}})
        );
    }

    #[test]
    fn resize_message() {
        assert_eq!(
            serde_json::to_value(update_request(7, 100, 30)).unwrap(),
            json!({"process": {"pid": 7}, "pty": {"size": {"cols": 100, "rows": 30}}})
        );
    }

    #[test]
    fn coalesce_keeps_order() {
        let batch = vec![
            Input::Bytes(b"a".to_vec()),
            Input::Bytes(b"b".to_vec()),
            Input::Resize { cols: 1, rows: 1 },
            Input::Resize { cols: 2, rows: 3 },
            Input::Bytes(b"c".to_vec()),
        ];
        assert_eq!(
            coalesce(batch),
            vec![
                Input::Bytes(b"ab".to_vec()),
                Input::Resize { cols: 2, rows: 3 },
                Input::Bytes(b"c".to_vec()),
            ]
        );
    }

    #[test]
    fn coalesce_caps_batches() {
        let big = vec![0u8; MAX_BATCH];
        let out = coalesce(vec![Input::Bytes(big.clone()), Input::Bytes(b"x".to_vec())]);
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn term_falls_back() {
        assert_eq!(remote_term(None), "xterm-256color");
        assert_eq!(remote_term(Some(String::new())), "xterm-256color");
        assert_eq!(
            remote_term(Some("screen-256color".into())),
            "screen-256color"
        );
    }
}

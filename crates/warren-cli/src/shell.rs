//! `warren sandbox shell`: an interactive terminal in a sandbox, over the agent's PTY API
//! (`process.Process/Start` with `pty`, `SendInput`, `Update`) through the server's proxy.
//!
//! Tasks: a thread reads the local terminal (a blocking read that cannot be cancelled, so not
//! on the runtime), a task turns SIGWINCH into resize messages, one writer task sends input and
//! resizes in order, and the calling task copies the shell's output to stdout until `end`.

use std::io::{IsTerminal, Read, Write};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use base64::Engine as _;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde_json::{json, Value};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use crate::client::Client;
use crate::connect::{self, Decoder, Frame};
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

/// The `Start` request: a login shell on a PTY of the given size.
fn start_request(term: &str, cols: u16, rows: u16) -> Value {
    json!({
        "process": {
            "cmd": "/bin/bash",
            "args": ["-i", "-l"],
            "envs": {"TERM": term, "LANG": "C.UTF-8"},
        },
        "pty": {"size": {"cols": cols, "rows": rows}},
    })
}

fn send_input_request(pid: u64, bytes: &[u8]) -> Value {
    json!({
        "process": {"pid": pid},
        "input": {"pty": base64::engine::general_purpose::STANDARD.encode(bytes)},
    })
}

fn update_request(pid: u64, cols: u16, rows: u16) -> Value {
    json!({"process": {"pid": pid}, "pty": {"size": {"cols": cols, "rows": rows}}})
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

/// The next envelope of the response, reading more of it as needed; `None` at its end.
async fn next_frame(
    stream: &mut (impl Stream<Item = reqwest::Result<Bytes>> + Unpin),
    decoder: &mut Decoder,
) -> anyhow::Result<Option<Frame>> {
    loop {
        if let Some(frame) = decoder.next_frame()? {
            return Ok(Some(frame));
        }
        match stream.next().await {
            Some(chunk) => decoder.push(&chunk.context("stream from the sandbox broke")?),
            None => return Ok(None),
        }
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
    let resp = sandbox::start_process(
        client,
        id,
        &token,
        user.as_deref(),
        &start_request(&term, cols, rows),
    )
    .await?;
    let mut stream = resp.bytes_stream();
    let mut decoder = Decoder::default();
    let pid = loop {
        match next_frame(&mut stream, &mut decoder).await? {
            Some(Frame::Message(m)) => {
                if let Some(pid) = m["event"]["start"]["pid"].as_u64() {
                    break pid;
                }
                if m["event"].get("keepalive").is_none() {
                    bail!("the sandbox did not start the shell: unexpected first event {m}");
                }
            }
            Some(Frame::End(Err(e))) => bail!("starting the shell: {e}"),
            Some(Frame::End(Ok(()))) | None => {
                bail!("the sandbox closed the stream before the shell started")
            }
        }
    };

    let session = Session {
        client,
        id,
        token: &token,
        pid,
    };
    let guard = RawMode::enable()?;
    let result = session.pump(stream, decoder).await;
    drop(guard);
    if result.is_err() {
        // Leave no orphan shell behind when the session broke off.
        session.kill().await;
    }
    result
}

struct Session<'a> {
    client: &'a Client,
    id: &'a str,
    token: &'a str,
    pid: u64,
}

impl Session<'_> {
    async fn kill(&self) {
        let msg = json!({"process": {"pid": self.pid}, "signal": "SIGNAL_SIGKILL"});
        let call =
            self.client
                .agent_unary(self.id, self.token, "/process.Process/SendSignal", &msg);
        let _ = tokio::time::timeout(Duration::from_secs(3), call).await;
    }

    async fn pump(
        &self,
        mut stream: impl Stream<Item = reqwest::Result<Bytes>> + Unpin,
        mut decoder: Decoder,
    ) -> anyhow::Result<u8> {
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
        let client = self.client.clone();
        let (id, token, pid) = (self.id.to_string(), self.token.to_string(), self.pid);
        let mut writer = tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut batch = vec![first];
                while let Ok(more) = rx.try_recv() {
                    batch.push(more);
                }
                for item in coalesce(batch) {
                    let (procedure, msg) = match item {
                        Input::Bytes(b) => {
                            ("/process.Process/SendInput", send_input_request(pid, &b))
                        }
                        Input::Resize { cols, rows } => {
                            ("/process.Process/Update", update_request(pid, cols, rows))
                        }
                    };
                    client
                        .agent_unary(&id, &token, procedure, &msg)
                        .await
                        .with_context(|| format!("sending {procedure} to the shell"))?;
                }
            }
            anyhow::Ok(())
        });

        let result = self
            .copy_output(&mut stream, &mut decoder, &mut writer)
            .await;
        resizer.abort();
        writer.abort();
        result
    }

    async fn copy_output(
        &self,
        stream: &mut (impl Stream<Item = reqwest::Result<Bytes>> + Unpin),
        decoder: &mut Decoder,
        writer: &mut tokio::task::JoinHandle<anyhow::Result<()>>,
    ) -> anyhow::Result<u8> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut term = signal(SignalKind::terminate())?;
        let mut hangup = signal(SignalKind::hangup())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut writer_failed: Option<anyhow::Error> = None;
        let grace = tokio::time::sleep(Duration::from_secs(0));
        tokio::pin!(grace);
        loop {
            tokio::select! {
                frame = next_frame(stream, decoder) => match frame? {
                    Some(Frame::Message(m)) => {
                        let event = &m["event"];
                        let data = &event["data"];
                        for (key, to_stderr) in [("pty", false), ("stdout", false), ("stderr", true)] {
                            if let Some(d) = data[key].as_str() {
                                let bytes = b64.decode(d).context("malformed output from the sandbox")?;
                                if to_stderr {
                                    std::io::stderr().write_all(&bytes)?;
                                } else {
                                    let mut out = std::io::stdout();
                                    out.write_all(&bytes)?;
                                    out.flush()?;
                                }
                            }
                        }
                        if let Some(end) = event.get("end") {
                            return Ok(connect::exit_code(end));
                        }
                    }
                    Some(Frame::End(Err(e))) => bail!("the shell's stream ended: {e}"),
                    Some(Frame::End(Ok(()))) | None => {
                        return Err(writer_failed.unwrap_or_else(|| {
                            anyhow!("the sandbox closed the stream before the shell ended")
                        }))
                    }
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

    #[test]
    fn start_request_asks_for_a_pty_login_shell() {
        let v = start_request("screen", 120, 40);
        assert_eq!(v["process"]["cmd"], "/bin/bash");
        assert_eq!(v["process"]["args"], json!(["-i", "-l"]));
        assert_eq!(v["process"]["envs"]["TERM"], "screen");
        assert_eq!(v["process"]["envs"]["LANG"], "C.UTF-8");
        assert_eq!(v["pty"], json!({"size": {"cols": 120, "rows": 40}}));
        assert!(v.get("stdin").is_none());
    }

    #[test]
    fn input_is_base64_pty_bytes() {
        let v = send_input_request(42, b"ls\r\x03");
        assert_eq!(
            v,
            json!({"process": {"pid": 42}, "input": {"pty": "bHMNAw=="}})
        );
    }

    #[test]
    fn resize_message() {
        assert_eq!(
            update_request(7, 100, 30),
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

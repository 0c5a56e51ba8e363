//! A small async client of QEMU's machine protocol (QMP): JSON lines over a unix socket.
//!
//! Connect, read the greeting, negotiate with `qmp_capabilities`, then send commands one at a
//! time (each tagged with an id) and read their answers; asynchronous events are kept in a
//! channel for whoever waits for them. Every exchange has a timeout.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::{broadcast, mpsc, Mutex};

use crate::error::{Error, Result};

/// Default time a command may take.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest QMP message accepted. QEMU is not trusted (it emulates devices for a hostile
/// guest): a longer line ends the connection instead of growing the manager's memory.
pub const MAX_LINE: usize = 16 << 20;

/// The next line of `r` without its newline, at most `max` bytes; `None` at a clean end.
pub async fn read_line<R: AsyncBufRead + Unpin>(
    r: &mut R,
    max: usize,
) -> std::io::Result<Option<String>> {
    use std::io::{Error as IoError, ErrorKind};
    let mut line = Vec::new();
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            return if line.is_empty() {
                Ok(None)
            } else {
                Err(ErrorKind::UnexpectedEof.into())
            };
        }
        let (take, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (avail.len(), false),
        };
        if line.len() + take > max {
            return Err(IoError::new(
                ErrorKind::InvalidData,
                format!("QMP message longer than {max} bytes"),
            ));
        }
        line.extend_from_slice(&avail[..take]);
        r.consume(take + usize::from(done));
        if done {
            return String::from_utf8(line)
                .map(Some)
                .map_err(|e| IoError::new(ErrorKind::InvalidData, e));
        }
    }
}

pub struct Qmp {
    writer: Mutex<(OwnedWriteHalf, mpsc::Receiver<Value>)>,
    events: broadcast::Sender<Value>,
    next_id: AtomicU64,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Qmp {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Qmp {
    /// Connects to the socket (retrying until `timeout`, since a just-started QEMU may not have
    /// created it yet) and negotiates capabilities.
    pub async fn connect(path: &Path, timeout: Duration) -> Result<Self> {
        let deadline = tokio::time::Instant::now() + timeout;
        // Nothing announces the socket: retry with a backoff (a QEMU starting on an idle host
        // creates it within milliseconds, one on a loaded host may take seconds).
        let mut pause = Duration::from_millis(1);
        let stream = loop {
            match UnixStream::connect(path).await {
                Ok(s) => break s,
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    return Err(Error::QmpConnection(e))
                }
                Err(_) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
            }
        };
        let (read, write) = stream.into_split();
        let mut lines = BufReader::new(read);
        let greeting = tokio::time::timeout_at(deadline, read_line(&mut lines, MAX_LINE))
            .await
            .map_err(|_| Error::QmpTimeout("greeting".into()))?
            .map_err(Error::QmpConnection)?
            .ok_or_else(|| Error::QmpConnection(std::io::ErrorKind::UnexpectedEof.into()))?;
        let greeting: Value = serde_json::from_str(&greeting).map_err(|e| Error::Qmp {
            command: "greeting".into(),
            message: e.to_string(),
        })?;
        if greeting.get("QMP").is_none() {
            return Err(Error::Qmp {
                command: "greeting".into(),
                message: format!("unexpected {greeting}"),
            });
        }
        let (events, _) = broadcast::channel(64);
        let (tx, rx) = mpsc::channel(8);
        let ev = events.clone();
        let reader = tokio::spawn(async move {
            loop {
                let line = match read_line(&mut lines, MAX_LINE).await {
                    Ok(Some(line)) => line,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "QMP connection dropped");
                        break;
                    }
                };
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                if v.get("event").is_some() {
                    let _ = ev.send(v);
                } else if tx.send(v).await.is_err() {
                    break;
                }
            }
        });
        let qmp = Self {
            writer: Mutex::new((write, rx)),
            events,
            next_id: AtomicU64::new(1),
            reader,
        };
        qmp.execute("qmp_capabilities", json!({})).await?;
        // With `events`, QEMU reports every migration status change as a MIGRATION event,
        // which the waits below sleep on. Best effort: QEMU refuses while a migration runs
        // (a server taking back a VM mid-checkpoint), and the waits re-query then anyway.
        let _ = qmp
            .execute(
                "migrate-set-capabilities",
                json!({ "capabilities": [ { "capability": "events", "state": true } ] }),
            )
            .await;
        Ok(qmp)
    }

    /// Runs `command` with `arguments`; returns its `return` value.
    pub async fn execute(&self, command: &str, arguments: Value) -> Result<Value> {
        self.execute_timeout(command, arguments, COMMAND_TIMEOUT)
            .await
    }

    pub async fn execute_timeout(
        &self,
        command: &str,
        arguments: Value,
        timeout: Duration,
    ) -> Result<Value> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut msg = json!({ "execute": command, "id": id });
        if arguments.as_object().is_some_and(|o| !o.is_empty()) {
            msg["arguments"] = arguments;
        }
        let mut line = msg.to_string();
        line.push('\n');
        let mut guard = self.writer.lock().await;
        let (writer, replies) = &mut *guard;
        let exchange = async {
            writer
                .write_all(line.as_bytes())
                .await
                .map_err(Error::QmpConnection)?;
            loop {
                let reply = replies.recv().await.ok_or_else(|| {
                    Error::QmpConnection(std::io::ErrorKind::UnexpectedEof.into())
                })?;
                // Answers to earlier commands that timed out are skipped.
                if reply.get("id").and_then(Value::as_u64) != Some(id) {
                    continue;
                }
                if let Some(err) = reply.get("error") {
                    return Err(Error::Qmp {
                        command: command.into(),
                        message: err
                            .get("desc")
                            .and_then(Value::as_str)
                            .unwrap_or("error")
                            .to_string(),
                    });
                }
                return Ok(reply.get("return").cloned().unwrap_or(Value::Null));
            }
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| Error::QmpTimeout(command.into()))?
    }

    /// A receiver of the events that arrive from now on.
    pub fn events(&self) -> broadcast::Receiver<Value> {
        self.events.subscribe()
    }

    /// Waits until the migration completed (or failed, or `timeout`): reads `query-migrate`,
    /// then sleeps until the next MIGRATION event (see [`Self::next_event`]).
    pub async fn wait_migration(&self, timeout: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        // Subscribed before the first query: a change after it is never missed.
        let mut events = self.events();
        let mut recheck = RECHECK_FIRST;
        loop {
            let r = self.execute("query-migrate", json!({})).await?;
            match r.get("status").and_then(Value::as_str) {
                Some("completed") => return self.wait_finalized(deadline).await,
                Some("failed") | Some("cancelled") => {
                    return Err(Error::Qmp {
                        command: "migrate".into(),
                        message: r
                            .get("error-desc")
                            .and_then(Value::as_str)
                            .unwrap_or("failed")
                            .to_string(),
                    })
                }
                _ if tokio::time::Instant::now() >= deadline => {
                    return Err(Error::QmpTimeout("migration".into()))
                }
                _ => {
                    next_event(&mut events, &["MIGRATION"], deadline, recheck).await;
                    recheck = (recheck * 2).min(RECHECK_MAX);
                }
            }
        }
    }

    /// QEMU reports an outgoing migration "completed" a moment before it leaves the
    /// `finish-migrate` run state, and refuses `cont` in that state ("Migration is not
    /// finalized yet"); no event marks the change, so this re-reads the state briefly.
    async fn wait_finalized(&self, deadline: tokio::time::Instant) -> Result<()> {
        let mut pause = Duration::from_millis(2);
        while self.status().await? == "finish-migrate" {
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::QmpTimeout("migration finalization".into()));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(RECHECK_FIRST);
        }
        Ok(())
    }

    /// The VM's run state (`running`, `paused`, `inmigrate`, ...).
    pub async fn status(&self) -> Result<String> {
        let r = self.execute("query-status", json!({})).await?;
        Ok(r.get("status")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string())
    }
}

/// First and longest pause before a wait re-reads a state without having seen an event: only
/// a safety net (events arrive first whenever QEMU sends them).
pub const RECHECK_FIRST: Duration = Duration::from_millis(50);
pub const RECHECK_MAX: Duration = Duration::from_secs(1);

/// Returns at the next event named in `names` on `events`, after `recheck`, or at `deadline`,
/// whichever comes first; also when the connection ended (the caller's next command then
/// fails) or events were dropped for lagging (the caller re-reads the state).
pub async fn next_event(
    events: &mut broadcast::Receiver<Value>,
    names: &[&str],
    deadline: tokio::time::Instant,
    recheck: Duration,
) {
    let until = deadline.min(tokio::time::Instant::now() + recheck);
    let _ = tokio::time::timeout_at(until, async {
        loop {
            match events.recv().await {
                Ok(v) => {
                    let name = v.get("event").and_then(Value::as_str).unwrap_or_default();
                    if names.contains(&name) {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn an_endless_line_is_an_error_not_an_allocation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qmp.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        // A QMP peer that greets, then answers `qmp_capabilities` with a line of 2 GiB
        // (streamed: it never exists in the test's memory either).
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            s.write_all(b"{\"QMP\": {}}\n").await.unwrap();
            let mut buf = [0u8; 256];
            let _ = s.read(&mut buf).await;
            let chunk = vec![b'x'; 1 << 20];
            let mut sent = 0u64;
            while sent < 2 << 30 {
                if s.write_all(&chunk).await.is_err() {
                    break;
                }
                sent += chunk.len() as u64;
            }
            sent
        });
        let err = Qmp::connect(&path, Duration::from_secs(5))
            .await
            .err()
            .expect("an over-long answer fails the command");
        assert!(matches!(err, Error::QmpConnection(_)), "{err}");
        let sent = server.await.unwrap();
        assert!(
            sent < 2 << 30,
            "the client stopped reading once the line passed the cap"
        );
    }

    #[tokio::test]
    async fn lines_up_to_the_cap_are_read() {
        let data = b"short\nnext\n".to_vec();
        let mut r = BufReader::new(&data[..]);
        assert_eq!(
            read_line(&mut r, 5).await.unwrap().as_deref(),
            Some("short")
        );
        assert_eq!(read_line(&mut r, 5).await.unwrap().as_deref(), Some("next"));
        assert_eq!(read_line(&mut r, 5).await.unwrap(), None);
        let mut r = BufReader::new(&b"toolong\n"[..]);
        assert!(read_line(&mut r, 5).await.is_err());
    }
}

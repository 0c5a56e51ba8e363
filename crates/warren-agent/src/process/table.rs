//! Running (and recently finished) processes, and the fan-out of their output.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::ChildStdin;
use tokio::sync::{mpsc, watch};
use warren_proto::process::process_event::EndEvent;
use warren_proto::process::process_selector::Selector;
use warren_proto::process::{ProcessConfig, ProcessSelector};

use super::audit::{ProcAudit, Stream};
use super::pty::PtyMaster;
use super::spawn::Spawned;
use warren_proto::connect::{Code, ConnectError};
use warren_proto::server::RpcResult;

/// How long a finished process stays connectable.
pub const EXITED_RETENTION: Duration = Duration::from_secs(30);
/// Output chunk limits, as envd sends them.
const PIPE_CHUNK: usize = 32 * 1024;
const PTY_CHUNK: usize = 16 * 1024;
/// Each attached stream buffers at most this many chunks before the process is slowed down.
const SUBSCRIBER_QUEUE: usize = 16;
/// After the program exits, output still arriving is collected until the pipes stay quiet this
/// long (a background grandchild may hold them open forever) or the overall cap passes.
const DRAIN_IDLE: Duration = Duration::from_millis(100);
const DRAIN_CAP: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub enum Output {
    Stdout(Bytes),
    Stderr(Bytes),
    Pty(Bytes),
}

/// What attached streams receive.
#[derive(Debug, Clone)]
pub enum ProcEvent {
    Data(Output),
    End(EndEvent),
}

/// The outcome of attaching to a process.
pub enum Attach {
    Live(mpsc::Receiver<ProcEvent>),
    Ended(EndEvent),
}

#[derive(Default)]
struct Fanout {
    subscribers: Vec<mpsc::Sender<ProcEvent>>,
    end: Option<EndEvent>,
}

/// One started process.
pub struct Proc {
    pub pid: u32,
    pub config: ProcessConfig,
    pub tag: Option<String>,
    stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    pty: Option<PtyMaster>,
    fanout: Mutex<Fanout>,
    /// The journal's view of it (`None` when the journal is off).
    audit: Option<Arc<ProcAudit>>,
}

impl Proc {
    pub fn is_running(&self) -> bool {
        self.lock().end.is_none()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Fanout> {
        self.fanout.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Attaches a new stream: live output from now on, or the stored end of a finished process.
    pub fn attach(&self) -> Attach {
        let mut f = self.lock();
        if let Some(end) = &f.end {
            return Attach::Ended(end.clone());
        }
        let (tx, rx) = mpsc::channel(SUBSCRIBER_QUEUE);
        f.subscribers.push(tx);
        Attach::Live(rx)
    }

    /// Delivers output to every attached stream, waiting for slow ones (bounded memory).
    async fn publish(&self, out: Output) {
        let subs: Vec<_> = self.lock().subscribers.clone();
        if subs.is_empty() {
            return; // nobody listening: output is dropped, as envd does
        }
        let mut gone = false;
        for s in &subs {
            gone |= s.send(ProcEvent::Data(out.clone())).await.is_err();
        }
        if gone {
            self.lock().subscribers.retain(|s| !s.is_closed());
        }
    }

    async fn finish(&self, end: EndEvent) {
        let subs = {
            let mut f = self.lock();
            f.end = Some(end.clone());
            std::mem::take(&mut f.subscribers)
        };
        for s in subs {
            let _ = s.send(ProcEvent::End(end.clone())).await;
        }
        *self.stdin.lock().await = None;
    }

    /// Sends `sig` to the process's whole group.
    pub fn signal(&self, sig: Signal) -> RpcResult<()> {
        if !self.is_running() {
            return Err(not_found_pid(self.pid));
        }
        match killpg(Pid::from_raw(self.pid as i32), sig) {
            Ok(()) => Ok(()),
            // The group is gone but its end is not recorded yet (the waiter is about to):
            // to the caller the process no longer exists, as it will after the recording.
            Err(nix::errno::Errno::ESRCH) => Err(not_found_pid(self.pid)),
            Err(e) => Err(ConnectError::internal(format!("error sending signal: {e}"))),
        }
    }

    pub async fn write_stdin(&self, data: &[u8]) -> RpcResult<()> {
        if self.pty.is_some() {
            return Err(ConnectError::internal(
                "process uses a pty: send input as pty bytes",
            ));
        }
        let mut stdin = self.stdin.lock().await;
        let Some(pipe) = stdin.as_mut() else {
            return Err(ConnectError::internal(
                "error writing to stdin: stdin is not open",
            ));
        };
        let res = async {
            pipe.write_all(data).await?;
            pipe.flush().await
        }
        .await;
        res.map_err(|e| ConnectError::internal(format!("error writing to stdin: {e}")))
    }

    pub async fn write_pty(&self, data: &[u8]) -> RpcResult<()> {
        let Some(pty) = &self.pty else {
            return Err(ConnectError::internal(
                "process has no pty: send input as stdin bytes",
            ));
        };
        pty.write_all(data)
            .await
            .map_err(|e| ConnectError::internal(format!("error writing to pty: {e}")))
    }

    pub async fn close_stdin(&self) -> RpcResult<()> {
        if self.pty.is_some() {
            return Err(ConnectError::internal(
                "cannot close stdin of a pty process: send Ctrl+D (0x04) instead",
            ));
        }
        *self.stdin.lock().await = None;
        Ok(())
    }

    pub fn resize(&self, cols: u32, rows: u32) -> RpcResult<()> {
        let Some(pty) = &self.pty else {
            return Err(ConnectError::invalid_argument(
                "process has no pty to resize",
            ));
        };
        let clamp = |v: u32| v.min(u16::MAX as u32) as u16;
        pty.resize(clamp(cols), clamp(rows))
            .map_err(|e| ConnectError::internal(format!("error resizing pty: {e}")))
    }
}

pub fn not_found_pid(pid: u32) -> ConnectError {
    ConnectError::not_found(format!("process with pid {pid} not found"))
}

/// Every process the agent started, by pid.
#[derive(Default)]
pub struct ProcessTable {
    procs: Mutex<HashMap<u32, Arc<Proc>>>,
}

impl ProcessTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<Proc>>> {
        self.procs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Finds a process (running or recently finished) by pid or tag.
    pub fn find(&self, selector: Option<&ProcessSelector>) -> RpcResult<Arc<Proc>> {
        let procs = self.lock();
        match selector.and_then(|s| s.selector.as_ref()) {
            Some(Selector::Pid(pid)) => procs.get(pid).cloned().ok_or_else(|| not_found_pid(*pid)),
            Some(Selector::Tag(tag)) => {
                let mut matching: Vec<_> = procs
                    .values()
                    .filter(|p| p.tag.as_deref() == Some(tag))
                    .cloned()
                    .collect();
                // Prefer a running process when a tag was reused.
                matching.sort_by_key(|p| !p.is_running());
                matching.into_iter().next().ok_or_else(|| {
                    ConnectError::not_found(format!("process with tag {tag} not found"))
                })
            }
            None => Err(ConnectError::new(
                Code::Unimplemented,
                "invalid process selector",
            )),
        }
    }

    /// Finds a process that is still running.
    pub fn find_running(&self, selector: Option<&ProcessSelector>) -> RpcResult<Arc<Proc>> {
        let p = self.find(selector)?;
        if p.is_running() {
            Ok(p)
        } else {
            Err(not_found_pid(p.pid))
        }
    }

    pub fn running(&self) -> Vec<Arc<Proc>> {
        let mut v: Vec<_> = self
            .lock()
            .values()
            .filter(|p| p.is_running())
            .cloned()
            .collect();
        v.sort_by_key(|p| p.pid);
        v
    }

    /// Registers a freshly spawned program, attaches the caller's stream before any output can
    /// be produced, and starts the tasks that pump its output and wait for its end.
    pub fn adopt(
        self: &Arc<Self>,
        spawned: Spawned,
        config: ProcessConfig,
        tag: Option<String>,
        audit: Option<Arc<ProcAudit>>,
    ) -> (Arc<Proc>, mpsc::Receiver<ProcEvent>) {
        let Spawned {
            mut child,
            pid,
            stdin,
            stdout,
            stderr,
            pty,
        } = spawned;
        let proc = Arc::new(Proc {
            pid,
            config,
            tag,
            stdin: tokio::sync::Mutex::new(stdin),
            pty,
            fanout: Mutex::new(Fanout::default()),
            audit,
        });
        let Attach::Live(rx) = proc.attach() else {
            unreachable!("a new process has not ended")
        };
        self.lock().insert(pid, proc.clone());

        let (exited_tx, exited_rx) = watch::channel(false);
        let mut pumps = Vec::new();
        if let Some(out) = stdout {
            pumps.push(tokio::spawn(pump(
                Pipe(out),
                proc.clone(),
                Output::Stdout,
                PIPE_CHUNK,
                exited_rx.clone(),
            )));
        }
        if let Some(err) = stderr {
            pumps.push(tokio::spawn(pump(
                Pipe(err),
                proc.clone(),
                Output::Stderr,
                PIPE_CHUNK,
                exited_rx.clone(),
            )));
        }
        if proc.pty.is_some() {
            pumps.push(tokio::spawn(pump(
                PtySource(proc.clone()),
                proc.clone(),
                Output::Pty,
                PTY_CHUNK,
                exited_rx,
            )));
        }

        let table = self.clone();
        let waiter_proc = proc.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            let _ = exited_tx.send(true);
            for p in pumps {
                let _ = p.await;
            }
            let end = end_event(status);
            if let Some(audit) = &waiter_proc.audit {
                audit.ended(&end);
            }
            waiter_proc.finish(end).await;
            tokio::time::sleep(EXITED_RETENTION).await;
            let mut procs = table.lock();
            if procs
                .get(&pid)
                .is_some_and(|p| Arc::ptr_eq(p, &waiter_proc))
            {
                procs.remove(&pid);
            }
        });
        (proc, rx)
    }
}

/// Something output can be read from: a pipe or the PTY master.
trait Source: Send {
    fn read_some<'a>(
        &'a mut self,
        buf: &'a mut [u8],
    ) -> impl std::future::Future<Output = io::Result<usize>> + Send + 'a;
}

struct Pipe<R>(R);

impl<R: AsyncRead + Unpin + Send> Source for Pipe<R> {
    async fn read_some<'a>(&'a mut self, buf: &'a mut [u8]) -> io::Result<usize> {
        self.0.read(buf).await
    }
}

struct PtySource(Arc<Proc>);

impl Source for PtySource {
    async fn read_some<'a>(&'a mut self, buf: &'a mut [u8]) -> io::Result<usize> {
        match &self.0.pty {
            Some(pty) => pty.read(buf).await,
            None => Ok(0),
        }
    }
}

/// Copies output to the attached streams until the source ends. Once the program has exited,
/// reading stops as soon as the source stays quiet for `DRAIN_IDLE` (a background grandchild
/// may hold the pipe open forever), and at the latest after `DRAIN_CAP`.
async fn pump<S: Source>(
    mut src: S,
    proc: Arc<Proc>,
    wrap: fn(Bytes) -> Output,
    chunk: usize,
    mut exited: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; chunk];
    let mut drain_cap: Option<tokio::time::Instant> = None;
    loop {
        if drain_cap.is_none() && *exited.borrow() {
            drain_cap = Some(tokio::time::Instant::now() + DRAIN_CAP);
        }
        let read = match drain_cap {
            Some(cap) => {
                let limit = (tokio::time::Instant::now() + DRAIN_IDLE).min(cap);
                match tokio::time::timeout_at(limit, src.read_some(&mut buf)).await {
                    Ok(r) => r,
                    Err(_) => return,
                }
            }
            None => tokio::select! {
                r = src.read_some(&mut buf) => r,
                _ = exited.changed() => continue,
            },
        };
        match read {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let out = wrap(Bytes::copy_from_slice(&buf[..n]));
                if let Some(audit) = &proc.audit {
                    match &out {
                        Output::Stdout(b) => audit.output(Stream::Stdout, b),
                        Output::Stderr(b) => audit.output(Stream::Stderr, b),
                        // A terminal's bytes are keystrokes echoed and screen drawing, not
                        // lines; what runs in it is journaled as executed programs.
                        Output::Pty(_) => {}
                    }
                }
                proc.publish(out).await
            }
        }
    }
}

/// The `end` event for a wait status, worded like envd (Go's `ProcessState.String()`).
pub fn end_event(status: io::Result<std::process::ExitStatus>) -> EndEvent {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(st) => {
            if let Some(code) = st.code() {
                let text = format!("exit status {code}");
                EndEvent {
                    exit_code: code,
                    exited: true,
                    error: (code != 0).then(|| text.clone()),
                    status: text,
                }
            } else {
                let sig = st.signal().unwrap_or(0);
                let text = format!("signal: {}", signal_name(sig));
                EndEvent {
                    exit_code: -1,
                    exited: false,
                    status: text.clone(),
                    error: Some(text),
                }
            }
        }
        Err(e) => {
            let text = format!("wait failed: {e}");
            EndEvent {
                exit_code: -1,
                exited: false,
                status: text.clone(),
                error: Some(text),
            }
        }
    }
}

fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGHUP => "hangup".into(),
        libc::SIGINT => "interrupt".into(),
        libc::SIGQUIT => "quit".into(),
        libc::SIGILL => "illegal instruction".into(),
        libc::SIGABRT => "aborted".into(),
        libc::SIGBUS => "bus error".into(),
        libc::SIGFPE => "floating point exception".into(),
        libc::SIGKILL => "killed".into(),
        libc::SIGSEGV => "segmentation fault".into(),
        libc::SIGPIPE => "broken pipe".into(),
        libc::SIGALRM => "alarm clock".into(),
        libc::SIGTERM => "terminated".into(),
        n => format!("signal {n}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;

    #[test]
    fn end_events_read_like_envd() {
        let ok = end_event(Ok(ExitStatus::from_raw(0)));
        assert_eq!(
            (ok.exit_code, ok.exited, ok.status.as_str(), ok.error),
            (0, true, "exit status 0", None)
        );
        let fail = end_event(Ok(ExitStatus::from_raw(3 << 8)));
        assert_eq!(fail.exit_code, 3);
        assert_eq!(fail.error.as_deref(), Some("exit status 3"));
        let killed = end_event(Ok(ExitStatus::from_raw(libc::SIGKILL)));
        assert_eq!((killed.exit_code, killed.exited), (-1, false));
        assert_eq!(killed.status, "signal: killed");
    }
}

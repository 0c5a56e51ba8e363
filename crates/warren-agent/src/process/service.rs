//! The `process.Process` RPCs: translate requests, call the process table, encode events.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use nix::sys::signal::Signal as UnixSignal;
use tokio::sync::mpsc;
use tokio::time::Instant;
use warren_proto::journal::Masker;
use warren_proto::process::process_event::{self, Event};
use warren_proto::process::process_input::Input;
use warren_proto::process::stream_input_request::Event as InputEvent;
use warren_proto::process::*;

use super::audit::{ProcAudit, StartInfo, Trace};
use super::spawn::{spawn, SpawnSpec, DEFAULT_PATH};
use super::table::{not_found_pid, Attach, Output, Proc, ProcEvent};
use crate::auth::rpc_user;
use crate::paths;
use crate::state::AppState;
use crate::users::User;
use warren_proto::connect::{Code, ConnectError};
use warren_proto::server::{self, RpcResult, StreamSender};

/// Entry point for `POST /process.Process/{method}`.
pub async fn rpc(
    State(state): State<AppState>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match method.as_str() {
        "Start" => start(state, headers, body).await,
        "Connect" => connect_stream(state, headers, body).await,
        "StreamInput" => stream_input(state, headers, body).await,
        "List" => unary(&headers, body, |_: ListRequest| async { Ok(list(&state)) }).await,
        "SendInput" => unary(&headers, body, |r| send_input(&state, r)).await,
        "SendSignal" => unary(&headers, body, |r| async { send_signal(&state, r) }).await,
        "CloseStdin" => unary(&headers, body, |r| close_stdin(&state, r)).await,
        "Update" => unary(&headers, body, |r| async { update(&state, r) }).await,
        other => not_found_method("process.Process", other),
    }
}

/// Unknown procedure: 404 with a Connect `unimplemented` body.
pub fn not_found_method(service: &str, method: &str) -> Response {
    let mut resp = ConnectError::unimplemented(format!("unknown procedure {service}/{method}"))
        .into_response();
    *resp.status_mut() = axum::http::StatusCode::NOT_FOUND;
    resp
}

/// Runs a unary call: decode, handle, encode.
pub async fn unary<Req, Resp, F, Fut>(headers: &HeaderMap, body: Body, handler: F) -> Response
where
    Req: serde::de::DeserializeOwned,
    Resp: serde::Serialize,
    F: FnOnce(Req) -> Fut,
    Fut: std::future::Future<Output = RpcResult<Resp>>,
{
    let bytes = match axum::body::to_bytes(body, server::MAX_MESSAGE_BYTES).await {
        Ok(b) => b,
        Err(e) => {
            return ConnectError::invalid_argument(format!("reading request: {e}")).into_response()
        }
    };
    let req = match server::decode_unary(headers, &bytes) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    server::unary_response(handler(req).await)
}

fn list(state: &AppState) -> ListResponse {
    let processes = state
        .processes
        .running()
        .into_iter()
        .map(|p| ProcessInfo {
            config: Some(p.config.clone()),
            pid: p.pid,
            tag: p.tag.clone(),
        })
        .collect();
    ListResponse { processes }
}

async fn send_input(state: &AppState, req: SendInputRequest) -> RpcResult<SendInputResponse> {
    let proc = state.processes.find_running(req.process.as_ref())?;
    write_input(&proc, req.input).await?;
    Ok(SendInputResponse {})
}

async fn write_input(proc: &Proc, input: Option<ProcessInput>) -> RpcResult<()> {
    match input.and_then(|i| i.input) {
        Some(Input::Stdin(data)) => proc.write_stdin(&data).await,
        Some(Input::Pty(data)) => proc.write_pty(&data).await,
        None => Ok(()),
    }
}

fn send_signal(state: &AppState, req: SendSignalRequest) -> RpcResult<SendSignalResponse> {
    let proc = state.processes.find_running(req.process.as_ref())?;
    let sig = match Signal::try_from(req.signal) {
        Ok(Signal::Sigkill) => UnixSignal::SIGKILL,
        Ok(Signal::Sigterm) => UnixSignal::SIGTERM,
        _ => {
            return Err(ConnectError::unimplemented(format!(
                "invalid signal: {}",
                req.signal
            )))
        }
    };
    proc.signal(sig)?;
    Ok(SendSignalResponse {})
}

async fn close_stdin(state: &AppState, req: CloseStdinRequest) -> RpcResult<CloseStdinResponse> {
    let proc = state.processes.find_running(req.process.as_ref())?;
    proc.close_stdin().await?;
    Ok(CloseStdinResponse {})
}

fn update(state: &AppState, req: UpdateRequest) -> RpcResult<UpdateResponse> {
    let proc = state.processes.find_running(req.process.as_ref())?;
    if let Some(size) = req.pty.and_then(|p| p.size) {
        proc.resize(size.cols, size.rows)?;
    }
    Ok(UpdateResponse {})
}

/// Everything `Start` needs, validated before anything runs.
fn prepare(
    state: &AppState,
    headers: &HeaderMap,
    req: &StartRequest,
    trace: Option<&Trace>,
) -> RpcResult<SpawnSpec> {
    let user = rpc_user(state, headers)?;
    let config = req.process.clone().unwrap_or_default();
    if config.cmd.is_empty() {
        return Err(ConnectError::invalid_argument("process.cmd is required"));
    }
    let settings = state.settings();
    let cwd = match config.cwd.as_deref() {
        Some(c) if !c.is_empty() => paths::resolve(c, &user, settings.default_workdir.as_deref()),
        _ => default_cwd(&user, settings.default_workdir.as_deref()),
    };
    if !cwd.is_dir() {
        return Err(ConnectError::invalid_argument(format!(
            "cwd '{}' does not exist",
            cwd.display()
        )));
    }
    let mut env = login_env(&user);
    env.extend(
        settings
            .env_vars
            .iter()
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    if let Some(t) = trace {
        env.push(("TRACEPARENT".into(), t.traceparent()));
    }
    env.extend(config.envs.iter().map(|(k, v)| (k.clone(), v.clone())));
    let pty = req.pty.as_ref().map(|p| {
        let size = p.size.unwrap_or_default();
        let clamp = |v: u32| v.clamp(1, u16::MAX as u32) as u16;
        (
            clamp(if size.cols == 0 { 80 } else { size.cols }),
            clamp(if size.rows == 0 { 24 } else { size.rows }),
        )
    });
    Ok(SpawnSpec {
        cmd: shell_of_image(config.cmd),
        args: config.args,
        env: dedup_env(env),
        cwd,
        user,
        stdin: req.stdin.unwrap_or(true),
        pty,
    })
}

/// The SDKs run every command as `/bin/bash -l -c ...`. An image without bash (one pulled from
/// a registry, such as busybox or alpine) runs it with `/bin/sh`, which takes the same `-l -c`.
fn shell_of_image(cmd: String) -> String {
    if cmd == "/bin/bash" && !std::path::Path::new("/bin/bash").exists() {
        "/bin/sh".into()
    } else {
        cmd
    }
}

fn default_cwd(user: &User, workdir: Option<&std::path::Path>) -> PathBuf {
    [workdir.map(PathBuf::from), Some(user.home.clone())]
        .into_iter()
        .flatten()
        .find(|p| p.is_dir())
        .unwrap_or_else(|| PathBuf::from("/"))
}

/// A login environment for `user`.
fn login_env(user: &User) -> Vec<(String, String)> {
    vec![
        ("PATH".into(), DEFAULT_PATH.into()),
        ("HOME".into(), user.home.display().to_string()),
        ("USER".into(), user.name.clone()),
        ("LOGNAME".into(), user.name.clone()),
        ("SHELL".into(), user.shell.clone()),
        ("LANG".into(), "C.UTF-8".into()),
        ("E2B_SANDBOX".into(), "true".into()),
    ]
}

/// Later entries win; order of first appearance is kept.
fn dedup_env(env: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::with_capacity(env.len());
    for (k, v) in env {
        match out.iter_mut().find(|(ek, _)| *ek == k) {
            Some(slot) => slot.1 = v,
            None => out.push((k, v)),
        }
    }
    out
}

async fn start(state: AppState, headers: HeaderMap, body: Body) -> Response {
    let req: StartRequest = match server::read_single(&headers, body).await {
        Ok(r) => r,
        Err(e) => return server::stream_error(e),
    };
    let trace = Trace::from_headers(&headers);
    let spec = match prepare(&state, &headers, &req, trace.as_ref()) {
        Ok(s) => s,
        Err(e) => return server::stream_error(e),
    };
    let (cwd, user, pty) = (
        spec.cwd.display().to_string(),
        spec.user.name.clone(),
        spec.pty.is_some(),
    );
    let spawned = match spawn(spec) {
        Ok(s) => s,
        Err(e) => {
            let cmd = req
                .process
                .as_ref()
                .map(|p| p.cmd.as_str())
                .unwrap_or_default();
            return server::stream_error(ConnectError::invalid_argument(format!(
                "error starting process '{cmd}': {e}"
            )));
        }
    };
    let config = req.process.clone().unwrap_or_default();
    // The sandbox-wide variables' values are masked by the control plane, which keeps them;
    // a command's own exist only here.
    let masker = Masker::new(config.envs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let audit = ProcAudit::started(
        &state.journal,
        StartInfo {
            pid: spawned.pid,
            cmd: &config.cmd,
            args: &config.args,
            cwd: &cwd,
            user: &user,
            tag: req.tag.as_deref(),
            pty,
            trace,
            masker,
        },
    );
    let (proc, rx) = state
        .processes
        .adopt(spawned, config, req.tag.clone(), audit);
    tracing::debug!(pid = proc.pid, "process started");

    // The deadline is also the process's lifetime.
    let deadline = server::timeout(&headers).map(|t| Instant::now() + t);
    if let Some(at) = deadline {
        let p = proc.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            if p.is_running() {
                let _ = p.signal(UnixSignal::SIGKILL);
            }
        });
    }
    let keepalive = server::keepalive_interval(&headers);
    let (sender, resp) = server::stream_response();
    tokio::spawn(async move {
        if send_event(
            &sender,
            Event::Start(process_event::StartEvent { pid: proc.pid }),
            true,
        )
        .await
        {
            forward(sender, rx, keepalive, deadline, true).await;
        }
    });
    resp
}

async fn connect_stream(state: AppState, headers: HeaderMap, body: Body) -> Response {
    let req: ConnectRequest = match server::read_single(&headers, body).await {
        Ok(r) => r,
        Err(e) => return server::stream_error(e),
    };
    let proc = match state.processes.find(req.process.as_ref()) {
        Ok(p) => p,
        Err(e) => return server::stream_error(e),
    };
    let keepalive = server::keepalive_interval(&headers);
    let deadline = server::timeout(&headers).map(|t| Instant::now() + t);
    let (sender, resp) = server::stream_response();
    tokio::spawn(async move {
        let start = Event::Start(process_event::StartEvent { pid: proc.pid });
        match proc.attach() {
            Attach::Ended(end) => {
                if send_event(&sender, start, false).await
                    && send_event(&sender, Event::End(end), false).await
                {
                    sender.finish(Ok(())).await;
                }
            }
            Attach::Live(rx) => {
                if send_event(&sender, start, false).await {
                    forward(sender, rx, keepalive, deadline, false).await;
                }
            }
        }
    });
    resp
}

/// Encodes one event in the response type of `Start` or `Connect` (same shape on the wire).
async fn send_event(sender: &StreamSender, event: Event, _is_start: bool) -> bool {
    sender
        .send(&StartResponse {
            event: Some(ProcessEvent { event: Some(event) }),
        })
        .await
}

/// Streams process events to the client until the process ends, the deadline passes, or the
/// client leaves. Emits a keepalive after `keepalive` without events.
async fn forward(
    sender: StreamSender,
    mut rx: mpsc::Receiver<ProcEvent>,
    keepalive: Duration,
    deadline: Option<Instant>,
    is_start: bool,
) {
    let far = Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600);
    let deadline_at = deadline.unwrap_or(far);
    let mut idle_until = Instant::now() + keepalive;
    loop {
        tokio::select! {
            ev = rx.recv() => {
                let event = match ev {
                    Some(ProcEvent::Data(out)) => Event::Data(process_event::DataEvent { output: Some(match out {
                        Output::Stdout(b) => process_event::data_event::Output::Stdout(b.to_vec()),
                        Output::Stderr(b) => process_event::data_event::Output::Stderr(b.to_vec()),
                        Output::Pty(b) => process_event::data_event::Output::Pty(b.to_vec()),
                    })}),
                    // The deadline's own kill (above) ends the process at the same instant
                    // as the deadline passes here; whichever the runtime polls first, a call
                    // past its deadline ends as DeadlineExceeded, as the SDKs expect.
                    Some(ProcEvent::End(_)) if Instant::now() >= deadline_at => {
                        sender.finish(Err(ConnectError::new(Code::DeadlineExceeded, "the call's deadline was exceeded"))).await;
                        return;
                    }
                    Some(ProcEvent::End(end)) => {
                        if send_event(&sender, Event::End(end), is_start).await {
                            sender.finish(Ok(())).await;
                        }
                        return;
                    }
                    None => {
                        sender.finish(Err(ConnectError::internal("process stream closed without an end"))).await;
                        return;
                    }
                };
                if !send_event(&sender, event, is_start).await {
                    return;
                }
                idle_until = Instant::now() + keepalive;
            }
            _ = tokio::time::sleep_until(idle_until) => {
                if !send_event(&sender, Event::Keepalive(process_event::KeepAlive {}), is_start).await {
                    return;
                }
                idle_until = Instant::now() + keepalive;
            }
            _ = tokio::time::sleep_until(deadline_at) => {
                sender.finish(Err(ConnectError::new(Code::DeadlineExceeded, "the call's deadline was exceeded"))).await;
                return;
            }
            _ = sender.closed() => return,
        }
    }
}

/// Client-streaming input. The answer comes only once the input has ended (as connect-go
/// does): answering early makes HTTP/1.1 clients stop sending the rest of their input.
async fn stream_input(state: AppState, headers: HeaderMap, body: Body) -> Response {
    if !server::is_stream_content_type(&headers) {
        server::drain(body).await;
        return server::stream_error(ConnectError::invalid_argument(
            "streaming calls need content type application/connect+json",
        ));
    }
    let mut reader = server::EnvelopeReader::new(body.into_data_stream());
    let result = consume_input(&state, &mut reader).await;
    if result.is_err() {
        // Read off what is left so the connection stays usable.
        while let Ok(Some(_)) = reader.next::<serde::de::IgnoredAny>().await {}
    }
    server::stream_complete(result.map(|()| StreamInputResponse {}))
}

async fn consume_input<S, E>(
    state: &AppState,
    reader: &mut server::EnvelopeReader<S>,
) -> RpcResult<()>
where
    S: futures::Stream<Item = Result<axum::body::Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let mut target: Option<Arc<Proc>> = None;
    while let Some(msg) = reader.next::<StreamInputRequest>().await? {
        match msg.event {
            Some(InputEvent::Start(s)) => {
                target = Some(state.processes.find_running(s.process.as_ref())?);
            }
            Some(InputEvent::Data(d)) => {
                let proc = target.as_ref().ok_or_else(|| {
                    ConnectError::new(Code::FailedPrecondition, "input before the start event")
                })?;
                if !proc.is_running() {
                    return Err(not_found_pid(proc.pid));
                }
                write_input(proc, d.input).await?;
            }
            Some(InputEvent::Keepalive(_)) | None => {}
        }
    }
    if target.is_none() {
        return Err(ConnectError::invalid_argument(
            "input stream carried no start event",
        ));
    }
    Ok(())
}

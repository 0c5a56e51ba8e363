//! Dispatch of `filesystem.Filesystem` RPCs: decode, resolve the caller, run the operation,
//! encode. The operations themselves live in `ops` (unary) and `watch` (watchers).

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::time::Instant;
use warren_proto::filesystem::watch_dir_response::{Event, KeepAlive, StartEvent};
use warren_proto::filesystem::*;
use warren_proto::journal::{Level, FILE_MKDIR, FILE_REMOVE, FILE_RENAME};

use super::ops::{self, Caller};
use super::watch::{self, EventFeed, WatchOptions};
use crate::auth::rpc_user;
use crate::process::service::{not_found_method, unary};
use crate::state::AppState;
use warren_proto::connect::{Code, ConnectError};
use warren_proto::server::{self, RpcResult, StreamSender};

/// Entry point for `POST /filesystem.Filesystem/{method}`.
pub async fn rpc(
    State(state): State<AppState>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match method.as_str() {
        "Stat" => blocking_unary(&state, &headers, body, ops::stat, None).await,
        "MakeDir" => {
            let note: Note<MakeDirRequest> = |c, r| {
                let path = c.resolve(&r.path).display().to_string();
                (
                    FILE_MKDIR,
                    format!("made directory {path}"),
                    vec![("path", path)],
                )
            };
            blocking_unary(&state, &headers, body, ops::make_dir, Some(note)).await
        }
        "Move" => {
            let note: Note<MoveRequest> = |c, r| {
                let from = c.resolve(&r.source).display().to_string();
                let to = c.resolve(&r.destination).display().to_string();
                let message = format!("moved {from} to {to}");
                (
                    FILE_RENAME,
                    message,
                    vec![("path", from), ("destination", to)],
                )
            };
            blocking_unary(&state, &headers, body, ops::move_entry, Some(note)).await
        }
        "ListDir" => blocking_unary(&state, &headers, body, ops::list_dir, None).await,
        "Remove" => {
            let note: Note<RemoveRequest> = |c, r| {
                let path = c.resolve(&r.path).display().to_string();
                (FILE_REMOVE, format!("removed {path}"), vec![("path", path)])
            };
            blocking_unary(&state, &headers, body, ops::remove, Some(note)).await
        }
        "WatchDir" => watch_dir(state, headers, body).await,
        "CreateWatcher" => unary(&headers, body, |r| create_watcher(&state, &headers, r)).await,
        "GetWatcherEvents" => {
            unary(&headers, body, |r: GetWatcherEventsRequest| {
                let watchers = state.watchers.clone();
                async move {
                    let events = watchers.drain(&r.watcher_id).await?;
                    Ok(GetWatcherEventsResponse { events })
                }
            })
            .await
        }
        "RemoveWatcher" => {
            unary(&headers, body, |r: RemoveWatcherRequest| {
                let watchers = state.watchers.clone();
                async move {
                    watchers.remove(&r.watcher_id).await?;
                    Ok(RemoveWatcherResponse {})
                }
            })
            .await
        }
        other => not_found_method("filesystem.Filesystem", other),
    }
}

/// The run-as user of the request and the default working directory.
fn caller(state: &AppState, headers: &HeaderMap) -> RpcResult<Caller> {
    Ok(Caller {
        user: rpc_user(state, headers)?,
        default_workdir: state.settings().default_workdir,
    })
}

/// What the journal says of a change that succeeded: kind, message, fields.
type Note<Req> = fn(&Caller, &Req) -> (&'static str, String, Vec<(&'static str, String)>);

/// A unary call whose operation does blocking filesystem work: it runs off the async workers
/// (so a slow disk or a big tree never stalls them) with the caller's filesystem identity.
/// A change (`note`) is journaled once it succeeded.
async fn blocking_unary<Req, Resp>(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
    op: fn(&Caller, Req) -> RpcResult<Resp>,
    note: Option<Note<Req>>,
) -> Response
where
    Req: DeserializeOwned + Send + 'static,
    Resp: Serialize + Send + 'static,
{
    unary(headers, body, |req: Req| async move {
        let caller = caller(state, headers)?;
        let user = caller.user.clone();
        let noted = note.map(|n| n(&caller, &req));
        let result = super::identity::run_as(&user, move || op(&caller, req))
            .await
            .map_err(|e| ops::io_error(&e, "filesystem operation failed"))?;
        if let (Ok(_), Some((kind, message, fields))) = (&result, noted) {
            let mut fields: BTreeMap<String, String> = fields
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
            fields.insert("user".into(), user.name.clone());
            fields.insert("via".into(), "api".into());
            state.journal.record(kind, Level::Info, message, fields);
        }
        result
    })
    .await
}

fn watch_options(
    caller: &Caller,
    path: &str,
    recursive: bool,
    include_entry: bool,
    allow_network_mounts: bool,
) -> WatchOptions {
    WatchOptions {
        root: caller.resolve(path),
        recursive,
        include_entry,
        allow_network_mounts,
    }
}

async fn create_watcher(
    state: &AppState,
    headers: &HeaderMap,
    req: CreateWatcherRequest,
) -> RpcResult<CreateWatcherResponse> {
    let caller = caller(state, headers)?;
    let opts = watch_options(
        &caller,
        &req.path,
        req.recursive,
        req.include_entry,
        req.allow_network_mounts,
    );
    let watcher_id = state.watchers.create(opts).await?;
    Ok(CreateWatcherResponse { watcher_id })
}

async fn watch_dir(state: AppState, headers: HeaderMap, body: Body) -> Response {
    let req: WatchDirRequest = match server::read_single(&headers, body).await {
        Ok(r) => r,
        Err(e) => return server::stream_error(e),
    };
    let caller = match caller(&state, &headers) {
        Ok(c) => c,
        Err(e) => return server::stream_error(e),
    };
    let opts = watch_options(
        &caller,
        &req.path,
        req.recursive,
        req.include_entry,
        req.allow_network_mounts,
    );
    // The watch is in place before `start` goes out, so anything the client does after seeing
    // `start` is reported.
    let feed = match watch::subscribe(opts).await {
        Ok(f) => f,
        Err(e) => return server::stream_error(e),
    };
    let keepalive = server::keepalive_interval(&headers);
    let deadline = server::timeout(&headers).map(|t| Instant::now() + t);
    let (sender, resp) = server::stream_response();
    tokio::spawn(async move {
        if send(&sender, Event::Start(StartEvent {})).await {
            forward(sender, feed, keepalive, deadline).await;
        }
        // The feed is dropped here, whichever way the stream ended: the watch stops.
    });
    resp
}

async fn send(sender: &StreamSender, event: Event) -> bool {
    sender.send(&WatchDirResponse { event: Some(event) }).await
}

/// Streams watch events until the client leaves, the deadline passes or the watch fails;
/// emits a keepalive after `keepalive` without events.
async fn forward(
    sender: StreamSender,
    mut feed: EventFeed,
    keepalive: Duration,
    deadline: Option<Instant>,
) {
    let far = Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600);
    let deadline_at = deadline.unwrap_or(far);
    let mut idle_until = Instant::now() + keepalive;
    loop {
        tokio::select! {
            ev = feed.recv() => match ev {
                Ok(ev) => {
                    if !send(&sender, Event::Filesystem(ev)).await {
                        return;
                    }
                    idle_until = Instant::now() + keepalive;
                }
                Err(e) => {
                    sender.finish(Err(e)).await;
                    return;
                }
            },
            _ = tokio::time::sleep_until(idle_until) => {
                if !send(&sender, Event::Keepalive(KeepAlive {})).await {
                    return;
                }
                idle_until = Instant::now() + keepalive;
            }
            _ = tokio::time::sleep_until(deadline_at) => {
                sender
                    .finish(Err(ConnectError::new(
                        Code::DeadlineExceeded,
                        "the call's deadline was exceeded",
                    )))
                    .await;
                return;
            }
            _ = sender.closed() => return,
        }
    }
}

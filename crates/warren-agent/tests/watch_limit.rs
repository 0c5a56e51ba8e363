//! One agent runs a bounded number of filesystem watchers (each holds an inotify instance,
//! which the kernel counts against a budget shared with other sandboxes and the host).
//! Runs the real agent.

mod common;

use common::Agent;
use warren_proto::client::{AgentClient, CallOptions, Error, EventStream};
use warren_proto::connect::{Code, ConnectError};
use warren_proto::filesystem::watch_dir_response::Event;
use warren_proto::filesystem::{
    CreateWatcherRequest, CreateWatcherResponse, RemoveWatcherRequest, RemoveWatcherResponse,
    WatchDirRequest, WatchDirResponse,
};

/// The agent's `MAX_WATCHERS`.
const LIMIT: usize = 32;

fn client(agent: &Agent) -> AgentClient {
    AgentClient::new(reqwest::Client::new(), agent.base.clone())
}

fn as_root() -> CallOptions {
    CallOptions::new().user("root")
}

/// The agent's own error; anything else (transport, HTTP) fails the test.
fn rpc_error(e: Error) -> ConnectError {
    e.rpc()
        .cloned()
        .unwrap_or_else(|| panic!("not an RPC error: {e:?}"))
}

async fn create(agent: &Agent, dir: &str) -> Result<String, ConnectError> {
    let req = CreateWatcherRequest {
        path: dir.into(),
        ..Default::default()
    };
    client(agent)
        .unary::<_, CreateWatcherResponse>("filesystem.Filesystem/CreateWatcher", &req, &as_root())
        .await
        .map(|r| r.watcher_id)
        .map_err(rpc_error)
}

async fn remove(agent: &Agent, watcher_id: String) {
    client(agent)
        .unary::<_, RemoveWatcherResponse>(
            "filesystem.Filesystem/RemoveWatcher",
            &RemoveWatcherRequest { watcher_id },
            &as_root(),
        )
        .await
        .unwrap();
}

/// Opens a `WatchDir` stream and returns its first message (start event, or the end-of-stream
/// error) with the stream, which keeps the watch alive while held.
async fn watch_dir(
    agent: &Agent,
    dir: &str,
) -> (
    Result<Option<WatchDirResponse>, ConnectError>,
    EventStream<WatchDirResponse>,
) {
    let req = WatchDirRequest {
        path: dir.into(),
        ..Default::default()
    };
    let mut stream = client(agent)
        .server_stream("filesystem.Filesystem/WatchDir", &req, &as_root())
        .await
        .unwrap();
    let first = stream.next().await.map_err(rpc_error);
    (first, stream)
}

#[tokio::test]
async fn watchers_are_capped_with_a_clear_error_and_freed_on_removal() {
    let agent = Agent::start();
    let dir = format!("/tmp/warren-watch-limit-{}", uuid::Uuid::new_v4().simple());
    std::fs::create_dir(&dir).unwrap();

    // One streaming watcher and the rest polling: both kinds count.
    let (first, stream) = watch_dir(&agent, &dir).await;
    let first = first.unwrap().expect("a first message");
    assert!(matches!(first.event, Some(Event::Start(_))), "{first:?}");
    let mut ids = Vec::new();
    for _ in 1..LIMIT {
        ids.push(create(&agent, &dir).await.unwrap());
    }

    let err = create(&agent, &dir).await.unwrap_err();
    assert_eq!(err.code, Code::ResourceExhausted, "{err}");
    assert!(
        err.message.contains("too many filesystem watchers")
            && err.message.contains(&LIMIT.to_string()),
        "{err}"
    );
    let (end, _) = watch_dir(&agent, &dir).await;
    assert_eq!(end.unwrap_err().code, Code::ResourceExhausted);

    // Removing a polling watcher frees its place...
    remove(&agent, ids.pop().unwrap()).await;
    ids.push(create(&agent, &dir).await.unwrap());
    // ...and so does closing a stream (the agent notices once it next writes to it, so poll
    // until a place opens rather than assume when).
    drop(stream);
    let mut freed = false;
    for _ in 0..200 {
        match create(&agent, &dir).await {
            Ok(id) => {
                freed = true;
                ids.push(id);
                break;
            }
            Err(e) => assert_eq!(e.code, Code::ResourceExhausted, "{e}"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        freed,
        "closing the WatchDir stream did not free its watcher"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

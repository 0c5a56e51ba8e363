//! One agent runs a bounded number of filesystem watchers (each holds an inotify instance,
//! which the kernel counts against a budget shared with other sandboxes and the host).
//! Runs the real agent.

mod common;

use common::{basic, envelope, Agent, EnvelopeStream};
use serde_json::{json, Value};

/// The agent's `MAX_WATCHERS`.
const LIMIT: usize = 32;

async fn rpc(agent: &Agent, method: &str, msg: Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(agent.url(&format!("/filesystem.Filesystem/{method}")))
        .header("content-type", "application/json")
        .header("connect-protocol-version", "1")
        .header("authorization", basic("root"))
        .body(serde_json::to_vec(&msg).unwrap())
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

async fn create(agent: &Agent, dir: &str) -> (u16, Value) {
    rpc(agent, "CreateWatcher", json!({"path": dir})).await
}

/// Opens a `WatchDir` stream and returns its first message (start event, or the end-of-stream
/// error) with the stream, which keeps the watch alive while held.
async fn watch_dir(agent: &Agent, dir: &str) -> (Value, EnvelopeStream) {
    let resp = reqwest::Client::new()
        .post(agent.url("/filesystem.Filesystem/WatchDir"))
        .header("content-type", "application/connect+json")
        .header("authorization", basic("root"))
        .body(envelope(0, &json!({"path": dir})))
        .send()
        .await
        .unwrap();
    let mut stream = EnvelopeStream::new(resp);
    let (_, first) = stream.next().await.expect("a first message");
    (first, stream)
}

#[tokio::test]
async fn watchers_are_capped_with_a_clear_error_and_freed_on_removal() {
    let agent = Agent::start();
    let dir = format!("/tmp/warren-watch-limit-{}", uuid::Uuid::new_v4().simple());
    std::fs::create_dir(&dir).unwrap();

    // One streaming watcher and the rest polling: both kinds count.
    let (first, stream) = watch_dir(&agent, &dir).await;
    assert!(first.get("start").is_some(), "{first}");
    let mut ids = Vec::new();
    for _ in 1..LIMIT {
        let (status, body) = create(&agent, &dir).await;
        assert_eq!(status, 200, "{body}");
        ids.push(body["watcherId"].as_str().unwrap().to_string());
    }

    let (status, err) = create(&agent, &dir).await;
    assert_eq!(
        (status, err["code"].as_str()),
        (429, Some("resource_exhausted")),
        "{err}"
    );
    let message = err["message"].as_str().unwrap();
    assert!(
        message.contains("too many filesystem watchers") && message.contains(&LIMIT.to_string()),
        "{message}"
    );
    let (end, _) = watch_dir(&agent, &dir).await;
    assert_eq!(end["error"]["code"], "resource_exhausted", "{end}");

    // Removing a polling watcher frees its place...
    let (status, body) = rpc(&agent, "RemoveWatcher", json!({"watcherId": ids.pop()})).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = create(&agent, &dir).await;
    assert_eq!(status, 200, "{body}");
    // ...and so does closing a stream (the agent notices once it next writes to it, so poll
    // until a place opens rather than assume when).
    drop(stream);
    let mut freed = false;
    for _ in 0..200 {
        let (status, body) = create(&agent, &dir).await;
        if status == 200 {
            freed = true;
            ids.push(body["watcherId"].as_str().unwrap().to_string());
            break;
        }
        assert_eq!(body["code"], "resource_exhausted", "{body}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        freed,
        "closing the WatchDir stream did not free its watcher"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

//! API keys are scoped to their team (threat model M9): another team's sandboxes and
//! snapshots are "not found" to a key, whatever it does with their ids.

mod common;

use std::sync::Arc;

use common::{AgentRuntime, TestServer, API_KEY};
use serde_json::{json, Value};
use warren_control::Config;

async fn call(
    s: &TestServer,
    key: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    s.call_as(key, method, path, body).await
}

#[tokio::test]
async fn keys_see_only_their_teams_sandboxes_and_snapshots() {
    use reqwest::Method;
    let dir = tempfile::tempdir().unwrap();
    let s = TestServer::start_on(
        dir,
        Arc::new(AgentRuntime::persistence()),
        Config::default(),
    )
    .await;
    let a = s
        .control
        .keys()
        .create_team_key("a", "team-a", false)
        .await
        .unwrap()
        .secret;
    let b = s
        .control
        .keys()
        .create_team_key("b", "team-b", false)
        .await
        .unwrap()
        .secret;

    let (st, created) = call(
        &s,
        &a,
        Method::POST,
        "/v2/sandboxes",
        Some(json!({"templateID": "base"})),
    )
    .await;
    assert_eq!(st, 201);
    let id = created["sandboxID"].as_str().unwrap().to_string();
    let (st, snap) = call(
        &s,
        &a,
        Method::POST,
        &format!("/sandboxes/{id}/snapshots"),
        Some(json!({"name": "a-snap"})),
    )
    .await;
    assert_eq!(st, 201, "{snap}");
    let snap_id = snap["snapshotID"].as_str().unwrap().to_string();

    // Team b: every way in is "not found", and its lists are empty.
    for (method, path, body) in [
        (Method::GET, format!("/sandboxes/{id}"), None),
        (Method::DELETE, format!("/sandboxes/{id}"), None),
        (
            Method::POST,
            format!("/v2/sandboxes/{id}/connect"),
            Some(json!({"timeout": 60})),
        ),
        (
            Method::POST,
            format!("/sandboxes/{id}/timeout"),
            Some(json!({"timeout": 60})),
        ),
        (
            Method::POST,
            format!("/sandboxes/{id}/pause"),
            Some(json!({})),
        ),
        (
            Method::POST,
            format!("/sandboxes/{id}/snapshots"),
            Some(json!({})),
        ),
        (
            Method::POST,
            format!("/sandboxes/{id}/fork"),
            Some(json!({})),
        ),
        (Method::GET, format!("/sandboxes/{id}/metrics"), None),
        (Method::GET, format!("/events/sandboxes/{id}"), None),
        (Method::GET, format!("/v1/sandboxes/{id}/audit"), None),
        (Method::GET, format!("/sandboxes/{id}/logs"), None),
        (Method::GET, format!("/v2/sandboxes/{id}/logs"), None),
        (Method::DELETE, format!("/templates/{snap_id}"), None),
        (
            Method::POST,
            "/v2/sandboxes".to_string(),
            Some(json!({"templateID": snap_id})),
        ),
    ] {
        let (st, v) = call(&s, &b, method.clone(), &path, body).await;
        assert_eq!(st, 404, "{method} {path}: {v}");
        assert!(!v
            .to_string()
            .contains(created["envdAccessToken"].as_str().unwrap()));
    }
    let (_, list) = call(&s, &b, Method::GET, "/v2/sandboxes", None).await;
    assert_eq!(list, json!([]));
    let (_, snaps) = call(&s, &b, Method::GET, "/snapshots", None).await;
    assert_eq!(snaps, json!([]));
    let (st, hook) = call(
        &s,
        &a,
        Method::POST,
        "/events/webhooks",
        Some(
            json!({"url": "https://hooks.example.test/a", "events": ["sandbox.lifecycle.killed"],
                    "signatureSecret": "team-a-secret-123"}),
        ),
    )
    .await;
    assert_eq!(st, 201, "{hook}");
    let hook_path = format!("/events/webhooks/{}", hook["id"].as_str().unwrap());
    for method in [Method::GET, Method::DELETE] {
        let (st, v) = call(&s, &b, method.clone(), &hook_path, None).await;
        assert_eq!(st, 404, "{method} {hook_path}: {v}");
    }
    let (st, _) = call(
        &s,
        &b,
        Method::PATCH,
        &hook_path,
        Some(json!({"enabled": false})),
    )
    .await;
    assert_eq!(st, 404, "another team's webhook cannot be changed");
    let (_, hooks) = call(&s, &b, Method::GET, "/events/webhooks", None).await;
    assert_eq!(hooks, json!([]), "another team's webhooks");
    let (st, mine) = call(&s, &a, Method::GET, &hook_path, None).await;
    assert_eq!((st, mine["enabled"].clone()), (200, json!(true)), "{mine}");
    assert!(
        !mine.to_string().contains("team-a-secret-123"),
        "the secret is never shown"
    );
    let (_, events) = call(&s, &b, Method::GET, "/events/sandboxes", None).await;
    assert_eq!(events, json!([]), "another team's events");
    let (_, metrics) = call(
        &s,
        &b,
        Method::GET,
        &format!("/sandboxes/metrics?sandbox_ids={id}"),
        None,
    )
    .await;
    assert_eq!(metrics, json!({"sandboxes": {}}), "another team's metrics");
    // A name another team holds is not taken over.
    let (_, bid) = call(
        &s,
        &b,
        Method::POST,
        "/v2/sandboxes",
        Some(json!({"templateID": "base"})),
    )
    .await;
    let bid = bid["sandboxID"].as_str().unwrap().to_string();
    let (st, _) = call(
        &s,
        &b,
        Method::POST,
        &format!("/sandboxes/{bid}/snapshots"),
        Some(json!({"name": "a-snap"})),
    )
    .await;
    assert_eq!(st, 409);

    // Team a still has everything, and the operator's admin key sees both teams.
    let (st, _) = call(&s, &a, Method::GET, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(st, 200);
    let (_, all) = call(&s, API_KEY, Method::GET, "/v2/sandboxes", None).await;
    assert_eq!(all.as_array().unwrap().len(), 2);
    let (_, mine) = call(&s, &a, Method::GET, "/events/sandboxes", None).await;
    assert!(
        mine.as_array()
            .unwrap()
            .iter()
            .all(|e| e["sandboxTeamId"] == json!("team-a")),
        "{mine}"
    );
    assert!(
        mine.as_array()
            .unwrap()
            .iter()
            .any(|e| e["sandboxId"] == json!(id)),
        "{mine}"
    );
    let (_, every) = call(
        &s,
        API_KEY,
        Method::GET,
        "/events/sandboxes?limit=100",
        None,
    )
    .await;
    assert!(
        every
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["sandboxId"] == json!(bid)),
        "{every}"
    );
    let (st, _) = call(
        &s,
        API_KEY,
        Method::DELETE,
        &format!("/sandboxes/{bid}"),
        None,
    )
    .await;
    assert_eq!(st, 204);
}

/// The first SSE message's `data` on an event stream opened with `key`.
async fn first_streamed(s: &TestServer, key: &str, query: &str) -> tokio::task::JoinHandle<Value> {
    use futures::StreamExt;
    let resp = s
        .client()
        .get(s.url(&format!("/events/sandboxes/stream{query}")))
        .header("X-API-KEY", key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    // Subscribed: the server answered once its handler had subscribed.
    tokio::spawn(async move {
        let mut body = resp.bytes_stream();
        let mut text = String::new();
        while let Some(chunk) = body.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            if let Some(line) = text.lines().find(|l| l.starts_with("data:")) {
                return serde_json::from_str(line["data:".len()..].trim()).unwrap();
            }
        }
        panic!("the stream ended without an event: {text}")
    })
}

#[tokio::test]
async fn an_event_stream_carries_only_the_keys_teams_events() {
    use reqwest::Method;
    let dir = tempfile::tempdir().unwrap();
    let s = TestServer::start_on(
        dir,
        Arc::new(AgentRuntime::persistence()),
        Config::default(),
    )
    .await;
    let a = s
        .control
        .keys()
        .create_team_key("a", "team-a", false)
        .await
        .unwrap()
        .secret;
    let b = s
        .control
        .keys()
        .create_team_key("b", "team-b", false)
        .await
        .unwrap()
        .secret;
    let to_b = first_streamed(&s, &b, "").await;
    let to_a = first_streamed(&s, &a, "?types=sandbox.lifecycle.created").await;
    let create = |key: String| {
        let s = &s;
        async move {
            let (st, v) = call(
                s,
                &key,
                Method::POST,
                "/v2/sandboxes",
                Some(json!({"templateID": "base"})),
            )
            .await;
            assert_eq!(st, 201, "{v}");
            v["sandboxID"].as_str().unwrap().to_string()
        }
    };
    // Team a's sandbox first: team b's stream must skip it and carry b's own.
    let first = create(a.clone()).await;
    let second = create(b.clone()).await;
    let seen_by_a = to_a.await.unwrap();
    let seen_by_b = to_b.await.unwrap();
    assert_eq!(seen_by_a["sandboxId"], first);
    assert_eq!(seen_by_a["type"], "sandbox.lifecycle.created");
    assert_eq!(
        seen_by_b["sandboxId"], second,
        "another team's event: {seen_by_b}"
    );
    let (st, _) = call(
        &s,
        &a,
        Method::GET,
        "/events/sandboxes/stream?since=yesterday",
        None,
    )
    .await;
    assert_eq!(st, 400);
}

//! Pause, resume, snapshots and fork over a real socket: the exact success codes the SDKs
//! parse, JSON errors, and the proxy's behaviour with paused sandboxes.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{AgentRuntime, TestServer, API_KEY};
use serde_json::{json, Value};
use warren_control::Config;

async fn assert_json_error(resp: reqwest::Response, status: u16) -> Value {
    assert_eq!(resp.status(), status);
    let body: Value = resp.json().await.expect("error body is JSON");
    assert_eq!(body["code"], status, "{body}");
    assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
    body
}

async fn start_persistent() -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    TestServer::start_on(
        dir,
        Arc::new(AgentRuntime::persistence()),
        Config::default(),
    )
    .await
}

fn post(s: &TestServer, path: &str, body: Value) -> reqwest::RequestBuilder {
    s.client()
        .post(s.url(path))
        .header("X-API-KEY", API_KEY)
        .json(&body)
}

async fn get(s: &TestServer, path: &str) -> reqwest::Response {
    s.client()
        .get(s.url(path))
        .header("X-API-KEY", API_KEY)
        .send()
        .await
        .unwrap()
}

/// The agent's `/health` through the proxy.
async fn health(s: &TestServer, id: &str) -> reqwest::StatusCode {
    s.client()
        .get(s.url("/health"))
        .header("E2b-Sandbox-Id", id)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test]
async fn a_runtime_without_persistence_says_so() {
    let s = TestServer::start().await;
    let id = s.create(json!({"templateID": "base"})).await["sandboxID"]
        .as_str()
        .unwrap()
        .to_string();
    let detail: Value = get(&s, &format!("/sandboxes/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(detail["runtime"]["name"], "test-agent");
    assert_eq!(detail["runtime"]["pauseModes"], json!([]));
    assert_eq!(detail["runtime"]["snapshotModes"], json!([]));
    assert_eq!(
        detail["lifecycle"],
        json!({"autoResume": false, "onTimeout": "kill"})
    );
    assert!(detail.get("pauseMode").is_none());

    for (path, body) in [
        (format!("/sandboxes/{id}/pause"), json!({})),
        (format!("/sandboxes/{id}/snapshots"), json!({})),
        (format!("/sandboxes/{id}/fork"), json!({"count": 1})),
        (
            "/v2/sandboxes".to_string(),
            json!({"templateID": "base", "autoPause": true}),
        ),
    ] {
        let r = post(&s, &path, body).send().await.unwrap();
        let e = assert_json_error(r, 400).await;
        assert!(e["message"].as_str().unwrap().contains("test-agent"), "{e}");
    }
    // Still running.
    assert_eq!(health(&s, &id).await, 204);
    let r = get(&s, "/snapshots").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap(), json!([]));
}

#[tokio::test]
async fn pause_connect_and_proxy() {
    let s = start_persistent().await;
    let id = s.create(json!({"templateID": "base"})).await["sandboxID"]
        .as_str()
        .unwrap()
        .to_string();
    let r = post(&s, &format!("/sandboxes/{id}/pause"), json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let r = post(&s, &format!("/sandboxes/{id}/pause"), json!({}))
        .send()
        .await
        .unwrap();
    assert_json_error(r, 409).await;
    let r = post(&s, "/sandboxes/inosuch/pause", json!({}))
        .send()
        .await
        .unwrap();
    assert_json_error(r, 404).await;
    // This runtime has no filesystem-only pause: a clear 400.
    let r = post(
        &s,
        &format!("/sandboxes/{id}/pause"),
        json!({"memory": false}),
    )
    .send()
    .await
    .unwrap();
    assert_json_error(r, 400).await;

    let detail: Value = get(&s, &format!("/sandboxes/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(detail["state"], "paused");
    assert_eq!(detail["pauseMode"], "full");
    let listed: Value = get(&s, "/v2/sandboxes?state=paused")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listed[0]["sandboxID"], id.as_str());
    let listed: Value = get(&s, "/v2/sandboxes?state=running")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listed, json!([]));

    // No autoResume: traffic does not wake it.
    assert_eq!(health(&s, &id).await, 502);
    let metrics: Value = get(&s, &format!("/sandboxes/{id}/metrics"))
        .await
        .json()
        .await
        .unwrap();
    // Its history stays readable; a paused agent is not asked, so nothing is newer than the
    // pause.
    let paused_at = chrono::Utc::now().timestamp();
    for m in metrics.as_array().unwrap() {
        assert!(m["timestampUnix"].as_i64().unwrap() <= paused_at, "{m}");
    }
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let again: Value = get(&s, &format!("/sandboxes/{id}/metrics"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(again, metrics, "a paused sandbox is not sampled");

    let r = post(
        &s,
        &format!("/v2/sandboxes/{id}/connect"),
        json!({"timeout": 60}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), 201, "resumed");
    let body: Value = r.json().await.unwrap();
    assert!(body["envdAccessToken"].is_string() && body["envdVersion"].is_string());
    assert_eq!(health(&s, &id).await, 204);
    let r = post(&s, &format!("/v2/sandboxes/{id}/connect"), json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "was running");

    // Paused sandboxes can be killed.
    let r = post(
        &s,
        &format!("/sandboxes/{id}/pause"),
        json!({"requireHealthyGuest": true}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), 204);
    let r = s
        .client()
        .delete(s.url(&format!("/sandboxes/{id}")))
        .header("X-API-KEY", API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
}

#[tokio::test]
async fn auto_pause_then_traffic_resumes() {
    let s = start_persistent().await;
    let created = s
        .create(json!({
            "templateID": "base", "timeout": 1, "autoPause": true, "autoResume": {"enabled": true}
        }))
        .await;
    let id = created["sandboxID"].as_str().unwrap().to_string();
    let mut state = String::new();
    for _ in 0..100 {
        let d: Value = get(&s, &format!("/sandboxes/{id}"))
            .await
            .json()
            .await
            .unwrap();
        state = d["state"].as_str().unwrap_or_default().to_string();
        if state == "paused" {
            assert_eq!(
                d["lifecycle"],
                json!({"autoResume": true, "onTimeout": "pause"})
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(state, "paused", "paused at its end time, not killed");
    // Only a request the running sandbox would accept wakes it: not a stranger's.
    assert_eq!(
        health(&s, &id).await,
        403,
        "a request without the token is refused"
    );
    let d: Value = get(&s, &format!("/sandboxes/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(d["state"], "paused", "and does not wake it");
    let token = created["envdAccessToken"].as_str().unwrap();
    let status = s
        .client()
        .get(s.url("/health"))
        .header("E2b-Sandbox-Id", &id)
        .header("X-Access-Token", token)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 204, "traffic resumed it");
    let d: Value = get(&s, &format!("/sandboxes/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(d["state"], "running");
}

#[tokio::test]
async fn snapshots_and_fork() {
    let s = start_persistent().await;
    let id = s
        .create(json!({"templateID": "base", "metadata": {"k": "v"}}))
        .await["sandboxID"]
        .as_str()
        .unwrap()
        .to_string();
    let r = post(
        &s,
        &format!("/sandboxes/{id}/snapshots"),
        json!({"name": "team/snap"}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), 201);
    let snap: Value = r.json().await.unwrap();
    let snap_id = snap["snapshotID"].as_str().unwrap().to_string();
    assert_eq!(snap["names"], json!(["team/snap"]));
    assert_eq!(snap["sandboxID"], id.as_str());
    assert_eq!(snap["memory"], false);
    let r = post(
        &s,
        &format!("/sandboxes/{id}/snapshots"),
        json!({"memory": true}),
    )
    .send()
    .await
    .unwrap();
    let e = assert_json_error(r, 400).await;
    assert!(e["message"]
        .as_str()
        .unwrap()
        .contains("mode=\"filesystem\""));
    let second: Value = post(&s, &format!("/sandboxes/{id}/snapshots"), json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();

    let r = get(&s, &format!("/snapshots?sandboxID={id}&limit=1")).await;
    assert_eq!(r.status(), 200);
    let token = r.headers()["x-next-token"].to_str().unwrap().to_string();
    let page: Value = r.json().await.unwrap();
    assert_eq!(page[0]["snapshotID"], second["snapshotID"], "newest first");
    let r = get(
        &s,
        &format!("/snapshots?sandboxID={id}&limit=1&nextToken={token}"),
    )
    .await;
    assert!(r.headers().get("x-next-token").is_none());
    let page: Value = r.json().await.unwrap();
    assert_eq!(page[0]["snapshotID"], snap_id.as_str());
    assert_json_error(get(&s, "/snapshots?limit=abc").await, 400).await;

    // A snapshot is a template (by id with a tag, or by name).
    let child = s
        .create(json!({"templateID": format!("{snap_id}:default")}))
        .await;
    assert_eq!(child["templateID"], "base");
    s.create(json!({"templateID": "team/snap"})).await;

    let r = post(
        &s,
        &format!("/sandboxes/{id}/fork"),
        json!({"count": 2, "timeout": 60}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), 201);
    let forks: Value = r.json().await.unwrap();
    assert_eq!(forks.as_array().unwrap().len(), 2);
    for f in forks.as_array().unwrap() {
        let fid = f["sandbox"]["sandboxID"].as_str().unwrap();
        assert_ne!(fid, id);
        assert!(f.get("error").is_none());
        assert_eq!(health(&s, fid).await, 204);
        let d: Value = get(&s, &format!("/sandboxes/{fid}"))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(d["metadata"]["k"], "v");
    }
    for count in [0, 101] {
        let r = post(
            &s,
            &format!("/sandboxes/{id}/fork"),
            json!({"count": count}),
        )
        .send()
        .await
        .unwrap();
        assert_json_error(r, 400).await;
    }
    let r = post(&s, "/sandboxes/inosuch/fork", json!({}))
        .send()
        .await
        .unwrap();
    assert_json_error(r, 404).await;
    // The fork's checkpoint is gone; the two named/unnamed snapshots remain.
    assert_eq!(s.runtime.snapshots.lock().unwrap().len(), 2);

    let del = |path: String| {
        s.client()
            .delete(s.url(&path))
            .header("X-API-KEY", API_KEY)
            .send()
    };
    // SDKs path-encode snapshot ids (`/` as %2F).
    assert_eq!(
        del("/templates/team%2Fsnap%3Adefault".into())
            .await
            .unwrap()
            .status(),
        204
    );
    assert_json_error(del("/templates/team%2Fsnap".into()).await.unwrap(), 404).await;
    assert_eq!(
        del(format!(
            "/templates/{}",
            second["snapshotID"].as_str().unwrap()
        ))
        .await
        .unwrap()
        .status(),
        204
    );
    assert!(s.runtime.snapshots.lock().unwrap().is_empty());
    let r = post(&s, "/v2/sandboxes", json!({"templateID": snap_id}))
        .send()
        .await
        .unwrap();
    assert_json_error(r, 404).await;
}

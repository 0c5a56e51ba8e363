//! The REST API over a real socket: status codes, bodies and headers the SDKs depend on.

mod common;

use common::{TestServer, API_KEY};
use serde_json::{json, Value};
use warren_control::Config;

async fn assert_json_error(resp: reqwest::Response, status: u16) -> Value {
    assert_eq!(resp.status(), status);
    let body: Value = resp.json().await.expect("error body is JSON");
    assert_eq!(body["code"], status, "{body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    body
}

#[tokio::test]
async fn lifecycle() {
    let s = TestServer::start().await;
    let c = s.client();
    let created = s
        .create(json!({"templateID": "base", "metadata": {"team": "a"}, "envVars": {}}))
        .await;
    let id = created["sandboxID"].as_str().unwrap().to_string();
    assert_eq!(created["templateID"], "base");
    assert_eq!(created["envdVersion"], "0.6.13");
    assert!(created["envdAccessToken"]
        .as_str()
        .is_some_and(|t| !t.is_empty()));
    assert!(created["clientID"].is_string());

    let r = c
        .get(s.url(&format!("/sandboxes/{id}")))
        .header("X-API-KEY", API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let detail: Value = r.json().await.unwrap();
    assert_eq!(detail["state"], "running");
    assert_eq!(detail["metadata"]["team"], "a");
    for k in ["startedAt", "endAt", "cpuCount", "memoryMB", "diskSizeMB"] {
        assert!(!detail[k].is_null(), "{k} missing");
    }

    let r = c
        .post(s.url(&format!("/sandboxes/{id}/timeout")))
        .header("X-API-KEY", API_KEY)
        .json(&json!({"timeout": 600}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);

    let r = c
        .post(s.url(&format!("/v2/sandboxes/{id}/connect")))
        .header("X-API-KEY", API_KEY)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let conn: Value = r.json().await.unwrap();
    assert_eq!(conn["envdAccessToken"], created["envdAccessToken"]);

    let r = c
        .get(s.url(&format!("/sandboxes/{id}/metrics")))
        .header("X-API-KEY", API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let metrics: Vec<Value> = r.json().await.unwrap();
    assert_eq!(metrics.len(), 1);
    assert!(metrics[0]["memTotal"].as_u64().unwrap() > 0);

    let r = c
        .delete(s.url(&format!("/sandboxes/{id}")))
        .header("X-API-KEY", API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let r = c
        .delete(s.url(&format!("/sandboxes/{id}")))
        .header("X-API-KEY", API_KEY)
        .send()
        .await
        .unwrap();
    assert_json_error(r, 404).await;
    let r = c
        .get(s.url(&format!("/sandboxes/{id}")))
        .header("X-API-KEY", API_KEY)
        .send()
        .await
        .unwrap();
    assert_json_error(r, 404).await;
    let r = c
        .post(s.url(&format!("/v2/sandboxes/{id}/connect")))
        .header("X-API-KEY", API_KEY)
        .send()
        .await
        .unwrap();
    assert_json_error(r, 404).await;
}

#[tokio::test]
async fn list_filters_and_pages() {
    let s = TestServer::start().await;
    let c = s.client();
    let mut ids = Vec::new();
    for i in 0..3 {
        let v = s
            .create(
                json!({"templateID": "base", "metadata": {"suite": "list", "n": i.to_string()}}),
            )
            .await;
        ids.push(v["sandboxID"].as_str().unwrap().to_string());
    }
    s.create(json!({"templateID": "base", "metadata": {"suite": "other"}}))
        .await;

    let r = c
        .get(s.url("/v2/sandboxes"))
        .query(&[("metadata", "suite=list"), ("state", "running")])
        .header("X-API-KEY", API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("x-next-token").is_none());
    let items: Vec<Value> = r.json().await.unwrap();
    assert_eq!(items.len(), 3);

    let mut token: Option<String> = None;
    let mut seen = Vec::new();
    loop {
        let mut q = vec![
            ("metadata", "suite=list".to_string()),
            ("limit", "2".into()),
            ("order", "asc".into()),
        ];
        if let Some(t) = &token {
            q.push(("nextToken", t.clone()));
        }
        let r = c
            .get(s.url("/v2/sandboxes"))
            .query(&q)
            .header("X-API-KEY", API_KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        token = r
            .headers()
            .get("x-next-token")
            .map(|v| v.to_str().unwrap().to_string());
        let items: Vec<Value> = r.json().await.unwrap();
        seen.extend(
            items
                .iter()
                .map(|v| v["sandboxID"].as_str().unwrap().to_string()),
        );
        if token.is_none() {
            break;
        }
    }
    assert_eq!(seen, ids);

    let r = c
        .get(s.url("/v2/sandboxes?state=paused"))
        .header("X-API-KEY", API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.json::<Vec<Value>>().await.unwrap().len(), 0);
    for bad in [
        "limit=0",
        "limit=x",
        "state=bogus",
        "order=up",
        "metadata=a%3D1%3D2",
        "nextToken=%21",
        "startedAfter=x",
    ] {
        let r = c
            .get(s.url(&format!("/v2/sandboxes?{bad}")))
            .header("X-API-KEY", API_KEY)
            .send()
            .await
            .unwrap();
        assert_json_error(r, 400).await;
    }
}

#[tokio::test]
async fn auth_and_bad_input() {
    let s = TestServer::start().await;
    let c = s.client();
    let r = c.get(s.url("/v2/sandboxes")).send().await.unwrap();
    assert_json_error(r, 401).await;
    let r = c
        .get(s.url("/v2/sandboxes"))
        .header("X-API-KEY", "wrong-key")
        .send()
        .await
        .unwrap();
    assert_json_error(r, 401).await;
    let r = c
        .post(s.url("/v2/sandboxes"))
        .json(&json!({"templateID": "base"}))
        .send()
        .await
        .unwrap();
    assert_json_error(r, 401).await;

    let post = |body: Vec<u8>| {
        c.post(s.url("/v2/sandboxes"))
            .header("X-API-KEY", API_KEY)
            .header("content-type", "application/json")
            .body(body)
    };
    assert_json_error(post(b"{not json".to_vec()).send().await.unwrap(), 400).await;
    assert_json_error(
        post(br#"{"templateID": 5}"#.to_vec()).send().await.unwrap(),
        400,
    )
    .await;
    assert_json_error(post(br#"{}"#.to_vec()).send().await.unwrap(), 400).await;
    for t in ["-1", "0", "99999999999"] {
        let body = format!(r#"{{"templateID":"base","timeout":{t}}}"#);
        assert_json_error(post(body.into_bytes()).send().await.unwrap(), 400).await;
    }
    let unknown = post(br#"{"templateID":"no-such-template"}"#.to_vec())
        .send()
        .await
        .unwrap();
    let body = assert_json_error(unknown, 404).await;
    assert!(body["message"]
        .as_str()
        .unwrap()
        .contains("no-such-template"));
    let mut huge = br#"{"templateID":"base","metadata":{"x":""#.to_vec();
    huge.extend(std::iter::repeat_n(b'a', 2 * 1024 * 1024));
    huge.extend(br#""}}"#);
    assert_json_error(post(huge).send().await.unwrap(), 413).await;

    // Nothing was created by any of that.
    let r = c
        .get(s.url("/v2/sandboxes"))
        .header("X-API-KEY", API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.json::<Vec<Value>>().await.unwrap().len(), 0);

    let r = c.get(s.url("/no/such/route")).send().await.unwrap();
    assert_json_error(r, 404).await;
    let r = c
        .put(s.url("/v2/sandboxes"))
        .header("X-API-KEY", API_KEY)
        .send()
        .await
        .unwrap();
    assert_json_error(r, 405).await;
    let r = c
        .post(s.url("/sandboxes/nope/timeout"))
        .header("X-API-KEY", API_KEY)
        .json(&json!({"timeout": 5}))
        .send()
        .await
        .unwrap();
    assert_json_error(r, 404).await;
    let r = c.get(s.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn concurrency_limit_is_429_with_retry_after() {
    let s = TestServer::start_with(Config {
        max_concurrent: 1,
        ..Config::default()
    })
    .await;
    s.create(json!({"templateID": "base"})).await;
    let r = s
        .client()
        .post(s.url("/v2/sandboxes"))
        .header("X-API-KEY", API_KEY)
        .json(&json!({"templateID": "base"}))
        .send()
        .await
        .unwrap();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    assert_json_error(r, 429).await;
    assert!(retry.unwrap().parse::<u64>().unwrap() >= 1);
}

#[tokio::test]
async fn expiry_and_restart() {
    let s = TestServer::start().await;
    let keep = s.create(json!({"templateID": "base"})).await["sandboxID"]
        .as_str()
        .unwrap()
        .to_string();
    let short = s.create(json!({"templateID": "base", "timeout": 1})).await["sandboxID"]
        .as_str()
        .unwrap()
        .to_string();
    tokio::time::sleep(std::time::Duration::from_millis(1800)).await;
    let r = s
        .client()
        .get(s.url(&format!("/sandboxes/{short}")))
        .header("X-API-KEY", API_KEY)
        .send()
        .await
        .unwrap();
    assert_json_error(r, 404).await;

    // A restarted server remembers and reattaches the running sandbox.
    let (dir, runtime) = s.stop().await;
    let s = TestServer::start_on(dir, runtime, Config::default()).await;
    let r = s
        .client()
        .get(s.url(&format!("/sandboxes/{keep}")))
        .header("X-API-KEY", API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = s
        .client()
        .get(s.url("/health"))
        .header("E2b-Sandbox-Id", &keep)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
}

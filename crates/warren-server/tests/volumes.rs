//! Volumes and secrets over the REST API: status codes, bodies, teams, what a create hands the
//! runtime, and what a volume in use protects. Volumes are real (`warren-volume`: loop-mounted
//! images, so these tests need root and loop devices; without them they fail saying so).

mod common;

use std::sync::Arc;

use common::{AgentRuntime, TestServer, API_KEY};
use reqwest::Method;
use serde_json::{json, Value};
use warren_control::Config;
use warren_server::ServerConfig;

/// Deletes every volume left under the server's data dir before the directory goes: a
/// mounted volume would otherwise outlive the test (and its loop device with it).
struct Fixture {
    _cleanup: Cleanup,
    s: TestServer,
}

struct Cleanup(Arc<warren_volume::VolumeHost>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for e in std::fs::read_dir(self.0.root())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with('.') {
                let _ = self.0.delete(&name);
            }
        }
    }
}

impl std::ops::Deref for Fixture {
    type Target = TestServer;
    fn deref(&self) -> &TestServer {
        &self.s
    }
}

async fn server() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let host = Arc::new(
        warren_volume::VolumeHost::open(&dir.path().join("volumes"))
            .expect("volumes need root and loop devices"),
    );
    let runtime = Arc::new(AgentRuntime::with_volumes());
    let s = TestServer::start_full(
        dir,
        runtime,
        Config::default(),
        ServerConfig {
            volumes: Some(host.clone()),
            ..ServerConfig::default()
        },
        warren_server::ListenerLimits::default(),
    )
    .await;
    Fixture {
        _cleanup: Cleanup(host),
        s,
    }
}

async fn call(s: &TestServer, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    s.call_as(API_KEY, method, path, body).await
}

async fn new_volume(s: &TestServer, name: &str) -> Value {
    let (st, v) = call(
        s,
        Method::POST,
        "/volumes",
        Some(json!({"name": name, "quota": {"bytes": 16 << 20, "inodes": 256}})),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    v
}

#[tokio::test]
async fn volumes_api_teams_and_mounts() {
    let s = server().await;
    let v = new_volume(&s, "data").await;
    let id = v["volumeID"].as_str().unwrap().to_string();
    assert!(v["token"].as_str().unwrap().starts_with("wvt_"));
    assert_eq!(v["quota"], json!({"bytes": 16 << 20, "inodes": 256}));

    // By id and by name, with usage; listed without the token.
    let (st, got) = call(&s, Method::GET, "/volumes/data", None).await;
    assert_eq!((st, got["volumeID"].as_str()), (200, Some(id.as_str())));
    assert!(got["usage"]["bytesTotal"].as_u64().unwrap() > 0, "{got}");
    let (_, list) = call(&s, Method::GET, "/volumes", None).await;
    assert_eq!(list, json!([{"volumeID": id, "name": "data"}]));

    // Another team sees nothing of it.
    let other = s
        .control
        .keys()
        .create_team_key("other", "team-b", false)
        .await
        .unwrap();
    let (st, _) = s
        .call_as(&other.secret, Method::GET, &format!("/volumes/{id}"), None)
        .await;
    assert_eq!(st, 404);
    let (_, theirs) = s
        .call_as(&other.secret, Method::GET, "/volumes", None)
        .await;
    assert_eq!(theirs, json!([]));
    let (st, body) = s
        .call_as(
            &other.secret,
            Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": "base", "volumeMounts": [{"name": "data", "path": "/d"}]})),
        )
        .await;
    assert_eq!(st, 400, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("not found"),
        "{body}"
    );

    // A create hands the runtime the mounted volume; the details echo it.
    let created = s
        .create(json!({"templateID": "base",
                       "volumeMounts": [{"name": "data", "path": "/mnt/d", "readOnly": true}]}))
        .await;
    let sid = created["sandboxID"].as_str().unwrap().to_string();
    let given = s.runtime.volumes.lock().unwrap().clone();
    let (_, mounts) = given.iter().find(|(i, _)| *i == sid).unwrap();
    assert_eq!(mounts.len(), 1);
    assert_eq!(mounts[0].volume_id, id);
    assert_eq!(mounts[0].path, "/mnt/d");
    assert!(mounts[0].read_only);
    assert!(
        mounts[0].source.ends_with(format!("{id}/data")),
        "{:?}",
        mounts[0].source
    );
    let (_, detail) = call(&s, Method::GET, &format!("/sandboxes/{sid}"), None).await;
    assert_eq!(
        detail["volumeMounts"],
        json!([{"name": "data", "path": "/mnt/d", "readOnly": true}])
    );

    // In use: not deleted. Killed: deleted.
    let (st, body) = call(&s, Method::DELETE, "/volumes/data", None).await;
    assert_eq!(st, 409, "{body}");
    assert!(body["message"].as_str().unwrap().contains(&sid));
    let (st, _) = call(&s, Method::DELETE, &format!("/sandboxes/{sid}"), None).await;
    assert_eq!(st, 204);
    let (st, _) = call(&s, Method::DELETE, "/volumes/data", None).await;
    assert_eq!(st, 204);
    let (st, _) = call(&s, Method::GET, &format!("/volumes/{id}"), None).await;
    assert_eq!(st, 404);
}

#[tokio::test]
async fn bad_names_and_mounts_are_400s_naming_the_cause() {
    let s = server().await;
    new_volume(&s, "v1").await;
    for (body, cause) in [
        (json!({"name": "bad name"}), "Invalid volume name"),
        (json!({"name": "v1"}), "already exists"),
        (json!({"name": "x", "quota": {"bytes": 1}}), "bytes"),
    ] {
        let (st, b) = call(&s, Method::POST, "/volumes", Some(body.clone())).await;
        assert_eq!(st, 400, "{body}: {b}");
        assert!(
            b["message"].as_str().unwrap().contains(cause),
            "{body}: {b}"
        );
    }
    let mount =
        |path: &str| json!({"templateID": "base", "volumeMounts": [{"name": "v1", "path": path}]});
    for (body, cause) in [
        (mount("rel"), "absolute"),
        (mount("/a/../b"), "absolute and clean"),
        (mount("/proc/x"), "reserved"),
        (mount("/"), "absolute"),
        (
            json!({"templateID": "base", "volumeMounts": [{"name": "v1", "path": "/a"}, {"name": "v1", "path": "/a"}]}),
            "used twice",
        ),
        (
            json!({"templateID": "base", "volumeMounts": [{"name": "v1", "path": "/a", "subpath": "../x"}]}),
            "subpath",
        ),
    ] {
        let (st, b) = call(&s, Method::POST, "/v2/sandboxes", Some(body.clone())).await;
        assert_eq!(st, 400, "{body}: {b}");
        let m = b["message"].as_str().unwrap();
        assert!(
            m.starts_with("invalid mounts:") && m.contains(cause),
            "{body}: {m}"
        );
    }
}

#[tokio::test]
async fn content_api_needs_the_volumes_token_and_answers_string_codes() {
    let s = server().await;
    let v = new_volume(&s, "c").await;
    let (id, token) = (
        v["volumeID"].as_str().unwrap(),
        v["token"].as_str().unwrap(),
    );
    let c = s.client();
    let url = |p: &str| s.url(&format!("/volumecontent/{id}/{p}"));
    let r = c
        .put(url("file?path=/a.txt"))
        .bearer_auth(token)
        .body("hello")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let r = c
        .get(url("file?path=/a.txt"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "hello");
    for auth in [None, Some("wvt_wrong"), Some(API_KEY)] {
        let mut req = c.get(url("file?path=/a.txt"));
        if let Some(a) = auth {
            req = req.bearer_auth(a);
        }
        let r = req.send().await.unwrap();
        let st = r.status().as_u16();
        assert!(st == 401 || st == 403, "{auth:?}: {st}");
        let b: Value = r.json().await.unwrap();
        assert_eq!(b["code"], json!(st.to_string()), "{b}");
    }
    let r = c
        .get(url("path?path=/nope"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let b: Value = r.json().await.unwrap();
    assert_eq!(b["code"], "404");
    let r = c
        .put(url("file?path=/a.txt"))
        .bearer_auth(token)
        .body("again")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
}

#[tokio::test]
async fn secrets_api_never_returns_a_value() {
    let s = server().await;
    let value = "sk-test-do-not-return-me";
    let (st, made) = call(
        &s,
        Method::POST,
        "/secrets",
        Some(json!({"name": "OpenAI", "value": value, "metadata": {"k": "v"}})),
    )
    .await;
    assert_eq!(st, 201, "{made}");
    assert_eq!(made["name"], "openai");
    assert_eq!(made["currentVersion"], 1);
    let id = made["secretID"].as_str().unwrap().to_string();
    assert!(id.starts_with("sec_"));
    let (st, upd) = call(
        &s,
        Method::POST,
        "/secrets/OPENAI",
        Some(json!({"value": "v2"})),
    )
    .await;
    assert_eq!(
        (st, &upd["currentVersion"], &upd["metadata"]),
        (200, &json!(2), &json!({"k": "v"}))
    );
    for path in ["/secrets", "/secrets/openai", &format!("/secrets/{id}")] {
        let (st, body) = call(&s, Method::GET, path, None).await;
        assert_eq!(st, 200);
        assert!(
            !body.to_string().contains(value) && !body.to_string().contains("v2\""),
            "{body}"
        );
    }
    let (st, _) = call(
        &s,
        Method::POST,
        "/secrets",
        Some(json!({"name": "openai", "value": "x"})),
    )
    .await;
    assert_eq!(st, 409);
    let other = s
        .control
        .keys()
        .create_team_key("o", "team-b", false)
        .await
        .unwrap();
    let (st, _) = s
        .call_as(&other.secret, Method::GET, &format!("/secrets/{id}"), None)
        .await;
    assert_eq!(st, 404);
    // Pages: the header names the next one until the last.
    for i in 0..3 {
        call(
            &s,
            Method::POST,
            "/secrets",
            Some(json!({"name": format!("p{i}"), "value": "x"})),
        )
        .await;
    }
    let r = s
        .client()
        .get(s.url("/secrets?limit=3"))
        .header("X-API-KEY", API_KEY)
        .send()
        .await
        .unwrap();
    let next = r.headers()["x-next-token"].to_str().unwrap().to_string();
    assert_eq!(r.json::<Vec<Value>>().await.unwrap().len(), 3);
    let r = s
        .client()
        .get(s.url(&format!("/secrets?limit=3&nextToken={next}")))
        .header("X-API-KEY", API_KEY)
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("x-next-token").is_none());
    assert_eq!(r.json::<Vec<Value>>().await.unwrap().len(), 1);
    let (st, _) = call(&s, Method::DELETE, &format!("/secrets/{id}"), None).await;
    assert_eq!(st, 204);
    let (st, _) = call(&s, Method::DELETE, &format!("/secrets/{id}"), None).await;
    assert_eq!(st, 404);
}

#[tokio::test]
async fn a_sweep_removes_only_volumes_no_record_names() {
    let s = server().await;
    let kept = new_volume(&s, "kept").await;
    let kept_id = kept["volumeID"].as_str().unwrap();
    let (st, snap) = call(&s, Method::POST, "/v1/volumes/kept/snapshots", None).await;
    assert_eq!(st, 201, "{snap}");
    // What a crash between a disk's creation and its record leaves behind.
    let host = s._cleanup.0.clone();
    let quota = warren_volume::Quota {
        bytes: 16 << 20,
        inodes: 256,
    };
    host.create("volorphan", quota).unwrap();
    host.snapshot(kept_id, "vsnorphan").unwrap();
    assert_eq!(s.control.sweep_volumes().await.unwrap(), 2);
    assert!(!host.exists("volorphan"));
    assert_eq!(
        host.snapshot_ids().unwrap(),
        vec![snap["snapshotID"].as_str().unwrap().to_string()]
    );
    assert!(host.exists(kept_id));
    assert_eq!(s.control.sweep_volumes().await.unwrap(), 0);
}

#[tokio::test]
async fn a_volume_grows_and_never_shrinks() {
    let s = server().await;
    new_volume(&s, "growing").await;
    let (_, before) = call(&s, Method::GET, "/volumes/growing", None).await;
    let total = before["usage"]["bytesTotal"].as_u64().unwrap();

    let (st, v) = call(
        &s,
        Method::PATCH,
        "/volumes/growing",
        Some(json!({"quota": {"bytes": 48 << 20}})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["quota"]["bytes"], json!(48 << 20));
    assert!(
        v["usage"]["bytesTotal"].as_u64().unwrap() > total + (16 << 20),
        "{before} -> {v}"
    );
    // Inodes come with the space in ext4: the record says what the volume has.
    assert!(v["quota"]["inodes"].as_u64().unwrap() >= 256, "{v}");
    let (_, again) = call(&s, Method::GET, "/volumes/growing", None).await;
    assert_eq!(again["quota"]["bytes"], json!(48 << 20));

    for (body, says) in [
        (json!({"quota": {"bytes": 16 << 20}}), "must be larger"),
        (json!({"quota": {"bytes": 1u64 << 62}}), "at most"),
        (json!({"quota": {"inodes": 10}}), ""),
        (json!({"size": 1}), ""),
    ] {
        let (st, v) = call(&s, Method::PATCH, "/volumes/growing", Some(body.clone())).await;
        assert_eq!(st, 400, "{body}: {v}");
        assert!(v["message"].as_str().unwrap().contains(says), "{body}: {v}");
    }
    let (st, _) = call(
        &s,
        Method::PATCH,
        "/volumes/nope",
        Some(json!({"quota": {"bytes": 64 << 20}})),
    )
    .await;
    assert_eq!(st, 404);
}

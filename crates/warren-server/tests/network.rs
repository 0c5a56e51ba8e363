//! `network.allowOut` / `denyOut` on create, their readback, and `PUT /sandboxes/{id}/network`
//! (`e2b-compat-wave2.md` §2.1-2.2): validation, status codes, what reaches the runtime.
//! TEST-NET addresses only; nothing is sent anywhere (the runtime enforces, and is tested in
//! warren-net and end to end).

mod common;

use std::sync::Arc;

use common::{AgentRuntime, TestServer, API_KEY};
use serde_json::{json, Value};
use warren_control::Config;

async fn server() -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    TestServer::start_on(
        dir,
        Arc::new(AgentRuntime::with_egress()),
        Config::default(),
    )
    .await
}

async fn put(s: &TestServer, id: &str, body: Value) -> (u16, Value) {
    let r = s
        .client()
        .put(s.url(&format!("/sandboxes/{id}/network")))
        .header("X-API-KEY", API_KEY)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn detail(s: &TestServer, id: &str) -> Value {
    s.client()
        .get(s.url(&format!("/sandboxes/{id}")))
        .header("X-API-KEY", API_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn last_policy(s: &TestServer, id: &str) -> Value {
    let seen = s.runtime.egress.lock().unwrap();
    let (_, p) = seen.iter().rev().find(|(i, _)| i == id).expect("a policy");
    serde_json::to_value(p).unwrap()
}

#[tokio::test]
async fn create_takes_the_policy_and_reads_it_back() {
    let s = server().await;
    let created = s
        .create(json!({"templateID": "base", "network": {
            "allowOut": ["203.0.113.7"], "denyOut": ["0.0.0.0/0", "198.51.100.0/24"]}}))
        .await;
    let id = created["sandboxID"].as_str().unwrap();
    assert_eq!(
        last_policy(&s, id),
        json!({"allowOut": ["203.0.113.7"], "denyOut": ["0.0.0.0/0", "198.51.100.0/24"]})
    );
    let d = detail(&s, id).await;
    assert_eq!(d["network"]["allowOut"], json!(["203.0.113.7"]));
    assert_eq!(
        d["network"]["denyOut"],
        json!(["0.0.0.0/0", "198.51.100.0/24"])
    );
    assert_eq!(d["allowInternetAccess"], json!(true));

    // allow_internet_access=false denies everything but allowOut (as E2B).
    let cut = s
        .create(json!({"templateID": "base", "allow_internet_access": false,
                       "network": {"allowOut": ["192.0.2.0/28"]}}))
        .await;
    let cut = cut["sandboxID"].as_str().unwrap();
    assert_eq!(
        last_policy(&s, cut),
        json!({"allowOut": ["192.0.2.0/28"], "denyOut": ["0.0.0.0/0"]})
    );
    // No network at all: an open policy.
    let open = s.create(json!({"templateID": "base"})).await;
    let open = open["sandboxID"].as_str().unwrap();
    assert_eq!(
        last_policy(&s, open),
        json!({"allowOut": [], "denyOut": []})
    );
    let d = detail(&s, open).await;
    assert!(d["network"].get("allowOut").is_none(), "{d}");
}

#[tokio::test]
async fn put_replaces_the_whole_policy_of_a_running_sandbox() {
    let s = server().await;
    let created = s
        .create(json!({"templateID": "base", "network": {"denyOut": ["198.51.100.0/24"]}}))
        .await;
    let id = created["sandboxID"].as_str().unwrap();

    let (status, _) = put(&s, id, json!({"denyOut": ["203.0.113.0/24"]})).await;
    assert_eq!(status, 204);
    // Replaced, not merged: the earlier deny is gone.
    assert_eq!(
        last_policy(&s, id),
        json!({"allowOut": [], "denyOut": ["203.0.113.0/24"]})
    );
    assert_eq!(
        detail(&s, id).await["network"]["denyOut"],
        json!(["203.0.113.0/24"])
    );

    let (status, _) = put(
        &s,
        id,
        json!({"allowOut": ["192.0.2.1"], "allow_internet_access": false}),
    )
    .await;
    assert_eq!(status, 204);
    assert_eq!(
        last_policy(&s, id),
        json!({"allowOut": ["192.0.2.1"], "denyOut": ["0.0.0.0/0"]})
    );
    let d = detail(&s, id).await;
    assert_eq!(d["allowInternetAccess"], json!(false));

    // An empty body clears everything.
    let (status, _) = put(&s, id, json!({})).await;
    assert_eq!(status, 204);
    assert_eq!(last_policy(&s, id), json!({"allowOut": [], "denyOut": []}));
    assert_eq!(detail(&s, id).await["allowInternetAccess"], json!(true));
}

#[tokio::test]
async fn bad_policies_get_a_clear_400_and_change_nothing() {
    let s = server().await;
    let created = s
        .create(json!({"templateID": "base", "network": {"denyOut": ["198.51.100.0/24"]}}))
        .await;
    let id = created["sandboxID"].as_str().unwrap();
    let before = s.runtime.egress.lock().unwrap().len();
    for (body, says) in [
        (json!({"denyOut": ["300.1.2.3"]}), "invalid denyOut entry"),
        (
            json!({"allowOut": ["10.0.0.0/33"]}),
            "invalid allowOut entry",
        ),
        (json!({"allowOut": ["2001:db8::1"]}), "IPv6"),
        (
            json!({"allowOut": ["example.test"]}),
            "must include 'ALL_TRAFFIC' in deny out",
        ),
        (
            json!({"allowOut": ["example.test"], "denyOut": ["0.0.0.0/0"]}),
            "domain rules",
        ),
        (json!({"dnsServers": ["192.0.2.53"]}), "not supported"),
        (
            json!({"rules": {"api.example.test": [{"transform": {"headers": {"Host": "b"}}}]}}),
            "network.rules[\"api.example.test\"] header \"Host\"",
        ),
        (
            json!({"rules": {"10.0.0.1": [{"transform": {"headers": {"a": "b"}}}]}}),
            "not a domain name",
        ),
        (
            json!({"rules": {"a.test": [{"transform": {"headers": {"a": "${e2b.identity.tokens.x}"}}}]}}),
            "workload identity",
        ),
        (
            json!({"rules": {"a.test": [{"transform": {"headers": {"a": "b"}}, "scheme": "ftp"}]}}),
            "network.rules[\"a.test\"] scheme \"ftp\" is not known",
        ),
        (json!({"denyOut": "0.0.0.0/0"}), ""),
    ] {
        let (status, v) = put(&s, id, body.clone()).await;
        assert_eq!(status, 400, "{body}: {v}");
        assert!(
            v["message"].as_str().unwrap_or("").contains(says),
            "{body}: {v}"
        );
    }
    assert_eq!(s.runtime.egress.lock().unwrap().len(), before);
    assert_eq!(
        detail(&s, id).await["network"]["denyOut"],
        json!(["198.51.100.0/24"])
    );
    // The same checks on create.
    let r = s
        .client()
        .post(s.url("/v2/sandboxes"))
        .header("X-API-KEY", API_KEY)
        .json(&json!({"templateID": "base", "network": {"allowOut": ["*.example.test"]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}

#[tokio::test]
async fn header_rules_reach_the_runtime_and_read_back_with_their_placeholders() {
    let s = server().await;
    let rules = json!({"API.Example.test": [{"transform": {"headers": {
        "Authorization": "Bearer ${e2b.secrets.openai_key}"}}}]});
    let created = s
        .create(json!({"templateID": "base", "network": {"rules": rules}}))
        .await;
    let id = created["sandboxID"].as_str().unwrap();
    let want = json!({"api.example.test": [{"transform": {"headers": {
        "Authorization": "Bearer ${e2b.secrets.openai_key}"}}}]});
    assert_eq!(last_policy(&s, id)["rules"], want);
    assert_eq!(detail(&s, id).await["network"]["rules"], want);
    // An update replaces the rules; one without them clears them. A rule may let its
    // headers go over plain HTTP too (`scheme`, kept lower case).
    let (status, _) = put(
        &s,
        id,
        json!({"rules": {"*.models.test": [{"transform": {"headers": {"X-Key": "k"}},
            "scheme": "HTTP"}]}}),
    )
    .await;
    assert_eq!(status, 204);
    let want = json!({"*.models.test": [{"transform": {"headers": {"X-Key": "k"}},
        "scheme": "http"}]});
    assert_eq!(last_policy(&s, id)["rules"], want);
    assert_eq!(detail(&s, id).await["network"]["rules"], want);
    let (status, _) = put(&s, id, json!({})).await;
    assert_eq!(status, 204);
    assert!(last_policy(&s, id).get("rules").is_none());
    assert!(detail(&s, id).await["network"].get("rules").is_none());
}

#[tokio::test]
async fn put_for_unknown_killed_or_paused_sandboxes() {
    let s = server().await;
    let (status, v) = put(&s, "inosuchsandbox", json!({})).await;
    assert_eq!(status, 404, "{v}");
    assert_eq!(v["code"], 404);

    // Paused: stored now, given to the runtime on resume (with the resume's create spec).
    let created = s.create(json!({"templateID": "base"})).await;
    let id = created["sandboxID"].as_str().unwrap().to_string();
    let pause = s
        .client()
        .post(s.url(&format!("/sandboxes/{id}/pause")))
        .header("X-API-KEY", API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(pause.status(), 204);
    let before = s.runtime.egress.lock().unwrap().len();
    let (status, _) = put(&s, &id, json!({"denyOut": ["192.0.2.0/24"]})).await;
    assert_eq!(status, 204);
    assert_eq!(
        s.runtime.egress.lock().unwrap().len(),
        before,
        "not applied while paused"
    );
    assert_eq!(
        detail(&s, &id).await["network"]["denyOut"],
        json!(["192.0.2.0/24"])
    );

    let kill = s
        .client()
        .delete(s.url(&format!("/sandboxes/{id}")))
        .header("X-API-KEY", API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(kill.status(), 204);
    let (status, _) = put(&s, &id, json!({})).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn a_runtime_without_egress_policies_refuses_them() {
    let s = TestServer::start().await;
    for (network, says) in [
        (
            json!({"allowOut": ["203.0.113.0/24"]}),
            "does not enforce egress",
        ),
        (json!({"denyOut": ["0.0.0.0/0"]}), "does not enforce egress"),
        (
            json!({"rules": {"a.test": [{"transform": {"headers": {"a": "b"}}}]}}),
            "network.rules (headers set at egress) are not applied",
        ),
    ] {
        let r = s
            .client()
            .post(s.url("/v2/sandboxes"))
            .header("X-API-KEY", API_KEY)
            .json(&json!({"templateID": "base", "network": network}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{network}");
        let v: Value = r.json().await.unwrap();
        assert!(v["message"].as_str().unwrap().contains(says), "{v}");
    }
    // allow_internet_access alone keeps working there (it is not a list policy).
    s.create(json!({"templateID": "base", "allow_internet_access": false}))
        .await;
}

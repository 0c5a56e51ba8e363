//! The signed-URL lifetime limit the control plane sets through `POST /init`
//! (`signedUrlMaxAgeSecs`), against the real agent binary.
//!
//! Needs a `user` account (`useradd -m user`): downloads run as the default user.

mod common;

use base64::Engine;
use reqwest::StatusCode;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use common::Agent;

const TOKEN: &str = "policy-token";

/// The signature the SDKs compute for a read of `path` by the default user.
fn read_signature(path: &str, exp: Option<i64>) -> String {
    let mut text = format!("{path}:read::{TOKEN}");
    if let Some(e) = exp {
        text.push_str(&format!(":{e}"));
    }
    let digest = Sha256::digest(text.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after the epoch")
        .as_secs() as i64
}

/// A world-readable file in /tmp, removed on drop.
struct Sample(String);

impl Sample {
    fn new(tag: &str) -> Sample {
        let path = format!("/tmp/warren-signed-policy-{tag}-{}", std::process::id());
        std::fs::write(&path, b"policy").expect("write the sample file");
        Sample(path)
    }
}

impl Drop for Sample {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

struct Client {
    agent: Agent,
    http: reqwest::Client,
}

impl Client {
    fn start() -> Client {
        Client {
            agent: Agent::start_with(&["--default-user", "user"]),
            http: reqwest::Client::new(),
        }
    }

    /// `POST /init` with `body`, authenticated by the token once one is set.
    async fn init(&self, body: Value) -> reqwest::Response {
        self.http
            .post(self.agent.url("/init"))
            .header("x-access-token", TOKEN)
            .json(&body)
            .send()
            .await
            .expect("POST /init")
    }

    /// A signed `GET /files` of `path`, without the token header.
    async fn signed_get(&self, path: &str, exp: Option<i64>) -> reqwest::Response {
        let mut url = reqwest::Url::parse(&self.agent.url("/files")).expect("url");
        url.query_pairs_mut()
            .append_pair("path", path)
            .append_pair("signature", &read_signature(path, exp));
        if let Some(e) = exp {
            url.query_pairs_mut()
                .append_pair("signature_expiration", &e.to_string());
        }
        self.http.get(url).send().await.expect("GET /files")
    }
}

/// Asserts a 401 whose JSON message contains `needle`.
async fn assert_refused(resp: reqwest::Response, needle: &str) {
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let body: Value = resp.json().await.expect("JSON error body");
    let msg = body["message"].as_str().expect("message");
    assert!(msg.contains(needle), "message {msg:?} lacks {needle:?}");
}

#[tokio::test]
async fn a_maximum_age_from_init_bounds_signed_urls() {
    let c = Client::start();
    let file = Sample::new("max");
    let init = c
        .init(json!({ "accessToken": TOKEN, "signedUrlMaxAgeSecs": 300 }))
        .await;
    assert_eq!(init.status(), StatusCode::NO_CONTENT);

    // No expiration at all: refused, whatever the signature.
    assert_refused(
        c.signed_get(&file.0, None).await,
        "requires signed URLs to expire",
    )
    .await;
    // An expiration far beyond the limit (a day): refused.
    assert_refused(
        c.signed_get(&file.0, Some(now() + 86_400)).await,
        "expires later than this sandbox allows",
    )
    .await;
    // Within the limit: served. 60 s leaves the clock a wide margin either side.
    let resp = c.signed_get(&file.0, Some(now() + 60)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.text().await.expect("body"), "policy");
    // The token header is not a signed URL: not subject to the limit.
    let resp = c
        .http
        .get(c.agent.url(&format!("/files?path={}", file.0)))
        .header("x-access-token", TOKEN)
        .send()
        .await
        .expect("GET /files with the token");
    assert_eq!(resp.status(), StatusCode::OK);

    // A later /init without the field keeps the limit (a resumed sandbox is initialised again).
    assert_eq!(
        c.init(json!({ "envVars": { "A": "1" } })).await.status(),
        StatusCode::NO_CONTENT
    );
    assert_refused(
        c.signed_get(&file.0, None).await,
        "requires signed URLs to expire",
    )
    .await;

    // 0 lifts it: back to upstream's never-expiring URLs.
    assert_eq!(
        c.init(json!({ "signedUrlMaxAgeSecs": 0 })).await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(c.signed_get(&file.0, None).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn without_a_maximum_age_signed_urls_need_no_expiration() {
    let c = Client::start();
    let file = Sample::new("none");
    let init = c.init(json!({ "accessToken": TOKEN })).await;
    assert_eq!(init.status(), StatusCode::NO_CONTENT);
    assert_eq!(c.signed_get(&file.0, None).await.status(), StatusCode::OK);
    let far = now() + 10 * 365 * 86_400;
    assert_eq!(
        c.signed_get(&file.0, Some(far)).await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_bad_maximum_age_is_a_400_and_changes_nothing() {
    let c = Client::start();
    let file = Sample::new("bad");
    assert_eq!(
        c.init(json!({ "accessToken": TOKEN, "signedUrlMaxAgeSecs": 300 }))
            .await
            .status(),
        StatusCode::NO_CONTENT
    );
    for bad in [json!(-5), json!(2.5), json!("300"), json!(true)] {
        let resp = c
            .init(json!({ "signedUrlMaxAgeSecs": bad, "defaultWorkdir": "/tmp" }))
            .await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "value {bad}");
        let body: Value = resp.json().await.expect("JSON error body");
        let msg = body["message"].as_str().expect("message");
        assert!(msg.contains("signedUrlMaxAgeSecs"), "{msg}");
    }
    // The limit set before is still in force.
    assert_refused(
        c.signed_get(&file.0, None).await,
        "requires signed URLs to expire",
    )
    .await;
}

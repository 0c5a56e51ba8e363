//! The `process.Process` service and the agent's HTTP around it, against a real agent: the
//! access token, `/init`, HTTP/2 without TLS, and large output in bounded memory.

mod common;

use common::process::*;
use common::{envelope, parse_envelopes, Agent, EnvelopeStream};
use serde_json::{json, Value};

/// A `List` call on `c`, with `token` as the access token where there is one.
async fn list(agent: &Agent, c: &reqwest::Client, token: Option<&str>) -> reqwest::Response {
    let mut req = c
        .post(agent.url("/process.Process/List"))
        .header("content-type", "application/json");
    if let Some(token) = token {
        req = req.header("x-access-token", token);
    }
    req.body("{}").send().await.unwrap()
}

#[tokio::test]
async fn access_token_is_enforced_once_set() {
    let agent = Agent::start_with(&["--access-token", "s3cret"]);
    let c = client();
    let resp = list(&agent, &c, None).await;
    assert_eq!(resp.status(), 401);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["code"], 401);
    assert_eq!(list(&agent, &c, Some("wrong")).await.status(), 401);
    assert_eq!(list(&agent, &c, Some("s3cret")).await.status(), 200);
    // Health stays open.
    assert_eq!(
        c.get(agent.url("/health")).send().await.unwrap().status(),
        204
    );
}

#[tokio::test]
async fn init_sets_env_vars_default_user_and_token() {
    let agent = Agent::start();
    let c = client();
    let resp = c
        .post(agent.url("/init"))
        .json(&json!({"envVars": {"SANDBOX_WIDE": "yes"}, "defaultUser": "root", "accessToken": "tok"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    assert_eq!(resp.headers()["x-envd-version"], "0.6.13");
    let run = collect(
        start_bash(
            &agent,
            "echo $SANDBOX_WIDE; id -un",
            &[("x-access-token", "tok")],
        )
        .await,
    );
    assert_eq!(run.stdout, b"yes\nroot\n");
    let envs: Value = c
        .get(agent.url("/envs"))
        .header("x-access-token", "tok")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(envs["SANDBOX_WIDE"], "yes");
    // Malformed init body: clear error, nothing changed.
    let resp = c
        .post(agent.url("/init"))
        .header("x-access-token", "tok")
        .body("[")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let resp = c
        .get(agent.url("/envs"))
        .header("x-access-token", "tok")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn h2c_prior_knowledge_works() {
    let agent = Agent::start();
    let c = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let resp = c
        .post(agent.url("/process.Process/Start"))
        .header("content-type", STREAM)
        .body(envelope(0, &bash("echo over-h2")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.version(), reqwest::Version::HTTP_2);
    let run = collect(parse_envelopes(&resp.bytes().await.unwrap()));
    assert_eq!(run.stdout, b"over-h2\n");
}

#[tokio::test]
async fn large_output_streams_in_bounded_memory() {
    let agent = Agent::start();
    let body = envelope(0, &bash("head -c 200000000 /dev/zero"));
    let resp = stream_request(&agent, "Start", body).send().await.unwrap();
    let mut s = EnvelopeStream::new(resp);
    let mut total = 0usize;
    let mut ended = false;
    while let Some((flags, m)) = s.next().await {
        if flags == 2 {
            break;
        }
        if let Some(d) = m["event"]["data"].get("stdout") {
            total += b64(d).len();
        }
        ended |= m["event"].get("end").is_some();
    }
    assert!(ended);
    assert_eq!(total, 200_000_000);
    let peak_mib = agent.peak_rss_kib() / 1024;
    assert!(
        peak_mib < 100,
        "agent peak RSS {peak_mib} MiB after streaming 200 MB"
    );
}

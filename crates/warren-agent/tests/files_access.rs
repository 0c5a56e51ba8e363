//! End-to-end tests of who may use `GET/POST /files` (access token, signed URLs), of the
//! error statuses `/files` answers, and of `GET /metrics`, against the real agent binary.
//!
//! Needs root (the agent chowns uploads) and a `user` account (`useradd -m user`).

mod files_support;

use reqwest::StatusCode;

use files_support::*;

#[tokio::test]
async fn access_token_and_signatures() {
    let agent = Agent::start(Some(TOKEN)).await;
    let dir = Scratch::new("/tmp", "sign");
    let target = dir.path("s.txt");
    let plain = |url: String| agent.http.get(url).send();

    // Header token: right for writes and reads, wrong is refused.
    assert_eq!(
        agent.put(&target, b"signed".to_vec()).await.status(),
        StatusCode::OK
    );
    assert_eq!(agent.get(&target).await.status(), StatusCode::OK);
    let resp = agent
        .download(&target, &[("x-access-token", "wrong")])
        .await;
    assert_error(resp, StatusCode::UNAUTHORIZED, "does not match").await;

    // Neither header nor signature.
    let resp = plain(agent.files(&[("path", &target)])).await.expect("get");
    assert_error(resp, StatusCode::UNAUTHORIZED, "missing signature").await;

    // A valid read signature, with and without expiry and username.
    let sig = signature(&target, "read", "", None);
    let resp = plain(agent.files(&[("path", &target), ("signature", &sig)]))
        .await
        .expect("get");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.text().await.expect("body"), "signed");
    let exp = now() + 300;
    let sig = signature(&target, "read", "user", Some(exp));
    let exp_s = exp.to_string();
    let resp = plain(agent.files(&[
        ("path", &target),
        ("username", "user"),
        ("signature", &sig),
        ("signature_expiration", &exp_s),
    ]))
    .await
    .expect("get");
    assert_eq!(resp.status(), StatusCode::OK);

    // Tampered signature; a read signature used for a write.
    let resp = plain(agent.files(&[("path", &target), ("signature", "v1_bogus")]))
        .await
        .expect("get");
    assert_error(resp, StatusCode::UNAUTHORIZED, "invalid signature").await;
    let sig = signature(&target, "read", "", None);
    let resp = agent
        .upload(
            &[("path", &target), ("signature", &sig)],
            "application/octet-stream",
            "x",
        )
        .send()
        .await
        .expect("post");
    assert_error(resp, StatusCode::UNAUTHORIZED, "invalid signature").await;

    // A write signature uploads.
    let sig = signature(&target, "write", "", None);
    let resp = agent
        .upload(
            &[("path", &target), ("signature", &sig)],
            "application/octet-stream",
            "via url",
        )
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(std::fs::read(&target).expect("file"), b"via url");

    // Expired: the exact body the SDK tests assert.
    let exp = now() - 10;
    let sig = signature(&target, "read", "", Some(exp));
    let exp_s = exp.to_string();
    let resp = plain(agent.files(&[
        ("path", &target),
        ("signature", &sig),
        ("signature_expiration", &exp_s),
    ]))
    .await
    .expect("get");
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        resp.text().await.expect("body"),
        r#"{"code":401,"message":"signature is already expired"}"#
    );

    // /metrics sits behind the token.
    let resp = agent
        .http
        .get(agent.url("/metrics"))
        .send()
        .await
        .expect("metrics");
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn error_statuses() {
    let agent = Agent::start(None).await;
    let dir = Scratch::new("/tmp", "err");
    std::fs::create_dir_all(dir.path("adir")).expect("mkdir");

    let resp = agent
        .http
        .get(agent.files(&[("path", "/tmp/x"), ("username", "nosuchuser")]))
        .send()
        .await
        .expect("get");
    assert_error(
        resp,
        StatusCode::UNAUTHORIZED,
        "error looking up user 'nosuchuser'",
    )
    .await;

    let missing = dir.path("missing.txt");
    let resp = agent.get(&missing).await;
    assert_error(
        resp,
        StatusCode::NOT_FOUND,
        &format!("path '{missing}' does not exist"),
    )
    .await;

    let resp = agent.get(&dir.path("adir")).await;
    assert_error(resp, StatusCode::BAD_REQUEST, "is a directory").await;
    let resp = agent.put(&dir.path("adir"), b"x".to_vec()).await;
    assert_error(resp, StatusCode::BAD_REQUEST, "is a directory").await;
    // A parent that is a regular file.
    std::fs::write(dir.path("plain"), b"f").expect("write");
    let resp = agent.put(&dir.path("plain/child.txt"), b"x".to_vec()).await;
    assert_error(resp, StatusCode::BAD_REQUEST, "error ensuring directories").await;

    let resp = agent
        .upload(&[], "application/octet-stream", "x")
        .send()
        .await
        .expect("post");
    assert_error(
        resp,
        StatusCode::BAD_REQUEST,
        "path query parameter is required",
    )
    .await;

    let resp = agent
        .http
        .post(agent.files(&[("path", &dir.path("t.txt"))]))
        .header("content-type", "text/plain")
        .body("x")
        .send()
        .await
        .expect("post");
    assert_error(resp, StatusCode::BAD_REQUEST, "unsupported content type").await;

    let resp = agent
        .http
        .get(agent.files(&[("path", "/tmp"), ("signature_expiration", "soon")]))
        .send()
        .await
        .expect("get");
    assert_error(resp, StatusCode::BAD_REQUEST, "signature_expiration").await;
}

#[tokio::test]
async fn metrics_report_every_field() {
    let agent = Agent::start(Some(TOKEN)).await;
    let resp = agent
        .http
        .get(agent.url("/metrics"))
        .header("x-access-token", TOKEN)
        .send()
        .await
        .expect("metrics");
    assert_eq!(resp.status(), StatusCode::OK);
    let m = json_of(resp).await;
    for key in [
        "ts",
        "cpu_count",
        "mem_total",
        "mem_used",
        "mem_cache",
        "mem_total_mib",
        "mem_used_mib",
        "disk_used",
        "disk_total",
    ] {
        assert!(m[key].is_u64(), "{key} in {m}");
    }
    assert!(m["cpu_used_pct"].is_number(), "{m}");
    assert!(m["cpu_count"].as_u64() >= Some(1));
    assert!(m["mem_total"].as_u64() > Some(0));
    assert!(m["disk_total"].as_u64() > m["disk_used"].as_u64());
    assert!((m["ts"].as_i64().unwrap_or(0) - now()).abs() < 60);
}

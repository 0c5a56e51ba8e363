//! AWS credentials: the puller asks an ECR-shaped endpoint for an authorisation token
//! (SigV4-signed `GetAuthorizationToken`) and pulls from a real htpasswd registry with it.
//! ECR itself is not reachable from tests, so a loopback stand-in answers the token call the
//! way ECR documents; the registry side is the real `docker-registry`.

mod common;

use base64::Engine as _;
use common::*;
use warren_oci::{Credentials, PullError, PullOptions, Puller};

fn aws() -> Credentials {
    Credentials::Aws {
        access_key_id: "AKIDWARRENTEST".into(),
        secret_access_key: "not-a-real-secret".into(),
        region: "eu-west-3".into(),
    }
}

#[tokio::test]
async fn aws_keys_become_an_ecr_token_that_the_registry_takes() {
    if !have_registry(true) {
        return;
    }
    let reg = Registry::start_with(Some(("AWS", "ecr-issued-password")));
    reg.push("team/app", "1", &tiny_image("amd64", "ecr")).await;
    let token = base64::engine::general_purpose::STANDARD.encode("AWS:ecr-issued-password");
    let answer = format!(
        r#"{{"authorizationData":[{{"authorizationToken":"{token}","expiresAt":1.7E9,"proxyEndpoint":"https://{}"}}]}}"#,
        reg.host()
    );
    let (endpoint, requests) = http_endpoint("200 OK", answer, 1);
    let cache = tempfile::tempdir().unwrap();
    let mut opts = PullOptions::new(cache.path());
    opts.ca_files = reg.ca.iter().cloned().collect();
    opts.allow = vec![reg.host().parse().unwrap()];
    opts.ecr_endpoint = Some(endpoint);
    let puller = Puller::new(opts).unwrap();
    puller
        .pull(&format!("{}/team/app:1", reg.host()), &aws(), &|_| {})
        .await
        .unwrap();
    let request = requests.recv().unwrap();
    assert!(request.starts_with("post / http/1.1"), "{request}");
    assert!(
        request
            .contains("x-amz-target: amazonec2containerregistry_v20150921.getauthorizationtoken"),
        "{request}"
    );
    assert!(
        request.contains("authorization: aws4-hmac-sha256 credential=akidwarrentest/")
            && request.contains("/eu-west-3/ecr/aws4_request"),
        "a SigV4 signature for ecr in the region: {request}"
    );
    assert!(request.contains("x-amz-date: "), "{request}");
    assert!(
        !request.contains("not-a-real-secret"),
        "the secret is never sent"
    );
}

#[tokio::test]
async fn an_ecr_refusal_is_unauthorized_with_its_reason() {
    let (endpoint, _requests) = http_endpoint(
        "400 Bad Request",
        r#"{"__type":"UnrecognizedClientException","message":"The security token included in the request is invalid."}"#.into(),
        1,
    );
    let cache = tempfile::tempdir().unwrap();
    let mut opts = PullOptions::new(cache.path());
    opts.ecr_endpoint = Some(endpoint);
    let puller = Puller::new(opts).unwrap();
    let err = puller
        .pull(
            "123456789012.dkr.ecr.eu-west-3.amazonaws.com/app:1",
            &aws(),
            &|_| {},
        )
        .await
        .unwrap_err();
    assert!(matches!(err, PullError::Unauthorized { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("security token included in the request is invalid"),
        "{err}"
    );
}

//! AWS credentials for ECR: `GetAuthorizationToken`, SigV4-signed, gives a base64
//! `AWS:<password>` pair that the registry then takes as HTTP Basic.

use std::time::SystemTime;

use aws_credential_types::Credentials as AwsKeys;
use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use base64::Engine as _;
use serde::Deserialize;

use crate::PullError;

const TARGET: &str = "AmazonEC2ContainerRegistry_V20150921.GetAuthorizationToken";
const CONTENT_TYPE: &str = "application/x-amz-json-1.1";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Answer {
    #[serde(default)]
    authorization_data: Vec<AuthData>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AuthData {
    authorization_token: String,
}

/// Asks ECR (at `endpoint`, or the region's public endpoint) for a registry user name and
/// password.
pub(crate) async fn basic_auth(
    http: &reqwest_oci::Client,
    endpoint: Option<&str>,
    registry: &str,
    access_key_id: &str,
    secret_access_key: &str,
    region: &str,
) -> Result<(String, String), PullError> {
    if region.is_empty()
        || !region
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-')
    {
        return Err(PullError::Unauthorized {
            registry: registry.to_string(),
            detail: format!("the AWS region {region:?} is not a region name"),
        });
    }
    let url = match endpoint {
        Some(e) => e.to_string(),
        None => format!("https://api.ecr.{region}.amazonaws.com/"),
    };
    let ecr_host = url.clone();
    let body = b"{}";
    let identity: Identity =
        AwsKeys::new(access_key_id, secret_access_key, None, None, "warren").into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("ecr")
        .time(SystemTime::now())
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| PullError::Unauthorized {
            registry: registry.to_string(),
            detail: format!("the AWS request could not be signed: {e}"),
        })?
        .into();
    let headers = [("content-type", CONTENT_TYPE), ("x-amz-target", TARGET)];
    let signable = SignableRequest::new(
        "POST",
        &url,
        headers.iter().copied(),
        SignableBody::Bytes(body),
    )
    .and_then(|req| sign(req, &params))
    .map_err(|e| PullError::Unauthorized {
        registry: registry.to_string(),
        detail: format!("the AWS request could not be signed: {e}"),
    })?;
    let (instructions, _signature) = signable.into_parts();
    let mut req = http.post(&url).body(body.to_vec());
    for (name, value) in headers.iter().copied().chain(instructions.headers()) {
        req = req.header(name, value);
    }
    let unreachable = |e: reqwest_oci::Error| PullError::Unreachable {
        registry: ecr_host.clone(),
        source: Box::new(e),
    };
    let res = req.send().await.map_err(unreachable)?;
    let status = res.status();
    let text = res.text().await.map_err(unreachable)?;
    if status.as_u16() == 429 {
        return Err(PullError::RateLimited {
            registry: ecr_host,
            retry_after: None,
        });
    }
    if !status.is_success() {
        return Err(PullError::Unauthorized {
            registry: registry.to_string(),
            detail: format!(
                "ECR GetAuthorizationToken answered {status}: {}",
                text.trim()
            ),
        });
    }
    let bad = |why: &str| PullError::Unauthorized {
        registry: registry.to_string(),
        detail: format!("ECR's GetAuthorizationToken answer {why}"),
    };
    let answer: Answer = serde_json::from_str(&text).map_err(|_| bad("is not JSON"))?;
    let token = answer
        .authorization_data
        .into_iter()
        .next()
        .ok_or_else(|| bad("has no authorizationData"))?
        .authorization_token;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(token.trim())
        .map_err(|_| bad("has a token that is not base64"))?;
    let decoded = String::from_utf8(decoded).map_err(|_| bad("has a token that is not text"))?;
    let (user, password) = decoded
        .split_once(':')
        .ok_or_else(|| bad("has a token that is not user:password"))?;
    Ok((user.to_string(), password.to_string()))
}

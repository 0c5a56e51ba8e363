//! Talking to a new sandbox's agent: wait until it answers, then initialise it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde::Serialize;
use warren_runtime::RuntimeError;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Init<'a> {
    env_vars: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    access_token: Option<&'a str>,
    default_user: &'a str,
    timestamp: String,
}

/// Polls `GET /health` until the agent answers 204, then sends `POST /init`.
pub async fn wait_and_init(
    client: &reqwest::Client,
    agent: SocketAddr,
    env_vars: &BTreeMap<String, String>,
    access_token: Option<&str>,
    timeout: Duration,
) -> Result<(), RuntimeError> {
    let deadline = Instant::now() + timeout;
    let health = format!("http://{agent}/health");
    loop {
        match client
            .get(&health)
            .timeout(Duration::from_millis(500))
            .send()
            .await
        {
            Ok(r) if r.status().as_u16() == 204 => break,
            _ if Instant::now() > deadline => {
                return Err(RuntimeError::Failed(format!(
                    "agent at {agent} did not become ready"
                )))
            }
            _ => tokio::time::sleep(Duration::from_millis(2)).await,
        }
    }
    let body = Init {
        env_vars,
        access_token,
        default_user: "user",
        timestamp: chrono::Utc::now().to_rfc3339(),
    };
    let resp = client
        .post(format!("http://{agent}/init"))
        .json(&body)
        .send()
        .await
        .map_err(|e| RuntimeError::Failed(format!("init agent: {e}")))?;
    if resp.status().as_u16() != 204 {
        return Err(RuntimeError::Failed(format!(
            "init agent: HTTP {}",
            resp.status()
        )));
    }
    Ok(())
}

//! A small client of the server's REST API, and the typed agent client through its proxy.

use anyhow::{bail, Context};
use serde_json::Value;
use warren_proto::client::AgentClient;

use crate::{ClientArgs, KEY_FILE};

/// `s` as one URL path segment: everything but unreserved characters percent-encoded (ids and
/// names are checked by the server, but never trusted here).
pub fn path_segment(s: &str) -> String {
    encode(s, b"-_.~")
}

/// `s` as a query value that keeps its slashes readable (volume paths).
pub fn query_value(s: &str) -> String {
    encode(s, b"-_.~/")
}

fn encode(s: &str, keep: &[u8]) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || keep.contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    key: String,
}

impl Client {
    pub fn new(args: &ClientArgs) -> anyhow::Result<Client> {
        let key = match std::env::var("WARREN_API_KEY") {
            Ok(k) if !k.is_empty() => k,
            _ => {
                let path = args.data_dir.join(KEY_FILE);
                std::fs::read_to_string(&path)
                    .with_context(|| {
                        format!("no WARREN_API_KEY and no key file at {}", path.display())
                    })?
                    .trim()
                    .to_string()
            }
        };
        Ok(Client {
            http: reqwest::Client::new(),
            base: args.server.trim_end_matches('/').to_string(),
            key,
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn check(resp: reqwest::Response) -> anyhow::Result<reqwest::Response> {
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        let message = body["message"].as_str().unwrap_or("no details");
        bail!("server answered {status}: {message}")
    }

    pub async fn api(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<reqwest::Response> {
        let mut req = self
            .http
            .request(method, self.url(path))
            .header("X-API-KEY", &self.key);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("contacting {}", self.base))?;
        Self::check(resp).await
    }

    /// A request to the volume content API (`/volumecontent/...`) with a volume's token.
    pub async fn volume_content(
        &self,
        method: reqwest::Method,
        path_and_query: &str,
        token: &str,
        body: Option<reqwest::Body>,
    ) -> anyhow::Result<reqwest::Response> {
        let mut req = self
            .http
            .request(method, self.url(path_and_query))
            .bearer_auth(token);
        if let Some(b) = body {
            req = req
                .header("Content-Type", "application/octet-stream")
                .body(b);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("contacting {}", self.base))?;
        Self::check(resp).await
    }

    /// The agent of sandbox `id`, reached through the server's proxy with its access token.
    pub fn agent(&self, id: &str, token: &str) -> anyhow::Result<AgentClient> {
        Ok(AgentClient::new(self.http.clone(), self.base.clone())
            .with_header("E2b-Sandbox-Id", id)?
            .with_header("E2b-Sandbox-Port", &warren_types::AGENT_PORT.to_string())?
            .with_access_token(token)?)
    }
}

//! A small client of the server's REST API and sandbox proxy.

use anyhow::{bail, Context};
use serde_json::Value;

use crate::{ClientArgs, KEY_FILE};

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

    /// A request to a sandbox's agent through the server's proxy.
    pub fn sandbox(&self, id: &str, token: &str, path: &str) -> reqwest::RequestBuilder {
        self.http
            .post(self.url(path))
            .header("E2b-Sandbox-Id", id)
            .header("E2b-Sandbox-Port", "49983")
            .header("X-Access-Token", token)
    }

    /// A unary Connect call (JSON codec) to a sandbox's agent; the response message.
    pub async fn agent_unary(
        &self,
        id: &str,
        token: &str,
        procedure: &str,
        msg: &Value,
    ) -> anyhow::Result<Value> {
        let resp = self
            .sandbox(id, token, procedure)
            .header("content-type", "application/json")
            .header("connect-protocol-version", "1")
            .json(msg)
            .send()
            .await
            .context("contacting the sandbox")?;
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(body);
        }
        if body.get("code").is_some() {
            bail!("{}", crate::connect::error_text(&body))
        }
        bail!("sandbox answered {status}")
    }
}

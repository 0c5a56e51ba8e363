//! The egress options of `warren sandbox create` and `warren sandbox network <id>`.

use clap::Args;
use reqwest::Method;
use serde_json::{json, Value};

use crate::client::Client;
use crate::ClientArgs;

/// What a sandbox may connect to (E2B's `network.allowOut` / `denyOut`).
#[derive(Args, Debug, Default)]
pub struct EgressArgs {
    /// An address or CIDR the sandbox may reach even where --deny-out covers it (repeatable).
    #[arg(long = "allow-out", value_name = "CIDR")]
    pub allow_out: Vec<String>,
    /// An address or CIDR the sandbox may not reach; 0.0.0.0/0 denies all but --allow-out
    /// (repeatable).
    #[arg(long = "deny-out", value_name = "CIDR")]
    pub deny_out: Vec<String>,
    /// Deny all egress but --allow-out (allow_internet_access=false).
    #[arg(long)]
    pub no_internet: bool,
}

impl EgressArgs {
    /// Adds the options to a create body (nothing when none is given).
    pub fn add_to_create(&self, body: &mut Value) {
        if self.no_internet {
            body["allow_internet_access"] = false.into();
        }
        if !self.allow_out.is_empty() || !self.deny_out.is_empty() {
            body["network"] = json!({"allowOut": self.allow_out, "denyOut": self.deny_out});
        }
    }

    /// The body of `PUT /sandboxes/{id}/network`: the whole new policy.
    pub fn update_body(&self) -> Value {
        json!({
            "allowOut": self.allow_out,
            "denyOut": self.deny_out,
            "allow_internet_access": !self.no_internet,
        })
    }
}

/// `warren sandbox network <id> ...`: replaces the sandbox's egress policy (no option: open).
pub async fn update(
    client: &Client,
    args: &ClientArgs,
    id: &str,
    egress: &EgressArgs,
) -> anyhow::Result<()> {
    client
        .api(
            Method::PUT,
            &format!("/sandboxes/{id}/network"),
            Some(egress.update_body()),
        )
        .await?;
    if !args.json {
        println!("egress policy of {id} replaced");
    }
    Ok(())
}

/// `warren sandbox flows <id>`: the flow log, one decision per line (or the JSON list).
pub async fn flows(client: &Client, args: &ClientArgs, id: &str) -> anyhow::Result<()> {
    let v: Value = client
        .api(Method::GET, &format!("/sandboxes/{id}/network/flows"), None)
        .await?
        .json()
        .await?;
    let list = v["flows"].as_array().cloned().unwrap_or_default();
    if args.json {
        println!("{}", Value::Array(list));
        return Ok(());
    }
    for f in &list {
        println!("{}", flow_line(f));
    }
    Ok(())
}

/// `TIME KIND VERDICT WHAT [-> ADDRESSES] (VIA[: REASON])`.
fn flow_line(f: &Value) -> String {
    let s = |k: &str| f[k].as_str().unwrap_or_default().to_string();
    let what = match (f["name"].as_str(), f["destination"].as_str()) {
        (Some(n), Some(d)) => format!("{n} at {d}"),
        (Some(n), None) => n.to_string(),
        (None, Some(d)) => d.to_string(),
        (None, None) => "-".into(),
    };
    let mut line = format!("{} {:<3} {:<7} {what}", s("time"), s("kind"), s("verdict"));
    if let Some(a) = f["addresses"].as_array().filter(|a| !a.is_empty()) {
        let a: Vec<&str> = a.iter().filter_map(Value::as_str).collect();
        line.push_str(&format!(" -> {}", a.join(", ")));
    }
    let why = match f["reason"].as_str() {
        Some(r) => format!(" ({}: {r})", s("via")),
        None => format!(" ({})", s("via")),
    };
    line + &why
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_lines_say_what_was_decided() {
        let denied = json!({"time": "2026-12-02T21:00:00.000Z", "kind": "tcp", "verdict": "denied",
            "name": "evil.test", "destination": "192.0.2.7:443", "via": "tls-sni",
            "reason": "name not allowed"});
        assert_eq!(
            flow_line(&denied),
            "2026-12-02T21:00:00.000Z tcp denied  evil.test at 192.0.2.7:443 (tls-sni: name not allowed)"
        );
        let answered = json!({"time": "t", "kind": "dns", "verdict": "allowed",
            "name": "a.test", "addresses": ["192.0.2.1", "192.0.2.2"], "via": "dns"});
        assert_eq!(
            flow_line(&answered),
            "t dns allowed a.test -> 192.0.2.1, 192.0.2.2 (dns)"
        );
    }

    #[test]
    fn options_become_the_e2b_fields() {
        let mut body = json!({});
        EgressArgs::default().add_to_create(&mut body);
        assert_eq!(body, json!({}));
        let e = EgressArgs {
            allow_out: vec!["192.0.2.1".into()],
            deny_out: vec!["0.0.0.0/0".into()],
            no_internet: true,
        };
        e.add_to_create(&mut body);
        assert_eq!(
            body,
            json!({"allow_internet_access": false,
                   "network": {"allowOut": ["192.0.2.1"], "denyOut": ["0.0.0.0/0"]}})
        );
        assert_eq!(
            EgressArgs::default().update_body(),
            json!({"allowOut": [], "denyOut": [], "allow_internet_access": true})
        );
    }
}

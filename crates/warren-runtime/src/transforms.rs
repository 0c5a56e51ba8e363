//! `network.rules`: headers the egress proxy sets on a sandbox's requests to named hosts
//! (`{"api.example.com": [{"transform": {"headers": {"Authorization": "Bearer
//! ${e2b.secrets.KEY}"}}}]}`, `e2b-compat-wave2.md` §2.1), the way a sandbox uses a secret
//! without ever holding it.
//!
//! A rule grants no access: the policy's lists decide where a sandbox may connect, and a rule
//! only changes requests to a host the sandbox reaches anyway. Values may hold placeholders,
//! `${e2b.secrets.<name>}`, which the proxy replaces with the team's secret when each request
//! leaves ([`resolve`]); the stored rule keeps the placeholder. This module has no I/O.
//!
//! A rule's headers go over TLS only, unless it says `"scheme": "http"` (Warren's own,
//! optional field beside E2B's `transform`): then over plain HTTP too, in clear text.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::egress::Rule;

/// Most hosts one sandbox's rules may name (as E2B).
pub const MAX_HOSTS: usize = 10;
/// Most headers one host's transform may set.
pub const MAX_HEADERS: usize = 20;
pub const MAX_HOST_LEN: usize = 128;
pub const MAX_NAME_LEN: usize = 64;
pub const MAX_VALUE_LEN: usize = 2048;

const SECRET_PREFIX: &str = "e2b.secrets.";
const IDENTITY_PREFIX: &str = "e2b.identity.";

/// Headers a rule may not set: they frame the request or the connection, and the proxy must
/// find the next request where the client put it.
const FORBIDDEN: [&str; 9] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-connection",
];

/// `scheme` of a rule whose headers go over TLS only (the default).
pub const SCHEME_HTTPS: &str = "https";
/// `scheme` of a rule whose headers go over plain HTTP as well.
pub const SCHEME_HTTP: &str = "http";

/// What happens to requests to one host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transform: Option<Transform>,
    /// Where the headers may be sent: [`SCHEME_HTTPS`] (absent: the default), over TLS to a
    /// server that proved the name; [`SCHEME_HTTP`], over plain HTTP too, where anyone on the
    /// path reads them. Not in E2B's format, whose clients never send it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
}

impl HostRule {
    /// The headers this rule sets (none for a rule without a transform).
    pub fn headers(&self) -> &BTreeMap<String, String> {
        static NONE: BTreeMap<String, String> = BTreeMap::new();
        self.transform.as_ref().map_or(&NONE, |t| &t.headers)
    }

    /// Whether the headers may be set on plain HTTP requests (`"scheme": "http"`).
    pub fn plain_http(&self) -> bool {
        self.scheme.as_deref() == Some(SCHEME_HTTP)
    }
}

/// Headers set on every request (replacing any of the same name the client sent).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Transform {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

/// A sandbox's rules by host: an exact name or `*.suffix` (lower case, no trailing dot).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct HeaderRules(pub BTreeMap<String, Vec<HostRule>>);

/// Why rules are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransformError {
    #[error("network.rules names {0} hosts; at most {MAX_HOSTS} are allowed")]
    TooManyHosts(usize),
    #[error("network.rules key {0:?} is not a domain name or *.domain")]
    BadHost(String),
    #[error("network.rules[{0:?}] holds {1} rules; one is allowed per host")]
    TooManyRules(String, usize),
    #[error("network.rules[{0:?}] sets {1} headers; at most {MAX_HEADERS} are allowed")]
    TooManyHeaders(String, usize),
    #[error(
        "network.rules[{0:?}] scheme {1:?} is not known: \"https\" (the default) sets the \
         headers over TLS only, \"http\" over plain HTTP too"
    )]
    BadScheme(String, String),
    #[error("network.rules[{host:?}] header {name:?}: {why}")]
    BadHeader {
        host: String,
        name: String,
        why: String,
    },
}

impl HeaderRules {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Rules as a create or network update sends them, checked and with their hosts
    /// normalised (lower case, no trailing dot). Hosts with no headers to set are dropped.
    pub fn parse(raw: BTreeMap<String, Vec<HostRule>>) -> Result<Self, TransformError> {
        if raw.len() > MAX_HOSTS {
            return Err(TransformError::TooManyHosts(raw.len()));
        }
        let mut rules = BTreeMap::new();
        for (host, list) in raw {
            let key = normal_host(&host).ok_or_else(|| TransformError::BadHost(host.clone()))?;
            if list.len() > 1 {
                return Err(TransformError::TooManyRules(host, list.len()));
            }
            let rule = list.into_iter().next().unwrap_or_default();
            let scheme = match rule.scheme.as_deref() {
                None => None,
                Some(s) if s.eq_ignore_ascii_case(SCHEME_HTTPS) => Some(SCHEME_HTTPS.to_owned()),
                Some(s) if s.eq_ignore_ascii_case(SCHEME_HTTP) => Some(SCHEME_HTTP.to_owned()),
                Some(other) => return Err(TransformError::BadScheme(host, other.to_owned())),
            };
            let headers = rule.transform.map(|t| t.headers).unwrap_or_default();
            if headers.len() > MAX_HEADERS {
                return Err(TransformError::TooManyHeaders(host, headers.len()));
            }
            for (name, value) in &headers {
                check_header(name, value).map_err(|why| TransformError::BadHeader {
                    host: host.clone(),
                    name: name.clone(),
                    why,
                })?;
            }
            if headers.is_empty() {
                continue;
            }
            if rules.contains_key(&key) {
                return Err(TransformError::TooManyRules(host, 2));
            }
            rules.insert(
                key,
                vec![HostRule {
                    transform: Some(Transform { headers }),
                    scheme,
                }],
            );
        }
        Ok(Self(rules))
    }

    /// The rule for requests to `name` (lower case, no trailing dot): its own, else the one
    /// of the longest `*.suffix` it is under.
    pub fn for_name(&self, name: &str) -> Option<&HostRule> {
        if let Some(r) = self.0.get(name) {
            return r.first();
        }
        self.0
            .iter()
            .filter(|(k, _)| {
                k.strip_prefix("*.")
                    .is_some_and(|base| Rule::Below(base.to_owned()).matches_name(name))
            })
            .max_by_key(|(k, _)| k.len())
            .and_then(|(_, r)| r.first())
    }
}

impl HeaderRules {
    /// Every secret name the rules' values refer to.
    pub fn secret_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .0
            .values()
            .flatten()
            .filter_map(|r| r.transform.as_ref())
            .flat_map(|t| t.headers.values())
            .flat_map(|v| placeholders(v).into_iter().map(|(_, n)| n.to_owned()))
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

fn normal_host(host: &str) -> Option<String> {
    if host.len() > MAX_HOST_LEN {
        return None;
    }
    match Rule::parse(host).ok()? {
        Rule::Name(n) => Some(n),
        Rule::Below(base) => Some(format!("*.{base}")),
        Rule::Net(_) | Rule::AnyName => None,
    }
}

fn check_header(name: &str, value: &str) -> Result<(), String> {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || name.len() > MAX_NAME_LEN || !name.bytes().all(token) {
        return Err(format!(
            "a header name is 1-{MAX_NAME_LEN} characters of an HTTP token"
        ));
    }
    if FORBIDDEN.contains(&name.to_ascii_lowercase().as_str()) {
        return Err("frames the request or the connection and cannot be set".into());
    }
    if value.len() > MAX_VALUE_LEN {
        return Err(format!("the value is longer than {MAX_VALUE_LEN} bytes"));
    }
    if value.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err("the value holds a control character".into());
    }
    let mut rest = value;
    while let Some(at) = rest.find("${") {
        rest = &rest[at + 2..];
        let Some(close) = rest.find('}') else {
            if rest.starts_with("e2b.") {
                return Err("a ${e2b....} placeholder is not closed".into());
            }
            break;
        };
        let inner = &rest[..close];
        if inner.starts_with(IDENTITY_PREFIX) {
            return Err(format!(
                "${{{inner}}}: workload identity tokens are not supported by this server"
            ));
        }
        match inner.strip_prefix(SECRET_PREFIX) {
            Some(secret) if !valid_secret_name(secret) => {
                return Err(format!("${{{inner}}} does not name a secret"));
            }
            None if inner.starts_with("e2b.") => {
                return Err(format!("${{{inner}}} is not a known placeholder"));
            }
            _ => {}
        }
        rest = &rest[close + 1..];
    }
    Ok(())
}

/// A secret name as the secrets API takes it (before lower-casing).
fn valid_secret_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The `${e2b.secrets.NAME}` placeholders in `value`: (the whole placeholder, the name).
fn placeholders(value: &str) -> Vec<(&str, &str)> {
    let mut out = Vec::new();
    let mut rest = value;
    let mut offset = 0;
    while let Some(start) = rest.find("${") {
        let Some(len) = rest[start..].find('}') else {
            break;
        };
        let whole = &value[offset + start..offset + start + len + 1];
        if let Some(name) = whole[2..whole.len() - 1].strip_prefix(SECRET_PREFIX) {
            out.push((whole, name));
        }
        offset += start + len + 1;
        rest = &value[offset..];
    }
    out
}

/// The secret names (lower case) of the placeholders in one header value.
pub fn secret_names_in(value: &str) -> Vec<String> {
    placeholders(value)
        .into_iter()
        .map(|(_, n)| n.to_ascii_lowercase())
        .collect()
}

/// A placeholder's secret could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MissingSecret {
    #[error("secret {0:?} is not available")]
    Gone(String),
    /// Its value would end the header (CR, LF or another control character).
    #[error("secret {0:?} cannot be sent in a header: it holds a control character")]
    Unsendable(String),
}

/// `value` with every `${e2b.secrets.NAME}` replaced by `lookup(name)` (the name lower-cased,
/// as the secrets API keeps them). Other text is kept as it is.
pub fn resolve<F>(value: &str, mut lookup: F) -> Result<String, MissingSecret>
where
    F: FnMut(&str) -> Option<String>,
{
    let found = placeholders(value);
    if found.is_empty() {
        return Ok(value.to_owned());
    }
    let mut out = String::with_capacity(value.len() + 64);
    let mut rest = value;
    for (whole, name) in found {
        let at = rest.find(whole).unwrap_or(rest.len());
        out.push_str(&rest[..at]);
        let name = name.to_ascii_lowercase();
        match lookup(&name) {
            Some(v) if v.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) => {
                return Err(MissingSecret::Unsendable(name))
            }
            Some(v) => out.push_str(&v),
            None => return Err(MissingSecret::Gone(name)),
        }
        rest = &rest[(at + whole.len()).min(rest.len())..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(json: &str) -> Result<HeaderRules, TransformError> {
        HeaderRules::parse(serde_json::from_str(json).unwrap())
    }

    #[test]
    fn rules_are_checked_and_normalised() {
        let r = rules(
            r#"{"API.Example.com.": [{"transform": {"headers": {"Authorization": "Bearer ${e2b.secrets.Key_1}"}}}],
                "*.models.test": [{"transform": {"headers": {"X-Key": "k"}}, "scheme": "HTTP"}],
                "empty.test": [{}]}"#,
        )
        .unwrap();
        assert_eq!(
            r.0.keys().collect::<Vec<_>>(),
            vec!["*.models.test", "api.example.com"]
        );
        assert_eq!(r.secret_names(), vec!["Key_1".to_string()]);
        let h = r.for_name("api.example.com").unwrap();
        assert_eq!(h.headers()["Authorization"], "Bearer ${e2b.secrets.Key_1}");
        // TLS only unless the rule asks for plain HTTP too.
        assert!(!h.plain_http());
        assert!(r.for_name("eu.models.test").unwrap().plain_http());
        assert_eq!(r.0["*.models.test"][0].scheme.as_deref(), Some("http"));
        assert!(r.for_name("models.test").is_none());
        assert!(r.for_name("example.com").is_none());
        // Round trip: what is stored is what a detail shows.
        let back: HeaderRules = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn bad_rules_say_why() {
        let many: BTreeMap<String, Vec<HostRule>> = (0..11)
            .map(|i| (format!("h{i}.test"), vec![HostRule::default()]))
            .collect();
        assert_eq!(
            HeaderRules::parse(many),
            Err(TransformError::TooManyHosts(11))
        );
        for bad in ["10.0.0.1", "*", "bad host", "0.0.0.0/0"] {
            let json = format!(r#"{{"{bad}": [{{"transform": {{"headers": {{"a": "b"}}}}}}]}}"#);
            assert!(
                matches!(rules(&json), Err(TransformError::BadHost(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            rules(r#"{"a.test": [{}, {}]}"#),
            Err(TransformError::TooManyRules(..))
        ));
        for scheme in ["ftp", "", "tls", "http "] {
            let json = serde_json::json!({"a.test": [{"transform": {"headers": {"a": "b"}},
                "scheme": scheme}]});
            let got = HeaderRules::parse(serde_json::from_value(json).unwrap());
            assert_eq!(
                got,
                Err(TransformError::BadScheme("a.test".into(), scheme.into())),
                "{scheme:?}"
            );
        }
        let https =
            rules(r#"{"a.test": [{"transform": {"headers": {"a": "b"}}, "scheme": "https"}]}"#)
                .unwrap();
        assert!(!https.for_name("a.test").unwrap().plain_http());
        for (name, value) in [
            ("Host", "evil.test"),
            ("Content-Length", "0"),
            ("Bad Name", "v"),
            ("X", "a\r\nInjected: yes"),
            ("X", "${e2b.identity.tokens.gh}"),
            ("X", "${e2b.secrets.no spaces}"),
            ("X", "${e2b.nothing}"),
            ("X", "${e2b.secrets.open"),
        ] {
            let json = serde_json::json!({"a.test": [{"transform": {"headers": {name: value}}}]});
            assert!(
                matches!(
                    HeaderRules::parse(serde_json::from_value(json).unwrap()),
                    Err(TransformError::BadHeader { .. })
                ),
                "{name}: {value}"
            );
        }
    }

    #[test]
    fn placeholders_resolve_per_lookup() {
        let v = "Bearer ${e2b.secrets.Key} and ${e2b.secrets.other}; ${HOME}";
        let got = resolve(v, |n| Some(format!("<{n}>"))).unwrap();
        assert_eq!(got, "Bearer <key> and <other>; ${HOME}");
        assert_eq!(
            resolve(v, |n| (n == "key").then(|| "k".into())),
            Err(MissingSecret::Gone("other".into()))
        );
        assert_eq!(
            resolve(v, |_| Some("a\r\nX-Injected: 1".into())),
            Err(MissingSecret::Unsendable("key".into()))
        );
        assert_eq!(resolve("plain", |_| None).unwrap(), "plain");
    }
}

//! Who may reach a sandbox port through the proxy (`e2b-compat-wave2.md` §2.3).
//!
//! - The agent's port (49983) checks `X-Access-Token` itself (signed `/files` URLs and
//!   `/health` need none), so the proxy lets its requests through.
//! - Service ports (the code interpreter's 49999) run code for whoever reaches them: they need
//!   the envd access token (`X-Access-Token`) or the traffic token
//!   (`e2b-traffic-access-token`); the SDKs send both.
//! - Other ports are the sandbox's own services: public, as on E2B, unless the sandbox was
//!   created with `network.allowPublicTraffic = false`, then they need the traffic token.
//! - A browser's cross-site request (DNS rebinding, a page posting to another sandbox) is
//!   refused on every port of a sandbox that is not public, and on service ports always,
//!   unless it carries a token: a page cannot add one without a CORS preflight the sandbox
//!   would have to answer, and it does not know the token.
//!
//! Tokens are compared in constant time.

use axum::http::{header, HeaderMap};
use subtle::ConstantTimeEq;
use warren_control::Access;

use crate::proxy::AGENT_PORT;

pub(crate) const TRAFFIC_TOKEN: &str = "e2b-traffic-access-token";
pub(crate) const ACCESS_TOKEN: &str = "x-access-token";

/// Why a request was refused; the message is the 403 body's.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Denied {
    TrafficTokenMissing,
    TrafficTokenInvalid,
    ServiceTokenMissing(u16),
    CrossSite,
}

impl Denied {
    pub(crate) fn message(&self) -> String {
        match self {
            // Upstream's wording, which SDK users search for.
            Denied::TrafficTokenMissing => format!(
                "Sandbox is secured with traffic access token. Token header '{TRAFFIC_TOKEN}' is missing"
            ),
            Denied::TrafficTokenInvalid => format!(
                "Sandbox is secured with traffic access token. Provided token in header '{TRAFFIC_TOKEN}' is invalid"
            ),
            Denied::ServiceTokenMissing(port) => format!(
                "Sandbox port {port} is a service port: send the sandbox's access token \
                 ('{ACCESS_TOKEN}') or its traffic access token ('{TRAFFIC_TOKEN}')"
            ),
            Denied::CrossSite => {
                "Cross-site requests to this sandbox port are refused".to_string()
            }
        }
    }
}

fn token_matches(headers: &HeaderMap, name: &str, expected: &str) -> Option<bool> {
    let given = headers.get(name)?;
    // An empty expected token never matches (records from before tokens existed).
    Some(!expected.is_empty() && bool::from(given.as_bytes().ct_eq(expected.as_bytes())))
}

/// Whether the request comes from a page of another site (browsers send `Origin` on
/// cross-origin requests and `Sec-Fetch-Site` on all of them).
fn cross_site(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        if site.eq_ignore_ascii_case("cross-site") || site.eq_ignore_ascii_case("same-site") {
            // Sibling `{port}-{id}` hosts share a site: treat them as strangers too.
            return true;
        }
        if site.eq_ignore_ascii_case("same-origin") || site.eq_ignore_ascii_case("none") {
            return false;
        }
    }
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let origin_host = origin
        .split_once("://")
        .map_or(origin, |(_, rest)| rest)
        .trim_end_matches('/');
    // `null` (sandboxed frames, file: pages) and any other host are foreign.
    !origin_host.eq_ignore_ascii_case(host)
}

/// Whether a request may go to `port` of a sandbox with these rules.
pub(crate) fn authorize(access: &Access, port: u16, headers: &HeaderMap) -> Result<(), Denied> {
    if port == AGENT_PORT {
        return Ok(());
    }
    let traffic = token_matches(headers, TRAFFIC_TOKEN, &access.traffic_access_token);
    if traffic == Some(true) {
        return Ok(());
    }
    if access.service_ports.contains(&port) {
        if token_matches(headers, ACCESS_TOKEN, &access.envd_access_token) == Some(true) {
            return Ok(());
        }
        return Err(match traffic {
            Some(false) => Denied::TrafficTokenInvalid,
            _ => Denied::ServiceTokenMissing(port),
        });
    }
    if !access.allow_public_traffic {
        return Err(match traffic {
            None => Denied::TrafficTokenMissing,
            _ => Denied::TrafficTokenInvalid,
        });
    }
    Ok(())
}

/// The browser check, for requests [`authorize`] let through: a cross-site request without a
/// valid token (or, on the agent's port, a signed URL the agent verifies) reaches only the user
/// ports of a public sandbox.
pub(crate) fn check_site(
    access: &Access,
    port: u16,
    headers: &HeaderMap,
    query: &str,
) -> Result<(), Denied> {
    if !cross_site(headers) {
        return Ok(());
    }
    let has_token = token_matches(headers, TRAFFIC_TOKEN, &access.traffic_access_token)
        == Some(true)
        || token_matches(headers, ACCESS_TOKEN, &access.envd_access_token) == Some(true)
        || (port == AGENT_PORT && form_has(query, "signature"));
    let open_port =
        access.allow_public_traffic && port != AGENT_PORT && !access.service_ports.contains(&port);
    if has_token || open_port {
        Ok(())
    } else {
        Err(Denied::CrossSite)
    }
}

/// Whether a request to a paused sandbox may wake it: the check it would pass once running;
/// for the agent's port, a request carrying the access token or a signed URL.
pub(crate) fn may_wake(access: &Access, port: u16, headers: &HeaderMap, query: &str) -> bool {
    if port == AGENT_PORT {
        return token_matches(headers, ACCESS_TOKEN, &access.envd_access_token) == Some(true)
            || form_has(query, "signature");
    }
    authorize(access, port, headers).is_ok() && check_site(access, port, headers, query).is_ok()
}

fn form_has(query: &str, key: &str) -> bool {
    query
        .split('&')
        .any(|kv| kv.split('=').next().is_some_and(|k| k == key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn access(public: bool) -> Access {
        Access {
            envd_access_token: "ea_secret".into(),
            traffic_access_token: "ta_secret".into(),
            allow_public_traffic: public,
            service_ports: vec![49999].into(),
            mask_request_host: None,
        }
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn service_port_needs_a_token() {
        let a = access(true);
        assert_eq!(
            authorize(&a, 49999, &headers(&[])),
            Err(Denied::ServiceTokenMissing(49999))
        );
        assert_eq!(
            authorize(&a, 49999, &headers(&[(ACCESS_TOKEN, "ea_wrong")])),
            Err(Denied::ServiceTokenMissing(49999))
        );
        assert_eq!(
            authorize(&a, 49999, &headers(&[(TRAFFIC_TOKEN, "ta_wrong")])),
            Err(Denied::TrafficTokenInvalid)
        );
        assert!(authorize(&a, 49999, &headers(&[(ACCESS_TOKEN, "ea_secret")])).is_ok());
        assert!(authorize(&a, 49999, &headers(&[(TRAFFIC_TOKEN, "ta_secret")])).is_ok());
        // A valid traffic token next to a wrong access token is enough (contexts requests).
        assert!(authorize(
            &a,
            49999,
            &headers(&[(TRAFFIC_TOKEN, "ta_secret"), (ACCESS_TOKEN, "x")])
        )
        .is_ok());
    }

    #[test]
    fn user_ports_follow_allow_public_traffic() {
        assert!(authorize(&access(true), 8000, &headers(&[])).is_ok());
        let private = access(false);
        assert_eq!(
            authorize(&private, 8000, &headers(&[])),
            Err(Denied::TrafficTokenMissing)
        );
        assert_eq!(
            authorize(&private, 8000, &headers(&[(TRAFFIC_TOKEN, "ta_secre")])),
            Err(Denied::TrafficTokenInvalid)
        );
        // The envd token is not a traffic token.
        assert_eq!(
            authorize(&private, 8000, &headers(&[(ACCESS_TOKEN, "ea_secret")])),
            Err(Denied::TrafficTokenMissing)
        );
        assert!(authorize(&private, 8000, &headers(&[(TRAFFIC_TOKEN, "ta_secret")])).is_ok());
        // The agent checks its own token.
        assert!(authorize(&private, AGENT_PORT, &headers(&[])).is_ok());
    }

    #[test]
    fn empty_tokens_never_match() {
        let mut a = access(false);
        a.traffic_access_token.clear();
        assert!(authorize(&a, 8000, &headers(&[(TRAFFIC_TOKEN, "")])).is_err());
    }

    #[test]
    fn cross_site_requests() {
        let evil = headers(&[
            ("origin", "http://evil.test"),
            ("host", "8000-abc.warren.test"),
        ]);
        assert!(check_site(&access(true), 8000, &evil, "").is_ok());
        assert_eq!(
            check_site(&access(false), 8000, &evil, ""),
            Err(Denied::CrossSite)
        );
        assert_eq!(
            check_site(&access(true), 49999, &evil, ""),
            Err(Denied::CrossSite)
        );
        assert_eq!(
            check_site(&access(true), AGENT_PORT, &evil, ""),
            Err(Denied::CrossSite)
        );
        assert!(check_site(&access(true), AGENT_PORT, &evil, "signature=v1_x").is_ok());
        let mut with_token = evil.clone();
        with_token.insert(ACCESS_TOKEN, HeaderValue::from_static("ea_secret"));
        assert!(check_site(&access(false), AGENT_PORT, &with_token, "").is_ok());
        let same = headers(&[
            ("origin", "http://8000-abc.warren.test"),
            ("host", "8000-abc.warren.test"),
        ]);
        assert!(check_site(&access(false), 8000, &same, "").is_ok());
        let sibling = headers(&[
            ("sec-fetch-site", "same-site"),
            ("host", "8000-abc.warren.test"),
        ]);
        assert_eq!(
            check_site(&access(false), 8000, &sibling, ""),
            Err(Denied::CrossSite)
        );
        let null = headers(&[("origin", "null"), ("host", "localhost:3000")]);
        assert_eq!(
            check_site(&access(false), 8000, &null, ""),
            Err(Denied::CrossSite)
        );
        // SDKs outside browsers send neither header.
        assert!(check_site(&access(false), 49999, &headers(&[]), "").is_ok());
    }

    #[test]
    fn waking_needs_what_running_needs() {
        let a = access(true);
        assert!(!may_wake(&a, AGENT_PORT, &headers(&[]), ""));
        assert!(may_wake(
            &a,
            AGENT_PORT,
            &headers(&[(ACCESS_TOKEN, "ea_secret")]),
            ""
        ));
        assert!(may_wake(
            &a,
            AGENT_PORT,
            &headers(&[]),
            "path=/x&signature=v1_abc"
        ));
        assert!(may_wake(&a, 8000, &headers(&[]), ""));
        assert!(!may_wake(&access(false), 8000, &headers(&[]), ""));
        assert!(!may_wake(&a, 49999, &headers(&[]), ""));
    }
}

//! The proxy's routing: which sandbox and port (or the API) a request goes to, from its Host,
//! `E2b-Sandbox-Id` / `E2b-Sandbox-Port` headers and URI, with and without `--domain`.
//! Whatever the bytes, routing answers (never panics), and a routed id is one the proxy
//! accepts as a sandbox id.
#![no_main]

use axum::http::{HeaderMap, HeaderValue, Uri};
use libfuzzer_sys::fuzz_target;
use warren_server::proxy::Proxy;

fuzz_target!(|data: &[u8]| {
    // Fields separated by 0xff: Host, sandbox id, sandbox port, path-and-query.
    let mut parts = data.split(|b| *b == 0xff);
    let mut headers = HeaderMap::new();
    for name in ["host", "e2b-sandbox-id", "e2b-sandbox-port"] {
        if let Some(v) = parts.next().filter(|v| !v.is_empty()) {
            if let Ok(v) = HeaderValue::from_bytes(v) {
                headers.insert(name, v);
            }
        }
    }
    let uri = parts
        .next()
        .and_then(|p| Uri::try_from(p).ok())
        .unwrap_or_else(|| Uri::from_static("/"));
    for domain in [None, Some("warren.test".to_string())] {
        let proxy = Proxy::new(domain);
        if let Ok(Some((id, _port))) = proxy.route_target(&headers, &uri) {
            assert!(!id.is_empty() && id.len() <= 63);
            assert!(id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
        }
    }
});

//! `GET /files` through the agent's real handler on a fixed file: the request headers
//! (Range, If-Range, If-(Un)Modified-Since, If-None-Match, Accept-Encoding) come from the
//! input, and the whole response body is read.
#![no_main]

use std::sync::OnceLock;

use axum::extract::{Query, State};
use libfuzzer_sys::fuzz_target;
use warren_agent::http::files::{download, FilesQuery};
use warren_fuzz::{agent_state, request, runtime, scratch};

fn served() -> &'static str {
    static PATH: OnceLock<String> = OnceLock::new();
    PATH.get_or_init(|| {
        let path = scratch().join("served");
        let content: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, content).expect("write the served file");
        path.display().to_string()
    })
}

fuzz_target!(|data: &[u8]| {
    let (headers, _) = request(data);
    let query = FilesQuery {
        path: Some(served().to_string()),
        username: Some("root".into()),
        signature: None,
        signature_expiration: None,
    };
    runtime().block_on(async {
        let resp = download(State(agent_state()), Ok(Query(query)), headers).await;
        let _ = axum::body::to_bytes(resp.into_body(), 1 << 20).await;
    });
});

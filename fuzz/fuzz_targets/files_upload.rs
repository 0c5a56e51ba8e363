//! `POST /files` through the agent's real handler: headers (Content-Type with the multipart
//! boundary, Content-Encoding, X-Metadata-*) and body come from the input. The query names a
//! fixed path, which wins over part file names, so whatever the input, the handler writes
//! only to one scratch file.
#![no_main]

use axum::body::Body;
use axum::extract::{Query, State};
use libfuzzer_sys::fuzz_target;
use warren_agent::http::files::{upload, FilesQuery};
use warren_fuzz::{agent_state, request, runtime, scratch};

fuzz_target!(|data: &[u8]| {
    let (headers, body) = request(data);
    let query = FilesQuery {
        path: Some(scratch().join("up/target").display().to_string()),
        username: Some("root".into()),
        signature: None,
        signature_expiration: None,
    };
    let body = Body::from(body.to_vec());
    runtime().block_on(async {
        let resp = upload(State(agent_state()), Ok(Query(query)), headers, body).await;
        let _ = axum::body::to_bytes(resp.into_body(), 1 << 20).await;
    });
});

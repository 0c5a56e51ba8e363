//! Shared pieces of the fuzz targets.

use std::path::PathBuf;
use std::sync::OnceLock;

use axum::http::{HeaderMap, HeaderName, HeaderValue};

/// One runtime for every iteration: building one per input would dominate the run time.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime")
    })
}

/// A directory of this process under /tmp for the files the targets read and write.
pub fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("warren-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        dir
    })
}

/// Splits an input into request headers and body: `name: value` lines up to the first empty
/// line, then the body. Lines that are no valid header are skipped, so any input is usable.
pub fn request(data: &[u8]) -> (HeaderMap, &[u8]) {
    let (head, body) = match data.windows(2).position(|w| w == b"\n\n") {
        Some(i) => (&data[..i], &data[i + 2..]),
        None => (data, &[][..]),
    };
    let mut headers = HeaderMap::new();
    for line in head.split(|b| *b == b'\n') {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (name, value) = (line[..colon].trim_ascii(), line[colon + 1..].trim_ascii());
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
            headers.append(n, v);
        }
    }
    (headers, body)
}

/// Agent state acting for root, without an access token.
pub fn agent_state() -> warren_agent::state::AppState {
    warren_agent::state::AppState::new(
        warren_agent::state::Settings {
            access_token: None,
            default_user: "root".into(),
            default_workdir: None,
            env_vars: Default::default(),
            ..Default::default()
        },
        false,
    )
}

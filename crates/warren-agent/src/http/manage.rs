//! Health, initialisation and environment endpoints.

use std::collections::BTreeMap;
use std::path::PathBuf;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use crate::auth::http_error;
use crate::state::AppState;
use crate::users::UserDb;

/// `GET /health`: 204, never cached.
pub async fn health() -> Response {
    let mut resp = StatusCode::NO_CONTENT.into_response();
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// Body of `POST /init`; every field optional, unknown ones ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct InitRequest {
    pub env_vars: Option<BTreeMap<String, String>>,
    pub access_token: Option<String>,
    /// Wall clock of the host (RFC 3339), applied only when the agent may sync the clock.
    pub timestamp: Option<String>,
    pub default_user: Option<String>,
    pub default_workdir: Option<String>,
    /// Random bytes (hex) from the host, mixed into the kernel's random pool, which is then
    /// reseeded: sandboxes restored from one snapshot must not share their random state.
    pub random_seed: Option<String>,
    /// Longest lifetime, in seconds from the time of a request, of a signed file URL; a URL
    /// without `signature_expiration` is then refused. `0` removes the limit; absent (or
    /// `null`) leaves the current setting. Kept as raw JSON so a bad value gets its own 400.
    pub signed_url_max_age_secs: Option<serde_json::Value>,
    /// Certificates (PEM) the sandbox's TLS clients are to trust (see [`crate::trust`]).
    pub ca_bundle: Option<String>,
    /// Volumes to mount over NFS (E2B's `volumeMounts`; see [`crate::mounts`]).
    pub volume_mounts: Option<Vec<crate::mounts::VolumeMount>>,
}

/// `POST /init`: per-sandbox settings from the control plane. 204 with `X-Envd-Version`.
pub async fn init(State(state): State<AppState>, body: axum::body::Bytes) -> Response {
    let req: InitRequest = if body.is_empty() {
        InitRequest::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => {
                return http_error(StatusCode::BAD_REQUEST, format!("malformed init body: {e}"))
            }
        }
    };
    if let Some(user) = req.default_user.as_deref().filter(|u| !u.is_empty()) {
        if UserDb::load().by_name(user).is_none() {
            return http_error(
                StatusCode::BAD_REQUEST,
                format!("invalid default user '{user}'"),
            );
        }
    }
    // Validated before anything is applied, so a refused body changes nothing.
    let max_age = match req.signed_url_max_age_secs.as_ref().map(signed_url_max_age) {
        None => None,
        Some(Ok(v)) => Some(v),
        Some(Err(msg)) => return http_error(StatusCode::BAD_REQUEST, msg),
    };
    if let Some(pem) = req.ca_bundle.as_deref() {
        if !crate::trust::valid(pem) {
            return http_error(StatusCode::BAD_REQUEST, "caBundle must be PEM certificates");
        }
    }
    let mounts = match req
        .volume_mounts
        .iter()
        .flatten()
        .map(crate::mounts::plan)
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(m) => m,
        Err(msg) => return http_error(StatusCode::BAD_REQUEST, format!("volumeMounts: {msg}")),
    };
    if !mounts.is_empty() {
        // Before anything else is applied: a sandbox whose volumes did not mount is not
        // initialised (the control plane fails its create).
        let done = tokio::task::spawn_blocking(move || crate::mounts::apply(&mounts)).await;
        match done {
            Ok(Ok(())) => {}
            Ok(Err(msg)) => return http_error(StatusCode::INTERNAL_SERVER_ERROR, msg),
            Err(e) => {
                return http_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("mounting volumes: {e}"),
                )
            }
        }
    }
    // The image's trust store is the sandbox's own: a failure to write it leaves the
    // sandbox usable (only brokered hosts would then fail their TLS checks), so it is logged.
    let trust_vars = match req.ca_bundle.as_deref() {
        Some(pem) => match crate::trust::install(std::path::Path::new("/"), pem) {
            Ok(vars) => vars,
            Err(e) => {
                tracing::warn!(error = %e, "could not install the CA bundle");
                BTreeMap::new()
            }
        },
        None => BTreeMap::new(),
    };
    if let Some(seed) = req.random_seed.as_deref() {
        match decode_hex(seed) {
            Some(bytes) => {
                if let Err(e) = crate::sys::reseed_random(&bytes) {
                    // Expected where the agent lacks CAP_SYS_ADMIN (a namespace sandbox,
                    // whose kernel is the host's anyway).
                    tracing::debug!(error = %e, "could not reseed the kernel's random pool");
                }
            }
            None => return http_error(StatusCode::BAD_REQUEST, "randomSeed must be hex"),
        }
    }
    if let (true, Some(ts)) = (state.sync_clock, req.timestamp.as_deref()) {
        match chrono::DateTime::parse_from_rfc3339(ts) {
            Ok(t) => {
                if let Err(e) =
                    crate::sys::set_wall_clock(t.timestamp(), t.timestamp_subsec_nanos())
                {
                    tracing::warn!(error = %e, "could not set the clock");
                }
            }
            Err(e) => return http_error(StatusCode::BAD_REQUEST, format!("bad timestamp: {e}")),
        }
    }
    {
        let mut s = state.settings.write().unwrap_or_else(|e| e.into_inner());
        if let Some(vars) = req.env_vars {
            s.env_vars.extend(vars);
        }
        for (k, v) in trust_vars {
            s.env_vars.entry(k).or_insert(v);
        }
        if let Some(token) = req.access_token {
            s.access_token = (!token.is_empty()).then_some(token);
        }
        if let Some(user) = req.default_user.filter(|u| !u.is_empty()) {
            s.default_user = user;
        }
        if let Some(dir) = req.default_workdir {
            s.default_workdir = (!dir.is_empty()).then(|| PathBuf::from(dir));
        }
        if let Some(max_age) = max_age {
            s.signed_url_max_age_secs = max_age;
        }
    }
    tracing::info!("initialised by the control plane");
    state.journal.record(
        warren_proto::journal::AGENT,
        warren_proto::journal::Level::Info,
        format!(
            "initialised by the control plane (envd {})",
            crate::ENVD_VERSION
        ),
        BTreeMap::new(),
    );
    let mut resp = StatusCode::NO_CONTENT.into_response();
    resp.headers_mut().insert(
        "x-envd-version",
        HeaderValue::from_static(crate::ENVD_VERSION),
    );
    resp
}

/// `signedUrlMaxAgeSecs` as the limit to store: a whole, non-negative number of seconds,
/// where `0` means no limit.
fn signed_url_max_age(v: &serde_json::Value) -> Result<Option<u64>, String> {
    match v.as_u64() {
        Some(0) => Ok(None),
        Some(secs) => Ok(Some(secs)),
        None => Err(format!(
            "signedUrlMaxAgeSecs must be a whole number of seconds, 0 for no limit (got {v})"
        )),
    }
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.len() > 512 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// `GET /envs`: the sandbox-wide environment variables.
pub async fn envs(State(state): State<AppState>) -> Json<BTreeMap<String, String>> {
    Json(state.settings().env_vars)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn signed_url_max_age_values() {
        assert_eq!(signed_url_max_age(&json!(300)), Ok(Some(300)));
        assert_eq!(signed_url_max_age(&json!(0)), Ok(None));
        assert_eq!(signed_url_max_age(&json!(u64::MAX)), Ok(Some(u64::MAX)));
        for bad in [
            json!(-1),
            json!(1.5),
            json!("300"),
            json!(true),
            json!([300]),
        ] {
            let err = signed_url_max_age(&bad).expect_err("refused");
            assert!(err.contains("signedUrlMaxAgeSecs"), "{err}");
        }
    }
}

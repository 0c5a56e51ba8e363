//! Who is calling: the access token check and the run-as user of a request.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;

use crate::state::AppState;
use crate::users::{User, UserDb};
use warren_proto::connect::{Code, ConnectError};

pub const UNAUTHORIZED_MESSAGE: &str =
    "unauthorized access, please provide a valid access token or method signing if supported";

/// A JSON error as the plain HTTP endpoints answer it: `{"code": <status>, "message": ...}`.
pub fn http_error(status: StatusCode, message: impl Into<String>) -> Response {
    let body = serde_json::json!({ "code": status.as_u16(), "message": message.into() });
    (status, axum::Json(body)).into_response()
}

/// Constant-time comparison of two secrets.
pub fn secrets_equal(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether the request's `X-Access-Token` matches (true when no token is configured).
pub fn token_ok(state: &AppState, headers: &HeaderMap) -> bool {
    // Every request passes here: read the token under the lock instead of cloning all settings.
    let settings = state.settings.read().unwrap_or_else(|e| e.into_inner());
    match &settings.access_token {
        None => true,
        Some(expected) => headers
            .get("x-access-token")
            .map(|v| secrets_equal(v.as_bytes(), expected.as_bytes()))
            .unwrap_or(false),
    }
}

/// `GET /envs` from inside the sandbox (a loopback peer) needs no token: it answers only the
/// variables every process of the sandbox is started with anyway. The template's services
/// read them there (the code interpreter's kernels, which a vm template starts before any
/// sandbox exists, so their environment lacks the sandbox's variables). The host reaches the
/// agent over the slot's link, never from loopback.
fn local_envs_read(req: &Request) -> bool {
    req.method() == axum::http::Method::GET
        && req.uri().path() == "/envs"
        && req
            .extensions()
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .is_some_and(|peer| peer.0.ip().is_loopback())
}

/// Middleware for the RPC and management routes: 401 JSON unless the access token matches.
pub async fn require_token(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if token_ok(&state, req.headers()) || local_envs_read(&req) {
        next.run(req).await
    } else {
        // Read the body first so the client's connection stays usable for its next request.
        let complete = warren_proto::server::drain(req.into_body()).await;
        let mut resp = http_error(StatusCode::UNAUTHORIZED, UNAUTHORIZED_MESSAGE);
        if !complete {
            resp.headers_mut().insert(
                header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        resp
    }
}

/// The user named by `Authorization: Basic base64("<name>:")`, or `None` when absent.
pub fn basic_user_name(headers: &HeaderMap) -> Result<Option<String>, ConnectError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let bad = || ConnectError::new(Code::Unauthenticated, "invalid authorization header");
    let text = value.to_str().map_err(|_| bad())?;
    let Some(encoded) = text
        .strip_prefix("Basic ")
        .or_else(|| text.strip_prefix("basic "))
    else {
        return Err(bad());
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| bad())?;
    let decoded = String::from_utf8(decoded).map_err(|_| bad())?;
    let name = decoded.split(':').next().unwrap_or_default().to_string();
    Ok(Some(name))
}

/// Looks up a user by name, or the default user when `name` is `None`.
pub fn lookup_user(state: &AppState, name: Option<&str>) -> Result<User, ConnectError> {
    let settings = state.settings();
    let name = name
        .filter(|n| !n.is_empty())
        .unwrap_or(&settings.default_user);
    UserDb::load().by_name(name).cloned().ok_or_else(|| {
        ConnectError::new(Code::Unauthenticated, format!("invalid username: '{name}'"))
    })
}

/// The run-as user of an RPC.
pub fn rpc_user(state: &AppState, headers: &HeaderMap) -> Result<User, ConnectError> {
    let name = basic_user_name(headers)?;
    lookup_user(state, name.as_deref())
}

//! Warren's guest agent: the daemon inside every sandbox.
//!
//! It serves E2B's envd protocol on one port (49983 by default): the Connect-RPC services
//! `process.Process` and `filesystem.Filesystem` (JSON codec, unary and streaming), and plain
//! HTTP endpoints for health, initialisation, environment, metrics and file transfer.
//! `docs/agent.md` describes the behaviour in detail.

pub mod auth;
pub mod fs;
pub mod http;
pub mod journal;
pub mod mounts;
pub mod paths;
pub mod process;
pub mod procwatch;
pub mod state;
pub mod sys;
pub mod trust;
pub mod users;

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::middleware::from_fn_with_state;
use axum::routing::{get, post};
use axum::Router;

pub use state::{AppState, Settings};

/// The envd protocol version this agent is compatible with (reported to the control plane).
pub const ENVD_VERSION: &str = "0.6.13";

/// Every route the agent serves.
pub fn router(state: AppState) -> Router {
    let guarded = Router::new()
        .route("/process.Process/{method}", post(process::service::rpc))
        .route("/filesystem.Filesystem/{method}", post(fs::service::rpc))
        .route("/envs", get(http::manage::envs))
        .route("/init", post(http::manage::init))
        .route("/metrics", get(http::metrics::metrics))
        .route("/journal", get(journal::read))
        .layer(DefaultBodyLimit::max(
            warren_proto::server::MAX_MESSAGE_BYTES,
        ))
        .layer(from_fn_with_state(state.clone(), auth::require_token));
    // /health is open; /files checks the token or a URL signature itself.
    let open = Router::new()
        .route("/health", get(http::manage::health))
        .route(
            "/files",
            get(http::files::download).post(http::files::upload),
        )
        .layer(DefaultBodyLimit::disable());
    guarded
        .merge(open)
        .fallback(|| async { auth::http_error(StatusCode::NOT_FOUND, "no such endpoint") })
        .with_state(state)
}

/// Serves HTTP/1.1 and h2c (prior knowledge) on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, state: AppState) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    // Small stream envelopes must leave at once: with Nagle's algorithm and the client's delayed
    // ACK each one would wait ~40 ms.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
    });
    // The peer's address reaches the token check (see `auth::require_token`).
    let app = router(state).into_make_service_with_connect_info::<std::net::SocketAddr>();
    axum::serve(listener, app).await
}

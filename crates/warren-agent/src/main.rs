//! `warren-agent`: the guest agent binary. Thin: parses flags and runs the library.

use std::net::SocketAddr;

use clap::Parser;
use warren_agent::{AppState, Settings};

#[derive(Parser, Debug)]
#[command(version, about = "Warren guest agent (E2B envd-compatible)")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = warren_types::AGENT_LISTEN, env = "WARREN_AGENT_LISTEN")]
    listen: SocketAddr,
    /// Access token required on every request (also settable later through POST /init).
    #[arg(long, env = "WARREN_AGENT_ACCESS_TOKEN", hide_env_values = true)]
    access_token: Option<String>,
    /// User for requests that name none.
    #[arg(long, default_value = "user")]
    default_user: String,
    /// Let POST /init set the wall clock (for sandboxes restored from snapshots).
    #[arg(long)]
    sync_clock: bool,
}

fn main() -> anyhow::Result<()> {
    // As PID 1 of a sandbox, split into a reaper of orphans and the agent proper, before any
    // thread exists.
    warren_agent::sys::become_init_if_pid1();
    let args = Args::parse();
    // The runtime hands the token over in the environment so the agent requires it from its
    // first request on; it has no business in what the agent's processes could inherit. No
    // thread exists yet, so changing the environment is safe.
    std::env::remove_var("WARREN_AGENT_ACCESS_TOKEN");
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WARREN_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();

    let mut default_user = args.default_user;
    if warren_agent::users::UserDb::load()
        .by_name(&default_user)
        .is_none()
    {
        tracing::warn!(user = %default_user, "default user does not exist; using root");
        default_user = "root".into();
    }
    let settings = Settings {
        access_token: args.access_token.filter(|t| !t.is_empty()),
        default_user,
        ..Settings::default()
    };
    let state = AppState::new(settings, args.sync_clock);
    warren_agent::procwatch::start(&state);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen).await?;
        tracing::info!(addr = %listener.local_addr()?, version = warren_agent::ENVD_VERSION, "agent listening");
        warren_agent::serve(listener, state).await?;
        Ok(())
    })
}

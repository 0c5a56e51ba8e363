//! Where the server's and the CLI's `tracing` output goes: log lines on stderr (filtered by
//! `WARREN_LOG`, default `info`) and, for `warren serve` with an OTLP endpoint, the exporter's
//! layers (spans and log records).

use tracing_subscriber::filter::{filter_fn, FilterExt};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

pub fn init(otel: Option<&warren_server::otel::Otel>) {
    let filter = EnvFilter::try_from_env("WARREN_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // Log lines stay as they were: spans exist for the exporter, and their fields prefixed
    // to every line inside a request would bury the message.
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(filter.and(filter_fn(|m| !m.is_span())));
    let registry = tracing_subscriber::registry().with(lines);
    match otel {
        Some(o) => registry.with(o.layer()).init(),
        None => registry.init(),
    }
}

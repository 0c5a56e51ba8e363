//! OpenTelemetry: traces, metrics and logs exported over OTLP/HTTP (protobuf) to a collector
//! the operator names (`warren serve --otlp-endpoint`, or `OTEL_EXPORTER_OTLP_ENDPOINT`).
//!
//! - **Traces**: the `tracing` spans of API requests (`request`), of control-plane operations
//!   and their stages (`warren-control`, the runtimes), parented on the caller's
//!   `traceparent`; and `sandbox.exec` for commands started with one (`exec`).
//! - **Metrics**: sandboxes by state and operation latencies (`metrics`), every 10 s.
//! - **Logs**: the server's own log events (info and above, with the trace context of the
//!   span they happened in) and the sandboxes' audit entries.
//!
//! Export never blocks or fails an operation: the SDK's batch processors queue (bounded; the
//! excess is dropped) and send from threads of their own. Without an endpoint none of this
//! is built, no layer is installed, and the spans' call sites stay disabled.

mod client;
mod exec;
mod metrics;
pub(crate) mod request;

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::logs::SdkLoggerProvider;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::filter::{filter_fn, FilterExt, LevelFilter, Targets};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;
use warren_control::Control;

/// The standard variables read (the SDK also reads `OTEL_EXPORTER_OTLP_HEADERS`, and
/// `OTEL_BSP_*`/`OTEL_BLRP_*` for its batch processors).
pub const ENV_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
pub const ENV_SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
pub const ENV_METRIC_INTERVAL: &str = "OTEL_METRIC_EXPORT_INTERVAL";
pub const ENV_SDK_DISABLED: &str = "OTEL_SDK_DISABLED";

pub const DEFAULT_SERVICE_NAME: &str = "warren";
/// How often metrics are exported unless `OTEL_METRIC_EXPORT_INTERVAL` (ms) says otherwise.
pub const DEFAULT_METRIC_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum OtelError {
    #[error("the OTLP endpoint {value:?} {reason} (e.g. http://127.0.0.1:4318)")]
    Endpoint { value: String, reason: &'static str },
    #[error("setting up the OTLP {signal} exporter: {message}")]
    Exporter {
        signal: &'static str,
        message: String,
    },
}

/// Where and as what the server exports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtelSettings {
    /// The collector's base URL; signals go to `/v1/traces`, `/v1/metrics`, `/v1/logs`.
    pub endpoint: String,
    pub service_name: String,
    pub metric_interval: Duration,
}

impl OtelSettings {
    /// The settings from the `--otlp-endpoint` flag (which wins) and the environment (`env`
    /// looks a variable up); `None` when no endpoint is named or `OTEL_SDK_DISABLED=true`.
    pub fn resolve(
        flag: Option<&str>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<OtelSettings>, OtelError> {
        let set = |name: &str| {
            env(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        if set(ENV_SDK_DISABLED).is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let Some(endpoint) = flag
            .map(|f| f.trim().to_string())
            .filter(|f| !f.is_empty())
            .or_else(|| set(ENV_ENDPOINT))
        else {
            return Ok(None);
        };
        let bad = |reason| OtelError::Endpoint {
            value: endpoint.clone(),
            reason,
        };
        let uri: axum::http::Uri = endpoint.parse().map_err(|_| bad("is not a URL"))?;
        match uri.scheme_str() {
            Some("http" | "https") => {}
            _ => return Err(bad("must start with http:// or https://")),
        }
        if uri.host().is_none_or(str::is_empty) {
            return Err(bad("names no host"));
        }
        if uri.query().is_some() {
            return Err(bad("must not have a query"));
        }
        let metric_interval = set(ENV_METRIC_INTERVAL)
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|ms| *ms > 0)
            .map_or(DEFAULT_METRIC_INTERVAL, Duration::from_millis);
        Ok(Some(OtelSettings {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            service_name: set(ENV_SERVICE_NAME).unwrap_or_else(|| DEFAULT_SERVICE_NAME.into()),
            metric_interval,
        }))
    }

    /// Where one signal is posted (`traces`, `metrics`, `logs`).
    pub fn signal_url(&self, signal: &str) -> String {
        format!("{}/v1/{signal}", self.endpoint)
    }
}

/// The providers, while the server exports.
pub struct Otel {
    settings: OtelSettings,
    runtime: tokio::runtime::Handle,
    traces: SdkTracerProvider,
    metrics: SdkMeterProvider,
    logs: SdkLoggerProvider,
    gauges: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

fn exporter_error(
    signal: &'static str,
) -> impl Fn(opentelemetry_otlp::ExporterBuildError) -> OtelError {
    move |e| OtelError::Exporter {
        signal,
        message: e.to_string(),
    }
}

impl Otel {
    /// Builds the exporters and providers; sending happens on `runtime` (see `client`).
    pub fn start(
        settings: OtelSettings,
        runtime: tokio::runtime::Handle,
    ) -> Result<Otel, OtelError> {
        let http = client::ExportClient::new(runtime.clone()).map_err(|e| OtelError::Exporter {
            signal: "http",
            message: e.to_string(),
        })?;
        let resource = Resource::builder()
            .with_service_name(settings.service_name.clone())
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let spans = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_http_client(http.clone())
            .with_timeout(client::TIMEOUT)
            .with_endpoint(settings.signal_url("traces"))
            .build()
            .map_err(exporter_error("trace"))?;
        let traces = SdkTracerProvider::builder()
            .with_batch_exporter(spans)
            .with_id_generator(exec::ExecIds::default())
            .with_resource(resource.clone())
            .build();
        let measures = opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_http_client(http.clone())
            .with_timeout(client::TIMEOUT)
            .with_endpoint(settings.signal_url("metrics"))
            .build()
            .map_err(exporter_error("metric"))?;
        let metrics = SdkMeterProvider::builder()
            .with_reader(
                PeriodicReader::builder(measures)
                    .with_interval(settings.metric_interval)
                    .build(),
            )
            .with_resource(resource.clone())
            .build();
        let records = opentelemetry_otlp::LogExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_http_client(http)
            .with_timeout(client::TIMEOUT)
            .with_endpoint(settings.signal_url("logs"))
            .build()
            .map_err(exporter_error("log"))?;
        let logs = SdkLoggerProvider::builder()
            .with_batch_exporter(records)
            .with_resource(resource)
            .build();
        Ok(Otel {
            settings,
            runtime,
            traces,
            metrics,
            logs,
            gauges: std::sync::Mutex::new(None),
        })
    }

    pub fn settings(&self) -> &OtelSettings {
        &self.settings
    }

    /// The `tracing` layers that export: spans (with `traceparent` parents) and log events.
    /// Both take only Warren's own spans and events at info and above: the exporter's HTTP
    /// client and the SDK log too, and exporting those would feed back into the exporter.
    pub fn layer<S>(&self) -> Box<dyn Layer<S> + Send + Sync + 'static>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
    {
        let ours = || Targets::new().with_target("warren", LevelFilter::INFO);
        let spans = tracing_opentelemetry::layer()
            .with_tracer(self.traces.tracer("warren"))
            // Log events inside a span are exported as log records (with its trace context),
            // not also as span events: one copy of each.
            .with_filter(ours().and(filter_fn(|m| m.is_span())));
        let events =
            opentelemetry_appender_tracing::layer::OpenTelemetryTracingBridge::new(&self.logs)
                .with_filter(ours());
        Box::new(spans.and_then(events))
    }

    /// What turns the audit trail into spans and logs (`ControlBuilder::audit_observer`).
    pub fn audit_export(&self) -> std::sync::Arc<dyn warren_control::AuditObserver> {
        exec::AuditExport::new(self.traces.tracer("warren.sandbox"), &self.logs)
    }

    /// Starts what reads the control plane: the metrics.
    pub fn attach(&self, control: &Control) {
        let meter = opentelemetry::metrics::MeterProvider::meter(&self.metrics, "warren");
        let task = metrics::start(
            &meter,
            control,
            &self.runtime,
            self.settings.metric_interval,
        );
        if let Some(old) = self
            .gauges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(task)
        {
            old.abort();
        }
    }

    /// Sends what is queued and stops the exporters. Blocks (up to a few export timeouts):
    /// call it off the async runtime's worker threads, with the runtime still running (the
    /// last exports are sent on it).
    pub fn shutdown(&self) {
        if let Some(task) = self.gauges.lock().unwrap_or_else(|e| e.into_inner()).take() {
            task.abort();
        }
        for (what, r) in [
            ("traces", self.traces.shutdown()),
            ("metrics", self.metrics.shutdown()),
            ("logs", self.logs.shutdown()),
        ] {
            if let Err(e) = r {
                tracing::warn!(error = %warren_runtime::chain(&e), "flushing OTLP {what} at shutdown");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn nothing_named_is_nothing_exported() {
        assert_eq!(OtelSettings::resolve(None, env(&[])).unwrap(), None);
        assert_eq!(
            OtelSettings::resolve(Some("  "), env(&[(ENV_ENDPOINT, "")])).unwrap(),
            None
        );
    }

    #[test]
    fn the_flag_wins_over_the_environment() {
        let s = OtelSettings::resolve(
            Some("http://127.0.0.1:4318/"),
            env(&[(ENV_ENDPOINT, "http://collector:4318")]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(s.signal_url("traces"), "http://127.0.0.1:4318/v1/traces");
        assert_eq!(s.service_name, "warren");
        assert_eq!(s.metric_interval, DEFAULT_METRIC_INTERVAL);
    }

    #[test]
    fn the_standard_variables_are_honoured() {
        let s = OtelSettings::resolve(
            None,
            env(&[
                (ENV_ENDPOINT, "https://otel.example:4318/base"),
                (ENV_SERVICE_NAME, "warren-eu1"),
                (ENV_METRIC_INTERVAL, "1500"),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            s.signal_url("logs"),
            "https://otel.example:4318/base/v1/logs"
        );
        assert_eq!(s.service_name, "warren-eu1");
        assert_eq!(s.metric_interval, Duration::from_millis(1500));
        assert_eq!(
            OtelSettings::resolve(
                Some("http://127.0.0.1:4318"),
                env(&[(ENV_SDK_DISABLED, "TRUE")])
            )
            .unwrap(),
            None
        );
    }

    #[test]
    fn bad_endpoints_are_refused() {
        for bad in [
            "127.0.0.1:4318",
            "grpc://127.0.0.1:4317",
            "http://",
            "http://h:4318/?x=1",
            "not a url",
        ] {
            assert!(
                matches!(
                    OtelSettings::resolve(Some(bad), env(&[])),
                    Err(OtelError::Endpoint { .. })
                ),
                "{bad}"
            );
        }
    }
}

//! A span for every API request, whose parent is the caller's W3C `traceparent` when it sent
//! one, and for sandbox traffic that arrives traced.
//!
//! Spans are created whatever the configuration: with no OTLP endpoint, no subscriber layer
//! wants them, `tracing` marks their call sites disabled, and the middleware returns at once.

use axum::extract::{MatchedPath, Request};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry_http::HeaderExtractor;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::field::Empty;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The W3C trace context header (the agent reads it too: the proxy forwards it unchanged).
pub(crate) const TRACEPARENT: &str = "traceparent";

/// The caller's span, from `traceparent` (and `tracestate`); an empty context when there is
/// none or it is malformed (the request's span is then a root).
pub(crate) fn caller_context(headers: &HeaderMap) -> opentelemetry::Context {
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}

/// Wraps an API request (all but `/health`) in a server span named `METHOD /route/{template}`
/// (semantic conventions for HTTP servers).
pub(crate) async fn trace_api(req: Request, next: Next) -> Response {
    // Liveness probes (every few seconds, from every monitor) would bury the operations.
    if req.uri().path() == "/health" {
        return next.run(req).await;
    }
    let span = tracing::info_span!(
        "http.request",
        otel.name = Empty,
        otel.kind = "server",
        otel.status_code = Empty,
        http.request.method = Empty,
        http.route = Empty,
        http.response.status_code = Empty,
    );
    if span.is_disabled() {
        return next.run(req).await;
    }
    let method = req.method().as_str().to_string();
    match req.extensions().get::<MatchedPath>() {
        Some(route) => {
            span.record("otel.name", format!("{method} {}", route.as_str()));
            span.record("http.route", route.as_str());
        }
        None => {
            span.record("otel.name", method.as_str());
        }
    }
    span.record("http.request.method", method.as_str());
    // Fails only when no OpenTelemetry layer is installed, and then nothing is exported.
    let _ = span.set_parent(caller_context(req.headers()));
    // Attributes are recorded as i64 (tracing-opentelemetry keeps other integers as text).
    let resp = next.run(req).instrument(span.clone()).await;
    let status = resp.status();
    span.record("http.response.status_code", i64::from(status.as_u16()));
    if status.is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    resp
}

/// A span for a request to a sandbox that came with a `traceparent`; `None` for untraced
/// traffic (it is the bulk: file reads, streams), which gets no span of its own.
pub(crate) fn proxy_span(
    headers: &HeaderMap,
    sandbox_id: &str,
    port: u16,
) -> Option<tracing::Span> {
    if !headers.contains_key(TRACEPARENT) {
        return None;
    }
    let span = tracing::info_span!(
        "sandbox.proxy",
        otel.kind = "server",
        warren.sandbox.id = sandbox_id,
        server.port = i64::from(port),
        http.response.status_code = Empty,
    );
    if span.is_disabled() {
        return None;
    }
    let _ = span.set_parent(caller_context(headers));
    Some(span)
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceContextExt;

    #[test]
    fn traceparent_is_read() {
        let mut h = HeaderMap::new();
        h.insert(
            TRACEPARENT,
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                .parse()
                .unwrap(),
        );
        let cx = caller_context(&h);
        let sc = cx.span().span_context().clone();
        assert!(sc.is_valid() && sc.is_remote() && sc.is_sampled());
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
    }

    #[test]
    fn a_bad_traceparent_is_no_parent() {
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "garbage",
        ] {
            let mut h = HeaderMap::new();
            h.insert(TRACEPARENT, bad.parse().unwrap());
            assert!(
                !caller_context(&h).span().span_context().is_valid(),
                "{bad}"
            );
        }
        assert!(!caller_context(&HeaderMap::new())
            .span()
            .span_context()
            .is_valid());
    }

    #[test]
    fn untraced_sandbox_traffic_gets_no_span() {
        assert!(proxy_span(&HeaderMap::new(), "iabc", 49983).is_none());
    }

    #[tokio::test]
    async fn an_api_request_is_a_server_span_under_the_callers() {
        use axum::body::Body;
        use axum::http::StatusCode;
        use opentelemetry::trace::{SpanKind, TracerProvider as _};
        use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
        use tower::ServiceExt;
        use tracing_subscriber::layer::SubscriberExt;

        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        let _on = tracing::subscriber::set_default(subscriber);
        let app = axum::Router::new()
            .route(
                "/sandboxes/{sandbox_id}",
                axum::routing::delete(|| async {
                    tracing::info_span!("sandbox.kill").in_scope(|| StatusCode::NO_CONTENT)
                }),
            )
            .layer(axum::middleware::from_fn(trace_api));
        let req = axum::http::Request::delete("/sandboxes/iabc")
            .header(
                TRACEPARENT,
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            )
            .body(Body::empty())
            .unwrap();
        let resp = app.oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::NO_CONTENT);
        let spans = exporter.get_finished_spans().unwrap();
        let server = spans
            .iter()
            .find(|s| s.name == "DELETE /sandboxes/{sandbox_id}")
            .expect("the request's span, named by its route");
        assert_eq!(server.span_kind, SpanKind::Server);
        assert_eq!(
            server.span_context.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(server.parent_span_id.to_string(), "00f067aa0ba902b7");
        let attr = |k: &str| {
            server
                .attributes
                .iter()
                .find(|kv| kv.key.as_str() == k)
                .map(|kv| kv.value.to_string())
        };
        assert_eq!(attr("http.response.status_code").as_deref(), Some("204"));
        assert_eq!(
            attr("http.route").as_deref(),
            Some("/sandboxes/{sandbox_id}")
        );
        let inner = spans.iter().find(|s| s.name == "sandbox.kill").unwrap();
        assert_eq!(inner.parent_span_id, server.span_context.span_id());
    }
}

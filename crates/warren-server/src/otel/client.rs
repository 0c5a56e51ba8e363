//! The HTTP client OTLP export posts with: the workspace's rustls reqwest (the one webhooks
//! and registry pulls use, with the host's trust store), run on the server's tokio runtime.
//!
//! The SDK's batch processors and periodic reader export from threads of their own, through
//! a plain `block_on` without a tokio reactor; an async client would panic there. So each
//! request is spawned onto the runtime and only its result is awaited on the exporter's
//! thread: the API's tasks never wait for a collector, and a slow collector costs one
//! exporter thread's time, bounded by [`TIMEOUT`].

use std::time::Duration;

use bytes::Bytes;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};

/// How long one export may take (the OTLP default, `OTEL_EXPORTER_OTLP_TIMEOUT`).
pub(crate) const TIMEOUT: Duration = Duration::from_secs(10);
/// Largest collector answer read (an OTLP response is a few bytes; partial-success messages
/// a few hundred).
const MAX_RESPONSE: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub(crate) enum ExportError {
    #[error("building the OTLP HTTP client: {0}")]
    Client(String),
    #[error("the request to the collector: {0}")]
    Send(String),
    #[error("the collector's answer is larger than {MAX_RESPONSE} bytes")]
    TooLarge,
    #[error("the server is stopping")]
    Stopping,
}

#[derive(Debug, Clone)]
pub(crate) struct ExportClient {
    client: reqwest_oci::Client,
    runtime: tokio::runtime::Handle,
}

impl ExportClient {
    pub(crate) fn new(runtime: tokio::runtime::Handle) -> Result<Self, ExportError> {
        // Two TLS providers are compiled into the binary: rustls needs the process's chosen.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest_oci::Client::builder()
            .tls_certs_only(
                warren_tls::host_roots()
                    .iter()
                    .filter_map(|c| reqwest_oci::Certificate::from_der(c.as_ref()).ok()),
            )
            .timeout(TIMEOUT)
            // The collector is the operator's: proxy variables meant for sandboxes' builds
            // or registries must not reroute telemetry.
            .no_proxy()
            .build()
            .map_err(|e| ExportError::Client(e.to_string()))?;
        Ok(ExportClient { client, runtime })
    }

    async fn post(
        client: reqwest_oci::Client,
        request: Request<Bytes>,
    ) -> Result<Response<Bytes>, ExportError> {
        let (parts, body) = request.into_parts();
        let mut resp = client
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body)
            .send()
            .await
            .map_err(|e| ExportError::Send(e.to_string()))?;
        let status = resp.status();
        let headers = std::mem::take(resp.headers_mut());
        let mut body = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| ExportError::Send(e.to_string()))?
        {
            if body.len() + chunk.len() > MAX_RESPONSE {
                return Err(ExportError::TooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        let mut out = Response::new(Bytes::from(body));
        *out.status_mut() = status;
        *out.headers_mut() = headers;
        Ok(out)
    }
}

#[async_trait::async_trait]
impl HttpClient for ExportClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let task = self.runtime.spawn(Self::post(self.client.clone(), request));
        match task.await {
            Ok(result) => result.map_err(|e| Box::new(e) as HttpError),
            // The runtime shut down under the export (the server is stopping).
            Err(_) => Err(Box::new(ExportError::Stopping)),
        }
    }
}

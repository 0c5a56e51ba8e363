//! Connect-RPC (JSON codec) over axum: error codes, unary calls, and envelope-framed streams.
//!
//! Unary: `application/json` body in, JSON out; errors are `{"code","message"}` with the HTTP
//! status of the code. Streams: `application/connect+json`; each message is an envelope
//! (1 flag byte + 4-byte big-endian length + JSON). A server stream always answers HTTP 200 and
//! ends with one end-of-stream envelope (flag 0x02) carrying `{}` or `{"error":{...}}`.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{Buf, BufMut, BytesMut};
use futures::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::mpsc;

/// Largest single message accepted in a request (unary body or one stream envelope).
pub const MAX_MESSAGE_BYTES: usize = 32 * 1024 * 1024;

const FLAG_COMPRESSED: u8 = 0x01;
const FLAG_END_STREAM: u8 = 0x02;

/// The Connect error codes, serialised in snake_case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out_of_range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// HTTP status of a unary error, from the Connect specification.
    pub fn http_status(self) -> StatusCode {
        let n = match self {
            Code::Canceled => 499,
            Code::Unknown | Code::Internal | Code::DataLoss => 500,
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
            Code::DeadlineExceeded => 504,
            Code::NotFound => 404,
            Code::AlreadyExists | Code::Aborted => 409,
            Code::PermissionDenied => 403,
            Code::ResourceExhausted => 429,
            Code::Unimplemented => 501,
            Code::Unavailable => 503,
            Code::Unauthenticated => 401,
        };
        StatusCode::from_u16(n).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

/// An RPC failure as the client will see it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub struct RpcError {
    pub code: Code,
    pub message: String,
}

impl RpcError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
    pub fn invalid_argument(m: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, m)
    }
    pub fn not_found(m: impl Into<String>) -> Self {
        Self::new(Code::NotFound, m)
    }
    pub fn internal(m: impl Into<String>) -> Self {
        Self::new(Code::Internal, m)
    }
    pub fn unimplemented(m: impl Into<String>) -> Self {
        Self::new(Code::Unimplemented, m)
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({ "code": self.code.as_str(), "message": self.message })
    }
}

impl IntoResponse for RpcError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.json()).unwrap_or_default();
        let mut resp = (self.code.http_status(), body).into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        resp
    }
}

pub type RpcResult<T> = Result<T, RpcError>;

/// Whether a request's content type says it is a streaming call.
pub fn is_stream_content_type(headers: &HeaderMap) -> bool {
    content_type(headers).starts_with("application/connect+json")
}

fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// Checks the content type of a unary call and decodes its body.
pub fn decode_unary<T: DeserializeOwned>(headers: &HeaderMap, body: &[u8]) -> RpcResult<T> {
    let ct = content_type(headers);
    if !ct.is_empty() && !ct.starts_with("application/json") {
        return Err(RpcError::invalid_argument(format!(
            "unsupported content type '{ct}' for a unary call (want application/json)"
        )));
    }
    if body.len() > MAX_MESSAGE_BYTES {
        return Err(RpcError::new(
            Code::ResourceExhausted,
            "request message too large",
        ));
    }
    // An empty body is the empty message.
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        &b"{}"[..]
    } else {
        body
    };
    serde_json::from_slice(body)
        .map_err(|e| RpcError::invalid_argument(format!("malformed request message: {e}")))
}

/// Encodes a unary answer.
pub fn unary_response<T: Serialize>(result: RpcResult<T>) -> Response {
    match result.and_then(|msg| {
        serde_json::to_vec(&msg).map_err(|e| RpcError::internal(format!("encode response: {e}")))
    }) {
        Ok(body) => {
            let mut resp = (StatusCode::OK, body).into_response();
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            resp
        }
        Err(e) => e.into_response(),
    }
}

/// Frames one message (or the end-of-stream trailer) as an envelope.
pub fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut buf = BytesMut::with_capacity(5 + payload.len());
    buf.put_u8(flags);
    buf.put_u32(payload.len() as u32);
    buf.put_slice(payload);
    buf.freeze()
}

fn end_of_stream(result: &RpcResult<()>) -> Bytes {
    let json = match result {
        Ok(()) => serde_json::json!({}),
        Err(e) => serde_json::json!({ "error": e.json() }),
    };
    envelope(
        FLAG_END_STREAM,
        &serde_json::to_vec(&json).unwrap_or_default(),
    )
}

/// Incrementally decodes envelopes from a request body.
pub struct EnvelopeReader<S> {
    body: S,
    buf: BytesMut,
    done: bool,
}

impl<S, E> EnvelopeReader<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    pub fn new(body: S) -> Self {
        Self {
            body,
            buf: BytesMut::new(),
            done: false,
        }
    }

    /// Next message, `None` at a clean end of the body (or after an end-of-stream envelope).
    pub async fn next<T: DeserializeOwned>(&mut self) -> RpcResult<Option<T>> {
        loop {
            if self.buf.len() >= 5 {
                let flags = self.buf[0];
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                if len > MAX_MESSAGE_BYTES {
                    return Err(RpcError::new(
                        Code::ResourceExhausted,
                        "stream message too large",
                    ));
                }
                if self.buf.len() >= 5 + len {
                    self.buf.advance(5);
                    let payload = self.buf.split_to(len);
                    if flags & FLAG_COMPRESSED != 0 {
                        return Err(RpcError::unimplemented(
                            "compressed messages are not supported",
                        ));
                    }
                    if flags & FLAG_END_STREAM != 0 {
                        self.done = true;
                        return Ok(None);
                    }
                    let msg = serde_json::from_slice(&payload).map_err(|e| {
                        RpcError::invalid_argument(format!("malformed stream message: {e}"))
                    })?;
                    return Ok(Some(msg));
                }
            }
            if self.done {
                return Ok(None);
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.buf.extend_from_slice(&chunk),
                Some(Err(e)) => {
                    return Err(RpcError::new(Code::Canceled, format!("request body: {e}")))
                }
                None => {
                    self.done = true;
                    if self.buf.is_empty() {
                        return Ok(None);
                    }
                    return Err(RpcError::invalid_argument("truncated stream envelope"));
                }
            }
        }
    }
}

/// Reads the single request message of a server-streaming call, and the request body to its
/// end: answering before the body is complete would make the server drop the connection,
/// which clients that pool connections see as random failures of their next call.
pub async fn read_single<T: DeserializeOwned>(headers: &HeaderMap, body: Body) -> RpcResult<T> {
    if !is_stream_content_type(headers) {
        drain(body).await;
        return Err(RpcError::invalid_argument(
            "streaming calls need content type application/connect+json",
        ));
    }
    let mut reader = EnvelopeReader::new(body.into_data_stream());
    let first = reader.next::<T>().await;
    // Whatever follows the one message (normally nothing but the end of the body) is read
    // and ignored, so the connection stays usable.
    while let Ok(Some(_)) = reader.next::<serde::de::IgnoredAny>().await {}
    first?.ok_or_else(|| RpcError::invalid_argument("stream request carried no message"))
}

/// Most of a request body a server reads and throws away before answering an early error, so
/// the client's connection survives; past this the connection is closed instead.
pub const DRAIN_LIMIT: usize = 1024 * 1024;

/// Reads and discards the rest of a request body (up to [`DRAIN_LIMIT`] bytes or 5 s). Returns
/// whether the whole body was read.
pub async fn drain(body: Body) -> bool {
    let mut stream = body.into_data_stream();
    let mut seen = 0usize;
    let read_all = async {
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(c) => {
                    seen += c.len();
                    if seen > DRAIN_LIMIT {
                        return false;
                    }
                }
                Err(_) => return false,
            }
        }
        true
    };
    tokio::time::timeout(Duration::from_secs(5), read_all)
        .await
        .unwrap_or(false)
}

/// The sending half of a server stream. Dropping it without `finish` ends the stream cleanly.
pub struct StreamSender {
    tx: mpsc::Sender<Bytes>,
}

impl StreamSender {
    /// Sends one message; `false` when the client has gone away.
    pub async fn send<T: Serialize>(&self, msg: &T) -> bool {
        match serde_json::to_vec(msg) {
            Ok(payload) => self.tx.send(envelope(0, &payload)).await.is_ok(),
            Err(_) => false,
        }
    }

    /// Ends the stream with success or an error trailer.
    pub async fn finish(self, result: RpcResult<()>) {
        let _ = self.tx.send(end_of_stream(&result)).await;
    }

    /// Resolves when the client has disconnected.
    pub async fn closed(&self) {
        self.tx.closed().await
    }
}

/// Starts a server-stream response; the returned sender feeds it. Memory stays bounded: a slow
/// client makes `send` wait.
pub fn stream_response() -> (StreamSender, Response) {
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let body = Body::from_stream(
        tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, std::convert::Infallible>),
    );
    let mut resp = Response::new(body);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/connect+json"),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    (StreamSender { tx }, resp)
}

/// A complete stream response: one message and the end of stream, or just the error trailer.
pub fn stream_complete<T: Serialize>(result: RpcResult<T>) -> Response {
    let body = match result.and_then(|msg| {
        serde_json::to_vec(&msg).map_err(|e| RpcError::internal(format!("encode response: {e}")))
    }) {
        Ok(payload) => {
            let mut b = BytesMut::new();
            b.extend_from_slice(&envelope(0, &payload));
            b.extend_from_slice(&end_of_stream(&Ok(())));
            b.freeze()
        }
        Err(e) => end_of_stream(&Err(e)),
    };
    let mut resp = Response::new(Body::from(body));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/connect+json"),
    );
    resp
}

/// A stream response that ends immediately with `err` (stream errors travel with HTTP 200).
pub fn stream_error(err: RpcError) -> Response {
    let mut resp = Response::new(Body::from(end_of_stream(&Err(err))));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/connect+json"),
    );
    resp
}

/// The call deadline from `Connect-Timeout-Ms` (absent or 0: none).
pub fn timeout(headers: &HeaderMap) -> Option<Duration> {
    let ms: u64 = headers
        .get("connect-timeout-ms")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// Idle interval after which a stream emits a keepalive (`Keepalive-Ping-Interval`, seconds).
pub fn keepalive_interval(headers: &HeaderMap) -> Duration {
    let secs = headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .unwrap_or(90);
    Duration::from_secs(secs)
}

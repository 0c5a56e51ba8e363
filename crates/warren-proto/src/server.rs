//! The server half of the Connect protocol (JSON codec) over axum, as the agent serves it.
//!
//! Unary: `application/json` body in, JSON out; errors are a [`ConnectError`] with the HTTP
//! status of its code. Streams: `application/connect+json`, a sequence of envelopes framed by
//! [`crate::connect`]. A server stream always answers HTTP 200 and ends with one end-of-stream
//! envelope carrying `{}` or `{"error":{...}}`.
//!
//! The framing itself lives in [`crate::connect`], shared with the typed client of
//! [`crate::client`]; this module only moves those bytes through axum.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::connect::{
    encode_end_stream, encode_message, Code, CodecError, ConnectError, Decoder, FLAG_END_STREAM,
    STREAM_CONTENT_TYPE, UNARY_CONTENT_TYPE,
};

/// Largest single message accepted in a request (unary body or one stream envelope).
pub const MAX_MESSAGE_BYTES: usize = 32 * 1024 * 1024;

pub type RpcResult<T> = Result<T, ConnectError>;

impl IntoResponse for ConnectError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.code.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self).unwrap_or_default();
        with_content_type((status, body).into_response(), UNARY_CONTENT_TYPE)
    }
}

fn with_content_type(mut resp: Response, content_type: &'static str) -> Response {
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// Whether a request's content type says it is a streaming call.
pub fn is_stream_content_type(headers: &HeaderMap) -> bool {
    content_type(headers).starts_with(STREAM_CONTENT_TYPE)
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
    if !ct.is_empty() && !ct.starts_with(UNARY_CONTENT_TYPE) {
        return Err(ConnectError::invalid_argument(format!(
            "unsupported content type '{ct}' for a unary call (want application/json)"
        )));
    }
    if body.len() > MAX_MESSAGE_BYTES {
        return Err(ConnectError::new(
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
        .map_err(|e| ConnectError::invalid_argument(format!("malformed request message: {e}")))
}

fn encode_error(e: CodecError) -> ConnectError {
    ConnectError::internal(format!("encode response: {e}"))
}

/// Encodes a unary answer.
pub fn unary_response<T: Serialize>(result: RpcResult<T>) -> Response {
    match result
        .and_then(|msg| serde_json::to_vec(&msg).map_err(|e| encode_error(CodecError::Encode(e))))
    {
        Ok(body) => with_content_type((StatusCode::OK, body).into_response(), UNARY_CONTENT_TYPE),
        Err(e) => e.into_response(),
    }
}

/// The end-of-stream envelope for `result`.
fn end_of_stream(result: &RpcResult<()>) -> Vec<u8> {
    // Encoding `{}` or a code and a message cannot fail.
    encode_end_stream(result.as_ref().map(|_| ())).unwrap_or_default()
}

/// What a client sees when its request stream cannot be decoded.
fn request_error(e: CodecError) -> ConnectError {
    match e {
        CodecError::FrameTooLarge { .. } => {
            ConnectError::new(Code::ResourceExhausted, "stream message too large")
        }
        CodecError::Compressed => {
            ConnectError::unimplemented("compressed messages are not supported")
        }
        CodecError::Malformed(e) => {
            ConnectError::invalid_argument(format!("malformed stream message: {e}"))
        }
        CodecError::Truncated(_) => ConnectError::invalid_argument("truncated stream envelope"),
        e @ (CodecError::MessageTooLong(_) | CodecError::Encode(_)) => {
            ConnectError::internal(e.to_string())
        }
    }
}

/// Incrementally decodes envelopes from a request body.
pub struct EnvelopeReader<S> {
    body: S,
    decoder: Decoder,
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
            decoder: Decoder::new(MAX_MESSAGE_BYTES),
            done: false,
        }
    }

    /// Next message, `None` at a clean end of the body (or after an end-of-stream envelope).
    pub async fn next<T: DeserializeOwned>(&mut self) -> RpcResult<Option<T>> {
        loop {
            if let Some((flags, payload)) = self.decoder.next_raw().map_err(request_error)? {
                if flags & FLAG_END_STREAM != 0 {
                    self.done = true;
                    return Ok(None);
                }
                let msg = serde_json::from_slice(&payload)
                    .map_err(|e| request_error(CodecError::Malformed(e)))?;
                return Ok(Some(msg));
            }
            if self.done {
                return Ok(None);
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.decoder.push(&chunk),
                Some(Err(e)) => {
                    return Err(ConnectError::new(
                        Code::Canceled,
                        format!("request body: {e}"),
                    ))
                }
                None => {
                    self.done = true;
                    self.decoder.finish().map_err(request_error)?;
                    return Ok(None);
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
        return Err(ConnectError::invalid_argument(
            "streaming calls need content type application/connect+json",
        ));
    }
    let mut reader = EnvelopeReader::new(body.into_data_stream());
    let first = reader.next::<T>().await;
    // Whatever follows the one message (normally nothing but the end of the body) is read
    // and ignored, so the connection stays usable.
    while let Ok(Some(_)) = reader.next::<serde::de::IgnoredAny>().await {}
    first?.ok_or_else(|| ConnectError::invalid_argument("stream request carried no message"))
}

/// Most of a request body a server reads and throws away before answering an early error, so
/// the client's connection survives; past this the connection is closed instead.
pub const DRAIN_LIMIT: usize = 1024 * 1024;

/// Reads and discards the rest of a request body (up to [`DRAIN_LIMIT`] bytes or 5 s). Returns
/// whether the whole body was read.
pub async fn drain(body: Body) -> bool {
    drain_up_to(body, DRAIN_LIMIT, Duration::from_secs(5)).await
}

/// [`drain`] with other limits (bytes, time), for requests whose bodies are large by nature
/// (a file upload refused when the disk is full: its client only sees the answer once it has
/// sent the body).
pub async fn drain_up_to(body: Body, limit: usize, within: Duration) -> bool {
    let mut stream = body.into_data_stream();
    let mut seen = 0usize;
    let read_all = async {
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(c) => {
                    seen += c.len();
                    if seen > limit {
                        return false;
                    }
                }
                Err(_) => return false,
            }
        }
        true
    };
    tokio::time::timeout(within, read_all)
        .await
        .unwrap_or(false)
}

/// The sending half of a server stream. Dropping it without `finish` ends the stream cleanly.
pub struct StreamSender {
    tx: mpsc::Sender<Vec<u8>>,
}

impl StreamSender {
    /// Sends one message; `false` when the client has gone away.
    pub async fn send<T: Serialize>(&self, msg: &T) -> bool {
        match encode_message(msg) {
            Ok(envelope) => self.tx.send(envelope).await.is_ok(),
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

fn stream_body(body: Body) -> Response {
    with_content_type(Response::new(body), STREAM_CONTENT_TYPE)
}

/// Starts a server-stream response; the returned sender feeds it. Memory stays bounded: a slow
/// client makes `send` wait.
pub fn stream_response() -> (StreamSender, Response) {
    let (tx, rx) = mpsc::channel::<Vec<u8>>(16);
    let body = Body::from_stream(
        tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, std::convert::Infallible>),
    );
    let mut resp = stream_body(body);
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    (StreamSender { tx }, resp)
}

/// A complete stream response: one message and the end of stream, or just the error trailer.
pub fn stream_complete<T: Serialize>(result: RpcResult<T>) -> Response {
    let body = match result.and_then(|msg| encode_message(&msg).map_err(encode_error)) {
        Ok(mut body) => {
            body.extend_from_slice(&end_of_stream(&Ok(())));
            body
        }
        Err(e) => end_of_stream(&Err(e)),
    };
    stream_body(Body::from(body))
}

/// A stream response that ends immediately with `err` (stream errors travel with HTTP 200).
pub fn stream_error(err: ConnectError) -> Response {
    stream_body(Body::from(end_of_stream(&Err(err))))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::{encode_frame, FLAG_COMPRESSED};

    fn reader(
        chunks: Vec<Vec<u8>>,
    ) -> EnvelopeReader<impl Stream<Item = Result<Bytes, String>> + Unpin> {
        EnvelopeReader::new(futures::stream::iter(
            chunks.into_iter().map(|c| Ok(Bytes::from(c))),
        ))
    }

    async fn first_error(chunks: Vec<Vec<u8>>) -> ConnectError {
        reader(chunks)
            .next::<serde_json::Value>()
            .await
            .expect_err("the request stream must be refused")
    }

    #[tokio::test]
    async fn request_stream_errors_keep_their_codes() {
        let oversize = ((MAX_MESSAGE_BYTES + 1) as u32).to_be_bytes();
        let e = first_error(vec![vec![
            0,
            oversize[0],
            oversize[1],
            oversize[2],
            oversize[3],
        ]])
        .await;
        assert_eq!(e.code, Code::ResourceExhausted);
        let e = first_error(vec![encode_frame(FLAG_COMPRESSED, b"{}").unwrap()]).await;
        assert_eq!(e.code, Code::Unimplemented);
        let e = first_error(vec![encode_frame(0, b"{").unwrap()]).await;
        assert_eq!(e.code, Code::InvalidArgument);
        assert!(e.message.starts_with("malformed stream message"), "{e}");
        let e = first_error(vec![vec![0, 0, 0, 0, 9, b'{']]).await;
        assert_eq!(
            e,
            ConnectError::invalid_argument("truncated stream envelope")
        );
    }

    #[tokio::test]
    async fn request_stream_split_anywhere_and_end_of_stream() {
        let mut body = encode_message(&serde_json::json!({"a": 1})).unwrap();
        body.extend(encode_end_stream(Ok(())).unwrap());
        body.extend(encode_message(&serde_json::json!({"after": "end"})).unwrap());
        let chunks = body.iter().map(|b| vec![*b]).collect();
        let mut r = reader(chunks);
        let first: Option<serde_json::Value> = r.next().await.unwrap();
        assert_eq!(first, Some(serde_json::json!({"a": 1})));
        // The end-of-stream envelope ends the request: the body is not read past it.
        assert_eq!(r.next::<serde_json::Value>().await.unwrap(), None);
    }

    #[tokio::test]
    async fn errors_answer_with_their_status_and_json() {
        let resp = ConnectError::not_found("gone").into_response();
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        assert_eq!(resp.headers()[header::CONTENT_TYPE], UNARY_CONTENT_TYPE);
        let body = axum::body::to_bytes(resp.into_body(), 1024).await.unwrap();
        assert_eq!(&body[..], br#"{"code":"not_found","message":"gone"}"#);

        let resp = ConnectError::new(Code::ResourceExhausted, "too many").into_response();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);

        let resp = stream_error(ConnectError::internal("boom"));
        assert_eq!(resp.status(), StatusCode::OK);
        let body = axum::body::to_bytes(resp.into_body(), 1024).await.unwrap();
        let frames = crate::connect::decode_all(&body, 1024).unwrap();
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].0, FLAG_END_STREAM);
        assert_eq!(
            &frames[0].1[..],
            br#"{"error":{"code":"internal","message":"boom"}}"#
        );
    }
}

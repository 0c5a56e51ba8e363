//! The Connect protocol's framing for the JSON codec, as the agent speaks it.
//!
//! Unary calls are plain JSON bodies (`application/json`); errors come back as a JSON
//! [`ConnectError`] with the HTTP status of its code. Streams (`application/connect+json`) are
//! a sequence of envelopes: one flags byte, a big-endian `u32` length, then that many bytes of
//! JSON. A server stream ends with one envelope flagged [`FLAG_END_STREAM`] whose message is
//! `{}` or `{"error": {...}}`.
//!
//! This module has no transport: it turns messages into bytes and bytes into messages, so
//! both ends of the wire (the agent, the typed client of [`crate::client`]) can share it.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Envelope flag: the payload is compressed (never negotiated by us, so refused).
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Envelope flag: the end-of-stream message.
pub const FLAG_END_STREAM: u8 = 0x02;
/// Bytes before an envelope's payload: the flags byte and the length.
pub const HEADER_LEN: usize = 5;
/// Content type of a streaming call.
pub const STREAM_CONTENT_TYPE: &str = "application/connect+json";
/// Content type of a unary call.
pub const UNARY_CONTENT_TYPE: &str = "application/json";
/// Largest envelope payload a [`Decoder`] accepts unless told otherwise. The agent's output
/// events carry at most a few tens of KiB; what the other end announces is never buffered
/// past this.
pub const DEFAULT_MAX_FRAME: usize = 4 << 20;

/// The Connect error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    const ALL: [Code; 16] = [
        Code::Canceled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];

    /// The code's name on the wire (snake case).
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

    /// The HTTP status of a unary call that fails with this code (the Connect specification's
    /// table).
    pub fn http_status(self) -> u16 {
        match self {
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
        }
    }

    /// The code named `name`; the Connect specification has clients read a name they do not
    /// know as `unknown`.
    pub fn from_name(name: &str) -> Code {
        Self::ALL
            .into_iter()
            .find(|c| c.as_str() == name)
            .unwrap_or(Code::Unknown)
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Code {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Code {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = std::borrow::Cow::<'de, str>::deserialize(d)?;
        Ok(Code::from_name(&name))
    }
}

/// An RPC failure as the agent reports it: the body of a failed unary call, or the `error` of
/// an end-of-stream message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub struct ConnectError {
    pub code: Code,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl ConnectError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Code::NotFound, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Code::Internal, message)
    }
    pub fn unimplemented(message: impl Into<String>) -> Self {
        Self::new(Code::Unimplemented, message)
    }
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.message.is_empty() {
            write!(f, "{}", self.code)
        } else {
            write!(f, "{}: {}", self.code, self.message)
        }
    }
}

/// Why bytes could not become envelopes, or messages bytes.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("an envelope of {len} bytes is larger than the {max} allowed")]
    FrameTooLarge { len: usize, max: usize },
    #[error("a message of {0} bytes does not fit an envelope")]
    MessageTooLong(usize),
    #[error("a compressed envelope arrived, and no compression was negotiated")]
    Compressed,
    #[error("malformed message in an envelope")]
    Malformed(#[source] serde_json::Error),
    #[error("encoding a message")]
    Encode(#[source] serde_json::Error),
    #[error("the stream ended inside an envelope ({0} bytes left over)")]
    Truncated(usize),
}

/// One envelope around `payload`.
pub fn encode_frame(flags: u8, payload: &[u8]) -> Result<Vec<u8>, CodecError> {
    let len =
        u32::try_from(payload.len()).map_err(|_| CodecError::MessageTooLong(payload.len()))?;
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.push(flags);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(payload);
    Ok(out)
}

/// One message as a data envelope.
pub fn encode_message<T: Serialize>(msg: &T) -> Result<Vec<u8>, CodecError> {
    let payload = serde_json::to_vec(msg).map_err(CodecError::Encode)?;
    encode_frame(0, &payload)
}

/// The end-of-stream envelope: `{}` for success, `{"error": …}` otherwise.
pub fn encode_end_stream(result: Result<(), &ConnectError>) -> Result<Vec<u8>, CodecError> {
    let payload = serde_json::to_vec(&EndStream {
        error: result.err().cloned(),
    })
    .map_err(CodecError::Encode)?;
    encode_frame(FLAG_END_STREAM, &payload)
}

#[derive(Serialize, Deserialize)]
struct EndStream {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<ConnectError>,
}

/// One decoded envelope.
#[derive(Debug, PartialEq)]
pub enum Frame<T> {
    /// A stream message.
    Message(T),
    /// The end-of-stream message: `Ok` for `{}`, `Err` when it carries an error.
    End(Result<(), ConnectError>),
}

/// Splits a body, fed in chunks split anywhere, into envelopes. An envelope that announces
/// more than `max_frame` bytes is refused as soon as its header is in, before its payload is
/// buffered.
#[derive(Debug)]
pub struct Decoder {
    buf: Vec<u8>,
    max_frame: usize,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_FRAME)
    }
}

impl Decoder {
    pub fn new(max_frame: usize) -> Self {
        Self {
            buf: Vec::new(),
            max_frame,
        }
    }

    /// Changes the largest payload accepted from the next envelope on.
    pub fn set_max_frame(&mut self, max_frame: usize) {
        self.max_frame = max_frame;
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// Bytes received but not yet returned as an envelope.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next whole envelope as (flags, payload), if one has arrived.
    pub fn next_raw(&mut self) -> Result<Option<(u8, Vec<u8>)>, CodecError> {
        let Some(header) = self.buf.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let flags = header[0];
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        if len > self.max_frame {
            return Err(CodecError::FrameTooLarge {
                len,
                max: self.max_frame,
            });
        }
        if flags & FLAG_COMPRESSED != 0 {
            return Err(CodecError::Compressed);
        }
        if self.buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let payload = self.buf[HEADER_LEN..HEADER_LEN + len].to_vec();
        self.buf.drain(..HEADER_LEN + len);
        Ok(Some((flags, payload)))
    }

    /// The next whole envelope, decoded: a message of type `T` or the end of the stream.
    pub fn next_frame<T: DeserializeOwned>(&mut self) -> Result<Option<Frame<T>>, CodecError> {
        let Some((flags, payload)) = self.next_raw()? else {
            return Ok(None);
        };
        if flags & FLAG_END_STREAM != 0 {
            let end: EndStream = serde_json::from_slice(&payload).map_err(CodecError::Malformed)?;
            return Ok(Some(Frame::End(end.error.map_or(Ok(()), Err))));
        }
        let msg = serde_json::from_slice(&payload).map_err(CodecError::Malformed)?;
        Ok(Some(Frame::Message(msg)))
    }

    /// Checks that the body ended between envelopes.
    pub fn finish(&self) -> Result<(), CodecError> {
        match self.buf.len() {
            0 => Ok(()),
            n => Err(CodecError::Truncated(n)),
        }
    }
}

/// Splits a complete body into (flags, payload) envelopes; trailing bytes that are not a whole
/// envelope are an error.
pub fn decode_all(body: &[u8], max_frame: usize) -> Result<Vec<(u8, Vec<u8>)>, CodecError> {
    let mut d = Decoder::new(max_frame);
    d.push(body);
    let mut out = Vec::new();
    while let Some(frame) = d.next_raw()? {
        out.push(frame);
    }
    d.finish()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::process::process_event::{Event, StartEvent};
    use crate::process::{ProcessEvent, StartResponse};

    fn start(pid: u32) -> StartResponse {
        StartResponse {
            event: Some(ProcessEvent {
                event: Some(Event::Start(StartEvent { pid })),
            }),
        }
    }

    #[test]
    fn envelope_round_trip() {
        let bytes = encode_message(&start(7)).unwrap();
        assert_eq!(bytes[0], 0);
        let len = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
        assert_eq!(len, bytes.len() - HEADER_LEN);
        assert_eq!(
            serde_json::from_slice::<Value>(&bytes[HEADER_LEN..]).unwrap(),
            json!({"event": {"start": {"pid": 7}}})
        );
        let mut d = Decoder::default();
        d.push(&bytes);
        assert_eq!(
            d.next_frame::<StartResponse>().unwrap(),
            Some(Frame::Message(start(7)))
        );
        assert_eq!(d.next_frame::<StartResponse>().unwrap(), None);
        d.finish().unwrap();
    }

    #[test]
    fn split_chunks_and_error_trailer() {
        let mut body = encode_message(&start(3)).unwrap();
        body.extend(encode_message(&start(4)).unwrap());
        let err = ConnectError {
            code: Code::NotFound,
            message: "gone".into(),
        };
        body.extend(encode_end_stream(Err(&err)).unwrap());
        assert!(String::from_utf8_lossy(&body)
            .contains(r#"{"error":{"code":"not_found","message":"gone"}}"#));

        let mut d = Decoder::default();
        let mut frames = Vec::new();
        // One byte at a time: every split point must work.
        for b in &body {
            d.push(std::slice::from_ref(b));
            while let Some(f) = d.next_frame::<StartResponse>().unwrap() {
                frames.push(f);
            }
        }
        assert_eq!(
            frames,
            vec![
                Frame::Message(start(3)),
                Frame::Message(start(4)),
                Frame::End(Err(err.clone())),
            ]
        );
        assert_eq!(err.to_string(), "not_found: gone");
        d.finish().unwrap();
    }

    #[test]
    fn clean_trailer_and_unknown_codes() {
        let mut d = Decoder::default();
        d.push(&[FLAG_END_STREAM, 0, 0, 0, 2, b'{', b'}']);
        assert_eq!(d.next_frame::<Value>().unwrap(), Some(Frame::End(Ok(()))));
        let e: ConnectError = serde_json::from_value(json!({"code": "brand_new"})).unwrap();
        assert_eq!(e.code, Code::Unknown);
        assert_eq!(e.to_string(), "unknown");
        for c in Code::ALL {
            assert_eq!(Code::from_name(c.as_str()), c);
        }
    }

    #[test]
    fn oversized_frame_is_refused_from_its_header() {
        let mut d = Decoder::new(16);
        // Only the header of a 1 GiB envelope: refused before any payload arrives.
        d.push(&[0, 0x40, 0, 0, 0]);
        assert!(matches!(
            d.next_raw(),
            Err(CodecError::FrameTooLarge {
                len: 0x4000_0000,
                max: 16
            })
        ));
        let mut d = Decoder::new(16);
        d.push(&encode_frame(0, &[b' '; 16]).unwrap());
        assert!(
            d.next_raw().unwrap().is_some(),
            "the limit itself is allowed"
        );
    }

    #[test]
    fn malformed_compressed_and_truncated() {
        let mut d = Decoder::default();
        d.push(&[0, 0, 0, 0, 1, b'{']);
        assert!(matches!(
            d.next_frame::<Value>(),
            Err(CodecError::Malformed(_))
        ));
        let mut d = Decoder::default();
        d.push(&[FLAG_COMPRESSED, 0, 0, 0, 0]);
        assert!(matches!(d.next_raw(), Err(CodecError::Compressed)));
        let mut d = Decoder::default();
        d.push(&[0, 0, 0, 0, 9, b'{']);
        assert!(d.next_raw().unwrap().is_none());
        assert!(matches!(d.finish(), Err(CodecError::Truncated(6))));
        assert!(matches!(
            decode_all(&[0, 0, 0, 0, 2, b'{', b'}', 0], 64),
            Err(CodecError::Truncated(1))
        ));
    }
}

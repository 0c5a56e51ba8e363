//! A typed client of the agent's Connect services over HTTP (feature `client`): the one way the
//! host, the CLI and the tests talk to an agent, so a change to `proto/envd` shows up as a
//! compile error in every caller rather than as a silent wire mismatch.
//!
//! Unary calls return the response message; server streams return an [`EventStream`] that
//! yields typed messages until the end-of-stream envelope. Every message's size is bounded:
//! what a guest announces is never buffered past the limit.

use std::marker::PhantomData;
use std::net::SocketAddr;
use std::time::Duration;

use base64::Engine as _;
use futures::Stream;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use reqwest::StatusCode;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::connect::{
    self, CodecError, ConnectError, Decoder, Frame, DEFAULT_MAX_FRAME, STREAM_CONTENT_TYPE,
    UNARY_CONTENT_TYPE,
};
use crate::process;

/// The header that carries the sandbox's access token.
pub const ACCESS_TOKEN_HEADER: &str = "x-access-token";
/// Largest unary response read.
pub const MAX_UNARY_RESPONSE: usize = 4 << 20;
/// Most of an unexpected error body kept for the error's text.
const MAX_ERROR_BODY: usize = 4096;

/// Why a call failed. `procedure` names the RPC (`process.Process/Start`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid value for header {name}")]
    HeaderValue {
        name: String,
        #[source]
        source: reqwest::header::InvalidHeaderValue,
    },
    #[error("invalid header name {name:?}")]
    HeaderName {
        name: String,
        #[source]
        source: reqwest::header::InvalidHeaderName,
    },
    #[error("encoding the {procedure} request")]
    Encode {
        procedure: &'static str,
        #[source]
        source: CodecError,
    },
    #[error("calling {procedure}")]
    Transport {
        procedure: &'static str,
        #[source]
        source: reqwest::Error,
    },
    /// A failure outside the protocol (a proxy's 502, say), with the start of its body.
    #[error("{procedure} answered HTTP {status}: {body}")]
    Http {
        procedure: &'static str,
        status: StatusCode,
        body: String,
    },
    /// The agent refused or failed the call (a unary error, or an end-of-stream error).
    #[error("{procedure} failed")]
    Rpc {
        procedure: &'static str,
        #[source]
        source: ConnectError,
    },
    #[error("reading the {procedure} response")]
    Read {
        procedure: &'static str,
        #[source]
        source: reqwest::Error,
    },
    #[error("decoding the {procedure} response")]
    Decode {
        procedure: &'static str,
        #[source]
        source: CodecError,
    },
    #[error("the {procedure} response is larger than {max} bytes")]
    ResponseTooLarge { procedure: &'static str, max: usize },
    #[error("the {procedure} stream ended without its end-of-stream message ({leftover} bytes left over)")]
    Truncated {
        procedure: &'static str,
        leftover: usize,
    },
}

impl Error {
    /// The agent's own error, when the call reached it and it answered with one.
    pub fn rpc(&self) -> Option<&ConnectError> {
        match self {
            Error::Rpc { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Per-call settings.
#[derive(Debug, Clone, Default)]
pub struct CallOptions {
    user: Option<String>,
    timeout: Option<Duration>,
    keepalive: Option<Duration>,
    max_message: Option<usize>,
}

impl CallOptions {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs the call as `user` (HTTP Basic with an empty password, as envd takes it); the
    /// agent's default user otherwise.
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self
    }

    /// Gives up on the whole call (a stream: until its last byte) after `timeout`.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Asks a stream for keepalive events after this much silence (whole seconds), so proxies
    /// do not close a quiet stream.
    pub fn keepalive_ping_interval(mut self, interval: Duration) -> Self {
        self.keepalive = Some(interval);
        self
    }

    /// The largest message accepted (a stream's first ones: see [`EventStream::set_max_message`]).
    pub fn max_message(mut self, bytes: usize) -> Self {
        self.max_message = Some(bytes);
        self
    }
}

/// An agent reached at `base` (`http://10.11.0.2:49983`, or a proxy that routes by header),
/// with headers sent on every call.
#[derive(Debug, Clone)]
pub struct AgentClient {
    http: reqwest::Client,
    base: String,
    headers: HeaderMap,
}

impl AgentClient {
    pub fn new(http: reqwest::Client, base: impl Into<String>) -> Self {
        let mut base = base.into();
        while base.ends_with('/') {
            base.pop();
        }
        Self {
            http,
            base,
            headers: HeaderMap::new(),
        }
    }

    /// An agent listening at `addr`, spoken to directly.
    pub fn at(http: reqwest::Client, addr: SocketAddr) -> Self {
        Self::new(http, format!("http://{addr}"))
    }

    /// Sends the sandbox's access token (`X-Access-Token`) on every call.
    pub fn with_access_token(self, token: &str) -> Result<Self, Error> {
        self.with_header(ACCESS_TOKEN_HEADER, token)
    }

    /// Sends `name: value` on every call (a proxy's routing headers, say).
    pub fn with_header(mut self, name: &str, value: &str) -> Result<Self, Error> {
        let key = HeaderName::from_bytes(name.as_bytes()).map_err(|source| Error::HeaderName {
            name: name.to_string(),
            source,
        })?;
        let mut value = HeaderValue::from_str(value).map_err(|source| Error::HeaderValue {
            name: name.to_string(),
            source,
        })?;
        value.set_sensitive(key.as_str() == ACCESS_TOKEN_HEADER);
        self.headers.insert(key, value);
        Ok(self)
    }

    /// The `process.Process` service.
    pub fn process(&self) -> ProcessClient<'_> {
        ProcessClient { agent: self }
    }

    fn request(
        &self,
        procedure: &'static str,
        content_type: &'static str,
        opts: &CallOptions,
    ) -> Result<reqwest::RequestBuilder, Error> {
        let mut req = self
            .http
            .post(format!("{}/{procedure}", self.base))
            .headers(self.headers.clone())
            .header(CONTENT_TYPE, content_type)
            .header("connect-protocol-version", "1");
        if let Some(user) = &opts.user {
            let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:"));
            let mut value = HeaderValue::from_str(&format!("Basic {basic}")).map_err(|source| {
                Error::HeaderValue {
                    name: AUTHORIZATION.to_string(),
                    source,
                }
            })?;
            value.set_sensitive(true);
            req = req.header(AUTHORIZATION, value);
        }
        if let Some(timeout) = opts.timeout {
            req = req.timeout(timeout);
        }
        if let Some(interval) = opts.keepalive {
            req = req.header(
                "keepalive-ping-interval",
                interval.as_secs().max(1).to_string(),
            );
        }
        Ok(req)
    }

    /// Sends `req`; a response other than 2xx becomes the agent's [`ConnectError`] when its body
    /// is one, else [`Error::Http`].
    async fn send(
        procedure: &'static str,
        req: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, Error> {
        let mut resp = req
            .send()
            .await
            .map_err(|source| Error::Transport { procedure, source })?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let body = read_bounded(procedure, &mut resp, MAX_ERROR_BODY)
            .await
            .unwrap_or_else(|e| e.to_string().into_bytes());
        match serde_json::from_slice::<ConnectError>(&body) {
            Ok(source) => Err(Error::Rpc { procedure, source }),
            Err(_) => Err(Error::Http {
                procedure,
                status,
                body: String::from_utf8_lossy(&body).into_owned(),
            }),
        }
    }

    /// A unary call: one JSON message each way.
    pub async fn unary<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        procedure: &'static str,
        request: &Req,
        opts: &CallOptions,
    ) -> Result<Resp, Error> {
        let body = serde_json::to_vec(request).map_err(|e| Error::Encode {
            procedure,
            source: CodecError::Encode(e),
        })?;
        let req = self
            .request(procedure, UNARY_CONTENT_TYPE, opts)?
            .body(body);
        let mut resp = Self::send(procedure, req).await?;
        let max = opts.max_message.unwrap_or(MAX_UNARY_RESPONSE);
        let body = read_bounded(procedure, &mut resp, max).await?;
        if body.len() > max {
            return Err(Error::ResponseTooLarge { procedure, max });
        }
        serde_json::from_slice(&body).map_err(|e| Error::Decode {
            procedure,
            source: CodecError::Malformed(e),
        })
    }

    /// A server-streaming call: one request message, then the stream of responses.
    pub async fn server_stream<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        procedure: &'static str,
        request: &Req,
        opts: &CallOptions,
    ) -> Result<EventStream<Resp>, Error> {
        let body = connect::encode_message(request)
            .map_err(|source| Error::Encode { procedure, source })?;
        let req = self
            .request(procedure, STREAM_CONTENT_TYPE, opts)?
            .body(body);
        let resp = Self::send(procedure, req).await?;
        Ok(EventStream {
            procedure,
            resp: Some(resp),
            decoder: Decoder::new(opts.max_message.unwrap_or(DEFAULT_MAX_FRAME)),
            done: false,
            _message: PhantomData,
        })
    }
}

/// Up to `max + 1` bytes of the body: one past the limit tells the caller it was exceeded.
async fn read_bounded(
    procedure: &'static str,
    resp: &mut reqwest::Response,
    max: usize,
) -> Result<Vec<u8>, Error> {
    let mut out = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|source| Error::Read { procedure, source })?
    {
        let room = (max + 1).saturating_sub(out.len());
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if out.len() > max {
            break;
        }
    }
    Ok(out)
}

/// The messages of a server stream, read as they arrive. Dropping it closes the stream (the
/// agent's process keeps running: it belongs to the agent, not to the call).
pub struct EventStream<T> {
    procedure: &'static str,
    resp: Option<reqwest::Response>,
    decoder: Decoder,
    done: bool,
    _message: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for EventStream<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStream")
            .field("procedure", &self.procedure)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl<T: DeserializeOwned> EventStream<T> {
    /// The largest message accepted from now on (say, a small one until a start event, then
    /// larger output events).
    pub fn set_max_message(&mut self, bytes: usize) {
        self.decoder.set_max_frame(bytes);
    }

    /// The next message; `None` after a clean end of stream, [`Error::Rpc`] for an
    /// end-of-stream error. Cancel-safe: a call dropped before it resolves loses nothing, so
    /// it can sit in a `select!`.
    pub async fn next(&mut self) -> Result<Option<T>, Error> {
        let procedure = self.procedure;
        loop {
            if self.done {
                return Ok(None);
            }
            match self
                .decoder
                .next_frame::<T>()
                .map_err(|source| Error::Decode { procedure, source })?
            {
                Some(Frame::Message(msg)) => return Ok(Some(msg)),
                Some(Frame::End(result)) => {
                    self.done = true;
                    self.resp = None;
                    return result
                        .map(|()| None)
                        .map_err(|source| Error::Rpc { procedure, source });
                }
                None => {}
            }
            let Some(resp) = self.resp.as_mut() else {
                return Ok(None);
            };
            match resp
                .chunk()
                .await
                .map_err(|source| Error::Read { procedure, source })?
            {
                Some(chunk) => self.decoder.push(&chunk),
                None => {
                    self.done = true;
                    self.resp = None;
                    return Err(Error::Truncated {
                        procedure,
                        leftover: self.decoder.buffered(),
                    });
                }
            }
        }
    }

    /// The same messages as a [`Stream`]; it ends after the first error.
    pub fn into_stream(self) -> impl Stream<Item = Result<T, Error>> {
        futures::stream::unfold(Some(self), |state| async move {
            let mut stream = state?;
            match stream.next().await {
                Ok(Some(msg)) => Some((Ok(msg), Some(stream))),
                Ok(None) => None,
                Err(e) => Some((Err(e), None)),
            }
        })
    }
}

/// The `process.Process` service of an agent.
#[derive(Debug, Clone, Copy)]
pub struct ProcessClient<'a> {
    agent: &'a AgentClient,
}

impl ProcessClient<'_> {
    /// Starts a process; the stream carries its start, output and end events.
    pub async fn start(
        &self,
        request: &process::StartRequest,
        opts: &CallOptions,
    ) -> Result<EventStream<process::StartResponse>, Error> {
        self.agent
            .server_stream("process.Process/Start", request, opts)
            .await
    }

    /// Attaches to a running process's events.
    pub async fn connect(
        &self,
        request: &process::ConnectRequest,
        opts: &CallOptions,
    ) -> Result<EventStream<process::ConnectResponse>, Error> {
        self.agent
            .server_stream("process.Process/Connect", request, opts)
            .await
    }

    pub async fn list(&self, opts: &CallOptions) -> Result<process::ListResponse, Error> {
        self.agent
            .unary("process.Process/List", &process::ListRequest {}, opts)
            .await
    }

    pub async fn send_input(
        &self,
        request: &process::SendInputRequest,
        opts: &CallOptions,
    ) -> Result<process::SendInputResponse, Error> {
        self.agent
            .unary("process.Process/SendInput", request, opts)
            .await
    }

    pub async fn send_signal(
        &self,
        request: &process::SendSignalRequest,
        opts: &CallOptions,
    ) -> Result<process::SendSignalResponse, Error> {
        self.agent
            .unary("process.Process/SendSignal", request, opts)
            .await
    }

    /// Resizes a process's PTY.
    pub async fn update(
        &self,
        request: &process::UpdateRequest,
        opts: &CallOptions,
    ) -> Result<process::UpdateResponse, Error> {
        self.agent
            .unary("process.Process/Update", request, opts)
            .await
    }

    pub async fn close_stdin(
        &self,
        request: &process::CloseStdinRequest,
        opts: &CallOptions,
    ) -> Result<process::CloseStdinResponse, Error> {
        self.agent
            .unary("process.Process/CloseStdin", request, opts)
            .await
    }
}

/// Selects the process with this pid.
pub fn pid(pid: u32) -> Option<process::ProcessSelector> {
    Some(process::ProcessSelector {
        selector: Some(process::process_selector::Selector::Pid(pid)),
    })
}

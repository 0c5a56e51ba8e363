//! Bodies through the sandbox proxy: responses cut when their sandbox dies, and requests
//! whose end the proxy waits for before it answers with a refusal.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyStream, StreamBody};
use hyper::body::{Body as _, Frame, SizeHint};
use tokio_util::sync::CancellationToken;

/// The response body, streamed frame by frame; cut with an error (no clean end of stream)
/// when the sandbox is killed or its side of the stream breaks. An HTTP/1 client's
/// connection then ends with a reset (see [`crate::listener::ConnectionSocket`]).
pub(crate) fn cancellable(
    body: hyper::body::Incoming,
    cancel: CancellationToken,
    socket: Option<crate::listener::ConnectionSocket>,
) -> Body {
    let frames = BodyStream::new(body);
    let stream = futures::stream::unfold(Some((frames, cancel)), move |state| {
        let socket = socket.clone();
        async move {
            let (mut frames, cancel) = state?;
            let broken = |e: std::io::Error| {
                if let Some(s) = &socket {
                    s.reset_on_close();
                }
                Some((Err(e), None))
            };
            tokio::select! {
                biased;
                _ = cancel.cancelled() => broken(std::io::Error::other("sandbox was killed")),
                next = frames.next() => match next {
                    Some(Ok(frame)) => Some((Ok::<Frame<Bytes>, std::io::Error>(frame), Some((frames, cancel)))),
                    Some(Err(e)) => broken(std::io::Error::other(e)),
                    None => None,
                },
            }
        }
    });
    Body::new(StreamBody::new(stream))
}

/// Whether a request's body has been sent on in full, or never will be (failed, dropped).
#[derive(Default)]
pub(crate) struct Sent {
    done: AtomicBool,
    notify: tokio::sync::Notify,
}

impl Sent {
    fn set(&self) {
        self.done.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// Waits until the body is sent on in full, at most `limit`.
    pub(crate) async fn wait(&self, limit: Duration) {
        let _ = tokio::time::timeout(limit, async {
            loop {
                let notified = self.notify.notified();
                if self.done.load(Ordering::Acquire) {
                    return;
                }
                notified.await;
            }
        })
        .await;
    }
}

/// `req` with a body that reports when it has been read to its end.
pub(crate) fn track_request(req: Request) -> (Request, Arc<Sent>) {
    let sent = Arc::new(Sent::default());
    let (parts, inner) = req.into_parts();
    if inner.is_end_stream() {
        sent.set();
    }
    let body = Body::new(Tracked {
        inner,
        sent: sent.clone(),
    });
    (Request::from_parts(parts, body), sent)
}

struct Tracked {
    inner: Body,
    sent: Arc<Sent>,
}

/// A body dropped unfinished (the sandbox closed the connection) will not be sent on either.
impl Drop for Tracked {
    fn drop(&mut self) {
        self.sent.set();
    }
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) || self.inner.is_end_stream() {
            self.sent.set();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

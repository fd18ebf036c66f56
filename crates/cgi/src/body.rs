//! A response body of `serve`: complete, or a tunnel's pieces as they
//! come, or complete with work to run once it is sent (a new route's
//! population). Shared by everything that answers under `serve`
//! (`serve.rs`, `streams.rs`, `metrics_http.rs`), below all of them.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::StatusCode;
use hyper::body::{Frame, SizeHint};
use tokio::sync::mpsc;

use crate::handler::AfterReply;

/// What `Retry-After` says when a cap of `serve` is reached, in seconds.
pub const RETRY_AFTER_SECS: u32 = 5;

/// A response body: complete, or the pieces of a tunnel as they come.
pub enum Body {
    /// A complete body (taken when sent).
    Full(Option<Bytes>),
    /// A tunnel's pieces; the tunnel's task holds the sender, and the body
    /// ends when it is dropped.
    Stream(mpsc::Receiver<Bytes>),
    /// A complete body with what is to run once it is sent (started, a
    /// moment later, when hyper is done with the body).
    Then(Option<Bytes>, Option<AfterReply>),
    /// A held tunnel's: none, of unknown length, so that hyper writes the
    /// head of a streamed response; the tunnel's task writes the rest
    /// (crate::serve_held).
    HandOff(Option<std::sync::Arc<crate::serve_held::HandOff>>),
}

impl Drop for Body {
    fn drop(&mut self) {
        let Body::Then(_, after) = self else { return };
        let Some(after) = after.take() else { return };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    // The reply's last bytes leave with hyper's next flush.
                    tokio::time::sleep(AFTER_REPLY_MARGIN).await;
                    let _ = tokio::task::spawn_blocking(move || after.run()).await;
                });
            }
            Err(_) => after.run(),
        }
    }
}

/// How long after hyper has taken a reply's body its deferred work starts.
const AFTER_REPLY_MARGIN: Duration = Duration::from_millis(20);

impl Body {
    pub(crate) fn full(bytes: Vec<u8>) -> Body {
        Body::Full(Some(Bytes::from(bytes)))
    }

    pub(crate) fn empty() -> Body {
        Body::Full(None)
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Body::Full(bytes) | Body::Then(bytes, _) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Body::Stream(rx) => rx.poll_recv(cx).map(|piece| piece.map(|b| Ok(Frame::data(b)))),
            Body::HandOff(handoff) => {
                if let Some(handoff) = handoff.take() {
                    handoff.body_ended();
                }
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Body::Full(None) | Body::Then(None, _))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(Some(b)) | Body::Then(Some(b), _) => SizeHint::with_exact(b.len() as u64),
            Body::Full(None) | Body::Then(None, _) => SizeHint::with_exact(0),
            Body::Stream(_) | Body::HandOff(_) => SizeHint::default(),
        }
    }
}

/// A `text/plain` answer of `text`, made for this request.
pub(crate) fn plain_owned(code: StatusCode, text: String) -> hyper::Response<Body> {
    let length = text.len();
    let mut reply = hyper::Response::new(Body::full(text.into_bytes()));
    *reply.status_mut() = code;
    reply.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    reply.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(length));
    reply
}

/// A `text/plain` answer of a fixed `text`.
pub(crate) fn plain(code: StatusCode, text: &'static str) -> hyper::Response<Body> {
    let mut reply = hyper::Response::new(Body::full(text.as_bytes().to_vec()));
    *reply.status_mut() = code;
    reply.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    reply.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(text.len()));
    reply
}

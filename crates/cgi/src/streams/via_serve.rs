//! Durable Streams in `serve`: requests answered on the blocking pool,
//! long-polls and SSE responses followed as tasks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use kn_streams::Streams;

use super::*;
use crate::body::Body;

/// Answers a stream request in `serve`: the work runs on the blocking
/// pool; a long-poll or an SSE response waits as a task (a `Future`), no
/// thread held while idle.
///
/// `user` is who makes it (`None`: anonymous), as `serve` identified it;
/// the body, while it is held, takes its share of `budget`.
pub(crate) async fn respond(
    streams: Arc<Streams>,
    request: hyper::Request<Incoming>,
    local: std::net::SocketAddr,
    user: Option<String>,
    budget: &crate::serve_body::BodyBudget,
) -> hyper::Response<Body> {
    let (parts, mut incoming) = request.into_parts();
    let max = streams.streams_config().max_append_bytes;
    // A body over the limit is read to its end (up to DRAIN_BYTES more)
    // and dropped before the 413 goes out: a client still sending would
    // otherwise see its connection reset instead of the answer.
    let announced = parts.headers.get(hyper::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    let mut body = Vec::new();
    let mut seen: u64 = 0;
    let hopeless = announced.is_some_and(|n| n > max as u64 + DRAIN_BYTES);
    // The body's share of the budget across all requests: what is
    // announced before reading, what arrives beyond it as it does.
    let mut held = crate::serve_body::Held::default();
    if let (Some(n), false) = (announced, hopeless) {
        if let Err(refused) = budget.hold(&mut held, n.min(max as u64)) {
            return budget_refusal(refused);
        }
    }
    // A body announced far beyond the limit is refused unread.
    if !hopeless {
        loop {
            match incoming.frame().await {
                None => break,
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        seen += data.len() as u64;
                        if seen <= max as u64 {
                            if let Err(refused) = budget.hold(&mut held, seen) {
                                return budget_refusal(refused);
                            }
                            body.extend_from_slice(data);
                        } else if seen > max as u64 + DRAIN_BYTES {
                            break;
                        }
                    }
                }
                Some(Err(err)) => return to_hyper(StreamResponse::text(400, &format!("cannot read the request body: {err}")), false),
            }
        }
    }
    if hopeless || seen > max as u64 {
        let length = announced.unwrap_or(seen);
        let e = StreamError::new(StreamErrorKind::TooLarge, format!("a body of {length} bytes is larger than the limit of {max}"));
        let mut r = to_hyper(failure(&e), false);
        r.headers_mut().insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
        return r;
    }
    let raw_path = parts.uri.path();
    let path = percent_decode(raw_path.strip_prefix(PREFIX).unwrap_or(""));
    let url = if parts.method == hyper::Method::PUT {
        let host = parts.headers.get(hyper::header::HOST).and_then(|v| v.to_str().ok()).map(str::to_owned).unwrap_or_else(|| local.to_string());
        format!("http://{host}{raw_path}")
    } else {
        String::new()
    };
    let req = StreamRequest {
        method: parts.method.as_str().to_owned(),
        path,
        query: parts.uri.query().unwrap_or("").to_owned(),
        headers: parts.headers,
        body,
        url,
        user,
    };
    let head = req.method == "HEAD";
    // A read answered from memory, or an append made without waiting,
    // needs no blocking thread.
    if let Some(r) = handle_cached(&streams, &req) {
        return to_hyper(r, head);
    }
    let s = streams.clone();
    let outcome = match tokio::task::spawn_blocking(move || handle(&s, &req)).await {
        Ok(o) => o,
        Err(_) => return to_hyper(StreamResponse::text(500, "the stream handler failed (a bug: please report it)"), head),
    };
    match outcome {
        Outcome::Done(r) => to_hyper(r, head),
        Outcome::Wait(poll) => to_hyper(long_poll(streams, poll).await, head),
        Outcome::Sse(mut sse) => {
            let (tx, rx) = tokio::sync::mpsc::channel(8);
            let reply = to_hyper_body(&mut sse.head, Body::Stream(rx));
            tokio::spawn(follow_sse(streams, sse, tx));
            reply
        }
    }
}

/// The answer to a body the budget across requests cannot hold.
fn budget_refusal(refused: crate::serve_body::Refused) -> hyper::Response<Body> {
    use crate::serve_body::Refused;
    let mut r = match refused {
        Refused::TooLarge(m) => StreamResponse::text(413, &m),
        Refused::Busy(m) => StreamResponse::text(503, &m),
        Refused::Unreadable(m) => StreamResponse::text(400, &m),
    };
    if r.status == 503 {
        r.set("Retry-After", crate::body::RETRY_AFTER_SECS.to_string());
    }
    let mut reply = to_hyper(r, false);
    reply.headers_mut().insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
    reply
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

/// Waits for whichever comes first: a change, the poll interval, `left`.
async fn wake(watch: &kn_streams::StreamWatch, listeners: Vec<event_listener::EventListener>, left: Duration) {
    let nap = tokio::time::sleep(left.min(watch.poll_interval()));
    let mut listeners = listeners.into_iter();
    let first = listeners.next();
    let second = listeners.next();
    tokio::select! {
        _ = nap => {}
        _ = async { match first { Some(l) => l.await, None => std::future::pending().await } } => {}
        _ = async { match second { Some(l) => l.await, None => std::future::pending().await } } => {}
    }
}

async fn long_poll(streams: Arc<Streams>, poll: LongPoll) -> StreamResponse {
    let poll = Arc::new(poll);
    let (s, p) = (streams.clone(), poll.clone());
    let Some(Ok(watch)) = blocking(move || s.watch(p.path())).await else {
        return StreamResponse::text(500, "cannot watch the stream");
    };
    loop {
        let listeners = watch.listen();
        let (s, p) = (streams.clone(), poll.clone());
        match blocking(move || p.poll(&s)).await {
            Some(Some(r)) => return r,
            Some(None) => {}
            None => return StreamResponse::text(500, "the stream handler failed (a bug: please report it)"),
        }
        let left = poll.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let (s, p) = (streams.clone(), poll.clone());
            return blocking(move || p.timeout(&s)).await.unwrap_or_else(|| StreamResponse::text(500, "the stream handler failed"));
        }
        wake(&watch, listeners, left).await;
    }
}

async fn follow_sse(streams: Arc<Streams>, sse: Sse, tx: tokio::sync::mpsc::Sender<Bytes>) {
    let sse = Arc::new(std::sync::Mutex::new(sse));
    let (s, p) = (streams.clone(), sse.clone());
    let path = sse.lock().map(|x| x.path().to_owned()).unwrap_or_default();
    let Some(Ok(watch)) = blocking(move || s.watch(&path)).await else { return };
    let _ = p;
    loop {
        let listeners = watch.listen();
        let (s, p) = (streams.clone(), sse.clone());
        let Some((bytes, finished, behind, deadline)) = blocking(move || {
            let mut sse = p.lock().unwrap_or_else(|e| e.into_inner());
            let (bytes, finished) = sse.step(&s);
            let behind = !bytes.is_empty() && !finished && sse.behind(&s);
            (bytes, finished, behind, sse.deadline)
        })
        .await
        else {
            return;
        };
        if !bytes.is_empty() && tx.send(Bytes::from(bytes)).await.is_err() {
            return;
        }
        if finished {
            return;
        }
        if behind {
            continue;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        tokio::select! {
            _ = wake(&watch, listeners, left) => {}
            _ = tx.closed() => return,
        }
    }
}

fn to_hyper(mut r: StreamResponse, head: bool) -> hyper::Response<Body> {
    let body = if head || r.status == 204 || r.status == 304 { Body::Full(None) } else { Body::Full(Some(std::mem::take(&mut r.body))) };
    to_hyper_body(&mut r, body)
}

/// The response `r` (its headers taken) with `body`.
fn to_hyper_body(r: &mut StreamResponse, body: Body) -> hyper::Response<Body> {
    let mut reply = hyper::Response::new(body);
    *reply.status_mut() = hyper::StatusCode::from_u16(r.status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    let headers = reply.headers_mut();
    headers.reserve(r.headers.len());
    for (n, v) in r.headers.drain(..) {
        // Through the one rule of every header (crate::response); neither
        // kind of value is copied: the static ones are this module's
        // literals; a built one gives its buffer.
        if let (Some(n), true) = (header_name(n), crate::response::is_field_name(n)) {
            headers.append(n, crate::response::hyper_value(v));
        }
    }
    reply
}


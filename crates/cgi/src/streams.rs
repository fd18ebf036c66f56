//! The Durable Streams front door: `<base>/v1/stream/<path>`
//! (docs/DURABLE-STREAMS.md), in `serve` and in `pubsub.cgi`.
//!
//! This module turns HTTP requests into calls of
//! [`kn_streams::Streams`] and its answers into HTTP responses,
//! with no stream rule of its own. A request is answered at once
//! ([`Outcome::Done`]) or, for live reads, becomes a plan the transport
//! follows: a long-poll ([`LongPoll`]) that waits for a change and asks
//! again, or an SSE response ([`Sse`]) that sends what each step reads.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use kn_streams::{
    is_json, offset, parse_start, Append, Chunk, Create, Info, Producer, Start, StreamError, StreamErrorKind, Streams,
};

use crate::serve::Body;

/// Where streams are mounted, below the server's base.
pub const PREFIX: &str = "/v1/stream/";

/// The response headers browsers may read (CORS).
const EXPOSED: &str = "Stream-Next-Offset, Stream-Cursor, Stream-Up-To-Date, Stream-Closed, Stream-TTL, Stream-Expires-At, \
Stream-SSE-Data-Encoding, Producer-Epoch, Producer-Seq, Producer-Expected-Seq, Producer-Received-Seq, ETag, Location, Content-Type, Kn-Bridge-Error, Kn-Topic";

/// The request headers browsers may send (CORS preflight).
const ALLOWED: &str = "Content-Type, Stream-TTL, Stream-Expires-At, Stream-Seq, Stream-Closed, Stream-Forked-From, Stream-Fork-Offset, \
Stream-Fork-Sub-Offset, Producer-Id, Producer-Epoch, Producer-Seq, If-None-Match, Kn-Topic, Authorization";

/// Every response header this module sets, in canonical case, with its
/// `HeaderName` for `serve` (made once, at compile time: no allocation
/// per response).
pub static HEADER_NAMES: [(&str, HeaderName); 25] = [
    ("X-Content-Type-Options", hyper::header::X_CONTENT_TYPE_OPTIONS),
    ("Cross-Origin-Resource-Policy", HeaderName::from_static("cross-origin-resource-policy")),
    ("Access-Control-Allow-Origin", hyper::header::ACCESS_CONTROL_ALLOW_ORIGIN),
    ("Access-Control-Expose-Headers", hyper::header::ACCESS_CONTROL_EXPOSE_HEADERS),
    ("Content-Type", hyper::header::CONTENT_TYPE),
    ("Stream-Next-Offset", HeaderName::from_static("stream-next-offset")),
    ("Stream-Up-To-Date", HeaderName::from_static("stream-up-to-date")),
    ("Stream-Closed", HeaderName::from_static("stream-closed")),
    ("Stream-Cursor", HeaderName::from_static("stream-cursor")),
    ("Cache-Control", hyper::header::CACHE_CONTROL),
    ("ETag", hyper::header::ETAG),
    ("Producer-Epoch", HeaderName::from_static("producer-epoch")),
    ("Producer-Seq", HeaderName::from_static("producer-seq")),
    ("Producer-Expected-Seq", HeaderName::from_static("producer-expected-seq")),
    ("Producer-Received-Seq", HeaderName::from_static("producer-received-seq")),
    ("Stream-TTL", HeaderName::from_static("stream-ttl")),
    ("Stream-Expires-At", HeaderName::from_static("stream-expires-at")),
    ("Stream-SSE-Data-Encoding", HeaderName::from_static("stream-sse-data-encoding")),
    ("Location", hyper::header::LOCATION),
    ("Kn-Bridge-Error", HeaderName::from_static("kn-bridge-error")),
    ("Kn-Topic", HeaderName::from_static("kn-topic")),
    ("Allow", hyper::header::ALLOW),
    ("Access-Control-Allow-Methods", hyper::header::ACCESS_CONTROL_ALLOW_METHODS),
    ("Access-Control-Allow-Headers", hyper::header::ACCESS_CONTROL_ALLOW_HEADERS),
    ("Access-Control-Max-Age", hyper::header::ACCESS_CONTROL_MAX_AGE),
];

/// The `HeaderName` of a header this module sets.
fn header_name(name: &str) -> Option<HeaderName> {
    match HEADER_NAMES.iter().find(|(n, _)| *n == name) {
        Some((_, h)) => Some(h.clone()),
        None => HeaderName::from_bytes(name.as_bytes()).ok(),
    }
}

/// How much of a body over `Config::stream_max_append_bytes` is read and
/// dropped before answering `413` (beyond it the connection is closed).
const DRAIN_BYTES: u64 = 64 << 20;

/// How often an idle SSE response of a CGI process writes a comment (see
/// `serve_cgi`).
const SSE_KEEPALIVE: Duration = Duration::from_secs(1);

/// The largest integer a producer header may carry (JavaScript's safe
/// integers).
const MAX_SAFE: u64 = (1 << 53) - 1;

/// A stream request, whatever the transport.
#[derive(Clone, Debug, Default)]
pub struct StreamRequest {
    /// The HTTP method.
    pub method: String,
    /// The stream path: what follows `/v1/stream/`, percent-decoded.
    pub path: String,
    /// The raw query string.
    pub query: String,
    /// The request headers.
    pub headers: HeaderMap,
    /// The body.
    pub body: Vec<u8>,
    /// The URL of the stream as the client named it (for the `Location`
    /// of a `PUT`'s answer; `serve` fills it in for a `PUT` only).
    pub url: String,
}

impl StreamRequest {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| std::str::from_utf8(v.as_bytes()).ok()).map(str::trim)
    }

    fn param(&self, name: &str) -> Option<String> {
        self.query.split('&').filter_map(|kv| kv.split_once('=').or(Some((kv, "")))).find(|(k, _)| *k == name).map(|(_, v)| percent_decode(v))
    }
}

/// Decodes `%XX` escapes (`+` is not a space: offsets never contain one);
/// a `%` not followed by two hex digits stays as it is, and bytes that are
/// not UTF-8 become U+FFFD.
pub fn percent_decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text).decode_utf8_lossy().into_owned()
}

/// A complete response.
#[derive(Clone, Debug)]
pub struct StreamResponse {
    /// Status code.
    pub status: u16,
    /// Headers (names in canonical case, one of [`HEADER_NAMES`]).
    pub headers: Vec<(&'static str, Cow<'static, str>)>,
    /// Body (none is sent for `HEAD`).
    pub body: Bytes,
}

impl StreamResponse {
    fn new(status: u16) -> StreamResponse {
        let mut r = StreamResponse { status, headers: Vec::new(), body: Bytes::new() };
        r.set("X-Content-Type-Options", "nosniff");
        r.set("Cross-Origin-Resource-Policy", "cross-origin");
        r.set("Access-Control-Allow-Origin", "*");
        r.set("Access-Control-Expose-Headers", EXPOSED);
        r
    }

    fn set(&mut self, name: &'static str, value: impl Into<Cow<'static, str>>) -> &mut StreamResponse {
        self.headers.push((name, value.into()));
        self
    }

    fn text(status: u16, message: &str) -> StreamResponse {
        let mut r = StreamResponse::new(status);
        r.set("Content-Type", "text/plain; charset=utf-8");
        r.body = format!("{message}\n").into_bytes().into();
        r
    }

    /// The reason phrase of the status.
    pub fn reason(&self) -> &'static str {
        reason(self.status)
    }

    /// The response as a CGI program writes it (`Status:` line first).
    pub fn to_cgi_bytes(&self, head: bool) -> Vec<u8> {
        let mut out = format!("Status: {} {}\r\n", self.status, self.reason()).into_bytes();
        for (n, v) in &self.headers {
            out.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
        }
        if !self.headers.iter().any(|(n, _)| *n == "Content-Type") && self.status != 204 && self.status != 304 {
            // Apache would add its default type otherwise.
            out.extend_from_slice(b"Content-Type: application/octet-stream\r\n");
        }
        if self.status != 204 && self.status != 304 {
            out.extend_from_slice(format!("Content-Length: {}\r\n", self.body.len()).as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        if !head && self.status != 204 && self.status != 304 {
            out.extend_from_slice(&self.body);
        }
        out
    }
}

/// The reason phrase of the statuses this module answers with.
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        304 => "Not Modified",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        410 => "Gone",
        413 => "Payload Too Large",
        429 => "Too Many Requests",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        507 => "Insufficient Storage",
        _ => "Internal Server Error",
    }
}

/// What a request comes to.
pub enum Outcome {
    /// Answered.
    Done(StreamResponse),
    /// A long-poll with nothing to return yet: wait, then [`LongPoll::poll`].
    Wait(LongPoll),
    /// An SSE response: send [`Sse::head`], then what each
    /// [`Sse::step`] returns.
    Sse(Sse),
}

/// A waiting long-poll.
pub struct LongPoll {
    path: String,
    from: u64,
    cursor: Option<String>,
    /// When to give up and answer `204`.
    pub deadline: Instant,
}

/// An SSE response in progress.
pub struct Sse {
    path: String,
    next: u64,
    cursor: Option<String>,
    base64: bool,
    /// The response head (status 200 and headers).
    pub head: StreamResponse,
    /// When to end the response (the client reconnects).
    pub deadline: Instant,
    started: bool,
}

/// The current cursor interval (20 s intervals since 2024-10-09), moved
/// past the client's `cursor` when that is not behind (Durable Streams
/// 10.1: cursors never go backwards).
fn next_cursor(client: Option<&str>) -> String {
    const EPOCH: u64 = 1_728_432_000;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let interval = now.as_secs().saturating_sub(EPOCH) / 20;
    match client.and_then(|c| c.parse::<u64>().ok()) {
        Some(c) if c >= interval => c.saturating_add(1 + u64::from(now.subsec_nanos()) % 180),
        _ => interval,
    }
    .to_string()
}

/// Handles one stream request.
pub fn handle(streams: &Streams, req: &StreamRequest) -> Outcome {
    match run(streams, req) {
        Ok(o) => o,
        Err(e) => Outcome::Done(failure(&e)),
    }
}

fn bad(message: impl Into<String>) -> StreamError {
    StreamError::new(StreamErrorKind::BadRequest, message)
}

fn run(streams: &Streams, req: &StreamRequest) -> Result<Outcome, StreamError> {
    let path = req.path.as_str();
    if path.split('/').next() == Some("__ds") {
        return Ok(Outcome::Done(StreamResponse::text(501, "the subscription API (__ds) is not implemented")));
    }
    match req.method.as_str() {
        "OPTIONS" => Ok(Outcome::Done(preflight())),
        "PUT" => create(streams, req).map(Outcome::Done),
        "POST" => append(streams, req).map(Outcome::Done),
        "HEAD" => head(streams, path).map(Outcome::Done),
        "DELETE" => {
            streams.delete(path)?;
            Ok(Outcome::Done(StreamResponse::new(204)))
        }
        "GET" => read(streams, req),
        _ => {
            let mut r = StreamResponse::text(405, "method not allowed on a stream");
            r.set("Allow", "GET, HEAD, PUT, POST, DELETE, OPTIONS");
            Ok(Outcome::Done(r))
        }
    }
}

fn preflight() -> StreamResponse {
    let mut r = StreamResponse::new(204);
    r.set("Access-Control-Allow-Methods", "GET, HEAD, PUT, POST, DELETE, OPTIONS");
    r.set("Access-Control-Allow-Headers", ALLOWED);
    r.set("Access-Control-Max-Age", "86400");
    r
}

/// The answer to a failed operation, with the headers the protocol wants.
pub fn failure(e: &StreamError) -> StreamResponse {
    let status = match e.kind() {
        StreamErrorKind::BadRequest => 400,
        StreamErrorKind::NotFound => 404,
        StreamErrorKind::Gone => 410,
        StreamErrorKind::Conflict | StreamErrorKind::Closed | StreamErrorKind::SequenceGap => 409,
        StreamErrorKind::StaleEpoch => 403,
        StreamErrorKind::TooLarge => 413,
        StreamErrorKind::Limit => 429,
        StreamErrorKind::Store(k) => kn_journal::ErrorKind::status(k).0,
    };
    let mut r = StreamResponse::text(status, e.message());
    if e.kind() == StreamErrorKind::Closed {
        r.set("Stream-Closed", "true");
    }
    if let Some(o) = &e.next_offset {
        r.set("Stream-Next-Offset", o.clone());
    }
    if let Some(epoch) = e.epoch {
        r.set("Producer-Epoch", epoch.to_string());
    }
    if let Some((expected, received)) = e.gap {
        r.set("Producer-Expected-Seq", expected.to_string());
        r.set("Producer-Received-Seq", received.to_string());
    }
    r
}

fn is_true(v: Option<&str>) -> bool {
    v.is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// A non-negative decimal integer without sign, leading zeros, point or
/// exponent.
fn strict_uint(v: &str) -> Option<u64> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) || (v.len() > 1 && v.starts_with('0')) {
        return None;
    }
    v.parse().ok()
}

fn with_info(r: &mut StreamResponse, info: &Info) {
    r.set("Stream-Next-Offset", info.next_offset());
    if info.closed {
        r.set("Stream-Closed", "true");
    }
}

fn create(streams: &Streams, req: &StreamRequest) -> Result<StreamResponse, StreamError> {
    let ttl = match req.header("Stream-TTL") {
        Some(v) => Some(strict_uint(v).ok_or_else(|| bad(format!("Stream-TTL '{v}' is not a non-negative integer")))?),
        None => None,
    };
    let fork_from = req.header("Stream-Forked-From").map(percent_decode);
    let fork_offset = match req.header("Stream-Fork-Offset") {
        Some(_) if fork_from.is_none() => return Err(bad("Stream-Fork-Offset needs Stream-Forked-From")),
        Some(v) => Some(match parse_start(v)? {
            Start::Beginning => 0,
            Start::At(o) => o,
            Start::Now => return Err(bad("Stream-Fork-Offset cannot be 'now'")),
        }),
        None => None,
    };
    let fork_sub_offset = match req.header("Stream-Fork-Sub-Offset") {
        Some(_) if fork_from.is_none() => return Err(bad("Stream-Fork-Sub-Offset needs Stream-Forked-From")),
        Some(v) => strict_uint(v).ok_or_else(|| bad(format!("Stream-Fork-Sub-Offset '{v}' is not a non-negative integer")))?,
        None => 0,
    };
    let create = Create {
        content_type: req.header("Content-Type").filter(|v| !v.is_empty()).map(str::to_owned),
        ttl,
        expires_at: req.header("Stream-Expires-At").map(str::to_owned),
        closed: is_true(req.header("Stream-Closed")),
        body: req.body.clone(),
        fork_from,
        fork_offset,
        fork_sub_offset,
        topic: req.header("Kn-Topic").map(bound_topic).transpose()?,
    };
    let created = streams.create(&req.path, &create)?;
    let mut r = StreamResponse::new(if created.created { 201 } else { 200 });
    r.set("Content-Type", created.info.content_type.clone());
    with_info(&mut r, &created.info);
    if created.created {
        r.set("Location", req.url.clone());
    }
    Ok(r)
}

/// A `Kn-Topic` value: an absolute topic name below the root (a relative
/// name would be resolved against nothing, and the root is no topic events
/// are posted to).
fn bound_topic(topic: &str) -> Result<String, StreamError> {
    match topic {
        "/" => Err(bad("Kn-Topic '/' names the root, which cannot be bound: name a topic, e.g. /what/chat")),
        t if !t.starts_with('/') => Err(bad(format!("Kn-Topic '{t}' is not an absolute topic name: start it with '/', e.g. /{t}"))),
        t => Ok(t.to_owned()),
    }
}

fn producer(req: &StreamRequest) -> Result<Option<Producer>, StreamError> {
    let (id, epoch, seq) = (req.header("Producer-Id"), req.header("Producer-Epoch"), req.header("Producer-Seq"));
    match (id, epoch, seq) {
        (None, None, None) => Ok(None),
        (Some(id), Some(epoch), Some(seq)) => {
            if id.is_empty() {
                return Err(bad("Producer-Id cannot be empty"));
            }
            let number = |name: &str, v: &str| {
                strict_uint(v).filter(|&n| n <= MAX_SAFE).ok_or_else(|| bad(format!("{name} '{v}' is not an integer from 0 to 2^53-1")))
            };
            Ok(Some(Producer { id: id.to_owned(), epoch: number("Producer-Epoch", epoch)?, seq: number("Producer-Seq", seq)? }))
        }
        _ => Err(bad("Producer-Id, Producer-Epoch and Producer-Seq go together")),
    }
}

fn append(streams: &Streams, req: &StreamRequest) -> Result<StreamResponse, StreamError> {
    let append = append_request(req)?;
    let done = streams.append(&req.path, &append)?;
    Ok(appended(req, append.producer.is_some(), done))
}

/// What a `POST` asks for.
fn append_request(req: &StreamRequest) -> Result<Append<'_>, StreamError> {
    Ok(Append {
        content_type: req.header("Content-Type").filter(|v| !v.is_empty()),
        body: &req.body,
        close: is_true(req.header("Stream-Closed")),
        stream_seq: req.header("Stream-Seq").map(str::as_bytes),
        producer: producer(req)?,
    })
}

/// The answer to a `POST` that `done`.
fn appended(req: &StreamRequest, has_producer: bool, done: kn_streams::Appended) -> StreamResponse {
    let status = if has_producer && done.stored && !req.body.is_empty() { 200 } else { 204 };
    let mut r = StreamResponse::new(status);
    with_info(&mut r, &done.info);
    if let Some((epoch, seq)) = done.producer {
        r.set("Producer-Epoch", epoch.to_string());
        r.set("Producer-Seq", seq.to_string());
    }
    if let Some(e) = done.bridge_error {
        r.set("Kn-Bridge-Error", e.replace(['\r', '\n'], " "));
    }
    r
}

fn head(streams: &Streams, path: &str) -> Result<StreamResponse, StreamError> {
    let info = streams.head(path)?;
    let mut r = StreamResponse::new(200);
    r.set("Content-Type", info.content_type.clone());
    with_info(&mut r, &info);
    if let Some(ttl) = info.ttl {
        r.set("Stream-TTL", ttl.to_string());
    }
    if let Some(at) = &info.expires_at {
        r.set("Stream-Expires-At", at.clone());
    }
    if let Some(topic) = &info.topic {
        r.set("Kn-Topic", topic.clone());
    }
    r.set("Cache-Control", "no-store");
    Ok(r)
}

fn read(streams: &Streams, req: &StreamRequest) -> Result<Outcome, StreamError> {
    let offsets: Vec<&str> = req.query.split('&').filter(|kv| kv.split('=').next() == Some("offset")).collect();
    if offsets.len() > 1 {
        return Err(bad("more than one offset"));
    }
    let start = match req.param("offset") {
        Some(o) if o.is_empty() => return Err(bad("an empty offset")),
        Some(o) => parse_start(&o)?,
        None => Start::Beginning,
    };
    let live = req.param("live");
    let cursor = req.param("cursor");
    let config = streams.store().config();
    match live.as_deref() {
        None => {}
        Some("long-poll") => {
            if req.param("offset").is_none() {
                return Err(bad("a long-poll needs an offset"));
            }
            let chunk = streams.read(&req.path, if start == Start::Now { Start::Now } else { start })?;
            if chunk.records > 0 {
                let mut r = catch_up(chunk, false);
                r.set("Stream-Cursor", next_cursor(cursor.as_deref()));
                return Ok(Outcome::Done(r));
            }
            if chunk.info.closed {
                return Ok(Outcome::Done(poll_timeout(&chunk.info, chunk.next, cursor.as_deref())));
            }
            return Ok(Outcome::Wait(LongPoll {
                path: req.path.clone(),
                from: chunk.next,
                cursor,
                deadline: Instant::now() + config.stream_long_poll,
            }));
        }
        Some("sse") => {
            if req.param("offset").is_none() {
                return Err(bad("SSE needs an offset"));
            }
            let info = streams.head(&req.path)?;
            let from = match start {
                Start::Beginning => 0,
                Start::Now => info.tail,
                Start::At(o) => o,
            };
            if from > info.tail {
                return Err(bad(format!("offset {} is beyond the tail {}", offset(from), info.next_offset())));
            }
            let base64 = !(is_json(&info.content_type) || kn_streams::essence(&info.content_type).starts_with("text/"));
            let mut head = StreamResponse::new(200);
            head.set("Content-Type", "text/event-stream");
            head.set("Cache-Control", "no-cache");
            if base64 {
                head.set("Stream-SSE-Data-Encoding", "base64");
            }
            return Ok(Outcome::Sse(Sse {
                path: req.path.clone(),
                next: from,
                cursor,
                base64,
                head,
                deadline: Instant::now() + config.stream_sse_max_time,
                started: false,
            }));
        }
        Some(other) => return Err(bad(format!("unknown live mode '{other}'"))),
    }
    let chunk = streams.read(&req.path, start)?;
    Ok(Outcome::Done(plain_read(chunk, req, start)))
}

/// The answer to a catch-up read (no live mode) of `chunk`.
fn plain_read(chunk: Chunk, req: &StreamRequest, start: Start) -> StreamResponse {
    let etag = etag(&chunk);
    if start != Start::Now && req.header("If-None-Match").is_some_and(|v| v.split(',').any(|t| t.trim() == etag)) {
        let mut r = StreamResponse::new(304);
        r.set("ETag", etag);
        with_offset(&mut r, &chunk);
        return r;
    }
    let mut r = catch_up(chunk, start == Start::Now);
    if start != Start::Now {
        r.set("ETag", etag);
    }
    r
}

/// The answer to a catch-up read that the store can give at once from
/// memory ([`Streams::read_cached`]), or to an append it can make at once
/// ([`Streams::append_nowait`]), the same as [`handle`]'s; `None` for
/// any other request: ask [`handle`].
pub fn handle_cached(streams: &Streams, req: &StreamRequest) -> Option<StreamResponse> {
    if req.path.split('/').next() == Some("__ds") {
        return None;
    }
    if req.method == "POST" {
        let append = append_request(req).ok()?;
        return Some(match streams.append_nowait(&req.path, &append)? {
            Ok(done) => appended(req, append.producer.is_some(), done),
            Err(e) => failure(&e),
        });
    }
    if req.method != "GET" || req.param("live").is_some() {
        return None;
    }
    if req.query.split('&').filter(|kv| kv.split('=').next() == Some("offset")).count() > 1 {
        return None;
    }
    let start = match req.param("offset") {
        Some(o) if o.is_empty() => return None,
        Some(o) => parse_start(&o).ok()?,
        None => Start::Beginning,
    };
    let chunk = streams.read_cached(&req.path, start)?;
    Some(plain_read(chunk, req, start))
}

fn etag(chunk: &Chunk) -> String {
    format!("\"{}:{}:{}{}\"", chunk.info.id, offset(chunk.start), offset(chunk.next), if chunk.closed() { ":c" } else { "" })
}

fn with_offset(r: &mut StreamResponse, chunk: &Chunk) {
    r.set("Stream-Next-Offset", offset(chunk.next));
    if chunk.up_to_date {
        r.set("Stream-Up-To-Date", "true");
    }
    if chunk.closed() {
        r.set("Stream-Closed", "true");
    }
}

fn catch_up(chunk: Chunk, now: bool) -> StreamResponse {
    let mut r = StreamResponse::new(200);
    r.set("Content-Type", chunk.info.content_type.clone());
    with_offset(&mut r, &chunk);
    r.set("Cache-Control", if now || chunk.up_to_date { "no-store" } else { "public, max-age=60, stale-while-revalidate=300" });
    r.body = chunk.into_body();
    r
}

fn poll_timeout(info: &Info, at: u64, cursor: Option<&str>) -> StreamResponse {
    let mut r = StreamResponse::new(204);
    r.set("Stream-Next-Offset", offset(at));
    r.set("Stream-Up-To-Date", "true");
    if info.closed && at >= info.tail {
        r.set("Stream-Closed", "true");
    } else {
        r.set("Stream-Cursor", next_cursor(cursor));
    }
    r.set("Cache-Control", "no-store");
    r
}

impl LongPoll {
    /// The stream's path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Reads again: the answer if there is one now (data, closed, gone),
    /// else `None` (keep waiting).
    pub fn poll(&self, streams: &Streams) -> Option<StreamResponse> {
        let chunk = match streams.read(&self.path, Start::At(self.from)) {
            Ok(c) => c,
            Err(e) => return Some(failure(&e)),
        };
        if chunk.records > 0 {
            let mut r = catch_up(chunk, false);
            r.set("Stream-Cursor", next_cursor(self.cursor.as_deref()));
            return Some(r);
        }
        if chunk.info.closed {
            return Some(poll_timeout(&chunk.info, chunk.next, self.cursor.as_deref()));
        }
        None
    }

    /// The answer at the deadline: `204` at the current tail.
    pub fn timeout(&self, streams: &Streams) -> StreamResponse {
        match streams.head(&self.path) {
            Ok(info) => poll_timeout(&info, self.from.max(info.tail.min(self.from)), self.cursor.as_deref()),
            Err(e) => failure(&e),
        }
    }
}

impl Sse {
    /// The stream's path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Reads what is new and returns the events to send, and whether the
    /// response is finished (the stream closed and all sent, or gone).
    /// An empty `Vec` with `false`: nothing new, wait.
    pub fn step(&mut self, streams: &Streams) -> (Vec<u8>, bool) {
        let chunk = match streams.read(&self.path, Start::At(self.next)) {
            Ok(c) => c,
            Err(_) => return (Vec::new(), true),
        };
        let mut out = Vec::new();
        if chunk.records > 0 {
            out.extend_from_slice(b"event: data\n");
            let body = chunk.body();
            if self.base64 {
                let text = base64::engine::general_purpose::STANDARD.encode(&body);
                for line in text.as_bytes().chunks(76) {
                    out.extend_from_slice(b"data:");
                    out.extend_from_slice(line);
                    out.push(b'\n');
                }
            } else {
                // Every line break (CR LF, CR or LF) starts a new `data:`
                // line, so no payload can forge an event.
                let text = String::from_utf8_lossy(&body).replace("\r\n", "\n").replace('\r', "\n");
                for line in text.split('\n') {
                    out.extend_from_slice(b"data:");
                    out.extend_from_slice(line.as_bytes());
                    out.push(b'\n');
                }
            }
            out.push(b'\n');
        }
        let finished = chunk.closed();
        if chunk.records > 0 || !self.started || finished {
            self.next = chunk.next;
            let mut control = serde_json::Map::new();
            control.insert("streamNextOffset".into(), offset(chunk.next).into());
            if finished {
                control.insert("streamClosed".into(), true.into());
                control.insert("upToDate".into(), true.into());
            } else {
                let cursor = next_cursor(self.cursor.as_deref());
                self.cursor = Some(cursor.clone());
                control.insert("streamCursor".into(), cursor.into());
                if chunk.up_to_date {
                    control.insert("upToDate".into(), true.into());
                }
            }
            out.extend_from_slice(b"event: control\ndata:");
            out.extend_from_slice(serde_json::Value::Object(control).to_string().as_bytes());
            out.extend_from_slice(b"\n\n");
        }
        self.started = true;
        let more = !chunk.up_to_date;
        if more && !finished && out.is_empty() {
            return (out, false);
        }
        (out, finished)
    }

    /// True when more data is waiting to be read at once (a read stopped
    /// at the size limit).
    pub fn behind(&self, streams: &Streams) -> bool {
        streams.head(&self.path).map(|i| i.tail > self.next).unwrap_or(false)
    }
}

// ----- CGI ----------------------------------------------------------------

/// The stream path of a CGI request mounted with a second `ScriptAlias`
/// at `.../v1/stream` (`SCRIPT_NAME` ends with `/v1/stream`), or `None`.
pub fn cgi_path() -> Option<String> {
    let script = std::env::var("SCRIPT_NAME").ok()?;
    if !script.trim_end_matches('/').ends_with("/v1/stream") {
        return None;
    }
    let info = std::env::var("PATH_INFO").unwrap_or_default();
    Some(percent_decode(info.trim_start_matches('/')))
}

/// Serves one stream request as a CGI program, writing to `out`.
pub fn serve_cgi(config: kn_journal::Config, path: String, out: &mut std::fs::File) -> std::io::Result<()> {
    use std::io::{Read, Write};
    let env = |n: &str| std::env::var(n).ok();
    let mut headers = HeaderMap::new();
    for (k, v) in std::env::vars() {
        let name = if k == "CONTENT_TYPE" { "content-type".to_owned() } else if let Some(n) = k.strip_prefix("HTTP_") { n.replace('_', "-").to_ascii_lowercase() } else { continue };
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(&v)) {
            headers.append(n, v);
        }
    }
    let method = env("REQUEST_METHOD").unwrap_or_default();
    let announced: Option<usize> = env("CONTENT_LENGTH").and_then(|v| v.trim().parse().ok());
    let length = announced.unwrap_or(0);
    let max = config.stream_max_append_bytes;
    let mut body = Vec::with_capacity(length.min(max));
    // CONTENT_LENGTH bytes; without it, a PUT or POST may carry a chunked
    // body that the web server passes on until end of input; other
    // methods carry none (reading would wait for the server to close).
    let wanted = match announced {
        Some(n) => (n as u64).min(max as u64 + 1),
        None if method == "PUT" || method == "POST" => max as u64 + 1,
        None => 0,
    };
    std::io::stdin().lock().take(wanted).read_to_end(&mut body)?;
    if body.len() > max || length > max {
        // Read the rest (up to DRAIN_BYTES) so the web server can send
        // the answer rather than a reset.
        let _ = std::io::copy(&mut std::io::stdin().lock().take(DRAIN_BYTES), &mut std::io::sink());
        let e = StreamError::new(StreamErrorKind::TooLarge, format!("the body is larger than the limit of {max} bytes"));
        return out.write_all(&failure(&e).to_cgi_bytes(false));
    }
    let host = env("HTTP_HOST").unwrap_or_else(|| format!("{}:{}", env("SERVER_NAME").unwrap_or_default(), env("SERVER_PORT").unwrap_or_default()));
    let scheme = if env("HTTPS").is_some_and(|v| v.eq_ignore_ascii_case("on")) { "https" } else { "http" };
    let url = format!("{scheme}://{host}{}{}", env("SCRIPT_NAME").unwrap_or_default(), env("PATH_INFO").unwrap_or_default());
    let req = StreamRequest { method: method.clone(), path, query: env("QUERY_STRING").unwrap_or_default(), headers, body, url };
    let store = kn_journal::Store::open_with(config).map_err(|e| std::io::Error::other(e.to_string()))?;
    let streams = Streams::new(std::sync::Arc::new(store));
    let head = method == "HEAD";
    match handle(&streams, &req) {
        Outcome::Done(r) => out.write_all(&r.to_cgi_bytes(head)),
        Outcome::Wait(poll) => {
            let watch = streams.watch(poll.path()).ok();
            loop {
                if let Some(r) = poll.poll(&streams) {
                    return out.write_all(&r.to_cgi_bytes(head));
                }
                let left = poll.deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return out.write_all(&poll.timeout(&streams).to_cgi_bytes(head));
                }
                match &watch {
                    Some(w) => w.wait(left),
                    None => std::thread::sleep(left.min(Duration::from_millis(100))),
                }
            }
        }
        Outcome::Sse(mut sse) => {
            let mut head_bytes = b"Status: 200 OK\r\n".to_vec();
            for (n, v) in &sse.head.headers {
                head_bytes.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
            }
            head_bytes.extend_from_slice(b"\r\n");
            out.write_all(&head_bytes)?;
            let watch = streams.watch(sse.path()).ok();
            let mut written = Instant::now();
            loop {
                let (bytes, finished) = sse.step(&streams);
                if !bytes.is_empty() {
                    out.write_all(&bytes)?;
                    written = Instant::now();
                } else if written.elapsed() >= SSE_KEEPALIVE {
                    // A CGI learns that its client left only by writing:
                    // a comment (ignored by SSE clients) every second, so
                    // that an abandoned response ends within about a
                    // second instead of holding a process and a server
                    // worker until `stream_sse_max_time`.
                    out.write_all(b":\n\n")?;
                    written = Instant::now();
                }
                if finished {
                    return Ok(());
                }
                if !bytes.is_empty() && sse.behind(&streams) {
                    continue;
                }
                let left = sse.deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(());
                }
                let nap = left.min(SSE_KEEPALIVE);
                match &watch {
                    Some(w) => w.wait(nap),
                    None => std::thread::sleep(nap.min(Duration::from_millis(100))),
                }
            }
        }
    }
}

// ----- serve --------------------------------------------------------------

/// Answers a stream request in `serve`: the work runs on the blocking
/// pool; a long-poll or an SSE response waits as a task (a `Future`), no
/// thread held while idle.
pub async fn respond(streams: Arc<Streams>, request: hyper::Request<Incoming>, local: std::net::SocketAddr) -> hyper::Response<Body> {
    let (parts, mut incoming) = request.into_parts();
    let max = streams.store().config().stream_max_append_bytes;
    // A body over the limit is read to its end (up to DRAIN_BYTES more)
    // and dropped before the 413 goes out: a client still sending would
    // otherwise see its connection reset instead of the answer.
    let announced = parts.headers.get(hyper::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    let mut body = Vec::new();
    let mut seen: u64 = 0;
    let hopeless = announced.is_some_and(|n| n > max as u64 + DRAIN_BYTES);
    // A body announced far beyond the limit is refused unread.
    if !hopeless {
        loop {
            match incoming.frame().await {
                None => break,
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        seen += data.len() as u64;
                        if seen <= max as u64 {
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
        // Neither kind of value is copied: the static ones are this
        // module's literals; a built one gives its buffer.
        let value = match v {
            Cow::Borrowed(v) => Some(HeaderValue::from_static(v)),
            Cow::Owned(v) => HeaderValue::try_from(v).ok(),
        };
        if let (Some(n), Some(v)) = (header_name(n), value) {
            headers.append(n, v);
        }
    }
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_integers_only() {
        assert_eq!(strict_uint("3600"), Some(3600));
        assert_eq!(strict_uint("0"), Some(0));
        for bad in ["", "+3600", "03600", "3600.0", "3.6e3", "-1", " 1"] {
            assert_eq!(strict_uint(bad), None, "{bad}");
        }
    }

    #[test]
    fn cursors_move_past_the_clients() {
        let now: u64 = next_cursor(None).parse().unwrap();
        let past: u64 = next_cursor(Some(&(now + 10).to_string())).parse().unwrap();
        assert!(past > now + 10);
        assert_eq!(next_cursor(Some("0")), now.to_string());
        assert_eq!(next_cursor(Some(&u64::MAX.to_string())), u64::MAX.to_string());
    }

    #[test]
    fn percent_escapes_are_decoded() {
        assert_eq!(percent_decode("a%2Fb%20c"), "a/b c");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}

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
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use bytes::Bytes;
use hyper::header::{HeaderMap, HeaderName};
use kn_streams::{
    is_json, offset, parse_start, Append, Chunk, Create, Info, Offset, Producer, Start, StreamError, StreamErrorKind, Streams,
};


mod via_cgi;
mod via_serve;

pub use via_cgi::{cgi_path, serve_cgi};
pub(crate) use via_serve::respond;

/// Where streams are mounted, below the server's base.
pub const PREFIX: &str = "/v1/stream/";

/// The answer to every stream request while the endpoint is off
/// (`StreamsConfig::enabled`, `KN_STREAMS=off`): `404`.
pub const OFF: &str = "Durable Streams are turned off on this server (KN_STREAMS=off)";

/// The response headers browsers may read (CORS).
const EXPOSED: &str = "Stream-Next-Offset, Stream-Cursor, Stream-Up-To-Date, Stream-Closed, Stream-TTL, Stream-Expires-At, \
Stream-SSE-Data-Encoding, Producer-Epoch, Producer-Seq, Producer-Expected-Seq, Producer-Received-Seq, ETag, Location, Content-Type, Kn-Bridge-Error, Kn-Topic";

/// The request headers browsers may send (CORS preflight).
const ALLOWED: &str = "Content-Type, Stream-TTL, Stream-Expires-At, Stream-Seq, Stream-Closed, Stream-Forked-From, Stream-Fork-Offset, \
Stream-Fork-Sub-Offset, Producer-Id, Producer-Epoch, Producer-Seq, If-None-Match, Kn-Topic, Authorization";

/// Every response header this module sets, in canonical case, with its
/// `HeaderName` for `serve` (made once, at compile time: no allocation
/// per response).
pub static HEADER_NAMES: [(&str, HeaderName); 29] = [
    ("X-Content-Type-Options", hyper::header::X_CONTENT_TYPE_OPTIONS),
    ("Content-Security-Policy", hyper::header::CONTENT_SECURITY_POLICY),
    ("Content-Disposition", hyper::header::CONTENT_DISPOSITION),
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
    ("WWW-Authenticate", hyper::header::WWW_AUTHENTICATE),
    ("Retry-After", hyper::header::RETRY_AFTER),
];

/// The `HeaderName` of a header this module sets.
fn header_name(name: &str) -> Option<HeaderName> {
    match HEADER_NAMES.iter().find(|(n, _)| *n == name) {
        Some((_, h)) => Some(h.clone()),
        None => HeaderName::from_bytes(name.as_bytes()).ok(),
    }
}

/// The types a stream's bytes are served as they are, to be shown by a
/// browser that opens them: data no browser runs (by their essence,
/// [`kn_streams::essence`]). Any other type (`text/html`, XHTML, SVG,
/// XML, JavaScript, PDF, and every type nobody listed) is also served
/// `Content-Disposition: attachment`: saved, never rendered on this
/// origin.
pub const INERT_TYPES: [&str; 10] = [
    "text/plain",
    "text/csv",
    "application/json",
    "application/x-ndjson",
    "application/octet-stream",
    "image/png",
    "image/jpeg",
    "image/gif",
    "image/webp",
    "audio/mpeg",
];

/// True when a stream of `content_type` may be shown by a browser as it
/// is ([`INERT_TYPES`]).
pub fn is_inert(content_type: &str) -> bool {
    // A list of types (`text/plain,text/html`) is judged by a browser by
    // its last valid type (the Fetch standard's "extract a MIME type"),
    // never its first: none is inert.
    !content_type.contains(',') && INERT_TYPES.contains(&kn_streams::essence(content_type).as_str())
}

/// How much of a body over `StreamsConfig::max_append_bytes` is read and
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
    /// Who makes the request (`None`: anonymous), judged by the access
    /// rules ([`crate::stream_access`]).
    pub user: Option<String>,
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
        // Whatever a browser makes of an answer opened as a page, it runs
        // no script and is no document of this origin.
        r.set("Content-Security-Policy", "sandbox");
        r.set("Cross-Origin-Resource-Policy", "cross-origin");
        r.set("Access-Control-Allow-Origin", "*");
        r.set("Access-Control-Expose-Headers", EXPOSED);
        r
    }

    fn set(&mut self, name: &'static str, value: impl Into<Cow<'static, str>>) -> &mut StreamResponse {
        self.headers.push((name, value.into()));
        self
    }

    /// Sets the `Content-Type` of a stream's bytes, its creator's
    /// `content_type`, with `Content-Disposition: attachment` when that is
    /// not an inert type ([`is_inert`]).
    fn stored_type(&mut self, content_type: &str) -> &mut StreamResponse {
        self.set("Content-Type", content_type.to_owned());
        if !is_inert(content_type) {
            self.set("Content-Disposition", "attachment");
        }
        self
    }

    /// The CGI header block: `Status:` first, each header through
    /// [`crate::response::write_field`], and the blank line.
    pub fn cgi_head(&self, content_length: Option<usize>) -> Vec<u8> {
        let mut out = Vec::with_capacity(512);
        crate::response::write_status(&mut out, self.status, self.reason());
        for (n, v) in &self.headers {
            crate::response::write_field(&mut out, n, v);
        }
        let bodiless = self.status == 204 || self.status == 304;
        if !bodiless && !self.headers.iter().any(|(n, _)| *n == "Content-Type") {
            // Apache would add its default type otherwise.
            crate::response::write_field(&mut out, "Content-Type", "application/octet-stream");
        }
        if let (Some(n), false) = (content_length, bodiless) {
            crate::response::write_field(&mut out, "Content-Length", &n.to_string());
        }
        out.extend_from_slice(b"\r\n");
        out
    }

    /// A plain-text answer with `status`.
    pub fn text(status: u16, message: &str) -> StreamResponse {
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
        let mut out = self.cgi_head(Some(self.body.len()));
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
        401 => "Unauthorized",
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
    from: Offset,
    cursor: Option<String>,
    /// When to give up and answer `204`.
    pub deadline: Instant,
}

/// An SSE response in progress.
pub struct Sse {
    path: String,
    next: Offset,
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
    let token_expires = match refusal(streams, req) {
        Err(refused) => return Outcome::Done(refused),
        Ok(expires) => expires.map(crate::tunnel_end::instant_of),
    };
    let outcome = match run(streams, req) {
        Ok(o) => o,
        Err(e) => Outcome::Done(failure(&e)),
    };
    // A live read made with a bearer token ends when the token expires;
    // the client's next read needs a new one.
    match (outcome, token_expires) {
        (Outcome::Wait(mut poll), Some(at)) => {
            poll.deadline = poll.deadline.min(at);
            Outcome::Wait(poll)
        }
        (Outcome::Sse(mut sse), Some(at)) => {
            sse.deadline = sse.deadline.min(at);
            Outcome::Sse(sse)
        }
        (outcome, _) => outcome,
    }
}

/// The answer refusing `req` when its bearer token is unusable
/// (crate::bearer) or the access rules do not allow it; else when its
/// token, if any, expires.
fn refusal(streams: &Streams, req: &StreamRequest) -> Result<Option<u64>, StreamResponse> {
    let from = req.header("Stream-Forked-From");
    let store = streams.store();
    let who = crate::stream_access::request_principal(store, &req.headers, req.param(crate::bearer::TOKEN_PARAM), req.user.as_deref()).map_err(|refused| {
        let mut r = StreamResponse::text(401, &refused.message);
        r.set("WWW-Authenticate", refused.challenge());
        r
    })?;
    let checked = crate::stream_access::check(store, &req.method, &req.path, from, &who)
        .and_then(|()| crate::stream_access::check_bridge(streams, &req.method, &req.path, req.header("Kn-Topic"), &who));
    let Err(e) = checked else { return Ok(who.token_expires()) };
    let mut r = failure(&StreamError::new(StreamErrorKind::Store(e.kind()), e.message()));
    if e.kind() == kn_journal::ErrorKind::Unauthorized && !who.has_token() {
        r.set("WWW-Authenticate", format!("Basic realm=\"{}\"", crate::handler::AUTH_REALM));
    }
    Err(r)
}

/// Where `req`'s bearer token may be (crate::stream_access::Bearer).
fn bearer_of(req: &StreamRequest) -> crate::stream_access::Bearer<'_> {
    let header = |name| req.headers.get(name).map(|v: &hyper::header::HeaderValue| v.as_bytes());
    crate::stream_access::Bearer { authorization: header("authorization"), cookies: header("cookie"), param: req.param(crate::bearer::TOKEN_PARAM) }
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
            Start::Beginning => Offset::BEGINNING,
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
    r.stored_type(&created.info.content_type);
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
    r.stored_type(&info.content_type);
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
    let config = streams.streams_config();
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
                deadline: Instant::now() + config.long_poll,
            }));
        }
        Some("sse") => {
            if req.param("offset").is_none() {
                return Err(bad("SSE needs an offset"));
            }
            let info = streams.head(&req.path)?;
            let from = match start {
                Start::Beginning => Offset::BEGINNING,
                Start::Now => info.tail,
                // An offset of an earlier stream of this path: 410.
                Start::At(o) => info.accept(o)?,
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
                deadline: Instant::now() + config.sse_max_time,
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
    // A public-key signature check is made where blocking is fine.
    if !crate::stream_access::token_is_cheap(streams.store(), &bearer_of(req)) {
        return None;
    }
    if let Err(refused) = refusal(streams, req) {
        return Some(refused);
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
    r.stored_type(&chunk.info.content_type);
    with_offset(&mut r, &chunk);
    r.set("Cache-Control", if now || chunk.up_to_date { "no-store" } else { "public, max-age=60, stale-while-revalidate=300" });
    r.body = chunk.into_body();
    r
}

fn poll_timeout(info: &Info, at: Offset, cursor: Option<&str>) -> StreamResponse {
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

    /// The header lines of a CGI head (up to its first blank line), each
    /// checked to hold no control character.
    fn head_lines(bytes: &[u8]) -> Vec<String> {
        let end = bytes.windows(4).position(|w| w == b"\r\n\r\n").expect("a blank line ends the head");
        let lines: Vec<String> = String::from_utf8_lossy(&bytes[..end]).split("\r\n").map(str::to_owned).collect();
        for line in &lines {
            assert!(!line.chars().any(|c| c.is_ascii_control()), "a control character in {line:?}");
            assert!(line.contains(": "), "not a header line: {line:?}");
        }
        lines
    }

    #[test]
    fn a_stream_response_writes_no_control_character_into_its_head() {
        let evil = "/what/x\r\nSet-Cookie: a=b\r\nContent-Type: text/html\r\n\r\n<script>alert(1)</script>";
        let mut r = StreamResponse::new(200);
        r.set("Kn-Topic", evil.to_owned());
        r.set("Stream-Next-Offset", "1\n2\0");
        r.body = Bytes::from_static(b"data");
        let bytes = r.to_cgi_bytes(false);
        let lines = head_lines(&bytes);
        assert!(!lines.iter().any(|l| l.starts_with("Set-Cookie") || l == "Content-Type: text/html"), "{lines:?}");
        assert!(lines.contains(&"Stream-Next-Offset: 1 2 ".to_owned()), "{lines:?}");
        assert!(bytes.ends_with(b"\r\n\r\ndata"));
    }

    /// The stream at `path` made with `content_type` and `body` on a fresh
    /// store, read back from the start, answered as `handle` answers.
    fn put_then_read(content_type: &str, body: &[u8]) -> (StreamResponse, StreamResponse, StreamResponse) {
        let dir = tempfile::tempdir().unwrap();
        let store = kn_journal::Store::open_with(kn_journal::Config::new(dir.path().join("kn_events"))).unwrap();
        let streams = Streams::new(std::sync::Arc::new(store));
        let request = |method: &str, query: &str| {
            let mut headers = HeaderMap::new();
            if method == "PUT" {
                headers.insert("content-type", content_type.parse().unwrap());
            }
            let body = if method == "PUT" { body.to_vec() } else { Vec::new() };
            StreamRequest { method: method.into(), path: "s".into(), query: query.into(), headers, body, ..StreamRequest::default() }
        };
        let done = |o: Outcome| match o {
            Outcome::Done(r) => r,
            _ => panic!("answered at once"),
        };
        let put = done(handle(&streams, &request("PUT", "")));
        assert_eq!(put.status, 201, "{:?}", put.body);
        let head = done(handle(&streams, &request("HEAD", "")));
        let read = done(handle(&streams, &request("GET", "offset=-1")));
        (put, head, read)
    }

    #[test]
    fn stored_bytes_of_a_type_off_the_inert_list_are_served_as_a_sandboxed_attachment() {
        for (content_type, inert) in [
            ("text/html", false),
            ("Text/HTML; charset=utf-8", false),
            ("application/xhtml+xml", false),
            ("image/svg+xml", false),
            ("text/xml", false),
            ("application/xml", false),
            ("text/javascript", false),
            ("application/javascript", false),
            ("application/pdf", false),
            // A browser takes the last type of a list (Fetch, "extract a
            // MIME type"), the essence here the first.
            ("text/plain; x=,text/html", false),
            ("text/plain, text/html", false),
            ("text/plain", true),
            ("text/plain; charset=utf-8", true),
            ("application/json", true),
            ("application/octet-stream", true),
        ] {
            let body: &[u8] = if content_type == "application/json" { b"[1]" } else { b"<script>alert(1)</script>" };
            let (put, head, read) = put_then_read(content_type, body);
            assert_eq!(read.body.as_ref(), if content_type == "application/json" { &b"[1]"[..] } else { body }, "{content_type}");
            for r in [&put, &head, &read] {
                let has = |name: &str, value: &str| r.headers.iter().any(|(n, v)| *n == name && v == value);
                assert!(has("Content-Type", content_type), "{content_type}: the creator's type is kept: {:?}", r.headers);
                assert!(has("X-Content-Type-Options", "nosniff"), "{content_type}");
                assert!(has("Content-Security-Policy", "sandbox"), "{content_type}: {:?}", r.headers);
                assert_eq!(has("Content-Disposition", "attachment"), !inert, "{content_type}: {:?}", r.headers);
            }
        }
    }

    #[test]
    fn percent_escapes_are_decoded() {
        assert_eq!(percent_decode("a%2Fb%20c"), "a/b c");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}

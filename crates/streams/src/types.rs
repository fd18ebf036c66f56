//! The values of the streams API: what a request asks (`Create`,
//! `Append`, `Producer`), what it answers (`Created`, `Appended`, `Info`,
//! `Chunk`) and how it fails (`StreamError`, `StreamErrorKind`).

use std::fmt;
use std::path::Path;

use crate::is_json;
use crate::offset::{Epochs, Offset};

/// What kind of failure a [`StreamError`] is; the HTTP layer maps each to
/// the status the protocol names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamErrorKind {
    /// Malformed request: header, offset, JSON, empty append (400).
    BadRequest,
    /// No such stream, or it expired (404).
    NotFound,
    /// The stream was deleted but its forks keep it, or an offset is of
    /// an earlier stream of the same path (410).
    Gone,
    /// Configuration mismatch, content type mismatch, `Stream-Seq`
    /// regression (409).
    Conflict,
    /// Append to a closed stream (409 with `Stream-Closed: true`).
    Closed,
    /// Stale producer epoch (403, with the current epoch).
    StaleEpoch,
    /// Producer sequence gap (409, with expected and received).
    SequenceGap,
    /// Body larger than `StreamsConfig::max_append_bytes` (413).
    TooLarge,
    /// A limit that a later retry may pass (429). None is now: a stream's
    /// producers never go, so `StreamsConfig::max_producers` refuses a new
    /// one with `BadRequest` (a 429 would invite retries forever).
    Limit,
    /// Storage failure (500, or 507 when the disk is full).
    Store(kn_journal::ErrorKind),
}

/// A stream operation's failure, with what the protocol wants said.
#[derive(Debug)]
pub struct StreamError {
    kind: StreamErrorKind,
    message: String,
    /// The tail offset (closed streams), or the current epoch (stale).
    pub next_offset: Option<String>,
    /// Stale epoch: the server's epoch; gap: (expected, received).
    pub epoch: Option<u64>,
    /// Sequence gap: the expected and the received sequence numbers.
    pub gap: Option<(u64, u64)>,
}

impl StreamError {
    /// An error of `kind`.
    pub fn new(kind: StreamErrorKind, message: impl Into<String>) -> StreamError {
        StreamError { kind, message: message.into(), next_offset: None, epoch: None, gap: None }
    }

    /// Its kind.
    pub fn kind(&self) -> StreamErrorKind {
        self.kind
    }

    /// What went wrong, with which input.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StreamError {}

impl From<kn_journal::Error> for StreamError {
    fn from(e: kn_journal::Error) -> StreamError {
        StreamError::new(StreamErrorKind::Store(e.kind()), e.to_string())
    }
}

pub(crate) fn io(what: &str, path: &Path, e: std::io::Error) -> StreamError {
    kn_journal::Error::io(what, path, e).into()
}

/// Result of stream operations.
pub type StreamResult<T> = std::result::Result<T, StreamError>;

/// A stream's metadata, as `HEAD` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Info {
    /// The stream's path (below `/v1/stream/`).
    pub path: String,
    /// The content type set at creation.
    pub content_type: String,
    /// The tail: the offset after the last data.
    pub tail: Offset,
    /// Sliding time-to-live, seconds.
    pub ttl: Option<u64>,
    /// Absolute expiry (RFC 3339, as given).
    pub expires_at: Option<String>,
    /// Closed: no more appends.
    pub closed: bool,
    /// The PubSub topic the stream is bound to.
    pub topic: Option<String>,
    /// An id of this incarnation of the stream (for ETags).
    pub id: String,
    /// The epochs of this incarnation's offsets.
    pub(crate) epochs: Epochs,
}

impl Info {
    /// The tail as an offset token.
    pub fn next_offset(&self) -> String {
        self.tail.to_string()
    }

    /// The offset this stream gives the position after checkpoint `seq`
    /// (whether or not a record of that checkpoint holds data).
    pub fn offset_at(&self, seq: u64) -> Offset {
        self.epochs.offset(seq)
    }

    /// `at`, if it is an offset of this stream as it is now: `BadRequest`
    /// (`400`) past the tail, as the protocol wants of any offset there;
    /// else `Gone` (`410`) for an offset of an earlier stream of the same
    /// path, deleted or expired since (docs/DURABLE-STREAMS.md,
    /// "Operations", the choices the protocol leaves to the server).
    pub fn accept(&self, at: Offset) -> StreamResult<Offset> {
        if at.seq() > self.tail.seq() {
            return Err(StreamError::new(StreamErrorKind::BadRequest, format!("offset {at} is beyond the tail {}", self.tail)));
        }
        self.epochs.accept(at, &self.path)
    }

    /// True in JSON mode.
    pub fn is_json(&self) -> bool {
        is_json(&self.content_type)
    }
}

/// What a `PUT` asks for.
#[derive(Clone, Debug, Default)]
pub struct Create {
    /// Content type (default `application/octet-stream`).
    pub content_type: Option<String>,
    /// `Stream-TTL`, seconds.
    pub ttl: Option<u64>,
    /// `Stream-Expires-At`, RFC 3339.
    pub expires_at: Option<String>,
    /// `Stream-Closed: true`.
    pub closed: bool,
    /// The initial content.
    pub body: Vec<u8>,
    /// `Stream-Forked-From`: the source's path.
    pub fork_from: Option<String>,
    /// `Stream-Fork-Offset`.
    pub fork_offset: Option<Offset>,
    /// `Stream-Fork-Sub-Offset`.
    pub fork_sub_offset: u64,
    /// The PubSub topic to bind the stream to (the bridge).
    pub topic: Option<String>,
}

impl Create {
    /// A plain stream of `content_type`.
    pub fn new(content_type: &str) -> Create {
        Create { content_type: Some(content_type.to_owned()), ..Create::default() }
    }
}

/// The outcome of a create.
#[derive(Clone, Debug)]
pub struct Created {
    /// False: it existed with the same configuration (idempotent).
    pub created: bool,
    /// The stream now.
    pub info: Info,
}

/// An idempotent producer's headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Producer {
    /// `Producer-Id`.
    pub id: String,
    /// `Producer-Epoch`.
    pub epoch: u64,
    /// `Producer-Seq`.
    pub seq: u64,
}

/// What a `POST` asks for.
#[derive(Clone, Debug, Default)]
pub struct Append<'a> {
    /// The request's content type.
    pub content_type: Option<&'a str>,
    /// The bytes to append (may be empty only when closing).
    pub body: &'a [u8],
    /// `Stream-Closed: true`.
    pub close: bool,
    /// `Stream-Seq`.
    pub stream_seq: Option<&'a [u8]>,
    /// The idempotent producer, if any.
    pub producer: Option<Producer>,
}

impl<'a> Append<'a> {
    /// A plain append of `body`.
    pub fn data(content_type: Option<&'a str>, body: &'a [u8]) -> Append<'a> {
        Append { content_type, body, ..Append::default() }
    }
}

/// The outcome of an append.
#[derive(Clone, Debug)]
pub struct Appended {
    /// The stream after it.
    pub info: Info,
    /// False: nothing was written (a duplicate, or closing a closed
    /// stream).
    pub stored: bool,
    /// The producer's epoch and highest accepted seq, to echo.
    pub producer: Option<(u64, u64)>,
    /// A failure posting the appended messages to the bound topic (the
    /// append itself is stored).
    pub bridge_error: Option<String>,
}

/// A catch-up read.
#[derive(Clone, Debug)]
pub struct Chunk {
    /// The stream.
    pub info: Info,
    /// The offset the read started after.
    pub start: Offset,
    /// How many records holding data were read.
    pub records: usize,
    /// Where the next read starts.
    pub next: Offset,
    /// The read reached the tail.
    pub up_to_date: bool,
    /// The response body, joined once as the records were read (and
    /// shared by later reads of the same range, `Entry::served`).
    pub(crate) data: bytes::Bytes,
}

impl Chunk {
    /// The response body: the bytes, or in JSON mode the array of the
    /// messages.
    pub fn body(&self) -> Vec<u8> {
        self.data.to_vec()
    }

    /// [`Chunk::body`], without a copy: shared with the other reads of
    /// the same range that this process answered from memory.
    pub fn into_body(self) -> bytes::Bytes {
        self.data
    }

    /// True when the stream is closed and this read reached its end (EOF).
    pub fn closed(&self) -> bool {
        self.info.closed && self.up_to_date
    }
}

/// A [`Chunk`]'s body as its records are read: the payloads one after
/// the other, or in JSON mode (each payload holding messages joined by
/// commas) the array of the messages.
pub(crate) struct Joined {
    json: bool,
    data: Vec<u8>,
    records: usize,
    bytes: usize,
}

impl Joined {
    pub(crate) fn new(json: bool, capacity: usize) -> Joined {
        let mut data = Vec::with_capacity(capacity + 2);
        if json {
            data.push(b'[');
        }
        Joined { json, data, records: 0, bytes: 0 }
    }

    /// Adds `payload`, unless the body holds a record already and would
    /// pass `max` bytes of payload: false then (the read stops).
    pub(crate) fn add(&mut self, payload: &[u8], max: usize) -> bool {
        if self.records > 0 && self.bytes + payload.len() > max {
            return false;
        }
        if self.json && self.records > 0 {
            self.data.push(b',');
        }
        self.data.extend_from_slice(payload);
        self.bytes += payload.len();
        self.records += 1;
        true
    }

    /// The chunk read after checkpoint `start` up to checkpoint `next`.
    pub(crate) fn chunk(mut self, info: Info, start: u64, next: u64) -> Chunk {
        if self.json {
            self.data.push(b']');
        }
        let (start, next) = (info.offset_at(start), info.offset_at(next));
        Chunk { up_to_date: next >= info.tail, info, start, next, records: self.records, data: self.data.into() }
    }
}

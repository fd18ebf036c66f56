//! Durable Streams (github.com/durable-streams, PROTOCOL.md v1.0) on the
//! same store: append-only byte streams with opaque offsets, idempotent
//! producers, TTLs, forks and closing, and the bridge to PubSub topics.
//!
//! Each stream is a log like a journal's (the `log` module: segments of
//! checksummed records, torn tails repaired) in its own directory under
//! [`STREAMS_DIR`] in the store root; a topic segment never starts with
//! `.`, so no topic can collide with it. Its state (content type, TTL,
//! closed, forks, producers) is replayed from its records; a producer's
//! `(id, epoch, seq)` is written in the very record of the append it
//! guards, under the stream's lock (FORMAT.md, "Streams").
//!
//! An offset is the checkpoint of the last record holding data, as 16 hex
//! digits ([`offset`]). A fork copies its source's records up to the fork
//! point, keeping their checkpoints, so offsets are shared as the protocol
//! wants.
//!
//! ```
//! use kn_streams::{Append, Create, Start, Streams};
//! use kn_journal::Store;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let streams = Streams::new(std::sync::Arc::new(Store::open(dir.path()).unwrap()));
//! let created = streams.create("chat/1", &Create::new("text/plain")).unwrap();
//! assert!(created.created);
//! streams.append("chat/1", &Append::data(Some("text/plain"), b"hello ")).unwrap();
//! streams.append("chat/1", &Append::data(Some("text/plain"), b"world")).unwrap();
//! let chunk = streams.read("chat/1", Start::Beginning).unwrap();
//! assert_eq!(chunk.body(), b"hello world");
//! assert!(chunk.up_to_date);
//! ```

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kn_journal::Event;
use kn_journal::logs::{self as log, LogCursor, SpaceGauge, Writer};
use kn_journal::Record;
use kn_journal::Store;

mod bridge;
mod figures;
mod cache;
mod expiry;
mod forks;
mod json;
mod offset;
mod snapshot;
mod state;
mod time;

pub use figures::StreamFigures;
pub use expiry::{register as sweep_expired_streams, ExpirySweep};
pub use json::{essence, is_json};
pub use offset::{offset, parse_offset, parse_start, Start};
pub use time::parse_rfc3339;

use cache::{Entry, Last, Served};
use forks::source_path;
use state::{has_data, name, op};

/// The directory of the store root holding the streams, one directory
/// each, named by the `xxh3_128` of the stream's path in hex.
pub use kn_journal::STREAMS_DIR;

/// File whose modification time is a stream's last read or write, for a
/// sliding `Stream-TTL`.
const ACCESS_FILE: &str = ".access";

/// Most read positions a process keeps per stream (see `Entry::marks`):
/// the memory of a stream's cache entry stays bounded however long it is.
const MAX_MARKS: usize = 1024;

/// Records between two read positions a process keeps (`Entry::marks`)
/// when it places its cursor after its own appends.
const MARK_EVERY: u64 = 64;

/// How long a watched process trusts that the `.head` it holds open is
/// still the stream's (its path names the same file) before it looks
/// again. A head replaced whole, or a removed stream's, is spoiled first
/// (FORMAT.md, "The magic doubles as a validity flag"; see
/// `Streams::remove`), which every process sees at once: this is a bound
/// on staleness should that ever not happen (a writer killed between
/// the two steps).
const TRUST: Duration = Duration::from_secs(1);

/// What kind of failure a [`StreamError`] is; the HTTP layer maps each to
/// the status the protocol names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamErrorKind {
    /// Malformed request: header, offset, JSON, empty append (400).
    BadRequest,
    /// No such stream, or it expired (404).
    NotFound,
    /// The stream was deleted but its forks keep it (410).
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
    /// Body larger than `Config::stream_max_append_bytes` (413).
    TooLarge,
    /// A limit that a later retry may pass (429). None is now: a stream's
    /// producers never go, so `Config::stream_max_producers` refuses a new
    /// one with `BadRequest` (a 429 would invite retries forever).
    Limit,
    /// Storage failure (500, or 507 when the disk is full).
    Store(kn_journal::ErrorKind),
}

/// Why the bridge refuses while access rules are in force.
const BRIDGE_OFF: &str =
    "streams are not bridged to topics while access rules are in force (KN_ACCESS_RULES): the stream front door does not know the user's rights on topics";

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

fn io(what: &str, path: &Path, e: std::io::Error) -> StreamError {
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
    /// The tail: checkpoint of the last data.
    pub tail: u64,
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
}

impl Info {
    /// The tail as an offset token.
    pub fn next_offset(&self) -> String {
        offset(self.tail)
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
    pub fork_offset: Option<u64>,
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
    pub start: u64,
    /// How many records holding data were read.
    pub records: usize,
    /// Where the next read starts.
    pub next: u64,
    /// The read reached the tail.
    pub up_to_date: bool,
    /// The response body, joined once as the records were read (and
    /// shared by later reads of the same range, `Entry::served`).
    data: bytes::Bytes,
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
struct Joined {
    json: bool,
    data: Vec<u8>,
    records: usize,
    bytes: usize,
}

impl Joined {
    fn new(json: bool, capacity: usize) -> Joined {
        let mut data = Vec::with_capacity(capacity + 2);
        if json {
            data.push(b'[');
        }
        Joined { json, data, records: 0, bytes: 0 }
    }

    /// Adds `payload`, unless the body holds a record already and would
    /// pass `max` bytes of payload: false then (the read stops).
    fn add(&mut self, payload: &[u8], max: usize) -> bool {
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

    fn chunk(mut self, info: Info, start: u64, next: u64) -> Chunk {
        if self.json {
            self.data.push(b']');
        }
        Chunk { up_to_date: next >= info.tail, info, start, next, records: self.records, data: self.data.into() }
    }
}

/// The streams of a store. One per process (it caches what it has read);
/// cheap to share behind an `Arc`.
pub struct Streams {
    store: Arc<Store>,
    dir: PathBuf,
    entries: Mutex<HashMap<String, Arc<cache::Cell>>>,
    /// The bytes the cached entries hold, as last counted (`cache.rs`).
    cached_bytes: AtomicUsize,
    gauge: SpaceGauge,
    /// The store's configuration for stream writers: without journal
    /// retention (a stream keeps all it was given, its `create` first).
    writing: kn_journal::Config,
    /// Keep cached streams watched (see [`Streams::watched`]).
    watched: bool,
    /// Records read from logs to bring states up to date.
    replayed: AtomicU64,
    /// Live reads of this process waiting now ([`StreamWatch`]es): with
    /// none, an append wakes no one (nor looks for whom to wake).
    live: Arc<AtomicUsize>,
    /// Appends and their bytes, for [`Streams::figures`].
    counted: figures::Counted,
}

impl fmt::Debug for Streams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Streams").field("dir", &self.dir).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn dir_ino(dir: &Path) -> u64 {
    fs::metadata(dir).map(|m| m.ino()).unwrap_or(0)
}

impl Streams {
    /// The streams of `store`. The store's sweep removes expired streams
    /// from then on (`expiry.rs`).
    pub fn new(store: Arc<Store>) -> Streams {
        expiry::register(&store);
        Streams::unregistered(store)
    }

    /// [`Streams::new`] without registering the sweep's pass.
    fn unregistered(store: Arc<Store>) -> Streams {
        let dir = store.config().root.join(STREAMS_DIR);
        let mut writing = store.config().clone();
        writing.journal_max_age = Duration::MAX;
        writing.journal_max_bytes = u64::MAX;
        Streams { store, dir, entries: Mutex::default(), cached_bytes: AtomicUsize::new(0), gauge: SpaceGauge::default(), writing, watched: false, replayed: AtomicU64::new(0), live: Arc::default(), counted: Default::default() }
    }

    /// The streams of `store` for a long-lived process (`serve`): the
    /// `.head` of every stream it keeps in memory stays open, so that a
    /// read of a stream that did not change since it last looked costs
    /// one `pread` (of the head) and no read of the log, while an append
    /// by any other process, which moves the head, is seen by the next
    /// read (`Streams::fresh`); its own appends wake its live readers
    /// directly. In shared mode (`Config::shared`: other hosts write
    /// through their own page caches) every request looks at the log, as
    /// without this.
    pub fn watched(store: Arc<Store>) -> Streams {
        Streams { watched: !store.is_shared(), ..Streams::new(store) }
    }

    /// How many records this process has read from stream logs to bring
    /// its states up to date (replayed): with snapshots, what a request
    /// of a process new to a stream costs does not grow with the stream.
    pub fn records_replayed(&self) -> u64 {
        self.replayed.load(Ordering::Relaxed)
    }

    /// The store.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    fn config(&self) -> &kn_journal::Config {
        self.store.config()
    }

    fn stream_dir(&self, path: &str) -> PathBuf {
        self.dir.join(format!("{:032x}", xxhash_rust::xxh3::xxh3_128(path.as_bytes())))
    }

    fn check_path(&self, path: &str) -> StreamResult<()> {
        let max = self.config().stream_max_path_bytes;
        if path.is_empty() {
            return Err(StreamError::new(StreamErrorKind::BadRequest, "a stream path cannot be empty"));
        }
        if path.len() > max {
            return Err(StreamError::new(StreamErrorKind::BadRequest, format!("stream path of {} bytes is longer than the limit of {max}", path.len())));
        }
        Ok(())
    }

    /// Brings `entry` up to date with the log (records written by any
    /// process since it last looked). In a watched process, nothing is
    /// read while the stream's head names the last record read.
    fn refresh(&self, entry: &mut Entry) -> StreamResult<()> {
        if self.fresh(entry) {
            return Ok(());
        }
        // Opened before looking: an append made after the look changes it.
        self.arm(entry);
        self.refresh_until(entry, None, None)
    }

    /// True when `entry` is known to match the log without reading it:
    /// the head, read with one `pread`, names the last record read. Every
    /// append, of any process, writes the head before it is acknowledged,
    /// so the next read sees it; a removed stream's head no longer
    /// decodes (`Streams::remove`). Once per `TRUST`, one `statx` checks
    /// that the head's path still names the file held open (not rebuilt,
    /// the directory not replaced). No change notification is involved:
    /// this process's own appends wake no thread of its own (the
    /// notifier's thread reading their inotify events cost about 40 % of
    /// an append's CPU).
    fn fresh(&self, entry: &mut Entry) -> bool {
        let Some(read) = entry.cursor.as_ref().map(|c| c.last_seq()) else { return false };
        if !self.watched || entry.ino == 0 || entry.verify.is_some() {
            return false;
        }
        let Some((head, ino)) = &entry.head else { return false };
        if entry.checked.is_none_or(|t| t.elapsed() >= TRUST) {
            if fs::metadata(entry.dir.join(log::HEAD_FILE)).map(|m| m.ino()).ok() != Some(*ino) {
                entry.head = None;
                return false;
            }
            entry.checked = Some(Instant::now());
        }
        match log::last_seq_of(head) {
            Some(last) => last == read,
            None => {
                // Spoiled (a removed stream) or replaced: open it again.
                entry.head = None;
                false
            }
        }
    }

    /// Opens `entry`'s head for [`Streams::fresh`] if it is not open:
    /// call it before reading the log.
    fn arm(&self, entry: &mut Entry) {
        if !self.watched || entry.ino == 0 || entry.head.is_some() {
            return;
        }
        let opened = fs::File::open(entry.dir.join(log::HEAD_FILE)).and_then(|f| f.metadata().map(|m| (m.ino(), f)));
        if let Ok((ino, file)) = opened {
            entry.head = Some((file, ino));
            entry.checked = Some(Instant::now());
        }
    }

    /// Where a process that knows nothing of the stream starts reading
    /// its log: after the snapshot's record, the state taken from the
    /// snapshot (to be confirmed by the log), or at the beginning.
    fn start(&self, entry: &mut Entry) -> LogCursor {
        let beginning = LogCursor::at(0, 0, 0, 0);
        if entry.no_snapshot {
            return beginning;
        }
        let Some((mark, mut state)) = snapshot::load(&entry.dir) else { return beginning };
        state.count_producers();
        if mark.seq == 0 {
            return beginning;
        }
        entry.forgotten = state.tail;
        entry.state = state;
        let cursor = LogCursor::at(mark.seq - 1, mark.segment, mark.frame_at, mark.ino);
        entry.verify = Some(mark);
        cursor
    }

    /// Forgets a snapshot the log did not confirm: the whole log is
    /// replayed instead.
    fn restart(&self, entry: &mut Entry) -> LogCursor {
        snapshot::discard(&entry.dir);
        let (dir, ino) = (std::mem::take(&mut entry.dir), entry.ino);
        *entry = Entry { dir, ino, no_snapshot: true, ..Entry::default() };
        LogCursor::at(0, 0, 0, 0)
    }

    /// [`Streams::refresh`], stopping once the record `until` is read: a
    /// writer knows the log's last checkpoint, and needs no further read
    /// (nor the listing that finds nothing more). `ino`: the directory's
    /// inode if the caller has just looked.
    fn refresh_until(&self, entry: &mut Entry, until: Option<u64>, ino: Option<u64>) -> StreamResult<()> {
        let ino = ino.unwrap_or_else(|| dir_ino(&entry.dir));
        if ino != entry.ino {
            let dir = std::mem::take(&mut entry.dir);
            *entry = Entry { dir, ino, ..Entry::default() };
        }
        if ino == 0 {
            return Ok(());
        }
        let mut cursor = match entry.cursor.take() {
            Some(c) => c,
            None => self.start(entry),
        };
        loop {
            if entry.verify.is_none() && until.is_some_and(|last| cursor.last_seq() >= last) {
                break;
            }
            let mut records = match log::read_new(&entry.dir, &mut cursor) {
                Ok(r) => r,
                Err(e) => {
                    // Start afresh next time rather than from a cursor
                    // that may have moved past records not applied.
                    *entry = Entry { dir: std::mem::take(&mut entry.dir), ..Entry::default() };
                    return Err(e.into());
                }
            };
            let mut skip = 0;
            if let Some(mark) = entry.verify.take() {
                // The snapshot's own record must be the first one there.
                match records.first() {
                    Some(r) if r.seq == mark.seq && snapshot::frame_of(r).1 == mark.hash => skip = 1,
                    _ => {
                        cursor = self.restart(entry);
                        continue;
                    }
                }
            }
            if records.is_empty() {
                break;
            }
            for r in &records[skip..] {
                let tail = entry.state.tail;
                entry.state.apply(r);
                if entry.state.tail != tail {
                    entry.remember(r.seq, r.event.payload(), self.config().stream_cache_bytes);
                }
                entry.since.0 += 1;
                entry.since.1 += r.event.payload().len() as u64;
            }
            self.replayed.fetch_add((records.len() - skip) as u64, Ordering::Relaxed);
            entry.marks.insert(cursor.last_seq(), cursor.clone());
            if entry.marks.len() > MAX_MARKS {
                // Every other one: reads start at most twice as far back.
                let mut i = 0;
                entry.marks.retain(|_, _| {
                    i += 1;
                    i % 2 == 0
                });
            }
            entry.last = records.pop().map(|record| Last { record, segment: cursor.segment(), ino: cursor.ino(), end: cursor.offset() });
        }
        entry.cursor = Some(cursor);
        Ok(())
    }

    /// Locks the stream for writing (creating its directory if `create`),
    /// with `entry` brought up to date under the lock.
    fn writer<'s>(&'s self, entry: &mut Entry, create: bool) -> StreamResult<Option<Writer<'s>>> {
        for _ in 0..4 {
            if create {
                if !self.dir.is_dir() {
                    match create_dir(&self.dir) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(io("cannot create", &self.dir, e)),
                    }
                }
                match create_dir(&entry.dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(io("cannot create stream directory", &entry.dir, e)),
                }
            }
            // Files kept from an earlier append are those of the
            // directory `entry.ino`: reused without a path lookup.
            let kept = entry.files.take().filter(|_| entry.ino != 0);
            let reopened = match kept {
                Some(files) => Writer::reopen(&self.writing, false, files)?,
                None => None,
            };
            let (w, ino) = match reopened {
                // Not removed while we waited for the lock: the head,
                // read under it, would no longer decode (`remove` spoils
                // it before the rename) and `reopen` would have failed.
                Some(w) => {
                    self.refresh_until(entry, Some(w.last_seq()), Some(entry.ino))?;
                    return Ok(Some(w));
                }
                None => {
                    let ino = dir_ino(&entry.dir);
                    if ino == 0 {
                        return Ok(None);
                    }
                    match Writer::open(&entry.dir, &self.writing, false) {
                        Ok(w) => (w, ino),
                        Err(_) if dir_ino(&entry.dir) != ino => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
            };
            // Deleted (renamed away) while we waited for the lock?
            if dir_ino(&entry.dir) != ino {
                drop(w);
                continue;
            }
            self.refresh_until(entry, Some(w.last_seq()), Some(ino))?;
            return Ok(Some(w));
        }
        Err(StreamError::new(StreamErrorKind::Conflict, "the stream is being deleted and re-created; try again"))
    }

    /// Unlocks the stream, keeping its files open for the next append;
    /// first takes a snapshot of its state if one is due.
    fn release(&self, entry: &mut Entry, w: Writer<'_>) {
        self.snapshot_if_due(entry);
        entry.files = Some(w.release());
    }

    /// Writes the snapshot of `entry`'s state (the caller holds the lock)
    /// once `SNAPSHOT_RECORDS` records or `SNAPSHOT_BYTES` bytes were
    /// applied since the last one.
    fn snapshot_if_due(&self, entry: &mut Entry) {
        if entry.since.0 < snapshot::SNAPSHOT_RECORDS && entry.since.1 < snapshot::SNAPSHOT_BYTES {
            return;
        }
        let Some(last) = &entry.last else { return };
        let at = entry.cursor.as_ref().map(|c| c.last_seq());
        if !entry.state.exists || entry.verify.is_some() || at != Some(last.record.seq) {
            return;
        }
        let (len, hash) = snapshot::frame_of(&last.record);
        let Some(frame_at) = last.end.checked_sub(len) else { return };
        let mark = snapshot::Mark { seq: last.record.seq, hash, segment: last.segment, ino: last.ino, frame_at };
        // A failure only means a longer replay later; try again after as
        // many records.
        let _ = snapshot::store(&entry.dir, &mark, &entry.state, self.config().sync == kn_journal::SyncPolicy::Always);
        entry.since = (0, 0);
    }

    /// Appends `event` (the stream is locked by `w`, `entry` up to date).
    /// When `entry`'s cursor was at the end of the log, the record is
    /// applied to the state from memory and the cursor placed after it:
    /// nothing is read back.
    fn append_record(&self, entry: &mut Entry, w: &mut Writer<'_>, event: Event) -> StreamResult<u64> {
        let (segment, len) = w.end();
        let placed = entry.verify.is_none()
            && entry.cursor.as_ref().is_some_and(|c| c.ino() != 0 && c.segment() == segment && c.offset() == len && c.last_seq() == w.last_seq());
        let stored_secs = kn_journal::now() as u64;
        // This process's live readers of the stream, if any, wake at once.
        // (One that starts waiting after this look is woken by the change
        // notification of the write, as for another process's append.)
        let waking = if self.watched && self.live.load(Ordering::SeqCst) > 0 { self.store.hub().appending(&entry.dir) } else { None };
        let appended = w.append(&event, stored_secs, &self.gauge);
        if let Some(waking) = waking {
            self.store.hub().appended(waking, matches!(appended, Ok(log::Appended::Stored(_))));
        }
        let seq = match appended? {
            log::Appended::Stored(seq) => seq,
            log::Appended::Duplicate => {
                return Err(StreamError::new(StreamErrorKind::Store(kn_journal::ErrorKind::Io), "a stream record was taken for a duplicate"))
            }
        };
        let (after, end) = w.end();
        let blob = self.writing.blob_bytes > 0 && event.payload().len() > self.writing.blob_bytes;
        let Some(cursor) = entry.cursor.as_mut().filter(|_| placed && after == segment && !blob) else {
            // Read back by the next refresh (the head is past the cursor).
            return Ok(seq);
        };
        cursor.advance(seq, end);
        let ino = cursor.ino();
        if entry.marks.last_key_value().is_none_or(|(&at, _)| seq >= at + MARK_EVERY) {
            let c = cursor.clone();
            entry.marks.insert(seq, c);
        }
        let record = Record { seq, stored_secs, event, blob: None };
        let tail = entry.state.tail;
        entry.state.apply(&record);
        if entry.state.tail != tail {
            entry.remember(seq, record.event.payload(), self.config().stream_cache_bytes);
        }
        entry.since.0 += 1;
        entry.since.1 += record.event.payload().len() as u64;
        entry.last = Some(Last { record, segment, ino, end });
        // The state matches the log again (we hold the lock): the head
        // names this record.
        self.arm(entry);
        Ok(seq)
    }

    fn touch(&self, entry: &Entry) {
        if entry.state.ttl.is_some() {
            let path = entry.dir.join(ACCESS_FILE);
            let _ = log::open_shared(&path, false).and_then(|f| f.set_modified(std::time::SystemTime::now()));
        }
    }

    fn expired(&self, entry: &Entry) -> bool {
        let now = time::now_ms();
        if let Some(at) = entry.state.expires_at.as_deref().and_then(parse_rfc3339) {
            if now >= at {
                return true;
            }
        }
        if let Some(ttl) = entry.state.ttl {
            let last = fs::metadata(entry.dir.join(ACCESS_FILE))
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_millis() as i64);
            if let Some(last) = last {
                // Checked: a TTL past the representable range (only an
                // older version could have stored one) never expires.
                return time::deadline(last, ttl).is_some_and(|end| now > end);
            }
        }
        false
    }

    fn info(entry: &Entry) -> Info {
        let s = &entry.state;
        Info {
            path: s.path.clone(),
            content_type: s.content_type.clone(),
            tail: s.tail,
            ttl: s.ttl,
            expires_at: s.expires_at.clone(),
            closed: s.closed,
            topic: s.topic.clone(),
            id: Self::id(entry),
        }
    }

    /// The id of the stream's incarnation (`Info::id`).
    fn id(entry: &Entry) -> String {
        let s = &entry.state;
        let mut kept = entry.id.borrow_mut();
        match &*kept {
            Some((created, id)) if *created == s.created => id.clone(),
            _ => {
                let id = format!("{:x}", xxhash_rust::xxh3::xxh3_64(format!("{}\0{}", s.path, s.created).as_bytes()));
                *kept = Some((s.created.clone(), id.clone()));
                id
            }
        }
    }

    /// Up to date and existing: `NotFound`, `Gone` (soft-deleted); an
    /// expired stream is removed here and is `NotFound`.
    fn live(&self, path: &str, entry: &mut Entry) -> StreamResult<()> {
        self.refresh(entry)?;
        if !entry.state.exists {
            return Err(not_found(path));
        }
        if entry.state.soft_deleted {
            return Err(StreamError::new(StreamErrorKind::Gone, format!("stream '{path}' was deleted")));
        }
        if self.expired(entry) {
            self.expire(path, entry)?;
            return Err(not_found(path));
        }
        Ok(())
    }

    /// Removes the expired stream of `entry` (locked by the caller) and
    /// counts it out of its fork source, as a delete would.
    fn expire(&self, path: &str, entry: &mut Entry) -> StreamResult<()> {
        let parent = entry.state.fork_from.clone();
        self.remove(path, entry)?;
        if let Some(parent) = parent {
            self.count_fork(&parent, op::FORK_REMOVED)?;
        }
        Ok(())
    }

    // ----- create -------------------------------------------------------

    /// Creates the stream at `path` (`PUT`): `created` false when it
    /// exists with the same configuration; `Conflict` when it exists
    /// otherwise (or was deleted and is kept for its forks).
    pub fn create(&self, path: &str, req: &Create) -> StreamResult<Created> {
        self.check_path(path)?;
        if req.ttl.is_some() && req.expires_at.is_some() {
            return Err(StreamError::new(StreamErrorKind::BadRequest, "Stream-TTL and Stream-Expires-At cannot both be given"));
        }
        if let Some(ttl) = req.ttl {
            if time::deadline(time::now_ms(), ttl).is_none() {
                return Err(StreamError::new(StreamErrorKind::BadRequest, format!("Stream-TTL {ttl} is past the times this server can represent")));
            }
        }
        if let Some(at) = &req.expires_at {
            if parse_rfc3339(at).is_none() {
                return Err(StreamError::new(StreamErrorKind::BadRequest, format!("Stream-Expires-At '{at}' is not an RFC 3339 timestamp")));
            }
        }
        if req.body.len() > self.config().stream_max_append_bytes {
            return Err(too_large(req.body.len(), self.config().stream_max_append_bytes));
        }
        let cell = self.entry(path);
        let mut entry = self.hold(&cell);
        self.refresh(&mut entry)?;
        if entry.state.exists && !entry.state.soft_deleted && self.expired(&entry) {
            self.expire(path, &mut entry)?;
        }
        if entry.state.exists {
            return self.recreate(path, req, &entry);
        }
        // The fork's source, read before anything is written.
        let source = match &req.fork_from {
            Some(from) => Some(self.fork_source(from, req)?),
            None => None,
        };
        let mut content_type = req.content_type.clone();
        let (mut ttl, mut expires_at) = (req.ttl, req.expires_at.clone());
        if let Some(src) = &source {
            match &content_type {
                Some(ct) if essence(ct) != essence(&src.info.content_type) => {
                    return Err(StreamError::new(StreamErrorKind::Conflict, format!("content type '{ct}' differs from the source's '{}'", src.info.content_type)));
                }
                Some(_) => {}
                None => content_type = Some(src.info.content_type.clone()),
            }
            if ttl.is_none() && expires_at.is_none() {
                ttl = src.info.ttl;
                expires_at = src.info.expires_at.clone();
            }
        }
        let content_type = content_type.unwrap_or_else(|| "application/octet-stream".to_owned());
        let initial = if is_json(&content_type) && !req.body.is_empty() {
            json::messages(&req.body, true)?.join(",").into_bytes()
        } else {
            req.body.clone()
        };
        if let Some(topic) = &req.topic {
            if !self.bridge_allowed() {
                return Err(StreamError::new(StreamErrorKind::Store(kn_journal::ErrorKind::Forbidden), BRIDGE_OFF));
            }
            kn_journal::Topic::parse(topic).map_err(|e| StreamError::new(StreamErrorKind::BadRequest, e.to_string()))?;
            if !is_json(&content_type) {
                return Err(StreamError::new(StreamErrorKind::BadRequest, "only application/json streams can be bound to a topic"));
            }
        }
        let Some(mut w) = self.writer(&mut entry, true)? else { return Err(not_found(path)) };
        if !entry.state.exists && entry.cursor.as_ref().is_some_and(|c| c.last_seq() > 0) {
            // Records without a create: a creation that crashed half-way
            // (creators hold the lock throughout). Start afresh, so that
            // a fork's copied checkpoints begin at 1.
            drop(w);
            self.remove(path, &mut entry)?;
            w = match self.writer(&mut entry, true)? {
                Some(w) => w,
                None => return Err(not_found(path)),
            };
        }
        if entry.state.exists {
            // Another process created it while we looked.
            self.release(&mut entry, w);
            return self.recreate(path, req, &entry);
        }
        let result = (|| {
            if let Some(src) = &source {
                for r in &src.records {
                    self.append_record(&mut entry, &mut w, r.clone())?;
                }
            }
            let mut e = Event::new();
            e.set(name::OP, op::CREATE);
            e.set(name::PATH, path);
            e.set(name::CONTENT_TYPE, content_type.as_str());
            e.set(name::CREATED, format!("{}-{}", time::now_ms(), kn_journal::fresh_id()));
            if let Some(t) = ttl {
                e.set(name::TTL, t.to_string());
            }
            if let Some(at) = &expires_at {
                e.set(name::EXPIRES_AT, at.as_str());
            }
            if let Some(src) = &source {
                e.set(name::FORK_FROM, src.info.path.as_str());
                e.set(name::FORK_OFFSET, src.offset.to_string());
                e.set(name::FORK_SUB, req.fork_sub_offset.to_string());
                e.set(name::FORK_DEPTH, (src.depth + 1).to_string());
            }
            if let Some(topic) = &req.topic {
                e.set(name::TOPIC, topic.as_str());
                // Only what is notified from now on is imported.
                let dir = kn_journal::Topic::parse(topic).map(|t| t.dir(&self.config().root));
                if let Ok(dir) = dir {
                    let at = log::cursor_at_end(&dir).map(|c| c.last_seq()).unwrap_or(0);
                    e.set(name::TOPIC_SEQ, at.to_string());
                }
            }
            if req.closed {
                e.set(name::CLOSE, "true");
            }
            if !initial.is_empty() {
                e.set(kn_journal::KN_PAYLOAD, initial.clone());
            }
            self.append_record(&mut entry, &mut w, e)?;
            let _ = log::open_shared(&entry.dir.join(ACCESS_FILE), false);
            self.refresh(&mut entry)
        })();
        self.release(&mut entry, w);
        if let Err(e) = result {
            // Never leave half a stream: its create record is what makes
            // it exist, so remove what was written before it.
            if !entry.state.exists {
                let _ = self.remove(path, &mut entry);
            }
            return Err(e);
        }
        if let Some(src) = &source {
            self.count_fork(&src.info.path, op::FORK_ADDED)?;
        }
        Ok(Created { created: true, info: Self::info(&entry) })
    }

    /// `PUT` on an existing stream: the same configuration or a conflict.
    fn recreate(&self, path: &str, req: &Create, entry: &Entry) -> StreamResult<Created> {
        let s = &entry.state;
        let conflict = |why: &str| Err(StreamError::new(StreamErrorKind::Conflict, format!("stream '{path}' exists with {why}")));
        if s.soft_deleted {
            return conflict("its forks still reading it (deleted)");
        }
        if let Some(ct) = &req.content_type {
            if essence(ct) != essence(&s.content_type) {
                return conflict(&format!("another content type ({})", s.content_type));
            }
        }
        if req.fork_from.is_none() && (req.ttl != s.ttl || req.expires_at != s.expires_at) {
            return conflict("another TTL or expiry");
        }
        if req.closed != s.closed {
            return conflict(if s.closed { "closed" } else { "open" });
        }
        if req.fork_from.as_deref().map(source_path) != s.fork_from.as_deref() {
            return conflict("another fork source");
        }
        if req.fork_from.is_some() && req.fork_offset.is_some() && req.fork_offset != s.fork_offset {
            return conflict("another fork offset");
        }
        if req.fork_from.is_some() && req.fork_sub_offset != s.fork_sub {
            return conflict("another fork sub-offset");
        }
        if req.topic.is_some() && req.topic != s.topic {
            return conflict("another topic");
        }
        Ok(Created { created: false, info: Self::info(entry) })
    }

    // ----- append -------------------------------------------------------

    /// Appends to the stream at `path` (`POST`), closing it with
    /// `close`; checks the producer and `Stream-Seq` and writes their new
    /// state in the same record.
    pub fn append(&self, path: &str, req: &Append<'_>) -> StreamResult<Appended> {
        self.check_path(path)?;
        let max = self.config().stream_max_append_bytes;
        if req.body.len() > max {
            return Err(too_large(req.body.len(), max));
        }
        if req.body.is_empty() && !req.close {
            return Err(StreamError::new(StreamErrorKind::BadRequest, "an append needs a body (or Stream-Closed: true)"));
        }
        if let Some(p) = &req.producer {
            let max = self.config().stream_max_producer_id_bytes;
            if p.id.len() > max {
                return Err(StreamError::new(StreamErrorKind::BadRequest, format!("a Producer-Id of {} bytes is longer than the limit of {max} (KN_STREAM_MAX_PRODUCER_ID_BYTES)", p.id.len())));
            }
        }
        let cell = self.entry(path);
        let mut entry = self.hold(&cell);
        // The writer brings the state up to date under the lock: the
        // checks of `live` are made there, with one read of the log.
        let Some(mut w) = self.writer(&mut entry, false)? else { return Err(not_found(path)) };
        if entry.state.exists && !entry.state.soft_deleted && self.expired(&entry) {
            drop(w);
            self.expire(path, &mut entry)?;
            return Err(not_found(path));
        }
        let result = self.append_locked(path, req, &mut entry, &mut w);
        self.release(&mut entry, w);
        let (mut appended, posted) = result?;
        self.touch(&entry);
        let bound = entry.state.topic.clone();
        drop(entry);
        if let (Some(topic), Some((at, messages))) = (bound, posted) {
            appended.bridge_error = if self.bridge_allowed() {
                self.post_to_topic(path, &topic, at, &messages).err().map(|e| e.to_string())
            } else {
                Some(BRIDGE_OFF.to_owned())
            };
        }
        Ok(appended)
    }

    /// An append as [`Streams::append`] makes it, when it can be made at
    /// once: in a watched process whose state of the stream matches the
    /// log (the head, read under the lock, names the last record read),
    /// without waiting for a lock (the stream's, in this process or any
    /// other) or reading the log, without a sync (`sync=none`: the record
    /// goes to the page cache) and with nothing more to do (no TTL to
    /// slide, no bound topic to import from or post to); `None`
    /// otherwise: call [`Streams::append`]. For a server's event loop,
    /// which must not block. System calls: `flock` (try), `pread` of the
    /// head, `fstat` of the segment, `pwrite` of the record and of the
    /// head, `flock` (unlock).
    pub fn append_nowait(&self, path: &str, req: &Append<'_>) -> Option<StreamResult<Appended>> {
        // On a shared store every write is a round trip to the file
        // server, and a lock call may wait for its turn (`shared::lock`).
        if self.config().sync == kn_journal::SyncPolicy::Always || self.config().shared == kn_journal::Shared::On || !self.watched {
            return None;
        }
        let long_id = req.producer.as_ref().is_some_and(|p| p.id.len() > self.config().stream_max_producer_id_bytes);
        if req.body.is_empty() || req.body.len() > self.config().stream_max_append_bytes || long_id {
            return None;
        }
        let cell = self.entries.try_lock().ok()?.get(path)?.clone();
        let mut guard = self.try_hold(&cell)?;
        let entry = &mut *guard;
        if entry.ino == 0 || entry.verify.is_some() || !entry.state.is_plain() {
            return None;
        }
        let read = entry.cursor.as_ref()?.last_seq();
        let files = entry.files.take()?;
        if !files.try_lock(self.config()) {
            entry.files = Some(files);
            return None;
        }
        // Held: reopened without a second `flock`. A removed stream's
        // spoiled head, or a segment changed, fails the reopen (the files
        // are closed, the lock released): the slow path opens afresh.
        let mut w = Writer::reopen_held(&self.writing, false, files).ok()??;
        if w.last_seq() != read {
            // Another process appended: the slow path reads its records.
            self.release(entry, w);
            return None;
        }
        let result = self.append_locked(path, req, entry, &mut w);
        self.release(entry, w);
        Some(result.map(|(appended, _)| appended))
    }

    #[allow(clippy::type_complexity)]
    fn append_locked(&self, path: &str, req: &Append<'_>, entry: &mut Entry, w: &mut Writer<'_>) -> StreamResult<(Appended, Option<(u64, Vec<String>)>)> {
        self.import_locked(entry, w)?;
        let s = &entry.state;
        if !s.exists || s.soft_deleted {
            return Err(if s.exists { StreamError::new(StreamErrorKind::Gone, format!("stream '{path}' was deleted")) } else { not_found(path) });
        }
        let done = |entry: &Entry, stored: bool, producer| Appended { info: Self::info(entry), stored, producer, bridge_error: None };
        if s.closed {
            if let (Some(p), Some((id, epoch, seq))) = (&req.producer, &s.closed_by) {
                if &p.id == id && p.epoch == *epoch && p.seq == *seq {
                    return Ok((done(entry, false, Some((p.epoch, p.seq))), None));
                }
            }
            if req.body.is_empty() && req.close {
                return Ok((done(entry, false, None), None));
            }
            let mut e = StreamError::new(StreamErrorKind::Closed, format!("stream '{path}' is closed"));
            e.next_offset = Some(offset(s.tail));
            return Err(e);
        }
        if !req.body.is_empty() {
            match req.content_type {
                None => return Err(StreamError::new(StreamErrorKind::BadRequest, "an append needs a Content-Type")),
                Some(ct) if essence(ct) != essence(&s.content_type) => {
                    return Err(StreamError::new(StreamErrorKind::Conflict, format!("content type '{ct}' is not the stream's '{}'", s.content_type)));
                }
                Some(_) => {}
            }
        }
        if let Some(p) = &req.producer {
            match s.producers.get(&p.id) {
                Some(&(epoch, _)) if p.epoch < epoch => {
                    let mut e = StreamError::new(StreamErrorKind::StaleEpoch, format!("producer '{}' epoch {} is stale (current {epoch})", p.id, p.epoch));
                    e.epoch = Some(epoch);
                    return Err(e);
                }
                Some(&(epoch, _)) if p.epoch > epoch && p.seq != 0 => {
                    return Err(StreamError::new(StreamErrorKind::BadRequest, format!("a new epoch must start at sequence 0, not {}", p.seq)));
                }
                Some(&(epoch, last)) if p.epoch == epoch && p.seq <= last => {
                    return Ok((done(entry, false, Some((epoch, last))), None));
                }
                Some(&(epoch, last)) if p.epoch == epoch && p.seq > last + 1 => {
                    let mut e = StreamError::new(StreamErrorKind::SequenceGap, format!("producer '{}' sent sequence {} after {last}", p.id, p.seq));
                    e.gap = Some((last + 1, p.seq));
                    return Err(e);
                }
                None if p.seq != 0 => {
                    let mut e = StreamError::new(StreamErrorKind::SequenceGap, format!("producer '{}' is new: its first sequence must be 0, not {}", p.id, p.seq));
                    e.gap = Some((0, p.seq));
                    return Err(e);
                }
                None if s.producers.len() >= self.config().stream_max_producers => {
                    return Err(StreamError::new(StreamErrorKind::BadRequest, format!("stream '{path}' has the most producers allowed ({}, KN_STREAM_MAX_PRODUCERS): a new Producer-Id is refused", self.config().stream_max_producers)));
                }
                _ => {}
            }
        }
        if let Some(seq) = req.stream_seq {
            if s.stream_seq.as_deref().is_some_and(|last| seq <= last) {
                return Err(StreamError::new(StreamErrorKind::Conflict, "Stream-Seq is not greater than the last one"));
            }
        }
        let messages: Vec<String> = if s.content_type.is_empty() || !is_json(&s.content_type) || req.body.is_empty() {
            Vec::new()
        } else {
            json::messages(req.body, false)?.into_iter().map(str::to_owned).collect()
        };
        let mut e = Event::new();
        if req.body.is_empty() {
            e.set(name::OP, op::CLOSE);
        } else {
            e.set(name::OP, op::APPEND);
            if is_json(&s.content_type) {
                e.set(kn_journal::KN_PAYLOAD, messages.join(","));
            } else {
                e.set(kn_journal::KN_PAYLOAD, req.body.to_vec());
            }
        }
        if let Some(p) = &req.producer {
            e.set(name::PRODUCER, p.id.as_str());
            e.set(name::EPOCH, p.epoch.to_string());
            e.set(name::SEQ, p.seq.to_string());
        }
        if let Some(seq) = req.stream_seq {
            e.set(name::STREAM_SEQ, seq.to_vec());
        }
        if req.close {
            e.set(name::CLOSE, "true");
        }
        let at = self.append_record(entry, w, e)?;
        self.counted.append(req.body.len());
        if entry.cursor.as_ref().is_none_or(|c| c.last_seq() < at) {
            self.refresh_until(entry, Some(at), None)?;
        }
        let producer = req.producer.as_ref().map(|p| (p.epoch, p.seq));
        let posted = if messages.is_empty() { None } else { Some((at, messages)) };
        Ok((done(entry, true, producer), posted))
    }

    // ----- read ---------------------------------------------------------

    /// Metadata (`HEAD`); does not reset a sliding TTL.
    pub fn head(&self, path: &str) -> StreamResult<Info> {
        self.check_path(path)?;
        let cell = self.entry(path);
        let mut entry = self.hold(&cell);
        self.live(path, &mut entry)?;
        self.import(&mut entry)?;
        Ok(Self::info(&entry))
    }

    /// Reads from `start` (catch-up), at most
    /// `Config::stream_max_read_bytes` (at least one record); resets a
    /// sliding TTL.
    pub fn read(&self, path: &str, start: Start) -> StreamResult<Chunk> {
        self.check_path(path)?;
        let cell = self.entry(path);
        let mut entry = self.hold(&cell);
        self.live(path, &mut entry)?;
        self.import(&mut entry)?;
        self.touch(&entry);
        let info = Self::info(&entry);
        let from = match start {
            Start::Beginning => 0,
            Start::Now => info.tail,
            Start::At(o) => o,
        };
        if from > info.tail {
            return Err(StreamError::new(StreamErrorKind::BadRequest, format!("offset {} is beyond the tail {}", offset(from), info.next_offset())));
        }
        if from == info.tail {
            return Ok(Joined::new(info.is_json(), 0).chunk(info, from, from));
        }
        if from >= entry.forgotten {
            return Ok(self.memory_chunk(&mut entry, from, info));
        }
        let mut cursor = match entry.marks.range(..=from).next_back() {
            Some((_, c)) => c.clone(),
            // Not placed: `read_new` starts in the segment holding the
            // record after `from` (found by its name), not at the start.
            None => LogCursor::at(from, 0, 0, 0),
        };
        drop(entry);
        let dir = self.stream_dir(path);
        let max = self.config().stream_max_read_bytes;
        let (mut joined, mut next) = (Joined::new(info.is_json(), 0), from);
        'read: loop {
            let records = log::read_new(&dir, &mut cursor)?;
            if records.is_empty() {
                break;
            }
            for r in records {
                if r.seq > info.tail {
                    break 'read;
                }
                if r.seq <= from || !has_data(&r) {
                    continue;
                }
                if !joined.add(r.event.payload(), max) {
                    break 'read;
                }
                next = r.seq;
            }
        }
        Ok(joined.chunk(info, from, next))
    }

    /// The data after `from` (at or after `entry.forgotten`: all of it in
    /// memory), at most `Config::stream_max_read_bytes` (at least one
    /// record).
    fn memory_chunk(&self, entry: &mut Entry, from: u64, info: Info) -> Chunk {
        if let Some(s) = entry.served.as_ref().filter(|s| s.from == from && s.tail == info.tail) {
            let (records, next, data) = (s.records, s.next, s.body.clone());
            return Chunk { up_to_date: next >= info.tail, info, start: from, next, records, data };
        }
        let max = self.config().stream_max_read_bytes;
        let first = entry.recent.partition_point(|(seq, _)| *seq <= from);
        let wanted = entry.recent.iter().skip(first).take_while(|(seq, _)| *seq <= info.tail);
        // Sized once (the payloads and their commas), however many fit.
        let capacity = wanted.clone().map(|(_, p)| p.len() + 1).sum::<usize>().min(max.saturating_add(1));
        let (mut joined, mut next) = (Joined::new(info.is_json(), capacity), from);
        for (seq, payload) in wanted {
            if !joined.add(payload, max) {
                break;
            }
            next = *seq;
        }
        let chunk = joined.chunk(info, from, next);
        entry.served = Some(Served { from, tail: chunk.info.tail, records: chunk.records, next, body: chunk.data.clone() });
        chunk
    }

    /// A catch-up read as [`Streams::read`] answers it, when it can be
    /// answered at once from memory without waiting for a lock, with one
    /// system call (a watched process whose cached state of the stream
    /// matches the log, `Streams::fresh`; the data in memory; a plain
    /// stream, `State::is_plain`: no TTL to slide, no bound topic to
    /// import from); `None` otherwise: call [`Streams::read`]. For a
    /// server's event loop, which must not block.
    pub fn read_cached(&self, path: &str, start: Start) -> Option<Chunk> {
        if !self.watched {
            return None;
        }
        let cell = self.entries.try_lock().ok()?.get(path)?.clone();
        let mut guard = self.try_hold(&cell)?;
        let entry = &mut *guard;
        if !self.fresh(entry) || !entry.state.is_plain() {
            return None;
        }
        let info = Self::info(entry);
        let from = match start {
            Start::Beginning => 0,
            Start::Now => info.tail,
            Start::At(o) => o,
        };
        if from > info.tail || from < entry.forgotten {
            return None;
        }
        Some(self.memory_chunk(entry, from, info))
    }

    /// Directories whose changes may bring `path` new data: the stream's
    /// and its bound topic's. Live reads wait on them
    /// ([`Streams::watch`]).
    pub fn watch(&self, path: &str) -> StreamResult<StreamWatch> {
        let cell = self.entry(path);
        let entry = self.hold(&cell);
        let mut subs = vec![self.store.hub().subscribe(&entry.dir)];
        if let Some(t) = entry.state.topic.as_deref().and_then(|t| kn_journal::Topic::parse(t).ok()) {
            subs.push(self.store.hub().subscribe(&t.dir(&self.config().root)));
        }
        Ok(StreamWatch { subs, poll: self.config().poll_interval, _live: Live::new(&self.live) })
    }

    // ----- delete -------------------------------------------------------

    /// Deletes the stream (`DELETE`). With forks it is only marked
    /// deleted (`410` from then on) until its last fork goes.
    pub fn delete(&self, path: &str) -> StreamResult<()> {
        self.check_path(path)?;
        let cell = self.entry(path);
        let mut entry = self.hold(&cell);
        self.live(path, &mut entry)?;
        let Some(mut w) = self.writer(&mut entry, false)? else { return Err(not_found(path)) };
        if entry.state.soft_deleted {
            self.release(&mut entry, w);
            return Err(StreamError::new(StreamErrorKind::Gone, format!("stream '{path}' was deleted")));
        }
        if entry.state.forks > 0 {
            let mut e = Event::new();
            e.set(name::OP, op::DELETE);
            let r = self.append_record(&mut entry, &mut w, e);
            self.release(&mut entry, w);
            r?;
            return self.refresh(&mut entry);
        }
        drop(w);
        let parent = entry.state.fork_from.clone();
        self.remove(path, &mut entry)?;
        drop(entry);
        if let Some(parent) = parent {
            self.count_fork(&parent, op::FORK_REMOVED)?;
        }
        Ok(())
    }

    /// Removes the stream's directory: renamed away first (one atomic
    /// step: readers see the whole stream or none), then deleted. Its
    /// head is spoiled before (its magic zeroed): a process that trusts
    /// its cached state while the head it holds open names its last read
    /// record ([`Streams::fresh`]) sees at once that the stream is gone.
    /// (A writer that finds a spoiled head in place rebuilds it from the
    /// log, FORMAT.md.)
    fn remove(&self, _path: &str, entry: &mut Entry) -> StreamResult<()> {
        entry.files = None;
        if let Ok(head) = fs::OpenOptions::new().write(true).open(entry.dir.join(log::HEAD_FILE)) {
            use std::os::unix::fs::FileExt;
            let _ = head.write_all_at(&[0; 8], 0);
        }
        let gone = self.dir.join(format!(".gone-{}", kn_journal::fresh_id()));
        match fs::rename(&entry.dir, &gone) {
            Ok(()) => release(&self.config().root, &gone),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("cannot delete stream", &entry.dir, e)),
        }
        let dir = std::mem::take(&mut entry.dir);
        *entry = Entry { dir, ..Entry::default() };
        Ok(())
    }

    // ----- the bridge ---------------------------------------------------

    /// Whether the bridge may carry events: only in a store without access
    /// rules (docs/ACCESS.md). The stream front door knows no user's rights
    /// on topics, so under rules (or a rules file that cannot be read) a
    /// stream is never bound to a topic, a bound one imports nothing, and
    /// its appends are not posted: nothing can be read or posted through a
    /// stream that could not be directly.
    fn bridge_allowed(&self) -> bool {
        matches!(self.store().access_rules(), Ok(None))
    }

    /// Imports what was notified to the bound topic since the last import
    /// (taking the lock only when there is something new).
    fn import(&self, entry: &mut Entry) -> StreamResult<()> {
        let Some(topic) = entry.state.topic.clone() else { return Ok(()) };
        if !self.bridge_allowed() {
            return Ok(());
        }
        if !self.topic_has_new(entry, &topic)? {
            return Ok(());
        }
        let Some(mut w) = self.writer(entry, false)? else { return Ok(()) };
        let r = self.import_locked(entry, &mut w);
        self.release(entry, w);
        r
    }
}

/// Deletes `gone`, a stream's directory set aside, and then the blobs
/// that its records alone held (a large payload is stored once in
/// `.blobs/`, FORMAT.md "Blobs"): a deleted stream leaves no orphan. Best
/// effort: what a crash or an unreadable segment leaves, the sweep
/// removes after `Config::blob_grace`.
fn release(root: &Path, gone: &Path) {
    let blobs = log::blobs_of(gone).unwrap_or_default();
    let _ = fs::remove_dir_all(gone);
    log::release_blobs(root, &blobs);
}

/// Creates a directory as topic directories are (setgid, group-writable
/// whatever the umask), so that every user of the store's group can write.
fn create_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::DirBuilder::new().mode(0o2775).create(path)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o2775))
}

fn not_found(path: &str) -> StreamError {
    StreamError::new(StreamErrorKind::NotFound, format!("no stream '{path}'"))
}

fn too_large(len: usize, max: usize) -> StreamError {
    StreamError::new(StreamErrorKind::TooLarge, format!("a body of {len} bytes is larger than the limit of {max}"))
}

/// Wakeups for a live read: a change in the stream's directory or its
/// bound topic's. Hints only: re-read after each.
pub struct StreamWatch {
    subs: Vec<kn_journal::logs::Subscription>,
    poll: std::time::Duration,
    _live: Live,
}

/// Counts a [`StreamWatch`] in `Streams::live` while it lives.
struct Live(Arc<AtomicUsize>);

impl Live {
    fn new(count: &Arc<AtomicUsize>) -> Live {
        count.fetch_add(1, Ordering::SeqCst);
        Live(count.clone())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl StreamWatch {
    /// Listeners to await (each a `Future`); arm them before re-reading.
    pub fn listen(&self) -> Vec<event_listener::EventListener> {
        self.subs.iter().map(|s| s.listen()).collect()
    }

    /// How long to sleep between re-reads when a directory is not
    /// watched (no change notification).
    pub fn poll_interval(&self) -> std::time::Duration {
        if self.subs.iter().all(|s| s.is_notified()) { std::time::Duration::from_secs(3600) } else { self.poll }
    }

    /// Blocks until a change or `timeout` (CGI processes).
    pub fn wait(&self, timeout: std::time::Duration) {
        let listeners = self.listen();
        // One listener is awaited; with a bound topic, poll the other.
        let timeout = if listeners.len() > 1 { timeout.min(self.poll) } else { timeout.min(self.poll_interval()) };
        match listeners.into_iter().next() {
            Some(l) => {
                kn_journal::logs::Subscription::wait(l, timeout);
            }
            None => std::thread::sleep(timeout),
        }
    }
}

//! Durable Streams (github.com/durable-streams, its protocol v1.0) on the
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
//! An offset is the checkpoint of the last record holding data and the
//! epoch of the stream's incarnation, 16 hex digits each ([`Offset`]): a
//! stream deleted and created again never repeats an offset of the one
//! before. A fork copies its source's records up to the fork point,
//! keeping their checkpoints and epochs, so offsets are shared as the
//! protocol wants.
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
use kn_journal::internal::logs::{self as log, LogCursor, SpaceGauge, Writer};
use kn_journal::internal::Record;
use kn_journal::Store;

mod bridge;
mod figures;
mod cache;
mod config;
mod expiry;
mod forks;
mod json;
mod offset;
mod snapshot;
mod state;
mod time;
mod types;
mod watch;
mod read;
mod write;

pub use config::StreamsConfig;
pub use figures::StreamFigures;
pub use expiry::{register as sweep_expired_streams, ExpirySweep};
pub use json::{essence, is_json};
pub use offset::{offset, parse_offset, parse_start, Offset, Start};
pub use time::parse_rfc3339;
pub use types::{Append, Appended, Chunk, Create, Created, Info, Producer, StreamError, StreamErrorKind, StreamResult};
pub use watch::StreamWatch;
use types::{io, Joined};
use watch::Live;

use cache::{Entry, Last, Served};
use forks::source_path;
use state::{has_data, name, op};

/// The directory of the store root holding the streams, one directory
/// each, named by the `xxh3_128` of the stream's path in hex.
pub use kn_journal::internal::STREAMS_DIR;

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

/// Why the bridge refuses while access rules are in force.
const BRIDGE_OFF: &str =
    "streams are not bridged to topics while access rules are in force (KN_ACCESS_RULES): the stream front door does not know the user's rights on topics";


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
    /// The front door's own settings (limits, caches, live reads).
    settings: StreamsConfig,
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

    /// These streams with `settings` in place of the defaults (which
    /// [`Streams::new`] and [`Streams::watched`] start with);
    /// `serve` and pubsub.cgi give [`StreamsConfig::from_env`].
    ///
    /// ```
    /// use kn_streams::{Streams, StreamsConfig};
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = std::sync::Arc::new(kn_journal::Store::open(dir.path()).unwrap());
    /// let streams = Streams::new(store).with_config(StreamsConfig { max_path_bytes: 64, ..StreamsConfig::default() });
    /// assert_eq!(streams.streams_config().max_path_bytes, 64);
    /// ```
    pub fn with_config(self, settings: StreamsConfig) -> Streams {
        Streams { settings, ..self }
    }

    /// The settings these streams answer with.
    pub fn streams_config(&self) -> &StreamsConfig {
        &self.settings
    }

    /// [`Streams::new`] without registering the sweep's pass.
    fn unregistered(store: Arc<Store>) -> Streams {
        let dir = store.config().root.join(STREAMS_DIR);
        let mut writing = store.config().clone();
        writing.journal_max_age = Duration::MAX;
        writing.journal_max_bytes = u64::MAX;
        Streams { store, dir, entries: Mutex::default(), cached_bytes: AtomicUsize::new(0), gauge: SpaceGauge::default(), writing, watched: false, settings: StreamsConfig::default(), replayed: AtomicU64::new(0), live: Arc::default(), counted: Default::default() }
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

    /// The directory of the stream at `path`: named by a hash of the
    /// path, which a client could make collide with another's, so every
    /// use compares the full path its `create` record holds
    /// (`State::is_of`): a path whose directory holds another stream
    /// finds no stream there and cannot create one.
    fn stream_dir(&self, path: &str) -> PathBuf {
        self.dir.join(format!("{:032x}", xxhash_rust::xxh3::xxh3_128(path.as_bytes())))
    }

    fn check_path(&self, path: &str) -> StreamResult<()> {
        let max = self.streams_config().max_path_bytes;
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
                    entry.remember(r.seq, r.event.payload(), self.streams_config().cache_bytes);
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
        let stored_secs = kn_journal::internal::now() as u64;
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
            entry.remember(seq, record.event.payload(), self.streams_config().cache_bytes);
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
            tail: s.epochs.offset(s.tail),
            ttl: s.ttl,
            expires_at: s.expires_at.clone(),
            closed: s.closed,
            topic: s.topic.clone(),
            id: Self::id(entry),
            epochs: s.epochs.clone(),
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
        if !entry.state.exists || !entry.state.is_of(path) {
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

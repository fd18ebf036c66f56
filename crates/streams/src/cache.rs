//! What a process keeps of the streams it served (`Entry`), and the
//! bounds on it: at most `StreamsConfig::cache` streams, holding at most
//! `StreamsConfig::cache_memory` bytes in all.
//!
//! The bytes are an estimate made each time a request lets go of a
//! stream ([`Held`]'s drop): the state (producers above all: up to
//! `StreamsConfig::max_producers` ids of up to `StreamsConfig::max_producer_id_bytes`
//! each), read positions, the latest data, the last body served and the
//! last record. Past the bound, every stream that no request holds is
//! forgotten (nothing is lost: all is in the log), as when the count is
//! reached. A stream in use is never forgotten, so the bound is exceeded
//! by at most what the requests running at once hold.

use std::collections::BTreeMap;
use std::fs;
use std::ops::{Deref, DerefMut};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::state::State;
use super::{lock, snapshot, Streams};
use kn_journal::internal::logs::{LogCursor, TopicFiles};
use kn_journal::internal::Record;

/// What a process knows of one stream between requests.
#[derive(Default)]
pub(super) struct Entry {
    pub(super) dir: PathBuf,
    /// Inode of the stream directory the state was read from (0: none).
    pub(super) ino: u64,
    pub(super) state: State,
    pub(super) cursor: Option<LogCursor>,
    /// Cursors after batches of records, by the last checkpoint read, so
    /// that a read from any offset starts near it.
    pub(super) marks: BTreeMap<u64, LogCursor>,
    pub(super) files: Option<TopicFiles>,
    /// Where the bound topic was read up to.
    pub(super) topic_cursor: Option<LogCursor>,
    /// The latest data records, `(seq, payload)`, at most
    /// `StreamsConfig::cache_bytes` of payload: catch-up reads of the
    /// tail need no file read.
    pub(super) recent: std::collections::VecDeque<(u64, Arc<[u8]>)>,
    pub(super) recent_bytes: usize,
    /// The highest checkpoint of data dropped from `recent` (0: none):
    /// reads from at or after it are served from memory.
    pub(super) forgotten: u64,
    /// The last record applied to `state`, and where it ends: what a
    /// snapshot is taken after.
    pub(super) last: Option<Last>,
    /// Records and payload bytes applied since the snapshot was read or
    /// written (or since the first record).
    pub(super) since: (u64, u64),
    /// The snapshot's record, when the state came from a snapshot and the
    /// log has not confirmed it yet (see `snapshot.rs`).
    pub(super) verify: Option<snapshot::Mark>,
    /// The snapshot did not match the log: replay the whole log.
    pub(super) no_snapshot: bool,
    /// In a watched process: the log's `.head` open for reading, with its
    /// inode, and when its path was last found to name that file. While
    /// the head names the last record read, `state` still matches the log
    /// (see `Streams::fresh`).
    pub(super) head: Option<(fs::File, u64)>,
    pub(super) checked: Option<Instant>,
    /// The last read answered from memory: from where, at which tail, and
    /// what it returned (records, next, body). The same range of an
    /// append-only stream always holds the same data, so a read of it
    /// again shares that body instead of joining it afresh (readers that
    /// catch up from the same offset, as the protocol's caches do).
    pub(super) served: Option<Served>,
    /// The stream's id for ETags, with the `created` stamp it is of
    /// (made once, not on every request).
    pub(super) id: std::cell::RefCell<Option<(String, String)>>,
}

/// See `Entry::served`.
pub(super) struct Served {
    pub(super) from: u64,
    pub(super) tail: u64,
    pub(super) records: usize,
    pub(super) next: u64,
    pub(super) body: bytes::Bytes,
}

/// The last record applied to a stream's state, where its segment ends.
pub(super) struct Last {
    pub(super) record: Record,
    pub(super) segment: u64,
    pub(super) ino: u64,
    pub(super) end: u64,
}

impl Entry {
    pub(super) fn remember(&mut self, seq: u64, payload: &[u8], budget: usize) {
        self.recent.push_back((seq, Arc::from(payload)));
        self.recent_bytes += payload.len();
        while self.recent_bytes > budget {
            let Some((seq, p)) = self.recent.pop_front() else { break };
            self.recent_bytes -= p.len();
            self.forgotten = seq;
        }
    }
}


/// A stream as the cache holds it: its entry, and what the cache counts
/// for it.
#[derive(Default)]
pub(super) struct Cell {
    entry: Mutex<Entry>,
    /// The entry's footprint as last counted in `Streams::cached_bytes`.
    accounted: AtomicUsize,
    /// In the cache's map (else nothing is counted for it).
    cached: AtomicBool,
}

/// A stream locked by a request; when let go, its footprint is counted
/// again and the cache trimmed if it is over its bound.
pub(super) struct Held<'a> {
    streams: &'a Streams,
    cell: &'a Cell,
    guard: Option<MutexGuard<'a, Entry>>,
}

impl Deref for Held<'_> {
    type Target = Entry;
    fn deref(&self) -> &Entry {
        self.guard.as_ref().expect("held until dropped")
    }
}

impl DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Entry {
        self.guard.as_mut().expect("held until dropped")
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let Some(guard) = self.guard.take() else { return };
        if !self.cell.cached.load(Ordering::Relaxed) {
            return;
        }
        let now = guard.footprint();
        drop(guard);
        let before = self.cell.accounted.swap(now, Ordering::Relaxed);
        if now >= before {
            self.streams.cached_bytes.fetch_add(now - before, Ordering::Relaxed);
        } else {
            self.streams.cached_bytes.fetch_sub(before - now, Ordering::Relaxed);
        }
        if self.streams.cached_bytes.load(Ordering::Relaxed) > self.streams.streams_config().cache_memory {
            // Never waited for (this may run on a server's event loop):
            // when the map is busy, the next request trims it.
            if let Ok(mut entries) = self.streams.entries.try_lock() {
                self.streams.forget_idle(&mut entries);
            }
        }
    }
}

/// Fixed cost counted per cached stream: the entry, its open files and
/// cursors, the map's slot.
const ENTRY_BYTES: usize = 1024;
/// Counted per producer beside its id (the map's slot, two numbers).
const PRODUCER_BYTES: usize = 64;
/// Counted per read position kept (`Entry::marks`) and per latest record
/// (`Entry::recent`) beside its payload.
const MARK_BYTES: usize = 96;

impl Entry {
    /// An estimate of the memory this entry holds.
    fn footprint(&self) -> usize {
        let s = &self.state;
        let producers = s.producer_bytes + s.producers.len() * PRODUCER_BYTES;
        let closed_by = s.closed_by.as_ref().map_or(0, |(id, _, _)| id.len());
        let strings = s.path.len() + s.content_type.len() + s.created.len() + closed_by;
        let optional = [&s.expires_at, &s.fork_from, &s.topic].iter().map(|o| o.as_ref().map_or(0, String::len)).sum::<usize>();
        let recent = self.recent_bytes + self.recent.len() * MARK_BYTES;
        let served = self.served.as_ref().map_or(0, |s| s.body.len());
        let last = self.last.as_ref().map_or(0, |l| l.record.event.payload().len());
        ENTRY_BYTES
            + self.dir.as_os_str().len()
            + strings
            + optional
            + s.stream_seq.as_ref().map_or(0, Vec::len)
            + producers
            + self.marks.len() * MARK_BYTES
            + recent
            + served
            + last
    }
}

impl Streams {
    /// The cached stream of `path` (made, empty, if there is none): kept
    /// in the cache unless it holds `StreamsConfig::cache` streams in use.
    pub(super) fn entry(&self, path: &str) -> Arc<Cell> {
        let mut entries = lock(&self.entries);
        if let Some(e) = entries.get(path) {
            return e.clone();
        }
        if entries.len() >= self.streams_config().cache.max(1) || self.cached_bytes.load(Ordering::Relaxed) > self.streams_config().cache_memory {
            self.forget_idle(&mut entries);
        }
        let cell = Arc::new(Cell::default());
        *lock(&cell.entry) = Entry { dir: self.stream_dir(path), ..Entry::default() };
        if entries.len() < self.streams_config().cache.max(1) {
            cell.cached.store(true, Ordering::Relaxed);
            entries.insert(path.to_owned(), cell.clone());
        }
        cell
    }

    /// Forgets every cached stream no request holds (none is lost: all
    /// is in the log), uncounting its bytes.
    fn forget_idle(&self, entries: &mut std::collections::HashMap<String, Arc<Cell>>) {
        entries.retain(|_, cell| {
            if Arc::strong_count(cell) > 1 {
                return true;
            }
            cell.cached.store(false, Ordering::Relaxed);
            self.cached_bytes.fetch_sub(cell.accounted.swap(0, Ordering::Relaxed), Ordering::Relaxed);
            false
        });
    }

    /// Locks `cell` for a request.
    pub(super) fn hold<'a>(&'a self, cell: &'a Cell) -> Held<'a> {
        Held { streams: self, cell, guard: Some(lock(&cell.entry)) }
    }

    /// Locks `cell` if no one holds it.
    pub(super) fn try_hold<'a>(&'a self, cell: &'a Cell) -> Option<Held<'a>> {
        let guard = cell.entry.try_lock().ok()?;
        Some(Held { streams: self, cell, guard: Some(guard) })
    }

    /// How many bytes (an estimate) the streams this process keeps in
    /// memory hold: at most `StreamsConfig::cache_memory` plus what the
    /// requests running now hold.
    pub fn cache_bytes(&self) -> usize {
        self.cached_bytes.load(Ordering::Relaxed)
    }
}

//! The `Writer`: exclusive, locked access to append to one topic (attach
//! or reuse the open files, recover a torn tail, look up and index `kn_id`s,
//! append, roll to a new segment), and the free-space gauge of appends.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::ErrorKind as IoKind;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::config::{Config, SyncPolicy};
use crate::error::{Error, ErrorKind, Result};
use crate::event::Event;
use crate::record::{self, BlobRef};

use super::{FILE_MODE, HEAD_FILE, LOCK_FILE, SharedPayload, eio, failpoint, group_writable, open_rw, sync_dir};
use super::head::{HEAD_SIZE, Head, HeadFile, INITIAL_SLOTS, SLOT_SIZE, decode_slot, encode_slot, id_hash, index_full, rebuild_head, recovery_of, write_head_file};
use super::segment::{Mode, Written, scan_file, segment_name, stat_fd, unlinked};
use super::space::SpaceGauge;
use super::blob::{link_name, list_links, refs_of_segment, store, sweep_one};
use super::segment;

/// What an append did to an ordinary topic's current state.
#[derive(Debug, PartialEq, Eq)]
pub enum Appended {
    /// Stored under this sequence number.
    Stored(u64),
    /// Same `kn_id` and end-to-end elements as the current event: not stored.
    Duplicate,
}

/// Exclusive access to append to one topic. Holding it holds the topic's
/// lock; dropping it releases the lock. [`Writer::release`] unlocks and
/// hands back the open files, so that a long-lived process can append to
/// the topic again without opening anything ([`TopicFiles`]).
pub struct Writer<'c> {
    pub(super) dir: PathBuf,
    pub(super) config: &'c Config,
    pub(super) ordinary: bool,
    pub(super) lock: File,
    pub(super) head_file: HeadFile,
    pub(super) head: Head,
    pub(super) segment: File,
    /// The first seq (name) of the segment `segment` really is: it differs
    /// from `head.active` only after a roll failed half-way.
    pub(super) segment_first: u64,
    /// The inode of `segment` as last seen (0: not known).
    pub(super) segment_ino: u64,
    /// The last record [`Writer::append_shared`] stored, as written, for
    /// [`Writer::take_written`].
    pub(super) written: Option<Written>,
    /// Records were written at the end of the segment and not yet counted
    /// in the head (an append failed in between: an index slot, the
    /// index's growth, the head): this writer's idea of where the log
    /// ends is behind the file, and another append would write a record
    /// of the same seq over them, which a reader may have delivered
    /// already. So it appends nothing more ([`Writer::unfenced`]); the
    /// next writer, opened afresh, adopts them (`recover_tail`).
    pub(super) fenced: bool,
}

/// A topic's open files, kept by a process between appends (unlocked).
/// Reused only after re-locking and re-reading the head: another process
/// may have appended, rolled, or replaced the head meanwhile (a replaced
/// head is invalidated first, see `write_head_file`).
pub struct TopicFiles {
    pub(super) dir: PathBuf,
    pub(super) lock: File,
    pub(super) head_file: HeadFile,
    pub(super) segment: File,
    segment_first: u64,
    segment_ino: u64,
}

/// In shared mode, `file` (just opened under the topic's lock) without
/// the pages this host cached of it: another host may have written them
/// since (FORMAT.md, "Shared mode"). As it is otherwise.
fn shared_fresh(config: &Config, file: File) -> File {
    if config.shared == crate::config::Shared::On {
        crate::shared::drop_cached_pages(&file);
    }
    file
}

impl TopicFiles {
    /// Takes the topic's lock if no process holds it, without waiting;
    /// [`Writer::reopen_held`] then goes on under it.
    pub fn try_lock(&self, config: &Config) -> bool {
        crate::shared::try_lock(&self.lock, crate::shared::LockKind::Exclusive, config).unwrap_or(false)
    }

    /// True when the topic was removed (its `.lock` unlinked) or its
    /// active segment is gone (compacted, removed) since these files were
    /// kept: they will never be used again.
    pub(crate) fn is_dead(&self) -> bool {
        unlinked(&self.lock) || unlinked(&self.segment)
    }
}

impl<'c> Writer<'c> {
    /// Locks the topic in `dir` (which must exist) and brings the writer's
    /// state up to date with the log, truncating a torn tail.
    pub fn open(dir: &Path, config: &'c Config, ordinary: bool) -> Result<Writer<'c>> {
        let lock_path = dir.join(LOCK_FILE);
        let lock = open_rw(&lock_path, true).map_err(|e| Error::io("cannot open lock file", &lock_path, e))?;
        crate::shared::lock(&lock, crate::shared::LockKind::Exclusive, config).map_err(|e| Error::io("cannot lock topic", &lock_path, e))?;
        // The sweep removes a topic under its lock, unlinking `.lock` first
        // (FORMAT.md, "Removal"): a writer that waited for it writes nowhere.
        if unlinked(&lock) {
            return Err(super::writer::removed(dir));
        }
        let head_path = dir.join(HEAD_FILE);
        let existing = match open_rw(&head_path, false) {
            Ok(f) => HeadFile::new(shared_fresh(config, f)).ok().and_then(|f| {
                let mut buf = [0u8; HEAD_SIZE as usize];
                let head = f.read_exact_at(&mut buf, 0).ok().and_then(|_| Head::decode(&buf));
                head.map(|h| (f, h))
            }),
            Err(e) if e.kind() == IoKind::NotFound => None,
            Err(e) => return Err(Error::io("cannot open head", &head_path, e)),
        };
        let (head_file, head) = match existing {
            Some(x) => x,
            None => rebuild_head(dir, config, ordinary)?,
        };
        let mut w = match Writer::attach(dir, config, ordinary, lock, head_file, head)? {
            Ok(w) => w,
            Err(lock) => {
                let (head_file, head) = rebuild_head(dir, config, ordinary)?;
                match Writer::attach(dir, config, ordinary, lock, head_file, head)? {
                    Ok(w) => w,
                    Err(_) => return Err(Error::new(ErrorKind::Corrupt, format!("cannot recover the log in '{}'", dir.display()))),
                }
            }
        };
        if w.recover_tail()? {
            return Ok(w);
        }
        // The head does not match the log after all: rebuild it, once.
        let (head_file, head) = rebuild_head(dir, config, ordinary)?;
        if let Ok(mut w) = Writer::attach(dir, config, ordinary, w.lock, head_file, head)? {
            if w.recover_tail()? {
                return Ok(w);
            }
        }
        Err(Error::new(ErrorKind::Corrupt, format!("cannot recover the log in '{}'", dir.display())))
    }

    /// Locks the topic with `files` kept from an earlier append, when they
    /// still match the topic's state (see [`TopicFiles`]); `None` (files
    /// closed, lock released) when it must be opened afresh. Opens nothing
    /// and looks no path up.
    pub fn reopen(config: &'c Config, ordinary: bool, files: TopicFiles) -> Result<Option<Writer<'c>>> {
        let Some(mut w) = Writer::reuse(config, ordinary, files, false)? else { return Ok(None) };
        Ok(if w.recover_tail()? { Some(w) } else { None })
    }

    /// [`Writer::reopen`] when the caller already holds the lock of
    /// `files` ([`TopicFiles::try_lock`]): the same without a second
    /// `flock`.
    pub fn reopen_held(config: &'c Config, ordinary: bool, files: TopicFiles) -> Result<Option<Writer<'c>>> {
        let Some(mut w) = Writer::reuse(config, ordinary, files, true)? else { return Ok(None) };
        Ok(if w.recover_tail()? { Some(w) } else { None })
    }

    /// Locks with kept files (unless `held`: the caller holds the lock);
    /// `None` (files closed, lock released) when the head was replaced or
    /// the active segment changed: open afresh.
    pub(super) fn reuse(config: &'c Config, ordinary: bool, files: TopicFiles, held: bool) -> Result<Option<Writer<'c>>> {
        if !held {
            if let Err(e) = crate::shared::lock(&files.lock, crate::shared::LockKind::Exclusive, config) {
                return Err(Error::io("cannot lock topic", &files.dir.join(LOCK_FILE), e));
            }
        }
        if config.shared == crate::config::Shared::On {
            // Another host may have written both since this host read them.
            crate::shared::drop_cached_pages(&files.head_file.file);
            crate::shared::drop_cached_pages(&files.segment);
        }
        let mut buf = [0u8; HEAD_SIZE as usize];
        let head = files.head_file.read_exact_at(&mut buf, 0).ok().and_then(|_| Head::decode(&buf));
        match head {
            Some(head) if head.active == files.segment_first && (!ordinary || head.slots > 0) => Ok(Some(Writer {
                dir: files.dir,
                config,
                ordinary,
                lock: files.lock,
                head_file: files.head_file,
                head,
                segment: files.segment,
                segment_first: files.segment_first,
                segment_ino: files.segment_ino,
                written: None,
                fenced: false,
            })),
            _ => Ok(None),
        }
    }

    /// Whether appending `event` is a few writes to files open already:
    /// no blob to store, no index to grow, no compaction to run after it
    /// (what a caller that must not block checks first).
    pub(crate) fn appends_at_once(&self, event: &Event) -> bool {
        let blob = self.config.blob_bytes > 0 && event.payload().len() > self.config.blob_bytes;
        let grows = self.ordinary && index_full(self.head.used, self.head.slots);
        !blob && !grows && !self.may_want_compaction_after_append()
    }

    /// The checkpoint of the last record in the log, as of now (0: none).
    pub fn last_seq(&self) -> u64 {
        self.head.next_seq.saturating_sub(1)
    }

    /// The end of the log as of now: the active segment (its first seq)
    /// and its length, so that a process that appended can place its
    /// read cursor after its own record without reading it back.
    pub fn end(&self) -> (u64, u64) {
        (self.head.active, self.head.active_len)
    }

    /// The topic's route generation (see `Head::routes`), as of now: the
    /// routes read after this call are at least as new as this value says.
    pub(crate) fn routes_generation(&self) -> u64 {
        self.head.routes
    }

    /// Marks that this topic's routes are about to change, so that no
    /// process keeps using the routes it read before. Call it before
    /// writing to `kn_routes`, and keep this writer (its lock) until that
    /// write is done.
    pub(crate) fn routes_changing(&mut self) -> Result<()> {
        self.head.routes = self.head.routes.wrapping_add(1);
        self.write_head()
    }

    /// Unlocks the topic and returns its open files for a later append.
    pub fn release(self) -> TopicFiles {
        crate::shared::unlock(&self.lock, self.config);
        TopicFiles {
            dir: self.dir,
            lock: self.lock,
            head_file: self.head_file,
            segment: self.segment,
            segment_first: self.segment_first,
            segment_ino: self.segment_ino,
        }
    }

    /// The record the last append stored, as written (its segment's
    /// inode, offset and frame), so that this process can hand it to its
    /// own readers instead of their reading it back (`watch.rs`). `None`
    /// when it stored nothing, or a blob (its payload is in another file),
    /// or the segment's inode is not known.
    pub(crate) fn take_written(&mut self) -> Option<Written> {
        self.written.take()
    }

    /// Opens the active segment named by `head`. `Err(lock)` hands the lock
    /// back when the head does not match the log (it must be rebuilt).
    pub(super) fn attach(
        dir: &Path,
        config: &'c Config,
        ordinary: bool,
        lock: File,
        head_file: HeadFile,
        head: Head,
    ) -> Result<std::result::Result<Writer<'c>, File>> {
        let path = dir.join(segment_name(head.active));
        let segment = match open_rw(&path, false) {
            Ok(f) => shared_fresh(config, f),
            Err(e) if e.kind() == IoKind::NotFound && head.active_len == 0 => {
                let f = open_rw(&path, true).map_err(|e| Error::io("cannot create segment", &path, e))?;
                if config.sync == SyncPolicy::Always {
                    sync_dir(dir)?;
                }
                f
            }
            Err(e) if e.kind() == IoKind::NotFound => return Ok(Err(lock)),
            Err(e) => return Err(Error::io("cannot open segment", &path, e)),
        };
        let stat = stat_fd(&segment).map_err(|e| Error::io("cannot stat segment", &path, e))?;
        let (size, segment_ino) = (stat.size, stat.ino);
        if size < head.active_len || (ordinary && head.slots == 0) {
            return Ok(Err(lock));
        }
        // A head shorter than its own table (cut by a crash) must be rebuilt.
        let head_len = head_file.len();
        if head_len < HEAD_SIZE + head.slots * SLOT_SIZE {
            return Ok(Err(lock));
        }
        // A roll always starts the new segment at `next_seq`: if that file
        // exists while the head names an older one, the head lost writes (a
        // power cut) and must be rebuilt from the log, or sequence numbers
        // would be reused.
        if head.next_seq != head.active && dir.join(segment_name(head.next_seq)).exists() {
            return Ok(Err(lock));
        }
        let segment_first = head.active;
        Ok(Ok(Writer { dir: dir.to_path_buf(), config, ordinary, lock, head_file, head, segment, segment_first, segment_ino, written: None, fenced: false }))
    }

    /// Adopts whole records that a writer appended but did not record in
    /// the head (it was killed), and truncates a torn tail. Bad bytes that
    /// are not a torn tail (valid records follow them, or the last frame is
    /// corrupt rather than incomplete) are kept: the segment is sealed and
    /// appends go on in a new one (see `recovery_of`).
    /// Returns false when the open segment was deleted (its name must be
    /// opened again) or the head lags behind the log (it must be rebuilt).
    fn recover_tail(&mut self) -> Result<bool> {
        let meta = match stat_fd(&self.segment) {
            Ok(meta) => meta,
            Err(e) => return Err(Error::io("cannot stat segment", &self.dir.join(segment_name(self.head.active)), e)),
        };
        if meta.links == 0 {
            return Ok(false);
        }
        self.segment_ino = meta.ino;
        let size = meta.size;
        if size == self.head.active_len {
            return Ok(true);
        }
        let path = self.dir.join(segment_name(self.head.active));
        let floor = self.head.next_seq.saturating_sub(1);
        let scan = scan_file(&mut self.segment, &path, self.head.active_len, floor, Mode::Whole, 0)?;
        let tail = recovery_of(&scan, size);
        let adopted_next = scan.records.iter().map(|(_, r)| r.seq + 1).max().unwrap_or(0).max(self.head.next_seq);
        let adopted_next = adopted_next + tail.hidden;
        if adopted_next != self.head.active && self.dir.join(segment_name(adopted_next)).exists() {
            // The head lags behind the log across a roll (a power cut with
            // sync=none): only a rebuild knows the right next seq.
            return Ok(false);
        }
        for (_, r) in &scan.records {
            self.head.next_seq = self.head.next_seq.max(r.seq + 1);
            if self.ordinary {
                let digest = super::blob::digest(&self.dir, r);
                self.index(&r.event, digest)?;
            }
        }
        self.head.next_seq = adopted_next;
        if tail.truncate {
            self.segment.set_len(scan.end).map_err(|e| Error::io("cannot truncate torn tail of", &path, e))?;
        }
        self.head.active_len = if tail.truncate { scan.end } else { size };
        if tail.seal && self.head.next_seq > self.head.active {
            self.roll()?;
        }
        self.write_head()?;
        Ok(true)
    }

    fn write_head(&mut self) -> Result<()> {
        self.head_file
            .write_all_at(&self.head.encode(), 0)
            .map_err(|e| Error::io("cannot write head", &self.dir.join(HEAD_FILE), e))
    }

    /// Looks `id` up in the duplicate index: the digest of its current
    /// event's end-to-end elements, if it has one.
    pub(super) fn lookup(&self, id: &[u8]) -> Result<(u64, Option<u64>)> {
        const PROBE_SLOTS: u64 = 16;
        let h = id_hash(id);
        let mask = self.head.slots - 1;
        let mut i = h & mask;
        let mut buf = [0u8; PROBE_SLOTS as usize * SLOT_SIZE as usize];
        loop {
            // Read up to PROBE_SLOTS slots at once (never past the table's
            // end): at a load near 0.8 a search for an absent id runs over
            // a dozen slots, which then take one read.
            let n = PROBE_SLOTS.min(self.head.slots - i) as usize;
            let bytes = &mut buf[..n * SLOT_SIZE as usize];
            self.head_file
                .read_exact_at(bytes, HEAD_SIZE + i * SLOT_SIZE)
                .map_err(|e| Error::io("cannot read index", &self.dir.join(HEAD_FILE), e))?;
            for k in 0..n {
                let (slot_hash, digest) = decode_slot(&bytes[k * SLOT_SIZE as usize..(k + 1) * SLOT_SIZE as usize]);
                if slot_hash == 0 {
                    return Ok((i + k as u64, None));
                }
                if slot_hash == h {
                    return Ok((i + k as u64, Some(digest)));
                }
            }
            i = (i + n as u64) & mask;
        }
    }

    /// Records `event`, whose end-to-end digest is `digest`, as the
    /// current one for its `kn_id`.
    pub(super) fn index(&mut self, event: &Event, digest: u64) -> Result<()> {
        let id = event.id().unwrap_or(b"");
        if index_full(self.head.used, self.head.slots) {
            self.grow_index()?;
        }
        let (slot, old) = self.lookup(id)?;
        match old {
            Some(_) => self.head.garbage += 1,
            None => {
                self.head.used += 1;
                self.head.live += 1;
            }
        }
        self.write_slot(slot, id_hash(id), digest)
    }

    /// Writes `event`'s index slot (found by [`Writer::lookup`]: its id's
    /// own when `replaced`, else the empty one that ended the search) with
    /// `digest`, counting it in the head's live and garbage figures.
    pub(super) fn write_indexed(&mut self, event: &Event, slot: u64, replaced: bool, digest: u64) -> Result<()> {
        if failpoint("index-eio") {
            return Err(Error::io("cannot write index", &self.dir.join(HEAD_FILE), eio()));
        }
        // An event that expires (a deleted or poisoned route, a withdrawn
        // announcement, a route made with kn_expires) is garbage to come,
        // not live data: compaction is weighed against the ids that stay
        // (see `wants_compaction`).
        let expiring = event.contains(crate::event::KN_EXPIRES);
        if replaced {
            self.head.garbage += 1;
            if expiring {
                self.head.live = self.head.live.saturating_sub(1);
            }
        } else {
            self.head.used += 1;
            if expiring {
                self.head.garbage += 1;
            } else {
                self.head.live += 1;
            }
        }
        self.write_slot(slot, id_hash(event.id().unwrap_or(b"")), digest)
    }

    fn write_slot(&self, slot: u64, hash: u64, digest: u64) -> Result<()> {
        self.head_file
            .write_all_at(&encode_slot(hash, digest), HEAD_SIZE + slot * SLOT_SIZE)
            .map_err(|e| Error::io("cannot write index", &self.dir.join(HEAD_FILE), e))
    }

    pub(super) fn grow_index(&mut self) -> Result<()> {
        let path = self.dir.join(HEAD_FILE);
        let mut table = vec![0u8; (self.head.slots * SLOT_SIZE) as usize];
        self.head_file.read_exact_at(&mut table, HEAD_SIZE).map_err(|e| Error::io("cannot read index", &path, e))?;
        let entries: Vec<(u64, u64)> =
            table.chunks_exact(SLOT_SIZE as usize).map(decode_slot).filter(|&(h, _)| h != 0).collect();
        let slots = (self.head.slots * 2).max(INITIAL_SLOTS);
        let head = Head { slots, used: entries.len() as u64, ..self.head };
        self.head_file = write_head_file(&self.dir, &head, &entries)?;
        self.head = head;
        Ok(())
    }

    /// Appends `event` (which must carry a `kn_id`) as one record. On an
    /// ordinary topic a duplicate is not stored.
    /// A payload longer than `Config::blob_bytes` is stored as a blob.
    pub fn append(&mut self, event: &Event, stored_secs: u64, gauge: &SpaceGauge) -> Result<Appended> {
        if self.config.blob_bytes > 0 && event.payload().len() > self.config.blob_bytes {
            let mut bare = event.clone();
            let payload = SharedPayload::take_from(&mut bare, self.config);
            return self.append_shared(&bare, payload.as_ref(), stored_secs, gauge);
        }
        self.append_shared(event, None, stored_secs, gauge)
    }

    /// Appends `event` as [`Writer::append`] does; with `payload`, the
    /// event's `kn_payload` is that blob's content (the event must not
    /// carry one): the blob is stored if need be and linked into the
    /// topic, and the record refers to it (FORMAT.md, "Blobs").
    pub(crate) fn append_shared(
        &mut self,
        event: &Event,
        payload: Option<&SharedPayload>,
        stored_secs: u64,
        gauge: &SpaceGauge,
    ) -> Result<Appended> {
        self.unfenced()?;
        self.written = None;
        // One index probe serves both the duplicate check and the update.
        let digest = if self.ordinary { event.end_to_end_digest_with_payload(payload.map(|p| &p.bytes[..])) as u64 } else { 0 };
        let id = event.id().unwrap_or(b"");
        let slot = if self.ordinary {
            if index_full(self.head.used, self.head.slots) {
                self.grow_index()?;
            }
            let (slot, old) = self.lookup(id)?;
            if old == Some(digest) {
                return Ok(Appended::Duplicate);
            }
            Some((slot, old.is_some()))
        } else {
            None
        };
        let seq = self.head.next_seq;
        let frame = record::encode_event(seq, stored_secs, event, payload.map(|p| &p.reference));
        if self.head.active_len > 0 && self.head.active_len + frame.len() as u64 > self.config.segment_bytes {
            self.roll()?;
        }
        if let Some(payload) = payload {
            // The blob and its link exist before the record that refers
            // to them: a failure in between leaves an unreferenced link.
            self.link_blob(seq, payload, gauge)?;
        }
        gauge.check(&self.dir, self.config.reserve_bytes, frame.len() as u64)?;
        self.write_at_end(&frame)?;
        if let Some((slot, replaced)) = slot {
            self.write_indexed(event, slot, replaced, digest)?;
        }
        let offset = self.head.active_len;
        self.count_appended(seq + 1, frame.len() as u64)?;
        if payload.is_none() && self.segment_ino != 0 && self.segment_first == self.head.active {
            self.written = Some(Written { segment: self.segment_first, ino: self.segment_ino, offset, frame });
        }
        Ok(Appended::Stored(seq))
    }

    /// Appends `events` to a journal (whose events are never checked for
    /// duplicates) as consecutive records, in order, with one write of
    /// their frames and one of the head: the copies one forwarding pass
    /// delivers to a journal (FORMAT.md, "Forwarding", "Deferred
    /// forwarding"). Returns their seqs. An event whose payload is large
    /// enough for a blob, or a run that would not fit the active segment,
    /// is appended one record at a time, as [`Writer::append`] does.
    /// A crash part-way leaves whole records the head does not name yet,
    /// or a torn last one: the next writer adopts or truncates them
    /// (`recover_tail`), as after a single append.
    pub(crate) fn append_run(&mut self, events: &[Event], stored_secs: u64, gauge: &SpaceGauge) -> Result<Vec<u64>> {
        self.unfenced()?;
        self.written = None;
        let blob = |e: &Event| self.config.blob_bytes > 0 && e.payload().len() > self.config.blob_bytes;
        if self.ordinary || events.len() < 2 || events.iter().any(blob) {
            return self.append_each(events, stored_secs, gauge);
        }
        let first = self.head.next_seq;
        let mut frames = Vec::new();
        for (i, event) in events.iter().enumerate() {
            frames.extend_from_slice(&record::encode_event(first + i as u64, stored_secs, event, None));
        }
        let total = frames.len() as u64;
        if self.head.active_len > 0 && self.head.active_len + total > self.config.segment_bytes {
            return self.append_each(events, stored_secs, gauge);
        }
        gauge.check(&self.dir, self.config.reserve_bytes, total)?;
        let offset = self.head.active_len;
        self.write_at_end(&frames)?;
        let n = events.len() as u64;
        self.count_appended(first + n, total)?;
        if self.segment_ino != 0 && self.segment_first == self.head.active {
            self.written = Some(Written { segment: self.segment_first, ino: self.segment_ino, offset, frame: frames });
        }
        Ok((first..first + n).collect())
    }

    /// Writes `frames` (whole records) at the end of the active segment
    /// with one positioned write, synced under `sync=always`; on any
    /// failure (ENOSPC, EIO...) cuts the segment back, so that no partial
    /// record is left behind.
    pub(super) fn write_at_end(&mut self, frames: &[u8]) -> Result<()> {
        let end = self.head.active_len;
        let path = || self.dir.join(segment_name(self.head.active));
        let written = if failpoint("append-eio") {
            // Half of it reaches the file, then the device fails.
            self.segment.write_all_at(&frames[..frames.len() / 2], end).and(Err(eio()))
        } else {
            self.segment.write_all_at(frames, end)
        };
        if let Err(e) = written {
            let _ = self.segment.set_len(end);
            return Err(Error::io("cannot append to", &path(), e));
        }
        if self.config.sync == SyncPolicy::Always {
            let synced = if failpoint("fsync-eio") { Err(eio()) } else { self.segment.sync_data() };
            if let Err(e) = synced {
                let _ = self.segment.set_len(end);
                return Err(Error::io("cannot sync", &path(), e));
            }
        }
        // Until `count_appended` has written the head.
        self.fenced = true;
        Ok(())
    }

    /// `Ok` unless an earlier append of this writer failed after writing
    /// its records (see `Writer::fenced`).
    pub(super) fn unfenced(&self) -> Result<()> {
        if !self.fenced {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Io,
            format!("an earlier append to '{}' failed after writing its records: the topic is opened again for the next one", self.dir.display()),
        ))
    }

    /// Counts `bytes` of records just written at the end of the active
    /// segment, the next seq then being `next_seq`, in the head (synced
    /// under `sync=always`: the head is derived data, but a stale index
    /// after a power cut could misjudge duplicates, so it is kept as
    /// durable as the log).
    pub(super) fn count_appended(&mut self, next_seq: u64, bytes: u64) -> Result<()> {
        self.head.next_seq = next_seq;
        self.head.active_len += bytes;
        self.write_head()?;
        if self.config.sync == SyncPolicy::Always {
            self.head_file.sync_data().map_err(|e| Error::io("cannot sync", &self.dir.join(HEAD_FILE), e))?;
        }
        self.fenced = false;
        Ok(())
    }

    /// [`Writer::append_run`] one record at a time; the records written
    /// are handed over together when they are consecutive.
    fn append_each(&mut self, events: &[Event], stored_secs: u64, gauge: &SpaceGauge) -> Result<Vec<u64>> {
        let mut seqs = Vec::with_capacity(events.len());
        let mut run: Option<Written> = None;
        for event in events {
            if let Appended::Stored(seq) = self.append(event, stored_secs, gauge)? {
                seqs.push(seq);
            }
            run = match (run, self.written.take()) {
                (Some(mut run), Some(w)) if w.ino == run.ino && w.segment == run.segment && w.offset == run.offset + run.frame.len() as u64 => {
                    run.frame.extend_from_slice(&w.frame);
                    Some(run)
                }
                (_, w) => w,
            };
        }
        self.written = run;
        Ok(seqs)
    }

    /// Seals the active segment and starts a new one at `next_seq`. The
    /// head names the new segment before the file exists, so a crash
    /// in between leaves nothing a reader could misplace.
    pub(super) fn roll(&mut self) -> Result<()> {
        let first = self.head.next_seq;
        self.head.active = first;
        self.head.active_len = 0;
        self.write_head()?;
        let path = self.dir.join(segment_name(first));
        // `attach` has checked that no segment `first` exists; should one
        // appear anyway, never truncate records: refuse, and the next
        // writer rebuilds the head from the log.
        self.segment = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(FILE_MODE)
            .custom_flags(libc::O_NOATIME)
            .open(&path)
            .and_then(|f| group_writable(&f).map(|_| f))
            .map_err(|e| Error::io("cannot create segment", &path, e))?;
        self.segment_first = first;
        self.segment_ino = stat_fd(&self.segment).map(|s| s.ino).unwrap_or(0);
        if self.config.sync == SyncPolicy::Always {
            sync_dir(&self.dir)?;
        }
        if !self.ordinary {
            self.apply_retention()?;
        }
        Ok(())
    }
}

/// The error of a writer that found its topic removed by the sweep:
/// `Expired` (a journal's stale answer); `Store` opens an ordinary topic
/// afresh instead.
pub(crate) fn removed(dir: &Path) -> Error {
    Error::new(ErrorKind::Expired, format!("the topic in '{}' was removed", dir.display()))
}

// A topic's blob links, kept by its writer (the blob store: blob.rs).
impl Writer<'_> {
    /// Links `payload`'s blob into this topic as the blob of record `seq`
    /// (to be written next), storing the blob first if need be. Under the
    /// lock, a link of that name can only be left by a writer that died
    /// before writing record `seq`: it is replaced.
    pub(super) fn link_blob(&self, seq: u64, payload: &SharedPayload, gauge: &SpaceGauge) -> Result<()> {
        let root = &self.config.root;
        let dst = self.dir.join(link_name(seq));
        match fs::remove_file(&dst) {
            Ok(()) => {}
            Err(e) if e.kind() == IoKind::NotFound => {}
            Err(e) => return Err(Error::io("cannot replace stale blob link", &dst, e)),
        }
        let mut attempts = 0;
        loop {
            let src = store(root, payload, self.config, gauge)?;
            if failpoint("blob-stored") {
                // Stored, then the writer fails before linking it.
                return Err(Error::io("cannot link blob into", &dst, eio()));
            }
            match fs::hard_link(&src, &dst) {
                Ok(()) => break,
                // Swept as garbage between the check and the link: store
                // it again.
                Err(e) if e.kind() == IoKind::NotFound && attempts < 3 => attempts += 1,
                Err(e) => return Err(Error::io("cannot link blob into", &dst, e)),
            }
        }
        if self.config.sync == SyncPolicy::Always {
            sync_dir(&self.dir)?;
        }
        if failpoint("blob-linked") {
            // Linked, then the writer fails before writing the record.
            return Err(Error::io("cannot append to", &dst, eio()));
        }
        Ok(())
    }

    /// Unlinks the blob links of this topic that no record in `kept`
    /// refers to (dropped records, and links left by a writer that died
    /// before its record), then removes `.blobs/` entries left with no
    /// other link. Called under the lock, after the segment changes.
    pub(super) fn unlink_unreferenced(&self, kept: &HashSet<u64>, hashes: &[BlobRef]) -> Result<usize> {
        let mut removed = 0;
        for seq in list_links(&self.dir)? {
            if kept.contains(&seq) {
                continue;
            }
            let path = self.dir.join(link_name(seq));
            match fs::remove_file(&path) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == IoKind::NotFound => {}
                Err(e) => return Err(Error::io("cannot unlink blob", &path, e)),
            }
        }
        for blob in hashes {
            sweep_one(&self.config.root, blob);
        }
        Ok(removed)
    }
}

impl Writer<'_> {
    /// Unlinks the links of records dropped with a deleted segment, then
    /// removes `.blobs/` entries left with no other link.
    pub(super) fn unlink_dropped(&self, dropped: &[(u64, BlobRef)]) -> Result<()> {
        for (seq, _) in dropped {
            let path = self.dir.join(link_name(*seq));
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == IoKind::NotFound => {}
                Err(e) => return Err(Error::io("cannot unlink blob", &path, e)),
            }
        }
        for (_, blob) in dropped {
            sweep_one(&self.config.root, blob);
        }
        Ok(())
    }
}

impl Writer<'_> {
    /// Unlinks the blob links of this topic that no record refers to
    /// (left by a writer that failed between the link and the record);
    /// returns how many.
    pub(crate) fn drop_orphan_links(&self) -> Result<usize> {
        let mut referenced = HashSet::new();
        for first in segment::list_segments(&self.dir)? {
            for (seq, _) in refs_of_segment(&self.dir.join(segment::segment_name(first)))? {
                referenced.insert(seq);
            }
        }
        self.unlink_unreferenced(&referenced, &[])
    }
}

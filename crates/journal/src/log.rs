//! One topic's log: append-only segments, the writer's `.head` (state and
//! duplicate index), torn-tail repair, reading, compaction and retention.
//!
//! FORMAT.md explains the files; this module is the code that keeps the
//! promises made there.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind as IoKind, Read, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::config::{Config, SyncPolicy};
use crate::error::{Error, ErrorKind, Result};
use crate::event::{Event, KN_ID};
use crate::record::{self, Decoded, Record};

pub(crate) const LOCK_FILE: &str = ".lock";
pub(crate) const HEAD_FILE: &str = ".head";
const SEGMENT_PREFIX: &str = ".seg-";

const HEAD_MAGIC: &[u8; 8] = b"KNHEAD\x00\x03";
const HEAD_SIZE: u64 = 128;
/// Offset of the header's CRC-32C, which covers the bytes before it.
const HEAD_CRC: usize = 72;
const SLOT_SIZE: u64 = 12;
const INITIAL_SLOTS: u64 = 64;
/// Compaction of an ordinary topic starts once it holds this many
/// superseded records and more of them than live ones.
const COMPACT_MIN_GARBAGE: u64 = 1000;

/// Modes of files and directories the store creates: group-writable so the
/// web server and sensors run by other users of one group can all write,
/// never world-writable (the umask may remove more).
pub(crate) const FILE_MODE: u32 = 0o664;

pub(crate) fn segment_name(first_seq: u64) -> String {
    format!("{SEGMENT_PREFIX}{first_seq:016x}")
}

fn parse_segment_name(name: &str) -> Option<u64> {
    let hex = name.strip_prefix(SEGMENT_PREFIX)?;
    if hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

pub(crate) fn is_segment_file(name: &std::ffi::OsStr) -> bool {
    name.to_str().and_then(parse_segment_name).is_some()
}

/// The first sequence numbers of the segments of `dir`, ascending. A
/// missing directory has none.
pub(crate) fn list_segments(dir: &Path) -> Result<Vec<u64>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == IoKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("cannot list topic directory", dir, e)),
    };
    let mut firsts: Vec<u64> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(parse_segment_name))
        .collect();
    firsts.sort_unstable();
    Ok(firsts)
}

/// Reads the records of a segment starting at byte `from`. Stops at the
/// first incomplete or corrupt frame: readers treat it as not yet written.
/// Returns the records with their offsets, the end of the valid prefix and
/// what stopped the scan (`None` at a clean end).
pub(crate) fn scan_segment(path: &Path, from: u64) -> Result<Option<Scan>> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == IoKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("cannot open segment", path, e)),
    };
    let ino = stat_fd(&file).map(|s| s.ino).unwrap_or(0);
    Ok(Some(scan_file(&mut file, path, from, ino)?))
}

/// What the store asks `statx` about an open file.
pub(crate) struct FdStat {
    pub size: u64,
    pub links: u64,
    pub ino: u64,
}

/// The size, link count and inode number of an open file, from a `statx`
/// that asks for nothing else. Not asking for the file's times matters:
/// with multigrain timestamps (Linux 6.13+), a file whose change time was
/// asked for gets a fine-grained new one at its next write, so every
/// append after such an `fstat` would also update the segment's inode;
/// unasked, appends within one clock tick leave it alone.
pub(crate) fn stat_fd(file: &File) -> std::io::Result<FdStat> {
    use std::os::fd::AsRawFd;
    // SAFETY: statx only writes the struct it is given; an all-zero
    // `libc::statx` is a valid value of that plain-data struct.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    let mask = libc::STATX_SIZE | libc::STATX_NLINK | libc::STATX_INO;
    // SAFETY: a valid descriptor, a NUL-terminated empty path with
    // AT_EMPTY_PATH, and a pointer to the struct above.
    let rc = unsafe { libc::statx(file.as_raw_fd(), c"".as_ptr(), libc::AT_EMPTY_PATH, mask, &mut sx) };
    if rc == 0 {
        return Ok(FdStat { size: sx.stx_size, links: sx.stx_nlink as u64, ino: sx.stx_ino });
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::ENOSYS) {
        return Err(err);
    }
    let m = file.metadata()?;
    Ok(FdStat { size: m.len(), links: m.nlink(), ino: m.ino() })
}

/// The result of scanning part of a segment.
pub(crate) struct Scan {
    pub records: Vec<(u64, Record)>,
    /// Offset just past the last valid record.
    pub end: u64,
    /// Why the scan stopped before the end of the file, if it did.
    pub stop: Option<Stop>,
    /// The inode of the segment file scanned.
    pub ino: u64,
}

/// Why a scan stopped before the end of the file.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Stop {
    Incomplete,
    Corrupt(String),
}

fn scan_file(file: &mut File, path: &Path, from: u64, ino: u64) -> Result<Scan> {
    let mut bytes = Vec::new();
    file.seek(SeekFrom::Start(from)).map_err(|e| Error::io("cannot seek segment", path, e))?;
    file.read_to_end(&mut bytes).map_err(|e| Error::io("cannot read segment", path, e))?;
    let mut records = Vec::new();
    let mut pos = 0usize;
    let mut stop = None;
    while pos < bytes.len() {
        match record::decode(&bytes[pos..]) {
            Decoded::Record(r, len) => {
                records.push((from + pos as u64, r));
                pos += len;
            }
            Decoded::Incomplete => {
                stop = Some(Stop::Incomplete);
                break;
            }
            Decoded::Corrupt(why) => {
                stop = Some(Stop::Corrupt(why));
                break;
            }
        }
    }
    Ok(Scan { records, end: from + pos as u64, stop, ino })
}

/// Reads every record with `seq > after`, in order, skipping repeats (a
/// crash during a segment merge may leave a record in two segments).
pub(crate) fn read_after(dir: &Path, after: u64) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    let mut last = after;
    // A segment that vanished between listing and opening was merged into
    // an earlier one by compaction: list again and go on from `last`.
    'listing: loop {
        let segments = list_segments(dir)?;
        let start = segments.iter().rposition(|&first| first <= last.saturating_add(1)).unwrap_or(0);
        for &first in &segments[start..] {
            let Some(scan) = scan_segment(&dir.join(segment_name(first)), 0)? else { continue 'listing };
            for (_, r) in scan.records {
                if r.seq > last {
                    last = r.seq;
                    out.push(r);
                }
            }
        }
        return Ok(out);
    }
}

/// Visits records newest first until `visit` returns false. Costs the
/// records visited plus at most one segment read in full.
pub(crate) fn read_backwards(dir: &Path, mut visit: impl FnMut(Record) -> bool) -> Result<()> {
    let segments = list_segments(dir)?;
    let mut floor = u64::MAX;
    for &first in segments.iter().rev() {
        let Some(scan) = scan_segment(&dir.join(segment_name(first)), 0)? else { continue };
        for (_, r) in scan.records.into_iter().rev() {
            if r.seq >= floor {
                continue;
            }
            floor = r.seq;
            if !visit(r) {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// A reader's position in a topic's log: just after record `last_seq`,
/// which ends at `offset` in segment `segment`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogCursor {
    pub(crate) last_seq: u64,
    pub(crate) segment: u64,
    pub(crate) offset: u64,
    pub(crate) ino: u64,
}

impl LogCursor {
    /// The checkpoint of the last record this cursor has passed (0 before
    /// the first).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }
}

/// A cursor at the current end of the log of `dir`.
pub(crate) fn cursor_at_end(dir: &Path) -> Result<LogCursor> {
    let segments = list_segments(dir)?;
    let Some(&last) = segments.last() else {
        return Ok(LogCursor { last_seq: 0, segment: 0, offset: 0, ino: 0 });
    };
    let Some(scan) = scan_segment(&dir.join(segment_name(last)), 0)? else {
        return Ok(LogCursor { last_seq: last.saturating_sub(1), segment: 0, offset: 0, ino: 0 });
    };
    let last_seq = scan.records.last().map(|(_, r)| r.seq).unwrap_or(last.saturating_sub(1));
    Ok(LogCursor { last_seq, segment: last, offset: scan.end, ino: scan.ino })
}

/// Reads the records after `cursor` and advances it. Cheap when nothing is
/// new: one `stat`, one `read` and, at the end of a segment, one listing.
pub(crate) fn read_new(dir: &Path, cursor: &mut LogCursor) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    loop {
        let path = dir.join(segment_name(cursor.segment));
        let positioned = cursor.ino != 0;
        let scan = if positioned { scan_segment(&path, cursor.offset)? } else { None };
        match scan {
            Some(scan) if scan.ino == cursor.ino => {
                for (_, r) in scan.records {
                    if r.seq > cursor.last_seq {
                        cursor.last_seq = r.seq;
                        out.push(r);
                    }
                }
                cursor.offset = scan.end;
                if !out.is_empty() {
                    // Report what we have; the rest comes on the next call.
                    return Ok(out);
                }
                // At the end of this segment, or at a frame not written
                // completely: wait for more, unless a newer segment exists
                // (then this one is sealed and a bad frame in it is
                // corruption that `verify` reports: skip past it).
                let segments = list_segments(dir)?;
                match segments.iter().find(|&&f| f > cursor.segment) {
                    Some(&next) => {
                        // Records appended to this segment after our read
                        // but before the roll: read them first.
                        if let Some(late) = scan_segment(&path, cursor.offset)?.filter(|s| s.ino == cursor.ino) {
                            cursor.offset = late.end;
                            for (_, r) in late.records {
                                if r.seq > cursor.last_seq {
                                    cursor.last_seq = r.seq;
                                    out.push(r);
                                }
                            }
                            if !out.is_empty() {
                                return Ok(out);
                            }
                        }
                        cursor.segment = next;
                        cursor.offset = 0;
                        cursor.ino = File::open(dir.join(segment_name(next))).and_then(|f| stat_fd(&f)).map(|s| s.ino).unwrap_or(0);
                        if cursor.ino == 0 {
                            return Ok(out);
                        }
                    }
                    None => return Ok(out),
                }
            }
            _ => {
                // The segment was replaced (compaction) or the cursor is not
                // placed yet: find the segment holding `last_seq + 1` again.
                let segments = list_segments(dir)?;
                let Some(idx) = segments
                    .iter()
                    .rposition(|&f| f <= cursor.last_seq.saturating_add(1))
                    .or(if segments.is_empty() { None } else { Some(0) })
                else {
                    return Ok(out);
                };
                let first = segments[idx];
                let Some(scan) = scan_segment(&dir.join(segment_name(first)), 0)? else { continue };
                cursor.segment = first;
                cursor.ino = scan.ino;
                cursor.offset = 0;
                // Re-enter the positioned branch from the start of this
                // segment; records up to `last_seq` are skipped there.
                if scan.ino == 0 {
                    return Ok(out);
                }
            }
        }
    }
}

/// The writer's state, kept in the first bytes of `.head`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Head {
    next_seq: u64,
    active: u64,
    active_len: u64,
    live: u64,
    garbage: u64,
    slots: u64,
    used: u64,
    /// The route generation: changes (is incremented) before every write
    /// to this topic's `kn_routes`, and starts at a random value in every
    /// head built from the log, so that a process may keep the routes it
    /// read for as long as it finds the same value here.
    routes: u64,
}

impl Head {
    fn encode(&self) -> [u8; HEAD_SIZE as usize] {
        let mut b = [0u8; HEAD_SIZE as usize];
        b[..8].copy_from_slice(HEAD_MAGIC);
        let fields =
            [self.next_seq, self.active, self.active_len, self.live, self.garbage, self.slots, self.used, self.routes];
        for (i, f) in fields.iter().enumerate() {
            b[8 + i * 8..16 + i * 8].copy_from_slice(&f.to_le_bytes());
        }
        let crc = crate::record::crc32c(&[&b[..HEAD_CRC]]);
        b[HEAD_CRC..HEAD_CRC + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<Head> {
        if b.len() < HEAD_CRC + 4 || &b[..8] != HEAD_MAGIC {
            return None;
        }
        let crc = u32::from_le_bytes([b[HEAD_CRC], b[HEAD_CRC + 1], b[HEAD_CRC + 2], b[HEAD_CRC + 3]]);
        if crate::record::crc32c(&[&b[..HEAD_CRC]]) != crc {
            return None;
        }
        let f = |i: usize| u64::from_le_bytes(b[8 + i * 8..16 + i * 8].try_into().unwrap_or([0; 8]));
        let head = Head {
            next_seq: f(0),
            active: f(1),
            active_len: f(2),
            live: f(3),
            garbage: f(4),
            slots: f(5),
            used: f(6),
            routes: f(7),
        };
        (head.slots == 0 || head.slots.is_power_of_two()).then_some(head)
    }
}

/// A route generation for a head built from the log: random, so that it
/// matches no value a process may have kept from an earlier head.
fn fresh_routes_generation() -> u64 {
    u64::from_le_bytes(crate::store::random_bytes())
}

/// Fault injection for tests, compiled in only with the `failpoints`
/// feature: true when the file named by `KN_FAILPOINT` lists `name`
/// (`append-eio`: half a record is written, then EIO; `fsync-eio`: the
/// `fdatasync` of `KN_SYNC=always` fails with EIO).
#[cfg(feature = "failpoints")]
fn failpoint(name: &str) -> bool {
    std::env::var_os("KN_FAILPOINT")
        .and_then(|path| fs::read_to_string(path).ok())
        .is_some_and(|armed| armed.split_whitespace().any(|w| w == name))
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
fn failpoint(_name: &str) -> bool {
    false
}

fn eio() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::EIO)
}

/// How many `kn_id`s the duplicate index of the ordinary topic in `dir`
/// holds, from its head: at least the number of its current events (a
/// cheap bound for limits). `u64::MAX` when there is no valid head.
pub(crate) fn indexed_ids(dir: &Path) -> u64 {
    let mut buf = [0u8; HEAD_SIZE as usize];
    File::open(dir.join(HEAD_FILE))
        .ok()
        .and_then(|f| f.read_exact_at(&mut buf, 0).ok())
        .and_then(|_| Head::decode(&buf))
        .map(|h| h.used.max(h.live))
        .unwrap_or(u64::MAX)
}

/// The 32-bit hash of a `kn_id` in the duplicate index (never 0, which
/// marks an empty slot). Two ids may share a hash: a duplicate needs the
/// 64-bit digest of the end-to-end elements to match as well.
fn id_hash(id: &[u8]) -> u64 {
    (xxhash_rust::xxh3::xxh3_64(id) as u32 | 1) as u64
}

/// One index slot: id hash (u32 LE), digest (u64 LE).
fn encode_slot(hash: u64, digest: u64) -> [u8; SLOT_SIZE as usize] {
    let mut s = [0u8; SLOT_SIZE as usize];
    s[..4].copy_from_slice(&(hash as u32).to_le_bytes());
    s[4..].copy_from_slice(&digest.to_le_bytes());
    s
}

fn decode_slot(s: &[u8]) -> (u64, u64) {
    let hash = u32::from_le_bytes(s[..4].try_into().unwrap_or([0; 4])) as u64;
    let digest = u64::from_le_bytes(s[4..12].try_into().unwrap_or([0; 8]));
    (hash, digest)
}

/// The index grows (doubles) before it is more than 80 % full.
fn index_full(used: u64, slots: u64) -> bool {
    (used + 1) * 10 > slots * 8
}

/// What an append did to an ordinary topic's current state.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Appended {
    /// Stored under this sequence number.
    Stored(u64),
    /// Same `kn_id` and end-to-end elements as the current event: not stored.
    Duplicate,
}

/// The open `.head`, mapped shared: the head read, the index probe and the
/// slot and header updates of a post are memory accesses, not system calls.
/// Other processes see the same page cache, exactly as with `pread` and
/// `pwrite`; the store never truncates a `.head` in place (a new one is
/// written aside and renamed), so the mapping never loses its pages.
pub(crate) struct HeadFile {
    file: File,
    map: memmap2::MmapRaw,
}

impl HeadFile {
    /// Maps `file`; fails (the head is then rebuilt) when it is shorter
    /// than a header.
    fn new(file: File) -> std::io::Result<HeadFile> {
        let len = file.metadata()?.len();
        if len < HEAD_SIZE {
            return Err(std::io::Error::new(IoKind::UnexpectedEof, "head shorter than its header"));
        }
        let map = memmap2::MmapOptions::new().len(len as usize).map_raw(&file)?;
        Ok(HeadFile { file, map })
    }

    fn len(&self) -> u64 {
        self.map.len() as u64
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let end = offset as usize + buf.len();
        if end > self.map.len() {
            return Err(std::io::Error::new(IoKind::UnexpectedEof, "read past the end of the head"));
        }
        // SAFETY: in bounds of a live mapping of a file that is never
        // truncated in place; other processes' concurrent writes are
        // excluded by the topic lock held by every writer of the head.
        unsafe { std::ptr::copy_nonoverlapping(self.map.as_ptr().add(offset as usize), buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    fn write_all_at(&self, bytes: &[u8], offset: u64) -> std::io::Result<()> {
        let end = offset as usize + bytes.len();
        if end > self.map.len() {
            return Err(std::io::Error::new(IoKind::UnexpectedEof, "write past the end of the head"));
        }
        // SAFETY: as in `read_exact_at`; the caller holds the topic lock.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.map.as_mut_ptr().add(offset as usize), bytes.len()) };
        Ok(())
    }

    fn sync_data(&self) -> std::io::Result<()> {
        self.map.flush()?;
        self.file.sync_data()
    }
}

/// Exclusive access to append to one topic. Holding it holds the topic's
/// lock; dropping it releases the lock. [`Writer::release`] unlocks and
/// hands back the open files, so that a long-lived process can append to
/// the topic again without opening anything ([`TopicFiles`]).
pub(crate) struct Writer<'c> {
    dir: PathBuf,
    config: &'c Config,
    ordinary: bool,
    lock: File,
    head_file: HeadFile,
    head: Head,
    segment: File,
    /// The first seq (name) of the segment `segment` really is: it differs
    /// from `head.active` only after a roll failed half-way.
    segment_first: u64,
}

/// A topic's open files, kept by a process between appends (unlocked).
/// Reused only after re-locking and re-reading the head: another process
/// may have appended, rolled, or replaced the head meanwhile (a replaced
/// head is invalidated first, see [`write_head_file`]).
pub(crate) struct TopicFiles {
    dir: PathBuf,
    lock: File,
    head_file: HeadFile,
    segment: File,
    segment_first: u64,
}

/// Free space as last queried, so that the free-space check of every
/// append does not need a `statvfs` each time: it is queried again after
/// 100 ms, or as soon as the bytes written since approach half of the
/// headroom above the reserve.
#[derive(Default)]
pub(crate) struct SpaceGauge {
    state: std::sync::Mutex<Option<(std::time::Instant, u64, u64)>>,
}

fn open_rw(path: &Path, create: bool) -> std::io::Result<File> {
    match OpenOptions::new().read(true).write(true).open(path) {
        Err(e) if create && e.kind() == IoKind::NotFound => open_shared(path, false),
        other => other,
    }
}

/// Opens `path` for reading and writing (appending if `append`), creating
/// it group-writable if it does not exist. The mode is set only on
/// creation: changing the mode of another user's file is not allowed.
pub(crate) fn open_shared(path: &Path, append: bool) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).append(append);
    match options.open(path) {
        Err(e) if e.kind() == IoKind::NotFound => {
            let mut create = options.clone();
            match create.create_new(true).mode(FILE_MODE).open(path) {
                Ok(f) => group_writable(&f).map(|_| f),
                // Another process created it first: it set the mode.
                Err(e) if e.kind() == IoKind::AlreadyExists => options.open(path),
                Err(e) => Err(e),
            }
        }
        other => other,
    }
}

/// Gives a file the store's mode whatever the umask: group-writable, so
/// that the web server and sensors of one group can all write, and never
/// world-writable. Called only when a file is created.
pub(crate) fn group_writable(f: &File) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    f.set_permissions(fs::Permissions::from_mode(FILE_MODE))
}

pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| Error::io("cannot sync directory", dir, e))
}

impl<'c> Writer<'c> {
    /// Locks the topic in `dir` (which must exist) and brings the writer's
    /// state up to date with the log, truncating a torn tail.
    pub(crate) fn open(dir: &Path, config: &'c Config, ordinary: bool) -> Result<Writer<'c>> {
        let lock_path = dir.join(LOCK_FILE);
        let lock = open_rw(&lock_path, true).map_err(|e| Error::io("cannot open lock file", &lock_path, e))?;
        lock.lock().map_err(|e| Error::io("cannot lock topic", &lock_path, e))?;
        let head_path = dir.join(HEAD_FILE);
        let existing = match open_rw(&head_path, false) {
            Ok(f) => HeadFile::new(f).ok().and_then(|f| {
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
    pub(crate) fn reopen(config: &'c Config, ordinary: bool, files: TopicFiles) -> Result<Option<Writer<'c>>> {
        let Some(mut w) = Writer::reuse(config, ordinary, files)? else { return Ok(None) };
        Ok(if w.recover_tail()? { Some(w) } else { None })
    }

    /// Locks with kept files; `None` (files closed, lock released) when the
    /// head was replaced or the active segment changed: open afresh.
    fn reuse(config: &'c Config, ordinary: bool, files: TopicFiles) -> Result<Option<Writer<'c>>> {
        if let Err(e) = files.lock.lock() {
            return Err(Error::io("cannot lock topic", &files.dir.join(LOCK_FILE), e));
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
            })),
            _ => Ok(None),
        }
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
    pub(crate) fn release(self) -> TopicFiles {
        let _ = self.lock.unlock();
        TopicFiles {
            dir: self.dir,
            lock: self.lock,
            head_file: self.head_file,
            segment: self.segment,
            segment_first: self.segment_first,
        }
    }

    /// Opens the active segment named by `head`. `Err(lock)` hands the lock
    /// back when the head does not match the log (it must be rebuilt).
    fn attach(
        dir: &Path,
        config: &'c Config,
        ordinary: bool,
        lock: File,
        head_file: HeadFile,
        head: Head,
    ) -> Result<std::result::Result<Writer<'c>, File>> {
        let path = dir.join(segment_name(head.active));
        let segment = match open_rw(&path, false) {
            Ok(f) => f,
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
        let size = stat_fd(&segment).map_err(|e| Error::io("cannot stat segment", &path, e))?.size;
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
        Ok(Ok(Writer { dir: dir.to_path_buf(), config, ordinary, lock, head_file, head, segment, segment_first }))
    }

    /// Adopts whole records that a writer appended but did not record in
    /// the head (it was killed), and truncates a torn tail.
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
        let size = meta.size;
        if size == self.head.active_len {
            return Ok(true);
        }
        let path = self.dir.join(segment_name(self.head.active));
        let scan = scan_file(&mut self.segment, &path, self.head.active_len, 0)?;
        let adopted_next = scan.records.iter().map(|(_, r)| r.seq + 1).max().unwrap_or(0).max(self.head.next_seq);
        if adopted_next != self.head.active && self.dir.join(segment_name(adopted_next)).exists() {
            // The head lags behind the log across a roll (a power cut with
            // sync=none): only a rebuild knows the right next seq.
            return Ok(false);
        }
        for (_, r) in &scan.records {
            self.head.next_seq = self.head.next_seq.max(r.seq + 1);
            if self.ordinary {
                self.index(&r.event)?;
            }
        }
        if scan.end < size {
            self.segment.set_len(scan.end).map_err(|e| Error::io("cannot truncate torn tail of", &path, e))?;
        }
        self.head.active_len = scan.end;
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
    fn lookup(&self, id: &[u8]) -> Result<(u64, Option<u64>)> {
        let h = id_hash(id);
        let mask = self.head.slots - 1;
        let mut i = h & mask;
        let mut buf = [0u8; 4 * SLOT_SIZE as usize];
        loop {
            // Read up to four slots at once: most probes end in the first.
            let n = (4 - (i & 3)).min(self.head.slots - i) as usize;
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

    /// Records `event` as the current one for its `kn_id`.
    fn index(&mut self, event: &Event) -> Result<()> {
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
        self.write_slot(slot, id_hash(id), event.end_to_end_digest() as u64)
    }

    fn write_slot(&self, slot: u64, hash: u64, digest: u64) -> Result<()> {
        self.head_file
            .write_all_at(&encode_slot(hash, digest), HEAD_SIZE + slot * SLOT_SIZE)
            .map_err(|e| Error::io("cannot write index", &self.dir.join(HEAD_FILE), e))
    }

    fn grow_index(&mut self) -> Result<()> {
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
    pub(crate) fn append(&mut self, event: &Event, stored_secs: u64, gauge: &SpaceGauge) -> Result<Appended> {
        // One index probe serves both the duplicate check and the update.
        let digest = if self.ordinary { event.end_to_end_digest() as u64 } else { 0 };
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
        let frame = record::encode_event(seq, stored_secs, event);
        if self.head.active_len > 0 && self.head.active_len + frame.len() as u64 > self.config.segment_bytes {
            self.roll()?;
        }
        gauge.check(&self.dir, self.config.reserve_bytes, frame.len() as u64)?;
        let path = || self.dir.join(segment_name(self.head.active));
        let written = if failpoint("append-eio") {
            // Half a record reaches the file, then the device fails.
            self.segment.write_all_at(&frame[..frame.len() / 2], self.head.active_len).and(Err(eio()))
        } else {
            self.segment.write_all_at(&frame, self.head.active_len)
        };
        if let Err(e) = written {
            // Never leave a partial record behind (ENOSPC, EIO...).
            let _ = self.segment.set_len(self.head.active_len);
            return Err(Error::io("cannot append to", &path(), e));
        }
        if self.config.sync == SyncPolicy::Always {
            let synced = if failpoint("fsync-eio") { Err(eio()) } else { self.segment.sync_data() };
            if let Err(e) = synced {
                let _ = self.segment.set_len(self.head.active_len);
                return Err(Error::io("cannot sync", &path(), e));
            }
        }
        if let Some((slot, replaced)) = slot {
            if replaced {
                self.head.garbage += 1;
            } else {
                self.head.used += 1;
                self.head.live += 1;
            }
            self.write_slot(slot, id_hash(id), digest)?;
        }
        self.head.next_seq = seq + 1;
        self.head.active_len += frame.len() as u64;
        self.write_head()?;
        if self.config.sync == SyncPolicy::Always {
            // The head is derived data, but a stale index after a power cut
            // could misjudge duplicates: keep it as durable as the log.
            self.head_file.sync_data().map_err(|e| Error::io("cannot sync", &self.dir.join(HEAD_FILE), e))?;
        }
        Ok(Appended::Stored(seq))
    }

    /// Seals the active segment and starts a new one at `next_seq`. The
    /// head names the new segment before the file exists, so a crash
    /// in between leaves nothing a reader could misplace.
    fn roll(&mut self) -> Result<()> {
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
            .open(&path)
            .and_then(|f| group_writable(&f).map(|_| f))
            .map_err(|e| Error::io("cannot create segment", &path, e))?;
        self.segment_first = first;
        if self.config.sync == SyncPolicy::Always {
            sync_dir(&self.dir)?;
        }
        if !self.ordinary {
            self.apply_retention()?;
        }
        Ok(())
    }

    /// Whether enough superseded records piled up to compact.
    pub(crate) fn wants_compaction(&self) -> bool {
        self.ordinary && self.head.garbage >= COMPACT_MIN_GARBAGE && self.head.garbage > self.head.live
    }

    /// Deletes whole sealed journal segments that are too old or beyond
    /// the byte budget, oldest first.
    pub(crate) fn apply_retention(&mut self) -> Result<usize> {
        let segments = list_segments(&self.dir)?;
        let sealed: Vec<(u64, u64, SystemTime)> = segments
            .iter()
            .filter(|&&f| f != self.head.active)
            .filter_map(|&f| {
                let m = fs::metadata(self.dir.join(segment_name(f))).ok()?;
                Some((f, m.len(), m.modified().ok()?))
            })
            .collect();
        let active_len = self.head.active_len;
        let mut total: u64 = sealed.iter().map(|s| s.1).sum::<u64>() + active_len;
        let now = SystemTime::now();
        let mut removed = 0;
        for (first, len, modified) in sealed {
            let too_old = now.duration_since(modified).unwrap_or(Duration::ZERO) > self.config.journal_max_age;
            if !too_old && total <= self.config.journal_max_bytes {
                break;
            }
            let path = self.dir.join(segment_name(first));
            fs::remove_file(&path).map_err(|e| Error::io("cannot delete old segment", &path, e))?;
            total -= len;
            removed += 1;
        }
        Ok(removed)
    }

    /// Rewrites the sealed segments keeping only live records: on an
    /// ordinary topic the current event of each `kn_id`, everywhere
    /// nothing expired longer than `expired_grace` ago. Each segment is
    /// replaced by one atomic rename, so a concurrent reader sees either the
    /// old or the new file, both valid; appends wait for the lock we hold.
    pub(crate) fn compact(&mut self, now: f64) -> Result<CompactReport> {
        let mut report = CompactReport::default();
        let segments = list_segments(&self.dir)?;
        // Pass 1: the newest sequence number of every kn_id.
        let mut latest: HashMap<u128, u64> = HashMap::new();
        let mut scans = Vec::new();
        for &first in &segments {
            let Some(scan) = scan_segment(&self.dir.join(segment_name(first)), 0)? else { continue };
            if self.ordinary {
                for (_, r) in &scan.records {
                    latest.insert(id_key(&r.event), r.seq);
                }
            }
            scans.push((first, scan));
        }
        // Pass 2: rewrite what changes, then merge small neighbours.
        let horizon = now - self.config.expired_grace.as_secs_f64();
        let mut last_seq = 0u64;
        let mut kept_segments: Vec<(u64, Vec<Record>, bool)> = Vec::new();
        for (first, scan) in scans {
            report.records_before += scan.records.len();
            let active = first == self.head.active;
            let total = scan.records.len();
            let mut keep = Vec::with_capacity(total);
            for (_, r) in scan.records {
                let repeated = r.seq <= last_seq;
                last_seq = last_seq.max(r.seq);
                let superseded = self.ordinary && latest.get(&id_key(&r.event)) != Some(&r.seq);
                let long_expired = matches!(r.event.expires_at(now), Ok(Some(t)) if t <= horizon);
                if active || !(repeated || superseded || long_expired) {
                    keep.push(r);
                }
            }
            let changed = keep.len() != total;
            kept_segments.push((first, keep, changed));
        }
        let merged = merge_small(kept_segments, self.head.active, self.config.segment_bytes);
        for seg in &merged {
            report.records_after += seg.records.len();
            self.rewrite_segment(seg)?;
        }
        if self.ordinary {
            self.rebuild_index_from(&merged)?;
        }
        report.segments_after = merged.iter().filter(|s| !s.records.is_empty() || s.first == self.head.active).count();
        Ok(report)
    }

    fn rewrite_segment(&self, seg: &Planned) -> Result<()> {
        if seg.first == self.head.active || !seg.changed {
            return Ok(());
        }
        let path = self.dir.join(segment_name(seg.first));
        if seg.records.is_empty() {
            return match fs::remove_file(&path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == IoKind::NotFound => Ok(()),
                Err(e) => Err(Error::io("cannot delete emptied segment", &path, e)),
            };
        }
        let tmp = self.dir.join(format!(".tmp-compact-{:016x}", seg.first));
        let mut bytes = Vec::new();
        for r in &seg.records {
            bytes.extend_from_slice(&record::encode(r));
        }
        let write = || -> std::io::Result<()> {
            let f = OpenOptions::new().write(true).create(true).truncate(true).mode(FILE_MODE).open(&tmp)?;
            group_writable(&f)?;
            f.write_all_at(&bytes, 0)?;
            f.sync_all()
        };
        if let Err(e) = write() {
            let _ = fs::remove_file(&tmp);
            return Err(Error::io("cannot write compacted segment", &tmp, e));
        }
        fs::rename(&tmp, &path).map_err(|e| Error::io("cannot install compacted segment", &path, e))?;
        sync_dir(&self.dir)?;
        // Merged-away neighbours go only after the merged file is durably in
        // place: a crash in between leaves records twice, which readers skip.
        for &gone in &seg.absorbed {
            let p = self.dir.join(segment_name(gone));
            let _ = fs::remove_file(p);
        }
        sync_dir(&self.dir)
    }

    fn rebuild_index_from(&mut self, segments: &[Planned]) -> Result<()> {
        let mut entries: HashMap<u64, u64> = HashMap::new();
        for seg in segments {
            for r in &seg.records {
                entries.insert(id_hash(r.event.id().unwrap_or(b"")), r.event.end_to_end_digest() as u64);
            }
        }
        let live = entries.len() as u64;
        let slots = table_slots(live);
        let head = Head { live, garbage: 0, slots, used: live, ..self.head };
        let list: Vec<(u64, u64)> = entries.into_iter().collect();
        self.head_file = write_head_file(&self.dir, &head, &list)?;
        self.head = head;
        Ok(())
    }
}

/// What a compaction did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// Records in the topic before.
    pub records_before: usize,
    /// Records kept.
    pub records_after: usize,
    /// Segment files left.
    pub segments_after: usize,
}

fn id_key(event: &Event) -> u128 {
    xxhash_rust::xxh3::xxh3_128(event.get(KN_ID).unwrap_or(b""))
}

impl SpaceGauge {
    /// Fails with [`ErrorKind::DiskFull`] unless `needed` bytes fit above
    /// the reserve on the file system of `dir`.
    pub(crate) fn check(&self, dir: &Path, reserve: u64, needed: u64) -> Result<()> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let fresh = match *state {
            Some((at, free, written)) => {
                let headroom = free.saturating_sub(reserve);
                at.elapsed() < std::time::Duration::from_millis(100) && (written + needed) * 2 < headroom
            }
            None => false,
        };
        if fresh {
            if let Some((_, _, written)) = state.as_mut() {
                *written += needed;
            }
            return Ok(());
        }
        let free = fs4::available_space(dir).map_err(|e| Error::io("cannot query free space of", dir, e))?;
        if free < reserve.saturating_add(needed) {
            *state = None;
            return Err(Error::new(
                ErrorKind::DiskFull,
                format!(
                    "disk full: {free} bytes free on the file system of '{}', below the reserve of {reserve} bytes",
                    dir.display()
                ),
            ));
        }
        *state = Some((std::time::Instant::now(), free, needed));
        Ok(())
    }
}

/// A segment as compaction will leave it.
struct Planned {
    first: u64,
    records: Vec<Record>,
    changed: bool,
    absorbed: Vec<u64>,
}

/// Merges runs of adjacent sealed segments whose records fit together in
/// half a segment, so that compaction does not leave many tiny files.
fn merge_small(segments: Vec<(u64, Vec<Record>, bool)>, active: u64, segment_bytes: u64) -> Vec<Planned> {
    let size = |rs: &[Record]| rs.iter().map(|r| 64 + r.event.byte_size() as u64).sum::<u64>();
    let mut out: Vec<Planned> = Vec::new();
    for (first, records, changed) in segments {
        if first != active {
            if let Some(prev) = out.last_mut() {
                if prev.first != active && size(&prev.records) + size(&records) <= segment_bytes / 2 {
                    prev.records.extend(records);
                    prev.changed = true;
                    prev.absorbed.push(first);
                    continue;
                }
            }
        }
        out.push(Planned { first, records, changed, absorbed: Vec::new() });
    }
    out
}

fn table_slots(live: u64) -> u64 {
    let mut slots = INITIAL_SLOTS;
    while index_full(live, slots) {
        slots *= 2;
    }
    slots
}

/// Writes a complete `.head` (header and table) under a temporary name and
/// renames it into place; returns it opened.
fn write_head_file(dir: &Path, head: &Head, entries: &[(u64, u64)]) -> Result<HeadFile> {
    let mut bytes = vec![0u8; (HEAD_SIZE + head.slots * SLOT_SIZE) as usize];
    bytes[..HEAD_SIZE as usize].copy_from_slice(&head.encode());
    if head.slots > 0 {
        let mask = head.slots - 1;
        for &(h, digest) in entries {
            let mut i = h & mask;
            loop {
                let at = (HEAD_SIZE + i * SLOT_SIZE) as usize;
                if bytes[at..at + 4] == [0u8; 4] {
                    bytes[at..at + SLOT_SIZE as usize].copy_from_slice(&encode_slot(h, digest));
                    break;
                }
                i = (i + 1) & mask;
            }
        }
    }
    let tmp = dir.join(".tmp-head");
    let path = dir.join(HEAD_FILE);
    // Processes keeping the old head open (TopicFiles) must notice that it
    // is replaced: clear its magic first (we hold the topic's lock).
    if let Ok(old) = OpenOptions::new().write(true).open(&path) {
        let _ = old.write_all_at(&[0u8; 8], 0);
    }
    let write = || -> std::io::Result<HeadFile> {
        let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).mode(FILE_MODE).open(&tmp)?;
        group_writable(&f)?;
        f.write_all_at(&bytes, 0)?;
        let mapped = HeadFile::new(f)?;
        fs::rename(&tmp, &path)?;
        Ok(mapped)
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        Error::io("cannot write head", &path, e)
    })
}

/// Rebuilds `.head` from a full scan of the log: the slow path, taken only
/// when the head is missing or does not match the log (a crash, a power
/// cut with `sync=none`, an old store).
fn rebuild_head(dir: &Path, config: &Config, ordinary: bool) -> Result<(HeadFile, Head)> {
    let mut segments = list_segments(dir)?;
    let mut max_seq = 0u64;
    let mut entries: HashMap<u64, u64> = HashMap::new();
    let mut records = 0u64;
    let mut active_len = 0u64;
    let mut kept = Vec::new();
    let last = segments.last().copied();
    for first in segments.drain(..) {
        let path = dir.join(segment_name(first));
        let Some(scan) = scan_segment(&path, 0)? else { continue };
        if scan.records.is_empty() && Some(first) != last {
            // An empty sealed segment (a crash while rolling): drop it.
            let _ = fs::remove_file(&path);
            continue;
        }
        for (_, r) in &scan.records {
            if r.seq <= max_seq {
                continue;
            }
            max_seq = r.seq;
            records += 1;
            if ordinary {
                entries.insert(id_hash(r.event.id().unwrap_or(b"")), r.event.end_to_end_digest() as u64);
            }
        }
        if Some(first) == last {
            if scan.stop.is_some() {
                let f = open_rw(&path, false).map_err(|e| Error::io("cannot open segment", &path, e))?;
                f.set_len(scan.end).map_err(|e| Error::io("cannot truncate torn tail of", &path, e))?;
            }
            active_len = scan.end;
        }
        kept.push(first);
    }
    let active = match kept.last() {
        Some(&f) => f,
        None => {
            let path = dir.join(segment_name(1));
            open_rw(&path, true).map_err(|e| Error::io("cannot create segment", &path, e))?;
            if config.sync == SyncPolicy::Always {
                sync_dir(dir)?;
            }
            1
        }
    };
    let next_seq = (max_seq + 1).max(active);
    let live = entries.len() as u64;
    let slots = if ordinary { table_slots(live) } else { 0 };
    let head = Head {
        next_seq,
        active,
        active_len,
        live: if ordinary { live } else { records },
        garbage: if ordinary { records.saturating_sub(live) } else { 0 },
        slots,
        used: if ordinary { live } else { 0 },
        routes: fresh_routes_generation(),
    };
    let list: Vec<(u64, u64)> = entries.into_iter().collect();
    let file = write_head_file(dir, &head, &list)?;
    Ok((file, head))
}

/// Checks every record of a topic directory: the number of valid records
/// and, for each segment with a bad frame, where and why.
pub(crate) fn verify_dir(dir: &Path) -> Result<(usize, Vec<(PathBuf, u64, Stop)>)> {
    let mut good = 0;
    let mut bad = Vec::new();
    for first in list_segments(dir)? {
        let path = dir.join(segment_name(first));
        let Some(scan) = scan_segment(&path, 0)? else { continue };
        good += scan.records.len();
        if let Some(stop) = scan.stop {
            bad.push((path, scan.end, stop));
        }
    }
    Ok((good, bad))
}

//! Segment files: their names, listing, scanning (resynchronising at the
//! next valid frame after a bad one) and reading records after a sequence
//! number, backwards, or as they arrive (`LogCursor`).

use std::fs::{self, File};
use std::io::{ErrorKind as IoKind, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{Error, Result};
use crate::record::{self, Decoded, Record};

const SEGMENT_PREFIX: &str = ".seg-";

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

/// Reads the records of a segment starting at byte `from` (see
/// [`scan_file`] for `floor` and `mode`). `None` when the file is gone.
pub(crate) fn scan_segment(path: &Path, from: u64, floor: u64, mode: Mode) -> Result<Option<Scan>> {
    Ok(open_and_scan(path, from, floor, mode, 0)?.map(|(_, scan)| scan))
}

/// The end of segment `path` as [`scan_segment`] from its start (in tail
/// mode) finds it: its last valid record's seq (`Scan::last`) and the
/// offset after it, every frame's CRC checked but no record decoded or
/// returned (a topic's newest segment may hold thousands).
fn scan_segment_end(path: &Path, floor: u64) -> Result<Option<Scan>> {
    Ok(open_and_scan(path, 0, floor, Mode::Tail, u64::MAX)?.map(|(_, scan)| scan))
}

/// [`scan_segment`], handing back the open file too.
fn open_and_scan(path: &Path, from: u64, floor: u64, mode: Mode, skip_upto: u64) -> Result<Option<(File, Scan)>> {
    let mut file = match super::open_read(path) {
        Ok(f) => f,
        Err(e) if e.kind() == IoKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("cannot open segment", path, e)),
    };
    // One `statx` gives the inode and the length to read, so that the
    // read is one `pread` of exactly what is there (no seek, no second
    // read to find the end): the cost of a tunnel's read of a new event.
    let (ino, size) = stat_fd(&file).map(|s| (s.ino, Some(s.size))).unwrap_or((0, None));
    let scan = scan_read(&mut file, path, from, floor, mode, ino, size, skip_upto)?;
    Ok(Some((file, scan)))
}

/// How many segments readers keep open in this process (see [`KeptSegment`]).
static KEPT_SEGMENTS: AtomicUsize = AtomicUsize::new(0);

/// The segment a long-lived reader (a tunnel) keeps open between its
/// reads, so that each read of a new record is a `statx` and a `pread` of
/// the open file, without the `open` and `close` (and their path walk) of
/// a read by name. Only up to a number of them in the process (the
/// caller's `keep_at_most`): each holds a descriptor. Used only while the
/// file is still linked (compaction replaces a segment by renaming
/// another over it, retention unlinks it): after that the read goes by
/// name again, as every read without a kept segment does.
pub(crate) struct KeptSegment {
    file: File,
    ino: u64,
}

impl KeptSegment {
    /// Keeps `file` (segment inode `ino`) if fewer than `at_most` segments
    /// are kept in the process.
    fn keep(file: File, ino: u64, at_most: usize) -> Option<KeptSegment> {
        KEPT_SEGMENTS
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < at_most).then_some(n + 1))
            .ok()
            .map(|_| KeptSegment { file, ino })
    }

    /// True when `kept` is the cursor's segment, still linked, and ends
    /// where the cursor stands (one `statx`): a reader that took the
    /// records up to there from memory ([`read_written`]) has then read
    /// everything the file holds, as a read of the file would have.
    pub(crate) fn ends_at(kept: &Option<KeptSegment>, cursor: &LogCursor) -> bool {
        let Some(kept) = kept.as_ref().filter(|k| k.ino == cursor.ino) else { return false };
        stat_fd(&kept.file).is_ok_and(|st| st.links > 0 && st.size == cursor.offset)
    }
}

impl Drop for KeptSegment {
    fn drop(&mut self) {
        KEPT_SEGMENTS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How [`read_new_hinted`] may read: what its caller knows, and where it
/// keeps the segment it reads.
pub(crate) struct ReadHints<'a> {
    /// No segment can have appeared in the topic's directory since the
    /// caller last found none after the cursor's (the change notifier
    /// says so, see `Subscription::segments_created`): a read that
    /// reaches the end of its segment is then caught up without looking
    /// for the next segment by name.
    pub no_new_segment: bool,
    /// The segment kept open by the caller between reads, if any.
    pub kept: &'a mut Option<KeptSegment>,
    /// Keep the segment read open if fewer than this many are (0: never).
    pub keep_at_most: usize,
}

/// Scans the cursor's segment from its offset, through the kept file when
/// it is that segment and still linked, else by name (keeping the file
/// opened if `hints` allow).
fn scan_positioned(path: &Path, cursor: &LogCursor, floor: u64, hints: &mut ReadHints<'_>) -> Result<Option<Scan>> {
    if let Some(kept) = hints.kept.as_mut().filter(|k| k.ino == cursor.ino) {
        if let Ok(st) = stat_fd(&kept.file) {
            if st.links > 0 {
                let scan = scan_read(&mut kept.file, path, cursor.offset, floor, Mode::Tail, st.ino, Some(st.size), 0)?;
                return Ok(Some(scan));
            }
        }
    }
    *hints.kept = None;
    let Some((file, scan)) = open_and_scan(path, cursor.offset, floor, Mode::Tail, 0)? else { return Ok(None) };
    if scan.ino == cursor.ino && hints.keep_at_most > 0 {
        *hints.kept = KeptSegment::keep(file, scan.ino, hints.keep_at_most);
    }
    Ok(Some(scan))
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
    /// The valid records with their offsets, in file order.
    pub records: Vec<(u64, Record)>,
    /// Offset just past the last valid record (or `from` if none).
    pub end: u64,
    /// Bad frames followed by valid ones: each damaged stretch, skipped.
    pub damaged: Vec<Damage>,
    /// Why the scan stopped before the end of the file, if it did: a bad
    /// frame at `end` with no valid frame after it.
    pub stop: Option<Stop>,
    /// The inode of the segment file scanned.
    pub ino: u64,
    /// The highest seq of the valid records read, skipped ones included
    /// (the scan's `floor` when there is none).
    pub last: u64,
    /// True when every byte read was a whole, valid record (the scan
    /// reached the end of what the file held).
    pub whole: bool,
}

/// A stretch of bad bytes in the middle of a segment, between two valid
/// frames: one damaged record (or more, if the damage spans several).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Damage {
    /// Where the bad frame starts.
    pub offset: u64,
    /// Bytes skipped up to the next valid frame.
    pub len: u64,
    /// What was wrong with the frame at `offset`.
    pub stop: Stop,
}

/// Why a scan stopped before the end of the file, or why a frame was bad.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Stop {
    /// A frame whose length runs past the end of the file.
    Incomplete,
    /// Nothing but zero bytes up to the end of the file (a file size that
    /// survived a power cut without its data).
    Zeroed,
    /// A frame whose length, CRC or body is wrong.
    Corrupt(String),
}

/// How a scan treats an *incomplete* frame followed by more bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The segment may be receiving an append right now (the last segment,
    /// read without the lock): an incomplete frame is "not written yet",
    /// so the scan stops there. A *corrupt* frame is never a write in
    /// progress (a reader sees a prefix of a frame, which is incomplete),
    /// so the scan resynchronises after it.
    Tail,
    /// No append can be in progress (a sealed segment, or the writer's own
    /// scan under the lock): the scan resynchronises after any bad frame.
    Whole,
}

/// The smallest frame a writer ever writes: header, a map of three, the
/// keys `s`, `t`, `e` with one-byte values and an empty element map. A
/// stretch of `n` damaged bytes held at most `n / MIN_FRAME` records.
pub(crate) const MIN_FRAME: u64 = (record::FRAME_HEADER + 10) as u64;

/// Reads the records of `file` from byte `from` to its end. A bad frame
/// does not end the scan: it looks forward, byte by byte, for the next
/// frame whose length and CRC check out, whose body decodes and whose `seq`
/// is above every `seq` before it (and above `floor`), and goes on from
/// there, recording the skipped stretch in `damaged`. Only when no valid
/// frame follows does it stop (`stop`), with `end` just past the last
/// valid record. In [`Mode::Tail`] an incomplete frame stops the scan at
/// once. The forward search runs only after a bad frame.
pub(crate) fn scan_file(file: &mut File, path: &Path, from: u64, floor: u64, mode: Mode, ino: u64) -> Result<Scan> {
    scan_read(file, path, from, floor, mode, ino, None, 0)
}

/// [`scan_file`] of a file whose length was `size` a moment ago: reads
/// from `from` up to that length with `pread` (bytes appended since are
/// left for the next scan, as if they came after it), else to the end.
/// Records up to seq `skip_upto` are checked (their CRC) but neither
/// decoded nor returned (0: every record is).
#[allow(clippy::too_many_arguments)]
fn scan_read(file: &mut File, path: &Path, from: u64, floor: u64, mode: Mode, ino: u64, size: Option<u64>, skip_upto: u64) -> Result<Scan> {
    let mut bytes = Vec::new();
    match size {
        Some(size) => {
            bytes.resize(usize::try_from(size.saturating_sub(from)).unwrap_or(0), 0);
            // A file cut short meanwhile (a torn tail repaired) reads less.
            let got = super::read_at_most(file, &mut bytes, from).map_err(|e| Error::io("cannot read segment", path, e))?;
            bytes.truncate(got);
        }
        None => {
            file.seek(SeekFrom::Start(from)).map_err(|e| Error::io("cannot seek segment", path, e))?;
            file.read_to_end(&mut bytes).map_err(|e| Error::io("cannot read segment", path, e))?;
        }
    }
    let mut records = Vec::new();
    let mut damaged = Vec::new();
    let mut pos = 0usize;
    let mut end = 0usize;
    let mut last = floor;
    let mut stop = None;
    while pos < bytes.len() {
        if skip_upto > 0 {
            if let Some((seq, len)) = record::peek_seq(&bytes[pos..]).filter(|&(seq, _)| seq <= skip_upto) {
                last = last.max(seq);
                pos += len;
                end = pos;
                continue;
            }
        }
        let bad = match record::decode(&bytes[pos..]) {
            Decoded::Record(r, len) => {
                last = last.max(r.seq);
                records.push((from + pos as u64, r));
                pos += len;
                end = pos;
                continue;
            }
            Decoded::Incomplete => Stop::Incomplete,
            Decoded::Corrupt(why) => Stop::Corrupt(why),
        };
        if bytes[pos..].iter().all(|&b| b == 0) {
            stop = Some(Stop::Zeroed);
            break;
        }
        if bad == Stop::Incomplete && mode == Mode::Tail {
            stop = Some(bad);
            break;
        }
        match resync(&bytes, pos + 1, last) {
            Some(next) => {
                damaged.push(Damage { offset: from + pos as u64, len: (next - pos) as u64, stop: bad });
                pos = next;
            }
            None => {
                stop = Some(bad);
                break;
            }
        }
    }
    let whole = stop.is_none() && end == bytes.len();
    Ok(Scan { records, end: from + end as u64, damaged, stop, ino, whole, last })
}

/// The first offset at or after `start` where a valid frame begins whose
/// `seq` is above `last`.
fn resync(bytes: &[u8], start: usize, last: u64) -> Option<usize> {
    let header = record::FRAME_HEADER;
    let mut at = start;
    while at + MIN_FRAME as usize <= bytes.len() {
        let len = u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]) as usize;
        // Cheap tests first: the length must fit, and a body is a map.
        let plausible = len + header <= bytes.len() - at
            && len >= MIN_FRAME as usize - header
            && matches!(bytes[at + header], 0x80..=0x8f | 0xde | 0xdf);
        if plausible {
            if let Decoded::Record(r, _) = record::decode(&bytes[at..]) {
                if r.seq > last {
                    return Some(at);
                }
            }
        }
        at += 1;
    }
    None
}

/// Visits records newest first until `visit` returns false. Costs the
/// records visited plus at most one segment read in full (and one `open`
/// of each segment).
///
/// The records visited are one consistent view of the log, whatever a
/// compaction does meanwhile: every record compaction drops is superseded
/// by a newer one, and the segments are opened oldest first (see
/// [`open_oldest_first`]), so a record missing from a segment opened after
/// its compaction has its newer record in a segment opened later still.
/// Reading newest first straight from the names instead would miss both
/// when a compaction drops an old record for a newer one appended after the
/// newest segment was read.
///
/// Only the records after seq `after` (0: all) are visited: the older
/// records of a segment are checked but not decoded (what a resume from a
/// checkpoint near the end costs is then the few records after it, not
/// the whole newest segment), and older segments are not read.
pub(crate) fn read_backwards_after(dir: &Path, after: u64, mut visit: impl FnMut(Record) -> bool) -> Result<()> {
    let segments = open_oldest_first(dir)?;
    let newest = segments.len();
    let mut floor = u64::MAX;
    for (i, (first, mut file)) in segments.into_iter().enumerate().rev() {
        let mode = if i + 1 == newest { Mode::Tail } else { Mode::Whole };
        let path = dir.join(segment_name(first));
        let (ino, size) = stat_fd(&file).map(|s| (s.ino, Some(s.size))).unwrap_or((0, None));
        let scan = scan_read(&mut file, &path, 0, first.saturating_sub(1), mode, ino, size, after)?;
        for (_, r) in scan.records.into_iter().rev() {
            if r.seq >= floor {
                continue;
            }
            floor = r.seq;
            if !visit(r) {
                return Ok(());
            }
        }
        // Every record of an older segment is below this one's first.
        if after > 0 && first <= after.saturating_add(1) {
            return Ok(());
        }
    }
    Ok(())
}

/// How many times [`open_oldest_first`] starts again when a segment
/// vanished between its listing and its opening.
const OPEN_ATTEMPTS: usize = 64;

/// Opens every segment of `dir`, oldest first, then any that a roll added
/// meanwhile, until a listing shows nothing newer than the last one opened.
/// An open descriptor keeps the file as it was when opened, even when a
/// compaction renames a rewritten file over it. A segment gone between the
/// listing and its opening (merged into an older one by a compaction, or
/// deleted by retention) starts the whole opening again: the older
/// segments opened before may lack what it held.
fn open_oldest_first(dir: &Path) -> Result<Vec<(u64, File)>> {
    'attempt: for _ in 0..OPEN_ATTEMPTS {
        let mut opened: Vec<(u64, File)> = Vec::new();
        let mut listed = list_segments(dir)?;
        loop {
            let last = opened.last().map(|&(first, _)| first);
            for first in listed.into_iter().filter(|&f| last.is_none_or(|l| f > l)) {
                let path = dir.join(segment_name(first));
                match super::open_read(&path) {
                    Ok(file) => opened.push((first, file)),
                    Err(e) if e.kind() == IoKind::NotFound => continue 'attempt,
                    Err(e) => return Err(Error::io("cannot open segment", &path, e)),
                }
            }
            listed = list_segments(dir)?;
            let last = opened.last().map(|&(first, _)| first);
            if listed.last().copied() <= last {
                return Ok(opened);
            }
        }
    }
    Err(Error::io(
        "segments kept vanishing while opening them to read",
        dir,
        std::io::Error::new(IoKind::Interrupted, format!("{OPEN_ATTEMPTS} attempts")),
    ))
}

/// A record this process appended, as it was written: the segment file it
/// went to (its name's first seq and its inode), where in it the frame
/// starts, and the frame's bytes (or the frames of consecutive records
/// appended together, `Writer::append_run`). A segment is append-only and a record, once stored, is never
/// changed in place (compaction and retention make or unlink *other*
/// files), so these are the bytes a read of that inode at `offset` returns
/// for as long as the inode exists: a reader positioned there can take
/// them instead of reading the file ([`read_written`]).
#[derive(Debug)]
pub(crate) struct Written {
    pub segment: u64,
    pub ino: u64,
    pub offset: u64,
    pub frame: Vec<u8>,
}

/// Takes from `written` (appends of this process to the cursor's topic,
/// oldest first) the records that continue `cursor` exactly: the first
/// must start where the cursor stands in its segment (same segment, same
/// inode, same offset) and carry the next sequence number, each next one
/// start where the last ended and carry the number after. Advances the cursor past
/// them (whether the cursor is then caught up is the caller's to say, see
/// [`LogCursor::caught_up`]).
/// Empty, the cursor untouched, when the first does not match: the
/// caller reads the file. A record with a blob is never handed over (its
/// payload is in another file) and ends the run.
pub(crate) fn read_written(cursor: &mut LogCursor, written: &[std::sync::Arc<Written>]) -> Vec<Record> {
    let mut out = Vec::new();
    if cursor.ino == 0 {
        return out;
    }
    let at = |w: &Written, c: &LogCursor| w.segment == c.segment && w.ino == c.ino && w.offset == c.offset;
    let Some(start) = written.iter().position(|w| at(w, cursor)) else { return out };
    for w in &written[start..] {
        if !at(w, cursor) {
            break;
        }
        // One frame, or the consecutive frames of a run (`append_run`).
        let mut rest = &w.frame[..];
        while !rest.is_empty() {
            let Decoded::Record(r, len) = record::decode(rest) else { return out };
            if r.blob.is_some() || Some(r.seq) != cursor.last_seq.checked_add(1) {
                return out;
            }
            rest = &rest[len..];
            cursor.offset += len as u64;
            cursor.last_seq = r.seq;
            out.push(r);
        }
    }
    out
}

/// A reader's position in a topic's log: just after record `last_seq`,
/// which ends at `offset` in segment `segment`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogCursor {
    pub(crate) last_seq: u64,
    pub(crate) segment: u64,
    pub(crate) offset: u64,
    pub(crate) ino: u64,
    /// Set by [`read_new`]: its last call read everything the log held
    /// when it looked (see [`LogCursor::caught_up`]).
    pub(crate) caught_up: bool,
}

impl LogCursor {
    /// A cursor just after record `last_seq`, ending at `offset` of the
    /// segment named `segment` whose inode is `ino` (0: not known), as a
    /// reader recorded it (a snapshot of its position). `LogCursor::at(n,
    /// 0, 0, 0)`: just after record `n`, its place found by the first
    /// read; `n = 0`: the beginning of the log.
    pub fn at(last_seq: u64, segment: u64, offset: u64, ino: u64) -> LogCursor {
        LogCursor { last_seq, segment, offset, ino, caught_up: false }
    }

    /// Moves the cursor past record `seq`, which its owner has just
    /// appended itself and which ends at `offset` of the cursor's segment,
    /// so that it is not read back.
    pub fn advance(&mut self, seq: u64, offset: u64) {
        self.last_seq = seq;
        self.offset = offset;
    }

    /// The checkpoint of the last record this cursor has passed (0 before
    /// the first).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The segment (its first seq) the cursor is in (0: to be found).
    pub fn segment(&self) -> u64 {
        self.segment
    }

    /// Where in [`LogCursor::segment`] the cursor is, in bytes.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The inode of [`LogCursor::segment`] as last seen (0: not known).
    pub fn ino(&self) -> u64 {
        self.ino
    }

    /// True when the last read left nothing behind that was in the log
    /// when it looked (whether it returned records or not): the segment
    /// read to its end in whole records, and no segment after it under the
    /// name a roll gives it (the next sequence number). A reader whose wakeup was armed
    /// before that read may then wait for the next wakeup instead of
    /// reading again to make sure. (A segment started after a crash
    /// recovery hid records, or by a compaction, has another name; its
    /// writer's wakeup comes after it, so waiting loses nothing there
    /// either, at worst delays it to the next wakeup or keep-alive.)
    pub fn caught_up(&self) -> bool {
        self.caught_up
    }
}

/// A cursor at the current end of the log of `dir`.
pub fn cursor_at_end(dir: &Path) -> Result<LogCursor> {
    let segments = list_segments(dir)?;
    let Some(&last) = segments.last() else {
        return Ok(LogCursor { last_seq: 0, segment: 0, offset: 0, ino: 0, caught_up: false });
    };
    let Some(scan) = scan_segment_end(&dir.join(segment_name(last)), last.saturating_sub(1))? else {
        return Ok(LogCursor { last_seq: last.saturating_sub(1), segment: 0, offset: 0, ino: 0, caught_up: false });
    };
    Ok(LogCursor { last_seq: scan.last, segment: last, offset: scan.end, ino: scan.ino, caught_up: scan.whole })
}

/// Reads the records after `cursor` and advances it. Cheap when nothing is
/// new: one `stat`, one `read` and, at the end of a segment, one listing.
/// A long-lived reader passes [`ReadHints`] (see there).
pub(crate) fn read_new_hinted(dir: &Path, cursor: &mut LogCursor, mut hints: ReadHints<'_>) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    cursor.caught_up = false;
    let no_new_segment = hints.no_new_segment;
    loop {
        let path = dir.join(segment_name(cursor.segment));
        let positioned = cursor.ino != 0;
        let floor = cursor.last_seq.max(cursor.segment.saturating_sub(1));
        let scan = if positioned { scan_positioned(&path, cursor, floor, &mut hints)? } else { None };
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
                    cursor.caught_up = scan.whole && (no_new_segment || !dir.join(segment_name(cursor.last_seq + 1)).exists());
                    return Ok(out);
                }
                if scan.whole && no_new_segment {
                    // At the end of the segment, and no newer one can
                    // exist whose wakeup is not still to come (see
                    // `ReadHints::no_new_segment`): nothing to list.
                    cursor.caught_up = true;
                    return Ok(out);
                }
                // At the end of this segment, or at a frame not written
                // completely: wait for more, unless a newer segment exists
                // (then this one is sealed: read the rest of it in whole,
                // resynchronising after any bad frame, and move on).
                let segments = list_segments(dir)?;
                match segments.iter().find(|&&f| f > cursor.segment) {
                    Some(&next) => {
                        // Records appended to this segment after our read
                        // but before the roll: read them first.
                        let floor = cursor.last_seq.max(cursor.segment.saturating_sub(1));
                        if let Some(late) = scan_segment(&path, cursor.offset, floor, Mode::Whole)?.filter(|s| s.ino == cursor.ino) {
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
                    None => {
                        // Nothing newer: caught up if this one was read
                        // to its end in whole records.
                        cursor.caught_up = scan.whole;
                        return Ok(out);
                    }
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
                let Some(scan) = scan_segment(&dir.join(segment_name(first)), 0, u64::MAX, Mode::Tail)? else { continue };
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

/// True when `file` has no name left (`fstat` link count 0): its topic was
/// removed while this process waited for the lock or kept it open.
pub(crate) fn unlinked(file: &File) -> bool {
    file.metadata().is_ok_and(|m| m.nlink() == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Event;

    #[test]
    fn the_end_found_without_decoding_is_the_end_found_by_decoding() {
        let frame = |seq: u64| {
            let mut e = Event::new();
            e.set("kn_id", format!("id{seq}")).set("kn_payload", "x".repeat(seq as usize % 7));
            record::encode(&Record { seq, stored_secs: 1, event: e, blob: None })
        };
        let whole: Vec<u8> = (10..20).flat_map(frame).collect();
        let torn = [whole.clone(), frame(20)[..9].to_vec()].concat();
        let mut damaged = whole.clone();
        damaged[frame(10).len() + 12] ^= 1; // inside the record of seq 11
        let zeroed = [whole.clone(), vec![0; 64]].concat();
        let dir = tempfile::tempdir().unwrap();
        for (name, bytes) in [("whole", whole), ("torn", torn), ("damaged", damaged), ("zeroed", zeroed), ("empty", Vec::new())] {
            let path = dir.path().join(name);
            std::fs::write(&path, &bytes).unwrap();
            let decoded = scan_segment(&path, 0, 9, Mode::Tail).unwrap().unwrap();
            let peeked = scan_segment_end(&path, 9).unwrap().unwrap();
            let last = decoded.records.last().map_or(9, |(_, r)| r.seq);
            assert_eq!((peeked.last, peeked.end, peeked.whole, &peeked.stop), (last, decoded.end, decoded.whole, &decoded.stop), "{name}");
            assert_eq!(peeked.damaged.len(), decoded.damaged.len(), "{name}");
            assert!(peeked.records.is_empty(), "{name}");
        }
    }

    #[test]
    fn written_records_are_taken_only_where_the_cursor_stands() {
        let frame = |seq: u64, payload: &str| {
            let mut e = Event::new();
            e.set("kn_id", format!("id{seq}")).set("kn_payload", payload);
            record::encode(&Record { seq, stored_secs: 1, event: e, blob: None })
        };
        let (f1, f2, f3) = (frame(5, "a"), frame(6, "b"), frame(7, "c"));
        let (o2, o3) = (100 + f1.len() as u64, 100 + (f1.len() + f2.len()) as u64);
        let written: Vec<std::sync::Arc<Written>> = vec![
            Written { segment: 1, ino: 9, offset: 100, frame: f1 },
            Written { segment: 1, ino: 9, offset: o2, frame: f2 },
            Written { segment: 1, ino: 9, offset: o3, frame: f3.clone() },
        ]
        .into_iter()
        .map(std::sync::Arc::new)
        .collect();
        let at = |offset: u64, ino: u64, last_seq: u64| LogCursor { last_seq, segment: 1, offset, ino, caught_up: true };
        // Where the second starts: the second and the third, in order.
        let mut cursor = at(o2, 9, 5);
        let got = read_written(&mut cursor, &written);
        assert_eq!(got.iter().map(|r| r.seq).collect::<Vec<_>>(), [6, 7]);
        assert_eq!(got[1].event.payload(), b"c");
        assert_eq!((cursor.offset, cursor.last_seq), (o3 + f3.len() as u64, 7));
        // Another inode, another segment, an offset between records, a
        // sequence number that does not follow, past the end, or a cursor
        // not placed: nothing, the cursor untouched.
        let elsewhere = LogCursor { segment: 2, ..at(o2, 9, 5) };
        for mut cursor in [at(o2, 8, 5), elsewhere, at(o2 + 1, 9, 5), at(o2, 9, 4), at(cursor.offset, 9, 7), at(0, 0, 0)] {
            let before = cursor.clone();
            assert!(read_written(&mut cursor, &written).is_empty());
            assert_eq!(cursor, before);
        }
        // A gap after the first: only the first.
        let gap = vec![written[0].clone(), written[2].clone()];
        let mut cursor = at(100, 9, 4);
        assert_eq!(read_written(&mut cursor, &gap).iter().map(|r| r.seq).collect::<Vec<_>>(), [5]);
        // A run of frames in one piece (`append_run`): all of them, in
        // order; a run that breaks off (a wrong seq) gives what came before.
        let run: Vec<u8> = [frame(5, "a"), frame(6, "b"), frame(7, "c")].concat();
        let mut cursor = at(100, 9, 4);
        let one = [std::sync::Arc::new(Written { segment: 1, ino: 9, offset: 100, frame: run.clone() })];
        assert_eq!(read_written(&mut cursor, &one).iter().map(|r| r.seq).collect::<Vec<_>>(), [5, 6, 7]);
        assert_eq!((cursor.offset, cursor.last_seq), (100 + run.len() as u64, 7));
        let broken: Vec<u8> = [frame(5, "a"), frame(9, "b")].concat();
        let mut cursor = at(100, 9, 4);
        let one = [std::sync::Arc::new(Written { segment: 1, ino: 9, offset: 100, frame: broken })];
        assert_eq!(read_written(&mut cursor, &one).iter().map(|r| r.seq).collect::<Vec<_>>(), [5]);
        assert_eq!(cursor.last_seq, 5);
        // A record with a blob is never taken (its payload is elsewhere).
        let mut e = Event::new();
        e.set("kn_id", "big");
        let blob = record::BlobRef::of(b"elsewhere");
        let with_blob = record::encode(&Record { seq: 5, stored_secs: 1, event: e, blob: Some(blob) });
        let mut cursor = at(100, 9, 4);
        assert!(read_written(&mut cursor, &[std::sync::Arc::new(Written { segment: 1, ino: 9, offset: 100, frame: with_blob })]).is_empty());
        assert_eq!(cursor.offset, 100);
    }

    fn segment(n: u64) -> (Vec<u8>, Vec<(usize, usize)>) {
        let mut bytes = Vec::new();
        let mut frames = Vec::new();
        for seq in 1..=n {
            let mut e = Event::new();
            e.set("kn_id", format!("id{seq}")).set("kn_payload", "x".repeat(seq as usize * 3));
            let frame = record::encode(&Record { seq, stored_secs: 1_796_018_670, event: e, blob: None });
            frames.push((bytes.len(), frame.len()));
            bytes.extend_from_slice(&frame);
        }
        (bytes, frames)
    }

    fn scan_bytes(bytes: &[u8], mode: Mode) -> Scan {
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, bytes).unwrap();
        scan_file(&mut f, Path::new("test"), 0, 0, mode, 0).unwrap()
    }

    /// Every single flipped bit of the first, a middle or the last record
    /// costs that record alone; the scan reports it where it starts.
    #[test]
    fn every_flipped_bit_costs_one_record() {
        let (bytes, frames) = segment(7);
        for k in [0usize, 3, 6] {
            let (at, len) = frames[k];
            for i in at..at + len {
                for bit in 0..8 {
                    let mut bad = bytes.clone();
                    bad[i] ^= 1 << bit;
                    let scan = scan_bytes(&bad, Mode::Whole);
                    let seqs: Vec<u64> = scan.records.iter().map(|(_, r)| r.seq).collect();
                    let want: Vec<u64> = (1..=7).filter(|&s| s != k as u64 + 1).collect();
                    assert_eq!(seqs, want, "record {k}, byte {i}, bit {bit}");
                    let reported: Vec<u64> =
                        scan.damaged.iter().map(|d| d.offset).chain(scan.stop.as_ref().map(|_| scan.end)).collect();
                    assert_eq!(reported, [at as u64], "record {k}, byte {i}, bit {bit}");
                }
            }
        }
    }

    /// In the tail mode of readers, an incomplete frame at the end is "not
    /// written yet"; a corrupt one in the middle is skipped.
    #[test]
    fn tail_mode_waits_at_an_incomplete_frame_and_skips_a_corrupt_one() {
        let (bytes, frames) = segment(3);
        let (at, _) = frames[2];
        let partial = &bytes[..at + 10];
        let scan = scan_bytes(partial, Mode::Tail);
        assert_eq!((scan.records.len(), scan.end, scan.stop.clone()), (2, at as u64, Some(Stop::Incomplete)));
        let mut bad = bytes.clone();
        bad[frames[1].0 + 12] ^= 0x40;
        let scan = scan_bytes(&bad, Mode::Tail);
        assert_eq!(scan.records.iter().map(|(_, r)| r.seq).collect::<Vec<_>>(), [1, 3]);
        assert_eq!(scan.stop, None);
        // Zeros to the end of the file are a torn tail, whatever the mode.
        let mut zeroed = bytes[..at].to_vec();
        zeroed.extend_from_slice(&[0u8; 100]);
        assert_eq!(scan_bytes(&zeroed, Mode::Whole).stop, Some(Stop::Zeroed));
    }
}

//! The writer's `.head`: the header (`Head`), its open file (`HeadFile`,
//! read and written with `pread`/`pwrite`), the `kn_id` duplicate index
//! slots, and writing or rebuilding a head from the log (with what a
//! writer does with bad bytes in the active segment: `recovery_of`).

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::ErrorKind as IoKind;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use crate::config::{Config, SyncPolicy};
use crate::error::{Error, Result};

use super::{FILE_MODE, HEAD_FILE, group_writable, open_rw, sync_dir};
use super::segment::{MIN_FRAME, Mode, Scan, Stop, list_segments, scan_segment, segment_name};

const HEAD_MAGIC: &[u8; 8] = b"KNHEAD\x00\x03";
pub(super) const HEAD_SIZE: u64 = 128;
/// Offset of the header's CRC-32C, which covers the bytes before it.
const HEAD_CRC: usize = 72;
pub(super) const SLOT_SIZE: u64 = 12;
pub(super) const INITIAL_SLOTS: u64 = 64;
/// The unit in which a whole `.head` is written (see `write_head_file`).
const HEAD_PAGE: usize = 4096;

/// The writer's state, kept in the first bytes of `.head`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Head {
    pub(super) next_seq: u64,
    pub(super) active: u64,
    pub(super) active_len: u64,
    pub(super) live: u64,
    pub(super) garbage: u64,
    pub(super) slots: u64,
    pub(super) used: u64,
    /// The route generation: changes (is incremented) before every write
    /// to this topic's `kn_routes`, and starts at a random value in every
    /// head built from the log, so that a process may keep the routes it
    /// read for as long as it finds the same value here.
    pub(super) routes: u64,
}

impl Head {
    pub(super) fn encode(&self) -> [u8; HEAD_SIZE as usize] {
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

    pub(super) fn decode(b: &[u8]) -> Option<Head> {
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
    u64::from_le_bytes(crate::ids::random_bytes())
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

/// The checkpoint of the last record of the log whose `.head` is open as
/// `file`, as the head says now: one `pread`. `None` when it is not a
/// valid head (one replaced since `file` was opened has its magic
/// cleared, see `write_head_file`).
pub fn last_seq_of(file: &File) -> Option<u64> {
    let mut buf = [0u8; HEAD_SIZE as usize];
    file.read_exact_at(&mut buf, 0).ok()?;
    Head::decode(&buf).map(|h| h.next_seq.saturating_sub(1))
}

/// The 32-bit hash of a `kn_id` in the duplicate index (never 0, which
/// marks an empty slot). Two ids may share a hash: a duplicate needs the
/// 64-bit digest of the end-to-end elements to match as well.
pub(super) fn id_hash(id: &[u8]) -> u64 {
    (xxhash_rust::xxh3::xxh3_64(id) as u32 | 1) as u64
}

/// One index slot: id hash (u32 LE), digest (u64 LE).
pub(super) fn encode_slot(hash: u64, digest: u64) -> [u8; SLOT_SIZE as usize] {
    let mut s = [0u8; SLOT_SIZE as usize];
    s[..4].copy_from_slice(&(hash as u32).to_le_bytes());
    s[4..].copy_from_slice(&digest.to_le_bytes());
    s
}

pub(super) fn decode_slot(s: &[u8]) -> (u64, u64) {
    let hash = u32::from_le_bytes(s[..4].try_into().unwrap_or([0; 4])) as u64;
    let digest = u64::from_le_bytes(s[4..12].try_into().unwrap_or([0; 8]));
    (hash, digest)
}

/// The index grows (doubles) before it is more than 80 % full.
pub(super) fn index_full(used: u64, slots: u64) -> bool {
    (used + 1) * 10 > slots * 8
}

/// The open `.head`, read and written with `pread` and `pwrite`. It is
/// not memory-mapped: a store into a mapped page that the file system
/// cannot allocate (a full disk, a hole in the file, any write on a
/// copy-on-write file system) raises SIGBUS and kills the process, where
/// `pwrite` returns `ENOSPC` (the post's `DiskFull`, 507). The store never
/// truncates a `.head` in place (a new one is written aside and renamed),
/// so its length, read once here, stays right for as long as it is open.
pub(crate) struct HeadFile {
    pub(super) file: File,
    len: u64,
}

impl HeadFile {
    /// Takes `file`; fails (the head is then rebuilt) when it is shorter
    /// than a header.
    pub(super) fn new(file: File) -> std::io::Result<HeadFile> {
        let len = file.metadata()?.len();
        if len < HEAD_SIZE {
            return Err(std::io::Error::new(IoKind::UnexpectedEof, "head shorter than its header"));
        }
        Ok(HeadFile { file, len })
    }

    pub(super) fn len(&self) -> u64 {
        self.len
    }

    pub(super) fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        if offset + buf.len() as u64 > self.len {
            return Err(std::io::Error::new(IoKind::UnexpectedEof, "read past the end of the head"));
        }
        self.file.read_exact_at(buf, offset)
    }

    /// One `pwrite`; the caller holds the topic lock, which excludes every
    /// other writer of the head.
    pub(super) fn write_all_at(&self, bytes: &[u8], offset: u64) -> std::io::Result<()> {
        if offset + bytes.len() as u64 > self.len {
            return Err(std::io::Error::new(IoKind::UnexpectedEof, "write past the end of the head"));
        }
        self.file.write_all_at(bytes, offset)
    }

    pub(super) fn sync_data(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }
}

pub(super) fn table_slots(live: u64) -> u64 {
    let mut slots = INITIAL_SLOTS;
    while index_full(live, slots) {
        slots *= 2;
    }
    slots
}

/// Writes a complete `.head` (header and table) under a temporary name and
/// renames it into place; returns it opened.
pub(super) fn write_head_file(dir: &Path, head: &Head, entries: &[(u64, u64)]) -> Result<HeadFile> {
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
        // Read at every append: without access times (`without_atime`).
        let f = super::without_atime(OpenOptions::new().read(true).write(true).create(true).truncate(true).mode(FILE_MODE), &tmp)?;
        group_writable(&f)?;
        // Page by page: the page cache then holds the file in small folios.
        // One large write would make large folios, and every later small
        // `pwrite` of a slot or the header would pay for the whole folio
        // (ext4 walks each block of the folio it writes into).
        for (i, page) in bytes.chunks(HEAD_PAGE).enumerate() {
            f.write_all_at(page, (i * HEAD_PAGE) as u64)?;
        }
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
pub(super) fn rebuild_head(dir: &Path, config: &Config, ordinary: bool) -> Result<(HeadFile, Head)> {
    let mut segments = list_segments(dir)?;
    let mut max_seq = 0u64;
    let mut entries: HashMap<u64, u64> = HashMap::new();
    let mut records = 0u64;
    let mut active_len = 0u64;
    let mut kept = Vec::new();
    let last = segments.last().copied();
    // Set when the last segment has bad bytes the rebuild may not cut:
    // the sequence numbers they may have held, and that it must be sealed.
    let mut hidden = 0u64;
    let mut seal = false;
    for first in segments.drain(..) {
        let path = dir.join(segment_name(first));
        let Some(scan) = scan_segment(&path, 0, first.saturating_sub(1), Mode::Whole)? else { continue };
        if scan.records.is_empty() && scan.damaged.is_empty() && scan.stop.is_none() && Some(first) != last {
            // An empty sealed segment (a crash while rolling): drop it. A
            // segment holding nothing but bad frames is kept (FORMAT.md:
            // a damaged record is never deleted).
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
                entries.insert(id_hash(r.event.id().unwrap_or(b"")), super::blob::digest(dir, r));
            }
        }
        if Some(first) == last {
            max_seq = max_seq.max(first.saturating_sub(1));
            let tail = recovery_of(&scan, size_of(&path)?);
            if tail.truncate {
                let f = open_rw(&path, false).map_err(|e| Error::io("cannot open segment", &path, e))?;
                f.set_len(scan.end).map_err(|e| Error::io("cannot truncate torn tail of", &path, e))?;
            }
            hidden = tail.hidden;
            seal = tail.seal;
            active_len = if seal { 0 } else { scan.end };
        }
        kept.push(first);
    }
    let active = match kept.last() {
        // A damaged active segment is sealed: the new active one, created
        // by the attach that follows, starts after every seq it may hold.
        Some(&f) if seal => (max_seq + 1 + hidden).max(f + 1),
        Some(&f) => f,
        None => {
            // A new topic: at 1, or after the last seq of a topic of this
            // name that the sweep removed (FORMAT.md, "Readers and checkpoints").
            let first = super::removed::first_seq(config, dir)?;
            let path = dir.join(segment_name(first));
            open_rw(&path, true).map_err(|e| Error::io("cannot create segment", &path, e))?;
            if config.sync == SyncPolicy::Always {
                sync_dir(dir)?;
            }
            first
        }
    };
    let next_seq = (max_seq + 1 + hidden).max(active);
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

fn size_of(path: &Path) -> Result<u64> {
    fs::metadata(path).map(|m| m.len()).map_err(|e| Error::io("cannot stat segment", path, e))
}

/// What a writer does with the active segment after scanning it whole
/// under the lock (FORMAT.md, "Torn tails, recovery and the derived head").
pub(super) struct TailRecovery {
    /// Cut the file at `scan.end`: it ends in a torn write (an incomplete
    /// frame or zeroed bytes) with no valid frame after it.
    pub(super) truncate: bool,
    /// Seal the segment and go on in a new one: it holds bad bytes that
    /// are not a torn tail (damage followed by valid records, or a corrupt
    /// last frame), which are kept for `verify` and never cut.
    pub(super) seal: bool,
    /// How many sequence numbers a corrupt last stretch may have held, so
    /// that the next ones are not reused for new records.
    pub(super) hidden: u64,
}

pub(super) fn recovery_of(scan: &Scan, size: u64) -> TailRecovery {
    let corrupt_tail = matches!(scan.stop, Some(Stop::Corrupt(_)));
    TailRecovery {
        truncate: matches!(scan.stop, Some(Stop::Incomplete | Stop::Zeroed)),
        seal: corrupt_tail || !scan.damaged.is_empty(),
        hidden: if corrupt_tail { size.saturating_sub(scan.end) / MIN_FRAME + 1 } else { 0 },
    }
}

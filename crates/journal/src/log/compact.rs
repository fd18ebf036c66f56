//! Compaction and retention of one topic: the plan (which records stay,
//! which small segments merge), the rewrite of each segment, the rebuilt
//! index, the deletion of old journal segments, and the deletion of a
//! whole topic directory the sweep has set aside.

use std::collections::{HashMap, HashSet};
use std::fs::{self, OpenOptions};
use std::path::Path;
use std::io::ErrorKind as IoKind;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::{Duration, SystemTime};

use crate::error::{Error, Result};
use crate::event::{Event, KN_ID};
use crate::record::{self, BlobRef, Record};

use super::{FILE_MODE, group_writable, sync_dir};
use super::blob::{digest, refs_of_segment};
use std::os::unix::fs::MetadataExt;
use super::head::{Head, id_hash, table_slots, write_head_file};
use super::segment::{Mode, is_segment_file, list_segments, scan_segment, segment_name};
use super::writer::Writer;

/// Compaction of an ordinary topic starts once it holds this many
/// superseded records and more of them than live ones.
const COMPACT_MIN_GARBAGE: u64 = 1000;
/// The same for `kn_routes` and `kn_subtopics`: small topics that every
/// notify (routes) or removal (announcements) reads whole, and whose
/// garbage (deleted routes, withdrawn announcements) is most of what is
/// written to them under churn.
const COMPACT_MIN_GARBAGE_RESERVED: u64 = 32;

impl Writer<'_> {
    /// Whether enough superseded records piled up to compact: at least
    /// `COMPACT_MIN_GARBAGE`, and more than the live ids. An id whose
    /// current event is an expiring replacement (a deleted route, a
    /// tombstone) leaves the live count when it is stored, so churn (routes
    /// made and deleted) is weighed against the routes still there, not
    /// against every id ever seen; a compaction then counts every id it
    /// kept as live (tombstones not yet reclaimable included), so the next
    /// one is at least as far away as this one cost.
    /// On `kn_routes` and `kn_subtopics` the minimum is
    /// `COMPACT_MIN_GARBAGE_RESERVED`.
    pub(crate) fn wants_compaction(&self) -> bool {
        self.wants_compaction_at(self.head.garbage, self.head.live)
    }

    /// Whether appending one more record could leave the topic wanting a
    /// compaction ([`Writer::wants_compaction`]): an append adds at most
    /// one superseded record and takes at most one live id away.
    pub(crate) fn may_want_compaction_after_append(&self) -> bool {
        self.wants_compaction_at(self.head.garbage + 1, self.head.live.saturating_sub(1))
    }

    /// The rule of [`Writer::wants_compaction`] for `garbage` superseded
    /// records and `live` ids.
    fn wants_compaction_at(&self, garbage: u64, live: u64) -> bool {
        let min = if self.is_reserved() { COMPACT_MIN_GARBAGE_RESERVED } else { COMPACT_MIN_GARBAGE };
        self.ordinary && garbage >= min && garbage > live
    }

    /// True for a `kn_routes` or `kn_subtopics` topic.
    fn is_reserved(&self) -> bool {
        self.dir.file_name().is_some_and(|n| n == crate::topic::ROUTES_SEGMENT || n == crate::topic::SUBTOPICS_SEGMENT)
    }

    /// The compaction a write asks for when [`Writer::wants_compaction`]:
    /// [`Writer::compact`], which leaves the active segment as it is. A
    /// small reserved topic (`kn_routes`, `kn_subtopics` whose segments
    /// hold at most `segment_bytes` in all), whose garbage may all be in
    /// its active segment for ever (it rolls only when it fills), first
    /// seals that segment (a roll, as an append that fills it does), so
    /// its garbage goes now: the trigger then costs reading and
    /// rewriting at most `segment_bytes`, and comes again only once as
    /// much garbage as live data was written.
    pub(crate) fn compact_wanted(&mut self, now: f64) -> Result<CompactReport> {
        if self.is_reserved() && self.head.active_len > 0 {
            let mut total = 0;
            for first in list_segments(&self.dir)? {
                total += fs::metadata(self.dir.join(segment_name(first))).map(|m| m.len()).unwrap_or(0);
            }
            if total <= self.config.segment_bytes {
                self.roll()?;
            }
        }
        self.compact(now)
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
            let blobs = refs_of_segment(&path)?;
            fs::remove_file(&path).map_err(|e| Error::io("cannot delete old segment", &path, e))?;
            // The records go first, then their blob links: a crash in
            // between leaves links that compaction removes, never a record
            // without its blob.
            self.unlink_dropped(&blobs)?;
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
            let path = self.dir.join(segment_name(first));
            let Some(scan) = scan_segment(&path, 0, first.saturating_sub(1), Mode::Whole)? else { continue };
            if self.ordinary {
                for (_, r) in &scan.records {
                    latest.insert(id_key(&r.event), r.seq);
                }
            }
            scans.push((first, scan));
        }
        // Every blob referred to before, to sweep those no record keeps.
        let blobs_before: Vec<BlobRef> = scans.iter().flat_map(|(_, scan)| scan.records.iter().filter_map(|(_, r)| r.blob)).collect();
        // Pass 2: rewrite what changes, then merge small neighbours.
        let horizon = now - self.config.expired_grace.as_secs_f64();
        let mut last_seq = 0u64;
        let mut kept_segments: Vec<(u64, Vec<Record>, bool, bool)> = Vec::new();
        for (first, scan) in scans {
            report.records_before += scan.records.len();
            // A segment with a bad frame is left as it is, like the active
            // one: rewriting it would delete the damaged bytes (FORMAT.md:
            // never repaired), so it is neither rewritten nor merged.
            let damaged = !scan.damaged.is_empty() || scan.stop.is_some();
            let active = first == self.head.active || damaged;
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
            kept_segments.push((first, keep, changed, active));
        }
        let merged = merge_small(kept_segments, self.config.segment_bytes);
        for seg in &merged {
            report.records_after += seg.records.len();
            self.rewrite_segment(seg)?;
        }
        if self.ordinary {
            self.rebuild_index_from(&merged)?;
        }
        // The segments are in place: unlink the blobs of dropped records
        // (and links left by writers that died before their record).
        let kept: HashSet<u64> = merged.iter().flat_map(|s| s.records.iter().filter(|r| r.blob.is_some()).map(|r| r.seq)).collect();
        let kept_hashes: HashSet<u128> = merged.iter().flat_map(|s| s.records.iter().filter_map(|r| r.blob.map(|b| b.hash))).collect();
        let dropped: Vec<BlobRef> = blobs_before.into_iter().filter(|b| !kept_hashes.contains(&b.hash)).collect();
        report.blobs_unlinked = self.unlink_unreferenced(&kept, &dropped)?;
        report.segments_after = merged.iter().filter(|s| !s.records.is_empty() || s.pinned).count();
        Ok(report)
    }

    fn rewrite_segment(&self, seg: &Planned) -> Result<()> {
        if seg.pinned || !seg.changed {
            return Ok(());
        }
        let path = self.dir.join(segment_name(seg.first));
        if seg.records.is_empty() {
            // Merged neighbours were emptied too: they go with it (keeping
            // them would keep every record compaction meant to drop).
            for first in std::iter::once(seg.first).chain(seg.absorbed.iter().copied()) {
                let path = self.dir.join(segment_name(first));
                match fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == IoKind::NotFound => {}
                    Err(e) => return Err(Error::io("cannot delete emptied segment", &path, e)),
                }
            }
            return sync_dir(&self.dir);
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
        // The last record of each id, then one digest each: a digest may
        // read and hash a blob, which a replaced record never needs.
        let mut latest: HashMap<u64, &Record> = HashMap::new();
        for seg in segments {
            for r in &seg.records {
                latest.insert(id_hash(r.event.id().unwrap_or(b"")), r);
            }
        }
        let live = latest.len() as u64;
        let slots = table_slots(live);
        let head = Head { live, garbage: 0, slots, used: live, ..self.head };
        let list: Vec<(u64, u64)> = latest.into_iter().map(|(hash, r)| (hash, digest(&self.dir, r))).collect();
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
    /// Blob links removed (of dropped records, or left by a crash).
    pub blobs_unlinked: usize,
}

fn id_key(event: &Event) -> u128 {
    xxhash_rust::xxh3::xxh3_128(event.get(KN_ID).unwrap_or(b""))
}

/// A segment as compaction will leave it.
struct Planned {
    pub(super) first: u64,
    pub(super) records: Vec<Record>,
    pub(super) changed: bool,
    /// The active segment, or one with a bad frame: kept as it is.
    pinned: bool,
    absorbed: Vec<u64>,
}

/// Merges runs of adjacent sealed segments whose records fit together in
/// half a segment, so that compaction does not leave many tiny files.
/// Pinned segments (the active one, damaged ones) are never merged.
fn merge_small(segments: Vec<(u64, Vec<Record>, bool, bool)>, segment_bytes: u64) -> Vec<Planned> {
    let size = |rs: &[Record]| rs.iter().map(|r| 64 + r.event.byte_size() as u64).sum::<u64>();
    let mut out: Vec<Planned> = Vec::new();
    for (first, records, changed, pinned) in segments {
        if !pinned {
            if let Some(prev) = out.last_mut() {
                if !prev.pinned && size(&prev.records) + size(&records) <= segment_bytes / 2 {
                    prev.records.extend(records);
                    prev.changed = true;
                    prev.absorbed.push(first);
                    continue;
                }
            }
        }
        out.push(Planned { first, records, changed, pinned, absorbed: Vec::new() });
    }
    out
}

/// Deletes the topic directory `dir` that the sweep has already renamed
/// out of the tree (FORMAT.md, "Removal"), with everything in it: first
/// the blob references of its segments are noted, then every file and
/// directory goes, then each noted `.blobs/` entry of `root` left with no
/// other link. Returns the bytes of the files deleted (blobs included).
/// A crash half-way leaves a hidden directory the next sweep deletes.
/// In a store without `.blobs/` (no payload was ever large enough) no
/// segment is read: no record can refer to a blob.
pub(crate) fn remove_topic_dir(dir: &Path, root: &Path) -> Result<u64> {
    let mut blobs = Vec::new();
    let mut bytes = 0u64;
    let has_blobs = root.join(super::blob::BLOBS_DIR).is_dir();
    for entry in walkdir::WalkDir::new(dir).follow_links(false) {
        let Ok(entry) = entry else { continue };
        if !entry.file_type().is_file() {
            continue;
        }
        bytes += entry.metadata().map(|m| m.len()).unwrap_or(0);
        if has_blobs && is_segment_file(entry.file_name()) {
            blobs.extend(refs_of_segment(entry.path()).unwrap_or_default().into_iter().map(|(_, b)| b));
        }
    }
    match fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == IoKind::NotFound => {}
        Err(e) => return Err(Error::io("cannot remove", dir, e)),
    }
    for blob in blobs {
        let path = root.join(super::blob::BLOBS_DIR).join(blob.hex());
        if fs::metadata(&path).is_ok_and(|m| m.nlink() == 1) && fs::remove_file(&path).is_ok() {
            bytes += blob.len;
        }
    }
    Ok(bytes)
}

//! Blobs: a large `kn_payload` stored once, however many topics hold it
//! (FORMAT.md, "Blobs").
//!
//! The payload is written to `<root>/.blobs/<xxh3_128 hex>` (a temporary,
//! then a rename), and each record that holds it gets a hard link of that
//! file in its own topic directory, `.blob-<seq as 16 hex>`, made before the
//! record is written. The link count is the reference count: compaction
//! and retention unlink a dropped record's link after the segment change,
//! and a `.blobs/` entry left with one link is garbage. Readers resolve a
//! record's payload through its topic's own link, so the `.blobs/` entry
//! is only the meeting point of writers storing the same payload.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind as IoKind, Read};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::config::{Config, SyncPolicy};
use crate::error::{Error, Result};
use crate::event::{Event, KN_PAYLOAD};
use crate::record::{BlobRef, Record};

use super::segment::{self, LogCursor};
use super::space::SpaceGauge;
use super::{FILE_MODE, group_writable, sync_dir};

/// The directory of the store root holding one file per stored blob.
pub(crate) const BLOBS_DIR: &str = ".blobs";
const LINK_PREFIX: &str = ".blob-";

/// A payload kept apart from its event while a post runs, so that routes
/// carry the reference and every topic links the one file.
#[derive(Debug)]
pub(crate) struct SharedPayload {
    pub(crate) reference: BlobRef,
    pub(crate) bytes: Vec<u8>,
}

impl SharedPayload {
    /// Takes `event`'s payload out of it when it is longer than
    /// `config.blob_bytes` (and blobs are enabled).
    pub(crate) fn take_from(event: &mut Event, config: &Config) -> Option<SharedPayload> {
        if config.blob_bytes == 0 || event.payload().len() <= config.blob_bytes {
            return None;
        }
        let bytes = event.remove(KN_PAYLOAD)?;
        Some(SharedPayload { reference: BlobRef::of(&bytes), bytes })
    }
}

/// The name of the link of record `seq`'s blob in its topic directory.
pub(crate) fn link_name(seq: u64) -> String {
    format!("{LINK_PREFIX}{seq:016x}")
}

fn parse_link_name(name: &str) -> Option<u64> {
    let hex = name.strip_prefix(LINK_PREFIX)?;
    if hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// The seqs of the blob links of `dir`.
pub(super) fn list_links(dir: &Path) -> Result<Vec<u64>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == IoKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("cannot list topic directory", dir, e)),
    };
    Ok(entries.filter_map(|e| e.ok()).filter_map(|e| e.file_name().to_str().and_then(parse_link_name)).collect())
}

/// Makes sure `<root>/.blobs/<hash>` holds `payload`: written to a
/// temporary, synced per the policy and renamed into place, unless a file
/// of the right length is there already. Returns its path.
pub(super) fn store(root: &Path, payload: &SharedPayload, config: &Config, gauge: &SpaceGauge) -> Result<PathBuf> {
    let dir = root.join(BLOBS_DIR);
    let path = dir.join(payload.reference.hex());
    if let Ok(m) = fs::metadata(&path) {
        if m.len() == payload.reference.len {
            if config.sync == SyncPolicy::Always {
                // Written by another process, perhaps not yet flushed.
                File::open(&path).and_then(|f| f.sync_data()).map_err(|e| Error::io("cannot sync blob", &path, e))?;
            }
            return Ok(path);
        }
    }
    match fs::create_dir(&dir) {
        Ok(()) => {
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o2775)).map_err(|e| Error::io("cannot set mode of", &dir, e))?;
            if config.sync == SyncPolicy::Always {
                sync_dir(root)?;
            }
        }
        Err(e) if e.kind() == IoKind::AlreadyExists => {}
        Err(e) => return Err(Error::io("cannot create blob directory", &dir, e)),
    }
    gauge.check(root, config.reserve_bytes, payload.reference.len)?;
    let tmp = dir.join(format!(".tmp-{}-{}", payload.reference.hex(), crate::ids::fresh_id()));
    let write = || -> std::io::Result<()> {
        let f = OpenOptions::new().write(true).create_new(true).mode(FILE_MODE).open(&tmp)?;
        group_writable(&f)?;
        f.write_all_at(&payload.bytes, 0)?;
        if config.sync == SyncPolicy::Always {
            f.sync_data()?;
        }
        fs::rename(&tmp, &path)
    };
    if let Err(e) = write() {
        let _ = fs::remove_file(&tmp);
        return Err(Error::io("cannot write blob", &path, e));
    }
    if config.sync == SyncPolicy::Always {
        sync_dir(&dir)?;
    }
    Ok(path)
}


/// The blob references of the records of segment `path` (read without
/// their payloads).
pub(super) fn refs_of_segment(path: &Path) -> Result<Vec<(u64, BlobRef)>> {
    let Some(scan) = segment::scan_segment(path, 0, 0, segment::Mode::Whole)? else { return Ok(Vec::new()) };
    Ok(scan.records.into_iter().filter_map(|(_, r)| r.blob.map(|b| (r.seq, b))).collect())
}



/// The blobs the records of the log in `dir` refer to (its segments read
/// without payloads): what removing the whole log releases.
pub fn blobs_of(dir: &Path) -> Result<Vec<BlobRef>> {
    let mut blobs = Vec::new();
    for first in segment::list_segments(dir)? {
        blobs.extend(refs_of_segment(&dir.join(segment::segment_name(first)))?.into_iter().map(|(_, b)| b));
    }
    blobs.sort_unstable_by_key(|b| b.hash);
    blobs.dedup_by_key(|b| b.hash);
    Ok(blobs)
}

/// Removes the `.blobs/` entries of `blobs` that nothing links any more,
/// once the log that held them is gone (a deleted stream). As compaction
/// does: a writer about to link one finds it gone and stores it again.
pub fn release(root: &Path, blobs: &[BlobRef]) {
    for blob in blobs {
        sweep_one(root, blob);
    }
}

/// Removes `.blobs/<hash>` when no topic links it any more. A writer that
/// was about to link it finds it gone and stores it again.
pub(super) fn sweep_one(root: &Path, blob: &BlobRef) {
    let path = root.join(BLOBS_DIR).join(blob.hex());
    if fs::metadata(&path).is_ok_and(|m| m.nlink() == 1) {
        let _ = fs::remove_file(&path);
    }
}

/// Removes every `.blobs/` entry no topic links (left by a crash between
/// storing a blob and linking it, or by an interrupted sweep) and stale
/// temporaries. Returns how many it removed.
pub(crate) fn sweep(root: &Path) -> Result<usize> {
    let mut removed = 0;
    for (path, _) in orphan_blobs(root)? {
        if fs::remove_file(&path).is_ok() {
            removed += 1;
        }
    }
    Ok(removed)
}

/// `.blobs/` entries that no topic links (one link left), and temporaries
/// older than a minute.
pub(crate) fn orphan_blobs(root: &Path) -> Result<Vec<(PathBuf, String)>> {
    let dir = root.join(BLOBS_DIR);
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == IoKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("cannot list blob directory", &dir, e)),
    };
    let mut out = Vec::new();
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(m) = entry.metadata() else { continue };
        if name.starts_with(".tmp-") {
            let old = m.modified().ok().and_then(|t| t.elapsed().ok()).is_some_and(|age| age.as_secs() > 60);
            if old {
                out.push((entry.path(), "leftover blob temporary".to_string()));
            }
        } else if m.nlink() == 1 {
            out.push((entry.path(), "orphan blob: no topic links it".to_string()));
        }
    }
    out.sort();
    Ok(out)
}

/// Reads record `seq`'s blob from topic `dir` and checks it against `blob`.
pub(crate) fn read_blob(dir: &Path, seq: u64, blob: &BlobRef) -> std::result::Result<Vec<u8>, String> {
    let path = dir.join(link_name(seq));
    let mut f = File::open(&path).map_err(|e| format!("blob {} of record {seq} missing: {e}", blob.hex()))?;
    let mut bytes = Vec::with_capacity(blob.len as usize);
    f.read_to_end(&mut bytes).map_err(|e| format!("cannot read blob {}: {e}", path.display()))?;
    if bytes.len() as u64 != blob.len {
        return Err(format!("blob {} of record {seq} holds {} bytes, the record says {}", blob.hex(), bytes.len(), blob.len));
    }
    if xxhash_rust::xxh3::xxh3_128(&bytes) != blob.hash {
        return Err(format!("blob {} of record {seq}: content does not match its hash", blob.hex()));
    }
    Ok(bytes)
}

/// Puts `record`'s payload back from its blob; false when the blob is
/// missing or damaged (compaction or retention dropped the record after
/// it was read, or the store is damaged, which `verify` reports).
fn resolve(dir: &Path, record: &mut Record) -> bool {
    let Some(blob) = record.blob else { return true };
    match read_blob(dir, record.seq, &blob) {
        Ok(bytes) => {
            record.event.set(KN_PAYLOAD, bytes);
            true
        }
        Err(_) => false,
    }
}

/// The duplicate-index digest of `record` of topic `dir`, its payload
/// read from its blob if it has one.
pub(super) fn digest(dir: &Path, record: &Record) -> u64 {
    match record.blob.and_then(|b| read_blob(dir, record.seq, &b).ok()) {
        Some(bytes) => record.event.end_to_end_digest_with_payload(Some(&bytes)) as u64,
        None => record.event.end_to_end_digest() as u64,
    }
}


/// [`segment::read_backwards_after`] of every record, with payloads
/// resolved.
pub(crate) fn read_backwards(dir: &Path, visit: impl FnMut(Record) -> bool) -> Result<()> {
    read_backwards_after(dir, 0, visit)
}

/// [`segment::read_backwards_after`] with payloads resolved.
pub(crate) fn read_backwards_after(dir: &Path, after: u64, mut visit: impl FnMut(Record) -> bool) -> Result<()> {
    segment::read_backwards_after(dir, after, |mut r| if resolve(dir, &mut r) { visit(r) } else { true })
}

/// `segment::read_new_hinted` (without a hint) with payloads resolved.
pub fn read_new(dir: &Path, cursor: &mut LogCursor) -> Result<Vec<Record>> {
    read_new_hinted(dir, cursor, segment::ReadHints { no_new_segment: false, kept: &mut None, keep_at_most: 0 })
}

/// [`segment::read_new_hinted`] with payloads resolved.
pub(crate) fn read_new_hinted(dir: &Path, cursor: &mut LogCursor, hints: segment::ReadHints<'_>) -> Result<Vec<Record>> {
    let mut records = segment::read_new_hinted(dir, cursor, hints)?;
    records.retain_mut(|r| resolve(dir, r));
    Ok(records)
}

/// Checks the blobs of topic `dir`: each record's link (present, right
/// length and hash) and links no record refers to. `records` are the
/// topic's records (raw, as scanned).
pub(crate) fn verify_links(dir: &Path, records: &[(PathBuf, u64, Record)]) -> Result<Vec<(PathBuf, u64, String)>> {
    let mut problems = Vec::new();
    let mut referenced = HashSet::new();
    for (segment, offset, r) in records {
        let Some(blob) = r.blob else { continue };
        referenced.insert(r.seq);
        if let Err(why) = read_blob(dir, r.seq, &blob) {
            problems.push((segment.clone(), *offset, why));
        }
    }
    let mut links = list_links(dir)?;
    links.sort_unstable();
    for seq in links {
        if !referenced.contains(&seq) {
            problems.push((dir.join(link_name(seq)), 0, "orphan blob link: no record refers to it".to_string()));
        }
    }
    Ok(problems)
}

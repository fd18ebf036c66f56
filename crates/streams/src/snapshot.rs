//! A stream's snapshot, `.state`: its state as of one record, so that a
//! process that knows nothing of the stream (every CGI request) replays
//! only the records after it instead of the whole log (FORMAT.md,
//! "Streams", "The snapshot").
//!
//! The snapshot is derived data, never the truth: it names the record it
//! was taken after (its `seq`, where its frame starts, and a hash of the
//! frame), and a process uses it only when that very record is found
//! there in the log. Anything else (no file, a torn or foreign one, a log
//! that lost its tail in a power cut and was written again since) falls
//! back to replaying the whole log. It is written by a writer, under the
//! stream's lock, to a temporary name and exchanged with the current one:
//! a reader sees the old snapshot or the new one, whole (or, should it
//! hold the file open across two more snapshots, one that fails its
//! checks and is not used).

use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::state::State;
use kn_journal::internal::Record;

/// The snapshot's file name, in the stream's directory.
pub(crate) const SNAPSHOT_FILE: &str = ".state";
const TEMP_FILE: &str = ".state.tmp";
const MAGIC: &[u8; 8] = b"KNDSST\x00\x01";
const HEADER: usize = 16;

/// A writer takes a new snapshot once this many records were applied
/// since the last one...
pub(crate) const SNAPSHOT_RECORDS: u64 = 256;
/// ... or this many bytes of payload: what a process without the stream
/// in memory replays is at most about that much.
pub(crate) const SNAPSHOT_BYTES: u64 = 1 << 20;

/// The record a state was taken after, and where it is in the log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Mark {
    /// Its checkpoint.
    pub seq: u64,
    /// `xxh3_64` of its frame as encoded.
    pub hash: u64,
    /// The segment holding it, and that segment's inode.
    pub segment: u64,
    pub ino: u64,
    /// Where its frame starts in the segment.
    pub frame_at: u64,
}

#[derive(Deserialize)]
struct Snapshot {
    mark: Mark,
    state: State,
}

/// [`Snapshot`] as written, borrowing what it holds.
#[derive(Serialize)]
struct SnapshotOf<'a> {
    mark: &'a Mark,
    state: &'a State,
}

/// The frame of `record` as the log holds it, and its hash.
pub(crate) fn frame_of(record: &Record) -> (u64, u64) {
    let frame = match &record.blob {
        Some(blob) => {
            let mut bare = record.event.clone();
            bare.remove(kn_journal::KN_PAYLOAD);
            kn_journal::internal::logs::encode_event(record.seq, record.stored_secs, &bare, Some(blob))
        }
        None => kn_journal::internal::logs::encode_event(record.seq, record.stored_secs, &record.event, None),
    };
    (frame.len() as u64, xxhash_rust::xxh3::xxh3_64(&frame))
}

/// The snapshot in `dir`, if there is a readable one (not yet checked
/// against the log: see [`Mark`]).
pub(crate) fn load(dir: &Path) -> Option<(Mark, State)> {
    let bytes = fs::read(dir.join(SNAPSHOT_FILE)).ok()?;
    if bytes.len() < HEADER || &bytes[..8] != MAGIC {
        return None;
    }
    let crc = u32::from_le_bytes(bytes[8..12].try_into().ok()?);
    let len = u32::from_le_bytes(bytes[12..16].try_into().ok()?) as usize;
    let body = bytes.get(HEADER..HEADER + len)?;
    if kn_journal::internal::logs::crc32c(&[body]) != crc {
        return None;
    }
    let snapshot: Snapshot = rmp_serde::from_slice(body).ok()?;
    Some((snapshot.mark, snapshot.state))
}

/// Writes the snapshot of `state` after `mark` (the caller holds the
/// stream's lock): aside, in `.state.tmp`, then exchanged with `.state`
/// in one step (`renameat2(RENAME_EXCHANGE)`), so that the previous
/// snapshot's file becomes the next one's temporary; with `sync`, synced
/// first. No inode is made or freed after the first two: creating the
/// temporary afresh for every rename cost about 7 % of an append's CPU in
/// `serve` (ext4's inode allocation). A reader that opened `.state` just
/// before the exchange and still reads it two snapshots later finds a CRC
/// that does not match, or a record the log does not hold at that place,
/// and replays the log instead (FORMAT.md, "The snapshot"). Where the
/// exchange is not supported (or there is no `.state` yet), a plain
/// rename. A failure only means a longer replay later.
pub(crate) fn store(dir: &Path, mark: &Mark, state: &State, sync: bool) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let body = rmp_serde::to_vec_named(&SnapshotOf { mark, state }).map_err(std::io::Error::other)?;
    let mut bytes = Vec::with_capacity(HEADER + body.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&kn_journal::internal::logs::crc32c(&[&body]).to_le_bytes());
    bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&body);
    let tmp = dir.join(TEMP_FILE);
    let f = kn_journal::internal::logs::open_shared(&tmp, false)?;
    f.write_all_at(&bytes, 0)?;
    f.set_len(bytes.len() as u64)?;
    if sync {
        f.sync_data()?;
    }
    drop(f);
    let path = dir.join(SNAPSHOT_FILE);
    match exchange(&tmp, &path) {
        Ok(()) => Ok(()),
        Err(_) => fs::rename(&tmp, &path),
    }
}

/// Swaps the names `a` and `b` in one step (both must exist, on a file
/// system that can: ext4, XFS, Btrfs, tmpfs).
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let a = CString::new(a.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    let b = CString::new(b.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // The system call itself: older C libraries (musl before 1.2.4) have
    // no wrapper. SAFETY: two NUL-terminated paths that live across it.
    let r = unsafe { libc::syscall(libc::SYS_renameat2, libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), libc::RENAME_EXCHANGE) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Removes a snapshot found not to match the log (best effort: a reader
/// may remove a good one written meanwhile, which costs a replay).
pub(crate) fn discard(dir: &Path) {
    let _ = fs::remove_file(dir.join(SNAPSHOT_FILE));
}

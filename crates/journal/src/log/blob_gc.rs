//! The sweep's pass over `.blobs/`: a blob that nothing links any more
//! (one link left, its own) is removed once its last link change is older
//! than `Config::blob_grace`, and so is a temporary left by a writer that
//! died (FORMAT.md, "Blobs", "Orphan blobs").
//!
//! Why this is safe against writers, with no lock shared with them: a
//! writer first makes sure `.blobs/<hash>` exists (storing it if not),
//! then hard-links it into its topic or stream, then writes the record
//! that refers to it. The pass removes an entry only when `lstat` shows
//! one link and a `ctime` older than the grace (`link` and `unlink` set
//! `ctime`, so a blob just stored or just unlinked from somewhere is
//! young). Whatever the order of the pass's `unlink` and a writer's
//! `link`:
//!
//! * the writer's `link` came first: its link is a name of the same
//!   inode, so the data stays however the pass removes `.blobs/<hash>`
//!   (only the meeting point of later writers is gone: the next one
//!   stores the payload afresh);
//! * the pass's `unlink` came first: the writer's `link` fails with
//!   `ENOENT`, and it stores the blob again and links that (the retry in
//!   `Writer::link_blob`).
//!
//! So no writer ever writes a record whose blob is missing. The grace
//! only keeps the pass from making a writer store a payload twice.
//!
//! A pass looks at a bounded number of entries, after the name where the
//! last pass stopped (`.sweep-blobs` in the store root), and runs at most
//! once per `every`: the listing of `.blobs/` is the one cost that grows
//! with the store.

use std::fs;
use std::io::ErrorKind as IoKind;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};

use super::blob::BLOBS_DIR;

/// In the store root: the name of `.blobs/` the last bounded pass looked
/// at last (the next one starts after it); its modification time is when
/// that pass ran.
pub(crate) const CURSOR_FILE: &str = ".sweep-blobs";

/// What a pass over `.blobs/` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct BlobSweep {
    /// Entries looked at (one `lstat` each).
    pub looked: usize,
    /// Orphan blobs and stale temporaries removed.
    pub removed: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// Removes the orphan blobs and stale temporaries of `root`'s `.blobs/`
/// older than `grace`. `limit`: at most that many entries, after where the
/// last such pass stopped, and nothing when one ran less than `every` ago
/// (the caller holds the sweep's lock); `None`: every entry (`kn gc`).
pub(crate) fn sweep_orphan_blobs(root: &Path, grace: Duration, limit: Option<usize>, every: Duration) -> Result<BlobSweep> {
    let cursor_path = root.join(CURSOR_FILE);
    if limit.is_some() {
        let ran = fs::metadata(&cursor_path).and_then(|m| m.modified()).ok();
        if ran.and_then(|t| t.elapsed().ok()).is_some_and(|age| age < every) {
            return Ok(BlobSweep::default());
        }
    }
    let dir = root.join(BLOBS_DIR);
    let mut names: Vec<String> = match fs::read_dir(&dir) {
        Ok(entries) => entries.filter_map(|e| e.ok()).filter_map(|e| e.file_name().into_string().ok()).collect(),
        Err(e) if e.kind() == IoKind::NotFound => Vec::new(),
        Err(e) => return Err(Error::io("cannot list blob directory", &dir, e)),
    };
    names.sort_unstable();
    let (start, take) = match limit {
        Some(n) => {
            let after = fs::read_to_string(&cursor_path).unwrap_or_default();
            (names.partition_point(|n| n.as_str() <= after.trim()), n.max(1))
        }
        None => (0, usize::MAX),
    };
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    let grace_secs = i64::try_from(grace.as_secs()).unwrap_or(i64::MAX);
    let mut report = BlobSweep::default();
    let mut last = String::new();
    for name in names.iter().skip(start).take(take) {
        report.looked += 1;
        last.clone_from(name);
        let path = dir.join(name);
        let Ok(m) = fs::symlink_metadata(&path) else { continue };
        let orphan = if name.starts_with(".tmp-") {
            // A writer's temporary: written and renamed in one go.
            now.saturating_sub(m.mtime()) >= grace_secs.max(60)
        } else {
            is_blob_name(name) && m.is_file() && m.nlink() == 1 && now.saturating_sub(m.ctime()) >= grace_secs
        };
        if orphan && fs::remove_file(&path).is_ok() {
            report.removed += 1;
            report.bytes += m.len();
        }
    }
    if limit.is_some() && dir.is_dir() {
        // Past the last name: the next pass starts again at the first.
        let next = if start + report.looked >= names.len() { String::new() } else { last };
        write_cursor(&cursor_path, &next);
    }
    Ok(report)
}

/// Writes a pass's cursor file (`name`, where the next pass starts after),
/// group-writable like every file of the store; the write sets its
/// modification time, which paces the passes. Best effort: a cursor lost
/// only makes the next pass start elsewhere.
pub fn write_cursor(path: &Path, name: &str) {
    use std::io::Write as _;
    if let Ok(mut f) = super::open_shared(path, false) {
        let _ = f.set_len(0).and_then(|_| f.write_all(format!("{name}\n").as_bytes()));
    }
}

/// True for the name of a stored blob: its hash, 32 lowercase hex digits.
fn is_blob_name(name: &str) -> bool {
    name.len() == 32 && name.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

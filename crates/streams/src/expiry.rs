//! Expired streams that nobody reads: removed by the store's sweep.
//!
//! A stream past its `Stream-TTL` or `Stream-Expires-At` is removed by the
//! first request that finds it so (`Streams::live`). One that no request
//! touches again would stay on disk for ever; so every [`Streams`]
//! registers this pass with its store ([`Store::set_extra_sweep`]), and
//! each sweep slice (pubsub.cgi after a response, `serve` in the
//! background) runs it after the topics.
//!
//! A pass is bounded and incremental: it runs at most once per
//! `PASS_EVERY` slices' interval, lists `.streams/` (names only) and looks
//! at no more than `STREAMS_PER_BUDGET` × the slice's budget streams,
//! after the one where the last pass stopped (`.streams/.sweep`); the
//! next pass goes on from there and wraps around. A look reads the
//! stream's snapshot and the records after it (what any process new to
//! the stream reads), and an expired stream is removed through the very
//! path a request takes (under its lock, counted out of its fork source,
//! its blobs released). Leftovers of a removal that a crash interrupted
//! (`.gone-*`) are deleted too.

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::{Entry, StreamErrorKind, Streams};
use kn_journal::Store;

/// In `.streams/`: the name of the stream directory the last bounded pass
/// looked at last.
const CURSOR_FILE: &str = ".sweep";

/// Streams one pass looks at, per unit of the slice's budget.
const STREAMS_PER_BUDGET: usize = 16;

/// A bounded pass runs at most once per this many sweep intervals.
const PASS_EVERY: u32 = 16;

/// How old a `.gone-*` leftover must be before a pass deletes it (a
/// removal running now deletes its own within milliseconds).
const LEFTOVER_AGE: Duration = Duration::from_secs(60);

/// Makes `store`'s sweep remove expired streams too (what
/// [`Streams::new`] does), for a process that sweeps without serving
/// streams (pubsub.cgi after a `/kn` request). Once per store; later
/// calls do nothing. The pass holds the store weakly: it never keeps it
/// alive.
pub fn register(store: &Arc<Store>) {
    let weak = Arc::downgrade(store);
    store.set_extra_sweep(Box::new(move |budget| match weak.upgrade() {
        Some(store) => Streams::unregistered(store).sweep_expired(budget).bytes,
        None => 0,
    }));
}

/// What a pass over the streams did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpirySweep {
    /// Stream directories looked at.
    pub looked: usize,
    /// Expired streams removed (and `.gone-*` leftovers deleted).
    pub removed: u64,
    /// Bytes of their files.
    pub bytes: u64,
}

impl Streams {
    /// Removes expired streams that no request touched: with `budget`, a
    /// bounded pass (at most `16 × budget` streams, after where the last
    /// one stopped; nothing if one ran recently), as a sweep slice makes
    /// it; with `None`, every stream. Errors of one stream pass it by.
    pub fn sweep_expired(&self, budget: Option<usize>) -> ExpirySweep {
        let mut report = ExpirySweep::default();
        let cursor_path = self.dir.join(CURSOR_FILE);
        if budget.is_some() {
            let every = self.config().sweep_interval.saturating_mul(PASS_EVERY);
            let ran = fs::metadata(&cursor_path).and_then(|m| m.modified()).ok();
            if ran.and_then(|t| t.elapsed().ok()).is_some_and(|age| age < every) {
                return report;
            }
        }
        let Ok(listing) = fs::read_dir(&self.dir) else { return report };
        let mut names: Vec<String> = listing.filter_map(|e| e.ok()).filter_map(|e| e.file_name().into_string().ok()).collect();
        names.sort_unstable();
        let (start, take) = match budget {
            Some(b) => {
                let after = fs::read_to_string(&cursor_path).unwrap_or_default();
                (names.partition_point(|n| n.as_str() <= after.trim()), b.max(1).saturating_mul(STREAMS_PER_BUDGET))
            }
            None => (0, usize::MAX),
        };
        let mut last = String::new();
        for name in names.iter().skip(start).take(take) {
            report.looked += 1;
            last.clone_from(name);
            let dir = self.dir.join(name);
            if name.starts_with(".gone-") {
                if age(&dir).is_some_and(|a| a >= LEFTOVER_AGE) {
                    report.bytes += size_of(&dir);
                    super::release(&self.config().root, &dir);
                    report.removed += 1;
                }
            } else if !name.starts_with('.') {
                let bytes = size_of(&dir);
                if self.expire_if_due(&dir) {
                    report.removed += 1;
                    report.bytes += bytes;
                }
            }
        }
        if budget.is_some() {
            let next = if start + report.looked >= names.len() { String::new() } else { last };
            if self.dir.is_dir() {
                kn_journal::internal::logs::write_cursor(&cursor_path, &next);
            }
        }
        report
    }

    /// Looks at the stream in `dir` and removes it if it expired: true
    /// when it did.
    fn expire_if_due(&self, dir: &Path) -> bool {
        let mut entry = Entry { dir: dir.to_owned(), ..Entry::default() };
        if self.refresh(&mut entry).is_err() || !entry.state.exists || entry.state.soft_deleted {
            return false;
        }
        if entry.state.ttl.is_none() && entry.state.expires_at.is_none() || !self.expired(&entry) {
            return false;
        }
        // Through the path a request takes: under the stream's lock, the
        // expiry checked again there, the fork source counted.
        let path = entry.state.path.clone();
        if self.stream_dir(&path) != dir {
            return false;
        }
        matches!(self.head(&path), Err(e) if e.kind() == StreamErrorKind::NotFound)
    }
}

/// How long ago `path` was last modified.
fn age(path: &Path) -> Option<Duration> {
    fs::symlink_metadata(path).and_then(|m| m.modified()).ok()?.elapsed().ok()
}

/// The bytes of the files directly in `dir` (a stream's: no
/// subdirectories).
fn size_of(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else { return 0 };
    entries.filter_map(|e| e.ok()).filter_map(|e| e.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).sum()
}

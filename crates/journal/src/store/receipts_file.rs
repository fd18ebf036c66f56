//! A journal's `.receipts` (FORMAT.md, "Receipts"): what its clients
//! were sent and confirmed, and the tracker through which a tunnel
//! records what it sent. Knows nothing of routes: the tunnel's side
//! (`read.rs`) and the receipts' (`receipts.rs`) both stand on it.

use std::fs::{self, File};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::ids::fresh_id;
use crate::log;
use crate::shared::LockKind;
use crate::topic::Topic;

use super::Store;

/// In a journal's directory: what its clients were sent and confirmed.
pub(super) const RECEIPTS_FILE: &str = ".receipts";

const MAGIC: &str = "KNr1";

/// Most separate ranges of sent checkpoints a journal's `.receipts`
/// keeps (the newest; adjacent and overlapping ones are merged): bounds
/// the file whatever the number of tunnels a journal had.
const MAX_RANGES: usize = 64;

/// What a journal's clients were sent and confirmed (its `.receipts`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct JournalReceipts {
    /// Every event at or before this checkpoint was confirmed (0: none).
    pub(crate) confirmed: u64,
    /// Ranges of checkpoints `[lo, hi]` that live tunnels sent, oldest
    /// first, neither overlapping nor adjacent.
    pub(crate) sent: Vec<(u64, u64)>,
}

impl JournalReceipts {
    fn parse(text: &str) -> JournalReceipts {
        let mut lines = text.lines();
        let mut receipts = JournalReceipts::default();
        if lines.next() != Some(MAGIC) {
            return receipts;
        }
        for line in lines {
            let mut words = line.split_ascii_whitespace();
            match words.next() {
                Some("confirmed") => {
                    receipts.confirmed = words.next().and_then(|w| w.parse().ok()).unwrap_or(0)
                }
                Some("sent") => {
                    receipts.sent = words
                        .filter_map(|w| {
                            let (lo, hi) = w.split_once('-')?;
                            Some((lo.parse().ok()?, hi.parse().ok()?))
                        })
                        .filter(|(lo, hi)| lo <= hi)
                        .collect();
                }
                _ => {}
            }
        }
        receipts
    }

    fn encode(&self) -> String {
        let mut text = format!("{MAGIC}\nconfirmed {}\nsent", self.confirmed);
        for (lo, hi) in &self.sent {
            text.push_str(&format!(" {lo}-{hi}"));
        }
        text.push('\n');
        text
    }

    /// Adds the range `[lo, hi]` (nothing when `lo > hi`), merged with
    /// those it touches; keeps the newest [`MAX_RANGES`].
    pub(crate) fn add_sent(&mut self, lo: u64, hi: u64) {
        if lo > hi {
            return;
        }
        self.sent.push((lo, hi));
        self.sent.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(self.sent.len());
        for &(lo, hi) in &self.sent {
            match merged.last_mut() {
                Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        let excess = merged.len().saturating_sub(MAX_RANGES);
        merged.drain(..excess);
        self.sent = merged;
    }

    /// True when a live tunnel sent checkpoint `seq`.
    pub(crate) fn was_sent(&self, seq: u64) -> bool {
        self.sent.iter().any(|&(lo, hi)| lo <= seq && seq <= hi)
    }
}

impl Store {
    /// The sent-position tracker of a new tunnel on `topic` (a journal),
    /// whose initial events start at `first` and whose cursor is at `end`.
    pub(super) fn sent_tracker(
        &self,
        topic: &Topic,
        dir: &Path,
        first: Option<u64>,
        end: u64,
    ) -> Option<SentTracker> {
        if !topic.is_journal() {
            return None;
        }
        let lo = first.unwrap_or(end + 1).min(end + 1);
        Some(SentTracker {
            dir: dir.to_path_buf(),
            config: Arc::clone(self.shared_config.get_or_init(|| Arc::new(self.config.clone()))),
            lo,
            hi: end,
            written: (lo > end).then_some(end),
            // The first write waits an interval too: a thousand tunnels
            // given their first event at once write nothing then (the
            // cold fan-out of BENCHMARKS.md), and a tunnel that ends
            // sooner writes once, at its end.
            last_write: Some(Instant::now()),
        })
    }
}

/// The `.receipts` of the journal in `dir` (empty when missing or not
/// readable): no lock, a whole file.
pub(crate) fn read_receipts(dir: &Path) -> JournalReceipts {
    fs::read_to_string(dir.join(RECEIPTS_FILE))
        .map(|t| JournalReceipts::parse(&t))
        .unwrap_or_default()
}

/// Changes the `.receipts` of the journal in `dir` with `change`, under
/// the file's lock: waiting for it when `wait`, else tried once
/// (`Ok(false)` when busy). The new file replaces the old by `rename`.
pub(crate) fn update_receipts(
    dir: &Path,
    config: &Config,
    wait: bool,
    change: impl FnOnce(&mut JournalReceipts),
) -> Result<bool> {
    let path = dir.join(RECEIPTS_FILE);
    for _ in 0..5 {
        let file =
            log::open_shared(&path, false).map_err(|e| Error::io("cannot open", &path, e))?;
        if wait {
            crate::shared::lock(&file, LockKind::Exclusive, config)
                .map_err(|e| Error::io("cannot lock", &path, e))?;
        } else if !crate::shared::try_lock(&file, LockKind::Exclusive, config)
            .map_err(|e| Error::io("cannot lock", &path, e))?
        {
            return Ok(false);
        }
        if !same_file(&file, &path) {
            // Replaced while we waited: lock the new one.
            crate::shared::unlock(&file, config);
            continue;
        }
        let mut receipts = fs::read_to_string(&path)
            .map(|t| JournalReceipts::parse(&t))
            .unwrap_or_default();
        change(&mut receipts);
        let result = replace(dir, &path, receipts.encode().as_bytes());
        crate::shared::unlock(&file, config);
        return result.map(|()| true);
    }
    Err(Error::new(
        ErrorKind::Io,
        format!(
            "cannot update '{}': replaced 5 times in a row",
            path.display()
        ),
    ))
}

fn replace(dir: &Path, path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp: PathBuf = dir.join(format!(
        "{RECEIPTS_FILE}.tmp-{}-{}",
        std::process::id(),
        fresh_id()
    ));
    log::write_replacing(&tmp, path, bytes).map_err(|e| Error::io("cannot write", path, e))
}

fn same_file(file: &File, path: &Path) -> bool {
    match (file.metadata(), fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// What a tunnel on a journal has sent, written to its `.receipts` at
/// most once per `receipts_flush` (tried, never waited for: a busy file
/// is written at the next chance) and when the tunnel ends.
pub(crate) struct SentTracker {
    dir: PathBuf,
    config: Arc<Config>,
    /// The first checkpoint this tunnel sent (its initial events' first,
    /// else the first after its start).
    lo: u64,
    /// The last checkpoint it sent.
    hi: u64,
    /// The `hi` last written.
    written: Option<u64>,
    /// When it last wrote (at first, when the tunnel started).
    last_write: Option<Instant>,
}

impl SentTracker {
    /// The tunnel has handed everything up to `hi` to its client.
    pub(crate) fn sent_up_to(&mut self, hi: u64) {
        self.hi = self.hi.max(hi);
        let due = self
            .last_write
            .is_none_or(|at| at.elapsed() >= self.config.receipts_flush);
        if due {
            self.flush();
        }
    }

    /// Writes what is not yet written (tried once).
    pub(crate) fn flush(&mut self) {
        if self.lo > self.hi || self.written == Some(self.hi) {
            return;
        }
        let (lo, hi) = (self.lo, self.hi);
        if let Ok(true) = update_receipts(&self.dir, &self.config, false, |r| r.add_sent(lo, hi)) {
            self.written = Some(hi);
            self.last_write = Some(Instant::now());
        }
    }
}

impl Drop for SentTracker {
    fn drop(&mut self) {
        self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_and_stay_bounded() {
        let mut r = JournalReceipts::default();
        r.add_sent(5, 9);
        r.add_sent(10, 12);
        r.add_sent(1, 2);
        r.add_sent(7, 8);
        assert_eq!(r.sent, vec![(1, 2), (5, 12)]);
        assert!(r.was_sent(12) && !r.was_sent(3) && !r.was_sent(13));
        for i in 0..200u64 {
            r.add_sent(100 + 3 * i, 100 + 3 * i);
        }
        assert_eq!(r.sent.len(), MAX_RANGES);
        assert!(r.was_sent(100 + 3 * 199));
        let back = JournalReceipts::parse(&r.encode());
        assert_eq!(back, r);
        assert_eq!(
            JournalReceipts::parse("garbage"),
            JournalReceipts::default()
        );
    }
}

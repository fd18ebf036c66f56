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
use crate::log;
use crate::shared::LockKind;
use crate::topic::Topic;

use super::Store;

/// In a journal's directory: what its clients were sent and confirmed.
pub(super) const RECEIPTS_FILE: &str = ".receipts";

const MAGIC: &str = "KNr1";

/// The last line of a version written in place: `end` and the CRC-32C
/// of the text before it, in hex. What follows it (the tail of a longer
/// version before, until the file is cut to length) is not read.
const END: &str = "end";

/// The text of one whole version in `text`: up to its `end` line, whose
/// checksum must match (else `None`: a write the machine's crash tore
/// reads as nothing sent or confirmed); a text without an `end` line (as
/// versions before it wrote, by rename) is taken whole.
fn whole(text: &str) -> Option<&str> {
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        if let Some(crc) = line.strip_prefix(END).and_then(|rest| rest.strip_prefix(' ')) {
            let body = &text[..at];
            let crc = u32::from_str_radix(crc.trim_end(), 16).ok()?;
            return (crate::record::crc32c(&[body.as_bytes()]) == crc).then_some(body);
        }
        at += line.len();
    }
    Some(text)
}

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
        let mut receipts = JournalReceipts::default();
        let Some(text) = whole(text) else { return receipts };
        let mut lines = text.lines();
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

    /// The file's text: the lines, then `end <crc>` (see [`whole`]).
    fn encode(&self) -> String {
        let mut text = format!("{MAGIC}\nconfirmed {}\nsent", self.confirmed);
        for (lo, hi) in &self.sent {
            text.push_str(&format!(" {lo}-{hi}"));
        }
        text.push('\n');
        let crc = crate::record::crc32c(&[text.as_bytes()]);
        text.push_str(&format!("{END} {crc:08x}\n"));
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
/// readable), read under a shared lock: a writer rewrites it in place
/// under an exclusive one (see [`update_receipts`]).
pub(crate) fn read_receipts(dir: &Path, config: &Config) -> JournalReceipts {
    let Ok(file) = File::open(dir.join(RECEIPTS_FILE)) else { return JournalReceipts::default() };
    if crate::shared::lock(&file, LockKind::Shared, config).is_err() {
        return JournalReceipts::default();
    }
    let text = read_text(&file);
    crate::shared::unlock(&file, config);
    JournalReceipts::parse(&text)
}

/// The whole text of an open `.receipts` (empty when not readable).
fn read_text(file: &File) -> String {
    std::io::read_to_string(file).unwrap_or_default()
}

/// Changes the `.receipts` of the journal in `dir` with `change`, under
/// the file's lock: waiting for it when `wait`, else tried once
/// (`Ok(false)` when busy). The new version is written over the old in
/// place, ending with its `end` line, and the file cut to its length:
/// no inode is made per write (a temporary renamed over it, as before,
/// cost about half a millisecond of ext4's inode allocation per write,
/// one per tunnel ending: FORMAT.md, "Receipts"). A file another
/// process replaced while this one waited for its lock is locked again
/// by its name (processes of versions that still rename).
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
        let mut receipts = JournalReceipts::parse(&read_text(&file));
        change(&mut receipts);
        let result = rewrite(&file, receipts.encode().as_bytes()).map_err(|e| Error::io("cannot write", &path, e));
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

/// Writes `bytes` over the start of `file` (whose lock the caller holds)
/// and cuts it to their length. A process killed between the two leaves
/// the tail of the version before after the new `end` line, unread.
fn rewrite(file: &File, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    file.write_all_at(bytes, 0)?;
    file.set_len(bytes.len() as u64)
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

    #[test]
    fn a_version_is_read_up_to_its_end_line_and_only_if_whole() {
        let mut r = JournalReceipts { confirmed: 7, sent: vec![(1, 9)] };
        let text = r.encode();
        assert!(text.ends_with('\n') && text.lines().last().unwrap().starts_with("end "));
        // The tail of a longer version before, not yet cut off.
        assert_eq!(JournalReceipts::parse(&format!("{text}sent 1-99999 100-200\nend 0000\n")), r);
        // A torn write: the checksum does not match.
        assert_eq!(JournalReceipts::parse(&text.replace("confirmed 7", "confirmed 8")), JournalReceipts::default());
        // Written by a version before (renamed into place, no end line).
        assert_eq!(JournalReceipts::parse("KNr1\nconfirmed 7\nsent 1-9\n"), r);
        r.sent.clear();
        assert_eq!(JournalReceipts::parse(&r.encode()), r);
    }

    #[test]
    fn writes_keep_one_file() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::new(dir.path());
        let path = dir.path().join(RECEIPTS_FILE);
        let mut inodes = std::collections::BTreeSet::new();
        for n in (1..=6u64).rev() {
            // Shorter each time: the file is cut to each version's length.
            assert!(update_receipts(dir.path(), &config, true, |r| {
                r.confirmed = n;
                r.sent = (0..n).map(|i| (10 * i, 10 * i + 1)).collect();
            })
            .unwrap());
            inodes.insert(fs::metadata(&path).unwrap().ino());
            let text = fs::read_to_string(&path).unwrap();
            assert_eq!(text.matches("end ").count(), 1, "{text}");
            assert_eq!(read_receipts(dir.path(), &config).confirmed, n);
        }
        // Rewritten in place: no inode made per write, no temporary.
        assert_eq!(inodes.len(), 1);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn readers_see_whole_versions_while_writers_write() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::new(dir.path());
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let writers: Vec<_> = (0..2u64)
                .map(|w| {
                    let (dir, config) = (dir.path(), &config);
                    s.spawn(move || {
                        for n in 0..300u64 {
                            update_receipts(dir, config, true, |r| {
                                r.confirmed = r.confirmed.max(n);
                                // Versions of different lengths.
                                if n % 7 == 0 {
                                    r.sent.clear();
                                }
                                r.add_sent(10 * n + w * 5_000_000, 10 * n + w * 5_000_000 + 3);
                            })
                            .unwrap();
                        }
                    })
                })
                .collect();
            for _ in 0..2 {
                let (dir, config, done) = (dir.path(), &config, &done);
                s.spawn(move || {
                    let mut last = 0;
                    while !done.load(std::sync::atomic::Ordering::Relaxed) {
                        let now = read_receipts(dir, config);
                        assert!(now.confirmed >= last, "went back from {last} to {}", now.confirmed);
                        assert!(last == 0 || !now.sent.is_empty(), "a version without its ranges");
                        last = now.confirmed;
                    }
                });
            }
            for w in writers {
                w.join().unwrap();
            }
            done.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        assert_eq!(read_receipts(dir.path(), &config).confirmed, 299);
    }
}

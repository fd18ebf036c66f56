//! Topic lifecycle: the topic list, compaction, verify and repair, journal
//! heartbeats (stale, refreshed, expired), and the write probe of the
//! self-test.

use std::fs;
use std::io::ErrorKind as IoKind;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use crate::error::{Error, ErrorKind, Result};
use crate::event::{Event, KN_ID, KN_PAYLOAD};
use crate::ids::{fresh_id, now};
use crate::log::{self, Appended, CompactReport, Writer};
use crate::topic::Topic;

use super::{create_topic_dir, HEARTBEAT_FILE, Kept, Store};

/// The name prefix of the probe directories of [`Store::probe`]: hidden,
/// so no topic can be named so (a topic segment never starts with `.`)
/// and the topic list skips it.
pub const PROBE_PREFIX: &str = ".probe-";

impl Store {
    /// Every topic of the store, sorted (the tree, walked with `walkdir`).
    pub fn topics(&self) -> Result<Vec<Topic>> {
        let root = &self.config.root;
        let mut out = Vec::new();
        for entry in walkdir::WalkDir::new(root).min_depth(1).follow_links(false).into_iter().filter_entry(|e| {
            !e.file_name().to_string_lossy().starts_with('.')
        }) {
            let entry = match entry {
                Ok(entry) => entry,
                // Removed by the sweep (or by hand) during the walk.
                Err(e) if e.io_error().is_some_and(|e| e.kind() == IoKind::NotFound) => continue,
                Err(e) => return Err(Error::new(ErrorKind::Io, format!("cannot walk '{}': {e}", root.display()))),
            };
            if !entry.file_type().is_dir() {
                continue;
            }
            let rel = entry.path().strip_prefix(root).unwrap_or(entry.path());
            if let Ok(t) = Topic::parse(&rel.to_string_lossy()) {
                out.push(t);
            }
        }
        out.sort();
        Ok(out)
    }

    /// Rewrites `topic`'s sealed segments without superseded records and
    /// events expired longer than `expired_grace`; on a journal also applies
    /// retention. Safe while others read and post.
    pub fn compact(&self, topic: &Topic) -> Result<CompactReport> {
        let dir = self.dir(topic);
        if !dir.is_dir() {
            return Err(Error::new(ErrorKind::BadTopic, format!("no topic '{topic}' in the store")));
        }
        let mut writer = match Writer::open(&dir, &self.config, !topic.is_journal()) {
            Ok(writer) => writer,
            // Removed by the sweep meanwhile: nothing left to compact.
            Err(e) if e.kind() == ErrorKind::Expired || !dir.is_dir() => return Ok(CompactReport::default()),
            Err(e) => return Err(e),
        };
        if topic.is_journal() {
            writer.apply_retention()?;
        }
        writer.compact(now())
    }

    /// Checks every record of every topic: the count of valid records
    /// (those after a bad frame included) and each bad frame, with its
    /// segment and offset; blobs missing or damaged, blob links no record
    /// refers to and blobs no topic links (FORMAT.md, "Blobs"). A post
    /// running meanwhile may show as an unreferenced link for a moment.
    pub fn verify(&self) -> Result<VerifyReport> {
        let mut report = VerifyReport::default();
        let mut dirs = vec![self.config.root.clone()];
        dirs.extend(self.topics()?.iter().map(|t| self.dir(t)));
        for dir in dirs {
            let (good, bad) = log::verify_dir(&dir)?;
            report.records += good;
            report.problems.extend(bad.into_iter().map(|b| VerifyProblem {
                reason: problem_reason(&b),
                path: b.path,
                offset: b.damage.offset,
            }));
        }
        for (path, reason) in log::orphan_blobs(&self.config.root)? {
            report.problems.push(VerifyProblem { path, offset: 0, reason });
        }
        Ok(report)
    }

    /// Truncates the torn tail of every topic (what the next writer would
    /// do), unlinks blob links no record refers to and blobs no topic
    /// links, making `verify` clean after a crash. Damaged records followed
    /// by valid ones, and corrupt tails, are kept and stay reported.
    /// Returns how many topics (and the blob directory) it touched.
    pub fn repair(&self) -> Result<usize> {
        let mut touched = 0;
        for t in std::iter::once(Topic::root()).chain(self.topics()?) {
            let dir = self.dir(&t);
            let (_, bad) = log::verify_dir(&dir)?;
            // Torn tails and blob problems are repaired; damaged records
            // followed by valid ones are kept (FORMAT.md).
            if !bad.iter().any(|b| b.tail || !b.path.file_name().is_some_and(log::is_segment_file)) {
                continue;
            }
            let writer = Writer::open(&dir, &self.config, !t.is_journal())?;
            writer.drop_orphan_links()?;
            touched += 1;
        }
        if log::sweep_blobs(&self.config.root)? > 0 {
            touched += 1;
        }
        Ok(touched)
    }

    /// True when `journal` has no heartbeat or one older than
    /// `heartbeat_stale` (100 s). Ordinary topics are never stale.
    pub fn is_stale(&self, journal: &Topic) -> bool {
        if !journal.is_journal() {
            return false;
        }
        let path = self.dir(journal).join(HEARTBEAT_FILE);
        match fs::metadata(&path).and_then(|m| m.modified()) {
            Ok(t) => SystemTime::now().duration_since(t).unwrap_or(Duration::ZERO) > self.config.heartbeat_stale,
            Err(_) => true,
        }
    }

    /// [`Store::is_stale`], through the heartbeat in `kept` (opened and
    /// kept there when this process writes to the journal): an `fstat`
    /// instead of a path lookup. A heartbeat deleted since (expired, or
    /// replaced) is unlinked: the path decides then.
    pub(super) fn journal_stale(&self, journal: &Topic, kept: &mut Kept) -> bool {
        if kept.files.is_none() {
            return self.is_stale(journal);
        }
        let linked = |f: &fs::File| f.metadata().ok().filter(|m| m.nlink() > 0);
        let meta = match kept.heartbeat.as_ref().and_then(linked) {
            Some(meta) => meta,
            None => match fs::File::open(self.dir(journal).join(HEARTBEAT_FILE)) {
                Ok(f) => {
                    let meta = linked(&f);
                    kept.heartbeat = Some(f);
                    match meta {
                        Some(meta) => meta,
                        None => return true,
                    }
                }
                Err(_) => {
                    kept.heartbeat = None;
                    return self.is_stale(journal);
                }
            },
        };
        match meta.modified() {
            Ok(t) => SystemTime::now().duration_since(t).unwrap_or(Duration::ZERO) > self.config.heartbeat_stale,
            Err(_) => true,
        }
    }

    /// Refreshes `journal`'s heartbeat (a tunnel reading it does so).
    pub fn heartbeat(&self, journal: &Topic) -> Result<()> {
        self.beat(journal).map(drop)
    }

    /// [`Store::heartbeat`], returning the heartbeat file, open.
    pub(super) fn beat(&self, journal: &Topic) -> Result<fs::File> {
        let path = self.checked_dir(journal)?.join(HEARTBEAT_FILE);
        let beat = || -> std::io::Result<fs::File> {
            let f = log::open_shared(&path, false)?;
            // A write sets the modification time to now with write
            // permission alone; setting a time explicitly (utimensat with a
            // value) is allowed only to the file's owner, and the web server
            // and sensors of one group are different users.
            std::os::unix::fs::FileExt::write_all_at(&f, b"\n", 0)?;
            Ok(f)
        };
        beat().map_err(|e| Error::io("cannot refresh heartbeat", &path, e))
    }

    /// Makes `journal` stale at once (a tunnel's `kn_expires` passed).
    pub fn expire(&self, journal: &Topic) -> Result<()> {
        let path = self.checked_dir(journal)?.join(HEARTBEAT_FILE);
        match fs::remove_file(&path) {
            Ok(()) => {
                // Stale now: due for the sweep after its grace.
                self.queue_journal(journal, Duration::ZERO);
                Ok(())
            }
            Err(e) if e.kind() == IoKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("cannot expire heartbeat", &path, e)),
        }
    }
}

/// How `kn verify` describes a bad frame.
fn problem_reason(bad: &log::BadFrame) -> String {
    let why = match &bad.damage.stop {
        log::Stop::Incomplete => "incomplete record".to_string(),
        log::Stop::Zeroed => "zeroed bytes".to_string(),
        log::Stop::Corrupt(why) => why.clone(),
    };
    if !bad.tail {
        return format!("damaged record ({why}); {} bytes skipped to the next valid record", bad.damage.len);
    }
    match bad.damage.stop {
        log::Stop::Incomplete | log::Stop::Zeroed => format!("{why} (torn tail)"),
        log::Stop::Corrupt(_) => format!("damaged record ({why}); no valid record after it in this segment"),
    }
}

impl Store {
    /// Proves that this process can post to the store, with the journal's
    /// own writer: in a fresh hidden directory of the store root (never a
    /// topic, see `PROBE_PREFIX`) it stores one event, reads it back, and
    /// removes the directory again, whatever happened. The error names
    /// the step that failed (permissions, the free-space reserve, a read
    /// that does not give back what was written).
    pub fn probe(&self) -> Result<()> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = self.config.root.join(format!("{PROBE_PREFIX}{}-{n}", std::process::id()));
        let result = self.probe_in(&dir);
        let removed = match fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != IoKind::NotFound => Err(Error::io("cannot remove the probe directory", &dir, e)),
            _ => Ok(()),
        };
        result.and(removed)
    }

    fn probe_in(&self, dir: &std::path::Path) -> Result<()> {
        create_topic_dir(dir).map_err(|e| Error::io("cannot create a directory in the store", dir, e))?;
        let mut event = Event::new();
        event.set(KN_ID, fresh_id()).set(KN_PAYLOAD, &b"self-test probe"[..]);
        let mut writer = Writer::open(dir, &self.config, true)?;
        let appended = writer.append(&event, now().max(0.0) as u64, &self.gauge)?;
        drop(writer);
        let Appended::Stored(seq) = appended else {
            return Err(Error::new(ErrorKind::Io, format!("the probe event in '{}' was taken for a duplicate", dir.display())));
        };
        let mut read = Vec::new();
        log::read_backwards(dir, |record| {
            read.push(record);
            true
        })?;
        match read.as_slice() {
            [record] if record.seq == seq && record.event == event => Ok(()),
            _ => Err(Error::new(
                ErrorKind::Io,
                format!("the probe event written to '{}' read back as {} records, not the one written", dir.display(), read.len()),
            )),
        }
    }
}

/// What [`Store::verify`] found.
#[derive(Clone, Debug, Default)]
pub struct VerifyReport {
    /// Valid records.
    pub records: usize,
    /// Bad frames: where and why.
    pub problems: Vec<VerifyProblem>,
}

/// One bad frame found by [`Store::verify`].
#[derive(Clone, Debug)]
pub struct VerifyProblem {
    /// The segment file.
    pub path: PathBuf,
    /// Offset of the bad frame.
    pub offset: u64,
    /// What is wrong.
    pub reason: String,
}

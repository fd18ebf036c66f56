//! The readers of a topic, as the sweep must respect them (FORMAT.md,
//! "`.readers`"): a live tunnel, in any process, holds a shared `flock`
//! on the topic's `.readers` for as long as it lives, and the sweep
//! removes a topic only once it has taken that lock exclusively, without
//! waiting; the kernel drops a reader's lock when its process ends,
//! however it ends, so a killed reader pins nothing. And a topic the sweep
//! removes leaves its last sequence number in `.removed` (`log::removed`),
//! so that a topic created again after it never hands out a checkpoint a
//! client of the old one may hold.

use std::collections::HashMap;
use std::fs::File;
use std::io::ErrorKind as IoKind;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use crate::error::{Error, ErrorKind, Result};
use crate::log;
use crate::shared::LockKind;
use crate::topic::Topic;

use super::report::PostReport;
use super::Store;

/// In a topic directory: the file whose `flock` marks live readers.
pub(super) const READERS_FILE: &str = ".readers";

/// How often a reader tries to mark a topic that the sweep keeps removing
/// under it before it gives up.
const MARK_ATTEMPTS: usize = 5;

/// A live reader's mark on a topic: while it lives, the sweep does not
/// remove the topic. The tunnels of one `Store` on one topic share one
/// open file (and one lock).
pub(crate) struct ReaderMark {
    _file: Arc<File>,
}

/// The marks a `Store` holds, by topic directory, shared by its tunnels.
#[derive(Default)]
pub(super) struct Marks {
    by_dir: HashMap<PathBuf, Weak<File>>,
    /// The size of `by_dir` after its last clean-up: entries of marks
    /// dropped since are removed once it has doubled.
    live_after_clean: usize,
}

/// What the sweep found of a topic's readers, under the topic's lock.
pub(super) enum Readers {
    /// At least one live reader: the topic stays.
    Live,
    /// None: the topic may be removed while this is held. A reader that
    /// comes meanwhile waits for it, then finds its mark in a directory
    /// set aside and starts again on the topic created anew.
    None(File),
}

impl Store {
    /// Marks `topic` (which the caller has just created or found) as read
    /// by a live reader, for as long as the returned mark lives. A topic
    /// that the sweep removed meanwhile is created again (with its
    /// announcements, in `report`), a journal revived, and marked then.
    pub(super) fn mark_reader(&self, topic: &Topic, report: &mut PostReport) -> Result<ReaderMark> {
        let dir = self.dir(topic);
        if let Some(file) = self.shared_mark(&dir) {
            return Ok(ReaderMark { _file: file });
        }
        let path = dir.join(READERS_FILE);
        for _ in 0..MARK_ATTEMPTS {
            match log::open_shared(&path, false) {
                Ok(file) => {
                    // The first live reader of a journal starts its
                    // presence (presence.rs): `.readers`'s mtime says
                    // since when. Tried, never waited for: held, the lock
                    // means another reader (or a removal, which this
                    // reader then waits for below).
                    if topic.is_journal() && matches!(crate::shared::try_lock(&file, LockKind::Exclusive, &self.config), Ok(true)) {
                        touch(&file);
                    }
                    // Waits while a removal holds it (see `Readers::None`);
                    // turns the lock tried above into a shared one.
                    crate::shared::lock(&file, LockKind::Shared, &self.config).map_err(|e| Error::io("cannot lock", &path, e))?;
                    if same_file(&file, &path) {
                        let file = Arc::new(file);
                        self.keep_mark(dir, &file);
                        return Ok(ReaderMark { _file: file });
                    }
                }
                Err(e) if matches!(e.kind(), IoKind::NotFound | IoKind::NotADirectory) => {}
                Err(e) => return Err(Error::io("cannot open", &path, e)),
            }
            // Removed under us: created again, as a tunnel creates it.
            let jobs = self.ensure_topic(topic, report)?;
            self.run_forwarding(jobs.into(), report)?;
            if topic.is_journal() {
                self.revive(topic, report)?;
            }
        }
        Err(Error::new(ErrorKind::Io, format!("cannot mark topic '{topic}' as read: removed {MARK_ATTEMPTS} times in a row")))
    }

    /// A mark this store holds on `dir` already, still in place.
    fn shared_mark(&self, dir: &Path) -> Option<Arc<File>> {
        let marks = self.readers.lock().ok()?;
        let file = marks.by_dir.get(dir)?.upgrade()?;
        // Only a hand deletion unlinks it while it is locked.
        (!log::unlinked(&file)).then_some(file)
    }

    fn keep_mark(&self, dir: PathBuf, file: &Arc<File>) {
        let Ok(mut marks) = self.readers.lock() else { return };
        marks.by_dir.insert(dir, Arc::downgrade(file));
        if marks.by_dir.len() >= 2 * marks.live_after_clean.max(64) {
            marks.by_dir.retain(|_, w| w.strong_count() > 0);
            marks.live_after_clean = marks.by_dir.len();
        }
    }

    /// Under the lock of the topic in `dir`, just before removing it:
    /// whether a live reader holds a mark. Creates `.readers` if need be
    /// and tries its lock exclusively, never waiting: a reader that has
    /// its mark keeps the topic; one that has not yet finds it removed.
    pub(super) fn readers_of(&self, dir: &Path) -> Result<Readers> {
        let path = dir.join(READERS_FILE);
        let file = log::open_shared(&path, false).map_err(|e| Error::io("cannot open", &path, e))?;
        match crate::shared::try_lock(&file, LockKind::Exclusive, &self.config) {
            Ok(true) => Ok(Readers::None(file)),
            Ok(false) => Ok(Readers::Live),
            Err(e) => Err(Error::io("cannot lock", &path, e)),
        }
    }

    /// Without any lock, creating nothing: true when a live reader marks
    /// the topic in `dir` (the sweep's queue looks again later instead of
    /// letting it go). A hint: the removal decides under the locks.
    pub(super) fn has_live_readers(&self, dir: &Path) -> bool {
        let Ok(file) = File::open(dir.join(READERS_FILE)) else { return false };
        match crate::shared::try_lock(&file, LockKind::Exclusive, &self.config) {
            Ok(true) => {
                crate::shared::unlock(&file, &self.config);
                false
            }
            Ok(false) => true,
            Err(_) => false,
        }
    }

    /// Under the lock of the topic in `dir`, just before it is set aside:
    /// records its last sequence number in `.removed`, so that a topic
    /// created again under its name starts after it. The last seq is the
    /// higher of the head's (which counts sequence numbers a damaged tail
    /// may hold) and the last record's (one a killed writer wrote and
    /// never counted, which readers may have returned).
    pub(super) fn record_last_seq(&self, dir: &Path) -> Result<()> {
        let counted = File::open(dir.join(log::HEAD_FILE)).ok().and_then(|f| log::last_seq_of(&f)).unwrap_or(0);
        let written = log::cursor_at_end(dir)?.last_seq();
        log::record_removed(&self.config, dir, counted.max(written))
    }
}

/// Sets `file`'s times to now: allowed to any user who may write it
/// (`0664`: the store's group), not only to its owner, as a chosen time
/// would be. Best effort: a presence's "since" is not worth failing for.
fn touch(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: futimens reads no memory when given a null pointer; the
    // descriptor is open for the call's duration.
    let _ = unsafe { libc::futimens(file.as_raw_fd(), std::ptr::null()) };
}

/// True when `path` names the file open as `file` (same device and inode).
fn same_file(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

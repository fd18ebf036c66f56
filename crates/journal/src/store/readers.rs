//! The readers of a topic, as the sweep must respect them (FORMAT.md,
//! "Readers and checkpoints"): a live tunnel, in any process, holds a
//! shared lock on one byte of the store's `.kn_readers`, the byte of its
//! topic, for as long as it lives, and the sweep removes a topic only once
//! it has taken that byte exclusively, without waiting. The locks are open
//! file description locks (`F_OFD_SETLK`): a process holds all its marks
//! on one open file, so a tunnel costs no descriptor of its own beyond its
//! connection, and the kernel drops them when that file is closed, however
//! the process ends, so a killed reader pins nothing. `T/.readers` stays,
//! a plain file: its identity before and after the lock tells a reader
//! that T was removed meanwhile, and its mtime when T's current run of
//! tunnels began (presence's "since"). And a topic the sweep removes
//! leaves its last sequence number in `.removed` (`log::removed`), so that
//! a topic created again after it never hands out a checkpoint a client of
//! the old one may hold.

use std::collections::HashMap;
use std::fs::File;
use std::io::ErrorKind as IoKind;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::log;
use crate::shared::LockKind;
use crate::topic::Topic;

use super::report::PostReport;
use super::Store;

/// In a topic directory: the file whose identity and mtime go with the
/// topic's readers (see the module documentation).
pub(super) const READERS_FILE: &str = ".readers";

/// In the store root: the file whose bytes mark live readers, one byte
/// per topic ([`mark_byte`]).
pub(super) const MARKS_FILE: &str = ".kn_readers";

/// How often a reader tries to mark a topic that the sweep keeps removing
/// under it before it gives up.
const MARK_ATTEMPTS: usize = 5;

/// A live reader's mark on a topic: while it lives, the sweep does not
/// remove the topic. The tunnels of one `Store` on one topic share one
/// mark (and one locked byte).
pub(crate) struct ReaderMark {
    _hold: Arc<Hold>,
}

/// The marks a `Store` holds: its open `.kn_readers` and, by topic
/// directory, the marks its tunnels share.
#[derive(Default)]
pub(super) struct Marks {
    file: Option<Arc<MarksFile>>,
    by_dir: HashMap<PathBuf, Weak<Hold>>,
    /// The size of `by_dir` after its last clean-up: entries of marks
    /// dropped since are removed once it has doubled.
    live_after_clean: usize,
}

/// A `Store`'s open `.kn_readers`, on which all its marks are held, and
/// how many marks hold each byte (two topics whose names share a byte
/// share its lock: it is released when the last of them goes).
pub(super) struct MarksFile {
    file: File,
    config: Arc<Config>,
    bytes: Mutex<HashMap<u64, Arc<Mutex<usize>>>>,
}

/// One mark's hold on its byte of `.kn_readers`.
struct Hold {
    marks: Arc<MarksFile>,
    at: u64,
    count: Arc<Mutex<usize>>,
}

/// What the sweep found of a topic's readers, under the topic's lock.
pub(super) enum Readers {
    /// At least one live reader: the topic stays.
    Live,
    /// None: the topic may be removed while this is held. A reader that
    /// comes meanwhile waits for it, then finds `.readers` gone or
    /// another file and starts again on the topic created anew.
    None(Unread),
}

/// The sweep's exclusive hold on a topic's byte (and on its `.readers`'
/// `flock`, which readers of earlier versions take), released when
/// dropped.
pub(super) struct Unread {
    _byte: File,
    _legacy: Option<File>,
}

impl Store {
    /// Marks `topic` (which the caller has just created or found) as read
    /// by a live reader, for as long as the returned mark lives. A topic
    /// that the sweep removed meanwhile is created again (with its
    /// announcements, in `report`), a journal revived, and marked then.
    pub(super) fn mark_reader(&self, topic: &Topic, report: &mut PostReport) -> Result<ReaderMark> {
        let dir = self.dir(topic);
        if let Some(hold) = self.shared_mark(&dir) {
            return Ok(ReaderMark { _hold: hold });
        }
        let marks = self.marks_file()?;
        let at = mark_byte(&self.config.root, &dir);
        let path = dir.join(READERS_FILE);
        for _ in 0..MARK_ATTEMPTS {
            match log::open_shared(&path, false) {
                Ok(file) => {
                    // Open across the lock: its inode cannot be reused by
                    // a `.readers` created after a removal meanwhile.
                    let hold = marks.hold(at, topic.is_journal(), &file).map_err(|e| Error::io("cannot lock", &self.config.root.join(MARKS_FILE), e))?;
                    if same_file(&file, &path) {
                        let hold = Arc::new(hold);
                        self.keep_mark(dir, &hold);
                        return Ok(ReaderMark { _hold: hold });
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

    /// This store's open `.kn_readers`, opened (and created) on first use.
    fn marks_file(&self) -> Result<Arc<MarksFile>> {
        let mut marks = self.readers.lock().map_err(|_| Error::new(ErrorKind::Io, "the readers' marks were poisoned by a panic"))?;
        if let Some(file) = &marks.file {
            return Ok(file.clone());
        }
        let path = self.config.root.join(MARKS_FILE);
        let file = log::open_shared(&path, false).map_err(|e| Error::io("cannot open", &path, e))?;
        let config = Arc::clone(self.shared_config.get_or_init(|| Arc::new(self.config.clone())));
        let file = Arc::new(MarksFile { file, config, bytes: Mutex::new(HashMap::new()) });
        marks.file = Some(file.clone());
        Ok(file)
    }

    /// A mark this store holds on `dir` already.
    fn shared_mark(&self, dir: &Path) -> Option<Arc<Hold>> {
        let marks = self.readers.lock().ok()?;
        marks.by_dir.get(dir)?.upgrade()
    }

    fn keep_mark(&self, dir: PathBuf, hold: &Arc<Hold>) {
        let Ok(mut marks) = self.readers.lock() else { return };
        marks.by_dir.insert(dir, Arc::downgrade(hold));
        if marks.by_dir.len() >= 2 * marks.live_after_clean.max(64) {
            marks.by_dir.retain(|_, w| w.strong_count() > 0);
            marks.live_after_clean = marks.by_dir.len();
        }
    }

    /// Under the lock of the topic in `dir`, just before removing it:
    /// whether a live reader holds a mark. Tries the topic's byte of
    /// `.kn_readers` exclusively on an open file of its own, never
    /// waiting (and the `flock` of `.readers`, which readers of versions
    /// before the byte marks take): a reader that has its mark keeps the
    /// topic; one that has not yet finds it removed.
    pub(super) fn readers_of(&self, dir: &Path) -> Result<Readers> {
        let path = self.config.root.join(MARKS_FILE);
        let file = log::open_shared(&path, false).map_err(|e| Error::io("cannot open", &path, e))?;
        match crate::shared::lock_byte(&file, mark_byte(&self.config.root, dir), LockKind::Exclusive, false, &self.config) {
            Ok(true) => {}
            Ok(false) => return Ok(Readers::Live),
            Err(e) => return Err(Error::io("cannot lock", &path, e)),
        }
        let legacy = match File::open(dir.join(READERS_FILE)) {
            Ok(old) => match crate::shared::try_lock(&old, LockKind::Exclusive, &self.config) {
                Ok(true) => Some(old),
                Ok(false) => return Ok(Readers::Live),
                Err(e) => return Err(Error::io("cannot lock", &dir.join(READERS_FILE), e)),
            },
            Err(_) => None,
        };
        Ok(Readers::None(Unread { _byte: file, _legacy: legacy }))
    }

    /// Without any lock, creating nothing: true when a live reader marks
    /// the topic in `dir` (the sweep's queue looks again later instead of
    /// letting it go; presence counts the journal connected). A test of
    /// its byte of `.kn_readers` (`F_OFD_GETLK`) from an open file of its
    /// own. A hint: the removal decides under the locks.
    pub(super) fn has_live_readers(&self, dir: &Path) -> bool {
        let Ok(file) = File::open(self.config.root.join(MARKS_FILE)) else { return false };
        crate::shared::byte_locked(&file, mark_byte(&self.config.root, dir), &self.config).unwrap_or(false)
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

impl MarksFile {
    /// Holds the byte `at` shared for one more mark, taking its lock when
    /// no mark of this store holds it yet (waiting while a removal holds
    /// it). The first live reader of a journal starts its presence
    /// (presence.rs): `readers`' mtime (its `.readers`) says since when.
    /// Tried, never waited for: held, the byte means another reader (or a
    /// removal, which the shared lock then waits for).
    fn hold(self: &Arc<Self>, at: u64, journal: bool, readers: &File) -> std::io::Result<Hold> {
        let count = {
            let mut bytes = self.bytes.lock().unwrap_or_else(|p| p.into_inner());
            bytes.entry(at).or_default().clone()
        };
        let mut held = count.lock().unwrap_or_else(|p| p.into_inner());
        if *held == 0 {
            if journal && matches!(crate::shared::lock_byte(&self.file, at, LockKind::Exclusive, false, &self.config), Ok(true)) {
                touch(readers);
            }
            // Turns the lock tried above into a shared one.
            crate::shared::lock_byte(&self.file, at, LockKind::Shared, true, &self.config)?;
        }
        *held += 1;
        drop(held);
        Ok(Hold { marks: self.clone(), at, count })
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let last = {
            let mut held = self.count.lock().unwrap_or_else(|p| p.into_inner());
            *held = held.saturating_sub(1);
            if *held == 0 {
                crate::shared::unlock_byte(&self.marks.file, self.at, &self.marks.config);
            }
            *held == 0
        };
        if last {
            // Forgotten unless another mark took it up meanwhile (this
            // hold's reference and the map's are the only ones; one
            // being taken holds its count: never waited for here).
            let mut bytes = self.marks.bytes.lock().unwrap_or_else(|p| p.into_inner());
            let unused = bytes.get(&self.at).is_some_and(|c| Arc::strong_count(c) == 2 && c.try_lock().is_ok_and(|n| *n == 0));
            if unused {
                bytes.remove(&self.at);
            }
        }
    }
}

/// The byte of `.kn_readers` that marks the topic in `dir`: 62 bits of
/// the SHA-256 of its path below the store root (the same in every
/// process and on every host, wherever the volume is mounted; below
/// 2^62, so that every byte is a valid offset). Two topics sharing a
/// byte keep each other while read (never a reader left reading a
/// removed topic, at worst an unread topic removed one pass later), and
/// a journal sharing a byte with a read one looks connected to presence:
/// so the hash is one no one can aim, a name whose byte is a given
/// topic's costing about 2^62 hashes (issue 37, suspected point b: with
/// the FNV-1a used before, `what/3e16581ecf90e7ca` and
/// `what/36275fa5fc904d83` shared a byte, found in a minute). A store
/// upgraded from FNV-1a has its readers marked on other bytes: restart
/// every `serve` of the store together (the package's upgrade does).
pub(super) fn mark_byte(root: &Path, dir: &Path) -> u64 {
    use sha2::Digest as _;
    use std::os::unix::ffi::OsStrExt;
    let relative = dir.strip_prefix(root).unwrap_or(dir);
    let digest = sha2::Sha256::digest(relative.as_os_str().as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(first) & ((1 << 62) - 1)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    fn mtime(path: &Path) -> SystemTime {
        std::fs::metadata(path).unwrap().modified().unwrap()
    }

    fn set_old(path: &Path) {
        File::options().write(true).open(path).unwrap().set_modified(SystemTime::UNIX_EPOCH).unwrap();
    }

    #[test]
    fn a_topics_byte_depends_on_its_path_below_the_root_alone_and_is_a_valid_offset() {
        let a = mark_byte(Path::new("/mnt/a/kn_events"), Path::new("/mnt/a/kn_events/who/anna/kn_journal"));
        let b = mark_byte(Path::new("/srv/b/kn_events"), Path::new("/srv/b/kn_events/who/anna/kn_journal"));
        assert_eq!(a, b, "the same topic on two hosts mounting the volume at different places");
        assert_ne!(a, mark_byte(Path::new("/srv/b/kn_events"), Path::new("/srv/b/kn_events/who/bob/kn_journal")));
        assert!(a < 1 << 62 && libc::off_t::try_from(a + 1).is_ok());
    }

    /// Two topic names whose FNV-1a bytes were the same (found by a rho
    /// search): a reader of one made the other look read, so a journal
    /// named to collide faked another's presence. Their bytes differ now.
    #[test]
    fn names_made_to_collide_under_fnv_1a_get_bytes_of_their_own() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let (read, other) = (dir.path().join("what/3e16581ecf90e7ca"), dir.path().join("what/36275fa5fc904d83"));
        assert_ne!(mark_byte(dir.path(), &read), mark_byte(dir.path(), &other));
        std::fs::create_dir_all(&read).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        let readers = log::open_shared(&read.join(READERS_FILE), false).unwrap();
        let _held = store.marks_file().unwrap().hold(mark_byte(dir.path(), &read), false, &readers).unwrap();
        let fresh = Store::open(dir.path()).unwrap();
        assert!(fresh.has_live_readers(&read));
        assert!(!fresh.has_live_readers(&other), "the other topic looks read");
    }

    #[test]
    fn a_held_byte_keeps_its_topic_from_every_open_file_until_its_last_mark_goes() {
        let dir = tempfile::tempdir().unwrap();
        let a = Store::open(dir.path()).unwrap();
        let b = Store::open(dir.path()).unwrap();
        let topic = dir.path().join("who/x/kn_journal");
        std::fs::create_dir_all(&topic).unwrap();
        let readers = log::open_shared(&topic.join(READERS_FILE), false).unwrap();
        let at = mark_byte(dir.path(), &topic);
        let marks = a.marks_file().unwrap();
        assert!(!b.has_live_readers(&topic));

        // The first reader of a journal sets `.readers`' mtime (since).
        set_old(&topic.join(READERS_FILE));
        let one = marks.hold(at, true, &readers).unwrap();
        assert!(mtime(&topic.join(READERS_FILE)) > SystemTime::UNIX_EPOCH + Duration::from_secs(1));
        // A second mark on the byte (another topic sharing it) takes no
        // lock and sets no time: the byte is held already.
        set_old(&topic.join(READERS_FILE));
        let two = marks.hold(at, true, &readers).unwrap();
        assert_eq!(mtime(&topic.join(READERS_FILE)), SystemTime::UNIX_EPOCH);
        // Nor does a reader of another store (process) while it is held.
        let other = b.marks_file().unwrap().hold(at, true, &readers).unwrap();
        assert_eq!(mtime(&topic.join(READERS_FILE)), SystemTime::UNIX_EPOCH);
        drop(other);

        // Seen from another open file, of this store or another.
        assert!(a.has_live_readers(&topic) && b.has_live_readers(&topic));
        assert!(matches!(b.readers_of(&topic).unwrap(), Readers::Live));
        drop(one);
        assert!(b.has_live_readers(&topic), "the second mark still holds the byte");
        drop(two);
        assert!(!a.has_live_readers(&topic) && !b.has_live_readers(&topic));
        assert!(marks.bytes.lock().unwrap().is_empty(), "an unused byte is forgotten");

        // The sweep's hold makes a reader wait (here: a try fails) until
        // it is dropped.
        let Readers::None(unread) = b.readers_of(&topic).unwrap() else { panic!("no reader left") };
        assert!(!crate::shared::lock_byte(&marks.file, at, LockKind::Shared, false, &a.config).unwrap());
        drop(unread);
        assert!(crate::shared::lock_byte(&marks.file, at, LockKind::Shared, false, &a.config).unwrap());
    }

    #[test]
    fn a_flock_on_readers_taken_by_an_earlier_version_keeps_the_topic() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let topic = dir.path().join("what/old");
        std::fs::create_dir_all(&topic).unwrap();
        let old = log::open_shared(&topic.join(READERS_FILE), false).unwrap();
        old.lock_shared().unwrap();
        assert!(matches!(store.readers_of(&topic).unwrap(), Readers::Live));
        old.unlock().unwrap();
        assert!(matches!(store.readers_of(&topic).unwrap(), Readers::None(_)));
    }
}
